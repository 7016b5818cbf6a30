"""The launch helpers without a cluster: the Slurm templates read as text, jobs/mpiexec-local.sh
without MPI, the Makefile's bounded runs and `make clean-runs` on directories of their own,
and jobs/ddp_train.py's --batch refused before MPI starts."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"
TEMPLATES = sorted(JOBS.glob("*.sbatch"))


# -- the sbatch templates ------------------------------------------------------------------


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_every_srun_template_passes_cpus_per_task_to_srun(path):
    # Slurm 22.05-23.02: srun does not inherit SLURM_CPUS_PER_TASK (reference launchers.md);
    # gpu-nccl.sbatch and `hpccomm sbatch` set SRUN_CPUS_PER_TASK, cpu-mpi and torch-ddp did not
    lines = path.read_text().splitlines()
    runs = [i for i, line in enumerate(lines) if re.match(r"\s*srun\b", line)]
    if not runs:
        pytest.skip(f"{path.name} starts no srun step")
    exports = [
        i
        for i, line in enumerate(lines)
        if line.startswith("export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}")
    ]
    assert exports and exports[0] < runs[0], f"{path.name}: no SRUN_CPUS_PER_TASK before srun"
    omp = [line for line in lines if line.startswith("export OMP_NUM_THREADS=")]
    assert omp == ["export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}"], (path.name, omp)


# -- jobs/mpiexec-local.sh without MPI ---------------------------------------------------


def _bare_copy(tmp_path):
    """jobs/mpiexec-local.sh in a checkout without .venv, and a PATH without mpiexec."""
    (tmp_path / "jobs").mkdir()
    script = tmp_path / "jobs" / "mpiexec-local.sh"
    shutil.copy(JOBS / "mpiexec-local.sh", script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("dirname"), bin_dir / "dirname")
    return script, str(bin_dir)


def _run_local(script, path):
    """``mpiexec-local.sh 2 hpccomm info`` with only ``path`` on PATH."""
    return subprocess.run(
        ["/bin/bash", str(script), "2", "hpccomm", "info"],
        env={"PATH": path},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_mpiexec_local_without_mpi_says_what_is_missing(tmp_path):
    # was: "line 26: exec: mpiexec: not found", status 127, no hint
    script, path = _bare_copy(tmp_path)
    out = _run_local(script, path)
    assert out.returncode == 127
    assert out.stderr == (
        f"mpiexec-local.sh: no {tmp_path}/.venv/bin/mpiexec and no mpiexec on PATH: run "
        f"`make install` (the .venv with Open MPI) or put an MPI's bin on PATH\n"
    ), out.stderr


def test_mpiexec_local_names_a_command_it_cannot_find(tmp_path):
    script, path = _bare_copy(tmp_path)
    fake = Path(path) / "mpiexec"
    fake.write_text("#!/bin/bash\necho mpiexec ran\n")
    fake.chmod(0o755)
    out = _run_local(script, path)
    assert (out.returncode, out.stdout) == (127, "")
    assert out.stderr.startswith("mpiexec-local.sh: 'hpccomm' is not a command here"), out.stderr
    assert "make install" in out.stderr and out.stderr.count("\n") == 1


# -- the Makefile's bounded runs and clean-runs ------------------------------------------

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def _make(tmp_path, *args, recipe=""):
    """make with the project's Makefile and a probe target running ``recipe`` bounded."""
    probe = tmp_path / "probe.mk"
    recipe = recipe.replace("$", "$$")  # make's escape
    probe.write_text(f"include {ROOT}/Makefile\n_probe:\n\t@$(BOUND) sh -c '{recipe}'\n")
    return subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "-C",
            str(ROOT),
            "-f",
            str(probe),
            f"RUN_DIR={tmp_path}/run",
            *args,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
    )


