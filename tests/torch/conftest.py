"""PyTorch backend tests: they run under mpiexec (``--with-mpi``, make test-torch) with torch
installed, and skip with the reason otherwise."""

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    why = None
    if not getattr(importlib.util.find_spec("torch"), "origin", None):
        why = "torch is not installed (pip install -e '.[torch]')"
    elif not config.getoption("with_mpi", False):
        why = "torch backend tests run under mpiexec with --with-mpi (make test-torch)"
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.mpi)
            item.add_marker(pytest.mark.torch)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def tdist():
    """torch.distributed initialized on hpccomm (once per test session)."""
    import torch.distributed as dist

    import hpccomm.torch as ht

    if not dist.is_initialized():
        ht.init_process_group(timeout=120)
    return dist
