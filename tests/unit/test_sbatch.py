"""`hpccomm sbatch` rendering and its refusals (no cluster needed)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hpccomm.cli import main
from hpccomm.errors import CommTimeoutError, HpccommError, InvalidArgumentError
from hpccomm.slurm import BatchOptions, parse_time, render, submit, validate


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


@pytest.mark.parametrize(
    "text", ["1h", "1:99", "1:2:3:4", "-5", "", "1-", "12:61:00", "\u0663\u0660", "30\n", "1:00\n"]
)  # (other scripts' digits and a final newline were taken: the newline broke the script)
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
                 "srun --mpi=pmix --kill-on-bad-exit=1 hpccomm doctor"):  # fmt: skip
        assert line in text.splitlines() or any(l.startswith(line) for l in text.splitlines()), line  # noqa: E741
    assert text.startswith("#!/bin/bash\n")


def test_render_takes_the_cpus_given_at_submission():
    # without --cpus-per-task the script set OMP_NUM_THREADS=1 and no SRUN_CPUS_PER_TASK:
    # `sbatch -c 8 job.sh` gave each rank one thread (an outside hunt), as the templates do not
    lines = render(BatchOptions(command=["hpccomm", "info"])).splitlines()
    for line in ("export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}",
                 "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}"):  # fmt: skip
        assert any(ln.startswith(line) for ln in lines), (line, lines)


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
    assert "srun --mpi=pmix --kill-on-bad-exit=1 hpccomm info" in out.read_text()


# --- errors are one line, typed, and never a traceback -------------------------------------


def test_refusals_are_invalid_argument_errors():
    with pytest.raises(
        InvalidArgumentError, match=r"sbatch: --nodes is 0, expected an integer >= 1"
    ):
        validate(BatchOptions(command=["true"], nodes=0))
    for name in ("nodes", "ntasks_per_node", "cpus_per_task", "gpus_per_node"):
        # (True is an int to isinstance: nodes=True made a 1-node script, a review)
        option = "--" + name.replace("_", "-")
        with pytest.raises(InvalidArgumentError, match=rf"{option} is True, expected an integer"):
            validate(BatchOptions(command=["true"], **{name: True}))
        with pytest.raises(InvalidArgumentError, match=rf"{option} is 2.0, expected an integer"):
            validate(BatchOptions(command=["true"], **{name: 2.0}))
    # NumPy's integers are integers (as in the collectives' arguments)
    script = render(BatchOptions(command=["true"], nodes=np.int64(2), cpus_per_task=np.int32(4)))
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --cpus-per-task=4\n" in script
    with pytest.raises(InvalidArgumentError, match=r"sbatch: --time '1h' is not a Slurm time"):
        parse_time("1h")
    with pytest.raises(InvalidArgumentError, match=r"sbatch: --mpi 'x' is not a Slurm MPI plug-in"):
        render(BatchOptions(command=["true"], mpi="x"))
    with pytest.raises(InvalidArgumentError, match=r"no command given"):
        validate(BatchOptions(command=[]))
    with pytest.raises(
        InvalidArgumentError, match=r"--extra '--exclusive' must be an '#SBATCH \.\.\.' line"
    ):
        validate(BatchOptions(command=["true"], extra=["--exclusive"]))


def test_cli_write_to_missing_directory_is_one_line(tmp_path, capsys):
    target = tmp_path / "missing" / "x.sbatch"
    assert main(["sbatch", "-o", str(target), "--", "true"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"hpccomm: sbatch: cannot write {target}: No such file or directory\n"


def test_cli_write_error_has_no_traceback_from_the_command(tmp_path):
    target = tmp_path / "missing" / "x.sbatch"
    out = subprocess.run(
        [sys.executable, "-m", "hpccomm.cli", "sbatch", "-o", str(target), "--", "true"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert out.stderr == f"hpccomm: sbatch: cannot write {target}: No such file or directory\n"


# --- --submit: sbatch missing, failing, hanging (fake sbatch scripts on PATH) -----------------


def fake_sbatch(tmp_path, body):
    """A directory holding only an executable `sbatch` with this shell body (which finds the
    usual tools on the system's default PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sbatch"
    script.write_text(f"#!/bin/sh\nPATH={os.defpath}\n{body}")
    script.chmod(0o755)
    return bin_dir


def test_submit_without_sbatch_on_path(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert main(["sbatch", "--submit", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("hpccomm: sbatch: cannot submit: no `sbatch` command on PATH")


def test_submit_failure_shows_sbatch_stderr(tmp_path, monkeypatch, capsys):
    msg = "sbatch: error: Batch job submission failed: Invalid partition name specified"
    bin_dir = fake_sbatch(tmp_path, f"cat >/dev/null\necho '{msg}' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    assert main(["sbatch", "--partition", "nope", "--submit", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err == f"hpccomm: sbatch: submission failed: sbatch exited with status 1: {msg}\n"


def test_submit_is_time_bounded(tmp_path, monkeypatch, capsys):
    bin_dir = fake_sbatch(tmp_path, "exec sleep 30\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    start = time.monotonic()
    assert main(["sbatch", "--submit", "--submit-timeout", "0.5", "--", "true"]) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "sbatch: submission timed out: sbatch did not answer within 0.5 s" in err
    assert "squeue" in err  # whether the job went in is unknown: the message says how to look


def test_submit_timeout_from_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(fake_sbatch(tmp_path, "exec sleep 30\n")))
    monkeypatch.setenv("HPCCOMM_SBATCH_TIMEOUT", "0.5")
    assert main(["sbatch", "--submit", "--", "true"]) == 2
    assert "did not answer within 0.5 s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "text"),
    [
        (["--submit-timeout", "0"], None, "--submit-timeout is 0.0, expected seconds > 0"),
        ([], "soon", "HPCCOMM_SBATCH_TIMEOUT is 'soon', expected seconds > 0"),
        ([], "-1", "HPCCOMM_SBATCH_TIMEOUT is '-1', expected seconds > 0"),
    ],
)
def test_submit_timeout_refused(argv, env, text, monkeypatch, capsys):
    if env is not None:
        monkeypatch.setenv("HPCCOMM_SBATCH_TIMEOUT", env)
    assert main(["sbatch", *argv, "--submit", "--", "true"]) == 2
    assert text in capsys.readouterr().err


def test_submit_passes_the_script_and_prints_the_job_id(tmp_path, monkeypatch, capsys):
    got = tmp_path / "stdin.txt"
    bin_dir = fake_sbatch(tmp_path, f"cat >'{got}'\necho '4242;cluster'\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    assert main(["sbatch", "-N", "2", "--submit", "--", "hpccomm", "info"]) == 0
    assert capsys.readouterr().out == "4242\n"
    assert got.read_text() == render(BatchOptions(command=["hpccomm", "info"], nodes=2))


def test_submit_function_raises_typed_errors(tmp_path):
    with pytest.raises(HpccommError, match=r"cannot submit: no `.*/nothing-here` command \("):
        submit("#!/bin/bash\n", sbatch=str(tmp_path / "nothing-here"))
    bin_dir = fake_sbatch(tmp_path, "exec sleep 30\n")
    with pytest.raises(CommTimeoutError, match=r"did not answer within 0.2 s"):
        submit("#!/bin/bash\n", sbatch=str(bin_dir / "sbatch"), timeout=0.2)


# --- a control character in a value would write its own lines into the script ----------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--job-name", "a\n#SBATCH --x"),
        ("--partition", "gpu\n#SBATCH --exclusive"),
        ("--account", "abc\r"),
        ("--output", "o.out\nrm -rf ~"),
        ("--time", "1:00:00\n#SBATCH --x"),
        ("--array", "0-3\x00"),
        ("--extra", "#SBATCH --exclusive\n#SBATCH --x"),
    ],
)
def test_control_characters_are_refused(option, value, capsys):
    assert main(["sbatch", f"{option}={value}", "--", "true"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        f"sbatch: {option} is {value!r}, expected text without control characters" in captured.err
    )


@pytest.mark.parametrize("word", ["a\nb", "tab\there", "\x1b[2J"])
def test_control_characters_in_the_command_are_refused(word, capsys):
    assert main(["sbatch", "--", "echo", "ok", word]) == 2
    assert (
        f"sbatch: command word 3 is {word!r}, expected text without control characters"
        in capsys.readouterr().err
    )


def test_control_characters_refused_by_render():
    with pytest.raises(InvalidArgumentError, match=r"--job-name is 'a\\n#SBATCH --x'"):
        render(BatchOptions(command=["true"], job_name="a\n#SBATCH --x"))


def test_values_with_spaces_are_quoted_and_double_quotes_refused():
    # sbatch splits an #SBATCH directive at whitespace unless the value is in double quotes
    text = render(BatchOptions(command=["hostname"], job_name="my job", output="/tmp/a b/%j.out",
                               partition="p1"))  # fmt: skip
    assert '#SBATCH --job-name="my job"' in text.splitlines()
    assert '#SBATCH --output="/tmp/a b/%j.out"' in text.splitlines()
    assert "#SBATCH --partition=p1" in text.splitlines()
    with pytest.raises(InvalidArgumentError, match=r"--job-name is 'a\"b', expected text without"):
        validate(BatchOptions(command=["hostname"], job_name='a"b'))


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_job_name_is_refused(capsys, name):
    # --job-name '' wrote "#SBATCH --job-name="
    assert main(["sbatch", "--job-name", name, "--", "true"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"hpccomm: sbatch: --job-name is {name!r}, expected a name (not empty or blank; "
        f"'#SBATCH --job-name=' names no job)\n"
    )


@pytest.mark.parametrize("array", ["0-15", "1,3,5", "0-15:4", "0-15%4", "1-7:2,10%2", "7"])
def test_slurm_arrays_are_written(array, capsys):
    assert main(["sbatch", "--array", array, "--", "true"]) == 0
    assert f"#SBATCH --array={array}" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("array", "why"),
    [
        ("", "item '' is neither an index nor a LO-HI[:STEP] range"),
        ("x", "item 'x' is neither an index nor a LO-HI[:STEP] range"),
        ("1,,2", "item '' is neither"),
        ("5:2", "item '5:2' is neither"),
        ("0-1\u0663", "item '0-1\u0663' is neither"),  # another script's digit
        ("15-0", "range '15-0' ends below its start"),
        ("0-15:0", "range '0-15:0' has step 0, expected 1 or more"),
        ("0-15%0", "%0 lets no task run"),
        ("0-15%", "% is not a count of tasks"),
        ("0-15%4%2", "%4%2 is not a count of tasks"),
    ],
)
def test_an_array_that_is_not_slurm_syntax_is_refused(capsys, array, why):
    # --array was written into the script unchecked
    assert main(["sbatch", "--array", array, "--", "true"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"hpccomm: sbatch: --array {array!r} is not a Slurm array: ")
    assert why in captured.err
    assert captured.err.endswith(
        "; expected index lists and LO-HI[:STEP] ranges, then an optional %MAX, e.g. 0-15, "
        "1,3,5, 0-15:4, 0-15%4\n"
    )
    assert len(captured.err.splitlines()) == 1
