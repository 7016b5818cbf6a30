"""Render, check and submit Slurm batch scripts (``hpccomm sbatch``).

Values are checked before anything is submitted; each error names the option. Refusals are
:class:`~hpccomm.errors.InvalidArgumentError`; a submission that fails is an
:class:`~hpccomm.errors.HpccommError`, one that does not finish in time a
:class:`~hpccomm.errors.CommTimeoutError`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import CommTimeoutError, HpccommError, InvalidArgumentError
from .ops import as_int

__all__ = [
    "BatchOptions",
    "render",
    "validate",
    "submit",
    "MPI_PLUGINS",
    "parse_time",
    "SUBMIT_TIMEOUT",
]

# Seconds `submit` waits for sbatch by default: a hung slurmctld must not hang the caller.
SUBMIT_TIMEOUT = 60.0

# srun --mpi values: pmix for Open MPI >= 3.1 (and MPICH >= 4), pmi2 for MPICH / Intel MPI,
# cray_shasta for Cray PALS, none for launchers that bring their own (torchrun).
MPI_PLUGINS = ("pmix", "pmix_v4", "pmix_v5", "pmi2", "cray_shasta", "none")

# ASCII digits only, the whole text (re.fullmatch: "$" also matched before a final newline)
_TIME_FORMS = (
    re.compile(r"(?P<m>[0-9]+)"),
    re.compile(r"(?P<m>[0-9]+):(?P<s>[0-9]+)"),
    re.compile(r"(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)"),
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+)"),
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+)"),
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)"),
)


def _integer(value: object) -> bool:
    """An integer, NumPy's too, not a bool (True is 1 to isinstance: --nodes True made a
    1-node script); as ops.as_int, which the collectives' arguments use."""
    return as_int(value) is not None


def parse_time(text: str) -> int | None:
    """Seconds in a Slurm time limit ("30", "1:00:00", "2-12", ...); None for unlimited.

    Raises:
        InvalidArgumentError: naming --time and the forms Slurm accepts.
    """
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    for form in _TIME_FORMS:
        m = form.fullmatch(text)
        if m:
            g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
            if g.get("s", 0) >= 60 or (
                ("h" in g and ("m" in g or "d" in g)) and g.get("m", 0) >= 60
            ):
                break
            return ((g.get("d", 0) * 24 + g.get("h", 0)) * 60 + g.get("m", 0)) * 60 + g.get("s", 0)
    raise InvalidArgumentError(
        f"sbatch: --time {text!r} is not a Slurm time; use minutes, MM:SS, HH:MM:SS, D-HH, "
        f"D-HH:MM or D-HH:MM:SS (e.g. 30, 1:00:00, 2-12:00)"
    )


@dataclass
class BatchOptions:
    """What a batch script asks Slurm for, and the command it runs on every task."""

    command: Sequence[str]
    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    time: str = "00:30:00"
    partition: str | None = None
    account: str | None = None
    job_name: str = "hpccomm"
    output: str | None = None
    mpi: str = "pmix"
    array: str | None = None
    extra: Sequence[str] = field(default_factory=list)


# Every text value lands in the script: a control character (a newline above all) would write
# a line of its own, e.g. an extra #SBATCH directive or a shell command.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TEXT_OPTIONS = ("job_name", "partition", "account", "output", "time", "array", "mpi")


def _check_text(what: str, value: object) -> None:
    if isinstance(value, str) and _CONTROL.search(value):
        raise InvalidArgumentError(
            f"sbatch: {what} is {value!r}, expected text without control characters (a newline "
            f"would write a line of its own into the script)"
        )


# values written into #SBATCH lines: sbatch splits a directive at whitespace unless the value
# is in double quotes ('--job-name=my job' is "Invalid directive found in batch script: job")
_DIRECTIVE_OPTIONS = ("job_name", "partition", "account", "output", "array")


def _directive(name: str, value: object) -> str:
    text = str(value)
    if any(c.isspace() for c in text):
        text = f'"{text}"'
    return f"#SBATCH --{name}={text}"


