"""Fixtures for tests that run under mpiexec (``pytest --with-mpi``), at any world size.

Every test in this directory is an MPI test: it gets pytest-mpi's ``mpi`` marker here, so
pytest-mpi skips it without ``--with-mpi`` and honours ``@pytest.mark.mpi(min_size=2)`` (a
skip when COMM_WORLD is smaller) on the pair tests."""

from pathlib import Path

import pytest

import hpccomm

HERE = Path(__file__).parent
# pytest-mpi's own reason ("need --with-mpi option to run") does not say how to start ranks.
HOW_TO_RUN = "MPI tests run under mpiexec with --with-mpi (make test-mpi)"


@pytest.fixture(scope="session")
def world():
    # A bound on every blocking operation: a mismatched test fails instead of hanging.
    return hpccomm.init(timeout=60)


@pytest.fixture(params=[60.0, None], ids=["bounded", "plain"])
def comm(world, request):
    """A fresh duplicate per test, so one test's sequence numbers and leftovers stay apart.
    Every test runs twice: with a 60 s bound on each operation (collectives then run on the
    communicator's worker thread, waited for with a deadline), and plain (no timeout: plain
    collectives run inline, repeats reuse their cached validation). The plain runs stay
    bounded by pytest-timeout and the Makefile's timeout."""
    c = world.dup()
    c.timeout = request.param
    yield c
    c.free()


@pytest.hookimpl(tryfirst=True)  # before pytest-mpi's hook, which acts on the mpi marker
def pytest_collection_modifyitems(config, items):
    with_mpi = config.getoption("with_mpi", False)
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.mpi)
            if not with_mpi:  # added before pytest-mpi's skip, so this reason is the one shown
                item.add_marker(pytest.mark.skip(reason=HOW_TO_RUN))
