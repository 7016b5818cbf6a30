"""Slurm hostlist expand/compress: the whole syntax, the malformed inputs, round trips."""

import pytest

from hpccomm.hostlist import MAX_RANGE, compress, expand, expand_tasks_per_node

EXPAND_CASES = [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[001-003]", ["node001", "node002", "node003"]),
    ("node[001-004,007]", ["node001", "node002", "node003", "node004", "node007"]),
    ("linux[0000-0002]", ["linux0000", "linux0001", "linux0002"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("n[09-11]", ["n09", "n10", "n11"]),
    ("n[98-101]", ["n98", "n99", "n100", "n101"]),
    ("a,b,c", ["a", "b", "c"]),
    ("a b\tc\nd", ["a", "b", "c", "d"]),
    ("a,,b", ["a", "b"]),
    ("  a , b  ", ["a", "b"]),
    ("", []),
    ("node[1,3,5]", ["node1", "node3", "node5"]),
    ("node[5,1,3]", ["node5", "node1", "node3"]),
    ("node[1-2],node[1-2]", ["node1", "node2", "node1", "node2"]),
    ("node[1,1]", ["node1", "node1"]),
    ("rack[0-1]_blade[0-1]", ["rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"]),
    ("r[1-2]c[1-2]n[1-2]", [f"r{a}c{b}n{c}" for a in (1, 2) for b in (1, 2) for c in (1, 2)]),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
    ("gpu[1-2]-ib,cpu3", ["gpu1-ib", "gpu2-ib", "cpu3"]),
    ("ml-16-node-[001-002,004]", ["ml-16-node-001", "ml-16-node-002", "ml-16-node-004"]),
    ("login", ["login"]),
    ("login,compute", ["login", "compute"]),
    ("[1-3]", ["1", "2", "3"]),
    ("x[7]", ["x7"]),
    ("x[0-0]", ["x0"]),
    ("node[1-2],gpu[01-02]", ["node1", "node2", "gpu01", "gpu02"]),
    ("node[1-3,5-6]", ["node1", "node2", "node3", "node5", "node6"]),
    ("pre[1-2]mid[3]post", ["pre1mid3post", "pre2mid3post"]),
    ("node-1.cluster", ["node-1.cluster"]),
]


@pytest.mark.parametrize(("expr", "names"), EXPAND_CASES)
def test_expand(expr, names):
    assert expand(expr) == names


BAD = [
    ("node[3-1]", "lo 3 > hi 1", 5),
    ("node[1-2", "'[' without ']'", 4),
    ("node1-2]", "']' without '['", 7),
    ("node[1-[2]]", "nested '['", 7),
    ("node[]", "empty range", 5),
    ("node[1,]", "empty range", 7),
    ("node[,1]", "empty range", 5),
    ("node[-1]", "negative number", 5),
    ("node[1--2]", "bad range", 5),
    ("node[a-b]", "bad range", 5),
    ("a,b]c", "']' without '['", 3),
    ("x[1-2]y[", "'[' without ']'", 7),
    # more names than Slurm's MAX_RANGE (64 * 1024): expanded without a limit, n[0-3000000]
    # took 12 s and 490 MB, a[0-300]b[0-300]c[0-300] 2.1 GB
    ("n[0-3000000]", "range '0-3000000' has 3000001 names, more than the limit of 65536", 2),
    ("n[0-65536]", "range '0-65536' has 65537 names, more than the limit of 65536", 2),
    ("n[0-40000,0-40000]", "brackets [0-40000,0-40000] hold at least 80002 names", 10),
    (
        "a[0-300]b[0-300]c[0-300]",
        "name 'a[0-300]b[0-300]c[0-300]' expands to 27270901 names (301 x 301 x 301), more "
        "than the limit of 65536",
        0,
    ),
    (
        "x,n[0-40000],m[0-40000]",
        "the expression expands to more than the limit of 65536 names (40002 before this "
        "name, 40001 in 'm[0-40000]')",
        13,
    ),
]


@pytest.mark.parametrize(("expr", "what", "pos"), BAD)
def test_expand_rejects(expr, what, pos):
    with pytest.raises(ValueError) as info:
        expand(expr)
    msg = str(info.value)
    assert f"hostlist {expr!r}" in msg
    assert what in msg
    assert f"position {pos}" in msg


COMPRESS_CASES = [
    (["node1", "node2"], "node[1-2]"),
    (["node1"], "node1"),
    (["node001", "node002", "node003", "node007"], "node[001-003,007]"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["n1", "n2", "n4"], "n[1-2,4]"),
    (["a", "b"], "a,b"),
    (["ml-16-node-001", "ml-16-node-002", "ml-16-node-004"], "ml-16-node-[001-002,004]"),
    (["node2", "node1"], "node[2,1]"),
    (["node1", "node1"], "node[1,1]"),
    (["node1", "gpu1", "node2"], "node1,gpu1,node2"),
    ([], ""),
]


@pytest.mark.parametrize(("names", "expr"), COMPRESS_CASES)
def test_compress(names, expr):
    assert compress(names) == expr


ROUND_TRIPS = [
    "node[001-004,007]",
    "rack[0-1]_blade[0-1]",
    "gpu[1-2]-ib,login,n[9-11]",
    "node[1-2],node[1-2]",
    "n[09-12],n[8-9]",
    "a1b2,a1b3,x",
    "node[1,3,2]",
    "[1-3]",
]


@pytest.mark.parametrize("expr", ROUND_TRIPS)
def test_round_trip(expr):
    names = expand(expr)
    assert expand(compress(names)) == names


def test_round_trip_many_shapes():
    import random

    rng = random.Random(7)
    for _ in range(200):
        names = [
            f"{rng.choice(['n', 'gpu-', 'rack1_b'])}{str(rng.randrange(0, 120)).zfill(rng.choice([1, 3]))}"
            for _ in range(rng.randrange(1, 12))
        ]
        assert expand(compress(names)) == names


def test_compress_rejects_unwritable_names():
    with pytest.raises(ValueError, match="cannot be written"):
        compress(["a,b"])
    with pytest.raises(ValueError, match="cannot be written"):
        compress([""])


@pytest.mark.parametrize(
    ("spec", "counts"),
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("3,2(x2),1", [3, 2, 2, 1]),
        ("4", [4]),
        ("1(x2)", [1, 1]),
        ("3,2", [3, 2]),
    ],
)
def test_tasks_per_node(spec, counts):
    assert expand_tasks_per_node(spec) == counts


def test_tasks_per_node_rejects():
    with pytest.raises(ValueError, match=r"tasks-per-node '2\(3\)'"):
        expand_tasks_per_node("2(3)")


def test_other_scripts_digits_and_zero_repeats_are_refused():
    # str.isdigit took "n[1-\u0663]" (Arabic-Indic 3) as n1..n3; "2(x0)" repeated nothing
    with pytest.raises(ValueError, match="bad range"):
        expand("n[1-\u0663]")
    with pytest.raises(ValueError, match="bad item '2\\(x0\\)'"):
        expand_tasks_per_node("2(x0)")


def test_a_tasks_per_node_list_longer_than_slurm_allows_is_refused_unexpanded():
    # "1(x100000000)" took 1.6 GB and 10 s to expand (x999999999: more than 10 GB)
    assert len(expand_tasks_per_node(f"2,1(x{MAX_RANGE - 1})")) == MAX_RANGE
    for spec in ("1(x100000000)", "1(x999999999)", f"2,1(x{MAX_RANGE})"):
        with pytest.raises(ValueError, match=f"longer than the limit of {MAX_RANGE} nodes"):
            expand_tasks_per_node(spec)


def test_the_largest_range_slurm_takes_expands():
    names = expand("n[00000-65535]")
    assert len(names) == MAX_RANGE == 65536 and names[-1] == "n65535"
