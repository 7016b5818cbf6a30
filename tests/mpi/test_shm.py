"""The shared-memory fast path (hpccomm/backends/shm.py): large all_reduce, reduce and
reduce_scatter among ranks of one node.

Every rank builds every rank's input from (rank, seed), so each can compute the expected
result with NumPy in the path's own order (rank 0, 1, ..., p-1): results must equal it
bitwise, floats included (NaN where NumPy has NaN). Most tests run on a fast path with a
small chunk and threshold (``small``), so a few KiB cross many chunk boundaries; one test
runs the default settings. Each test checks that the fast path ran (its call counter), so
none can pass by testing MPI instead."""

import contextlib
import errno
import gc
import os
import re
import time

import ml_dtypes
import numpy as np
import pytest

import hpccomm
from hpccomm import CommTimeoutError, MismatchError, ReduceOp, arena
from hpccomm.backends import shm as shm_mod
from hpccomm.backends.shm import ShmBackend
from hpccomm.notices import ASK_WAIT
from hpccomm.ops import ALL_REDUCE, REDUCE, REDUCE_SCATTER

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
    if opname in ("PREMUL_SUM", "AVG"):  # AVG: PREMUL_SUM(1/size), as NCCL
        xs = [(x * (0.5 if opname == "PREMUL_SUM" else 1.0 / size)).astype(dt) for x in xs]
    with np.errstate(all="ignore"):
        acc = xs[0].copy()
        for x in xs[1:]:
            acc = f(acc, x).astype(dt)
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


def with_fast_path(comm, monkeypatch=None, *, direct=False, chunk=CHUNK, threshold=THRESHOLD):
    """``comm`` with a fast path of a 4 KiB chunk (or ``chunk``) and a 1 KiB threshold (or
    ``threshold``); with
    ``monkeypatch``, pieces of 4 KiB for symmetric buffers and single copy (so small sizes
    cross many); with ``direct``, the single-copy path from 1 KiB, probed here: skipped,
    with the reason, only where Yama forbids one rank reading another's memory; elsewhere
    the probe must succeed."""
    if comm.size < 2:
        pytest.skip("the fast path needs 2 or more ranks (a group of 1 never takes it)")
    if comm.num_nodes != 1:
        pytest.skip("the fast path needs every rank on one node")
    if monkeypatch is not None:
        monkeypatch.setattr(shm_mod, "SYM_PIECE", PIECE)
    fast = ShmBackend(comm._backend, threshold, chunk, direct=direct)
    comm._dispatcher.shm = fast
    comm._dispatcher.cache.clear()
    if direct:
        comm.all_reduce(np.ones(THRESHOLD, np.uint8))  # the first call probes
        if fast.cma is None:
            scope = ptrace_scope()
            if scope:
                pytest.skip(f"Yama's ptrace_scope is {scope} here: {fast.cma_why}")
            pytest.fail(f"the single-copy probe failed: {fast.cma_why}")
        assert (fast.direct_calls, fast.calls) == (1, 0)
        fast.direct_calls = 0
    return comm, fast


@pytest.fixture
def small(comm):
    """``comm`` with a fast path of a 4 KiB chunk and a 1 KiB threshold (the copy path)."""
    return with_fast_path(comm)


