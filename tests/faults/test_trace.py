"""The flight recorder in real jobs: each rank writes its last calls when it times out, on
SIGUSR1 and SIGTERM (also while stuck inside MPI), and `hpccomm trace analyze` names the
diverging rank and call, and the ranks that left no file."""

import json
import signal
import subprocess
import time

import pytest

from hpccomm.cli import main

pytestmark = pytest.mark.faults


def analyze(trace, capsys):
    assert main(["trace", "analyze", str(trace)]) == 0
    return capsys.readouterr().out


def test_a_rank_skips_a_collective(launch, tmp_path, capsys):
    trace = tmp_path / "trace"
    job = launch(
        4,
        f"""
        c = hpccomm.init(timeout=3, trace_dir={str(trace)!r})
        tp = c.split(c.rank // 2)
        for _ in range(3):
            c.all_reduce(np.ones(4))
        c.broadcast(np.ones(2), 0)
        if c.rank != 3:
            outcome(c, "call", lambda: c.all_reduce(np.ones(1024, np.float32)))
        else:
            outcome(c, "call", lambda: tp.barrier())
        """,
    )
    assert job.of(0, "call")["cls"] == "CommTimeoutError"
    assert sorted(p.name for p in trace.glob("rank*.json")) == [
        f"rank{r:05d}.json" for r in range(4)
    ]
    verdict = analyze(trace, capsys)
    assert verdict.startswith(
        "world #6: ranks 0-2 entered all_reduce #6 on world (1024,) float32 and wait. "
        "rank 3 never did: its last completed call there was broadcast #5 on world (2,) "
        "float64, and it waits in barrier #1 on world/split(1)"
    ), verdict
    assert (
        "rank 2 never did: it completed no recorded call on that group (group creations, "
        "split, dup, new_group, are not recorded)"
    ) in verdict


def test_sibling_groups_of_one_split_are_told_apart(launch, tmp_path, capsys):
    # The groups one split makes shared one id in the dumps, so the analysis took the last
    # sibling's members for the stuck group's: it blamed rank 2 (in the other group) and
    # never named rank 1, the rank that skipped the call.
    trace = tmp_path / "trace"
    job = launch(
        3,
        f"""
        c = hpccomm.init(timeout=3, trace_dir={str(trace)!r})
        g = c.split(0 if c.rank < 2 else 1)
        for _ in range(2):
            g.all_reduce(np.ones(4))
        if c.rank != 1:  # rank 1 skips its group's third call
            outcome(c, "call", lambda: g.all_reduce(np.ones(4)))
        if c.rank == 0:
            time.sleep(3)  # (its stuck call aborts the job at exit: the others dump first)
        else:
            time.sleep(1)
            hpccomm.dump()
            time.sleep(8)  # alive: its exit would tell rank 0 at once that it left
        """,
    )
    assert job.of(0, "call")["cls"] == "CommTimeoutError"
    verdict = analyze(trace, capsys)
    assert verdict.startswith(
        "world/split(0) #3: rank 0 entered all_reduce #3 on world/split(0) (4,) float64 and "
        "waits. rank 1 never did: its last completed call there was all_reduce #2 on "
        "world/split(0)"
    ), verdict
    assert "rank 2" not in verdict.split(". (dumps")[0], verdict


def test_a_rank_ended_by_an_uncaught_exception_leaves_its_trace(launch, tmp_path, capsys):
    # The rank holding the root cause left no dump (its exit aborted the job without one):
    # the analysis said "rank 1 never did and left no trace file (killed hard?)"
    trace = tmp_path / "trace"
    launch(
        2,
        f"""
        c = hpccomm.init(trace_dir={str(trace)!r})
        for step in range(4):
            if c.rank == 1 and step == 2:
                raise ValueError(f"bad batch at step {{step}}")
            c.all_reduce(np.ones(1000, np.float32))
        """,
    )
    verdict = analyze(trace, capsys)
    assert "rank 1 never did: its last completed call there was all_reduce #2 on world" in verdict
    assert "it ended with an exception nobody caught: ValueError: bad batch at step 2" in verdict
    assert "left no trace file" not in verdict, verdict


