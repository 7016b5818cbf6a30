"""The README's Python examples run, under mpiexec with 2 ranks (bounded)."""

import re
import subprocess
from pathlib import Path

import pytest
from test_dtypes_cli import BIN, MPIEXEC, mpi_env

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert BLOCKS


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (install the 'mpi' extra)")
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(tmp_path, index):
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    out = subprocess.run(
        [MPIEXEC, "--oversubscribe", "-n", "2", str(BIN / "python"), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=mpi_env(),
    )
    assert out.returncode == 0, out.stdout + out.stderr
