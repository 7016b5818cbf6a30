"""The default debug level, "large": a collective on the host MPI path whose largest buffer
exceeds the threshold (Open MPI's eager limit less headroom) is compared across ranks before
MPI is called, so sizes that differ raise MismatchError on every rank instead of letting
Open MPI's single-copy transport write past the smaller buffer. Every rank of a correct
call must decide alike whether to check (else the checking rank would wait for the others),
at sizes on both sides of the threshold, for every op and call variant."""

import re

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
        # (an all_to_all at every size: split sizes on some ranks only must not hang)
        want = 1 if largest * 4 > limit or op == "all_to_all" else 0
        assert checked == want, (op, n, largest * 4, limit)


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
    assert len(seen) == 2  # the fingerprints, then whether every rank's splits agree
    assert got.tolist() == [float(i) for i in range(p) for _ in range(recv[i])]


def test_off_checks_nothing(comm):
    comm.debug = "off"
    seen = exchanges(comm)
    comm.all_reduce(np.ones(comm._dispatcher.large, F32))
    assert seen == []


@pytest.mark.parametrize("op", ["broadcast_object", "all_gather_object", "gather_object"])
def test_object_collectives_are_checked_at_every_size(comm, op):
    # only the source knows an object's pickled size, so no size rule could be alike on
    # every rank: every object collective is compared (roots that differed on a 300 KB
    # broadcast_object waited in mpi4py's exchange for ever, or timed out as "some rank has
    # not joined it" though every rank had)
    seen = exchanges(comm)
    r = comm.rank
    if op == "broadcast_object":
        got = comm.broadcast_object({"r": r}, src=comm.size - 1)
        assert got == {"r": comm.size - 1}
    elif op == "all_gather_object":
        assert comm.all_gather_object(r) == list(range(comm.size))
    else:
        got = comm.gather_object(r, dst=0)
        assert got == (list(range(comm.size)) if r == 0 else None)
    assert len(seen) == 1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", ["roots", "ops"])
def test_object_collectives_that_differ_raise_on_every_rank(comm, case):
    r, big = comm.rank, {"pad": "x" * 300_000}
    with pytest.raises(hpccomm.MismatchError) as info:
        if case == "roots":  # every rank names itself the source
            comm.broadcast_object(big, src=r)
        elif r == 0:
            comm.all_gather_object(big)
        else:
            comm.broadcast_object(big, src=0)
    said = (
        r"src is 0 on rank 0(,| but) 1 on rank 1" if case == "roots" else "'all_gather_object' on"
    )
    assert re.search(said, str(info.value)), str(info.value)
    assert comm.all_gather_object(r) == list(range(comm.size))  # the group goes on


@pytest.mark.mpi(min_size=2)
def test_ranks_out_of_step_make_the_group_unusable_on_every_rank(comm):
    # A rooted call below the threshold on rank 1 (not compared: its message goes out
    # eagerly and the call completes) and above it on rank 0 (compared: rank 0 waits in
    # the check, which rank 1's next call meets). The sequence numbers then differ for
    # good: every later call used to raise a MismatchError, or return on rank 1 alone.
    if comm.size != 2:
        pytest.skip("written for 2 ranks (a reduce's message must leave rank 1 eagerly)")
    r, n = comm.rank, comm._dispatcher.large // 4
    big, small = np.ones(n + 256, F32), np.ones(256, F32)
    if r == 1:
        comm.reduce(small, 0)  # completes on its own
    with pytest.raises(hpccomm.MismatchError) as info:
        comm.reduce(big, 0) if r == 0 else comm.all_reduce(big)
    msg = str(info.value)
    assert "seq is 1 on rank 0 but 2 on rank 1" in msg, msg
    assert "the ranks are out of step on this group: rank 1 has made 1 call more" in msg
    assert "the group is unusable" in msg
    for call in (lambda: comm.all_reduce(np.ones(3)), lambda: comm.barrier()):
        with pytest.raises(hpccomm.ClosedError, match="the group is unusable: .*out of step"):
            call()


@pytest.mark.mpi(min_size=2)
def test_an_object_collective_refused_on_one_rank_is_named_on_every_rank(comm):
    # a scatter_object list of the wrong length on the source: refused there, and the
    # others, in the check that every object collective gets, waited for it (at "check" the
    # refusing rank joined the comparison; at "large" it did not)
    r = comm.rank
    objs = list(range(comm.size + 1)) if r == 0 else None
    with pytest.raises(hpccomm.HpccommError) as info:
        comm.scatter_object(objs, src=0)
    msg = str(info.value)
    if r == 0:
        assert type(info.value) is hpccomm.InvalidArgumentError, msg
    else:  # (its notice comes after the comparison: no PeerError first where bounded)
        assert type(info.value) is hpccomm.MismatchError, msg
        assert "rank 0 refused it: InvalidArgumentError" in msg, msg
    assert comm.all_gather_object(r) == list(range(comm.size))  # the group goes on


