"""Shared test set-up.

- The pytest header names the MPI library, the rank/size and the GPU stack (when present), so
  every report says what it ran on.
- Fixtures for tests that start processes: the virtual environment's bin directory, its
  mpiexec (the test skips, saying why, without one) and an environment for MPI subprocesses.
- The ``ref`` fixture: deterministic per-rank data and NumPy references for tests/mpi and
  tests/gpu, so each rank computes every rank's input locally and checks its result without
  communicating.
"""

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest


def pytest_report_header(config):
    lines = []
    if (
        "mpi4py" in __import__("sys").modules
        or os.environ.get("OMPI_COMM_WORLD_SIZE")
        or config.getoption("with_mpi", False)
    ):
        from mpi4py import MPI

        lines.append(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}")
        lines.append(f"MPI rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}")
    if importlib.util.find_spec("cupy") is not None:
        try:
            import cupy

            line = f"CuPy {cupy.__version__}"
            try:
                from cupy.cuda import nccl

                line += f", NCCL {nccl.get_version()}"
            except Exception as exc:  # report, do not fail the header
                line += f", NCCL unavailable ({exc})"
            lines.append(line)
        except Exception as exc:
            lines.append(f"CuPy failed to import: {exc}")
    else:
        lines.append("CuPy: not installed (GPU tests skip)")
    return lines


# -- processes: the venv's programs, mpiexec, the environment of an MPI subprocess ----------


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    """The bin directory of the Python running the tests (python, hpccomm, mpiexec)."""
    return Path(sys.executable).parent


@pytest.fixture(scope="session")
def mpiexec(venv_bin) -> str:
    """The mpiexec to start ranks with; the test skips without one."""
    found = shutil.which("mpiexec", path=str(venv_bin)) or shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec (install the 'mpi' extra)")
    return found


@pytest.fixture
def mpi_env():
    """A fresh environment for an MPI subprocess: root and oversubscription allowed, ranks
    yield while waiting, and no launcher variables of this process (Slurm, Open MPI's world,
    PRRTE, PMIx, PMI) that would make the child think it is one of our ranks."""
    env = dict(os.environ)
    env.update(
        # a TMPDIR per test: a launcher killed at a test's time bound leaves its session
        # directory ($TMPDIR/ompi.<pid>), which fails a later launcher given the same pid
        TMPDIR=(tmp := tempfile.mkdtemp(prefix="hpccomm-", dir="/tmp")),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_mpi_yield_when_idle="1",
    )
    for key in [
        k for k in env if k.startswith(("SLURM_", "OMPI_COMM_WORLD", "PRTE_", "PMIX_", "PMI_"))
    ]:
        del env[key]
    yield env
    shutil.rmtree(tmp, ignore_errors=True)


# -- references: per-rank data and NumPy results (tests/mpi, tests/gpu) ---------------------

BF16 = np.dtype(ml_dtypes.bfloat16)


def data(dtype, rank, shape, seed=0):
    """Small integers (exact in every dtype, sums/products of 4 ranks included)."""
    rng = np.random.default_rng(97 * seed + rank)
    dtype = np.dtype(dtype)
    ints = rng.integers(0, 4, size=shape)
    if dtype == np.bool_:
        return ints.astype(bool) & (ints > 1)
    if dtype.kind == "c":
        return (ints + 1j * rng.integers(0, 4, size=shape)).astype(dtype)
    return ints.astype(dtype)


def wide(x):
    """Upcast for reference arithmetic (bfloat16/float16 through float64)."""
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype == np.bool_:
        return x
    if x.dtype.kind in "iu":
        return x.astype(np.int64)
    return x.astype(np.float64)


def reduce_ref(arrays, op_name, factor=None):
    xs = np.stack([wide(a) for a in arrays])
    is_bool = arrays[0].dtype == np.bool_
    if op_name == "SUM":
        return xs.any(0) if is_bool else xs.sum(0)
    if op_name == "PRODUCT":
        return xs.all(0) if is_bool else xs.prod(0)
    if op_name == "MIN":
        return xs.min(0)
    if op_name == "MAX":
        return xs.max(0)
    if op_name == "AVG":
        return xs.mean(0)
    if op_name == "PREMUL_SUM":
        return (xs * factor).sum(0)
    table = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
    if is_bool:
        table = {"BAND": np.logical_and, "BOR": np.logical_or, "BXOR": np.logical_xor}
    return table[op_name].reduce(xs, axis=0)


def assert_close(got, expect, dtype):
    dtype = np.dtype(dtype)
    g = wide(np.asarray(got))
    if dtype in (np.dtype(np.float16), BF16):
        np.testing.assert_allclose(g, expect, rtol=1e-2, atol=1e-2)
    elif dtype.kind in "fc":
        np.testing.assert_allclose(g, expect, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(g, expect)


@pytest.fixture(scope="session")
def ref() -> SimpleNamespace:
    """The reference helpers: ``ref.data(dtype, rank, shape, seed=0)``, ``ref.wide(x)``,
    ``ref.reduce_ref(arrays, op_name, factor=None)``, ``ref.assert_close(got, expect, dtype)``."""
    return SimpleNamespace(data=data, wide=wide, reduce_ref=reduce_ref, assert_close=assert_close)


@pytest.fixture(autouse=True)
def _unwaited_warnings_said_anew():
    """Each test starts with hpccomm's count of dropped Work handles at zero: past
    DROPS_SAID a process only counts them, and a test that expects the warning must not
    depend on how many handles earlier tests dropped."""
    work = sys.modules.get("hpccomm.work")
    if work is not None:
        work._DROPPED[0] = 0
    yield
