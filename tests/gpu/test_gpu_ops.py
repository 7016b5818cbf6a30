"""Every operation on device arrays, on the NCCL path and on the MPI path (direct or staged),
against NumPy references; streams and async Work; bfloat16."""

import ml_dtypes
import numpy as np
import pytest

from hpccomm import P2POp, ReduceOp

cp = pytest.importorskip("cupy")

DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    ml_dtypes.bfloat16,
    np.int32,
    np.int64,
    np.uint8,
    np.complex64,
]
OPS = [
    ReduceOp.SUM,
    ReduceOp.MAX,
    ReduceOp.MIN,
    ReduceOp.PRODUCT,
    ReduceOp.AVG,
    ReduceOp.PREMUL_SUM(0.5),
]


def _cupy_bf16() -> bool:
    """Whether CuPy makes bfloat16 arrays (CuPy >= 14 with ml_dtypes). Asked on first use,
    after hpccomm.init bound this rank's GPU: a kernel at import would make a context on
    device 0 in every rank."""
    if not hasattr(_cupy_bf16, "answer"):
        try:
            cp.zeros(1, dtype=ml_dtypes.bfloat16)
            _cupy_bf16.answer = True
        except Exception:  # CuPy < 14 has no bfloat16
            _cupy_bf16.answer = False
    return _cupy_bf16.answer


def no_bf16_reason() -> str:
    return f"CuPy {cp.__version__} has no bfloat16 arrays (CuPy >= 14 with ml_dtypes)"


def dev(x):
    if np.dtype(x.dtype) == np.dtype(ml_dtypes.bfloat16) and not _cupy_bf16():
        pytest.skip(no_bf16_reason())
    return cp.asarray(x)


def host(x):
    cp.cuda.get_current_stream().synchronize()
    return cp.asnumpy(x)


def ok_pair(dt, op):
    from hpccomm.dtypes import ALLOWED_CATEGORIES, SUPPORTED_DTYPES

    return SUPPORTED_DTYPES[np.dtype(dt)].category in ALLOWED_CATEGORIES[op.name]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_all_reduce(gcomm, ref, dtype, op):
    if not ok_pair(dtype, op):
        pytest.skip(f"{op.name} is not defined for {np.dtype(dtype).name}")
    n, r = gcomm.size, gcomm.rank
    x = dev(ref.data(dtype, r, (257,)))
    assert gcomm.all_reduce(x, op=op) is x
    ref.assert_close(
        host(x),
        ref.reduce_ref([ref.data(dtype, i, (257,)) for i in range(n)], op.name, op.factor),
        dtype,
    )


def test_reduce_broadcast(gcomm, ref):
    n, r = gcomm.size, gcomm.rank
    x = dev(ref.data(np.float32, r, (64,)))
    gcomm.reduce(x, dst=n - 1)
    if r == n - 1:
        ref.assert_close(
            host(x),
            ref.reduce_ref([ref.data(np.float32, i, (64,)) for i in range(n)], "SUM"),
            np.float32,
        )
    y = dev(ref.data(ml_dtypes.bfloat16, r, (33,)))
    gcomm.broadcast(y, src=0)
    assert np.array_equal(host(y), ref.data(ml_dtypes.bfloat16, 0, (33,)))


@pytest.mark.parametrize("uneven", [False, True])
def test_all_gather_gather_scatter(gcomm, ref, uneven):
    n, r = gcomm.size, gcomm.rank
    sizes = [i % 3 + (0 if uneven else 2 - i % 3) for i in range(n)]
    kw = {"sizes": sizes} if uneven else {}
    x = dev(ref.data(np.float64, r, (sizes[r], 3)))
    full = np.concatenate([ref.data(np.float64, i, (sizes[i], 3)) for i in range(n)])
    assert np.array_equal(host(gcomm.all_gather(x, **kw)), full)
    got = gcomm.gather(x, dst=0, **kw)
    assert (got is None) if r else np.array_equal(host(got), full)
    src = dev(full) if r == 0 else None
    blk = gcomm.scatter(src, src=0, out=cp.empty((sizes[r], 3)), **kw)
    start = sum(sizes[:r])
    assert np.array_equal(host(blk), full[start : start + sizes[r]])


