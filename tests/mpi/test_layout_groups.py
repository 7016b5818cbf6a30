"""Layout groups on real ranks: members and an all_reduce per group (tp 2 x dp 2 and
pp 2 x tp 2 at 4 ranks; the layouts that fit at other sizes)."""

import numpy as np
import pytest

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
