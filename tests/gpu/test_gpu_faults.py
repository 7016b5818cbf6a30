"""GPU fault behaviour: NCCL's refusal of ranks sharing a GPU (and the "auto" fallback to the
MPI device path), and a peer that never joins a bounded NCCL collective, which must end in
CommTimeoutError with the NCCL communicator aborted (also where the call was an async one
dropped unwaited, at free()). jobs/gpu-check.sh runs each in the
configuration it needs, with HPCCOMM_GPU_STRICT=1: an unmet precondition then fails."""

import os
import time

import pytest

from hpccomm import BackendError, CommTimeoutError, GpuBindingError
from hpccomm.errors import UnwaitedWorkWarning

cp = pytest.importorskip("cupy")

STRICT = os.environ.get("HPCCOMM_GPU_STRICT") == "1"


def need(condition: bool, why: str) -> None:
    if not condition:
        if STRICT:
            pytest.fail(f"HPCCOMM_GPU_STRICT=1 and this check cannot run: {why}")
        pytest.skip(why)


def test_ranks_sharing_a_gpu_refused_and_auto_falls_back(gworld, gpu_shared, nccl_usable):
    need(gworld.size >= 2 and gpu_shared, "needs >= 2 ranks sharing a GPU")
    need(
        gworld.device.mode == "nccl" and nccl_usable is not None,
        "needs NCCL to refuse the shared GPU (NCCL_MULTI_RANK_GPU_ENABLE unset)",
    )
    explicit = gworld.dup(device_backend="nccl")
    with pytest.raises(GpuBindingError, match=r"would share GPU (GPU-|MIG-|\S+:[0-9a-fA-F]{4}:)"):
        explicit.enable_nccl()
    explicit.free()
    auto = gworld.dup()  # the world's device_backend="auto"
    need(auto.device.auto, "the world was not made with device_backend='auto'")
    x = cp.full(8, gworld.rank + 1.0, dtype=cp.float32)
    with pytest.warns(RuntimeWarning, match="take the MPI device path"):
        auto.all_reduce(x)
    cp.cuda.get_current_stream().synchronize()
    assert float(x[0]) == sum(range(1, gworld.size + 1))
    assert auto.nccl is None
    auto.free()


def test_missing_peer_times_out_and_aborts_nccl(gworld, nccl_usable):
    need(gworld.size >= 2, "needs >= 2 ranks")
    need(nccl_usable is None, f"needs a usable NCCL communicator ({nccl_usable})")
    comm = gworld.dup(device_backend="nccl")
    comm.enable_nccl()
    x = cp.ones(1 << 12, dtype=cp.float32)
    comm.all_reduce(x)  # connections made (NCCL's lazy connect) with every rank present
    cp.cuda.get_current_stream().synchronize()
    comm.timeout = 5
    if comm.rank != 0:  # rank 0 never joins the next all_reduce
        t0 = time.monotonic()
        with pytest.raises(CommTimeoutError, match="NCCL communicator was aborted"):
            comm.all_reduce(x)
        assert time.monotonic() - t0 < 30
        assert comm.nccl.comm == 0  # CuPy's handle is released by ncclCommAbort
        with pytest.raises(BackendError, match="aborted"):
            comm.all_reduce(x)
    gworld.barrier()  # host MPI: every rank gets here once the others have timed out
    if comm.rank == 0:
        comm.nccl.abort()  # its peers aborted theirs: a destroy would wait for them
    comm.free()


def test_missing_peer_of_a_dropped_async_call_bounds_free(gworld, nccl_usable):
    """An async NCCL call that rank 0 never joins, dropped unwaited on the others: their
    free() ends after the group's timeout with CommTimeoutError, the communicator aborted
    (ncclCommDestroy would have waited inside NCCL for good)."""
    need(gworld.size >= 2, "needs >= 2 ranks")
    need(nccl_usable is None, f"needs a usable NCCL communicator ({nccl_usable})")
    comm = gworld.dup(device_backend="nccl")
    comm.enable_nccl()
    x = cp.ones(1 << 12, dtype=cp.float32)
    comm.all_reduce(x)  # connections made with every rank present
    cp.cuda.get_current_stream().synchronize()
    comm.timeout = None  # (gworld's 120 s, inherited: its calls would be bounded on the worker)
    if comm.rank != 0:
        with pytest.warns(UnwaitedWorkWarning):
            comm.all_reduce(x, async_op=True)  # dropped; rank 0 never joins it
        comm.timeout = 5
        t0 = time.monotonic()
        with pytest.raises(CommTimeoutError, match=r"^free: NCCL .* not complete on the GPU"):
            comm.free()
        assert time.monotonic() - t0 < 30
        assert comm.freed
    gworld.barrier()  # host MPI: every rank gets here once the others have freed theirs
    if comm.rank == 0:
        comm.nccl.abort()  # its peers aborted theirs: a destroy would wait for them
        comm.free()
