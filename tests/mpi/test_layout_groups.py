"""Layout groups on real ranks: members and an all_reduce per group (tp 2 x dp 2 and
pp 2 x tp 2 at 4 ranks; the layouts that fit at other sizes)."""

import re

import numpy as np
import pytest

from hpccomm import MismatchError
from hpccomm.layout import Layout

CASES = [
    dict(tp=2, dp=2),
    dict(pp=2, tp=2),
    dict(tp=2),
    dict(dp=3),
    dict(pp=2, tp=2, order="tp-cp-ep-pp-dp"),
]


@pytest.mark.parametrize("sizes", CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_layout_groups_members_and_sums(comm, sizes):
    product = 1
    for k, v in sizes.items():
        if k != "order":
            product *= v
    if product != comm.size:
        pytest.skip(f"layout {sizes} needs {product} ranks, this run has {comm.size}")
    groups = comm.layout(**sizes)
    lay = Layout(comm.size, **sizes)
    for dims in ("tp", "dp", "pp", "tp-dp", "tp-pp"):
        members = lay.group_of(comm.rank, dims)
        g = groups.group(dims)
        assert g.size == len(members) and g.rank == members.index(comm.rank)
        assert g.translate(range(g.size), comm) == members
        x = np.array([comm.rank], dtype=np.int64)
        g.all_reduce(x)
        assert x[0] == sum(members)
    assert groups.tp is groups.group("tp")  # cached
    groups.free()


@pytest.mark.parametrize("debug", ["large", "off"])
@pytest.mark.parametrize("how", ["dims", "layout"])
def test_ranks_asking_for_different_layout_groups(comm, debug, how):
    # Rank 0 asks for tp while the others ask for dp (or build another layout): under the
    # default level the split returned groups of the wrong size and the all_reduce summed the
    # wrong ranks, silently. The default level compares the layouts now (MismatchError on
    # every rank, the group goes on); "off" still finds it where the group is not the
    # layout's (a MismatchError on that rank)
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    comm.debug = debug
    first = comm.rank == 0
    if how == "dims":
        groups = comm.layout(tp=comm.size)
        dims = "tp" if first else "dp"
    else:
        groups = comm.layout(tp=comm.size) if first else comm.layout(dp=comm.size)
        dims = "tp"
    want = groups.members(dims)
    if debug == "large":
        with pytest.raises(MismatchError, match=r"split #\d+ on .*the ranks' calls differ: expect"):
            groups.group(dims)
    else:
        try:
            g = groups.group(dims)
        except MismatchError as exc:
            assert f"expected {want} by the layout" in str(exc)
        else:  # a group that is the layout's for this rank (its dp group: itself alone)
            assert not first and g.size == len(want) and g.rank == want.index(comm.rank)
    comm.debug = "large"
    x = np.ones(3)
    comm.all_reduce(x)  # the group goes on
    assert (x == comm.size).all()
    groups.free()


def test_debug_off_finds_a_group_of_the_right_size_with_other_members(comm):
    # tp=2 at 4 ranks, rank 0 asks for tp and the others for dp: the split gives rank 0 the
    # group [0, 2] (rank 2's dp group), of tp's size and with rank 0 first, which a check of
    # size and position passed (rank 0 then summed with rank 2 as its tp partner, silently)
    if comm.size < 4 or comm.size % 2:
        pytest.skip("needs an even number of ranks, at least 4")
    # (rank 2, whose dp group it is, is told too: the group's members name it differently,
    # world/tp on rank 0 and world/dp on rank 2: each raised; rank 2 kept a group whose other
    # member had freed it, before 2026-12-06)
    comm.debug = "off"
    try:
        groups = comm.layout(tp=2)
        if comm.rank % 2 == 0:  # (rank 0's dp group: the even ranks)
            with pytest.raises(MismatchError, match=r"split on .*: the new group's members name "
                               r"it differently: '\S+/tp' on rank 0 but '\S+/dp' on ranks? 2"):  # fmt: skip
                groups.group("tp" if comm.rank == 0 else "dp")
        else:
            groups.group("dp")
    finally:
        comm.debug = "large"
    groups.free()
    x = np.ones(3)
    comm.all_reduce(x)  # the world goes on
    assert (x == comm.size).all()


def test_a_layout_and_sizes_beside_it_are_refused(comm):
    # the sizes and order beside a Layout were ignored silently (tp=4, order='garbage')
    from hpccomm import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=r"layout .*both a Layout and \{'tp': 4, "
                       r"'order': 'garbage'\} were given, expected one of them"):  # fmt: skip
        comm.layout(Layout(comm.size), tp=4, order="garbage")
    assert comm.layout(Layout(comm.size)).layout == Layout(comm.size)