def test_sigusr1_and_sigterm_while_stuck_in_mpi(mpiexec, mpi_env, venv_bin, tmp_path, capsys):
    # No timeout: every rank is stuck inside a blocking MPI call (rank 0 in a barrier, the
    # others in an all_reduce); the signals still get the traces written.
    trace = tmp_path / "trace"
    script = tmp_path / "hang.py"
    script.write_text(
        "import numpy as np, hpccomm\n"
        f"c = hpccomm.init(trace_dir={str(trace)!r})\n"
        "c.all_reduce(np.ones(3))\n"
        "print('ready', flush=True)\n"
        "c.barrier() if c.rank == 0 else c.all_reduce(np.ones(8))\n"
    )
    proc = subprocess.Popen(
        [mpiexec, "--oversubscribe", "-n", "3", str(venv_bin / "python"), str(script)],
        env=mpi_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        ready = 0
        while ready < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            ready += line.startswith("ready")
        time.sleep(1.0)  # into the mismatched calls
        proc.send_signal(signal.SIGUSR1)  # mpiexec forwards it to every rank
        for _ in range(100):
            if len(list(trace.glob("rank*.json"))) == 3:
                break
            time.sleep(0.1)
        verdict = analyze(trace, capsys)
        assert (
            "world #2: ranks 0-2 entered different calls (ranks 1-2 all_reduce; rank 0 "
            "barrier) and wait" in verdict
        ), verdict
        assert "(dumps written on: SIGUSR1)" in verdict
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "(dumps written on: SIGTERM)" in analyze(trace, capsys)


def test_a_killed_rank_leaves_no_file(launch, tmp_path, capsys):
    trace = tmp_path / "trace"
    job = launch(
        3,
        f"""
        c = hpccomm.init(timeout=5, trace_dir={str(trace)!r})
        c.all_reduce(np.ones(2))
        if c.rank == 2:
            os.kill(os.getpid(), 9)
        outcome(c, "call", lambda: c.all_reduce(np.ones(2)))
        """,
        args=("--with-ft", "ulfm"),
    )
    assert job.of(0, "call")["cls"] == "PeerError"
    verdict = analyze(trace, capsys)
    assert "rank 2 left no trace file (killed hard, or not tracing)" in verdict, verdict
    assert "rank 0: all_reduce #2 on world (2,) float64 failed: all_reduce #2 on world" in verdict


def test_a_rank_stuck_in_group_creation_leaves_its_trace(launch, tmp_path, capsys):
    # split, dup, new_group, create_group and monitored_barrier make no record of a call:
    # their timeouts wrote no trace file, and the analysis said of a live rank "never did
    # and left no trace file (killed hard?)". Now their errors dump the trace, and the
    # analysis names what the rank reported.
    trace = tmp_path / "trace"
    job = launch(
        3,
        f"""
        c = hpccomm.init(timeout=2, trace_dir={str(trace)!r})
        c.all_reduce(np.ones(4))
        if c.rank < 2:
            outcome(c, "call", lambda: c.all_reduce(np.ones(1024, np.float32)))
        else:
            outcome(c, "call", lambda: c.split(0))
        """,
    )
    assert job.of(2, "call")["cls"] == "CommTimeoutError"
    assert sorted(p.name for p in trace.glob("rank*.json")) == [
        f"rank{r:05d}.json" for r in range(3)
    ]
    verdict = analyze(trace, capsys)
    assert "ranks 0-1 entered all_reduce #2 on world (1024,) float32 and wait" in verdict
    assert "rank 2 never did: its last completed call there was all_reduce #1" in verdict
    assert "and it reported CommTimeoutError: split #2 on world (rank 2 of 3)" in verdict
    assert "left no trace file" not in verdict


def test_dumps_of_an_earlier_job_in_the_same_directory_are_left_out(launch, tmp_path, capsys):
    # A 3-rank job, then a 2-rank job, into one directory: the analysis merged the first
    # job's rank00002.json into the second and blamed a "rank 2" the second job did not have.
    trace = tmp_path / "trace"
    launch(
        3,
        f"""
        c = hpccomm.init(timeout=2, trace_dir={str(trace)!r})
        c.all_reduce(np.ones(4))
        hpccomm.dump("checkpoint")
        """,
    )
    job = launch(
        2,
        f"""
        c = hpccomm.init(timeout=2, trace_dir={str(trace)!r})
        c.all_reduce(np.ones(4))
        if c.rank == 0:
            outcome(c, "call", lambda: c.all_reduce(np.ones(1024, np.float32)))
        else:
            hpccomm.dump("checkpoint")  # its file is this job's whatever ends it
            time.sleep(3)
        """,
    )
    assert job.of(0, "call")["cls"] == "CommTimeoutError"
    assert sorted(p.name for p in trace.glob("rank*.json")) == [
        f"rank{r:05d}.json" for r in range(3)
    ]
    verdict = analyze(trace, capsys)
    assert verdict.startswith(
        "world #2: rank 0 entered all_reduce #2 on world (1024,) float32 and waits. rank 1 never "
        "did: its last completed call there was all_reduce #1 on world (4,) float64"
    ), verdict
    analysis, _, left_out = verdict.partition(". left out: ")
    assert "rank 2" not in analysis, verdict
    assert left_out.startswith("rank00002.json (another job: job PMIX_NAMESPACE="), verdict
    assert ", 3 ranks, its newest dump" in left_out and left_out.rstrip().endswith(", 2 ranks)"), (
        verdict
    )


def test_the_programs_own_signal_handlers_are_kept(launch, tmp_path):
    # With a trace directory, a SIGTERM handler of the program's (a checkpoint before the
    # time limit) was replaced, or cut short 0.5 s after the dump, and a SIGUSR1 handler (a
    # requeue) replaced: now the dump is written and then the program's handler runs
    trace = tmp_path / "trace"
    job = launch(
        2,
        """
        import signal
        got = []
        signal.signal(signal.SIGTERM, lambda s, f: got.append("TERM"))
        signal.signal(signal.SIGUSR1, lambda s, f: got.append("USR1"))
        c = hpccomm.init(timeout=20)
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the watcher would have ended the process by now
        dumped = os.path.exists(os.path.join(os.environ["HPCCOMM_TRACE_DIR"],
                                             f"rank{c.rank:05d}.json"))
        report(c, "handlers", got=sorted(got), dumped=dumped)
        outcome(c, "after", lambda: c.all_reduce(np.ones(1)).tolist())
        """,
        env={"HPCCOMM_TRACE_DIR": str(trace)},
    )
    assert job.rc == 0, job.stderr[-3000:]
    for rank in (0, 1):
        assert job.of(rank, "handlers") == {"got": ["TERM", "USR1"], "dumped": True}
        assert job.of(rank, "after")["value"] == "[2.0]"


def test_sigterm_stops_the_program_while_its_trace_is_written(launch, tmp_path):
    # With a trace directory, the rank ran on for the 0.5 s the watcher waits after its
    # dump: it called collectives meanwhile, and a program that ended in that time exited
    # with status 0 (an outside hunt: 5 of 5 runs)
    trace = tmp_path / "trace"
    job = launch(
        2,
        f"""
        import signal
        c = hpccomm.init(timeout=20, trace_dir={str(trace)!r})
        c.all_reduce(np.ones(4))
        if c.rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            report(c, "alive")
        """,
    )
    assert job.rc != 0, job.stdout
    assert (1, "alive") not in job.reports, job.stdout
    doc = json.loads((trace / "rank00001.json").read_text())
    assert doc["reason"] == "SIGTERM"


def test_a_difference_found_at_exit_writes_the_dumps(launch, tmp_path, capsys):
    # The exit's comparison of the calls no comparison took named SUM against MAX and the
    # job ended with status 1, but the trace folder stayed empty and its analysis said
    # there was nothing to analyze (an outside hunt)
    trace = tmp_path / "trace"
    job = launch(
        2,
        f"""
        c = hpccomm.init(timeout=10, trace_dir={str(trace)!r})
        for _ in range(3):
            c.all_reduce(np.ones(4))
        c.all_reduce(np.ones(4), op=ReduceOp.SUM if c.rank == 0 else ReduceOp.MAX)
        report(c, "done")
        """,
    )
    assert job.rc == 1, job.stderr[-2000:]
    assert "at exit: on group world" in job.stderr, job.stderr[-2000:]
    assert sorted(p.name for p in trace.glob("rank*.json")) == ["rank00000.json", "rank00001.json"]
    verdict = analyze(trace, capsys)
    assert (
        "world #4 (all_reduce): the ranks' calls differ: op ReduceOp.SUM on rank 0 but "
        "ReduceOp.MAX on rank 1"
    ) in verdict, verdict


def test_a_refused_call_is_in_the_refusing_ranks_trace(launch, tmp_path, capsys):
    # Validation refused rank 2's all_reduce #4 (MAX on complex64): the call took its number
    # but was not recorded, so rank 2's dump ended at #3 and the analysis knew of the call
    # only from its peers' PeerError, cut at 100 characters
    trace = tmp_path / "trace"
    job = launch(
        3,
        f"""
        c = hpccomm.init(timeout=5, trace_dir={str(trace)!r})
        for _ in range(3):
            c.all_reduce(np.ones(4))
        x = np.ones(4, np.complex64 if c.rank == 2 else np.float64)
        outcome(c, "call", lambda: c.all_reduce(x, op=ReduceOp.MAX if c.rank == 2 else ReduceOp.SUM))
        time.sleep(2)  # (the peers' calls stay inside MPI: their exit aborts the job)
        """,
    )
    assert job.of(2, "call")["cls"] == "DtypeError"
    assert job.of(0, "call")["cls"] == "PeerError"
    mine = json.loads((trace / "rank00002.json").read_text())["entries"]
    assert [(e["op"], e["seq"], e["state"]) for e in mine][-2:] == [
        ("all_reduce", 3, "completed"),
        ("all_reduce", 4, "refused"),
    ]
    assert (mine[-1]["dtype"], mine[-1]["shape"], mine[-1]["redop"]) == (
        "complex64",
        [4],
        "ReduceOp.MAX",
    )
    verdict = analyze(trace, capsys)
    assert verdict.startswith(
        "world #4 (all_reduce): the ranks' calls differ: dtype complex64 on rank 2 but float64 "
        "on ranks 0-1; op ReduceOp.MAX on rank 2 but ReduceOp.SUM on ranks 0-1"
    ), verdict
    assert (
        "rank 2: all_reduce #4 on world (4,) complex64 refused: all_reduce (rank 2 of 3): op MAX "
        "is not defined for dtype complex64: complex numbers have no order"
    ) in verdict, verdict
