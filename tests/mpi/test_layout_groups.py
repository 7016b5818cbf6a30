"""Layout groups on real ranks: members and an all_reduce per group (tp 2 x dp 2 and
pp 2 x tp 2 at 4 ranks; the layouts that fit at other sizes)."""

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
            assert f"expected {len(want)} ({want}) by the layout" in str(exc)
        else:  # a group that is the layout's for this rank (its dp group: itself alone)
            assert not first and g.size == len(want) and g.rank == want.index(comm.rank)
    comm.debug = "large"
    x = np.ones(3)
    comm.all_reduce(x)  # the group goes on
    assert (x == comm.size).all()
    groups.free()