def test_default_path_is_set_on_one_node(comm):
    # The default ranges, and the path each size takes: the single-copy path in its range
    # (where this machine allows it), else the copy path in its range, else MPI.
    fast = comm._dispatcher.shm
    if comm.size < 2 or comm.num_nodes != 1 or not shm_mod.settings().enabled:
        assert fast is None
        return
    assert isinstance(fast, ShmBackend)
    total = comm.size * (comm.size + 1) / 2
    methods = (
        (ALL_REDUCE, comm.all_reduce, lambda x, got: (got == total).all()),
        (REDUCE_SCATTER, comm.reduce_scatter, lambda x, got: (got == total).all()),
        (REDUCE, lambda x: comm.reduce(x, 0), lambda x, got: comm.rank or (x == total).all()),
    )
    pair = "pair" if comm.size == 2 else "group"
    for spec, method, right in methods:
        low, high = fast.ranges[spec]
        dlow, dhigh = fast.direct_ranges[spec]
        if shm_mod.settings().threshold is None:  # the defaults
            key = spec.name if spec is REDUCE_SCATTER or comm.size > 2 else "pair"
            assert (low, high) == shm_mod.DEFAULT_RANGES[key]
            if shm_mod.settings().cma:
                key = f"reduce {pair}" if spec is REDUCE else pair
                assert (dlow, dhigh) == shm_mod.DIRECT_RANGES[key]
            else:
                assert dlow == shm_mod.NEVER
        counts = []
        for lo, hi in ((low, high), (dlow, dhigh)):
            if lo < shm_mod.NEVER:
                counts += [lo // 4 - 1, lo // 4, lo // 4 + 1, fast.chunk // 4 + 1]
            if hi < shm_mod.NEVER:
                counts += [hi // 4, hi // 4 + 1]
        for count in sorted(set(counts)):
            count = count // comm.size * comm.size or comm.size
            before = (fast.calls, fast.direct_calls)
            x = np.full(count, comm.rank + 1, np.float32)
            got = method(x)
            assert right(x, got), (spec.name, count)
            direct = fast.cma is not None and dlow <= count * 4 <= dhigh
            copies = not direct and low <= count * 4 <= high
            want = (before[0] + copies, before[1] + direct)
            assert (fast.calls, fast.direct_calls) == want, (spec.name, count)


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


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # (np.matrix)
@pytest.mark.parametrize("direct", [False, True], ids=["copy", "single-copy"])
def test_an_ndarray_subclass_takes_the_fast_path_as_mpi_takes_it(comm, monkeypatch, direct):
    # np.matrix reshapes to (1, n): the fast path failed on every rank ("operands could not
    # be broadcast together with shapes (1,100000) (32768,)"), where MPI's path, below the
    # threshold, worked (an outside hunt)
    comm, fast = with_fast_path(comm, monkeypatch, direct=direct)
    n = comm.size
    count = 3 * CHUNK + 5 * n  # (float64: many chunks and pieces, a multiple of n)
    x = np.matrix(inputs(comm.rank, count, np.float64, 11))
    before = fast.calls + fast.direct_calls
    got = comm.all_reduce(x)
    assert got is x and type(got) is np.matrix and x.shape == (1, count)
    same(np.asarray(x).reshape(-1), expected(n, count, np.float64, "SUM", 11))
    x = np.matrix(inputs(comm.rank, count, np.float64, 12))
    comm.reduce(x, 0)
    if comm.rank == 0:
        same(np.asarray(x).reshape(-1), expected(n, count, np.float64, "SUM", 12))
    y = np.matrix(inputs(comm.rank, count, np.float64, 13)).T  # (count, 1): rows split
    out = comm.reduce_scatter(y)
    block = count // n
    want = expected(n, count, np.float64, "SUM", 13)[comm.rank * block : (comm.rank + 1) * block]
    same(np.asarray(out).reshape(-1), want)
    assert fast.calls + fast.direct_calls == before + 3


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


@pytest.mark.parametrize("debug", ["large", "off"])
def test_ranks_that_disagree_raise_a_mismatch_on_every_rank(small, debug):
    # debug "large" (the default) compares the calls before the fast path runs (a rank whose
    # call differs may be on MPI, another size); with it off the header check finds it
    comm, fast = small
    count = CHUNK + 8 * comm.rank  # a different count on every rank, all above the threshold
    x = np.ones(count, np.float32)
    said = "shape is" if debug == "large" else "on the shared-memory path"
    with at_debug(comm, debug), pytest.raises(MismatchError, match=f"calls differ.*{said}"):
        comm.all_reduce(x)
    # the group goes on: the next call is right
    y = np.full(CHUNK, comm.rank + 1.0, np.float32)
    comm.all_reduce(y)
    assert (y == comm.size * (comm.size + 1) / 2).all()


@contextlib.contextmanager
def at_debug(comm, level, restore=True):
    """``comm`` at the debug level ``level`` for the block (then back, when ``restore``:
    setting the level is a collective step of the group, which every rank must make)."""
    before = comm.debug
    comm.debug = level
    try:
        yield
    finally:  # (an assertion failing on one rank: it restores too, meeting the others)
        if restore:
            comm.debug = before


@pytest.mark.parametrize("against", ["size", "broadcast"])
def test_a_rank_on_the_fast_path_and_one_on_mpi_get_a_mismatch(comm, against):
    # Rank 1's call is 4 bytes smaller (below the fast path's 64 KiB: MPI) or another
    # collective: the fast path's header check cannot see a rank that is on MPI, so the
    # debug check (default "large") compares the calls first, as on MPI: MismatchError on
    # every rank instead of rank 0 waiting in the fast path's barrier for ever.
    comm, fast = with_fast_path(comm, threshold=64 << 10)
    count = (64 << 10) // 4
    x = np.ones(count - (comm.rank == 1), np.float32)
    said = r"shape is \(16384,\) on ranks? 0.* but \(16383,\) on rank 1"
    if against == "broadcast":
        x = np.ones(count, np.float32)
        said = r"the call is 'all_reduce' on ranks? 0.* but 'broadcast' on rank 1"
    with pytest.raises(MismatchError, match=said):
        if comm.rank == 1 and against == "broadcast":
            comm.broadcast(x, 0)
        else:
            comm.all_reduce(x)
    y = np.full(count, comm.rank + 1.0, np.float32)
    comm.all_reduce(y)  # the group goes on, on the fast path
    assert (y == comm.size * (comm.size + 1) / 2).all()
    assert fast.calls == 1


def _no_memfd(*args):
    raise OSError(38, "Function not implemented")


def test_a_segment_that_cannot_be_made_leaves_the_group_on_mpi(small, monkeypatch):
    comm, fast = small
    monkeypatch.setattr(shm_mod.os, "memfd_create", _no_memfd)
    monkeypatch.setattr(shm_mod, "SHM_DIR", "/nonexistent-hpccomm-test")
    x = np.full(CHUNK, comm.rank + 1, np.int32)
    comm.all_reduce(x)
    assert (x == comm.size * (comm.size + 1) // 2).all()
    assert fast.calls == 0 and fast.segment is None
    assert "could not create /nonexistent-hpccomm-test/hpccomm-" in (fast.failed or "")
    assert "(nameless file: rank 0: memfd_create: [Errno 38]" in (fast.failed or "")
    y = np.full(3 * CHUNK, comm.rank + 1, np.int32)  # a new description: MPI from the start
    comm.all_reduce(y)
    assert (y == comm.size * (comm.size + 1) // 2).all()
    assert fast.calls == 0


def test_the_segment_is_a_nameless_file(small):
    comm, fast = small
    before = set(os.listdir(shm_mod.SHM_DIR))
    x = np.full(CHUNK, comm.rank + 1, np.int32)
    comm.all_reduce(x)
    assert (x == comm.size * (comm.size + 1) // 2).all()
    assert fast.calls == 1 and fast.segment is not None
    # nothing named: a job that dies while the segment is being made leaves nothing behind
    made = [n for n in set(os.listdir(shm_mod.SHM_DIR)) - before if n.startswith("hpccomm-")]
    assert made == []
    mine = os.readlink(f"/proc/self/map_files/{_mapping_of(fast.segment.raw)}")
    assert mine.startswith("/memfd:hpccomm-shm")


def _mapping_of(a):
    """The /proc/self/map_files name of the mapping holding array ``a``."""
    addr = a.ctypes.data
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.split()[0]
    raise AssertionError("not mapped")


def test_without_memfd_a_named_file_is_made_and_unlinked(small, monkeypatch):
    comm, fast = small
    monkeypatch.setattr(shm_mod.os, "memfd_create", _no_memfd)
    before = set(os.listdir(shm_mod.SHM_DIR))
    x = np.full(CHUNK, comm.rank + 1, np.int32)
    comm.all_reduce(x)
    assert (x == comm.size * (comm.size + 1) // 2).all()
    assert fast.calls == 1 and fast.segment is not None and fast.failed is None
    comm.barrier()  # rank 0 has unlinked it
    made = [n for n in set(os.listdir(shm_mod.SHM_DIR)) - before if n.startswith("hpccomm-")]
    assert made == []


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
    # Rank 0 waits 0.5 s for a rank that joins after 2.5 s: a CommTimeoutError naming the
    # call, not a hang; once the late rank has joined, the call completes and the group works.
    import time

    comm, fast = small
    comm.timeout = 0.5
    x = np.full(4 * CHUNK, comm.rank + 1.0)
    if comm.rank == 0:
        with pytest.raises(CommTimeoutError, match=r"all_reduce #\d+ on .*not complete after"):
            comm.all_reduce(x)
    else:  # (past rank 0's timeout and its asking where the others are)
        time.sleep(0.5 + ASK_WAIT + 1.0)
        comm.all_reduce(x)
    comm.timeout = 30
    y = np.full(4 * CHUNK, comm.rank + 1.0)
    comm.all_reduce(y)  # queued behind the late call on rank 0
    total = comm.size * (comm.size + 1) / 2
    assert (y == total).all()
    assert (x == total).all()  # the timed-out call did complete on rank 0 too
    assert fast.calls == 2


# -- symmetric buffers (comm.empty) --------------------------------------------------------

PIECE = 4096  # bytes each rank reduces at a time from symmetric buffers, in these tests


@pytest.fixture
def sym(comm, monkeypatch):
    """``small`` with pieces of 4 KiB for symmetric buffers, so small sizes cross many."""
    return with_fast_path(comm, monkeypatch)


def sym_sizes(dtype, size):
    """Element counts around the threshold and the piece boundaries of one rank's part
    (all_reduce cuts the array into ``size`` parts), odd ones."""
    item = np.dtype(dtype).itemsize
    t, c = -(-THRESHOLD // item), PIECE // item
    return sorted({t, t + 1, c - 1, c + 1, size * c - 1, size * c, size * c + 1,
                   3 * size * c + 7, 5 * c + size + 2})  # fmt: skip


def written(x, values, offset=0):
    """``values`` into ``x`` from element ``offset``; returns that part of ``x``."""
    part = x[offset : offset + values.size]
    part[...] = values
    return part


@pytest.mark.parametrize("dtype", ALL, ids=name)
def test_symmetric_all_reduce_every_op_and_size(sym, dtype):
    comm, fast = sym
    counts = sym_sizes(dtype, comm.size)
    x = comm.empty(max(counts) + 1, dtype)
    assert comm.is_symmetric(x)
    seed = 0
    check = Checks()
    for opname in ops_for(dtype):
        for count in counts:
            seed += 1
            offset = seed % 2  # the same part of every rank's buffer, at byte 0 or 1 element
            before, copies = fast.sym_calls, fast.calls
            y = written(x, inputs(comm.rank, count, dtype, seed), offset)
            got = comm.all_reduce(y, op=op_of(opname))
            what = f"{opname} {count}+{offset}"
            check(what, got, expected(comm.size, count, dtype, opname, seed))
            check.count(what, fast.sym_calls - before + fast.calls - copies, 1)
            check.count(what + " copies", fast.calls - copies, 0)
    check.done()


def test_symmetric_async_op_and_repeated_calls(sym):
    comm, fast = sym
    n = comm.size
    x = comm.empty(4 * PIECE, np.float64)
    check = Checks()
    for i in range(10):  # symmetric calls between copy-path calls: the ticks interleave
        count = (i % 4 + 1) * PIECE // 8 + i
        y = written(x, inputs(comm.rank, count, np.float64, i))
        if i % 3 == 0:
            got = comm.all_reduce(y, async_op=True).wait()
        else:
            got = comm.all_reduce(y)
        check(i, got, expected(n, count, np.float64, "SUM", i))
        z = inputs(comm.rank, CHUNK + i, np.int32, i)  # an ordinary array: the copy path
        comm.all_reduce(z)
        check(f"{i} ordinary", z, expected(n, CHUNK + i, np.int32, "SUM", i))
    check.done()
    assert (fast.sym_calls, fast.calls) == (10, 10)


def test_symmetric_results_bitwise_equal_to_the_copy_path(sym):
    comm, fast = sym
    count = 5 * PIECE // 8 + 3
    x = comm.empty(count, np.float32)
    written(x, inputs(comm.rank, count, np.float32, 9))
    comm.all_reduce(x, op=ReduceOp.AVG)
    y = inputs(comm.rank, count, np.float32, 9)
    comm.all_reduce(y, op=ReduceOp.AVG)
    same(x, y)
    digests = comm.all_gather_object(x.tobytes())
    assert all(d == digests[0] for d in digests)
    assert (fast.sym_calls, fast.calls) == (1, 1)


def test_symmetric_buffers_that_differ_raise_a_mismatch_on_every_rank(sym):
    comm, fast = sym
    count = 2 * PIECE
    a = comm.empty(count, np.float32)
    b = comm.empty(count, np.float32)
    mine = a if comm.rank == 0 else b  # rank 0 passes buffer 1, the others buffer 2
    with pytest.raises(MismatchError, match=r"rank 0: all_reduce #\d+ of 8192 float32 \(SUM, "
                       r"symmetric buffer \d+ at byte 0.*rank 1: all_reduce #\d+ of 8192 float32 "
                       r"\(SUM, symmetric buffer \d+ at byte 0"):  # fmt: skip
        comm.all_reduce(mine)
    # a symmetric buffer on rank 0, an ordinary array (on the copy path) on the others: the
    # debug check (default "large") compares it before the path runs; without it, the
    # path's header check
    mine = a if comm.rank == 0 else np.ones(count, np.float32)
    with pytest.raises(
        MismatchError,
        match=r"memory is 'symmetric buffer' on rank 0 but 'ordinary array' on ranks? 1",
    ):
        comm.all_reduce(mine)
    with (
        at_debug(comm, "off"),
        pytest.raises(MismatchError, match=r"symmetric buffer \d+ at byte 0.*an ordinary array"),
    ):
        comm.all_reduce(mine)
    # another part of the same buffer on rank 0
    mine = a[4:] if comm.rank == 0 else a[: count - 4]
    with pytest.raises(MismatchError, match=r"at byte 16.*at byte 0"):
        comm.all_reduce(mine)
    # the group goes on
    a[...] = comm.rank + 1
    comm.all_reduce(a)
    assert (a == comm.size * (comm.size + 1) / 2).all()


@pytest.mark.parametrize("debug", ["large", "check"])
def test_a_symmetric_buffer_against_an_ordinary_array_that_mpi_runs(comm, debug):
    # At the default sizes a symmetric buffer takes the symmetric path from 256 KiB, an
    # ordinary array MPI where no other path takes it (pairs without single copy, 3 ranks
    # below 1 MiB): a rank passing one against ranks passing the other waited in the path's
    # barrier while they waited in MPI's allreduce, until a timeout that said every rank was
    # in the call with the same arguments (an outside hunt). Now the debug check compares
    # which kind each rank passed: MismatchError on every rank, and the group goes on.
    comm, fast = with_fast_path(comm, threshold=None)
    count = (256 << 10) // 4
    a = comm.zeros(count, np.float32)
    mine = a if comm.rank == 0 else np.zeros(count, np.float32)
    with (
        at_debug(comm, debug),
        pytest.raises(
            MismatchError,
            match=r"memory is 'symmetric buffer' on rank 0 but 'ordinary array' on ranks? 1",
        ),
    ):
        comm.all_reduce(mine)
    # the group goes on: the same kinds on every rank, each on its path
    a[...] = comm.rank + 1
    comm.all_reduce(a)
    assert (a == comm.size * (comm.size + 1) / 2).all() and fast.sym_calls == 1
    x = np.full(count, comm.rank + 1, np.float32)
    comm.all_reduce(x)
    assert (x == comm.size * (comm.size + 1) / 2).all()
    # below the symmetric range both kinds run on MPI: mixing them there is no mismatch
    small = count // 4
    mine = a[:small] if comm.rank == 0 else np.ones(small, np.float32)
    mine[...] = 1
    with at_debug(comm, debug):
        comm.all_reduce(mine)
    assert (mine == comm.size).all() and fast.sym_calls == 1


def test_empty_with_different_shapes_is_a_mismatch_on_every_rank(sym):
    comm, fast = sym
    # (compared before the call at every debug level but off, as every group step is; the
    # call's own comparison, under "off", says "the ranks ask for different arrays")
    with pytest.raises(MismatchError, match=r"empty #\d+ on .*\(rank \d+ of \d+\): the ranks' "
                       r"calls differ: shape is \(4,\) on rank 0(,| but) \(5,\) on rank 1"):  # fmt: skip
        comm.empty(4 + comm.rank, np.float32)
    comm.debug, level = "off", comm.debug
    on = "" if comm.name == "world" else f" on {re.escape(comm.name)}"
    with pytest.raises(MismatchError, match=rf"empty{on} \(rank \d+ of \d+\): the ranks ask for "
                       r"different arrays \(rank 0: \(4,\) float32; rank 1: \(5,\) float32"):  # fmt: skip
        comm.empty(4 + comm.rank, np.float32)
    comm.debug = level
    with pytest.raises(
        hpccomm.DtypeError, match=rf"empty{on} \(rank \d+ of \d+\): dtype is <U4, expected one of"
    ):
        comm.empty(4, np.dtype("U4"))
    assert comm.is_symmetric(comm.empty((3, 5), np.int16))
    # a shape too large for any array: NumPy's int64 product wrapped (2**62 x 3 to a
    # negative count), so each rank read another span of the mapping (a bare ValueError)
    for shape in ((2**62, 3), (2**32, 2**32)):
        with pytest.raises(
            hpccomm.InvalidArgumentError, match=r"bytes, more than any array can hold"
        ):
            comm.empty(shape, np.float32)
    # no element, but dimensions NumPy refuses (a raw OverflowError or ValueError before)
    for shape in ((0, 2**70), (2**32, 2**32, 0)):
        with pytest.raises(
            hpccomm.InvalidArgumentError,
            match=r"bytes \(no element\), more than any array can hold",
        ):
            comm.zeros(shape, np.float32)
    assert comm.zeros((0, 2**40), np.uint8).shape == (0, 2**40)
    assert comm.is_symmetric(comm.empty(7, np.float64))  # the group goes on


def test_a_buffer_that_cannot_be_mapped_is_an_ordinary_array_warned_at_the_users_line(
    sym, monkeypatch
):
    comm, fast = sym
    assert comm.is_symmetric(comm.empty(7, np.float64))  # (the path's own segment made)

    def full(total):  # as the node's memory refuses a file larger than MemAvailable
        raise OSError(errno.ENOMEM, f"{total:,} bytes asked, none available (pretend)")

    monkeypatch.setattr(shm_mod, "_room_for", full)
    for make in (comm.empty, comm.zeros):
        with pytest.warns(RuntimeWarning) as said:
            x = make((5, 7), np.int16)
        assert x.shape == (5, 7) and x.dtype == np.int16 and (x == 0).all()
        assert not comm.is_symmetric(x)
        (w,) = [w for w in said if "symmetric" in str(w.message)]
        assert re.search(rf"{make.__name__}.* \(rank \d+ of \d+\): an ordinary array, not a "
                         r"symmetric "
                         r"buffer: the shared memory could not be mapped: .*pretend",
                         str(w.message)), w.message  # fmt: skip
        # the line above, also where the allocation ran on the group's worker thread (a
        # timeout set): the warning pointed at threading.py there
        assert w.filename == __file__, (w.filename, w.lineno)
    monkeypatch.undo()
    assert comm.is_symmetric(comm.empty(7, np.float64))  # the group goes on


def open_files():
    """This process's open descriptors and what each names."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # (listdir's own)
    return out


def test_a_fork_childs_writes_to_a_symmetric_buffer_stay_its_own(sym, monkeypatch):
    # mapped shared, a fork() child's writes (a DataLoader worker's) landed in the parent's
    # buffer and the group's next reduction: 2000 where 2 was right (an outside hunt). The
    # child now maps every symmetric buffer copy-on-write; a child of the child inherits
    # the child's pages (remapped from the file, it lost them: a review). The buffer's
    # mapping keeps a descriptor of the file for it (from Python 3.13 only when asked to:
    # the hook found none there, a review), closed with the buffer.
    comm, fast = sym
    keeps = []
    real = shm_mod._mmap
    monkeypatch.setattr(shm_mod, "_mmap", lambda *a: keeps.append(a[2:]) or real(*a))
    comm.zeros(16)  # (the group's segment is made with its first buffer: made before)
    gc.collect()
    before = open_files()
    a = comm.zeros(2 * PIECE, np.float32)
    assert keeps[-1] == (True,)  # (the buffer's mapping keeps its descriptor)
    a[...] = 1
    view = a[8:]
    pid = os.fork()
    if pid == 0:  # the child: reads the parent's values, writes its own
        code = 0 if (a[0], view[0]) == (1, 1) else 7
        a[...] = 1000
        code = code or (0 if (a[5], view[0]) == (1000, 1000) else 8)
        grandchild = os.fork()
        if grandchild == 0:  # sees the child's values, and writes its own
            ok = (a[5], view[0]) == (1000, 1000)
            a[...] = 5
            os._exit(0 if ok else 9)
        _, status = os.waitpid(grandchild, 0)
        code = code or os.waitstatus_to_exitcode(status)
        code = code or (0 if (a == 1000).all() else 10)
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (a == 1).all()
    comm.all_reduce(a)
    assert (a == comm.size).all() and fast.sym_calls == 1
    alloc = fast.locate(a)[0]  # (this rank's region of the mapping: the one remapped)
    entry = (alloc.start, alloc.region, comm.rank * alloc.region)
    assert [e for e in shm_mod._LIVE.values() if e[0] == alloc.start] == [entry]
    del a, view, alloc
    gc.collect()
    assert entry not in shm_mod._LIVE.values()
    assert open_files() == before  # its descriptor closed


def test_a_subclass_view_of_a_symmetric_buffer_counts_as_one(sym):
    # an ndarray subclass's view of a symmetric buffer runs on the symmetric path (the body
    # looks at the address), but the debug check took it for an ordinary array: a false
    # MismatchError against ranks passing the buffer itself, and none against ranks passing
    # an ordinary array, which then waited in different calls (a review)
    comm, fast = sym

    class Sub(np.ndarray):
        pass

    count = 2 * PIECE
    a = comm.zeros(count, np.float32)
    a[...] = comm.rank + 1
    mine = a.view(Sub) if comm.rank == 0 else a
    assert comm.is_symmetric(mine) and comm.is_symmetric(a.view(Sub)[3:])
    with at_debug(comm, "check"):
        comm.all_reduce(mine)
    assert (a == comm.size * (comm.size + 1) / 2).all() and fast.sym_calls == 1
    mine = a.view(Sub) if comm.rank == 0 else np.ones(count, np.float32)
    with (
        at_debug(comm, "check"),
        pytest.raises(
            MismatchError,
            match=r"memory is 'symmetric buffer' on rank 0 but 'ordinary array' on ranks? 1",
        ),
    ):
        comm.all_reduce(mine)


def test_symmetric_array_outlives_free(sym):
    comm, fast = sym
    g = comm.dup()
    g._dispatcher.shm = gf = ShmBackend(g._backend, THRESHOLD, CHUNK)
    x = g.empty(3 * PIECE, np.float32)
    x[...] = g.rank + 1
    g.all_reduce(x)
    view = x[5:]
    g.free()
    assert gf.allocs == {} and not g.is_symmetric(x)
    del x
    total = g.size * (g.size + 1) / 2
    assert (view == total).all()  # still mapped: the view keeps the memory
    view[...] = 7  # and writable, as any array
    assert (view == 7).all()


def test_symmetric_entry_goes_with_the_last_view(sym):
    comm, fast = sym
    x = comm.empty(PIECE, np.float32)
    v = x[8:]
    del x
    assert comm.is_symmetric(v) and len(fast.allocs) == 1
    del v
    comm.barrier()  # the worker thread (bounded runs) lets go of the last call's result
    gc.collect()
    assert fast.allocs == {}


# -- the single-copy path (ordinary arrays, process_vm_readv/writev) ----------------------


def ptrace_scope():
    """Yama's ptrace_scope, or None where Yama is not there (then nothing but the user and
    the container's seccomp profile decide)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read())
    except OSError:
        return None


@pytest.fixture
def mapped():
    """Every array from THRESHOLD bytes NumPy allocates on this thread during the test in
    the arena (skipped where this process has none)."""
    if arena.mine() is None:
        pytest.skip(f"no arena in this process: {arena.state()}")
    before = arena.retune(THRESHOLD)
    try:
        yield
    finally:
        arena.retune(before)


@pytest.fixture
def unmapped():
    """No array NumPy allocates during the test in the arena (the kernel's copy only)."""
    if arena.mine() is None:
        yield
        return
    before = arena.retune(2**62)
    try:
        yield
    finally:
        arena.retune(before)


@pytest.fixture(params=["cma", "mapped"])
def form(request):
    """How the single-copy path reaches the peers' ordinary arrays: "cma", the kernel's copy
    (``unmapped``), or "mapped", the peers' arenas mapped here (``mapped``)."""
    request.getfixturevalue("mapped" if request.param == "mapped" else "unmapped")
    return request.param


@pytest.fixture
def direct(comm, monkeypatch, form):
    """``comm`` with the single-copy path from 1 KiB, pieces of 4 KiB and the copy path's
    4 KiB chunk for anything the single-copy path cannot take (``with_fast_path``), in both
    forms (``form``)."""
    return with_fast_path(comm, monkeypatch, direct=True)


@pytest.mark.parametrize("dtype", ALL, ids=name)
def test_direct_all_reduce_every_op_and_size(direct, form, dtype):
    comm, fast = direct
    seed = 0
    check = Checks()
    for opname in ops_for(dtype):
        for count in sym_sizes(dtype, comm.size):
            seed += 1
            before = fast.direct_calls, fast.mapped_calls
            x = inputs(comm.rank, count, dtype, seed)
            got = comm.all_reduce(x, op=op_of(opname))
            what = f"{opname} {count}"
            check(what, x, expected(comm.size, count, dtype, opname, seed))
            check.count(what, fast.direct_calls, before[0] + 1)
            check.count(f"{what} (mapped)", fast.mapped_calls, before[1] + (form == "mapped"))
            if got is not x:
                check.bad.append(f"{what}: all_reduce did not return its array")
    check.done()
    assert fast.calls == 0


def test_direct_async_timeout_and_repeated_calls_of_every_kind(direct):
    comm, fast = direct
    n = comm.size
    check = Checks()
    given = comm.timeout
    for i in range(12):
        count = (i % 4 + 1) * PIECE // 8 + 3 * i
        x = inputs(comm.rank, count, np.float64, i)
        how = i % 3
        comm.timeout = 30 if how == 1 else None  # bounded: the body runs on the worker
        if how == 0:
            comm.all_reduce(x, async_op=True).wait()
        else:
            comm.all_reduce(x)
        check(f"{i} all_reduce", x, expected(n, count, np.float64, "SUM", i))
        y = inputs(comm.rank, n * count, np.int32, i)
        work = comm.reduce_scatter(y, op=ReduceOp.MAX, async_op=how == 0)
        out = work.wait() if how == 0 else work
        want = expected(n, n * count, np.int32, "MAX", i)[comm.rank * count :][:count]
        check(f"{i} reduce_scatter", out, want)
        root = i % n
        z = inputs(comm.rank, count, np.float32, i)
        work = comm.reduce(z, root, op=ReduceOp.AVG, async_op=how == 0)
        if how == 0:
            work.wait()
        want = expected(n, count, np.float32, "AVG", i) if comm.rank == root else None
        check(f"{i} reduce", z, want if want is not None else inputs(comm.rank, count,
                                                                     np.float32, i))  # fmt: skip
    comm.timeout = given
    check.done()
    assert (fast.direct_calls, fast.calls) == (36, 0)


def signed(rank, count, dtype, seed):
    """``inputs`` with signed zeros and NaNs of either sign placed so that the order of the
    operands shows in the bits: MAX(0.0, -0.0) is 0.0 but MAX(-0.0, 0.0) is -0.0, and
    NaN + NaN keeps the first operand's sign."""
    x = inputs(rank, count, dtype, seed)
    x[::7] = 0.0 if rank % 2 else -0.0
    x[3::11] = np.nan if rank % 2 else -np.nan
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.complex64], ids=name)
def test_direct_results_bitwise_equal_to_the_copy_path(direct, dtype):
    comm, fast = direct
    count = 5 * PIECE + 3
    copy = ShmBackend(comm._backend, THRESHOLD, CHUNK)  # no single copy: the copy path
    ops = ["SUM", "AVG", "PREMUL_SUM"] + (["MAX", "MIN"] if np.dtype(dtype).kind == "f" else [])
    for opname in ops:
        for root in [None, *range(comm.size)]:
            got = []
            for path in (fast, copy):
                comm._dispatcher.shm = path
                comm._dispatcher.cache.clear()
                x = signed(comm.rank, count, dtype, 9)
                if root is None:
                    comm.all_reduce(x, op=op_of(opname))
                else:
                    comm.reduce(x, root, op=op_of(opname))
                got.append(x.tobytes())
            comm._dispatcher.shm = fast
            comm._dispatcher.cache.clear()
            assert got[0] == got[1], (opname, root)  # bytes: NaN signs and -0.0 included
            if root is None:
                digests = comm.all_gather_object(got[0])
                assert all(d == digests[0] for d in digests)
    calls = len(ops) * (comm.size + 1)
    assert (fast.direct_calls, copy.calls) == (calls, calls)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=name)
def test_complex_pieces_of_one_element_bitwise_equal_on_every_form(comm, monkeypatch, dtype):
    # NumPy rounds a 1-element complex multiply whose output is one of its inputs otherwise
    # than one whose output is not, and the forms alias different steps: single copy was
    # 1 ulp off the copy path (and MPI) in the last rank's piece of one element, with
    # PREMUL_SUM's complex factor (an outside hunt), and AVG alike (PRODUCT is refused for
    # complex numbers)
    comm, fast = with_fast_path(comm, monkeypatch, direct=True)
    per = PIECE // np.dtype(dtype).itemsize  # elements per piece
    count = comm.size * per + 1  # the last rank's part: one piece and one element
    copy = ShmBackend(comm._backend, THRESHOLD, CHUNK)  # the copy path
    values = np.array([-84.87146284745383 - 57.08347706943091j,
                       29.371365813830497 - 25.13587076483221j,
                       -3.3 + 71.25j, 0.125 - 9.75j])  # fmt: skip
    ops = [ReduceOp.PREMUL_SUM(complex(0.37, -0.25)), ReduceOp.PREMUL_SUM(0.37),
           ReduceOp.AVG, ReduceOp.SUM]  # fmt: skip
    for op in ops:
        got = []
        for path in (fast, copy, fast):  # single copy, copy path, symmetric buffers
            comm._dispatcher.shm = path
            comm._dispatcher.cache.clear()
            mine = np.full(count, values[comm.rank % 4], dtype)
            x = comm.empty(count, dtype) if len(got) == 2 else np.empty(count, dtype)
            x[...] = mine
            comm.all_reduce(x, op=op)
            got.append(x.tobytes())
        assert got[0] == got[1] == got[2], op
        assert len(set(comm.all_gather_object(got[0]))) == 1, op
    comm._dispatcher.shm = fast
    comm._dispatcher.cache.clear()
    assert (fast.direct_calls, copy.calls, fast.sym_calls) == (len(ops),) * 3


@pytest.mark.parametrize("debug", ["large", "off"])
def test_direct_ranks_that_disagree_raise_a_mismatch_on_every_rank(direct, debug):
    comm, fast = direct
    count = 2 * PIECE
    x = np.ones(count + (comm.rank == 1), np.float32)
    said = (r"shape is \(8192,\) on ranks? 0.* but \(8193,\) on rank 1" if debug == "large" else
            r"rank 0: all_reduce #\d+ of 8192 float32 \(SUM, an ordinary array, single copy.*"
            r"rank 1: all_reduce #\d+ of 8193 float32")  # fmt: skip
    with at_debug(comm, debug), pytest.raises(MismatchError, match=said):
        comm.all_reduce(x)
    y = np.full(count, comm.rank + 1.0)
    comm.all_reduce(y)  # the group goes on
    assert (y == comm.size * (comm.size + 1) / 2).all()


REAL_READ = shm_mod._Lane.read


def fail_read(fast, monkeypatch, nth):
    """This rank's ``nth`` read of a peer's memory fails as with a peer that is gone (until
    :func:`heal_reads` or the test's end)."""
    calls = {"n": 0}
    real = REAL_READ

    def failing(lane, rank, pid, addr, local, n):
        calls["n"] += 1
        if calls["n"] == nth:
            raise shm_mod._Unreachable(rank, "process_vm_readv: No such process")
        real(lane, rank, pid, addr, local, n)

    monkeypatch.setattr(shm_mod._Lane, "read", failing)


def heal_reads(monkeypatch):
    """Reads of peers' memory work again (after :func:`fail_read`; on any rank)."""
    monkeypatch.setattr(shm_mod._Lane, "read", REAL_READ)


def test_a_rank_that_cannot_reach_a_peer_fails_the_call_on_every_rank(direct, form, monkeypatch):
    # One rank's read of a peer's array fails in the middle of the call (mapped: it cannot
    # make its views of the peers' arrays): every rank gets a BackendError naming it (no
    # rank returns a result with that rank's part missing), and the group goes on.
    comm, fast = direct
    real_mapped = fast._mapped
    said = (r"rank 1 could not reach rank \d+'s array \(process id \d+\): process_vm_readv: "
            r"No such process") if form == "cma" else r"rank 1 MemoryError: no views"  # fmt: skip
    if comm.rank == 1 and form == "cma":
        fail_read(fast, monkeypatch, 3)
    elif comm.rank == 1:

        def no_views(addrs, flat):
            raise MemoryError("no views")

        monkeypatch.setattr(fast, "_mapped", no_views)
    x = np.full(5 * PIECE, comm.rank + 1.0)
    with pytest.raises(hpccomm.BackendError, match=r"all_reduce #\d+ on .*single-copy path "
                       rf"failed: {said}; the result is incomplete"):  # fmt: skip
        comm.all_reduce(x)
    heal_reads(monkeypatch)
    monkeypatch.setattr(fast, "_mapped", real_mapped)
    y = np.full(5 * PIECE, comm.rank + 1.0)
    comm.all_reduce(y)
    assert (y == comm.size * (comm.size + 1) / 2).all()


def test_a_rank_failing_before_the_first_barrier_fails_the_call_on_every_rank(direct, monkeypatch):
    # Rank 1 cannot get its scratch buffers (before the call's first barrier): it still
    # joins the call and tells the others at its end, so every rank raises, nobody's next
    # call pairs with a call left behind, and the group goes on.
    comm, fast = direct
    if comm.rank == 1:

        def no_memory(dtype, n):
            raise MemoryError(f"no {n} elements of {dtype}")

        monkeypatch.setattr(fast, "_scratch_for", no_memory)
    x = np.full(5 * PIECE, comm.rank + 1.0)
    with pytest.raises(hpccomm.BackendError, match=r"all_reduce #\d+ on .*single-copy path "
                       r"failed: rank 1 MemoryError: no \d+ elements of float64; the result "
                       r"is incomplete on every rank"):  # fmt: skip
        comm.all_reduce(x)
    monkeypatch.undo()
    for k in range(3):
        y = np.full(5 * PIECE, comm.rank + 10.0 * k)
        comm.all_reduce(y)
        assert (y == comm.size * (comm.size - 1) / 2 + comm.size * 10.0 * k).all()
    assert fast._held == []  # every rank left the call together: nothing to keep


@pytest.mark.parametrize("path", ["symmetric", "single_copy"])
def test_a_call_allocates_nothing_of_array_size_before_its_first_barrier(comm, path):
    # A rank that fails before the call's first barrier (no memory for a buffer) is out of
    # the call its peers are in. Symmetric buffers and single copy reduce through two
    # piece buffers made with the path, so even a group's first call of a dtype allocates
    # no more than a few small Python objects (the pieces here are 256 KiB; the chunk of
    # 1 MiB keeps the copy path's plan, made with the call's description, small).
    import tracemalloc

    comm, fast = with_fast_path(comm, direct=path == "single_copy", chunk=1 << 20)
    count = 3 * fast.piece // 8 * comm.size + 5  # several pieces per rank, float64
    on = OnPath(comm, fast, path == "symmetric")
    warm = on.place(np.ones(count, np.float32), count)
    comm.all_reduce(warm)  # the segment (and the probe): float32 only
    x = on.place(np.full(count, comm.rank + 1.0), count)
    before = on.runs()
    tracemalloc.start()
    try:
        comm.all_reduce(x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert on.runs() == before + 1
    assert (x == comm.size * (comm.size + 1) / 2).all()
    assert peak < fast.piece // 4, f"rank {comm.rank}: {peak} bytes allocated by the call"


@pytest.mark.parametrize("late", [False, True], ids=["prompt", "late_check"])
def test_a_mismatch_one_rank_saw_is_not_matched_later(direct, monkeypatch, late):
    # debug "off" (no cross-rank check before the call): rank 0 calls all_reduce while
    # rank 1 calls barrier, which the fast path's first barrier matches; only rank 0 sees
    # the headers differ. Its header is withdrawn, so rank 1's next call (the same
    # description) does not take it for its partner's (it would read and write rank 0's
    # old array): both ranks' next calls raise instead of returning a wrong result.
    # "late_check": rank 0 reads the headers only after rank 1's next call has written
    # its own (the same description and tick: only the calls' sequence numbers differ);
    # before they were in the header rank 0 took it for its partner's, read and wrote
    # rank 1's array and waited for ever (a machine under load did that by itself).
    comm, fast = direct
    if comm.size != 2:
        pytest.skip("written for 2 ranks")
    count = 2 * PIECE
    x = np.full(count, comm.rank + 1.0)
    if late and comm.rank == 0:
        real = fast._check

        def late_check(seg, call, mine, slot):
            # the first call's only: the next call's waited its full 10 s for a header rank 1
            # never writes, as long as the drain below waits (a CI run failed at free())
            monkeypatch.setattr(fast, "_check", real)
            other = seg.headers[1, slot]
            for _ in range(2000):  # rank 1's next call writes its header (tick word last)
                if other[mine.size - 1] == mine[-1]:
                    break
                time.sleep(0.005)
            return real(seg, call, mine, slot)

        monkeypatch.setattr(fast, "_check", late_check)
    # not restored: the group is unusable on rank 0 after the block, not on rank 1
    with at_debug(comm, "off", restore=False):
        if comm.rank == 0:
            with pytest.raises(MismatchError, match="on the shared-memory path"):
                comm.all_reduce(x)
        else:
            comm.barrier()
        y = np.full(count, 10.0 * (comm.rank + 1))
        # bounded: the peer's notice of its MismatchError may reach this rank's caller
        # first (a PeerError naming it); this rank's own body then ends with its own
        with pytest.raises((MismatchError, hpccomm.PeerError), match="withdrawn|chunk tick"):
            comm.all_reduce(y)
    ex = comm._dispatcher.executor
    for _ in range(2000):
        if ex is None or not ex.pending:
            break
        time.sleep(0.005)
    assert (x == comm.rank + 1.0).all(), "rank 0's array was written after its call raised"
    assert (y == 10.0 * (comm.rank + 1)).all()


@pytest.mark.mpi(min_size=2)
def test_an_interrupted_rank_keeps_its_array_for_the_peers_writes(direct, monkeypatch):
    # Rank 0 is interrupted (a KeyboardInterrupt) in the call's first barrier, after it
    # published its array's address; rank 1 goes on, reads rank 0's input and writes its
    # part of the result into rank 0's array after rank 0's call has raised. The array is
    # kept referenced (never freed under those writes). Rank 0 then completes the call's
    # collectives by hand, as a rank still inside it that failed would: rank 1 raises.
    comm, fast = direct
    if comm.size != 2:
        pytest.skip("written for 2 ranks")
    if comm.timeout is not None:
        pytest.skip("an interrupt reaches a body run on the caller's thread (no timeout)")
    count = 4 * PIECE
    x = np.full(count, comm.rank + 1.0)
    if comm.rank == 0:
        real = fast._barrier

        def interrupted():
            monkeypatch.setattr(fast, "_barrier", real)
            raise KeyboardInterrupt

        monkeypatch.setattr(fast, "_barrier", interrupted)
        with pytest.raises(KeyboardInterrupt):
            comm.all_reduce(x)
        assert len(fast._held) == 1 and np.shares_memory(fast._held[0], x)
        mpi = comm._backend.mpi
        mpi.Barrier()  # rank 1's first barrier
        flag = np.zeros(1, np.int64)
        from mpi4py import MPI

        flag[0] = 1
        mpi.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)  # rank 1's closing allreduce
        mpi.allgather("interrupted")  # the reasons
        fast.tick += 1  # as the completed call would have
        half = count // 2
        assert (x[half:] == 3.0).all() and (x[:half] == 1.0).all()  # rank 1 wrote after
        # the group is unusable on the interrupted rank (its peers may be inside the call
        # for good): its next call says so instead of meeting them out of step
        dispatcher = comm._dispatcher
        with pytest.raises(hpccomm.ClosedError, match=r"the group is unusable: all_reduce "
                           r"#\d+ on world/dup \(rank 0 of 2\) \(interrupted by "
                           r"KeyboardInterrupt inside the shared-memory path"):  # fmt: skip
            comm.all_reduce(np.ones(count))
        # (the test, having completed the call by hand, makes the group usable again)
        dispatcher.broken = dispatcher.interrupted = None
        dispatcher._update_slow()
        dispatcher.group.seq -= 1  # the refused call's number
    else:
        with pytest.raises(hpccomm.BackendError, match="failed: rank 0 interrupted; the "
                           "result is incomplete"):  # fmt: skip
            comm.all_reduce(x)
        assert (x[: count // 2] == 2.0).all()  # rank 0's part never came
    y = np.full(count, comm.rank + 1.0)
    comm.all_reduce(y)
    assert (y == 3.0).all()


def test_a_failed_probe_leaves_the_group_on_the_copy_path(comm, monkeypatch):
    # One rank cannot use process_vm_readv (a seccomp profile, Yama): every rank learns it
    # from the probe and the calls go through the copy path, with the same results.
    if comm.size < 2 or comm.num_nodes != 1:
        pytest.skip("needs 2 or more ranks on one node")
    if comm.rank == comm.size - 1:

        def refuse(self, rank, pid, addr, into):
            raise shm_mod._Unreachable(rank, "process_vm_readv: Operation not permitted")

        monkeypatch.setattr(shm_mod._Cma, "read", refuse)
    fast = ShmBackend(comm._backend, THRESHOLD, CHUNK, direct=True)
    comm._dispatcher.shm = fast
    comm._dispatcher.cache.clear()
    x = inputs(comm.rank, 3 * CHUNK, np.float32, 4)
    comm.all_reduce(x)
    same(x, expected(comm.size, 3 * CHUNK, np.float32, "SUM", 4))
    assert fast.cma is None and (fast.direct_calls, fast.calls) == (0, 1)
    assert f"rank {comm.size - 1}: rank 0 (process" in fast.cma_why
    assert "Operation not permitted" in fast.cma_why


# -- both paths without a copy in: symmetric buffers and single copy ----------------------


class OnPath:
    """How a test hands its inputs to the path under test (``symmetric``: written into one
    symmetric buffer per dtype, made by the first call with ``room`` elements, alike on
    every rank; single copy: the ordinary arrays themselves) and that path's call count."""

    def __init__(self, comm, fast, symmetric, copies=False):
        self.comm, self.fast, self.symmetric, self.copies = comm, fast, symmetric, copies
        self.buffers = {}

    def place(self, values, room):
        if not self.symmetric:
            return values
        buf = self.buffers.get(values.dtype)
        if buf is None:
            buf = self.buffers[values.dtype] = self.comm.zeros(room, values.dtype)
        return written(buf, values.reshape(-1)).reshape(values.shape)

    def runs(self):
        fast = self.fast
        return (
            fast.sym_calls if self.symmetric else fast.calls if self.copies else fast.direct_calls
        )


@pytest.fixture(params=["symmetric", "single_copy", "mapped"])
def on_path(comm, monkeypatch, request):
    single = request.param != "symmetric"
    request.getfixturevalue("mapped" if request.param == "mapped" else "unmapped")
    comm, fast = with_fast_path(comm, monkeypatch, direct=single)
    return OnPath(comm, fast, not single)


@pytest.fixture(params=["copy", "symmetric", "single_copy", "mapped"])
def every_path(comm, monkeypatch, request):
    """``on_path`` and the copy path (ordinary arrays through the segment's chunks)."""
    kind = request.param
    request.getfixturevalue("mapped" if kind == "mapped" else "unmapped")
    comm, fast = with_fast_path(comm, monkeypatch, direct=kind in ("single_copy", "mapped"))
    return OnPath(comm, fast, kind == "symmetric", copies=kind == "copy")


@pytest.mark.parametrize("opname", ["SUM", "PREMUL_SUM", "AVG", "MIN"])
def test_reduce_scatter_into_its_own_input(every_path, opname):
    # The output inside the input: on every rank exactly its own block (in place, as users
    # of torch's reduce_scatter_tensor do: folded in place on ranks 0 and 1, from a copy of
    # each piece elsewhere and with PREMUL_SUM), then block 0 on every rank (the others read
    # it while it is written), then a block shifted by one element (later chunks' input).
    # The result is right in each case, and no rank's input changes outside its output.
    comm = every_path.comm
    n = comm.size
    k = 3 * PIECE // 4 + 5
    want = expected(n, n * k, np.float32, opname, 3)[comm.rank * k : (comm.rank + 1) * k]
    check = Checks()
    for where in (comm.rank * k, 0, 1):
        before = every_path.runs()
        given = inputs(comm.rank, n * k, np.float32, 3)
        x = every_path.place(given, n * k)
        out = x[where : where + k]
        comm.reduce_scatter(x, out=out, op=op_of(opname))
        check(f"output at {where}", out, want)
        check(f"input outside the output at {where}", np.delete(x, np.s_[where : where + k]),
              np.delete(given, np.s_[where : where + k]))  # fmt: skip
        check.count(f"output at {where}", every_path.runs(), before + 1)
    check.done()


def test_a_read_only_array_is_refused_on_every_rank(every_path):
    # Rank 1's array (all_reduce; reduce's root) or output (reduce_scatter) is read-only, in
    # a call whose description was seen before (no validation: the cache). No rank writes
    # anything (a peer would write into it with process_vm_writev, or into the symmetric
    # buffer behind a read-only view), every rank raises, naming rank 1, and the group goes on.
    comm = every_path.comm
    n, count = comm.size, 3 * PIECE // 4 + 5
    last = comm.rank == 1
    check = Checks()
    for how in ("all_reduce", "reduce", "reduce_scatter"):
        for attempt in ("cached", "read-only", "again"):
            given = inputs(comm.rank, n * count, np.float32, 7)
            x = every_path.place(given, n * count)
            out = np.zeros(count, np.float32)
            frozen = last and attempt == "read-only"
            if frozen:
                (out if how == "reduce_scatter" else x).flags.writeable = False
            try:
                if how == "all_reduce":
                    comm.all_reduce(x)
                elif how == "reduce":
                    comm.reduce(x, 1)
                else:
                    comm.reduce_scatter(x, out=out)
            except hpccomm.InvalidArgumentError as exc:
                said = str(exc)
                if attempt != "read-only":
                    check.bad.append(f"{how} {attempt}: {said}")
                elif last and " is read-only (its writeable flag is False)" not in said:
                    check.bad.append(f"{how}: {said}")
                elif not last and "rank 1's " not in said:
                    check.bad.append(f"{how}: {said}")
                check(f"{how} {attempt}: input", x, given)
                check(f"{how} {attempt}: output", out, np.zeros(count, np.float32))
            else:
                if attempt == "read-only":
                    check.bad.append(f"{how}: returned on rank {comm.rank}")
                    continue
                whole = expected(n, n * count, np.float32, "SUM", 7)
                if how == "reduce_scatter":
                    check(f"{how} {attempt}", out, whole[comm.rank * count :][:count])
                else:
                    check(f"{how} {attempt}", x, whole if last or how == "all_reduce" else given)
            finally:
                x.flags.writeable = out.flags.writeable = True
    check.done()
    assert every_path.fast._held == []  # nothing read or written: nothing to keep


@pytest.mark.parametrize("debug", ["off", "large"])
def test_premul_sum_factors_that_differ_by_rank(every_path, debug):
    # Each rank scales its own input by its own factor (the sum of f_r * x_r, as on MPI);
    # the paths where a rank scales every rank's input (symmetric buffers, single copy)
    # find that the factors differ and run the call on MPI (whose order of summation is
    # its own: compared within float32 rounding). The debug check leaves the factor out
    # (each rank's own, as NCCL's): it was a MismatchError on every rank at the default
    # level above 31 KiB, and a false "an earlier call differed" for the smaller calls
    # before it (an outside hunt).
    comm = every_path.comm
    n, count = comm.size, 3 * PIECE // 2 + 3
    factors = [0.5 + r for r in range(n)]
    op = ReduceOp.PREMUL_SUM(factors[comm.rank])

    def given(r):
        return np.random.default_rng(11 + r).standard_normal(n * count).astype(np.float32)

    for how in ("all_reduce", "reduce_scatter"):
        x = every_path.place(given(comm.rank), n * count)
        run = comm.all_reduce if how == "all_reduce" else comm.reduce_scatter
        with at_debug(comm, debug):
            # a small call with its own factor too (compared with the next, large, one)
            small = np.full(5, comm.rank + 1.0, np.float32)
            comm.all_reduce(small, op=op)
            got = run(x, op=op)
        np.testing.assert_allclose(small, sum((r + 1.0) * factors[r] for r in range(n)), rtol=1e-6)
        want = sum(given(r).astype(np.float64) * factors[r] for r in range(n))
        if how == "reduce_scatter":
            want = want[comm.rank * count :][:count]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int64, np.float32, np.float64,
                                   ml_dtypes.bfloat16, np.complex64, np.bool_], ids=name)  # fmt: skip
def test_no_copy_in_reduce_scatter_every_op_and_size(on_path, dtype):
    comm = on_path.comm
    n = comm.size
    item = np.dtype(dtype).itemsize
    blocks = sorted({-(-THRESHOLD // item // n) + 1, PIECE // item - 1, PIECE // item + 1,
                     3 * PIECE // item + 5})  # fmt: skip
    seed = 0
    check = Checks()
    for opname in ops_for(dtype):
        for k in blocks:
            seed += 1
            before = on_path.runs()
            y = on_path.place(inputs(comm.rank, n * k, dtype, seed), n * max(blocks))
            out = comm.reduce_scatter(y, op=op_of(opname))
            want = expected(n, n * k, dtype, opname, seed)[comm.rank * k : (comm.rank + 1) * k]
            check(f"{opname} {k}", out, want)
            check(f"{opname} {k} input kept", y, inputs(comm.rank, n * k, dtype, seed))
            check.count(f"{opname} {k}", on_path.runs(), before + 1)
    check.done()


def test_no_copy_in_reduce_scatter_uneven_and_2d(on_path):
    comm = on_path.comm
    n = comm.size
    sizes = [PIECE // 4 + 3 * r + 1 for r in range(n)]  # rows of 2 float32 per rank
    total = sum(sizes)
    x = inputs(comm.rank, 2 * total, np.float32, 5).reshape(total, 2)
    x = on_path.place(x, 2 * total)
    out = comm.reduce_scatter(x, sizes=sizes)
    start = sum(sizes[: comm.rank])
    want = expected(n, 2 * total, np.float32, "SUM", 5).reshape(total, 2)
    same(out, want[start : start + sizes[comm.rank]])
    assert on_path.runs() == 1


@pytest.mark.parametrize(("dtype", "opname"), [(np.uint8, "SUM"), (np.float32, "SUM"),
                         (np.float32, "PREMUL_SUM"), (np.float32, "AVG"), (np.float32, "MAX")],
                         ids=lambda v: v if isinstance(v, str) else name(v))  # fmt: skip
def test_no_copy_in_reduce_to_each_root(on_path, dtype, opname):
    # every rank's place in the fold (single copy: rank 0 and 1 fold in place on the root,
    # the others in scratch); non-roots keep their input
    comm = on_path.comm
    count = 3 * PIECE + 5
    check = Checks()
    for root in range(comm.size):
        before = on_path.runs()
        x = on_path.place(inputs(comm.rank, count, dtype, root), count)
        comm.reduce(x, root, op=op_of(opname))
        check.count(root, on_path.runs(), before + 1)
        if comm.rank == root:
            check(root, x, expected(comm.size, count, dtype, opname, root))
        else:
            check(root, x, inputs(comm.rank, count, dtype, root))  # non-roots keep their input
    check.done()


@pytest.mark.mpi(min_size=2)
def test_no_copy_in_late_rank_times_out_the_others_then_the_group_goes_on(on_path):
    import time

    comm = on_path.comm
    x = on_path.place(np.full(4 * PIECE, comm.rank + 1.0), 4 * PIECE)
    comm.timeout = 0.5
    if comm.rank == 0:
        with pytest.raises(CommTimeoutError, match=r"all_reduce #\d+ on .*not complete after"):
            comm.all_reduce(x)
    else:  # (past rank 0's timeout and its asking where the others are)
        time.sleep(0.5 + ASK_WAIT + 1.0)
        comm.all_reduce(x)
    comm.timeout = 30
    comm.barrier()  # the late call has completed everywhere (rank 0: queued behind it)
    total = comm.size * (comm.size + 1) / 2
    assert (x == total).all()  # the late rank wrote its part into rank 0's array
    assert on_path.runs() == 1


# -- the hierarchical all_reduce, with ranks pretending to be on two nodes -----------------


def on_pretend_nodes(comm, form="copy", monkeypatch=None):
    """``comm`` with a hierarchical fast path (1 KiB threshold, 4 KiB chunk) whose ranks
    0..ceil(p/2)-1 play node 0 and the others node 1; inside each node the copy path, or
    (``form`` "single_copy", with ``monkeypatch``) single copy in pieces of 4 KiB. Returns
    (the path, this rank's pretend node, ranks per node 0)."""
    n = comm.size
    half = -(-n // 2)
    node = comm.rank // half
    local = [r for r in range(n) if r // half == node]
    single = form in SINGLE
    if single:
        monkeypatch.setattr(shm_mod, "SYM_PIECE", PIECE)
    fast = ShmBackend(comm._backend, THRESHOLD, CHUNK, direct=single,
                      node=(node, local.index(comm.rank), len(local)))  # fmt: skip
    comm._dispatcher.shm = fast
    comm._dispatcher.cache.clear()
    return fast, node, half


def ran_as(fast, form, calls, runs=True, through=None):
    """The hierarchical path ran ``calls`` calls in ``form`` (the single-copy probe must
    succeed where Yama allows it; elsewhere the test is skipped with the reason), of which
    ``through`` (default: all) passed the header check (mapped: each made its views)."""
    if form in SINGLE and runs and fast.cma is None:
        scope = ptrace_scope()
        if scope:
            pytest.skip(f"Yama's ptrace_scope is {scope} here: {fast.cma_why}")
        pytest.fail(f"the single-copy probe failed: {fast.cma_why}")
    single = calls if form in SINGLE and runs else 0
    assert (fast.direct_calls, fast.calls) == (single, calls - single)
    through = single if through is None else through
    assert fast.mapped_calls == (through if form == "mapped" and runs else 0)


SINGLE = ("single_copy", "mapped")  # the single-copy path's forms (see ``form``)


@pytest.fixture(params=["copy", *SINGLE])
def node_form(request):
    """The form of the hierarchical path inside each node."""
    request.getfixturevalue("mapped" if request.param == "mapped" else "unmapped")
    return request.param


def test_hierarchical_a_check_failed_on_one_node_fails_every_node(comm, node_form, monkeypatch):
    # The header check is node-local: a read-only array (a description seen before) or,
    # with debug off, calls that differ on one node reach the other nodes through one
    # cross-node allreduce, so every rank raises instead of the other nodes' ranks waiting
    # in the cross-node all_reduce for ever. The group goes on.
    n = comm.size
    if n < 4 or n % 2:
        pytest.skip("needs an even number of 4 or more ranks (two pretend nodes of 2+)")
    fast, node, _ = on_pretend_nodes(comm, node_form, monkeypatch)
    count = 3 * CHUNK // 8 + 5
    total = n * (n + 1) / 2
    last = n - 1
    check = Checks()
    for case in ("first", "read-only", "again", "differ", "after"):
        x = np.full(count + (case == "differ" and comm.rank == last), comm.rank + 1.0)
        if case == "read-only" and comm.rank == last:
            x.flags.writeable = False
        with at_debug(comm, "off") if case == "differ" else contextlib.nullcontext():
            try:
                comm.all_reduce(x)
            except (MismatchError, hpccomm.InvalidArgumentError) as exc:
                said = str(exc)
                want = ("is read-only" if comm.rank == last else
                        f"rank {last}'s array is read-only" if node == 1 else
                        "a rank's array is read-only on another node")  # fmt: skip
                if case == "differ":
                    want = (rf"rank {last}: all_reduce #\d+ of {count + 1}" if node == 1 else
                            "the ranks' calls differ on another node")  # fmt: skip
                if case not in ("read-only", "differ") or not re.search(want, said):
                    check.bad.append(f"{case}: {said}")
            else:
                if case in ("read-only", "differ"):
                    check.bad.append(f"{case}: returned")
                else:
                    check(case, x, np.full(count, total))
    check.done()
    ran_as(fast, node_form, 5, through=3)  # (read-only and differ: refused by the check)


def test_hierarchical_single_copy_failures_and_factors(comm, monkeypatch):
    # Single copy inside each pretend node: a rank failing (a peer's memory unreachable in
    # the middle of the call; no memory before the first barrier) still joins every
    # piece's cross-node all_reduce, so the other node's ranks do not wait for ever, and
    # every rank raises; PREMUL_SUM factors that differ inside one node send every node's
    # ranks to MPI (the sum of f_r * x_r); factors that differ only between nodes are right
    # on the path. The group goes on after each.
    n = comm.size
    if n < 4 or n % 2:
        pytest.skip("needs an even number of 4 or more ranks (two pretend nodes of 2+)")
    fast, node, half = on_pretend_nodes(comm, "single_copy", monkeypatch)
    count = 5 * PIECE // 8 + 3
    total = n * (n + 1) / 2

    def plain(k):
        x = np.full(count, comm.rank + 1.0 + k)
        comm.all_reduce(x)
        np.testing.assert_array_equal(x, np.full(count, total + n * k))

    plain(0)
    ran_as(fast, "single_copy", 1)
    last = n - 1
    if comm.rank == last:
        fail_read(fast, monkeypatch, 2)
    with pytest.raises(hpccomm.BackendError, match=rf"single-copy path failed: rank {last} "
                       rf"could not reach rank ({'|'.join(map(str, range(half, last)))})'s array "
                       r"\(process id \d+\): "  # (which of the node's peers: the order)
                       r"process_vm_readv: No such process; the result is incomplete"):  # fmt: skip
        comm.all_reduce(np.full(count, 1.0))
    heal_reads(monkeypatch)
    plain(1)
    if comm.rank == 0:

        def no_memory(dtype, m):
            raise MemoryError(f"no {m} elements of {dtype}")

        monkeypatch.setattr(fast, "_scratch_for", no_memory)
    with pytest.raises(hpccomm.BackendError, match=r"single-copy path failed: rank 0 "
                       r"MemoryError: no \d+ elements of float64; the result is incomplete"):  # fmt: skip
        comm.all_reduce(np.full(count, 1.0))
    monkeypatch.setattr(fast, "_scratch_for", ShmBackend._scratch_for.__get__(fast))
    plain(2)
    mpi_before = fast.direct_calls
    for case in ("inside node 0", "between nodes"):
        given = [np.random.default_rng(7 + r).standard_normal(count) for r in range(n)]
        # node 0's ranks 0.5, 1.5, ...; node 1's all 0.5 (node 1 alone sees no difference:
        # it must learn node 0's verdict) / 0.5 on node 0, 1.5 on node 1
        factors = [0.5 + (r if r < half else 0) if case == "inside node 0" else 0.5 + r // half
                   for r in range(n)]  # fmt: skip
        x = given[comm.rank].copy()
        with at_debug(comm, "off"):  # the debug check counts the factor as part of the call
            comm.all_reduce(x, op=ReduceOp.PREMUL_SUM(factors[comm.rank]))
        want = sum(g * f for g, f in zip(given, factors, strict=True))
        np.testing.assert_allclose(x, want, rtol=1e-12, atol=1e-12, err_msg=case)
    plain(3)
    assert fast.direct_calls == mpi_before + 3  # counted as begun, then the one with
    # factors differing inside node 0 ran on MPI
    assert fast._held == []


def test_hierarchical_info_says_off_without_a_threshold(comm, node_form, monkeypatch):
    # Across nodes the path runs only from HPCCOMM_SHM_THRESHOLD; without it hpccomm info
    # named the path all the same ("hierarchical all_reduce across nodes (from
    # HPCCOMM_SHM_THRESHOLD only)") and no call took it (an outside hunt on the cluster)
    if comm.size < 4 or comm.size % 2:
        pytest.skip("needs an even number of 4 or more ranks (two pretend nodes of 2+)")
    fast, node, half = on_pretend_nodes(comm, node_form, monkeypatch)
    assert fast.describe("hpccomm info").startswith(
        "hierarchical all_reduce across nodes from 1,024 bytes (HPCCOMM_SHM_THRESHOLD); inside "
    )
    local = (node, comm.rank - node * half, half)
    unset = ShmBackend(comm._backend, None, CHUNK, direct=node_form in SINGLE, node=local)
    comm._dispatcher.shm = unset
    comm._dispatcher.cache.clear()
    assert unset.describe("hpccomm info") == (
        "off across nodes: HPCCOMM_SHM_THRESHOLD is not set (the hierarchical all_reduce is "
        "not measured across real nodes: it runs only from a size given)"
    )
    x = np.full(1 << 20, comm.rank + 1, np.int32)  # 4 MiB
    comm.all_reduce(x)
    assert (x == comm.size * (comm.size + 1) // 2).all()
    assert (unset.calls, unset.direct_calls) == (0, 0)  # (what the line says)


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.float32, np.float16, np.complex64,
                                   np.bool_], ids=name)  # fmt: skip
def test_hierarchical_all_reduce_on_pretend_nodes(comm, dtype, node_form, monkeypatch):
    # Ranks 0..p/2-1 play node 0, the others node 1. With an even rank count the path runs
    # (node-local shared memory, MPI between the two nodes' ranks holding the same slice);
    # with an odd one the nodes differ in size and every rank stays on MPI.
    n = comm.size
    if n < 2:
        pytest.skip("needs 2 or more ranks")
    fast, node, half = on_pretend_nodes(comm, node_form, monkeypatch)
    runs = n % 2 == 0 and n >= 4
    seed = 0
    check = Checks()
    for opname in ops_for(dtype):
        for count in sizes_for(dtype, comm.size):
            seed += 1
            x = inputs(comm.rank, count, dtype, seed)
            comm.all_reduce(x, op=op_of(opname))
            want = hierarchical(n, half, count, dtype, opname, seed)
            if not runs and np.dtype(dtype).kind in "fc":  # MPI's own order: not bitwise
                wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
                if np.dtype(dtype).itemsize == 2 and opname == "PRODUCT":
                    continue  # overflow to inf depends on the order
                tol = 0.1 if np.dtype(dtype).itemsize == 2 else 1e-5  # float16: per-step rounding
                if not np.allclose(
                    x.astype(wide), want.astype(wide), rtol=tol, atol=1.0, equal_nan=True
                ):
                    check.bad.append(f"{opname} {count}: not close to NumPy's result")
                continue
            check(f"{opname} {count}", x, want)
    check.done()
    if runs:
        assert fast.failed is None and fast.cross is not None
        ran_as(fast, node_form, seed)
    else:
        assert fast.calls == 0 and "ranks per node" in fast.failed


def hierarchical(size, half, count, dtype, opname, seed):
    """The hierarchical path's order: each node's ranks in order, then node 0's result with
    node 1's (AVG: every input scaled by 1/size first, as PREMUL_SUM)."""
    dt = np.dtype(dtype)
    f = BOOL_UFUNC[opname] if dt == np.bool_ else UFUNC[opname]
    xs = [inputs(r, count, dtype, seed) for r in range(size)]
    if opname in ("PREMUL_SUM", "AVG"):
        xs = [(x * (0.5 if opname == "PREMUL_SUM" else 1.0 / size)).astype(dt) for x in xs]
    with np.errstate(all="ignore"):
        nodes = []
        for lo in range(0, size, half):
            acc = xs[lo].copy()
            for x in xs[lo + 1 : lo + half]:
                acc = f(acc, x).astype(dt)
            nodes.append(acc)
        if size % 2:  # uneven nodes: MPI's all_reduce, the copy path's order
            return expected(size, count, dtype, opname, seed)
        acc = f(nodes[0], nodes[1]).astype(dt)
    return acc


@pytest.mark.parametrize("direct", [False, True], ids=["copy", "single_copy"])
def test_calls_of_no_elements_from_a_threshold_of_zero(comm, monkeypatch, direct):
    # HPCCOMM_SHM_THRESHOLD=0: every size takes the path, 0 elements too. The copy path had
    # no chunk for them: all_reduce and reduce's root raised IndexError, and where one rank
    # had 0 elements and the other 4096 the ranks' ticks parted for good (every later call
    # a MismatchError). Now: nothing to do, alike on every rank; a call whose sizes differ
    # is a MismatchError on every rank, and the group goes on.
    comm, fast = with_fast_path(comm, monkeypatch, direct=direct, threshold=0)
    empty = np.ones(0, np.float32)
    assert comm.all_reduce(empty).shape == (0,)
    for root in range(comm.size):
        assert comm.reduce(np.ones(0, np.float64), root).shape == (0,)
    assert comm.reduce_scatter(np.ones(0, np.int32)).shape == (0,)
    with at_debug(comm, "off"):  # no debug check: the path's header check sees it
        with pytest.raises(MismatchError, match="differ"):
            comm.all_reduce(np.ones(0 if comm.rank == 0 else 4096, np.float32))
    for _ in range(3):
        x = np.full(4096, comm.rank + 1.0, np.float32)
        comm.all_reduce(x)
        assert (x == comm.size * (comm.size + 1) / 2).all()


def test_a_chunk_that_dtypes_cannot_tile_is_refused():
    # 4100 bytes: float64 and complex128 views of a chunk failed inside every call
    with pytest.raises(hpccomm.InvalidArgumentError, match="HPCCOMM_SHM_CHUNK is 4100, expected"):
        shm_mod.settings({"HPCCOMM_SHM_CHUNK": "4100"})
    assert shm_mod.settings({"HPCCOMM_SHM_CHUNK": "4160"}).chunk == 4160


def test_buffers_dropped_while_a_call_looks_them_up(comm, monkeypatch):
    # The worker thread (async calls) looks up symmetric buffers in the group's table while
    # the main thread may drop others (their finalizers remove their entries): "dictionary
    # changed size during iteration" failed a call on one rank, its peers then waited. An
    # entry whose lookup drops another makes the interleaving certain.
    comm, fast = with_fast_path(comm, monkeypatch)
    x = comm.zeros(4096, np.float32)
    keep = [comm.zeros(256, np.float32) for _ in range(3)]

    class Dropping:
        region = 0

        @property
        def start(self):
            fast.allocs.pop(max(fast.allocs), None)  # the newest buffer's finalizer
            return 0

    fast.allocs = {0: Dropping(), **fast.allocs}
    before = fast.sym_calls
    x[:] = comm.rank + 1
    comm.all_reduce(x, async_op=True).wait()
    assert (x == comm.size * (comm.size + 1) / 2).all()
    assert fast.sym_calls == before + 1
    del keep
