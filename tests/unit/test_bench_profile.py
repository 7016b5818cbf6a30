"""hpccomm bench and the profiler without MPI: the busbw arithmetic against nccl-tests'
formulas, sizes and options, the -c check's arithmetic, the table, JSON and plot of a result
document, and the profiler's analysis, summary and Chrome trace of recorded rank data (the
CLI in-process)."""

import json

import numpy as np
import pytest

from hpccomm import bench, profiler
from hpccomm.cli import main
from hpccomm.dtypes import ReduceOp
from hpccomm.errors import DtypeError

# nccl-tests doc/PERFORMANCE.md, written out again here: busbw = algbw * factor, algbw = S/t.
NCCL_TESTS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1,
    "reduce": lambda n: 1,
    "gather": lambda n: (n - 1) / n,  # src/gather.cu GatherGetBw
    "scatter": lambda n: (n - 1) / n,  # src/scatter.cu ScatterGetBw
    "send_recv": lambda n: 1,  # src/sendrecv.cu SendRecvGetBw
}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 64])
@pytest.mark.parametrize("op", sorted(NCCL_TESTS))
def test_busbw_matches_nccl_tests(op, n):
    size, seconds = 64 << 20, 0.0125
    algbw, busbw = bench.bandwidths(op, size, seconds, n)
    assert algbw == pytest.approx(size / seconds / 1e9)
    assert busbw == pytest.approx(size / seconds / 1e9 * NCCL_TESTS[op](n))
    assert set(bench.FACTORS) == set(NCCL_TESTS)


def test_all_reduce_busbw_example():
    # 1 GB all_reduce in 0.1 s on 8 ranks: algbw 10 GB/s, busbw 10 * 2*7/8 = 17.5 GB/s
    assert bench.bandwidths("all_reduce", 10**9, 0.1, 8) == pytest.approx((10.0, 17.5))


@pytest.mark.parametrize(
    "op, size, n, block, total",
    [
        ("all_reduce", 1024, 4, 256, 256),  # S = the buffer
        ("all_gather", 1024, 4, 64, 256),  # S = the gathered output, blocks of S/n
        ("reduce_scatter", 1024, 4, 64, 256),
        ("all_to_all", 1024, 4, 64, 256),
        ("scatter", 1024, 4, 64, 256),
        ("gather", 1024, 4, 64, 256),
        ("broadcast", 8, 4, 2, 2),
        ("all_gather", 8, 4, 1, 4),  # at least one element per rank: S = 16 B
        ("all_gather", 32760, 3, 2730, 8190),  # the review's row: nccl-tests prints 2730
    ],
)
def test_case_sizes_follow_nccl_tests(op, size, n, block, total):
    # nccl-tests' count column is nbytes / wordSize with nbytes = paramcount * wordSize
    # (src/common.cu); paramcount is count/nranks for all_gather, reduce_scatter, alltoall,
    # gather and scatter (their *GetCollByteCount), the whole count for the others.
    k = bench.Case(op, size, np.dtype(np.float32), n, 0, 0, ReduceOp.SUM)
    assert (k.block, k.total, k.nbytes) == (block, total, total * 4)
    assert k.count == block  # the count column: per rank where S is n blocks


def test_sizes_and_parsing():
    assert bench.parse_size("64M") == 64 << 20
    assert bench.parse_size("8") == 8
    assert bench.parse_size("1G") == 1 << 30
    assert bench.size_series(8, 64 << 20, 2)[-1] == 64 << 20
    assert len(bench.size_series(8, 64 << 20, 2)) == 24
    assert bench.size_series(8, 100, 4) == [8, 32]
    with pytest.raises(ValueError, match="not a byte count"):
        bench.parse_size("lots")
    for text in ("infK", "nanM"):  # infK was an OverflowError traceback
        with pytest.raises(ValueError, match="not a byte count"):
            bench.parse_size(text)
    with pytest.raises(ValueError, match=r"expected at most 1,099,511,627,776 \(1 TiB\)"):
        bench.parse_size("1e30G")  # ran, doubling the size, until killed
    assert bench.parse_size("1024G") == 1 << 40


def test_an_op_undefined_for_the_dtype_is_refused_before_mpi():
    # refused only after MPI had started (and only by the first reducing operation)
    with pytest.raises(DtypeError, match=r"op AVG is not defined for dtype int32"):
        bench.BenchOptions(ops=["all_gather", "reduce"], dtype="int32", redop="avg").normalized()
    bench.BenchOptions(ops=["all_gather"], dtype="int32", redop="avg").normalized()  # no reduction
    with pytest.raises(ValueError, match="expected an integer >= 2"):
        bench.size_series(8, 64, 1)


