"""The default debug level, "large": a collective on the host MPI path whose largest buffer
exceeds the threshold (Open MPI's eager limit less headroom) is compared across ranks before
MPI is called, so sizes that differ raise MismatchError on every rank instead of letting
Open MPI's single-copy transport write past the smaller buffer. Every rank of a correct
call must decide alike whether to check (else the checking rank would wait for the others),
at sizes on both sides of the threshold, for every op and call variant."""

import numpy as np
import pytest

import hpccomm

F32 = np.float32


def exchanges(comm):
    """The debug-check exchanges this communicator's calls make (a list that grows)."""
    backend = comm._dispatcher.backend
    seen: list[int] = []
    original = backend.same_int

    def counted(value):
        seen.append(value)
        return original(value)

    backend.same_int = counted
    return seen


def run(comm, op, n, rank_extra=0, async_op=False):
    """One call of ``op`` with ``n`` float32 elements per rank's block (``rank_extra`` more
    on rank 0); returns the number of elements of the largest buffer."""
    p, r = comm.size, comm.rank
    m = n + (rank_extra if r == 0 else 0)
    kw = {"async_op": True} if async_op else {}
    if op == "all_reduce":
        got, largest = comm.all_reduce(np.ones(m, F32), **kw), n
    elif op == "broadcast":
        got, largest = comm.broadcast(np.ones(m, F32), 0, **kw), n
    elif op == "reduce":
        got, largest = comm.reduce(np.ones(m, F32), dst=0, **kw), n
    elif op == "all_gather":
        got, largest = comm.all_gather(np.ones(m, F32), **kw), p * n
    elif op == "gather":
        got, largest = comm.gather(np.ones(m, F32), dst=0, **kw), p * n
    elif op == "scatter":
        full = np.ones(p * m, F32) if r == 0 else None
        got, largest = comm.scatter(full, src=0, out=np.empty(m, F32), **kw), p * n
    elif op == "reduce_scatter":
        got, largest = comm.reduce_scatter(np.ones(p * m, F32), **kw), p * n
    elif op == "all_to_all":
        got, largest = comm.all_to_all(np.ones(p * m, F32), **kw), p * n
    elif op == "all_gather_v":
        sizes = [n + i for i in range(p)]
        sizes[0] += rank_extra if r == 0 else 0
        x = np.ones(sizes[r], F32)
        got, largest = comm.all_gather(x, sizes=sizes, **kw), sum(n + i for i in range(p))
    else:
        raise AssertionError(op)
    if async_op:
        got.wait()
    return largest


OPS = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "all_gather_v",
]


def test_default_level(comm):
    assert comm.debug == "large"
    assert comm._dispatcher.large in (4096 - 1024, 32768 - 1024)  # as MPI was started


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op", OPS)
def test_every_rank_decides_alike_either_side_of_the_threshold(comm, op, async_op):
    limit = comm._dispatcher.large
    p = comm.size
    per_block = {"all_reduce": 1, "broadcast": 1, "reduce": 1}.get(op, p)
    seen = exchanges(comm)
    for n in (limit // 4 // per_block - 1, limit // 4 // per_block + 1):
        if op == "all_gather_v":  # blocks n, n+1, ...: total near the threshold
            n = (limit // 4 - p * (p - 1) // 2) // p + (0 if n < limit // 4 // p else 1)
        before = len(seen)
        largest = run(comm, op, n, async_op=async_op)
        checked = len(seen) - before
        everyone = comm.all_gather_object((largest * 4, checked))
        assert len(set(everyone)) == 1, (op, n, everyone)
        assert checked == (1 if largest * 4 > limit else 0), (op, n, largest * 4, limit)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", OPS)
def test_sizes_that_differ_above_the_threshold_raise_on_every_rank(comm, op):
    n = comm._dispatcher.large // 4 + 100
    with pytest.raises(hpccomm.MismatchError, match=r"the ranks' calls differ: .*on rank 0 but"):
        run(comm, op, n, rank_extra=8)
    run(comm, op, n)  # the group stays usable: nothing reached MPI


def test_uneven_all_to_all_is_always_checked(comm):
    # its per-rank totals differ in a correct call, so every rank checks at any size
    p, r = comm.size, comm.rank
    seen = exchanges(comm)
    send = [(r + j) % 3 for j in range(p)]  # rank r sends (r + j) % 3 rows to rank j
    recv = [(i + r) % 3 for i in range(p)]
    x = np.full(sum(send), r, F32)
    got = comm.all_to_all_single(x, input_split_sizes=send, output_split_sizes=recv)
    assert len(seen) == 1
    assert got.tolist() == [float(i) for i in range(p) for _ in range(recv[i])]


def test_off_checks_nothing(comm):
    comm.debug = "off"
    seen = exchanges(comm)
    comm.all_reduce(np.ones(comm._dispatcher.large, F32))
    assert seen == []
