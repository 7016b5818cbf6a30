"""Fault injection: each scenario is a small program run under mpiexec in its own job (a
failure may end the job), with an outer time bound, and each rank reports what it saw as one
``R<rank> <tag> <json>`` line on stdout."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time
from dataclasses import dataclass, field

import pytest

PRELUDE = """
import json, os, sys, time
import numpy as np
import hpccomm
from hpccomm import ReduceOp

def report(c, tag, **kw):
    print(f"R{c.rank} {tag} " + json.dumps(kw), flush=True)

def outcome(c, what, fn):
    t0 = time.monotonic()
    try:
        value = fn()
    except Exception as e:
        report(c, what, cls=type(e).__name__, mro=[k.__name__ for k in type(e).__mro__],
               msg=str(e), s=round(time.monotonic() - t0, 2))
    else:
        report(c, what, cls=None, value=repr(value)[:200], s=round(time.monotonic() - t0, 2))

def all_reported(c, bound=30):
    # before os._exit on a group left unusable: the first rank to leave without finalize
    # ends the whole job, so each rank waits (files, not MPI) until every rank has reported
    d = os.environ["SCENARIO_JOB_DIR"]
    open(os.path.join(d, f"reported.{c.rank}"), "w").close()
    t0 = time.monotonic()
    while len(os.listdir(d)) < c.size and time.monotonic() - t0 < bound:
        time.sleep(0.05)
"""


@dataclass
class Job:
    """What a scenario's job did: exit status, wall time, output, and each rank's reports."""

    rc: int | None
    seconds: float
    stdout: str
    stderr: str
    reports: dict[tuple[int, str], dict] = field(default_factory=dict)

    def of(self, rank: int, what: str) -> dict:
        assert (rank, what) in self.reports, (
            f"rank {rank} did not report {what!r}\nstdout:\n{self.stdout}\nstderr:\n"
            f"{self.stderr[-3000:]}"
        )
        return self.reports[(rank, what)]

    def crashed(self) -> bool:
        return bool(re.search(r"Segmentation fault|signal 11|core dumped|Traceback", self.stderr))


@pytest.fixture
def launch(mpiexec, mpi_env, venv_bin, tmp_path):
    """``launch(n, body, bound=60, args=(), env=None, python=()) -> Job``: run PRELUDE +
    ``body`` on n ranks (``args`` go to mpiexec, ``python`` to Python before the script); the
    job is killed (and the test fails) if it outlives ``bound`` seconds."""

    def run(n: int, body: str, *, bound: float = 60, args=(), env=None, python=()) -> Job:
        script = tmp_path / "scenario.py"
        script.write_text(PRELUDE + textwrap.dedent(body))
        cmd = [
            mpiexec,
            "--oversubscribe",
            *args,
            "-n",
            str(n),
            str(venv_bin / "python"),
            *python,
            str(script),
        ]
        jobs = sorted(tmp_path.glob("job.*"))
        job_dir = tmp_path / f"job.{len(jobs)}"
        job_dir.mkdir()
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                cmd,
                env={**mpi_env, "SCENARIO_JOB_DIR": str(job_dir), **(env or {})},
                capture_output=True,
                text=True,
                timeout=bound,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            pytest.fail(
                f"the job hung: still running after {bound} s\nstdout:\n{out}\nstderr:\n{err}"
            )
        job = Job(proc.returncode, time.monotonic() - t0, proc.stdout, proc.stderr)
        for line in proc.stdout.splitlines():
            m = re.match(r"R(\d+) (\S+) (\{.*\})$", line)
            if m:
                job.reports[(int(m.group(1)), m.group(2))] = json.loads(m.group(3))
        return job

    return run