@needs_make
@pytest.mark.parametrize(
    "recipe, extra, status",
    [
        ('echo "$TMPDIR"', [], None),
        ('echo "$TMPDIR"; exit 3', [], "Error 3"),
        ('echo "$TMPDIR"; sleep 30', ["MPI_TIMEOUT=1"], "Error 124"),  # timed out
    ],
)
def test_a_bounded_run_removes_its_tmpdir_when_it_ends(tmp_path, recipe, extra, status):
    # every bounded run left a /tmp/hpccomm-run.* directory (638 of them)
    out = _make(tmp_path, *extra, "_probe", recipe=recipe)
    tmpdir = out.stdout.strip()
    assert tmpdir.startswith(f"{tmp_path}/run."), (out.stdout, out.stderr)
    assert not os.path.exists(tmpdir)
    if status is None:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode == 2 and status in out.stderr, out.stderr


@needs_make
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc")
def test_a_running_job_owns_its_tmpdir(tmp_path):
    # the owner file names the shell that waits for timeout (the command's grandparent)
    recipe = 'o=$(cat "$TMPDIR/owner"); set -- $(cat /proc/$PPID/stat); [ "$4" = "$o" ] && echo ok'
    out = _make(tmp_path, "_probe", recipe=recipe)
    assert (out.returncode, out.stdout) == (0, "ok\n"), out.stderr


@needs_make
def test_clean_runs_leaves_the_directories_of_running_jobs(tmp_path):
    # `make clean` ran rm -rf /tmp/hpccomm-run.*, the session files of other checkouts' jobs
    ended = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout
    dirs = {name: tmp_path / f"run.{name}" for name in ("alive", "ended", "young", "old")}
    for d in dirs.values():
        d.mkdir()
        (d / "ompi.123").mkdir()
    (dirs["alive"] / "owner").write_text(f"{os.getpid()}\n")
    (dirs["ended"] / "owner").write_text(ended)
    old = dirs["old"].stat().st_mtime - 2 * 3600  # an older Makefile's, past every bound
    os.utime(dirs["old"], (old, old))
    out = _make(tmp_path, "clean-runs")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.glob("run.*")) == ["run.alive", "run.young"]
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "clean"], capture_output=True, text=True)
    assert not re.search(r"rm -rf[^\n]*hpccomm-run\.\*", dry.stdout), dry.stdout


# -- jobs/ddp_train.py --batch ---------------------------------------------------------------


@pytest.mark.skipif(
    not getattr(importlib.util.find_spec("torch"), "origin", None), reason="torch is not installed"
)
@pytest.mark.parametrize(
    "batch, said",
    [
        (2, "--batch 2 at 3 ranks: a rank would train on 0 samples (loss nan), expected a "
            "multiple of 3 (e.g. 3)"),
        (256, "--batch 256 at 3 ranks: 1 sample of every batch would go unused, expected a "
              "multiple of 3 (e.g. 255 or 258)"),
    ],
)  # fmt: skip
def test_ddp_train_refuses_a_batch_the_ranks_cannot_share(mpi_env, batch, said):
    # --batch 2 at 3 ranks trained on empty shards (loss nan) and reported success
    env = {**mpi_env, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(JOBS / "ddp_train.py"), "--batch", str(batch), "--steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines()[-1] == f"ddp_train.py: error: {said}"


# -- jobs/gpu-check.sh's arguments (no GPU needed: refused before any step) ----------------


@pytest.mark.parametrize(
    "args, said",
    [
        (["--bogus"], "unknown option --bogus"),
        (["/proc/hpccomm-logs"], "cannot make, enter or write the log folder /proc/hpccomm-logs"),
        (["a", "b"], "one LOGDIR at most"),
    ],
)
def test_gpu_check_refuses_what_it_cannot_log_to(tmp_path, args, said):
    # a folder mkdir could not make left LOGDIR empty: the logs went to /, the wheels'
    # installs to /prefix, and every step failed as "the environment check failed" (an
    # outside hunt); an unknown option was taken as the folder
    got = subprocess.run(
        ["bash", str(JOBS / "gpu-check.sh"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 2, (got.returncode, got.stdout[-2000:], got.stderr[-2000:])
    assert said in got.stderr, got.stderr
    assert got.stdout == "" and list(tmp_path.iterdir()) == []
    assert not Path("/env.log").exists() and not Path("/summary.txt").exists()
