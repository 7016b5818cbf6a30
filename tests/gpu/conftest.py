"""GPU tests: the real CuPy/NCCL paths. They run under mpiexec (``--with-mpi``) on a machine
with a CUDA GPU (jobs/gpu-check.sh), and skip with the reason everywhere else. Every test in
this directory gets the ``gpu`` marker and pytest-mpi's ``mpi`` marker here."""

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def why_no_gpu() -> str | None:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no usable CUDA device ({exc})"
    if count < 1:
        return "no CUDA device visible"
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-mpi's hook (mpi marker) and -m selection
def pytest_collection_modifyitems(config, items):
    ours = [i for i in items if HERE in Path(i.path).parents]
    if not ours:
        return
    for item in ours:
        item.add_marker(pytest.mark.gpu)
        item.add_marker(pytest.mark.mpi)
    why = why_no_gpu()
    if why is None and not config.getoption("with_mpi", False):
        why = "GPU tests run under mpiexec with --with-mpi (jobs/gpu-check.sh)"
    if why:  # added before pytest-mpi's skip, so this reason is the one shown
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def gworld():
    import hpccomm

    return hpccomm.init(gpu=True, timeout=120)


@pytest.fixture(params=["nccl", "mpi"])
def gcomm(request, gworld):
    """A duplicate of the world whose device arrays go through NCCL or through MPI."""
    from hpccomm.backends.nccl import multi_rank_gpu_allowed

    if request.param == "nccl":
        if gworld.device.mode != "nccl":
            pytest.skip("CuPy has no usable NCCL on this machine")
        from cupy.cuda import nccl

        shared = (
            len(set(gworld.all_gather_object((gworld.launch.hostname, gworld.device.gpu))))
            < gworld.size
        )
        if shared and not multi_rank_gpu_allowed(nccl.get_version()):
            pytest.skip(
                f"{gworld.size} ranks share a GPU: NCCL needs NCCL_MULTI_RANK_GPU_ENABLE=1 and NCCL >= 2.30 "
                f"(this is {nccl.get_version()}, env {os.environ.get('NCCL_MULTI_RANK_GPU_ENABLE')!r})"
            )
    comm = gworld.dup(device_backend=request.param)
    if request.param == "nccl":
        comm.enable_nccl()
    yield comm
    comm.free()
