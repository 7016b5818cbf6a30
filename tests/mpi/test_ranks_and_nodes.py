"""Rank translation (group_rank, world_rank, translate) and the node group, at any size.

A rank that is not in the group reached MPI_Group_translate_ranks: a segfault that ended
the job (a world rank >= the world size), MPI_PROC_NULL passed through (-2 gave -2), None
for a rank that is no rank at all; a freed group gave mpi4py's bare MPI_ERR_COMM. The
world's node() followed the launcher's local ranks (Open MPI 5 oversubscribed numbers
ranks 0..3 of one node 0, 2, 1, 3), though it promises rank order."""

import os
import re

import numpy as np
import pytest

import hpccomm
from hpccomm import ClosedError, InvalidArgumentError


def halves(comm):
    """``comm.split(rank % 2)`` and the world ranks of this rank's half, in rank order."""
    half = comm.split(comm.rank % 2)
    return half, [comm.world_rank(r) for r in range(comm.rank % 2, comm.size, 2)]


@pytest.mark.parametrize(
    "bad",
    [lambda n: n, lambda n: n + 3, lambda n: -1, lambda n: -2],
    ids=["size", "size+3", "-1", "-2 (MPI_PROC_NULL)"],
)
def test_group_rank_of_no_world_rank_is_refused(comm, world, bad):
    half, _ = halves(comm)
    value = bad(world.size)
    with pytest.raises(
        InvalidArgumentError,
        match=rf"^group_rank on {re.escape(half.name)} \(rank {half.rank} of {half.size}\): world rank "
        rf"{value} is not in 0..{world.size - 1}$",
    ):
        half.group_rank(value)
    half.barrier()  # every rank is still here (a segfault ended the job)
    half.free()


def test_group_rank_takes_numpy_integers_and_refuses_bools(comm, world):
    half, members = halves(comm)
    for i, w in enumerate(members):
        assert half.group_rank(w) == i
        assert half.group_rank(np.int64(w)) == i and type(half.group_rank(np.int32(w))) is int
    for flag in (True, np.True_, False):
        # (not "world rank True is not in 0..3", which is false: True == 1)
        with pytest.raises(
            InvalidArgumentError,
            match=r"world rank is (np\.)?(True|False)_?, expected an integer in 0\.\.",
        ):
            half.group_rank(flag)
    for other in ("0", 1.0, None):
        with pytest.raises(
            InvalidArgumentError, match=r"^group_rank .*: world rank is .*, expected an integer in"
        ):
            half.group_rank(other)
    half.free()


@pytest.mark.mpi(min_size=2)
def test_group_rank_of_a_world_rank_outside_the_group_is_none(comm, world):
    half, members = halves(comm)
    outside = [w for w in range(world.size) if w not in members]
    assert outside and all(half.group_rank(w) is None for w in outside)
    assert half.group_rank(np.int64(outside[0])) is None
    half.free()


@pytest.mark.mpi(min_size=2)
def test_a_new_group_refuses_what_its_members_cannot_translate(comm, world):
    # 2 ranks: g.group_rank(2) and comm.translate([2], g) segfaulted
    g = comm.new_group([0, 1])
    if g:
        with pytest.raises(InvalidArgumentError, match=rf"world rank {world.size} is not in"):
            g.group_rank(world.size)
        with pytest.raises(InvalidArgumentError, match=r"group rank 2 is not in 0..1"):
            g.translate([2], comm)
        assert g.translate([0, 1], comm) == [0, 1]
        g.free()
    with pytest.raises(
        InvalidArgumentError,
        match=rf"^translate on {re.escape(comm.name)} \(rank {comm.rank} of {comm.size}\): group rank "
        rf"{comm.size} is not in 0..{comm.size - 1} \(ranks\[1\] of \[0, {comm.size}\]\)$",
    ):
        comm.translate([0, comm.size], comm)
    comm.barrier()


def test_translate_checks_every_rank(comm, world):
    half, members = halves(comm)
    assert half.translate(range(half.size), world) == members
    assert half.translate(np.arange(half.size), world) == members
    assert half.translate([], world) == []
    assert comm.translate([np.int64(comm.rank)], half) == [half.rank]
    # (7 + size gave [None] silently, -2 (MPI_PROC_NULL) gave [-2])
    for bad in (7 + half.size, -2, True, np.True_, 0.0, "0"):
        with pytest.raises(InvalidArgumentError) as info:
            half.translate([0, bad], world)
        assert str(info.value).startswith(f"translate on {half.name} (rank {half.rank} of "), info
        said = (  # (a bool is an int to Python: "group rank True is not in 0..1" was false)
            f"group rank {bad!r} is not in 0..{half.size - 1}"
            if type(bad) is int
            else f"group rank is {bad!r}, expected an integer in 0..{half.size - 1}"
        )
        assert f": {said} (ranks[1] of [0, " in str(info.value), info
    with pytest.raises(InvalidArgumentError, match=r"ranks is 0, expected a sequence of ranks"):
        half.translate(0, world)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"other is None, expected a Communicator"):
        half.translate([0], None)  # type: ignore[arg-type]
    half.free()


