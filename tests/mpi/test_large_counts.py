"""Counts beyond a C int: the embedded Open MPI (MPI 3.1) refuses more than 2^31-1 elements
in one argument, so all_reduce, reduce, broadcast, send and recv run in pieces and the other
operations refuse with the limit named. The pieces are tested with a small limit (a real
2^31-element array needs gigabytes per rank)."""

import numpy as np
import pytest

from hpccomm import InvalidArgumentError, ReduceOp
from hpccomm.backends import mpi as mpi_backend

LIMIT = 1000


@pytest.fixture
def small_limit(world, monkeypatch):
    monkeypatch.setattr(mpi_backend, "MAX_COUNT", LIMIT)
    c = world.dup()  # a fresh validation cache: calls are prepared under the small limit
    yield c
    c.free()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("timeout", [None, 60.0], ids=["plain", "bounded"])
def test_reductions_and_broadcast_in_pieces(small_limit, async_op, timeout):
    comm = small_limit
    comm.timeout = timeout
    n, r = comm.size, comm.rank
    count = 2 * LIMIT + 345  # three pieces, the last one short

    def run(result):
        return result.wait(timeout=60) if async_op else result

    x = (np.arange(count, dtype=np.int64) + r).reshape(5, -1)
    run(comm.all_reduce(x, async_op=async_op))
    expect = sum(np.arange(count, dtype=np.int64) + i for i in range(n)).reshape(5, -1)
    assert np.array_equal(x, expect)
    y = np.full(count, float(r + 1))
    run(comm.all_reduce(y, op=ReduceOp.PREMUL_SUM(0.5), async_op=async_op))
    assert np.allclose(y, 0.5 * sum(range(1, n + 1)))
    z = np.full(count, float(r))
    run(comm.all_reduce(z, op=ReduceOp.AVG, async_op=async_op))
    assert np.allclose(z, (n - 1) / 2)
    w = np.full(count, r + 1, np.int32)
    run(comm.reduce(w, n - 1, op=ReduceOp.MAX, async_op=async_op))
    if r == n - 1:
        assert (w == n).all()
    b = np.arange(count, dtype=np.float32) if r == 0 else np.zeros(count, np.float32)
    run(comm.broadcast(b, 0, async_op=async_op))
    assert np.array_equal(b, np.arange(count, dtype=np.float32))


@pytest.mark.mpi(min_size=2)
def test_send_recv_in_pieces(small_limit):
    comm = small_limit
    r = comm.rank
    count = 3 * LIMIT + 1
    if r == 0:
        comm.send(np.arange(count, dtype=np.int16), 1, tag=4)
        work = comm.isend(np.arange(count, dtype=np.int16) * 2, 1, tag=5)
        work.wait(timeout=60)
    elif r == 1:
        got = np.empty(count, np.int16)
        assert comm.recv(got, 0, tag=4) == 0
        assert np.array_equal(got, np.arange(count, dtype=np.int16))
        assert comm.irecv(got, 0, tag=5).wait(timeout=60) == 0
        assert np.array_equal(got, np.arange(count, dtype=np.int16) * 2)
        with pytest.raises(InvalidArgumentError, match="recv from a named source"):
            comm.recv(got, None, tag=6)  # any source: the pieces could come from two senders
    comm.barrier()


def test_other_operations_name_the_limit(small_limit):
    comm = small_limit
    with pytest.raises(
        InvalidArgumentError,
        match=rf"all_gather( on \S+)? \(rank {comm.rank} of {comm.size}\): 1,001 elements in one MPI "
        r"argument, more than 1,000 \(a C int\)",
    ):
        comm.all_gather(np.ones(LIMIT + 1))
    if comm.size > 1:  # another rank's block: named (it was the count alone)
        sizes = [1] * comm.size
        sizes[(comm.rank + 1) % comm.size] = LIMIT + 1
        with pytest.raises(
            InvalidArgumentError,
            match=rf"1,001 elements in one MPI argument \(rank {(comm.rank + 1) % comm.size}'s "
            r"block\), more than 1,000",
        ):
            comm.all_gather(np.ones(1), sizes=sizes)


def test_a_receive_from_itself_in_pieces(small_limit):
    # each piece of a receive from this rank itself is a receive of its own (see _SelfQueue),
    # matched in order: the pieces' requests were once gathered without copying back (the
    # buffer stayed unchanged)
    comm = small_limit
    me = comm.rank
    count = 2 * LIMIT + 345
    got = np.zeros(count, np.int64)
    w = comm.irecv(got, me, tag=7)
    comm.send(np.arange(count, dtype=np.int64), me, tag=7)
    assert w.wait(timeout=60) == me
    assert np.array_equal(got, np.arange(count))


@pytest.mark.mpi(min_size=3)
def test_blocks_starting_past_the_limit_are_refused_by_name(small_limit):
    # each block within a C int, a later one starting past one: MPI's displacements are C
    # ints too, and such calls reached MPI, whose MPI_ERR_ARG named nothing (an outside
    # hunt: sizes of 2**30 + 1 int8 rows at 3 ranks); every rank refuses alike
    comm = small_limit
    n = comm.size
    sizes = [700, 701] + [700] * (n - 2)  # uneven: rank 2's block starts at 1,401
    mine = sizes[comm.rank]
    with pytest.raises(InvalidArgumentError, match=r"rank 2's block starts at element 1,401"):
        comm.all_gather(np.ones(mine), sizes=sizes)
    with pytest.raises(InvalidArgumentError, match=r"rank 2's block starts at element 1,400"):
        comm.gather(np.ones(700), dst=0)  # (MPI_Gatherv, equal blocks too)
    out = comm.all_gather(np.full(700, float(comm.rank)))  # equal blocks: MPI_Allgather
    assert out.shape == (700 * n,) and out[1400] == 2.0
