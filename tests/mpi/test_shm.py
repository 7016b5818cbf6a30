"""The shared-memory fast path (hpccomm/backends/shm.py): large all_reduce, reduce and
reduce_scatter among ranks of one node.

Every rank builds every rank's input from (rank, seed), so each can compute the expected
result with NumPy in the path's own order (rank 0, 1, ..., p-1): results must equal it
bitwise, floats included (NaN where NumPy has NaN). Most tests run on a fast path with a
small chunk and threshold (``small``), so a few KiB cross many chunk boundaries; one test
runs the default settings. Each test checks that the fast path ran (its call counter), so
none can pass by testing MPI instead."""

import ml_dtypes
import numpy as np
import pytest

import hpccomm
from hpccomm import CommTimeoutError, MismatchError, ReduceOp
from hpccomm.backends import shm as shm_mod
from hpccomm.backends.shm import ShmBackend
from hpccomm.ops import ALL_REDUCE, REDUCE_SCATTER

CHUNK = 4096  # bytes per chunk in the small fast path
THRESHOLD = 1024  # bytes

INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float32, np.float64]
OTHERS = [np.float16, ml_dtypes.bfloat16, np.complex64, np.complex128, np.bool_]
ALL = INTS + FLOATS + OTHERS
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
FLOAT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"]
UFUNC = {
    "SUM": np.add,
    "AVG": np.add,
    "PREMUL_SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
}
BOOL_UFUNC = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or,
              "PRODUCT": np.logical_and, "MIN": np.logical_and, "BAND": np.logical_and,
              "BXOR": np.logical_xor}  # fmt: skip

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's own expectations


def name(dt):
    return np.dtype(dt).name


def op_of(opname):
    return ReduceOp.PREMUL_SUM(0.5) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)


def inputs(rank, count, dtype, seed):
    """Rank ``rank``'s input: values that overflow small integers, NaN and inf in floats."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(1000 * seed + rank)
    if dt == np.bool_:
        return rng.integers(0, 2, count).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
        return rng.integers(lo, hi, count, dtype=np.int64 if dt.kind == "i" else np.uint64,
                            endpoint=True).astype(dt)  # fmt: skip
    x = rng.standard_normal(count) * 100
    if dt.kind == "c":
        x = x + 1j * rng.standard_normal(count)
    x = x.astype(dt)
    if count > 16:
        x[3] = np.nan if rank == 0 else 1  # NaN on one rank only
        x[5] = np.inf
        x[7] = -np.inf if rank == 1 else 2  # inf - inf on two ranks: NaN
    return x


def expected(size, count, dtype, opname, seed):
    """The reduction in the fast path's order, with NumPy."""
    dt = np.dtype(dtype)
    f = BOOL_UFUNC[opname] if dt == np.bool_ else UFUNC[opname]
    xs = [inputs(r, count, dtype, seed) for r in range(size)]
    if opname == "PREMUL_SUM":
        xs = [(x * 0.5).astype(dt) for x in xs]
    with np.errstate(all="ignore"):
        acc = xs[0].copy()
        for x in xs[1:]:
            acc = f(acc, x).astype(dt)
        if opname == "AVG":
            acc = np.divide(acc, size).astype(dt)
    return acc


def differs(got, want):
    """None when ``got`` equals ``want`` bitwise (NaN where NaN), else what differs."""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if got.dtype.kind in "fc" or got.dtype == ml_dtypes.bfloat16:
        g = got.astype(np.complex128 if got.dtype.kind == "c" else np.float64)
        w = want.astype(g.dtype)
        bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
    else:
        bad = got != want
    if bad.any():
        return f"{bad.sum()} of {got.size} differ, first at {np.flatnonzero(bad)[:5]}"
    return None


def same(got, want):
    problem = differs(got, want)
    assert problem is None, problem


class Checks:
    """Failures collected over a loop and asserted at its end, so a rank whose result is
    wrong does not leave the loop while the others wait in its next collective."""

    def __init__(self):
        self.bad = []

    def __call__(self, what, got, want):
        problem = differs(got, want)
        if problem is not None:
            self.bad.append(f"{what}: {problem}")

    def count(self, what, got, want):
        if got != want:
            self.bad.append(f"{what}: {got} fast-path calls, expected {want}")

    def done(self):
        assert not self.bad, "; ".join(self.bad[:10])


def ops_for(dtype):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    if dt.kind in "iu":
        return INT_OPS
    if dt.kind == "c":
        return ["SUM", "AVG", "PREMUL_SUM"]
    return FLOAT_OPS


