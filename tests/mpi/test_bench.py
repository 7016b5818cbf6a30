"""hpccomm bench in a real job (any world size), in-process: every op checks clean, -c catches
a corrupted result, the JSON document's schema, per-group rows with --group, and the raw
mpi4py and gloo peers measured in the same rounds."""

import importlib.util
import json

import numpy as np
import pytest

from hpccomm import bench
from hpccomm.cli import main


def small(**kw):
    base = dict(min_bytes=8, max_bytes=4096, factor=8, rounds=2, warmup=1, iters=3)
    return bench.BenchOptions(**{**base, **kw})


def rows(doc):
    return [r for g in doc["groups"] for r in g["rows"]]


def test_every_op_checks_clean(world):
    doc = bench.run(world, small(ops=["all"], dtype="int32"))
    doc = world.mpi.bcast(doc, root=0)
    ops = {r["op"] for r in rows(doc)}
    expect = set(bench.FACTORS) - ({"send_recv"} if world.size < 2 else set())
    assert ops == expect
    assert all(r["wrong"] == 0 for r in rows(doc)), [r for r in rows(doc) if r["wrong"]]
    for r in rows(doc):
        assert r["time_us"] > 0
        algbw, busbw = bench.bandwidths(r["op"], r["bytes"], r["time_us"] / 1e6, world.size)
        assert (r["algbw"], r["busbw"]) == pytest.approx((algbw, busbw))
        # nccl-tests' count column: the per-rank count where S is n blocks (its paramcount)
        blocks = world.size if r["op"] in BLOCKED else 1
        assert r["count"] * 4 * blocks == r["bytes"], r


BLOCKED = ("all_gather", "gather", "reduce_scatter", "all_to_all", "scatter")


@pytest.mark.parametrize("warmup", [0, 2])
def test_warmup_calls_are_what_w_says(world, monkeypatch, warmup):
    # -w 0 made one warm-up call all the same
    calls = []
    real = bench.HPCCOMM["all_reduce"]

    def counting(c, k):
        call = real(c, k)

        def run():
            calls.append(1)
            call()

        return run

    monkeypatch.setitem(bench.HPCCOMM, "all_reduce", counting)
    doc = bench.run(world, small(max_bytes=8, warmup=warmup, iters=3, rounds=2))
    assert len(calls) == warmup + 2 * 3 + 1  # warm-up, 2 rounds of 3, the -c call
    doc = world.mpi.bcast(doc, root=0)
    assert doc["options"]["warmup"] == warmup and doc["notes"] == []
    assert f"-w {warmup}, -c 1" in bench.format_table(doc)


def test_warmup_0_with_a_peer_says_the_peer_makes_one_call(world):
    doc = world.mpi.bcast(bench.run(world, small(max_bytes=8, warmup=0, peers=["mpi4py"])))
    assert doc["notes"] == [bench._PEER_WARMUP]
    table = bench.format_table(doc)
    assert "-w 0 (peers 1), -c 1" in table and f"# note: {bench._PEER_WARMUP}" in table
    assert "time_us" in rows(doc)[0]["peers"]["mpi4py"]


def test_root_is_ignored_by_ops_without_one(world):
    # -o all_reduce --root 3 at 2 ranks failed: "expected a rank of the group (0..1)"
    ops = ["all_reduce,all_gather,reduce_scatter,all_to_all"]
    doc = world.mpi.bcast(bench.run(world, small(ops=ops, max_bytes=64, root=world.size)))
    assert {r["root"] for r in rows(doc)} == {None}
    assert all(r["wrong"] == 0 for r in rows(doc))
    with pytest.raises(ValueError, match=rf"--root {world.size} for broadcast, expected a rank"):
        bench.run(world, small(ops=["broadcast"], max_bytes=64, root=world.size))


def test_a_bad_root_is_refused_before_any_op_runs(world, monkeypatch):
    # it was said after the earlier ops' whole sweep had run, their results lost
    ran = []
    monkeypatch.setattr(bench, "_measure", lambda *a, **k: ran.append(a[0].op))
    with pytest.raises(ValueError, match=rf"--root {world.size} for broadcast, expected a rank"):
        bench.run(world, small(ops=["all_reduce,broadcast"], max_bytes=64, root=world.size))
    assert ran == []


def test_buffers_that_do_not_fit_are_said_on_every_rank(world, monkeypatch):
    # a size past the machine's memory was a NumPy traceback on every rank; where one rank
    # alone ran short, the others would have waited for it in the first call
    real = bench.Case

    def short(op, size, *a, **k):
        if world.rank == world.size - 1 and size >= 1024:
            raise MemoryError("Unable to allocate")
        return real(op, size, *a, **k)

    monkeypatch.setattr(bench, "Case", short)
    with pytest.raises(ValueError) as info:
        bench.run(world, small(ops=["all_reduce"], min_bytes=8, max_bytes=4096))
    msg = str(info.value)
    assert "bench: all_reduce at 4 KiB: the buffers do not fit in memory on rank(s) " in msg, msg
    assert f"[{world.size - 1}] of the group (MemoryError: Unable to allocate); lower -e" in msg


