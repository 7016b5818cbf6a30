"""The README's Python examples run, under mpiexec with 2 ranks (bounded)."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(mpiexec, venv_bin, mpi_env, tmp_path, index):
    if "import torch" in BLOCKS[index] and not getattr(
        importlib.util.find_spec("torch"), "origin", None
    ):
        pytest.skip("the example needs torch, which is not installed (make install adds it)")
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    out = subprocess.run(
        [mpiexec, "--oversubscribe", "-n", "2", str(venv_bin / "python"), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=mpi_env,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_operation_is_in_the_operations_table():
    # The operations table is checked against the op facts (hpccomm/ops.py SPECS) and the
    # Communicator: every op the dispatch knows is documented and is a method.
    from hpccomm.comm import Communicator
    from hpccomm.ops import SPECS

    table = README.read_text().split("Operations (all ranks of a group", 1)[1].split("\n\n", 2)[1]
    for spec in SPECS:
        assert f"`{spec.name}`" in table, spec.name
        assert callable(getattr(Communicator, spec.name)), spec.name
