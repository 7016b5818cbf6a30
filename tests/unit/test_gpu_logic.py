"""The GPU path's logic, on the CPU: NCCL dtype/op plans, unique-id packing, the duplicate-GPU
check from given bus ids, the CUDA-aware decision, staging-buffer reuse and error messages.
(The real thing runs in tests/gpu on a GPU machine.)"""

import ml_dtypes
import numpy as np
import pytest

from hpccomm import DtypeError, GpuBindingError, ReduceOp
from hpccomm.backends.nccl import (
    NCCL_AVG,
    NCCL_BFLOAT16,
    NCCL_FLOAT32,
    NCCL_FLOAT64,
    NCCL_MAX,
    NCCL_MIN,
    NCCL_SUM,
    NCCL_UINT8,
    check_unique_gpus,
    multi_rank_gpu_allowed,
    pack_unique_id,
    plan_reduction,
    unpack_unique_id,
)
from hpccomm.cuda_aware import DeviceConfig, DevicePath, decide
from hpccomm.dtypes import dtype_info
from hpccomm.staging import StagingPool

W = "all_reduce (rank 1 of 2)"


def info(dt):
    return dtype_info(np.dtype(dt), W)


def test_plan_native_types_and_ops():
    p = plan_reduction(info(ml_dtypes.bfloat16), ReduceOp.SUM, 22000, W)
    assert (p.dtype, p.per_element, p.op, p.prescale, p.divide_after) == (
        NCCL_BFLOAT16,
        1,
        NCCL_SUM,
        None,
        False,
    )
    assert plan_reduction(info(np.float32), ReduceOp.AVG, 22000, W).op == NCCL_AVG


def test_plan_avg_on_old_nccl_divides_after():
    p = plan_reduction(info(np.float32), ReduceOp.AVG, 20900, W)
    assert (p.op, p.divide_after) == (NCCL_SUM, True)


def test_plan_premul_sum_scales_first():
    p = plan_reduction(info(np.float64), ReduceOp.PREMUL_SUM(0.25), 22000, W)
    assert (p.dtype, p.op, p.prescale) == (NCCL_FLOAT64, NCCL_SUM, 0.25)


def test_plan_complex_as_pairs_and_bool_as_uint8():
    p = plan_reduction(info(np.complex64), ReduceOp.SUM, 22000, W)
    assert (p.dtype, p.per_element) == (NCCL_FLOAT32, 2)
    assert plan_reduction(info(bool), ReduceOp.SUM, 22000, W)[::2] == (NCCL_UINT8, NCCL_MAX, False)
    assert plan_reduction(info(bool), ReduceOp.BAND, 22000, W).op == NCCL_MIN


@pytest.mark.parametrize("op", [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR])
def test_plan_refuses_bitwise(op):
    with pytest.raises(
        DtypeError,
        match=rf"{W[:10]}.*op {op.name} is not supported on the NCCL path for dtype int32",
    ):
        plan_reduction(info(np.int32), op, 22000, W)


def test_plan_refuses_int16():
    with pytest.raises(DtypeError, match="dtype int16 has no NCCL type"):
        plan_reduction(info(np.int16), ReduceOp.SUM, 22000, W)


def test_unique_id_bytes_round_trip():
    uid = bytes(range(128))
    buf = pack_unique_id(uid)
    assert buf.dtype == np.uint8 and buf.size == 128
    assert unpack_unique_id(buf, as_bytes=True) == uid


def test_unique_id_tuple_of_signed_chars_round_trip():
    uid = tuple((i * 37) % 256 - 128 for i in range(128))  # negative values included
    buf = pack_unique_id(uid)
    assert unpack_unique_id(buf, as_bytes=False) == uid


def test_unique_id_wrong_size():
    with pytest.raises(Exception, match="NCCL unique id has 127 bytes, expected 128"):
        pack_unique_id(bytes(127))


def test_duplicate_gpu_check_names_ranks_host_and_gpu():
    ids = [
        ("n1", "0000:01:00.0"),
        ("n1", "0000:02:00.0"),
        ("n1", "0000:01:00.0"),
        ("n2", "0000:01:00.0"),
    ]
    with pytest.raises(GpuBindingError) as exc:
        check_unique_gpus(ids, 2)
    msg = str(exc.value)
    assert msg.startswith(
        "NCCL init (rank 2 of 4): ranks [0, 2] on host n1 would share GPU 0000:01:00.0"
    )
    assert "--gpus-per-task=1" in msg and "NCCL_MULTI_RANK_GPU_ENABLE=1" in msg


