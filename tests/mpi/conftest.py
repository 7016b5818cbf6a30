"""Fixtures for tests that run under mpiexec (``pytest --with-mpi``), at any world size."""

from pathlib import Path

import numpy as np
import pytest

import hpccomm


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


HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    if not config.getoption("with_mpi", False):
        skip = pytest.mark.skip(
            reason="MPI tests run under mpiexec with --with-mpi (make test-mpi)"
        )
        for item in items:
            if HERE in Path(item.path).parents:
                item.add_marker(skip)


def rng_for(rank: int, seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(1000 * seed + rank)