def test_group_spec():
    layout, dim = bench.parse_group("tp=2", 8)
    assert dim == "tp" and layout.groups("tp")[1] == [2, 3]
    layout, dim = bench.parse_group("tp=2,pp=2:pp", 8)
    assert dim == "pp" and layout.groups("pp")[0] == [0, 4]
    with pytest.raises(ValueError, match="is not DIM=SIZE"):
        bench.parse_group("tp", 8)
    with pytest.raises(ValueError, match="world 6 is not divisible"):
        bench.parse_group("tp=4", 6)


def test_options_are_checked_with_aliases():
    o = bench.BenchOptions(ops=["allreduce,sendrecv", "gather"], dtype="half", peers=["gloo"])
    o = o.normalized()
    assert (o.ops, o.dtype, o.peers) == (["all_reduce", "send_recv", "gather"], "float16", ["gloo"])
    assert bench.BenchOptions(ops=["all"]).normalized().ops == list(bench.FACTORS)
    with pytest.raises(ValueError, match="unknown operation 'allsum'"):
        bench.BenchOptions(ops=["allsum"]).normalized()
    with pytest.raises(ValueError, match="-d 'float128', expected one of"):
        bench.BenchOptions(dtype="float128").normalized()
    with pytest.raises(ValueError, match="--peer 'nccl', expected one of mpi4py, gloo, torch"):
        bench.BenchOptions(peers=["nccl"]).normalized()
    # "-o ''" or "-o ,": a table of nothing with status 0 before (an outside hunt)
    for empty in ([""], [","], [" , "]):
        with pytest.raises(ValueError, match=r"bench: -o .*: no operation given, expected one"):
            bench.BenchOptions(ops=empty).normalized()


def test_the_header_says_what_minus_a_takes():
    # "-a 0" read "time = rank 0 over ranks of the mean of n calls" (an outside hunt)
    doc = _doc()
    assert "time = average over ranks of the mean of n calls" in bench.format_table(doc)
    doc["average"] = "rank 0"
    assert "time = rank 0's (the group's rank 0 with --group) of the mean of n calls" in (
        bench.format_table(doc)
    )


@pytest.mark.parametrize("op", sorted(NCCL_TESTS))
@pytest.mark.parametrize("redop", ["SUM", "PRODUCT", "MAX"])
def test_check_counts_wrong_elements(op, redop):
    # The result each rank would get, written by hand from the check data: 0 wrong; one
    # element changed: 1 wrong.
    n, me = 4, 1
    k = bench.Case(op, 256, np.dtype(np.int32), n, me, 0, ReduceOp(redop))
    if op == "send_recv":
        k.partner = 0
    k.fill()
    exp = k.expected()
    if exp is None:
        assert k.wrong() == 0
        return
    target, values = exp
    target[...] = values
    assert k.wrong() == 0
    target[3] += 1
    assert k.wrong() == 1


def _doc(peers=("mpi4py", "gloo")):
    rows = []
    for i, size in enumerate([8, 1024, 1 << 20]):
        t = 5.0 + size / 1e3
        row = {"op": "all_reduce", "bytes": size, "count": size // 4, "dtype": "float32",
               "redop": "sum", "root": None, "iters": 10, "wrong": 0, "time_us": t,
               "algbw": size / t / 1e3, "busbw": size / t / 1e3, "rounds_us": [t] * 3,
               "peers": {p: {"time_us": t * 2, "algbw": 1.0, "busbw": size / t / 2e3,
                             "ratio": 2.0, "rounds_us": [t * 2] * 3} for p in peers}}  # fmt: skip
        if i == 0 and "gloo" in peers:
            row["peers"]["gloo"] = {"error": "RuntimeError: not supported"}
        rows.append(row)
    opts = {**vars(bench.BenchOptions(peers=list(peers)).normalized())}
    opts.pop("progress")
    return {"schema": bench.SCHEMA, "ranks": 2, "mpi": "Open MPI v5", "options": opts,
            "average": "average", "hosts": ["vm"],
            "groups": [{"name": "world", "members": [0, 1], "rows": rows,
                        "avg_busbw": {"hpccomm": 1.0, "mpi4py": 0.5, "gloo": 0.25}}],
            "notes": []}  # fmt: skip