@pytest.mark.mpi(min_size=2)
def test_check_catches_a_corrupted_result(world, monkeypatch):
    real = bench.HPCCOMM["all_reduce"]

    def corrupting(c, k):
        call = real(c, k)

        def run():
            call()
            if c.rank == 1:
                k.x[0] += 1  # one wrong element on rank 1

        return run

    monkeypatch.setitem(bench.HPCCOMM, "all_reduce", corrupting)
    doc = world.mpi.bcast(bench.run(world, small(max_bytes=64)), root=0)
    assert [r["wrong"] for r in rows(doc)] == [1, 1]
    assert "Out of bounds values : 2 FAILED" in bench.format_table(doc)


def test_json_schema_and_cli(world, tmp_path_factory, capsys):
    path = world.mpi.bcast(
        str(tmp_path_factory.mktemp("bench") / "b.json") if world.rank == 0 else None
    )
    argv = ["bench", "-b", "8", "-e", "1K", "-f", "4", "-n", "3", "-w", "1", "--rounds", "2"]
    assert main([*argv, "--json", path, "-q"]) == 0
    out = capsys.readouterr().out
    if world.rank != 0:
        assert out == ""
        return
    assert "# Avg bus bandwidth" in out
    doc = json.load(open(path))
    assert doc["schema"] == "hpccomm.bench/1" and doc["ranks"] == world.size
    assert {"mpi", "options", "groups", "average", "notes", "hosts"} <= set(doc)
    (g,) = doc["groups"]
    assert g["members"] == list(range(world.size))
    assert [r["bytes"] for r in g["rows"]] == [8, 32, 128, 512]
    for r in g["rows"]:
        assert {"op", "bytes", "count", "dtype", "redop", "root", "iters", "time_us", "algbw",
                "busbw", "wrong", "rounds_us", "peers"} <= set(r)  # fmt: skip
        assert len(r["rounds_us"]) == 2 and r["iters"] == 3


@pytest.mark.mpi(min_size=2)
def test_group_runs_every_group_at_once(world):
    if world.size % 2:
        pytest.skip("--group tp=2 needs an even world size")
    doc = world.mpi.bcast(bench.run(world, small(group="tp=2", max_bytes=64)), root=0)
    assert [g["members"] for g in doc["groups"]] == [[i, i + 1] for i in range(0, world.size, 2)]
    assert [g["name"] for g in doc["groups"]][0] == "tp [0, 1]"
    for g in doc["groups"]:
        assert [r["wrong"] for r in g["rows"]] == [0, 0]


@pytest.mark.mpi(min_size=2)
def test_peers_side_by_side(world):
    peers = ["mpi4py"]
    if getattr(importlib.util.find_spec("torch"), "origin", None) is not None:
        peers += ["gloo", "torch"]  # torch: hpccomm's own torch.distributed backend (send_recv
        # too: its irecv on a new_group group works, once left out as failing)
    doc = bench.run(world, small(ops=["all_reduce,broadcast,send_recv"], peers=peers))
    doc = world.mpi.bcast(doc, root=0)
    for r in rows(doc):
        for p in peers:
            q = r["peers"][p]
            assert q["time_us"] > 0 and q["ratio"] == pytest.approx(q["time_us"] / r["time_us"])
    table = bench.format_table(doc)
    assert all(f"{p} time" in table for p in peers)


@pytest.mark.mpi(min_size=2)
def test_a_peer_without_the_op_is_named_not_fatal(world):
    # raw MPI has no bfloat16 reduction: the mpi4py column says so, hpccomm still runs
    doc = world.mpi.bcast(bench.run(world, small(dtype="bfloat16", peers=["mpi4py"])), root=0)
    r = rows(doc)[0]
    assert r["peers"]["mpi4py"] == {"error": "HpccommError: raw MPI has no bfloat16 reduction"}
    assert r["wrong"] == 0
    assert np.isfinite(r["time_us"])


def test_device_without_cupy_or_gpu_skips_saying_why(world, capsys):
    if importlib.util.find_spec("cupy") is not None and world.device.gpu is not None:
        pytest.skip("CuPy and a GPU are here: --device runs (tests/gpu)")
    doc = bench.run(world, small(device=True))
    if world.rank == 0:
        assert doc["skipped"].startswith("--device: rank 0: ")
        assert "skipped" in bench.format_table(doc)
    else:
        assert doc is None


def test_several_operations_get_an_average_each(world, capsys):
    # one "Avg bus bandwidth" line averaged all_reduce and broadcast rows together (a figure
    # of neither); nccl-tests' line is one operation's, as each of these is
    argv = ["bench", "-o", "all_reduce,broadcast", "-b", "8", "-e", "64", "-f", "8", "-n", "2"]
    assert main([*argv, "-w", "0", "--rounds", "1", "-q"]) == 0
    out = capsys.readouterr().out
    if world.rank != 0:
        return
    lines = [line for line in out.splitlines() if "Avg bus bandwidth" in line]
    assert [line.split(":")[0] for line in lines] == [
        "# Avg bus bandwidth (all_reduce)",
        "# Avg bus bandwidth (broadcast)",
        "# Avg bus bandwidth (all operations)",
    ]
