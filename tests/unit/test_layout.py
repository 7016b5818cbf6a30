"""Parallel layouts: the published Megatron example, properties over many shapes and orders,
the DeviceMesh equivalence, errors, JSON, and the CLI."""

import itertools
import json
import random

import pytest

from hpccomm.cli import main
from hpccomm.layout import TOKENS, Layout

L64 = Layout(64, tp=4, pp=2, dp=8)


def test_published_example_groups():
    assert L64.groups("tp") == [list(range(i, i + 4)) for i in range(0, 64, 4)]
    dp = L64.groups("dp")
    assert (
        len(dp) == 8 * 1
        and dp[0] == [0, 4, 8, 12, 16, 20, 24, 28]
        and dp[1] == [1, 5, 9, 13, 17, 21, 25, 29]
    )
    assert dp[-1] == [35, 39, 43, 47, 51, 55, 59, 63] and len(L64.groups("dp")) == 8
    pp = L64.groups("pp")
    assert len(pp) == 32 and pp[0] == [0, 32] and pp[-1] == [31, 63]
    tp_pp = L64.groups("tp-pp")
    assert len(tp_pp) == 8 and [0, 1, 2, 3, 32, 33, 34, 35] in tp_pp


def test_published_example_rank_37():
    assert L64.coords(37) == {"tp": 1, "cp": 0, "ep": 0, "dp": 1, "pp": 1}
    assert L64.rank_of(tp=1, dp=1, pp=1) == 37
    assert L64.group_of(37, "tp") == [36, 37, 38, 39]
    assert L64.group_of(37, "pp-tp") == [4, 5, 6, 7, 36, 37, 38, 39]


def test_megatron_combinations_exist():
    for dims in ("dp-cp", "tp-dp-cp", "tp-dp", "tp-cp", "tp-pp"):
        groups = L64.groups(dims)
        assert sorted(r for g in groups for r in g) == list(range(64))


def test_embedding_groups():
    assert L64.embedding_groups()[0] == [0, 32]
    assert Layout(4, tp=4).embedding_groups() == [[0], [1], [2], [3]]


def test_expert_layout():
    ex = L64.expert(ep=4, tp=2)
    assert ex.sizes == {"tp": 2, "ep": 4, "dp": 4, "pp": 2}
    assert ex.groups("ep")[0] == [0, 2, 4, 6]
    assert Layout.from_json(ex.to_json()) == ex


def random_layouts(count=150, seed=3):
    rng = random.Random(seed)
    for _ in range(count):
        sizes = {t: rng.choice([1, 1, 2, 3, 4]) for t in TOKENS}
        if sizes["ep"] > 1 and sizes["cp"] > 1:
            sizes["cp"] = 1
        order = list(TOKENS)
        rng.shuffle(order)
        world = 1
        for s in sizes.values():
            world *= s
        yield Layout(world, order="-".join(order), **sizes)


def test_properties_over_many_shapes_and_orders():
    for lay in random_layouts():
        world = set(range(lay.world_size))
        for r in range(0, lay.world_size, max(1, lay.world_size // 7)):
            assert lay.rank_of(**lay.coords(r)) == r
        for k in (1, 2):
            for dims in itertools.combinations(lay.order, k):
                groups = lay.groups(dims)
                flat = [r for g in groups for r in g]
                assert sorted(flat) == sorted(world), (lay, dims)  # a partition
                expect = 1
                for t in dims:
                    expect *= lay.sizes[t]
                assert all(len(g) == expect for g in groups)
        for a, b in itertools.combinations(lay.order, 2):  # orthogonal dims meet in one rank
            for r in (0, lay.world_size - 1):
                assert set(lay.group_of(r, a)) & set(lay.group_of(r, b)) == {r}


def test_megatron_order_equals_device_mesh():
    for lay in random_layouts(60, seed=11):
        mesh = Layout.from_mesh(lay.mesh_shape, lay.mesh_names)
        assert mesh == lay
        for t in lay.order:
            assert mesh.groups(t) == lay.groups(t)


def test_mesh_example_from_reference():
    mesh = Layout.from_mesh((2, 8, 4), ("pp", "dp", "tp"))
    lay = Layout(64, tp=4, dp=8, pp=2, order="tp-dp-pp-cp-ep")
    for t in ("tp", "dp", "pp"):
        assert mesh.groups(t) == lay.groups(t) == L64.groups(t)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        (
            {"world_size": 64, "tp": 4, "pp": 2, "dp": 7},
            "tp*pp*dp*cp*ep = 4*2*7*1*1 = 56, expected the world size 64; dp=8 would fit",
        ),
        ({"world_size": 10, "tp": 4}, "world 10 is not divisible by tp*pp*cp*ep = 4*1*1*1 = 4"),
        ({"world_size": 8, "order": "tp-cp-ep-dp-xx"}, "unknown token(s) ['xx']"),
        ({"world_size": 8, "order": "tp-tp-cp-ep-dp-pp"}, "repeats ['tp']"),
        ({"world_size": 8, "order": "tp-dp-pp"}, "lacks ['cp', 'ep']"),
        ({"world_size": 8, "ep": 2, "cp": 2}, "ep=2 and cp=2 are both above 1"),
        ({"world_size": 8, "tp": 0}, "tp is 0, expected an integer >= 1"),
    ],
)
def test_errors(kwargs, text):
    world = kwargs.pop("world_size")
    with pytest.raises(ValueError) as info:
        Layout(world, **kwargs)
    assert text in str(info.value)


def test_json_round_trip_and_differences():
    doc = L64.to_json()
    assert json.loads(doc) == {
        "world_size": 64,
        "order": "tp-cp-ep-dp-pp",
        "sizes": {"tp": 4, "cp": 1, "ep": 1, "dp": 8, "pp": 2},
    }
    assert Layout.from_json(doc) == L64
    other = Layout(64, tp=8, pp=2, dp=4)
    assert L64.differences(other) == ["dp 8 != 4", "tp 4 != 8"]
    with pytest.raises(ValueError, match="JSON lacks"):
        Layout.from_json("{}")


def test_cli_table_and_rank(capsys):
    assert main(["layout", "--world", "64", "--tp", "4", "--pp", "2", "--dp", "8"]) == 0
    out = capsys.readouterr().out
    assert "tp           0  [0, 1, 2, 3]" in out and "pp          31  [31, 63]" in out
    assert (
        main(["layout", "--world", "64", "--tp", "4", "--pp", "2", "--rank", "37", "--json"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["coords"] == {"tp": 1, "cp": 0, "ep": 0, "dp": 1, "pp": 1} and doc["groups"][
        "pp"
    ] == [5, 37]


def test_cli_error(capsys):
    assert main(["layout", "--world", "64", "--tp", "4", "--pp", "2", "--dp", "7"]) == 2
    assert "dp=8 would fit" in capsys.readouterr().err