def test_table_has_nccl_tests_columns_and_peers():
    text = bench.format_table(_doc())
    assert "#wrong" in text and "busbw" in text and "mpi4py time" in text and "gloo time" in text
    assert "# Avg bus bandwidth    : 1.000 GB/s (hpccomm); 0.500 GB/s (mpi4py)" in text
    assert "# not measured: gloo: RuntimeError: not supported" in text
    assert len([line for line in text.splitlines() if not line.startswith("#")]) == 3


def test_table_rows_keep_their_columns_for_every_redop():
    # "product" (7 characters) in the 6-wide redop column shifted the rest of its row
    widths = set()
    for redop in ("sum", "product", "min", "max", "avg"):
        doc = _doc()
        for row in doc["groups"][0]["rows"]:
            row["redop"] = redop
        rows = [ln for ln in bench.format_table(doc).splitlines() if not ln.startswith("#")]
        widths |= {ln.index("|") for ln in rows}
        if redop == "product":
            assert all(" prod " in ln for ln in rows), rows
    assert len(widths) == 1, widths


def test_json_round_trip(tmp_path):
    path = tmp_path / "b.json"
    bench.write_json(_doc(), path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == "hpccomm.bench/1"
    assert doc["groups"][0]["rows"][2]["peers"]["mpi4py"]["ratio"] == 2.0


def test_plot_file_opens(tmp_path):
    pytest.importorskip("matplotlib", reason="the 'plot' extra (matplotlib) is not installed")
    from PIL import Image

    path = tmp_path / "b.png"
    bench.plot(_doc(), path)
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] > 600


