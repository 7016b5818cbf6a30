"""PyTorch's own distributed tests (``torch.testing._internal.distributed.distributed_test``,
shipped in the wheel) run against the hpccomm backend under mpiexec.

torch's harness forks a fresh set of processes per test; here the ranks are mpiexec's and
every test runs in the same processes, one after another, on a default group made once by
``hpccomm.torch.init_process_group``. The suite reads its settings from the environment at
import, so they are set here first: ``BACKEND=mpi`` (hpccomm serves torch's MPI backend name,
so the suite holds it to what it expects of torch's own ProcessGroupMPI), ``WORLD_SIZE``, and a
``TEMP_DIR``
that every rank shares (made by rank 0, its path sent over MPI). The backend declares the
features it has (DDP, subgroups) in the suite's feature table; everything else the suite
decides itself (what the world size or a GPU allows). See test_torch_suite.py for the tests
left out and why.
"""

import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).parent
_why = None
if not getattr(importlib.util.find_spec("torch"), "origin", None):
    _why = "torch is not installed (pip install -e '.[torch]')"
elif (
    "OMPI_COMM_WORLD_SIZE" not in os.environ
    and "PMI_SIZE" not in os.environ
    and "SLURM_STEP_ID" not in os.environ
):
    _why = "PyTorch's suite runs under mpiexec (make test-torch)"


def setup_suite_environment() -> None:
    """Start hpccomm, share one TEMP_DIR, and set what the suite reads at import."""
    import hpccomm

    world = hpccomm.init(timeout=60)  # a test that leaves the ranks out of step fails
    path = tempfile.mkdtemp(prefix="hpccomm-torch-suite-") if world.rank == 0 else None
    path = world.broadcast_object(path, src=0)
    if world.rank == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.mkdir(os.path.join(path, sub))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    world.barrier()
    os.environ.update(
        BACKEND="mpi",
        WORLD_SIZE=str(world.size),
        TEMP_DIR=path,
        INIT_METHOD="env://",
    )


if _why is None:
    setup_suite_environment()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    why = _why or (
        None if config.getoption("with_mpi", False) else "run with --with-mpi (make test-torch)"
    )
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.mpi)
            item.add_marker(pytest.mark.torch)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))