def sizes_for(dtype, size):
    """Element counts around the threshold and chunk boundaries, odd ones, ones not a multiple
    of the rank count."""
    item = np.dtype(dtype).itemsize
    t, c = -(-THRESHOLD // item), CHUNK // item
    return sorted({t, t + 1, c - 1, c, c + 1, 2 * c - 1, 2 * c + 1, 3 * c + size + 2, 5 * c + 7})


@pytest.fixture
def small(comm):
    """``comm`` with a fast path of a 4 KiB chunk and a 1 KiB threshold."""
    if comm.size < 2:
        pytest.skip("the fast path needs 2 or more ranks (a group of 1 never takes it)")
    if comm.num_nodes != 1:
        pytest.skip("the fast path needs every rank on one node")
    fast = ShmBackend(comm._backend, THRESHOLD, CHUNK)
    comm._dispatcher.shm = fast
    comm._dispatcher.cache.clear()
    return comm, fast


def test_default_path_is_set_on_one_node(comm):
    fast = comm._dispatcher.shm
    if comm.size < 2 or comm.num_nodes != 1 or not shm_mod.settings().enabled:
        assert fast is None
        return
    assert isinstance(fast, ShmBackend)
    for spec, method in ((ALL_REDUCE, comm.all_reduce), (REDUCE_SCATTER, comm.reduce_scatter)):
        low, high = fast.ranges[spec]
        if shm_mod.settings().threshold is None:  # the defaults
            pair = spec is not REDUCE_SCATTER and comm.size == 2
            key = "pair" if pair else spec.name
            assert (low, high) == shm_mod.DEFAULT_RANGES[key]
        if low >= shm_mod.NEVER:
            continue
        counts = [low // 4 - 1, low // 4, low // 4 + 1, fast.chunk // 4 + 1]
        if high < shm_mod.NEVER:
            counts += [high // 4, high // 4 + 1]
        for count in counts:
            count = count // comm.size * comm.size or comm.size
            before = fast.calls
            x = np.full(count, comm.rank + 1, np.float32)
            got = method(x)
            assert (got == comm.size * (comm.size + 1) / 2).all()
            assert fast.calls == before + (low <= count * 4 <= high), count


@pytest.mark.parametrize("dtype", ALL, ids=name)
def test_all_reduce_every_op_and_size(small, dtype):
    comm, fast = small
    seed = 0
    check = Checks()
    for opname in ops_for(dtype):
        for count in sizes_for(dtype, comm.size):
            seed += 1
            before = fast.calls
            x = inputs(comm.rank, count, dtype, seed)
            got = comm.all_reduce(x, op=op_of(opname))
            assert got is x
            check.count((opname, count), fast.calls, before + 1)
            check((opname, count), x, expected(comm.size, count, dtype, opname, seed))
    check.done()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int64, np.float32, np.float64,
                                   np.float16], ids=name)  # fmt: skip
def test_reduce_scatter_every_op_and_size(small, dtype):
    comm, fast = small
    n = comm.size
    seed = 100
    check = Checks()
    for opname in ops_for(dtype):
        for rows in sorted({1, 7, CHUNK // 8 // n + 1, CHUNK // np.dtype(dtype).itemsize + 3}):
            count = rows * n
            if count * np.dtype(dtype).itemsize < THRESHOLD:
                continue
            seed += 1
            before = fast.calls
            x = inputs(comm.rank, count, dtype, seed)
            out = comm.reduce_scatter(x, op=op_of(opname))
            check.count((opname, rows), fast.calls, before + 1)
            want = expected(n, count, dtype, opname, seed)
            check((opname, rows), out, want[comm.rank * rows : (comm.rank + 1) * rows])
            check((opname, rows, "input"), x, inputs(comm.rank, count, dtype, seed))
    check.done()


def test_reduce_scatter_uneven_and_2d(small):
    comm, fast = small
    n = comm.size
    sizes = [(3 * r + 1) * 97 for r in range(n)]  # odd, all different, rows of 5
    rows = sum(sizes)
    x = inputs(comm.rank, rows * 5, np.float64, 7).reshape(rows, 5)
    before = fast.calls
    out = comm.reduce_scatter(x, sizes=sizes)
    assert fast.calls == before + 1
    want = expected(n, rows * 5, np.float64, "SUM", 7).reshape(rows, 5)
    start = sum(sizes[: comm.rank])
    assert out.shape == (sizes[comm.rank], 5)
    same(out, want[start : start + sizes[comm.rank]])
    # a rank with an empty block
    sizes = [0] + [400] * (n - 1)
    x = inputs(comm.rank, sum(sizes), np.int32, 8)
    out = comm.reduce_scatter(x, sizes=sizes)
    want = expected(n, sum(sizes), np.int32, "SUM", 8)
    start = sum(sizes[: comm.rank])
    same(out, want[start : start + sizes[comm.rank]])
    assert fast.calls == before + 2


@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=name)
def test_reduce_to_each_root(small, dtype):
    comm, fast = small
    count = 3 * CHUNK + 5
    check = Checks()
    for root in range(comm.size):
        before = fast.calls
        x = inputs(comm.rank, count, dtype, root)
        comm.reduce(x, root, op=ReduceOp.SUM)
        check.count(root, fast.calls, before + 1)
        if comm.rank == root:
            check(root, x, expected(comm.size, count, dtype, "SUM", root))
        else:
            check(root, x, inputs(comm.rank, count, dtype, root))  # non-roots keep their input
    check.done()


def test_async_op_and_repeated_calls_of_every_kind(small):
    comm, fast = small
    n = comm.size
    works = []
    before = fast.calls
    for i in range(12):  # sizes and ops alternate: the buffers' parity moves differently
        count = (i % 4 + 1) * CHUNK // 4 + i
        if i % 3 == 2:
            count = count // n * n
            x = inputs(comm.rank, count, np.float32, i)
            works.append((i, "rs", count, comm.reduce_scatter(x, async_op=True)))
        else:
            x = inputs(comm.rank, count, np.int16, i)
            works.append((i, "ar", count, x))
            if i % 2:
                comm.all_reduce(x, async_op=True).wait()
            else:
                comm.all_reduce(x)
    check = Checks()
    for i, kind, count, got in works:
        if kind == "rs":
            out = got.wait()
            k = count // n
            want = expected(n, count, np.float32, "SUM", i)[comm.rank * k : (comm.rank + 1) * k]
            check(i, out, want)
        else:
            check(i, got, expected(n, count, np.int16, "SUM", i))
    check.done()
    assert fast.calls == before + 12


def test_results_bitwise_identical_on_every_rank(small):
    comm, fast = small
    x = inputs(comm.rank, 7 * CHUNK // 8 + 3, np.float64, 42)
    comm.all_reduce(x)
    digests = comm.all_gather_object(x.tobytes())
    assert all(d == digests[0] for d in digests)
    assert fast.calls == 1


def test_the_record_names_the_backend(small):
    comm, fast = small
    log = []

    def listen(event, rec):
        log.append((event, rec.describe()))

    hpccomm.add_listener(listen)
    try:
        comm.all_reduce(np.ones(CHUNK, np.float32))
        comm.all_reduce(np.ones(4, np.float32))  # below the threshold: MPI
    finally:
        hpccomm.remove_listener(listen)
    ends = [d["backend"] for event, d in log if event == "end"]
    assert ends == ["shm", "mpi"]


def test_ranks_that_disagree_raise_a_mismatch_on_every_rank(small):
    comm, fast = small
    count = CHUNK + 8 * comm.rank  # a different count on every rank, all above the threshold
    x = np.ones(count, np.float32)
    with pytest.raises(MismatchError, match=r"the ranks' calls differ on the shared-memory path"):
        comm.all_reduce(x)
    # the group goes on: the next call is right
    y = np.full(CHUNK, comm.rank + 1.0, np.float32)
    comm.all_reduce(y)
    assert (y == comm.size * (comm.size + 1) / 2).all()


def test_a_segment_that_cannot_be_made_leaves_the_group_on_mpi(small, monkeypatch):
    comm, fast = small
    monkeypatch.setattr(shm_mod, "SHM_DIR", "/nonexistent-hpccomm-test")
    x = np.full(CHUNK, comm.rank + 1, np.int32)
    comm.all_reduce(x)
    assert (x == comm.size * (comm.size + 1) // 2).all()
    assert fast.calls == 0 and fast.segment is None
    assert "could not create /nonexistent-hpccomm-test/hpccomm-" in (fast.failed or "")
    y = np.full(3 * CHUNK, comm.rank + 1, np.int32)  # a new description: MPI from the start
    comm.all_reduce(y)
    assert (y == comm.size * (comm.size + 1) // 2).all()
    assert fast.calls == 0


def test_free_drops_the_segment(small):
    comm, fast = small
    g = comm.dup()
    gf = ShmBackend(g._backend, THRESHOLD, CHUNK)
    g._dispatcher.shm = gf
    g.all_reduce(np.ones(CHUNK, np.float32))
    assert gf.segment is not None and gf.calls == 1
    g.free()
    assert gf.segment is None
    with pytest.raises(hpccomm.ClosedError, match="already freed"):
        g.all_reduce(np.ones(CHUNK, np.float32))


@pytest.mark.mpi(min_size=2)
def test_a_late_rank_times_out_the_others_then_the_group_goes_on(small):
    # Rank 0 waits 0.5 s for a rank that joins after 1.5 s: a CommTimeoutError naming the
    # call, not a hang; once the late rank has joined, the call completes and the group works.
    import time

    comm, fast = small
    comm.timeout = 0.5
    x = np.full(4 * CHUNK, comm.rank + 1.0)
    if comm.rank == 0:
        with pytest.raises(CommTimeoutError, match=r"all_reduce #\d+ on .*not complete after"):
            comm.all_reduce(x)
    else:
        time.sleep(1.5)
        comm.all_reduce(x)
    comm.timeout = 30
    y = np.full(4 * CHUNK, comm.rank + 1.0)
    comm.all_reduce(y)  # queued behind the late call on rank 0
    total = comm.size * (comm.size + 1) / 2
    assert (y == total).all()
    assert (x == total).all()  # the timed-out call did complete on rank 0 too
    assert fast.calls == 2