@pytest.mark.parametrize("uneven", [False, True])
def test_reduce_scatter(gcomm, ref, uneven):
    n, r = gcomm.size, gcomm.rank
    sizes = [(i + 1) % 3 for i in range(n)] if uneven else [4] * n
    x = dev(ref.data(np.float32, r, (sum(sizes),)))
    out = gcomm.reduce_scatter(x, sizes=sizes if uneven else None)
    expect = ref.reduce_ref([ref.data(np.float32, i, (sum(sizes),)) for i in range(n)], "SUM")
    start = sum(sizes[:r])
    ref.assert_close(host(out), expect[start : start + sizes[r]], np.float32)


def test_all_to_all_equal_and_uneven(gcomm, ref):
    n, r = gcomm.size, gcomm.rank
    out = gcomm.all_to_all(dev(np.arange(2 * n, dtype=np.int64) + 100 * r))
    assert list(host(out)) == [100 * j + 2 * r + k for j in range(n) for k in range(2)]

    def splits(i):
        return [(i + 2 * j) % 3 for j in range(n)]

    inputs = [ref.data(np.float32, i, (sum(splits(i)),)) for i in range(n)]
    got = gcomm.all_to_all_single(
        dev(inputs[r]),
        input_split_sizes=splits(r),
        output_split_sizes=[splits(j)[r] for j in range(n)],
    )
    expect = np.concatenate(
        [inputs[j][sum(splits(j)[:r]) : sum(splits(j)[:r]) + splits(j)[r]] for j in range(n)]
    )
    assert np.array_equal(host(got), expect)


def test_p2p_ring_sendrecv_batch(gcomm):
    n, r = gcomm.size, gcomm.rank
    right, left = (r + 1) % n, (r - 1) % n
    got = gcomm.sendrecv(dev(np.full(5, r, dtype=np.float32)), dst=right, src=left)
    assert (host(got) == left).all()
    y = cp.empty(4)
    work = gcomm.batch_isend_irecv(
        [P2POp("send", dev(np.full(4, float(r))), right), P2POp("recv", y, left)]
    )
    work.wait()
    assert (host(y) == left).all()
    if n > 1:
        z = cp.empty(3, dtype=cp.int32)
        if r == 0:
            gcomm.send(dev(np.arange(3, dtype=np.int32)), 1)
        elif r == 1:
            assert gcomm.recv(z, 0) == 0
            assert list(host(z)) == [0, 1, 2]


def test_streams_and_async_work(gcomm):
    n = gcomm.size
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.ones(1 << 20, dtype=cp.float32)
        work = gcomm.all_reduce(x, async_op=True)
        work.wait()  # NCCL: the current stream (s) waits on the event, the host does not
        total = float(x.sum())  # ordered after the all-reduce on s
    assert total == n * (1 << 20)
    if hasattr(work, "synchronize"):
        work.synchronize(timeout=60)
    assert work.is_completed()
    # y is made on the current (null) stream, the call runs on s (non-blocking: not ordered
    # after the null stream by itself): order s after the producer, as a user must.
    y = cp.ones(16, dtype=cp.float64)
    s.wait_event(cp.cuda.get_current_stream().record())
    gcomm.all_reduce(y, stream=s)
    s.synchronize()
    assert (cp.asnumpy(y) == n).all()
    # an output hpccomm allocates for a call on s is allocated on s (and written there)
    with s:
        z = cp.arange(4, dtype=cp.float32) + gcomm.rank
    got = gcomm.all_gather(z, stream=s)
    s.synchronize()
    assert cp.asnumpy(got).tolist() == [float(k + r) for r in range(n) for k in range(4)]


def test_bf16_native_sum_large(gcomm):
    if not _cupy_bf16():
        pytest.skip(no_bf16_reason())
    n = gcomm.size
    x = cp.asarray(np.ones(1 << 16, dtype=ml_dtypes.bfloat16))
    gcomm.all_reduce(x)
    assert (host(x).astype(np.float32) == n).all()


def test_wrong_device_refused_on_nccl(gcomm):
    if gcomm.device.mode != "nccl" or cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs the NCCL path and a second GPU")
    other = (gcomm.device.gpu + 1) % cp.cuda.runtime.getDeviceCount()
    with cp.cuda.Device(other):
        x = cp.ones(4)
    with pytest.raises(
        ValueError, match=rf"array is on GPU {other}, expected GPU {gcomm.device.gpu}"
    ):
        gcomm.all_reduce(x)