# sbatch --array: a comma list of indices and LO-HI ranges (a range may take a :STEP), then
# an optional %N, the most array tasks to run at once: 0-15, 1,3,5, 0-15:4, 0-15%4, 1-7:2,10%2
_ARRAY_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")  # ASCII digits only
_ARRAY_FORM = (
    "index lists and LO-HI[:STEP] ranges, then an optional %MAX, e.g. 0-15, 1,3,5, 0-15:4, 0-15%4"
)


def _check_array(text: str) -> None:
    """Refuse an --array that is not Slurm's syntax (naming the item and what was expected)."""
    spec, percent, limit = text.partition("%")
    why = None
    if percent and not re.fullmatch(r"[0-9]+", limit):
        why = f"%{limit} is not a count of tasks"
    elif percent and int(limit) < 1:
        why = f"%{limit} lets no task run"
    for item in spec.split(","):
        if why is not None:
            break
        m = _ARRAY_ITEM.fullmatch(item)
        if m is None:
            why = f"item {item!r} is neither an index nor a LO-HI[:STEP] range"
        elif m.group(2) is not None and int(m.group(2)) < int(m.group(1)):
            why = f"range {item!r} ends below its start"
        elif m.group(3) is not None and int(m.group(3)) < 1:
            why = f"range {item!r} has step {m.group(3)}, expected 1 or more"
    if why is not None:
        raise InvalidArgumentError(
            f"sbatch: --array {text!r} is not a Slurm array: {why}; expected {_ARRAY_FORM}"
        )


def validate(opts: BatchOptions) -> None:
    """Check every option; nothing is rendered or submitted before this passes.

    Raises:
        InvalidArgumentError: naming the first bad option, its value and what was expected.
    """
    for name in _TEXT_OPTIONS:
        _check_text(f"--{name.replace('_', '-')}", getattr(opts, name))
    for name in _DIRECTIVE_OPTIONS:
        value = getattr(opts, name)
        if isinstance(value, str) and '"' in value:
            raise InvalidArgumentError(
                f"sbatch: --{name.replace('_', '-')} is {value!r}, expected text without a "
                f"double quote (the #SBATCH line quotes a value with spaces in double quotes)"
            )
    if not opts.job_name or not opts.job_name.strip():
        raise InvalidArgumentError(
            f"sbatch: --job-name is {opts.job_name!r}, expected a name (not empty or blank; "
            f"'#SBATCH --job-name=' names no job)"
        )
    if opts.array is not None:
        _check_array(opts.array)
    for line in opts.extra:
        _check_text("--extra", line)
    for i, word in enumerate(opts.command, 1):
        _check_text(f"command word {i}", word)
    for name in ("nodes", "ntasks_per_node"):
        value = getattr(opts, name)
        if not _integer(value) or value < 1:
            raise InvalidArgumentError(
                f"sbatch: --{name.replace('_', '-')} is {value!r}, expected an integer >= 1"
            )
    for name in ("gpus_per_node", "gpus_per_task", "cpus_per_task"):
        value = getattr(opts, name)
        if value is not None and (not _integer(value) or value < 1):
            raise InvalidArgumentError(
                f"sbatch: --{name.replace('_', '-')} is {value!r}, expected an integer >= 1"
            )
    parse_time(opts.time)
    if opts.gpus_per_task and opts.gpus_per_node:
        need = opts.gpus_per_task * opts.ntasks_per_node
        if need > opts.gpus_per_node:
            raise InvalidArgumentError(
                f"sbatch: --gpus-per-task {opts.gpus_per_task} x --ntasks-per-node "
                f"{opts.ntasks_per_node} = {need} GPUs, but --gpus-per-node is {opts.gpus_per_node}"
            )
    if opts.mpi not in MPI_PLUGINS:
        raise InvalidArgumentError(
            f"sbatch: --mpi {opts.mpi!r} is not a Slurm MPI plug-in; known: {', '.join(MPI_PLUGINS)}"
        )
    if not opts.command:
        raise InvalidArgumentError(
            "sbatch: no command given (put it after --, e.g. -- hpccomm doctor)"
        )
    for line in opts.extra:
        if not line.startswith("#SBATCH "):
            raise InvalidArgumentError(f"sbatch: --extra {line!r} must be an '#SBATCH ...' line")