def test_layout_errors_name_the_rank_and_group(comm):
    # Layout's own errors went through unnamed ("layout: world 2 is not divisible ..."); a
    # freed communicator's layout() returned groups that failed only on first use
    from hpccomm import ClosedError, InvalidArgumentError

    on = "" if comm.name == "world" else f" on {comm.name}"
    with pytest.raises(InvalidArgumentError, match=rf"^layout{on} \(rank {comm.rank} of "
                       rf"{comm.size}\): world {comm.size} is not divisible by tp"):  # fmt: skip
        comm.layout(tp=comm.size + 1)
    with pytest.raises(InvalidArgumentError, match=r"\(rank \d+ of \d+\): tp is 0, expected"):
        comm.layout(tp=0)
    with pytest.raises(InvalidArgumentError, match=r"differences\(\) compares two Layouts; "
                       r"got int 5"):  # fmt: skip
        Layout(comm.size).differences(5)
    d = comm.dup()
    d.free()
    with pytest.raises(ClosedError, match=r"layout .*already freed"):
        d.layout(dp=comm.size)
    # a layout's group first used after its communicator was freed: named, not "split"
    d = comm.dup()
    groups = d.layout(dp=comm.size)
    d.free()
    with pytest.raises(ClosedError, match=rf"^layout group tp on {re.escape(d.name)} \(rank "
                       rf"{comm.rank} of {comm.size}\): communicator {re.escape(d.name)} already "
                       r"freed, and a layout makes its groups from it on first use"):  # fmt: skip
        groups.tp.all_reduce(np.ones(2))


def test_a_layout_with_a_call_running_frees_none_of_its_groups(comm):
    # free() freed the groups before the one with a call running, then refused "nothing was
    # freed", and kept the freed groups' handles (an outside hunt)
    from hpccomm import InvalidArgumentError

    groups = comm.layout(dp=comm.size)
    tp, dp = groups.tp, groups.dp
    work = dp.all_reduce(np.ones(1 << 16, np.float32), async_op=True)
    with pytest.raises(InvalidArgumentError, match=r"free of the layout over .*: 1 operation"
                       r"\(s\) on \S+/dp still running .*wait\(\) for them first \(nothing "
                       r"was freed;"):  # fmt: skip
        groups.free()
    assert not tp.freed and not dp.freed
    work.wait()
    assert tp.all_reduce(np.ones(2))[0] == 1
    groups.free()
    assert tp.freed and dp.freed
    assert groups.tp is not tp and groups.tp.all_reduce(np.ones(2))[0] == 1  # made anew
    groups.free()


