"""GPU tests: the real CuPy/NCCL paths. They run under mpiexec (``--with-mpi``) on a machine
with a CUDA GPU (jobs/gpu-check.sh), and skip with the reason everywhere else. Every test in
this directory gets the ``gpu`` marker and pytest-mpi's ``mpi`` marker here.

With ``HPCCOMM_GPU_STRICT=1`` (jobs/gpu-check.sh sets it) a missing GPU stops the run with an
error instead of skipping every test, and the fault tests fail where their configuration is
not met (a check that skips proves nothing).

Nothing here touches CUDA before ``hpccomm.init`` binds the rank's GPU, except the device
count asked at collection (it creates no context)."""

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
    if why and os.environ.get("HPCCOMM_GPU_STRICT") == "1":
        raise pytest.UsageError(f"HPCCOMM_GPU_STRICT=1 but the GPU tests cannot run: {why}")
    if why:  # added before pytest-mpi's skip, so this reason is the one shown
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def gworld():
    import hpccomm

    return hpccomm.init(gpu=True, timeout=120)


@pytest.fixture(scope="session")
def gpu_shared(gworld) -> bool:
    """Whether two ranks of the world use one GPU: compared by UUID (what NCCL >= 2.30
    compares), not by the logical index (rank 1's GPU 1 and rank 0's GPU 0 may be one device
    under per-task CUDA_VISIBLE_DEVICES, and two ranks' GPU 0 may be two devices)."""
    import cupy

    from hpccomm.backends.nccl import gpu_identity

    mine = gpu_identity(cupy.cuda.runtime, gworld.device.gpu, gworld.launch.hostname)
    ids = gworld.all_gather_object(mine.uuid or f"{mine.host}:{mine.bus_id}")
    return len(set(ids)) < gworld.size


@pytest.fixture(scope="session")
def nccl_usable(gworld, gpu_shared) -> str | None:
    """None when the world's ranks can make an NCCL communicator, else why not."""
    if gworld.device.mode != "nccl":
        return "CuPy has no usable NCCL on this machine"
    from cupy.cuda import nccl

    from hpccomm.backends.nccl import multi_rank_gpu_allowed

    if gpu_shared and not multi_rank_gpu_allowed(nccl.get_version()):
        return (
            f"{gworld.size} ranks share a GPU: NCCL needs NCCL_MULTI_RANK_GPU_ENABLE=1 and "
            f"NCCL >= 2.30 (this is {nccl.get_version()}, env "
            f"{os.environ.get('NCCL_MULTI_RANK_GPU_ENABLE')!r})"
        )
    return None


@pytest.fixture(params=["nccl", "nccl-bounded", "mpi"])
def gcomm(request, gworld, nccl_usable):
    """A duplicate of the world whose device arrays go through NCCL (unbounded: enqueued
    inline; bounded: a 60 s timeout, so each call is enqueued on the worker thread and
    waited for on the host) or through MPI (with the world's timeout)."""
    path = request.param.split("-")[0]
    if path == "nccl" and nccl_usable is not None:
        pytest.skip(nccl_usable)
    comm = gworld.dup(device_backend=path)
    if request.param == "nccl":
        comm.timeout = None
    elif request.param == "nccl-bounded":
        comm.timeout = 60
    if path == "nccl":
        comm.enable_nccl()
    yield comm
    comm.free()