def test_plot_without_matplotlib_says_how(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    assert main(["bench", "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'hpccomm[plot]'" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_refuses_an_unwritable_output_before_mpi(monkeypatch, tmp_path, capsys, flag):
    # --json into a folder that does not exist failed only after the whole sweep
    import hpccomm.cli as cli

    def no_mpi():
        raise AssertionError("MPI started before the output path was checked")

    monkeypatch.setattr(cli, "init", no_mpi)
    monkeypatch.setattr(bench, "check_plot_available", lambda: None)
    monkeypatch.setattr(bench, "check_plot_format", lambda path: None)
    missing = tmp_path / "nonexistent" / "x.out"
    assert main(["bench", flag, str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"hpccomm: bench {flag}: cannot write {missing}: no directory {missing.parent}\n"
    ), err
    assert main(["bench", flag, str(tmp_path)]) == 2
    assert f"bench {flag}: cannot write {tmp_path}: it is a directory" in capsys.readouterr().err


def test_bench_cli_refuses_bad_flags_before_mpi(capsys):
    assert main(["bench", "-o", "allsum"]) == 2
    assert "unknown operation 'allsum'" in capsys.readouterr().err
    assert main(["bench", "--peer", "mpich"]) == 2
    assert "--peer 'mpich', expected one of mpi4py, gloo, torch" in capsys.readouterr().err


# -- the profiler's analysis of recorded rank data ---------------------------------------------


def _raw(rank, offset, late_rank, n=3, calls=5, wait=0.01):
    """What a rank sends at stop: its clock runs ``offset`` s ahead of rank 0's; at every
    all_reduce ``late_rank`` enters ``wait`` s after the others."""
    events = []
    t = 100.0
    for seq in range(1, calls + 1):
        start = t + (wait if rank == late_rank else 0.0)
        end = t + wait + 0.001
        events.append([0, "all_reduce", seq, start + offset, end + offset, 4096, False, False])
        t += 0.1
    events.append([1, "all_gather", 1, t + offset, t + offset + 0.002, 80, False, False])
    g = [{"gid": "world", "name": "world", "members": list(range(n)), "rank": rank, "size": n},
         {"gid": "world/3", "name": "world/tp", "members": [0, 1] if rank < 2 else [2],
          "rank": rank % 2, "size": 2 if rank < 2 else 1}]  # fmt: skip
    return {
        "rank": rank, "host": "node1" if rank < 2 else "node2", "pid": 1,
        "t_start": 99.0 + offset, "t_stop": 101.0 + offset, "groups": g,
        "stats": [[0, "all_reduce", calls, calls * 4096, calls * (wait + 0.001), 1.0, 0],
                  [1, "all_gather", 1, 80, 0.002, 80.0, 0]],
        "events": events, "dropped": 0,
        "clock": {"start": [offset, 4e-6], "stop": [offset, 5e-6]},
    }  # fmt: skip


def test_analysis_names_the_straggler_across_clock_offsets():
    raws = [_raw(r, off, late_rank=2) for r, off in enumerate([0.0, 3.5, -120.0])]
    doc = profiler.analyze(raws)
    world = next(g for g in doc["groups"] if g["group"] == "world")
    top = world["stragglers"][0]
    assert (top["rank"], top["last"], world["collectives"]) == (2, 5, 5)
    assert top["mean_wait_us"] == pytest.approx(10_000, rel=1e-6)
    assert doc["clock"]["bound_us"] == pytest.approx(5.0)
    ar = next(r for r in doc["table"] if r["op"] == "all_reduce")
    assert (ar["calls_per_rank"], ar["bytes_per_rank"]) == (5, 5 * 4096)
    text = profiler.format_summary(doc)
    assert "world [0, 1, 2]: rank 2 arrived last in 5 of 5 collectives (all_reduce 5)" in text
    assert "the others waited 10.00 ms each time, 50.00 ms in total" in text
    assert "error bound +-5.0 us" in text


def test_chrome_trace_has_a_track_per_rank():
    raws = [_raw(r, off, late_rank=1) for r, off in enumerate([0.0, 2.0, 7.0])]
    doc = profiler.analyze(raws)
    trace = json.loads(json.dumps(profiler.chrome_trace(doc, raws)))
    events = trace["traceEvents"]
    calls = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in calls} == {0, 1, 2}
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0 (node1)", 1: "rank 1 (node1)", 2: "rank 2 (node2)"}
    for e in calls:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0
    # on rank 0's clock the calls line up although the clocks differ by seconds
    first = {
        e["pid"]: e["ts"] for e in calls if e["args"]["seq"] == 1 and e["name"] == "all_reduce"
    }
    assert first[1] - first[0] == pytest.approx(10_000, abs=1)
    waits = {e["pid"]: e["args"]["wait_us"] for e in calls if e["args"]["seq"] == 1 and e["name"] == "all_reduce"}  # fmt: skip
    assert waits[1] == 0 and waits[0] == pytest.approx(10_000, abs=1)


def test_report_reads_the_files_and_merges_rank_files(tmp_path, capsys):
    raws = [_raw(r, 0.0, late_rank=0) for r in range(3)]
    doc = profiler.analyze(raws)
    profiler.write(doc, raws, tmp_path / "p")
    assert main(["profile", "report", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hpccomm profile: 3 ranks on 2 host(s)")
    assert "rank 0 arrived last in 5 of 5" in out
    alone = tmp_path / "alone"
    alone.mkdir()
    for r in raws:
        r = {**r, "clock": {"start": None, "stop": None}, "alone": "not every rank came"}
        (alone / f"rank{r['rank']:05d}.json").write_text(json.dumps(r))
    assert main(["profile", "report", str(alone)]) == 0
    out = capsys.readouterr().out
    assert "error bound unknown" in out and "note: not every rank came" in out
    assert main(["profile", "report", str(tmp_path / "none")]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("top", ["0", "-3"])
def test_report_refuses_a_top_below_one(tmp_path, capsys, top):
    # --top 0 and --top -3 printed an empty table without an error
    raws = [_raw(r, 0.0, late_rank=0) for r in range(2)]
    profiler.write(profiler.analyze(raws), raws, tmp_path / "p")
    assert main(["profile", "report", str(tmp_path / "p"), "--top", top]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"hpccomm: profile report: --top {top}, expected the number of rows to show (>= 1)\n"
    )


@pytest.mark.parametrize("name", ["profile.json", "rank00001.json"])
def test_report_names_the_corrupt_file(tmp_path, capsys, name):
    # a corrupt profile.json was reported as "cannot read DIR"
    (tmp_path / "rank00000.json").write_text(json.dumps(_raw(0, 0.0, late_rank=0)))
    (tmp_path / name).write_text('{"ranks": 2, "wal')
    assert main(["profile", "report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"hpccomm: profile report: cannot read {tmp_path / name}: invalid JSON ("
    ), err


def test_bus_bytes_of_a_call():
    assert profiler.bus_bytes("all_reduce", 1000, 4, False) == 1500
    assert profiler.bus_bytes("all_gather", 1000, 4, False) == 3000  # S = 4000
    assert profiler.bus_bytes("scatter", 4000, 4, True) == 3000
    assert profiler.bus_bytes("scatter", 1000, 4, False) == 3000
    assert profiler.bus_bytes("send", 10, 2, False) == 10
    assert profiler.bus_bytes("barrier", 0, 4, False) == 0


def test_report_draws_the_timeline(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the 'plot' extra (matplotlib) is not installed")
    from PIL import Image

    raws = [_raw(r, 0.0, late_rank=1) for r in range(3)]
    profiler.write(profiler.analyze(raws), raws, tmp_path / "p")
    png = tmp_path / "t.png"
    assert main(["profile", "report", str(tmp_path / "p"), "--timeline", str(png)]) == 0
    with Image.open(png) as img:
        assert img.format == "PNG"
    capsys.readouterr()


def test_calls_not_completed_at_the_stop_are_reported():
    # a call that never completed (a peer that never came) was left out: the report said
    # "errors: 0" and 0.1% of wall in communication for a rank stuck 3 s in an all_reduce
    raws = [_raw(r, 0.0, late_rank=0, n=2) for r in range(2)]
    raws[0]["unfinished"] = [[0, "all_reduce", 6, 98.0]]  # 3 s before its stop at 101.0
    doc = profiler.analyze(raws)
    assert doc["unfinished"] == [
        {"rank": 0, "group": "world", "op": "all_reduce", "seq": 6, "running_s": 3.0}
    ]
    text = profiler.format_summary(doc)
    assert "not completed: rank 0's all_reduce #6 on world, running 3.00 s at the stop" in text


@pytest.mark.parametrize(
    "name, content, said",
    [
        ("profile.json", "[1, 2]", "is not a profile.json of hpccomm.profile/1"),
        ("profile.json", '{"schema": "hpccomm.profile/1"}', "is damaged or incomplete (KeyError"),
        (
            "rank00000.json",
            '{"rank": 0, "entries": []}',
            "is not a profiler's rank file (a flight recorder dump?)",
        ),  # fmt: skip
        ("rank00000.json", '{"rank": 0}', "is not a profiler's rank file"),
    ],
)
@pytest.mark.parametrize("json_out", [[], ["--json"]])
def test_report_refuses_what_is_no_profile_in_one_line(
    tmp_path, capsys, name, content, said, json_out
):
    # these were tracebacks (TypeError, KeyError 'wall_s', KeyError 'clock'); with --json an
    # incomplete profile.json was printed, exit status 0
    (tmp_path / name).write_text(content)
    assert main(["profile", "report", str(tmp_path), *json_out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpccomm: profile report: ") and said in err, err
    assert err.count("\n") == 1, err


def _expected(op, n, me, redop="SUM", root=0, size=4096):
    k = bench.Case(op, size, np.dtype(np.float32), n, me, root, ReduceOp(redop))
    k.fill()
    return k, k.expected()


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_check_data_sees_results_moved_or_made_up(n):
    # A review broke hpccomm's ops on purpose and ran bench -c: with the old periodic data
    # ((i + 7r) % 3 + 1) every 3-rank sum was the constant 6 and ranks r and r+3 held the
    # same data, so a result reversed, a made-up constant, a wrong root or two blocks swapped
    # all passed with 0 wrong. Each of those must now change the expected result.
    for redop in ("SUM", "PRODUCT", "MIN", "MAX"):
        _, (_, want) = _expected("all_reduce", n, 0, redop)
        assert len(np.unique(want)) > 1, (redop, want[:12])
        assert (want != want[::-1]).any() and (want != np.roll(want, 3)).any()
    k, _ = _expected("broadcast", n, 0, root=n - 1)
    assert (k.values(n - 1, k.total) != k.values(0, k.total)).any()  # a wrong root shows
    k, (_, want) = _expected("all_gather", n, 0)
    b = k.block
    swapped = want.copy()
    swapped[:b], swapped[-b:] = want[-b:], want[:b].copy()
    assert (swapped != want).any()
    for op in ("reduce_scatter", "scatter", "all_to_all"):  # each rank's own block
        blocks = [_expected(op, n, me)[1][1] for me in range(n)]
        assert all((blocks[0] != other).any() for other in blocks[1:]), op
    _, (_, inputs) = _expected("all_to_all", n, 1)
    k, _ = _expected("all_to_all", n, 1)
    assert (inputs != k.x).any()  # an exchange that did nothing shows


def test_profile_report_keeps_the_newest_jobs_rank_files(tmp_path):
    # a 2-rank job's rank files written over a 4-rank job's were merged into one "4 ranks"
    # report with calls of both; a file named for another rank than it records was taken too
    import os

    from hpccomm.profiler import _one_job

    def raw(rank, job, world):
        return {"rank": rank, "job": job, "world": world}

    paths, raws = [], []  # job B's ranks 0 and 1 over job A's 0-3, 10 s later
    for rank, job, world, when in [
        (0, "B", 2, 10),
        (1, "B", 2, 10),
        (2, "A", 4, 0),
        (3, "A", 4, 0),
    ]:
        p = tmp_path / f"rank{rank:05d}.json"
        p.write_text("{}")
        os.utime(p, (1_000_000 + when, 1_000_000 + when))
        paths.append(p)
        raws.append(raw(rank, job, world))
    pairs = list(zip(paths, raws, strict=True))
    kept, notes = _one_job([p for p, _ in pairs], [r for _, r in pairs])
    assert [(r["rank"], r["job"]) for r in kept] == [(0, "B"), (1, "B")], kept
    assert notes == [
        "rank00002.json, rank00003.json (another job: A, 4 ranks; the newest files are B's, "
        "2 ranks)"
    ], notes
    misnamed = tmp_path / "rank00007.json"
    misnamed.write_text("{}")
    kept, notes = _one_job([misnamed], [raw(0, "B", 2)])
    assert kept == [] and notes == ["rank00007.json (records rank 0: not this name's)"]


@pytest.mark.parametrize("name", ["t.foo", "noext", "adir.png", "adir"])
def test_report_refuses_a_timeline_it_cannot_write_before_any_work(tmp_path, capsys, name):
    # --timeline t.foo printed the summary then matplotlib's traceback (rc 1); noext and a
    # directory wrote noext.png / DIR.png: bench --plot's checks, one line, exit 2
    pytest.importorskip("matplotlib", reason="the 'plot' extra (matplotlib) is not installed")
    raws = [_raw(r, 0.0, late_rank=1) for r in range(2)]
    profiler.write(profiler.analyze(raws), raws, tmp_path / "p")
    (tmp_path / "adir.png").mkdir()
    (tmp_path / "adir").mkdir()
    path = tmp_path / name
    before = sorted(tmp_path.iterdir())
    assert main(["profile", "report", str(tmp_path / "p"), "--timeline", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    why = {
        "t.foo": "the extension .foo is not a format matplotlib writes, expected one of .",
        "noext": f"it has no extension (matplotlib would write {path}.png instead), expected",
        "adir": f"it has no extension (matplotlib would write {path}.png instead), expected",
        "adir.png": "it is a directory",
    }[name]
    assert captured.err.startswith(
        f"hpccomm: profile report --timeline: cannot write {path}: {why}"
    ), captured.err
    assert captured.err.count("\n") == 1, captured.err
    assert sorted(tmp_path.iterdir()) == before  # nothing written


def test_report_timeline_without_matplotlib_says_how(tmp_path, capsys, monkeypatch):
    raws = [_raw(r, 0.0, late_rank=1) for r in range(2)]
    profiler.write(profiler.analyze(raws), raws, tmp_path / "p")
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    png = tmp_path / "t.png"
    assert main(["profile", "report", str(tmp_path / "p"), "--timeline", str(png)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not png.exists()
    assert captured.err == f"hpccomm: profile report --timeline: {bench.PLOT_HINT}\n"


def test_overlapping_async_calls_count_once_in_a_ranks_communication_time():
    # 8 async buckets issued at once and waited later: each call's time runs from its
    # issue, so summed they made 300-750% of the wall time (an outside hunt)
    raws = []
    for rank in range(2):
        events = [[0, "all_reduce", k + 1, 100.0, 100.1 + 0.01 * k, 4096, True, False]
                  for k in range(8)]  # fmt: skip
        events.append([0, "all_reduce", 9, 100.5, 100.6, 4096, False, False])
        g = [{"gid": "world", "name": "world", "members": [0, 1], "rank": rank, "size": 2}]
        raws.append({
            "rank": rank, "host": "node1", "pid": 1, "t_start": 100.0, "t_stop": 101.0,
            "groups": g, "stats": [[0, "all_reduce", 9, 9 * 4096, sum(e[4] - e[3] for e in events),
                                   1.0, 0]],
            "events": events, "dropped": 0,
            "clock": {"start": [0.0, 1e-6], "stop": [0.0, 1e-6]},
        })  # fmt: skip
    doc = profiler.analyze(raws)
    per = {p["rank"]: p for p in doc["per_rank"]}
    assert per[0]["comm_s"] == pytest.approx(0.17 + 0.1)  # not 0.08 * 8 + ... = 1.18
    assert "communication: 270.00 ms per rank (27.0% of wall)" in profiler.format_summary(doc)
