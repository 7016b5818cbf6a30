"""Parallel layouts: the published Megatron example, properties over many shapes and orders,
the DeviceMesh equivalence, errors, JSON, and the CLI; every group checked against a small
reference transcription of Megatron-LM's RankGenerator (orders that leave out size-1 dims)."""

import itertools
import json
import random

import pytest

from hpccomm.cli import main
from hpccomm.errors import InvalidArgumentError
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
    assert ex.sizes == {"tp": 2, "cp": 1, "ep": 4, "dp": 4, "pp": 2}
    assert ex.groups("ep")[0] == [0, 2, 4, 6]
    assert Layout.from_json(ex.to_json()) == ex
    assert L64.expert(ep=2).sizes["tp"] == 4  # Megatron: expert tp defaults to the dense tp


def test_an_expert_layout_says_so_and_keeps_it_in_json():
    # its groups are named apart from the dense layout's (world/expert-tp, not world/tp:
    # the two shared names in errors and traces); the kind names groups, it is not in ==
    ex = L64.expert(ep=4, tp=4)
    assert L64.kind == "dense" and ex.kind == "expert"
    assert "kind='expert'" in repr(ex) and "kind" not in repr(L64)
    back = Layout.from_json(ex.to_json())
    assert back.kind == "expert" and back == ex
    assert json.loads(ex.to_json())["kind"] == "expert" and "kind" not in L64.to_json()
    assert ex.groups_json() == Layout(64, tp=4, ep=4, pp=2).groups_json()
    with pytest.raises(InvalidArgumentError, match="kind 'moe', expected 'dense' or 'expert'"):
        Layout.from_json({**json.loads(ex.to_json()), "kind": "moe"})


@pytest.mark.parametrize(
    ("world", "sizes", "order", "ep", "etp"),
    [
        (64, {"tp": 4, "pp": 2, "dp": 8}, None, 4, 2),
        (64, {"tp": 4, "pp": 2, "dp": 8}, "tp-dp-pp", 4, 1),
        (48, {"tp": 2, "cp": 3, "pp": 4}, None, 3, None),
        (24, {"tp": 2, "pp": 3, "dp": 4}, "tp-pp-dp", 2, 2),
        (24, {"tp": 2, "cp": 2, "dp": 3, "pp": 2}, "cp-pp-tp-dp-ep", 6, 1),
        (8, {"cp": 2, "pp": 2, "dp": 2}, "cp-pp-dp-ep", 2, None),  # pp groups would differ
        (24, {"tp": 2, "pp": 3, "dp": 4}, "tp-pp-dp-ep", 2, 2),  # dp 2 vs 4, pp not last
        (16, {"tp": 2, "pp": 2, "dp": 4}, "tp-dp-pp", 4, 1),  # dp 2 vs 4, pp last: fine
    ],
)
def test_expert_groups_match_megatron_reference(world, sizes, order, ep, etp):
    # Megatron's expert_decoder_rank_generator: the user's order, cp = 1, its own tp/ep/dp.
    lay = Layout(world, **(dict(sizes) if order is None else dict(sizes, order=order)))
    full_etp = lay.sizes["tp"] if etp is None else etp
    pp = lay.sizes["pp"]
    try:
        m_order, m_sizes = oracle_rank_generator(
            full_etp, ep, world // (full_etp * ep * pp), pp, 1, order or "tp-cp-ep-dp-pp"
        )
    except OracleRejects:  # e.g. an order without ep: Megatron refuses ep > 1 there too
        with pytest.raises(InvalidArgumentError, match=f"lacks ep \\(size {ep}\\)"):
            lay.expert(ep=ep, tp=etp)
        return
    # initialize_model_parallel's two refusals: dp sizes that differ unless pp is last in
    # the user's order (or 1), and pipeline groups that differ between the two generators
    s = lay.sizes
    d_order, d_sizes = oracle_rank_generator(
        s["tp"], 1, s["dp"], pp, s["cp"], order or "tp-cp-ep-dp-pp"
    )
    e_dp = world // (full_etp * ep * pp)
    if not ((order or "tp-cp-ep-dp-pp").endswith("pp") or pp == 1 or e_dp == s["dp"]):
        with pytest.raises(InvalidArgumentError, match=r"expert layout's dp is \d+ but"):
            lay.expert(ep=ep, tp=etp)
        return
    if oracle_get_ranks(d_order, d_sizes, "pp") != oracle_get_ranks(m_order, m_sizes, "pp"):
        with pytest.raises(InvalidArgumentError, match=r"the pipeline groups differ"):
            lay.expert(ep=ep, tp=etp)
        return
    ex = lay.expert(ep=ep, tp=etp)
    for dims in ("tp", "ep", "dp", "pp", "tp-ep", "ep-dp", "tp-ep-pp"):
        assert ex.groups(dims) == oracle_get_ranks(m_order, m_sizes, dims), dims


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
        # Megatron appends size-1 dims an order leaves out, so "tp-dp-pp" alone (cp = ep = 1)
        # is now accepted (test_order_may_leave_out_size_1_dims); leaving out cp = 2 is not.
        ({"world_size": 8, "cp": 2, "order": "tp-dp-pp"}, "lacks cp (size 2)"),
        ({"world_size": 8, "ep": 2, "cp": 2}, "ep=2 and cp=2 are both above 1"),
        ({"world_size": 8, "tp": 0}, "tp is 0, expected an integer >= 1"),
    ],
)
def test_errors(kwargs, text):
    world = kwargs.pop("world_size")
    with pytest.raises(ValueError) as info:
        Layout(world, **kwargs)
    assert text in str(info.value)
    assert isinstance(info.value, InvalidArgumentError)


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
    assert main(["layout", "--world", "8", "--tp", "2", "--groups", "tp,,dp"]) == 2
    assert "--groups 'tp,,dp' has an empty item (item 2)" in capsys.readouterr().err


