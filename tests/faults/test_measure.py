"""hpccomm bench and HPCCOMM_PROFILE as commands in their own MPI jobs: the profile of an
unchanged program written at exit, a rank that reaches the exit-time stop too late (every
rank writes alone, the report merges them), and `hpccomm bench` with --json, --plot and its
progress line."""

import json
import subprocess

import pytest

from hpccomm.cli import main

pytestmark = pytest.mark.faults


def report(directory, capsys):
    assert main(["profile", "report", str(directory)]) == 0
    return capsys.readouterr().out


def test_env_variable_profiles_an_unchanged_program(launch, tmp_path, capsys):
    prof = tmp_path / "prof"
    job = launch(
        3,
        """
        c = hpccomm.init()
        for i in range(5):
            if c.rank == 1:
                time.sleep(0.15)
            c.all_reduce(np.ones(256, np.float32))
        c.broadcast(np.ones(8), 0)
        report(c, "done")
        c.free()  # the profiler's stop at exit does not need the world
        """,
        env={"HPCCOMM_PROFILE": str(prof)},
    )
    assert job.rc == 0, job.stderr
    assert sorted(p.name for p in prof.iterdir()) == ["profile.json", "summary.txt", "trace.json"]
    assert "hpccomm profile: wrote" in job.stderr
    out = report(prof, capsys)
    assert out == (prof / "summary.txt").read_text()
    assert "world [0, 1, 2]: rank 1 arrived last in" in out
    trace = json.loads((prof / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1, 2}


@pytest.mark.parametrize("late", [1, 0])
def test_a_rank_late_for_the_exit_stop_writes_alone(launch, tmp_path, capsys, late):
    # late=0: rank 1 gave up waiting for rank 0's word, and rank 0, arriving after that,
    # found the barrier complete and entered the clock exchange alone: the job hung at exit
    # (an outside hunt; likewise for stop(timeout=) called by a program)
    prof = tmp_path / "prof"
    job = launch(
        2,
        f"""
        import hpccomm.profiler as P
        P.STOP_TIMEOUT = 1.0
        c = hpccomm.init()
        c.all_reduce(np.ones(4))
        if c.rank == {late}:
            time.sleep(3)  # past the other rank's wait
        report(c, "done")
        """,
        env={"HPCCOMM_PROFILE": str(prof)},
        bound=60,
    )
    assert job.rc == 0, job.stderr
    assert sorted(p.name for p in prof.iterdir()) == ["rank00000.json", "rank00001.json"]
    assert "not every rank reached the profiler's stop in time" in job.stderr
    out = report(prof, capsys)
    assert out.startswith("hpccomm profile: 2 ranks")
    assert "note: not every rank reached the profiler's stop in time" in out


def test_a_fork_child_leaves_the_exit_stop_to_its_parent(launch, tmp_path, capsys):
    # the child's exit ran the profiler's exit-time stop over MPI as its parent: the job
    # hung or aborted, or the parent's rank file was overwritten (an outside hunt)
    prof = tmp_path / "prof"
    job = launch(
        2,
        """
        c = hpccomm.init(timeout=30)
        c.all_reduce(np.ones(4))
        if c.rank == 0:
            pid = os.fork()
            if pid == 0:
                sys.exit(0)
            _, status = os.waitpid(pid, 0)
            report(c, "child", status=os.waitstatus_to_exitcode(status))
        outcome(c, "after", lambda: c.all_reduce(np.ones(4)).tolist())
        """,
        env={"HPCCOMM_PROFILE": str(prof)},
        bound=60,
    )
    assert job.rc == 0, job.stderr[-3000:]
    assert job.of(0, "child")["status"] == 0
    assert job.of(1, "after")["value"] == "[2.0, 2.0, 2.0, 2.0]"
    assert sorted(p.name for p in prof.iterdir()) == ["profile.json", "summary.txt", "trace.json"]
    assert job.stderr.count("hpccomm profile: wrote") == 1, job.stderr[-3000:]
    assert "world [0, 1]" in report(prof, capsys)


def test_a_rank_that_leaves_is_heard_at_once_with_the_exit_stop(launch, tmp_path, capsys):
    # the profiler's exit-time stop (an atexit handler run before hpccomm's own exit) waited
    # for every rank before this rank's departure notice went out: a peer waiting for it in
    # a call waited out its timeout (45 s in an outside hunt) where it heard "has left the
    # job" at once without HPCCOMM_PROFILE
    prof = tmp_path / "prof"
    job = launch(
        2,
        """
        c = hpccomm.init(timeout=40)
        c.all_reduce(np.ones(4))
        if c.rank == 0:
            time.sleep(0.5)
            outcome(c, "call", lambda: c.all_reduce(np.ones(4)))
        """,
        env={"HPCCOMM_PROFILE": str(prof)},
        bound=90,
    )
    got = job.of(0, "call")
    assert got["cls"] == "PeerError" and "world rank 1 has left the job" in got["msg"], got
    assert got["s"] < 10, got
    # rank 0, going on to its exit, met rank 1 in the stop: one profile of both; then, as
    # without a profile, its call left inside MPI ends the job
    assert sorted(p.name for p in prof.iterdir()) == ["profile.json", "summary.txt", "trace.json"]
    assert "world [0, 1]" in report(prof, capsys)
    assert job.rc != 0 and "exiting while all_reduce #2 on world (rank 0 of 2) never completed" \
        in job.stderr, job.stderr[-3000:]  # fmt: skip


def test_stop_from_env_called_by_the_program_is_no_departure(launch, tmp_path):
    # (a review of the change above: stop_from_env sent the departure notice itself, and a
    # program that called it and went on got "rank 1 has left the job" in its next call)
    prof = tmp_path / "prof"
    job = launch(
        2,
        """
        from hpccomm import profiler
        c = hpccomm.init(timeout=20)
        c.all_reduce(np.ones(4))
        profiler.stop_from_env()
        if c.rank == 1:
            time.sleep(1)
        outcome(c, "barrier", lambda: c.barrier())
        """,
        env={"HPCCOMM_PROFILE": str(prof)},
        bound=60,
    )
    assert job.rc == 0, job.stderr[-3000:]
    for rank in (0, 1):
        assert job.of(rank, "barrier")["cls"] is None, job.of(rank, "barrier")
    assert sorted(p.name for p in prof.iterdir()) == ["profile.json", "summary.txt", "trace.json"]


def test_a_rank_ending_with_an_uncaught_exception_skips_the_exit_stop(launch, tmp_path):
    # it waited in the profiler's exit-time stop (30 s) before the abort, while its peer
    # waited in a call for it (an outside hunt)
    prof = tmp_path / "prof"
    job = launch(
        2,
        """
        c = hpccomm.init(timeout=40)
        c.all_reduce(np.ones(4))
        if c.rank == 1:
            raise RuntimeError("a bug in step 3")
        c.all_reduce(np.ones(4))
        """,
        env={"HPCCOMM_PROFILE": str(prof)},
        bound=60,
    )
    assert job.rc != 0 and job.seconds < 25, (job.rc, job.seconds, job.stderr[-2000:])
    assert "RuntimeError: a bug in step 3" in job.stderr
    assert "this rank ends with an exception nobody caught (RuntimeError)" in job.stderr
    assert (prof / "rank00001.json").exists()


def test_a_stop_whose_root_comes_late_ends_alike_on_every_rank(launch, tmp_path):
    # stop(timeout=1) with rank 0 three seconds late (rank 0 hung in the clock exchange),
    # and on time (one profile)
    job = launch(
        3,
        f"""
        for late in (3.0, 0.0):
            c = hpccomm.init()
            p = hpccomm.profile(c, {str(tmp_path)!r} + f"/p{{late}}").start()
            c.all_reduce(np.ones(4))
            if c.rank == 0:
                time.sleep(late)
            doc = p.stop(timeout=1)
            report(c, f"stop{{late}}", doc=doc is not None)
        """,
        bound=60,
    )
    assert job.rc == 0, job.stderr
    for r in range(3):
        assert job.of(r, "stop3.0") == {"doc": False}
        assert job.of(r, "stop0.0") == {"doc": r == 0}
    assert sorted(p.name for p in (tmp_path / "p3.0").iterdir()) == [
        "rank00000.json",
        "rank00001.json",
        "rank00002.json",
    ]
    assert (tmp_path / "p0.0" / "summary.txt").exists()


def test_bench_command_with_json_plot_and_progress(mpiexec, mpi_env, venv_bin, tmp_path):
    pytest.importorskip("matplotlib", reason="the 'plot' extra (matplotlib) is not installed")
    cmd = [mpiexec, "--oversubscribe", "-n", "2", str(venv_bin / "hpccomm"), "bench",
           "-o", "all_reduce,all_gather", "-b", "8", "-e", "64K", "-f", "16", "-n", "5",
           "--rounds", "2", "--peer", "mpi4py", "--json", str(tmp_path / "b.json"),
           "--plot", str(tmp_path / "b.png")]  # fmt: skip
    proc = subprocess.run(cmd, env=mpi_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# hpccomm bench: 2 ranks")
    assert sum(not line.startswith("#") for line in lines) == 4 * 2  # 8 B .. 32 KiB, 2 ops
    assert "bench: all_gather" in proc.stderr and "bench: done in" in proc.stderr
    doc = json.loads((tmp_path / "b.json").read_text())
    assert {r["op"] for r in doc["groups"][0]["rows"]} == {"all_reduce", "all_gather"}
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
