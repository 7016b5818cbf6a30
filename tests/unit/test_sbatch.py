"""`hpccomm sbatch` rendering and its refusals (no cluster needed)."""

import pytest

from hpccomm.cli import main
from hpccomm.slurm import BatchOptions, parse_time, render


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("5:30", 330),
        ("1:00:00", 3600),
        ("2-12", 216000),
        ("1-1:01", 90060),
        ("0-0:0:5", 5),
        ("UNLIMITED", None),
    ],
)
def test_parse_time(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["1h", "1:99", "1:2:3:4", "-5", "", "1-", "12:61:00"])
def test_parse_time_rejects(text):
    with pytest.raises(ValueError, match=r"sbatch: --time .* is not a Slurm time"):
        parse_time(text)


def test_render_full():
    text = render(
        BatchOptions(command=["hpccomm", "doctor"], nodes=2, ntasks_per_node=4, gpus_per_node=4, gpus_per_task=1,
                     cpus_per_task=8, time="1:00:00", partition="gpu", account="abc", output="o-%j.out",
                     extra=["#SBATCH --exclusive"])
    )  # fmt: skip
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4", "#SBATCH --gpus-per-task=1",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --time=1:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=abc",
                 "#SBATCH --output=o-%j.out", "#SBATCH --exclusive", "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}",
                 "srun --mpi=pmix hpccomm doctor"):  # fmt: skip
        assert line in text.splitlines() or any(l.startswith(line) for l in text.splitlines()), line  # noqa: E741
    assert text.startswith("#!/bin/bash\n")


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--time", "1h"], "--time '1h' is not a Slurm time"),
        (["--nodes", "0"], "--nodes is 0, expected an integer >= 1"),
        (
            ["--gpus-per-node", "2", "--gpus-per-task", "1", "--ntasks-per-node", "4"],
            "--gpus-per-task 1 x --ntasks-per-node 4 = 4 GPUs, but --gpus-per-node is 2",
        ),
        (["--mpi", "openmpi"], "--mpi 'openmpi' is not a Slurm MPI plug-in"),
        (["--extra=--exclusive"], "must be an '#SBATCH ...' line"),
    ],
)
def test_cli_refuses_before_submitting(argv, text, capsys, tmp_path):
    assert main(["sbatch", *argv, "--submit", "--", "true"]) == 2
    assert text in capsys.readouterr().err


def test_cli_needs_a_command(capsys):
    assert main(["sbatch"]) == 2
    assert "no command given" in capsys.readouterr().err


def test_cli_writes_file(tmp_path, capsys):
    out = tmp_path / "job.sh"
    assert main(["sbatch", "-N", "2", "-o", str(out), "--", "hpccomm", "info"]) == 0
    assert capsys.readouterr().out == ""
    assert "srun --mpi=pmix hpccomm info" in out.read_text()