@pytest.mark.mpi(min_size=2)
def test_translate_to_a_non_member_handle_is_refused(comm):
    nobody = comm.split(None if comm.rank == 0 else 0)
    if not nobody:
        with pytest.raises(InvalidArgumentError, match=r"other is <hpccomm.NotMember.*expected a"):
            comm.translate([0], nobody)
    else:
        nobody.free()


def test_world_rank_checks_alike(comm):
    half, members = halves(comm)
    assert [half.world_rank(np.int16(i)) for i in range(half.size)] == members
    for bad in (half.size, -2):
        with pytest.raises(InvalidArgumentError, match=rf"group rank {bad!r} is not in 0.."):
            half.world_rank(bad)
    for bad in (True, np.False_, 1.0):
        with pytest.raises(InvalidArgumentError, match=rf"group rank is {bad!r}, expected an int"):
            half.world_rank(bad)
    half.free()


def test_a_freed_group_raises_closed_error_on_either_side(comm):
    d = comm.dup()
    d.free()
    calls = {
        "group_rank": lambda: d.group_rank(0),
        "world_rank": lambda: d.world_rank(0),
        "translate": lambda: d.translate([0], comm),
    }
    for what, call in calls.items():
        with pytest.raises(
            ClosedError,
            match=rf"^{what} on {re.escape(d.name)} .*: communicator {re.escape(d.name)} already freed",
        ):
            call()
    # the other side: this group is open, the one it translates to was freed
    with pytest.raises(
        ClosedError,
        match=rf"^translate on {re.escape(comm.name)} .*: communicator {re.escape(d.name)} already freed$",
    ):
        comm.translate([0], d)
    assert isinstance(ClosedError("x"), hpccomm.HpccommError)
    comm.barrier()


def test_the_worlds_node_group_is_in_rank_order(world):
    # world.node() followed the launcher's local ranks: [0, 2, 1, 3] at 4 ranks under
    # Open MPI 5 oversubscribed, in translate and in all_gather's blocks
    node = world.node()
    members = node.translate(range(node.size), world)
    assert members == sorted(members), members
    assert node.size == world.local_size and members[node.rank] == world.rank
    assert node.all_gather(np.array([world.rank])).tolist() == members
    assert node.local_rank == node.rank and node.local_size == node.size
    # its node facts agree with those of a node group made later (a dup's)
    with world.dup() as d:
        other = d.node()
        assert other.translate(range(other.size), world) == members
        assert other.rank == node.rank


def test_the_worlds_local_rank_stays_the_launchers(world):
    # the launcher's numbering, checked to be a permutation of 0..n-1 (README: hpccomm info)
    said = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
    if said is not None:
        assert world.local_rank == int(said)
    node = world.node()
    locals_ = node.all_gather(np.array([world.local_rank]))
    assert sorted(locals_.tolist()) == list(range(node.size))


def test_a_large_reduction_on_the_worlds_node_group(world):
    # the node group as made at init, through the shared-memory fast path where it runs
    node = world.node()
    n = 1 << 20  # 8 MiB of float64
    x = np.full(n, float(world.rank + 1))
    fast = node._shm()
    before = None if fast is None else fast.calls + fast.direct_calls
    node.all_reduce(x)
    members = node.translate(range(node.size), world)
    assert (x == float(sum(m + 1 for m in members))).all()
    if fast is not None:
        assert fast.calls + fast.direct_calls == before + 1
    blocks = node.all_gather(np.full(3, world.rank))
    assert blocks.reshape(node.size, 3)[:, 0].tolist() == members


def test_a_layout_of_numpy_sizes(comm):
    # comm.layout(tp=np.int64(2)) was refused: "tp is np.int64(2), expected an integer >= 1"
    groups = comm.layout(tp=np.int64(comm.size), dp=np.int32(1))
    assert groups.layout == comm.layout(tp=comm.size).layout
    assert groups.tp.translate(range(groups.tp.size), comm) == list(range(comm.size))
    groups.free()
