"""Wrong results and accepted bad input found by a differential trial (issue "Correctness"):
each test here failed before its fix. Arrays are large enough (hundreds of elements, values
that overflow) that SIMD paths and freed temporaries show."""

import gc
import re

import ml_dtypes
import numpy as np
import pytest

import hpccomm
from hpccomm import DtypeError, InvalidArgumentError, ReduceOp

INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float32, np.float64, np.complex64, np.complex128, np.float16, ml_dtypes.bfloat16]


def where(comm, op):
    """The prefix of validation errors: the group too, where it is not the world."""
    on = "" if comm.name == "world" else f" on {re.escape(comm.name)}"
    return rf"{op}{on} \(rank {comm.rank} of {comm.size}\)"


def wide(a):
    return a.astype(np.complex128) if a.dtype.kind == "c" else a.astype(np.float64)


def churn():
    """Allocate and free memory of the sizes hpccomm's temporaries have, so a temporary freed
    too early gets overwritten before MPI reads it."""
    gc.collect()
    return [np.full(n, 7.0, np.float64) for n in (64, 256, 512, 1024) for _ in range(8)]


@pytest.mark.parametrize("dtype", FLOATS, ids=[np.dtype(d).name for d in FLOATS])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("opname", ["all_reduce", "reduce", "reduce_scatter"])
def test_premul_sum_temporary_lives_until_completion(comm, dtype, async_op, opname):
    n, r = comm.size, comm.rank
    count = 512 * n
    x = (np.arange(count) % 61 + r).astype(dtype)
    op = ReduceOp.PREMUL_SUM(0.5)
    expect = 0.5 * sum(wide((np.arange(count) % 61 + i).astype(dtype)) for i in range(n))
    if opname == "all_reduce":
        res = comm.all_reduce(x, op=op, async_op=async_op)
    elif opname == "reduce":
        res = comm.reduce(x, n - 1, op=op, async_op=async_op)
    else:
        res = comm.reduce_scatter(x, op=op, async_op=async_op)
        expect = expect[512 * r : 512 * (r + 1)]
    if async_op:
        junk = churn()
        res = res.wait(timeout=60)
        del junk
    if opname == "reduce" and r != n - 1:
        return
    tol = 1e-2 if np.dtype(dtype).itemsize == 2 else 1e-5
    np.testing.assert_allclose(wide(np.asarray(res)), expect, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", INTS, ids=[np.dtype(d).name for d in INTS])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("opname", ["SUM", "PRODUCT"])
def test_integer_overflow_wraps_like_numpy(comm, dtype, async_op, opname):
    n, r = comm.size, comm.rank
    info = np.iinfo(dtype)
    count = 67 * n  # whole SIMD vectors of every width and a tail, divisible by n

    def make(i):
        if opname == "SUM":
            return np.full(count, info.max if i == 0 else 2 + i, dtype)
        return np.full(count, info.max // 3 + i, dtype)

    with np.errstate(over="ignore"):
        ufunc = np.add if opname == "SUM" else np.multiply
        expect = make(0)
        for i in range(1, n):
            expect = ufunc(expect, make(i))
    op = getattr(ReduceOp, opname)
    got = comm.all_reduce(make(r), op=op, async_op=async_op)
    got = got.wait(timeout=60) if async_op else got
    np.testing.assert_array_equal(got, expect)
    got = comm.reduce(make(r), 0, op=op, async_op=async_op)
    got = got.wait(timeout=60) if async_op else got
    if r == 0:
        np.testing.assert_array_equal(got, expect)
    got = comm.reduce_scatter(make(r), op=op, async_op=async_op)
    got = got.wait(timeout=60) if async_op else got
    np.testing.assert_array_equal(got, expect[67 * r : 67 * (r + 1)])


@pytest.mark.mpi(min_size=2)  # a non-source rank
def test_scatter_block_on_non_source_is_refused(comm):
    if comm.rank != 0:  # raised before MPI is touched: the source rank does not call
        block = np.empty(3)
        with pytest.raises(
            InvalidArgumentError,
            match=where(comm, "scatter")
            + r": non-source ranks need out= .*got only an array of shape \(3,\)",
        ):
            comm.scatter(block, src=0)
        # the hint: the block of a full array that splits evenly; none that the source would
        # refuse (5 rows at 4 ranks suggested shape (1,))
        with pytest.raises(InvalidArgumentError, match=rf"e.g. shape \({4 * comm.size - 4},\) if"):
            comm.scatter(np.empty(4 * comm.size * (comm.size - 1)), src=0)
        if 3 % comm.size:
            with pytest.raises(InvalidArgumentError) as info:
                comm.scatter(block, src=0)
            assert f"its 3 rows do not make {comm.size} equal blocks" in str(info.value)
            assert "e.g. shape" not in str(info.value)
        # with sizes=: this rank's block by them; an array whose rows are not their sum is
        # no full array (it said "e.g. shape ('sizes[1]',) if it is the full array")
        sizes = list(range(1, comm.size + 1))
        with pytest.raises(InvalidArgumentError, match=rf"e.g. shape \({comm.rank + 1}, 2\) if"):
            comm.scatter(np.empty((sum(sizes), 2)), src=0, sizes=sizes)
        with pytest.raises(InvalidArgumentError) as info:
            comm.scatter(np.empty(sum(sizes) - 1), src=0, sizes=sizes)
        assert (
            f"pass out=<block>, of shape ({comm.rank + 1},) (its {sum(sizes) - 1} rows are not "
            f"the {sum(sizes)} rows sizes= adds up to, so it is no full array)"
        ) in str(info.value)
        with pytest.raises(InvalidArgumentError, match=r"sizes has 1 entry, expected"):
            comm.scatter(np.empty(4), src=0, sizes=[4])
        with pytest.raises(InvalidArgumentError, match=r"of at least one axis \(a 0-d array is"):
            comm.scatter(np.empty(()), src=0)


def test_scatter_torch_style_out_block(comm):
    n, r = comm.size, comm.rank
    full = np.arange(6.0 * n) if r == 0 else None
    block = np.empty(6)
    assert comm.scatter(full, src=0, out=block) is block
    assert np.array_equal(block, np.arange(6.0 * r, 6.0 * r + 6))


def test_premul_sum_factor_refusals(comm):
    with pytest.raises(DtypeError, match=r"PREMUL_SUM: factor is True \(bool\)"):
        ReduceOp.PREMUL_SUM(True)
    with pytest.raises(DtypeError, match="PREMUL_SUM: factor is '2'"):
        ReduceOp.PREMUL_SUM("2")
    # Every rank raises before MPI: nobody is left waiting.
    with pytest.raises(
        DtypeError,
        match=where(comm, "all_reduce")
        + r": op PREMUL_SUM has the complex factor \(1\+1j\) for dtype float32",
    ):
        comm.all_reduce(np.ones(4, np.float32), op=ReduceOp.PREMUL_SUM(1 + 1j))
    z = np.ones(4, np.complex64)
    comm.all_reduce(z, op=ReduceOp.PREMUL_SUM(1 + 1j))
    np.testing.assert_allclose(z, np.full(4, (1 + 1j) * comm.size))
    y = np.ones(4)
    comm.all_reduce(y, op=ReduceOp.PREMUL_SUM(np.float32(0.25)))
    np.testing.assert_allclose(y, np.full(4, 0.25 * comm.size))


def test_src_and_dst_positional_as_in_torch(comm):
    n, r = comm.size, comm.rank
    x = np.full(5, float(r))
    assert comm.broadcast(x, n - 1) is x
    assert np.array_equal(x, np.full(5, n - 1.0))
    y = np.full(5, r + 1, np.int64)
    comm.reduce(y, n - 1, op=ReduceOp.MAX)
    if r == n - 1:
        assert np.array_equal(y, np.full(5, n))
    w = comm.broadcast(np.full(2, float(r)), 0, async_op=True)
    assert np.array_equal(w.wait(timeout=60), np.zeros(2))


def test_numpy_integers_as_tag_colour_and_ranks(comm):
    n, r = comm.size, comm.rank
    out = np.empty(3)
    comm.sendrecv(np.full(3, float(r)), dst=(r + 1) % n, src=(r - 1) % n, out=out, tag=np.int64(7))
    assert np.array_equal(out, np.full(3, float((r - 1) % n)))
    work = comm.irecv(np.empty(2), (r - 1) % n, tag=np.int32(5))
    comm.send(np.ones(2), np.int64((r + 1) % n), tag=np.uint8(5))
    assert work.wait(timeout=60) == (r - 1) % n
    half = comm.split(np.int64(r % 2), key=np.int32(-r))
    assert half.size == len(range(r % 2, n, 2))
    assert half.rank == sorted(range(r % 2, n, 2), reverse=True).index(r)
    with comm.new_group([np.int64(i) for i in range(n)]) as everyone:
        assert everyone.size == n


def test_split_colour_out_of_range(comm):
    with pytest.raises(InvalidArgumentError, match=where(comm, "split") + r": color is 2147483648"):
        comm.split(2**31)
    with pytest.raises(InvalidArgumentError, match=where(comm, "split") + r": color is -1"):
        comm.split(-1)


def test_read_only_output_is_refused(comm):
    x = np.ones(4)
    x.flags.writeable = False
    with pytest.raises(
        InvalidArgumentError,
        match=where(comm, "all_reduce") + r": array is read-only .*expected a writable array",
    ):
        comm.all_reduce(x)
    out = np.empty(4 * comm.size)
    out.flags.writeable = False
    with pytest.raises(
        InvalidArgumentError, match=where(comm, "all_gather") + ": out is read-only"
    ):
        comm.all_gather(np.ones(4), out=out)
    # A read-only array that is only read is fine: the input of all_gather, the broadcast source.
    got = comm.all_gather(x)
    assert np.array_equal(got, np.ones(4 * comm.size))
    src = np.arange(3.0)
    src.flags.writeable = False
    dst = np.arange(3.0) if comm.rank == 0 else np.zeros(3)
    comm.broadcast(src if comm.rank == 0 else dst, 0)
    assert np.array_equal(dst if comm.rank else src, np.arange(3.0))


def test_masked_array_is_refused(comm):
    m = np.ma.masked_array(np.ones(4), mask=[0, 1, 0, 0])
    with pytest.raises(
        InvalidArgumentError, match=where(comm, "all_reduce") + r": array is a masked array"
    ):
        comm.all_reduce(m)


def test_errors_name_hpccomm_types():
    # Every error above is an HpccommError and the builtin a caller would catch.
    assert issubclass(InvalidArgumentError, hpccomm.HpccommError)
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(DtypeError, TypeError)


def test_nan_inf_and_overflow_raise_no_numpy_warnings(comm):
    # MPI's own ops reduce NaN, inf - inf and overflow silently; hpccomm's NumPy ops (float16,
    # NaN-propagating MIN/MAX, PREMUL_SUM's and AVG's scaling, AVG's division before) warned from inside the
    # library ("invalid value encountered in add", backends/mpi.py)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for dt in (np.float16, np.float32, np.float64, np.complex64):
            ops = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PREMUL_SUM(0.5)]
            if dt != np.complex64:
                ops += [ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
            for op in ops:
                for n in (7, 70001):
                    x = np.full(n, np.nan if comm.rank == 0 else np.inf, dt)
                    x[1] = -np.inf if comm.rank else np.inf
                    x[2] = 6e4 if dt == np.float16 else 3e38
                    comm.all_reduce(x, op=op)
                    comm.reduce_scatter(np.repeat(x, comm.size), op=op)
    mine = [w for w in caught if "hpccomm" in w.filename]
    assert not mine, [(w.filename, w.lineno, str(w.message)) for w in mine]


@pytest.mark.parametrize(
    "dtype, value",
    [(np.float16, 6e4), (ml_dtypes.bfloat16, 3e38), (np.float32, 3e38), (np.float64, 1.7e308),
     (np.complex64, 3e38 + 3e38j)],
    ids=["float16", "bfloat16", "float32", "float64", "complex64"],
)  # fmt: skip
@pytest.mark.parametrize("count", [1, 1023, 262_147], ids=["1", "1023", "262147"])
def test_avg_of_values_near_the_dtypes_limit_is_their_average(comm, dtype, value, count):
    # AVG summed, then divided: every rank's 60,000 in float16 (its max is 65,504) gave inf
    # on 2 ranks or more, where NCCL's AVG (a PreMulSum by 1/size) gives 60,000 (an outside
    # hunt). It is PREMUL_SUM(1/size) now, on MPI and on the shared-memory path (the large
    # size), for all_reduce, reduce and reduce_scatter, async and bounded too
    dt = np.dtype(dtype)
    each = np.array(value, dt)  # (the value as the dtype holds it)
    with np.errstate(over="ignore"):  # (complex64's multiply by 1.0 at 1 rank warns)
        scaled = (each * (1.0 / comm.size)).astype(dt)
    want = scaled
    for _ in range(comm.size - 1):
        want = (want + scaled).astype(dt)  # (the sum of equal terms: any order alike)
    assert np.isfinite(want.astype(np.complex128)).all() and want == want  # the test's own
    tol = 4 * comm.size * float(np.finfo(np.float16 if dt == np.float16 else np.float32).eps)
    assert abs(complex(want) - complex(each)) <= tol * abs(complex(each))
    for async_op in (False, True):
        x = np.full(count, each, dt)
        w = comm.all_reduce(x, op=ReduceOp.AVG, async_op=async_op)
        if async_op:
            w.wait()
        assert (x == want).all(), (x[:3], want)
        y = np.full(count, each, dt)
        w = comm.reduce(y, 0, op=ReduceOp.AVG, async_op=async_op)
        if async_op:
            w.wait()
        if comm.rank == 0:
            assert (y == want).all(), (y[:3], want)
        z = np.full(count * comm.size, each, dt)
        out = np.empty(count, dt)
        w = comm.reduce_scatter(z, out=out, op=ReduceOp.AVG, async_op=async_op)
        if async_op:
            w.wait()
        assert (out == want).all(), (out[:3], want)


@pytest.mark.parametrize("opname", ["SUM", "MAX", "BOR", "PRODUCT", "MIN", "BAND", "BXOR"])
@pytest.mark.parametrize("count", [7, 300_001], ids=["small", "large"])
def test_bool_reductions_are_logical_whatever_the_bytes(comm, opname, count):
    # A bool array whose bytes are not 0/1 (np.frombuffer, .view(bool)) is True wherever its
    # byte is not 0, to NumPy. MPI's C_BOOL ops took the bytes as they were: BXOR of [2, 1]
    # and [1, 2] gave [3, 3] (True) where logical XOR is False, and the others left bytes
    # other than 0/1 in the result. (The large size runs on the shared-memory path.)
    logical = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or,
               "PRODUCT": np.logical_and, "MIN": np.logical_and, "BAND": np.logical_and,
               "BXOR": np.logical_xor}[opname]  # fmt: skip

    def raw(r):
        return ((np.arange(count) * 7 + 3 * r) % 4).astype(np.uint8) * (1 + r % 3)

    x = raw(comm.rank).view(np.bool_)
    expect = raw(0) != 0
    for r in range(1, comm.size):
        expect = logical(expect, raw(r) != 0)
    comm.all_reduce(x, op=opname)
    assert np.array_equal(x.view(np.uint8) != 0, expect)
    if comm.size > 1:  # (one rank's all_reduce leaves its array as it is)
        assert np.array_equal(x.view(np.uint8), expect.view(np.uint8))