def test_duplicate_gpu_check_passes_distinct_and_allowed():
    check_unique_gpus([("n1", "a"), ("n1", "b"), ("n2", "a")], 0)
    check_unique_gpus([("n1", "a"), ("n1", "a")], 0, allowed=True)


def test_multi_rank_gpu_allowed_needs_env_and_version():
    assert multi_rank_gpu_allowed(23000, {"NCCL_MULTI_RANK_GPU_ENABLE": "1"})
    assert not multi_rank_gpu_allowed(22900, {"NCCL_MULTI_RANK_GPU_ENABLE": "1"})
    assert not multi_rank_gpu_allowed(23000, {})


def no(*_):
    return None


@pytest.mark.parametrize(
    ("setting", "env", "kinds", "mpix", "aware", "reason"),
    [
        (True, {"HPCCOMM_CUDA_AWARE_MPI": "0"}, None, 0, True, "init(cuda_aware_mpi=True)"),
        (None, {"HPCCOMM_CUDA_AWARE_MPI": "1"}, None, 0, True, "HPCCOMM_CUDA_AWARE_MPI=1"),
        (
            None,
            {"HPCCOMM_CUDA_AWARE_MPI": "false"},
            "cuda:device",
            1,
            False,
            "HPCCOMM_CUDA_AWARE_MPI=false",
        ),
        (
            None,
            {},
            "mpi,system,cuda:device",
            None,
            True,
            "mpi_memory_alloc_kinds='mpi,system,cuda:device'",
        ),
        (None, {}, "mpi,system", 1, False, "mpi_memory_alloc_kinds='mpi,system'"),
        (None, {}, None, 1, True, "MPIX_Query_cuda_support() = 1"),
        (None, {}, None, 0, False, "MPIX_Query_cuda_support() = 0"),
        (
            None,
            {"OMPI_MCA_opal_cuda_support": "true"},
            None,
            None,
            True,
            "OMPI_MCA_opal_cuda_support=true",
        ),
        (None, {}, None, None, False, "the MPI library gives no answer, so hpccomm is unsure"),
    ],
)
def test_cuda_aware_decision(setting, env, kinds, mpix, aware, reason):
    path = decide(setting, env, alloc_kinds=lambda: kinds, mpix=lambda: mpix)
    assert path == DevicePath(aware, reason)


def test_cuda_aware_bad_env():
    with pytest.raises(
        ValueError,
        match=r"HPCCOMM_CUDA_AWARE_MPI='maybe', expected 1/true/yes/on or 0/false/no/off \(any case\)",
    ):
        decide(None, {"HPCCOMM_CUDA_AWARE_MPI": "maybe"}, alloc_kinds=no, mpix=no)


def test_describe_says_path_and_why():
    text = DeviceConfig(0, "nccl", DevicePath(False, "MPIX_Query_cuda_support() = 0")).describe()
    assert (
        "GPU 0, collectives via NCCL" in text
        and "staged through pinned host buffers (MPIX_Query_cuda_support() = 0)" in text
    )


def test_staging_pool_reuses_buffers():
    pool = StagingPool(lambda n: np.empty(n, dtype=np.uint8))
    a = pool.take(1000, np.float64, (125,))
    assert a.shape == (125,) and a.dtype == np.float64 and pool.allocations == 1
    pool.give(a)
    b = pool.take(800, np.float32, (10, 20))  # same size class (1024 bytes): reused
    assert pool.allocations == 1 and b.shape == (10, 20)
    c = pool.take(1000, np.uint8, (1000,))  # b still lent: a second buffer
    assert pool.allocations == 2
    pool.give(b)
    pool.give(c)
    pool.take(5000, np.uint8, (5000,))
    assert pool.allocations == 3
    assert (
        StagingPool.size_class(1) == 1
        and StagingPool.size_class(1025) == 2048
        and StagingPool.size_class(0) == 1
    )


def test_a_refused_all_to_all_joins_the_comparison_only_for_host_data():
    # at "large" only host arrays' all_to_all is compared before MPI: a device array's
    # refusal joining a comparison its peers (on NCCL or device MPI) never enter queued
    # a stale fingerprint on the worker (from an outside review)
    import numpy as np

    from hpccomm.buffers import on_host as _on_host

    class Cuda:
        __cuda_array_interface__ = {}

    class DLPack:
        def __init__(self, kind):
            self.kind = kind

        def __dlpack__(self, stream=None):
            raise NotImplementedError

        def __dlpack_device__(self):
            return (self.kind, 0)

    assert _on_host(np.ones(2)) and _on_host(None) and _on_host(DLPack(1))
    assert not _on_host(Cuda()) and not _on_host(DLPack(2))
