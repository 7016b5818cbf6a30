"""Exit under ``mpiexec --with-ft ulfm`` after a rank was killed: every survivor, whether or
not it heard of the failure, leaves with status 1 naming the failed world rank (ULFM's
agreement at exit, see hpccomm.runtime._failure_agreed), where the ranks that never heard of
it waited in MPI_Finalize for the dead rank for good or ended the job with status 0; a job
without a failure still ends normally. Each runs in its own MPI job."""

import pytest

pytestmark = pytest.mark.faults

ULFM = ("--with-ft", "ulfm")


def survivors_report(job, ranks, dead):
    assert job.rc == 1, (job.rc, job.stderr[-3000:])
    for rank in ranks:
        line = f"hpccomm (rank {rank} of 4): world rank(s) [{dead}] failed during the job"
        assert line in job.stderr, job.stderr[-3000:]


@pytest.mark.parametrize("end", ["exit", "free"])
def test_ranks_that_never_heard_of_a_killed_rank_leave_as_survivors(launch, end):
    # Rank 0 is killed; rank 1 hears of it in a group with rank 0; ranks 2 and 3 make no
    # call after that and end (their world freed first, as ``with hpccomm.init()`` does, for
    # "free"). They went to MPI_Finalize, which waited on the dead rank: the job hung, 9 of
    # 9 runs in an outside hunt.
    job = launch(
        4,
        f"""
        import signal
        c = hpccomm.init(timeout=3)
        pair = c.new_group([0, 1])
        if c.rank == 0:
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        if c.rank == 1:
            outcome(c, "call", lambda: pair.all_reduce(np.ones(4)))
        time.sleep(1.0)
        if {end!r} == "free":
            c.free()
        report(c, "end")
        """,
        bound=50,
        args=ULFM,
    )
    got = job.of(1, "call")
    assert got["cls"] == "PeerError", got
    assert "rank(s) [0] of this group failed (the process died)" in got["msg"], got
    for rank in (1, 2, 3):
        job.of(rank, "end")
    survivors_report(job, (1, 2, 3), 0)


def test_a_killed_rank_nobody_heard_of_is_not_a_clean_exit(launch):
    # Rank 0 is killed after a barrier; the others make no call after it. The job ended with
    # status 0 and no word of the failure (3 of 3 runs in an outside hunt).
    job = launch(
        4,
        """
        import signal
        c = hpccomm.init(timeout=3)
        c.barrier()
        if c.rank == 0:
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(1.0)
        report(c, "end")
        """,
        bound=50,
        args=ULFM,
    )
    survivors_report(job, (1, 2, 3), 0)


def test_a_subgroup_peer_error_names_the_world_rank(launch):
    # dp = world ranks [1, 3]: world rank 1 is rank 0 of the group. The PeerError said only
    # "rank(s) [0] of this group failed", where other messages name the world rank too.
    job = launch(
        4,
        """
        import signal
        c = hpccomm.init(timeout=3)
        g = c.layout(tp=2, dp=2)
        g.tp
        dp = g.dp
        if c.rank == 1:
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        if c.rank == 3:
            outcome(c, "call", lambda: dp.all_reduce(np.ones(4)))
        # every survivor hears of it (this test does not depend on the exit's agreement)
        outcome(c, "world", c.barrier)
        """,
        bound=50,
        args=ULFM,
    )
    got = job.of(3, "call")
    assert got["cls"] == "PeerError", got
    assert got["msg"].startswith("all_reduce #1 on world/dp (rank 1 of 2): "), got
    assert "rank(s) [0] (world rank(s) [1]) of this group failed (the process died)" in got["msg"]
    survivors_report(job, (0, 2, 3), 1)


@pytest.mark.parametrize("end", ["exit", "free"])
def test_without_a_failure_the_job_ends_normally_under_ulfm(launch, end):
    # The agreement at exit waits for a rank still running (rank 2 ends 3 s after the
    # others, past the 1 s timeout), as MPI_Finalize does: nobody is taken for failed.
    job = launch(
        4,
        f"""
        c = hpccomm.init(timeout=1)
        c.all_reduce(np.ones(4))
        if c.rank == 2:
            time.sleep(3)
        if {end!r} == "free":
            c.free()
        report(c, "end", t=time.time())
        """,
        bound=50,
        args=ULFM,
    )
    assert job.rc == 0, (job.rc, job.stderr[-3000:])
    assert "failed during the job" not in job.stderr, job.stderr[-3000:]
    assert all(job.of(rank, "end") for rank in range(4))  # every program ran to its end