def test_a_layout_closes_every_group_before_it_looks_for_running_calls(comm, monkeypatch):
    # free() looked at every group, then freed them one by one: a call another thread
    # started on a later group in between reached it, and that group's free() raised after
    # the earlier ones were freed (a review). Every group is closed first now: such a call
    # gets ClosedError, and every group is freed. (The "other thread" is simulated by a call
    # made from inside the look, on every rank alike.)
    from hpccomm import ClosedError

    groups = comm.layout(dp=comm.size)
    tp, dp = groups.tp, groups.dp
    looked = tp._running
    seen = []

    def look():
        if not seen:  # (the layout's look; tp.free() looks again)
            try:
                dp.all_reduce(np.ones(2))
                seen.append("ran")
            except ClosedError:
                seen.append("ClosedError")
        return looked()

    monkeypatch.setattr(tp, "_running", look)
    groups.free()
    assert seen == ["ClosedError"]
    assert tp.freed and dp.freed


def test_a_layout_frees_every_group_after_one_look(comm, monkeypatch):
    # each group's free() looked again: a thread refused by the closed group meanwhile was
    # still counted inside it (its refusal's dump, its notices), and that free() raised
    # "nothing was freed" after the earlier groups were freed (a review). The thread is
    # simulated by its entry in the group's table of threads inside calls.
    groups = comm.layout(dp=comm.size)
    tp, dp = groups.tp, groups.dp
    last = list(groups._groups.values())[-1]  # the layout's look ends with it
    looked = last._running
    table = dp._dispatcher._threads

    def look():
        out = looked()
        table.setdefault(-1, "all_reduce")  # a thread entering dp's dispatch after the look
        return out

    monkeypatch.setattr(last, "_running", look)
    try:
        groups.free()
    finally:
        table.pop(-1, None)
    assert tp.freed and dp.freed


def test_a_call_refused_while_a_refused_free_looked_leaves_the_group_unusable(comm, monkeypatch):
    # a collective refused ("already freed") while another thread's free() had closed the
    # group took its number; that free() was then refused and the group opened again, out
    # of step with peers that may be inside that call (a review). The group is unusable
    # now. (The other thread is simulated by a call made from inside the look, every rank
    # alike.)
    from hpccomm import ClosedError, InvalidArgumentError

    g = comm.dup()
    looked = g._running
    said = []

    def look():
        try:
            g.all_reduce(np.ones(2))
        except ClosedError as exc:
            said.append(str(exc))
        return [*looked(), "all_reduce on a thread (simulated) still running"]

    monkeypatch.setattr(g, "_running", look)
    with pytest.raises(InvalidArgumentError, match="nothing was freed"):
        g.free()
    assert "is being freed by another thread" in said[0], said
    monkeypatch.undo()
    with pytest.raises(ClosedError, match="the group is unusable: a collective of it was refused"):
        g.all_reduce(np.ones(2))
    with pytest.raises(ClosedError, match="the group is unusable"):
        g.create_group(list(range(comm.size)))
    g.free()


def test_dense_and_expert_groups_have_their_own_names(comm):
    # Megatron's pair: the dense layout's groups and its expert layout's shared names
    # (world/tp for both), so errors and flight recorder dumps could not tell them apart
    if comm.size % 2:
        pytest.skip("needs an even world size for ep=2")
    dense = comm.layout(tp=1)
    experts = comm.layout(dense.layout.expert(ep=2))
    try:
        assert dense.tp.name == f"{comm.name}/tp" and dense.dp.name == f"{comm.name}/dp"
        assert experts.tp.name == f"{comm.name}/expert-tp"
        assert experts.ep.name == f"{comm.name}/expert-ep"
        assert experts.group("ep-dp").name == f"{comm.name}/expert-ep-dp"
        x = np.ones(1)
        experts.ep.all_reduce(x)
        assert x[0] == 2
    finally:
        dense.free()
        experts.free()


def test_a_tp_group_inside_one_node_is_not_warned_of(comm):
    # (every rank of these runs is on one node; across nodes placed round-robin, rank 0
    # gets a PlacementWarning: tests/slurm)
    import warnings

    from hpccomm import PlacementWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        groups = comm.layout(tp=comm.size)
        assert groups.tp.size == comm.size
    assert not [w for w in caught if issubclass(w.category, PlacementWarning)], caught
    groups.free()
