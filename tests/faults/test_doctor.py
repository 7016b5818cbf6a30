"""``hpccomm doctor`` when a check's call times out: the FAIL line names the timeout, the
checks after it still run (each on a fresh duplicate), the report is printed, and the job
exits 1 without MPI_Abort (a timed-out call cannot be cancelled: every rank leaves without
finalizing MPI). Before, the doctor gathered the errors on the communicator the stuck call
was in: no report, and the job aborted."""

import re

import pytest

pytestmark = pytest.mark.faults

# A check in which rank 1 skips the last all_reduce (a real hang: rank 0's call is never
# matched), put third among the doctor's checks; the CLI in-process under mpiexec.
HANG = """
from hpccomm import cli, diagnose

def skip_one(c, found):
    c.all_reduce(np.ones(4))
    if c.rank != 1:
        c.all_reduce(np.ones(4))

diagnose.CHECKS = (*diagnose.CHECKS[:2], diagnose.Check("hang", skip_one),
                   *diagnose.CHECKS[2:])
sys.exit(cli.main(["doctor", "--timeout", "2"]))
"""


def _clean_end(job):
    """Status 1 from the doctor itself: no abort, no traceback, no crash."""
    assert job.rc == 1, (job.rc, job.stdout, job.stderr)
    assert "MPI_ABORT" not in job.stderr and "aborting the job" not in job.stderr, job.stderr
    assert not job.crashed(), job.stderr
    assert "UnwaitedWorkWarning" not in job.stderr, job.stderr


def test_a_check_that_hangs_fails_and_the_others_still_run(launch):
    job = launch(2, HANG, bound=90)
    _clean_end(job)
    out = job.stdout
    assert "rank  local  node  hostname" in out, out  # the launch table
    (line,) = [x for x in out.splitlines() if x.startswith("FAIL")]
    assert re.match(r"FAIL  hang  \(ranks \[0\]: CommTimeoutError: all_reduce #\d+ on ", line), line
    assert "not complete after 2 s" in line, line
    assert line.endswith("[a call still inside MPI on ranks [0]]"), line
    passed = [x for x in out.splitlines() if x.startswith("PASS")]
    assert len(passed) == 16, out  # every check after the hung one ran, and passed
    assert "doctor: 16 of 17 operations passed on 2 ranks" in out, out
    assert (
        "doctor: calls of 1 check(s) that failed never completed on rank(s) [0] (MPI cannot "
        "cancel a call: 'hang'); every rank exits with status 1 without finalizing MPI"
    ) in job.stderr, job.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_a_tiny_timeout_is_reported_not_aborted(launch, n):
    # 1 microsecond: calls time out on some ranks and not on others (a peer's late call
    # may complete after all): every rank still reaches the same reporting steps, and the
    # report is complete (the tester's 0.001 s times out now and then only)
    body = 'from hpccomm import cli\nsys.exit(cli.main(["doctor", "--timeout", "0.000001"]))\n'
    job = launch(n, body, bound=120)
    assert f"of 16 operations passed on {n} ranks" in job.stdout, (job.stdout, job.stderr)
    fails = [x for x in job.stdout.splitlines() if x.startswith("FAIL")]
    assert fails, job.stdout
    assert all("not complete after 1e-06 s" in x for x in fails), fails
    _clean_end(job)