def render(opts: BatchOptions) -> str:
    """The batch script text (validated first).

    Raises:
        InvalidArgumentError: from :func:`validate`, before any text is made.
    """
    validate(opts)
    d = [
        "#!/bin/bash",
        "# Generated by `hpccomm sbatch`: one task per rank, launched by srun.",
        _directive("job-name", opts.job_name),
    ]
    d.append(f"#SBATCH --nodes={opts.nodes}")
    d.append(f"#SBATCH --ntasks-per-node={opts.ntasks_per_node}")
    if opts.cpus_per_task:
        d.append(f"#SBATCH --cpus-per-task={opts.cpus_per_task}")
    if opts.gpus_per_node:
        d.append(f"#SBATCH --gpus-per-node={opts.gpus_per_node}")
    if opts.gpus_per_task:
        d.append(f"#SBATCH --gpus-per-task={opts.gpus_per_task}")
    d.append(f"#SBATCH --time={opts.time}")
    for name in ("partition", "account", "output", "array"):
        value = getattr(opts, name)
        if value:
            d.append(_directive(name, value))
    d.extend(opts.extra)
    d += ["", "set -euo pipefail"]
    # (also without --cpus-per-task: `sbatch -c 8 job.sh` sets it at submission, and the
    # script gave each rank 1 thread, and 1 CPU under Slurm 22.05-23.02; an outside hunt)
    d.append("export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}")
    d.append(
        "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}  # Slurm 22.05-23.02: srun does not inherit it"
    )
    if opts.gpus_per_node or opts.gpus_per_task:
        d.append("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
        d.append("export NCCL_DEBUG=${NCCL_DEBUG:-WARN}")
    d.append("")
    # A task that dies or fails ends the whole step (srun's default lets the others run on,
    # stuck in their next collective with the dead rank).
    d.append(f"srun --mpi={opts.mpi} --kill-on-bad-exit=1 {shlex.join(opts.command)}")
    return "\n".join(d) + "\n"


def submit(script: str, *, sbatch: str = "sbatch", timeout: float = SUBMIT_TIMEOUT) -> str:
    """Submit with ``sbatch --parsable``; return the job id.

    Args:
        script: the batch script text (sent on sbatch's standard input).
        sbatch: the sbatch command (looked up on PATH).
        timeout: seconds to wait for sbatch before giving up (a hung slurmctld).

    Raises:
        HpccommError: sbatch is not there, cannot run, or refused the job (its message
            included).
        CommTimeoutError: sbatch did not answer within ``timeout`` seconds; it is killed, and
            whether the job went in is unknown.
    """
    try:
        out = subprocess.run(
            [sbatch, "--parsable"], input=script, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        raise HpccommError(
            f"sbatch: cannot submit: no `{sbatch}` command{'' if os.sep in sbatch else ' on PATH'} "
            f"(Slurm's client commands are needed here; or write the script with -o and submit "
            f"it where Slurm is)"
        ) from None
    except subprocess.TimeoutExpired:
        raise CommTimeoutError(
            f"sbatch: submission timed out: {sbatch} did not answer within {timeout:g} s (is "
            f"slurmctld up? `sinfo` tells); it was stopped, so whether the job went in is "
            f"unknown: look with `squeue --me`"
        ) from None
    except OSError as exc:
        raise HpccommError(f"sbatch: cannot submit: cannot run {sbatch}: {exc}") from None
    said = "; ".join(line.strip() for line in out.stderr.splitlines() if line.strip())
    if out.returncode != 0:
        raise HpccommError(
            f"sbatch: submission failed: {sbatch} exited with status {out.returncode}: "
            f"{said or '(no message)'}"
        )
    job = out.stdout.strip().split(";")[0]
    if not job:
        raise HpccommError(
            f"sbatch: submission failed: {sbatch} exited with status 0 but printed no job id "
            f"(stdout {out.stdout!r}, stderr {said!r})"
        )
    return job