def test_cli_rank_with_embedding(capsys):
    # --embedding was dropped with --rank
    assert main(["layout", "--world", "8", "--tp", "2", "--pp", "2", "--rank", "1", "--json",
                 "--embedding"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["groups"]["embedding"] == [1, 5]


# -- Megatron's RankGenerator: reference oracle ----------------------------------------------
# REFERENCE ORACLE, not hpccomm code: an independent, deliberately literal transcription of
# Megatron-LM megatron/core/parallel_state.py, RankGenerator.__init__ / get_mask / get_ranks
# and generate_masked_orthogonal_rank_groups (checked against NVIDIA/Megatron-LM d98e8a64, its
# gtp_remat axis left out since hpccomm has none). It keeps Megatron's group order (no sorting)
# and its quirks (substring test for a missing name, no check for a repeated token).


class OracleRejects(Exception):
    """Megatron's RankGenerator would raise (assert, RuntimeError or KeyError)."""


def oracle_rank_generator(tp, ep, dp, pp, cp, order):
    """Return (order, ordered sizes) as RankGenerator.__init__ leaves them."""
    if not (ep == 1 or cp == 1):
        raise OracleRejects("both EP and CP > 1")
    name_to_size = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp}
    order = order.lower()
    for name in name_to_size:
        if name not in order and name_to_size[name] != 1:
            raise OracleRejects(f"size of {name} is {name_to_size[name]}, not in the order")
        elif name not in order:
            order = order + "-" + name
    try:
        ordered_size = [name_to_size[token] for token in order.split("-")]
    except KeyError as exc:
        raise OracleRejects(f"unknown token {exc}") from None
    return order, ordered_size


def oracle_masked_groups(world_size, parallel_size, mask):
    """generate_masked_orthogonal_rank_groups, transcribed."""

    def prefix_product(a, init=1):
        r = [init]
        for v in a:
            init = init * v
            r.append(init)
        return r

    def inner_product(a, b):
        return sum(x * y for x, y in zip(a, b, strict=False))

    def decompose(index, shape):
        stride = prefix_product(shape)
        return [(index // d) % s for s, d in zip(shape, stride, strict=False)]

    masked_shape = [s for s, m in zip(parallel_size, mask, strict=True) if m]
    unmasked_shape = [s for s, m in zip(parallel_size, mask, strict=True) if not m]
    global_stride = prefix_product(parallel_size)
    masked_stride = [d for d, m in zip(global_stride, mask, strict=False) if m]
    unmasked_stride = [d for d, m in zip(global_stride, mask, strict=False) if not m]
    group_size = prefix_product(masked_shape)[-1]
    ranks = []
    for group_index in range(world_size // group_size):
        group_idx = decompose(group_index, unmasked_shape)
        ranks.append(
            [
                inner_product(decompose(r, masked_shape), masked_stride)
                + inner_product(group_idx, unmasked_stride)
                for r in range(group_size)
            ]
        )
    return ranks


def oracle_get_ranks(order, ordered_size, token):
    """RankGenerator.get_mask + get_ranks (rank_offset 0)."""
    ordered_token = order.split("-")
    mask = [False] * len(ordered_token)
    for t in token.split("-"):
        mask[ordered_token.index(t)] = True
    world = 1
    for s in ordered_size:
        world *= s
    return oracle_masked_groups(world, ordered_size, mask)


# -- hpccomm against the oracle -------------------------------------------------------------

ALL_DIMS = ["-".join(c) for k in range(1, 6) for c in itertools.combinations(TOKENS, k)]

ORACLE_CASES = [
    # (world, sizes, order); sizes omitted are 1, dp derived when absent
    (16, {"tp": 4, "pp": 2, "dp": 2}, "tp-pp-dp"),  # the example that used to raise
    (64, {"tp": 4, "pp": 2, "dp": 8}, None),  # default order
    (48, {"tp": 2, "cp": 3, "pp": 4}, None),  # default order, cp > 1
    (64, {"tp": 4, "pp": 2, "dp": 8}, "tp-dp-pp"),  # cp = ep = 1 left out
    (24, {"tp": 2, "pp": 3, "dp": 4}, "tp-pp-dp"),
    (12, {"pp": 3, "dp": 4}, "pp-dp"),  # tp left out too
    (12, {"tp": 3, "dp": 4}, "dp-tp"),
    (24, {"tp": 2, "ep": 3, "dp": 4}, "tp-ep-dp"),  # ep > 1, pp and cp left out
    (24, {"tp": 2, "cp": 2, "dp": 3, "pp": 2}, "tp-cp-dp-pp"),  # ep left out
    (24, {"tp": 2, "cp": 2, "dp": 3, "pp": 2}, "cp-pp-tp-dp-ep"),
    (16, {"tp": 4, "pp": 2, "dp": 2}, "TP-pp-Dp"),  # case-insensitive
    (6, {"dp": 6}, "dp"),
    (1, {}, "pp"),
]


def _layout_and_oracle(world, sizes, order):
    kwargs = dict(sizes) if order is None else dict(sizes, order=order)
    lay = Layout(world, **kwargs)
    full = {t: sizes.get(t, 1) for t in TOKENS}
    if "dp" not in sizes:
        full["dp"] = world // (full["tp"] * full["pp"] * full["cp"] * full["ep"])
    m_order, m_sizes = oracle_rank_generator(
        full["tp"], full["ep"], full["dp"], full["pp"], full["cp"], order or "tp-cp-ep-dp-pp"
    )
    return lay, m_order, m_sizes


@pytest.mark.parametrize(("world", "sizes", "order"), ORACLE_CASES)
def test_groups_match_megatron_reference(world, sizes, order):
    lay, m_order, m_sizes = _layout_and_oracle(world, sizes, order)
    # the same order, with the left-out dims appended where Megatron appends them
    assert "-".join(lay.order) == m_order
    assert [lay.sizes[t] for t in lay.order] == m_sizes
    for dims in ALL_DIMS:  # "tp", "dp", "pp", "cp", "ep", "tp-pp", "cp-dp", ... all 31
        expect = oracle_get_ranks(m_order, m_sizes, dims)
        assert lay.groups(dims) == expect, (lay, dims)  # same groups, same order
        assert lay.groups("-".join(reversed(dims.split("-")))) == expect  # "dp-cp" too
        for rank in (0, world // 2, world - 1):
            mine = [g for g in expect if rank in g]
            assert [lay.group_of(rank, dims)] == mine


def test_named_megatron_groups_16():
    lay = Layout(16, tp=4, pp=2, dp=2, order="tp-pp-dp")
    assert lay.order == ("tp", "pp", "dp", "ep", "cp")
    assert lay.groups("tp") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert lay.groups("pp")[:2] == [[0, 4], [1, 5]]
    assert lay.groups("dp")[:2] == [[0, 8], [1, 9]]
    assert lay.groups("cp") == [[r] for r in range(16)]
    assert lay.groups("tp-pp") == [list(range(8)), list(range(8, 16))]


def test_accepts_and_rejects_exactly_as_megatron():
    """Every order of 1 to 5 distinct known tokens, for several size mixes: hpccomm accepts
    exactly the orders the oracle accepts, and then builds the same groups."""
    mixes = [
        {"tp": 2, "pp": 3},
        {"dp": 4, "cp": 2},
        {"tp": 2, "ep": 2, "dp": 2},
        {},
    ]
    checked = rejected = 0
    for sizes in mixes:
        full = {t: sizes.get(t, 1) for t in TOKENS}
        world = full["tp"] * full["pp"] * full["dp"] * full["cp"] * full["ep"]
        for k in range(1, 6):
            for tokens in itertools.permutations(TOKENS, k):
                order = "-".join(tokens)
                try:
                    m_order, m_sizes = oracle_rank_generator(
                        full["tp"], full["ep"], full["dp"], full["pp"], full["cp"], order
                    )
                except OracleRejects:
                    with pytest.raises(InvalidArgumentError, match=f"order '{order}' lacks"):
                        Layout(world, order=order, **full)
                    rejected += 1
                    continue
                lay = Layout(world, order=order, **full)
                assert "-".join(lay.order) == m_order
                for dims in ("tp", "pp", "dp", "cp", "ep", "tp-pp", "dp-cp", "tp-dp-cp"):
                    assert lay.groups(dims) == oracle_get_ranks(m_order, m_sizes, dims)
                checked += 1
    assert checked > 100 and rejected > 100


def test_order_may_leave_out_size_1_dims():
    assert Layout(8, order="tp-dp-pp").order == ("tp", "dp", "pp", "ep", "cp")
    lay = Layout(16, tp=4, pp=2, order="tp-pp-dp")  # dp derived (2), named
    assert lay.sizes == {"tp": 4, "pp": 2, "dp": 2, "ep": 1, "cp": 1}
    assert Layout.from_json(lay.to_json()) == lay
    assert Layout(16, tp=4, pp=2, dp=2, order="TP-PP-DP") == lay
    # DeviceMesh names that leave dims out are appended the same way
    assert Layout.from_mesh((2, 8, 4), ("pp", "dp", "tp")) == Layout(
        64, tp=4, dp=8, pp=2, order="tp-dp-pp"
    )


@pytest.mark.parametrize(
    ("world", "kwargs", "text"),
    [
        (
            16,
            {"tp": 4, "pp": 2, "dp": 2, "order": "tp-pp"},
            "layout: order 'tp-pp' lacks dp (size 2); only dimensions of size 1 may be left out"
            " (they are appended), so name it, e.g. order='tp-pp-dp'",
        ),
        (16, {"tp": 4, "pp": 2, "order": "tp-pp"}, "order 'tp-pp' lacks dp (size 2)"),  # derived
        (16, {"tp": 4, "cp": 2, "dp": 2, "order": "tp-dp"}, "order 'tp-dp' lacks cp (size 2)"),
        (16, {"tp": 4, "ep": 4, "order": "tp-dp-pp"}, "order 'tp-dp-pp' lacks ep (size 4)"),
        (
            32,
            {"tp": 2, "pp": 2, "dp": 4, "cp": 2, "order": "tp-dp"},
            "order 'tp-dp' lacks pp (size 2), cp (size 2); ",
        ),
        (8, {"pp": 8, "order": "TP-DP"}, "order 'TP-DP' lacks pp (size 8)"),  # as given
        (4, {"tp": 2, "dp": 2, "order": "tp-XX-dp"}, "unknown token(s) ['xx']"),
        (4, {"tp": 2, "dp": 2, "order": ""}, "layout: order is empty"),
        (4, {"tp": 2, "dp": 2, "order": "tp--dp"}, "unknown token(s) ['']"),
        # Megatron asserts ep == 1 or cp == 1 whatever the order; both must be named anyway
        (8, {"ep": 2, "cp": 2, "order": "ep-cp-tp-dp-pp"}, "ep=2 and cp=2 are both above 1"),
        # hpccomm is stricter than Megatron here: Megatron has no check for a repeated token
        (4, {"tp": 2, "dp": 2, "order": "tp-dp-dp"}, "repeats ['dp']"),
    ],
)
def test_order_rejections_name_order_dim_and_size(world, kwargs, text):
    with pytest.raises(InvalidArgumentError) as info:
        Layout(world, **kwargs)
    assert text in str(info.value)


def test_group_tokens_are_not_case_folded():
    # Megatron lower-cases the order but not the tokens given to get_ranks
    lay = Layout(16, tp=4, pp=2, dp=2, order="TP-PP-DP")
    with pytest.raises(InvalidArgumentError, match=r"dims 'TP' has unknown token\(s\) \['TP'\]"):
        lay.groups("TP")


@pytest.mark.parametrize(
    "call",
    [
        lambda: Layout(8, tp=3),
        lambda: Layout(8, tp=2, dp=3),
        lambda: Layout(8, tp=1.5),
        lambda: Layout(0),
        lambda: Layout.from_mesh((2, 4), ("tp",)),
        lambda: Layout.from_mesh((2, "4"), ("tp", "dp")),
        lambda: Layout.from_mesh((2, 4), ("tp", "tp")),
        lambda: Layout.from_json("{}"),
        lambda: Layout.from_json("not json"),
        lambda: Layout.from_json({"world_size": 2, "order": "tp", "sizes": {"xx": 2}}),
        lambda: Layout.from_json({"world_size": 2, "order": 3, "sizes": {}}),
        lambda: Layout.from_json({"world_size": 4, "order": "tp-dp", "sizes": {"cp": 4}}),
        lambda: L64.coords(64),
        lambda: L64.rank_of(tp=4),
        lambda: L64.rank_of(tp="1"),
        lambda: L64.rank_of(xx=0),
        lambda: L64.groups("tp-xx"),
        lambda: L64.group_of(0, "tp-tp"),
        lambda: L64.normalize(""),
        lambda: L64.expert(ep=3),
    ],
)
def test_every_error_is_invalid_argument(call):
    with pytest.raises(InvalidArgumentError, match=r"^layout(\.expert\(.*\))?: "):
        call()


@pytest.mark.parametrize("text", ["[1,2]", "null", '"x"', "5"])
def test_from_json_that_is_not_an_object_says_so(text):
    # it said "JSON lacks list indices must be integers or slices, not str"
    with pytest.raises(InvalidArgumentError, match=r"layout: JSON is \w+ .*, expected an object"):
        Layout.from_json(text)


def test_from_json_takes_bytes():
    lay = Layout(8, tp=2, pp=2)
    assert Layout.from_json(lay.to_json().encode()) == lay


def test_bools_are_not_sizes_or_ranks():
    # True == 1 for isinstance(int): Layout(4, tp=True) had repr tp=True
    with pytest.raises(InvalidArgumentError, match="tp is True"):
        Layout(4, tp=True)
    with pytest.raises(InvalidArgumentError, match="rank is True, expected an integer in 0..3"):
        Layout(4, tp=2).coords(True)
    with pytest.raises(InvalidArgumentError, match="tp is True, expected an integer in 0..1"):
        Layout(4, tp=2).rank_of(tp=True)


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda: Layout(8, order=None), "order=None (NoneType)"),
        (lambda: Layout(8, order=5), "order=5 (int)"),
        (lambda: Layout(8, order=b"tp-dp"), "order=b'tp-dp' (bytes)"),
        (lambda: Layout(8, order=["tp", 2]), "order=['tp', 2] (list)"),
        (lambda: L64.groups(None), "dims=None (NoneType)"),
    ],
)
def test_an_order_that_is_not_text_is_invalid_argument(call, text):
    # Layout(8, order=None) raised a raw TypeError ('NoneType' object is not iterable)
    with pytest.raises(InvalidArgumentError) as err:
        call()
    assert str(err.value) == (
        f"layout: {text}, expected a string of tokens of "
        f"{'-'.join(TOKENS) if text.startswith('order') else '-'.join(L64.order)} such as "
        f"'tp-dp', or a sequence of them"
    )


@pytest.mark.parametrize(
    "dense, ep, tp",
    [
        (dict(tp=2, pp=2, order="tp-dp-pp"), 1, 4),  # pp last as given: Megatron accepts
        (dict(tp=2, order="tp-dp-pp"), 2, None),  # ep not in the order given: refused
    ],
)
def test_expert_of_a_layout_read_back_from_json_is_the_layouts(dense, ep, tp):
    # to_json wrote only the full order (size-1 dimensions appended), which expert() took
    # for the order as given: the first case was refused after the round trip, the second
    # built expert groups with ep after pp, which Megatron refuses; and the two compared ==
    a = Layout(16 if "pp" in dense else 8, **dense)
    b = Layout.from_json(a.to_json())
    assert b == a and b.given_order == a.given_order and hash(b) == hash(a)

    def expert(lay):
        try:
            return lay.expert(ep=ep, tp=tp)
        except InvalidArgumentError as exc:
            return str(exc)

    assert expert(b) == expert(a)
    # == compares the groups: the full order given gives the same groups, another expert()
    full = Layout(a.world_size, **{**dense, "order": a.to_dict()["order"]})
    assert full == a and hash(full) == hash(a) and full.groups_json() == a.groups_json()
    assert expert(full) != expert(a)


def test_from_json_with_an_order_that_leaves_dimensions_out_is_the_constructors():
    # an order naming some dimensions kept only those (no pp group; a false MismatchError
    # against a rank that built the same layout directly)
    doc = {"world_size": 8, "order": "tp-dp", "sizes": {"tp": 2, "dp": 4}}
    lay = Layout.from_json(doc)
    assert (
        lay == Layout(8, tp=2, dp=4, order="tp-dp")
        and lay.to_json() == Layout(8, tp=2, dp=4, order="tp-dp").to_json()
    )
    assert lay.groups("pp") == [[r] for r in range(8)]


def test_from_json_refuses_orders_that_disagree():
    doc = {"world_size": 8, "order": "tp-dp-pp-ep-cp", "order_given": "dp-tp", "sizes": {"tp": 2}}
    with pytest.raises(InvalidArgumentError, match=r"order 'tp-dp-pp-ep-cp' but order_given "
                       r"'dp-tp', which gives 'dp-tp-pp-ep-cp'; expected orders that agree"):  # fmt: skip
        Layout.from_json(doc)


def test_an_order_given_as_a_sequence_is_case_insensitive_too():
    assert Layout(8, tp=2, order=["TP", "dp"]) == Layout(8, tp=2, order="tp-dp")


def test_expert_refusals_say_it_is_the_expert_layout():
    with pytest.raises(InvalidArgumentError, match=r"^layout.expert\(ep=3, tp=2\) \(the expert "
                       r"layout: tp is the expert tensor parallel size.*world 8 is not "
                       r"divisible by tp\*pp\*cp\*ep = 2\*1\*1\*3 = 6"):  # fmt: skip
        Layout(8, tp=2).expert(ep=3)
    with pytest.raises(InvalidArgumentError, match=r"^layout.expert\(ep=2, tp=2\) .*order "
                       r"'tp-dp-pp' lacks ep \(size 2\)"):  # fmt: skip
        Layout(8, tp=2, order="tp-dp-pp").expert(ep=2)


def test_mesh_names_as_one_string():
    # "tp-dp" was read as its characters ("2 dims but 5 names")
    assert Layout.from_mesh((2, 4), "tp-dp") == Layout.from_mesh((2, 4), ("tp", "dp"))


def test_layouts_that_differ_only_where_size_one_dimensions_sit_are_equal():
    # "tp-dp-pp" (full order tp-dp-pp-ep-cp) and the default tp-cp-ep-dp-pp give the same
    # groups: they were unequal, and ranks building them got a false MismatchError
    a, b = Layout(8, tp=2, order="tp-dp-pp"), Layout(8, tp=2)
    assert a == b and hash(a) == hash(b) and a.groups_json() == b.groups_json()
    assert all(a.groups(d) == b.groups(d) for d in ("tp", "dp", "pp", "cp", "ep", "tp-dp"))
    assert Layout(8, tp=2, dp=4, order="dp-tp") != Layout(8, tp=2, dp=4, order="tp-dp")


def test_a_tp_group_across_nodes_is_named_where_a_node_could_hold_it():
    # Round-robin placement (srun --distribution=cyclic, mpirun --map-by node) puts ranks
    # 0 and 1 on two nodes: a tp=2 group then crosses the network every layer, silently
    from hpccomm.parallel import placement_note

    note = placement_note("world", [0, 1], nodes=2, per_node=2)
    assert note.startswith(
        "hpccomm: layout group tp on world (rank 0's: ranks [0, 1]) spans 2 nodes, though "
        "rank 0's node holds 2 ranks of world"
    ), note
    assert "srun --distribution=cyclic" in note
    assert placement_note("world", [0, 1], nodes=1, per_node=2) == ""  # inside a node
    assert placement_note("world", [0, 1, 2, 3], nodes=2, per_node=2) == ""  # cannot fit
    assert placement_note("world", [0, 2], nodes=2, per_node=2) == ""  # strided by order=
    assert "layout group expert-tp on world" in placement_note("world", [0, 1], 2, 2, "expert-tp")


@pytest.mark.parametrize("np_int", ["int64", "int32", "uint8"])
def test_numpy_integers_are_taken_as_the_communicator_takes_them(np_int):
    # They were refused with self-contradicting messages: "tp is np.int64(2), expected an
    # integer >= 1", "rank np.int64(3) is not in 0..7"
    np = pytest.importorskip("numpy")
    n = getattr(np, np_int)
    layout = Layout(n(8), tp=n(2), pp=n(1), dp=n(4), cp=n(1), ep=n(1))
    assert layout == Layout(8, tp=2, dp=4)
    assert all(type(s) is int for s in layout.sizes.values()) and type(layout.world_size) is int
    assert json.loads(layout.to_json())["sizes"]["tp"] == 2  # (np.int64 is not JSON)
    assert layout.coords(n(3)) == Layout(8, tp=2).coords(3)
    assert all(type(i) is int for i in layout.coords(n(3)).values())
    assert layout.rank_of(tp=n(1), dp=n(1)) == 3 and type(layout.rank_of(tp=n(1))) is int
    assert layout.group_of(n(3), "dp") == [1, 3, 5, 7]
    assert layout.expert(ep=n(2)) == Layout(8, tp=2).expert(ep=2)
    assert Layout.from_mesh((n(4), n(2)), ("dp", "tp")) == layout


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda: Layout(8, tp=True), "tp is True, expected an integer >= 1"),
        (lambda: Layout(True, tp=1), "world is True, expected an integer >= 1"),
        (lambda: Layout(8, tp=2).coords(True), "rank is True, expected an integer in 0..7"),
        (lambda: Layout(8, tp=2).rank_of(tp=True), "tp is True, expected an integer in 0..1"),
        (lambda: Layout.from_mesh((True, 8), ("dp", "tp")), "has [True], expected integers"),
        (lambda: Layout(8, tp=2.0), "tp is 2.0, expected an integer >= 1"),
    ],
)
def test_bools_and_floats_are_still_refused(call, text):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert text in str(info.value)


def test_numpy_bools_and_out_of_range_numpy_integers_are_refused():
    np = pytest.importorskip("numpy")
    with pytest.raises(InvalidArgumentError, match=r"tp is np.True_, expected an integer >= 1"):
        Layout(8, tp=np.True_)
    with pytest.raises(InvalidArgumentError, match=r"tp is np.int64\(0\), expected an integer"):
        Layout(8, tp=np.int64(0))
    with pytest.raises(InvalidArgumentError, match=r"rank np.int64\(8\) is not in 0..7"):
        Layout(8, tp=2).coords(np.int64(8))
    with pytest.raises(InvalidArgumentError, match=r"rank np.int64\(-1\) is not in 0..7"):
        Layout(8, tp=2).group_of(np.int64(-1), "tp")