@pytest.mark.mpi(min_size=2)
def test_an_all_to_all_refused_on_one_rank_is_named_on_every_rank(comm):
    # all_to_all on arrays is compared at "large" at every size, as object collectives are,
    # but a rank refusing it did not join that comparison: at 3 ranks with a timeout the
    # others raised a PeerError from its notice and the group was unusable on every rank
    # ("refused here but rank(s) [1, 2] entered it")
    r, n = comm.rank, comm.size
    splits = [1] * (n - 1) if r == 0 else [1] * n  # rank 0's: one entry short
    with pytest.raises(hpccomm.HpccommError) as info:
        comm.all_to_all_single(
            np.ones(sum(splits)), input_split_sizes=splits, output_split_sizes=[1] * n
        )
    msg = str(info.value)
    if r == 0:
        assert type(info.value) is hpccomm.InvalidArgumentError, msg
    else:
        assert type(info.value) is hpccomm.MismatchError, msg
        assert "rank 0 refused it: InvalidArgumentError" in msg, msg
    x = np.ones(2)
    comm.all_reduce(x)  # the group goes on
    assert (x == n).all()


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("op", ["all_gather", "gather", "scatter", "reduce_scatter"])
def test_equal_sizes_given_on_some_ranks_only_are_the_plain_call(comm, op, size):
    # sizes= (or split sizes) whose blocks are all equal, on rank 0 only: the same data
    # movement as the plain call, so a correct call. The ranks used to run different MPI
    # collectives (allgatherv against allgather: a hang) or, above the threshold, differ in
    # the comparison ("the ranks' calls differ: the ranks' calls differ")
    p, r = comm.size, comm.rank
    width = 2 if size == "small" else comm._dispatcher.large // 8
    given = [3] * p if r == 0 else None
    x = np.full((3, width), r + 1.0, F32)
    if op == "all_gather":
        got = comm.all_gather(x, sizes=given)
        want = np.repeat(np.arange(1.0, p + 1), 3)
    elif op == "gather":
        got = comm.gather(x, dst=0, sizes=given)
        want = np.repeat(np.arange(1.0, p + 1), 3) if r == 0 else None
    elif op == "scatter":
        full = np.repeat(np.arange(1.0, p + 1), 3)[:, None] * np.ones((1, width), F32)
        got = comm.scatter(full.astype(F32) if r == 0 else None, src=0, sizes=given,
                           out=np.empty((3, width), F32))  # fmt: skip
        want = np.full(3, r + 1.0)
    else:
        got = comm.reduce_scatter(np.full((3 * p, width), r + 1.0, F32), sizes=given)
        want = np.full(3, p * (p + 1) / 2)
    if want is None:
        assert got is None
    else:
        assert np.array_equal(np.asarray(got)[:, 0], want), (op, np.asarray(got)[:, 0], want)


@pytest.mark.mpi(min_size=2)
def test_split_sizes_given_on_some_ranks_only_are_named(comm):
    # all_to_all_single: split sizes on rank 0 only (equal blocks, so the same data); every
    # rank must run the same MPI collective, so hpccomm asks for them on every rank or on
    # none; above the threshold the message said "the ranks' calls differ: the ranks' calls
    # differ"
    p, r = comm.size, comm.rank
    x = np.ones((2 * p, comm._dispatcher.large // 8), F32)
    splits = [2] * p if r == 0 else None
    with pytest.raises(hpccomm.MismatchError) as info:
        comm.all_to_all_single(x, input_split_sizes=splits, output_split_sizes=splits)
    others = "rank 1" if p == 2 else f"ranks {list(range(1, p))}"
    assert (
        f"uneven sizes (sizes=, split sizes) given on rank 0 but not on {others} (pass them "
        f"on every rank or on none; all_to_all_single's split sizes count even where they are "
        f"all equal)" in str(info.value)
    ), str(info.value)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("async_op", [False, True], ids=["plain", "async"])
def test_split_sizes_on_some_ranks_only_below_the_threshold(comm, async_op):
    # the same below the threshold, where calls are not compared before MPI runs them: rank
    # 0 (split sizes: its call compared, then MPI's alltoallv) against ranks without them
    # (MPI's alltoall straight away) hung without a timeout, and with one timed out on every
    # rank, rank 0 blaming the sizes of the buffers; every small all_to_all is compared now
    p, r = comm.size, comm.rank
    x = np.arange(4 * p, dtype=np.int64)
    splits = [1] + [4] * (p - 2) + [7] if r == 0 else None  # rank 0 sends 7 to the last
    recv = [4] * p if r == 0 else None
    with pytest.raises(hpccomm.MismatchError) as info:
        if async_op:
            comm.all_to_all_single(
                x, input_split_sizes=splits, output_split_sizes=recv, async_op=True
            ).wait()
        else:
            comm.all_to_all_single(x, input_split_sizes=splits, output_split_sizes=recv)
    assert "uneven sizes (sizes=, split sizes) given on rank 0 but not on" in str(info.value)
    out = comm.all_to_all_single(x)  # the group goes on
    assert np.array_equal(out, np.concatenate([np.arange(4 * r, 4 * r + 4)] * p)), out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("then", ["barrier", "split"])
def test_a_refusal_joining_a_comparison_restarts_the_uncompared_count(comm, then):
    # A small all_reduce (not compared when it runs), then a scatter_object refused on the
    # source (it joins the others' comparison): the others' count of uncompared calls
    # restarted there, the refusing rank's did not, so the barrier compared on that rank
    # alone while the others went into MPI's barrier, for good (an outside audit)
    comm.all_reduce(np.ones(3))
    with pytest.raises((hpccomm.InvalidArgumentError, hpccomm.MismatchError), match="objects is"):
        comm.scatter_object(5 if comm.rank == 0 else None, src=0)
    if then == "barrier":
        comm.barrier()
    else:
        comm.split(0).free()
    x = np.ones(3)
    comm.all_reduce(x)
    assert (x == comm.size).all()
    comm.barrier()
