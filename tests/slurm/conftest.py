"""The Slurm tests need the local two-node cluster (``make slurm-up``); without it they skip
and say why. Every test in this directory gets the ``slurm`` marker here, so ``-m "not slurm"``
leaves them out. Every wait on the cluster is bounded."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONF = Path(os.environ.get("SLURM_RIG", ROOT / ".slurm")) / "etc" / "slurm.conf"
HERE = Path(__file__).parent


class Cluster:
    """The test cluster as the tests use it: the environment of its commands, and bounded
    runs of them."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir  # the venv's bin directory (hpccomm, mpiexec): first on PATH

    def env(self) -> dict:
        """A fresh environment: this cluster's slurm.conf, no Slurm/Open MPI/PMIx variables
        of the calling process."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "PMI_"))
        }
        env.update(
            SLURM_CONF=str(CONF),
            PATH=f"{self.bin}:{env.get('PATH', '')}",
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            OMPI_MCA_mpi_yield_when_idle="1",
            PMIX_MCA_psec="native",
            PMIX_MCA_gds="hash",
        )
        return env

    def run(self, cmd, timeout=120, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=self.env(), **kw
        )


@pytest.fixture(scope="session")
def cluster(venv_bin) -> Cluster:
    return Cluster(venv_bin)


def _why_not() -> str | None:
    if shutil.which("sinfo") is None:
        return "Slurm is not installed (make slurm-up installs and starts the test cluster)"
    if not CONF.exists():
        return f"no test cluster configuration at {CONF} (run make slurm-up)"
    try:
        out = Cluster(Path(sys.executable).parent).run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], timeout=15
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 15 s (is slurmctld running? make slurm-up)"
    idle = [
        line
        for line in out.stdout.splitlines()
        if line.split()[-1:] in (["idle"], ["mixed"], ["allocated"])
    ]
    if out.returncode != 0 or len(idle) < 2:
        return f"the test cluster is not up (sinfo: {out.stdout.strip() or out.stderr.strip()}); run make slurm-up"
    return None


@pytest.hookimpl(tryfirst=True)  # the marker is in place before -m selects
def pytest_collection_modifyitems(config, items):
    why = None
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.slurm)
            why = why or _why_not() or ""
            if why:
                item.add_marker(pytest.mark.skip(reason=why))
