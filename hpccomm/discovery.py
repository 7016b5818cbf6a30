"""Launch discovery: this process's place in the job, read from the environment only.

Imports neither mpi4py nor CuPy. The launcher that started this process is found with the
precedence of ``shared/reference/launchers.md`` (the innermost launcher wins) and every field is
taken from that launcher's row; fields the launcher does not export are left ``None`` and filled
from MPI by :func:`hpccomm.init`.

Slurm's per-task variables are trusted only where Slurm wrote them for this process: in an srun
step (srun sets SLURM_STEP_ID and SLURM_STEP_NUM_TASKS in every task) or in the batch shell
(task 0). Anywhere else they were inherited or copied from another process and are ignored,
with a warning that says what was found and why.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import hostlist
from .errors import GpuBindingError, InvalidArgumentError
from .gpuselect import choose_gpu, parse_visible_devices, sharing_allowed

__all__ = ["LaunchInfo", "discover", "FIELDS"]

FIELDS = (
    "launcher",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "node_index",
    "num_nodes",
    "nodelist",
    "hostname",
    "job_id",
    "array_task_id",
    "visible_gpus",
    "gpu",
)

# Fields a launcher may leave unset, which init() fills from MPI.
MPI_FIELDS = frozenset(
    {"rank", "size", "local_rank", "local_size", "node_index", "num_nodes", "nodelist"}
)


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job. ``sources[field]`` names where each value came from.

    A field that is ``None`` is not known from the environment; :func:`hpccomm.init` fills it
    from MPI (``sources`` then says ``MPI ...``).
    """

    launcher: str
    rank: int | None
    size: int | None
    local_rank: int | None
    local_size: int | None
    node_index: int | None
    num_nodes: int | None
    nodelist: tuple[str, ...] | None
    hostname: str
    job_id: str | None
    array_task_id: str | None
    visible_gpus: tuple[str, ...] | None
    gpu: int | None
    sources: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field, its source and the warnings."""
        out: dict[str, Any] = {name: getattr(self, name) for name in FIELDS}
        for key in ("nodelist", "visible_gpus"):
            if out[key] is not None:
                out[key] = list(out[key])
        out["sources"] = dict(self.sources)
        out["warnings"] = list(self.warnings)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def __str__(self) -> str:
        lines = []
        for name in FIELDS:
            value = getattr(self, name)
            if name == "nodelist" and value is not None:
                value = hostlist.compress(value) if value else "(empty)"
            if value is None:
                value = "(from MPI after init)" if name in MPI_FIELDS else "-"
            source = self.sources.get(name, "")
            lines.append(f"{name:>14}: {value}" + (f"   [{source}]" if source else ""))
        lines.extend(f"{'warning':>14}: {w}" for w in self.warnings)
        return "\n".join(lines)

    def replace(self, **changes: Any) -> LaunchInfo:
        return dataclasses.replace(self, **changes)


_DIGITS = re.compile(r"\s*[0-9]+\s*")
_COUNTS = ("size", "local_size", "num_nodes")
# (index, count): an index must be below its count when the launcher gives both
_BOUNDS = (("rank", "size"), ("local_rank", "local_size"), ("node_index", "num_nodes"))
# (part, whole): a count that cannot exceed another where the launcher's variables give both
# (a node holds at most every rank; every node of a launch runs at least one rank). Not
# where hpccomm set one itself: the batch shell is 1 process of a job of many nodes.
_WITHIN = (("local_size", "size"), ("num_nodes", "size"))
# counts that may describe the whole job rather than the step read beside them
_JOB_WIDE = frozenset({"SLURM_NNODES", "SLURM_JOB_NUM_NODES"})


class _Reader:
    """Reads typed values from the environment and remembers which variable each came from."""

    def __init__(self, env: Mapping[str, str], launcher: str) -> None:
        self.env = env
        self.launcher = launcher
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def int(self, name: str, *variables: str) -> None:
        for var in variables:
            raw = self.env.get(var)
            if raw is None or raw.strip() == "":
                continue
            # ASCII digits only: Python's int() also takes "1_0" (10) and other scripts' digits
            if not _DIGITS.fullmatch(raw):
                raise InvalidArgumentError(f"{self.where()}: {var}={raw!r} is not an integer >= 0")
            if len(raw.strip()) > 18:  # (beyond any job; 4,300 digits were int()'s own
                # ValueError, raised before MPI_Init on that rank alone)
                shown = raw.strip()
                shown = shown if len(shown) <= 40 else f"{shown[:20]}...({len(shown)} digits)"
                raise InvalidArgumentError(f"{self.where()}: {var}={shown!r} is too large")
            value = int(raw)
            if name in _COUNTS and value < 1:
                raise InvalidArgumentError(f"{self.where()}: {var}={raw!r}, expected a count >= 1")
            self.values[name] = value
            self.sources[name] = var
            return

    def where(self) -> str:
        """The start of an error: the launcher, and this process's rank (and the size) when
        a launcher variable has given it already ("launch discovery (openmpi, rank 1 of 2)")."""
        rank, size = self.values.get("rank"), self.values.get("size")
        if rank is None or self.sources.get("rank") not in self.env:  # not read from a variable
            return f"launch discovery ({self.launcher})"
        of = f" of {size}" if size is not None and rank < size else ""
        return f"launch discovery ({self.launcher}, rank {rank}{of})"

    def hosts(self, name: str, var: str) -> bool:
        """Read the Slurm hostlist in ``var`` into ``name``; False when it is unset or empty."""
        raw = self.env.get(var)
        if not raw:
            return False
        try:
            names = tuple(hostlist.expand(raw))
        except ValueError as exc:
            raise InvalidArgumentError(
                f"{self.where()}: {var}={raw!r} is not a Slurm hostlist: {exc}"
            ) from None
        self.set(name, names, var)
        return True

    def tasks_per_node(self, var: str) -> list[builtins.int]:
        """The expanded tasks-per-node list in ``var`` (e.g. ``"2(x3),1"``)."""
        raw = self.env[var]
        try:
            return hostlist.expand_tasks_per_node(raw)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"{self.where()}: {var}={raw!r} is not a Slurm tasks-per-node list: {exc}"
            ) from None

    def set(self, name: str, value: Any, source: str) -> None:
        self.values[name] = value
        self.sources[name] = source

    def warn(self, text: str) -> None:
        self.values.setdefault("warnings", []).append(text)


def _torchrun(r: _Reader) -> None:
    r.int("rank", "RANK")
    r.int("size", "WORLD_SIZE")
    r.int("local_rank", "LOCAL_RANK")
    r.int("local_size", "LOCAL_WORLD_SIZE")
    r.int("node_index", "GROUP_RANK")
    r.int("num_nodes", "GROUP_WORLD_SIZE")


def _mpi_world(prefix: str) -> Callable[[_Reader], None]:
    def read(r: _Reader) -> None:
        r.int("rank", f"{prefix}_RANK")
        r.int("size", f"{prefix}_SIZE")
        r.int("local_rank", f"{prefix}_LOCAL_RANK")
        r.int("local_size", f"{prefix}_LOCAL_SIZE")

    return read


def _pals(r: _Reader) -> None:
    r.int("rank", "PALS_RANKID")
    r.int("size", "PMI_SIZE")
    r.int("local_rank", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK")
    r.int("local_size", "PMI_LOCAL_SIZE")
    r.int("node_index", "PALS_NODEID")


def _hydra(r: _Reader) -> None:
    r.int("rank", "PMI_RANK", "PMI_ID")
    r.int("size", "PMI_SIZE")
    r.int("local_rank", "MPI_LOCALRANKID")
    r.int("local_size", "MPI_LOCALNRANKS")


# srun writes both into every task it starts (Slurm's env_array_for_step); the batch shell and
# an salloc shell have neither.
_STEP_VARS = ("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS")
# The batch script's own step id (SLURM_BATCH_SCRIPT, 0xfffffffb), which the batch shell of
# Slurm >= 26.05 exports, printed signed: it marks the batch shell, not an srun step.
_BATCH_STEP_IDS = frozenset({"-5", "4294967291"})
# Slurm's per-task variables that would give rank, size or local rank: what a warning lists.
_TASK_VARS = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_STEP_ID",
    "SLURM_STEP_NUM_TASKS",
)


def _step_vars(env: Mapping[str, str]) -> list[str]:
    """Which of srun's step variables are present (the batch script's step id is none)."""
    return [
        var
        for var in _STEP_VARS
        if var in env and not (var == "SLURM_STEP_ID" and env[var].strip() in _BATCH_STEP_IDS)
    ]


def _not_this_process(env: Mapping[str, str]) -> str | None:
    """Why Slurm's task variables here cannot have been written for this process (it is
    neither a task of an srun step nor the batch shell), or None when they can be, or are
    absent."""
    present = _step_vars(env)
    if len(present) == 1:
        (have,) = present
        (lack,) = (var for var in _STEP_VARS if var != have)
        return (
            f"this process is not a task of an srun step ({have} is set but {lack} is not; srun "
            f"sets both in every task, a batch or salloc shell neither)"
        )
    if present:
        return None
    task_ids = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")
    not_zero = [f"{v}={env[v]}" for v in task_ids if env.get(v, "").strip() not in ("", "0")]
    if not_zero:
        return (
            f"this process is not a task of an srun step ({' and '.join(_STEP_VARS)}, which srun "
            f"sets in every task, are missing) nor the batch shell (task 0; here "
            f"{', '.join(not_zero)})"
        )
    return None


def _srun_step(r: _Reader) -> None:
    env = r.env
    r.int("rank", "SLURM_PROCID")
    r.int("size", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    r.int("local_rank", "SLURM_LOCALID")
    r.int("node_index", "SLURM_NODEID")
    r.int("num_nodes", "SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    for var in ("SLURM_STEP_NODELIST", "SLURM_NODELIST"):
        if r.hosts("nodelist", var):
            break
    node = r.values.get("node_index")
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(var) and node is not None:
            counts = r.tasks_per_node(var)
            if node >= len(counts):
                raise InvalidArgumentError(
                    f"{r.where()}: SLURM_NODEID={node} but {var}={env[var]!r} "
                    f"lists only {len(counts)} nodes"
                )
            # the step's own list against the step's own counts (the job-level fallback may
            # describe the allocation, not this step)
            size, nodes = r.values.get("size"), r.values.get("num_nodes")
            step = var == "SLURM_STEP_TASKS_PER_NODE" and r.sources.get("size") == (
                "SLURM_STEP_NUM_TASKS"
            )
            if step and (
                (size is not None and sum(counts) != size)
                or (
                    nodes is not None
                    and r.sources.get("num_nodes") == "SLURM_STEP_NUM_NODES"
                    and len(counts) != nodes
                )  # fmt: skip
            ):
                raise InvalidArgumentError(
                    f"{r.where()}: {var}={env[var]!r} lists {sum(counts)} tasks on "
                    f"{len(counts)} nodes, but the step has {size} tasks "
                    f"({r.sources.get('size')}) on {nodes} nodes ({r.sources.get('num_nodes')})"
                )
            if counts[node] < 1:  # (the README's rule for every size)
                raise InvalidArgumentError(
                    f"{r.where()}: {var}={env[var]!r} gives node {node} (SLURM_NODEID) "
                    f"{counts[node]} tasks, but this task runs there"
                )
            r.set("local_size", counts[node], f"{var}[SLURM_NODEID]")
            break
    # the step's own node list against the step's node count and this task's node index
    # (SLURM_JOB_NODELIST and the fallbacks may describe the allocation, not this step)
    hosts = r.values.get("nodelist")
    if hosts is not None and r.sources.get("nodelist") == "SLURM_STEP_NODELIST":
        listed = f"SLURM_STEP_NODELIST={env['SLURM_STEP_NODELIST']!r}"
        if node is not None and node >= len(hosts):
            raise InvalidArgumentError(
                f"{r.where()}: SLURM_NODEID={node} but {listed} lists only {len(hosts)} nodes"
            )
        nodes = r.values.get("num_nodes")
        if r.sources.get("num_nodes") == "SLURM_STEP_NUM_NODES" and nodes != len(hosts):
            raise InvalidArgumentError(
                f"{r.where()}: {listed} lists {len(hosts)} nodes, but SLURM_STEP_NUM_NODES="
                f"{nodes}; the launcher's variables contradict each other"
            )


def _pmi_only(r: _Reader) -> None:
    r.int("rank", "PMIX_RANK", "PMI_RANK")


def _batch_shell(r: _Reader) -> None:
    env = r.env
    # The batch shell is task 0 of the job (SLURM_PROCID=0); an salloc shell, or a login to one
    # of the job's nodes, has no task variables at all.
    batch = "SLURM_PROCID" in env
    how = "batch shell (no srun step)" if batch else "shell outside any srun step"
    for name, value in (("rank", 0), ("size", 1), ("local_rank", 0), ("local_size", 1)):
        r.set(name, value, how)
    r.set("node_index", 0, "batch shell runs on the first node" if batch else how)
    r.int("num_nodes", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    r.hosts("nodelist", "SLURM_JOB_NODELIST")
    job = env.get("SLURM_JOB_ID")
    found = f"SLURM_JOB_ID is set, {' and '.join(_STEP_VARS)} are not"
    if batch:
        what = f"this is the batch shell of Slurm job {job} ({found})"
    else:
        what = (
            f"this is a shell of Slurm job {job} outside any srun step (salloc, or a login to "
            f"one of the job's nodes: {found})"
        )
    ntasks = env.get("SLURM_NTASKS")
    alone = "it runs as 1 process" + (f", not as rank 0 of SLURM_NTASKS={ntasks}" if ntasks else "")
    r.warn(f"{what}: {alone}; launch the ranks with srun")


def _ignore_leftovers(r: _Reader) -> None:
    env = r.env
    found = ", ".join(f"{var}={env[var]}" for var in _TASK_VARS if var in env)
    job = f" (Slurm job {env['SLURM_JOB_ID']})" if env.get("SLURM_JOB_ID") else ""
    r.warn(
        f"ignored {found}{job}: {_not_this_process(env)}: they were inherited or copied from "
        f"another process (a shell inside an allocation, a container), so rank and size come "
        f"from MPI; if srun did start this process, pass the SLURM_STEP_* variables through"
    )


def _nothing(r: _Reader) -> None:
    pass


# The precedence table: (launcher name, detector, reader). The first row that matches wins.
_ROWS: tuple[tuple[str, Callable[[Mapping[str, str]], bool], Callable[[_Reader], None]], ...] = (
    (
        "torchrun",
        lambda e: "TORCHELASTIC_RUN_ID" in e or ("GROUP_RANK" in e and "LOCAL_WORLD_SIZE" in e),
        _torchrun,
    ),
    ("openmpi", lambda e: "OMPI_COMM_WORLD_RANK" in e, _mpi_world("OMPI_COMM_WORLD")),
    ("mvapich2", lambda e: "MV2_COMM_WORLD_RANK" in e, _mpi_world("MV2_COMM_WORLD")),
    ("pals", lambda e: "PALS_RANKID" in e, _pals),
    ("hydra", lambda e: "MPI_LOCALRANKID" in e, _hydra),
    ("slurm", lambda e: len(_step_vars(e)) == len(_STEP_VARS), _srun_step),
    ("pmi", lambda e: "PMIX_RANK" in e or "PMI_RANK" in e, _pmi_only),
    # Slurm task variables that no Slurm launch wrote for this process: ignored, with a warning.
    ("none", lambda e: _not_this_process(e) is not None, _ignore_leftovers),
    ("slurm-batch", lambda e: "SLURM_JOB_ID" in e, _batch_shell),
    ("none", lambda e: True, _nothing),
)

_JOB_ID_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "TORCHELASTIC_RUN_ID")


def discover(
    environ: Mapping[str, str] | None = None,
    *,
    gpu_count: int | None = None,
    hostname: str | None = None,
) -> LaunchInfo:
    """Describe this process's place in the job from the environment alone.

    Args:
        environ: the environment to read (default ``os.environ``); tests pass recorded ones.
        gpu_count: number of GPUs this process can see, used when ``CUDA_VISIBLE_DEVICES`` is
            unset (None: unknown, no GPU is chosen).
        hostname: this host's name (default ``socket.gethostname()``).

    Returns:
        A frozen :class:`LaunchInfo`; fields the launcher does not export are None.

    Raises:
        InvalidArgumentError: a launcher variable that should be an integer, a hostlist or a
            tasks-per-node list is malformed (the message names it and its value).
    """
    env = os.environ if environ is None else environ
    launcher, _, read = next(row for row in _ROWS if row[1](env))
    r = _Reader(env, launcher)
    read(r)
    v = r.values
    warnings = list(v.pop("warnings", []))
    sources = r.sources
    for index, count in _BOUNDS:
        i, n = v.get(index), v.get(count)
        if i is not None and n is not None and i >= n:
            raise InvalidArgumentError(
                f"{r.where()}: {index.replace('_', ' ')} {i} "
                f"({sources[index]}) is not below the {count.replace('_', ' ')} {n} "
                f"({sources[count]}); the launcher's variables contradict each other"
            )
    for part, whole in _WITHIN:
        n, total = v.get(part), v.get(whole)
        given = all(sources.get(f, "").split("[")[0] in env for f in (part, whole)) and (
            sources.get(part) not in _JOB_WIDE  # (the job's, where the step's is missing)
        )
        if n is not None and total is not None and n > total and given:
            raise InvalidArgumentError(
                f"{r.where()}: {part.replace('_', ' ')} {n} ({sources[part]}) is above the "
                f"{whole} {total} ({sources[whole]}); the launcher's variables contradict "
                f"each other"
            )

    job_id = array_task_id = None
    for var in _JOB_ID_VARS:
        if env.get(var):
            job_id = env[var]
            sources["job_id"] = var
            break
    if env.get("SLURM_ARRAY_TASK_ID"):
        array_task_id = env["SLURM_ARRAY_TASK_ID"]
        sources["array_task_id"] = "SLURM_ARRAY_TASK_ID"
        if env.get("SLURM_ARRAY_JOB_ID") and sources.get("job_id") == "SLURM_JOB_ID":
            # Slurm's name for an element, as squeue, sacct and scancel take it ("83_0");
            # the element's own SLURM_JOB_ID (84) read as array job 84's task 0
            job_id = f"{env['SLURM_ARRAY_JOB_ID']}_{array_task_id}"
            sources["job_id"] = "SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID"

    visible = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        sources["visible_gpus"] = "CUDA_VISIBLE_DEVICES"
    elif gpu_count is not None:
        visible = tuple(str(i) for i in range(gpu_count))
        sources["visible_gpus"] = "device count"
    gpu = None
    if visible is not None and v.get("local_rank") is not None and v.get("local_size") is not None:
        try:
            gpu = choose_gpu(
                len(visible), v["local_rank"], v["local_size"], allow_sharing=sharing_allowed(env)
            )
        except GpuBindingError as exc:
            warnings.append(str(exc))
        sources["gpu"] = "local rank and visible GPUs"

    return LaunchInfo(
        launcher=launcher,
        rank=v.get("rank"),
        size=v.get("size"),
        local_rank=v.get("local_rank"),
        local_size=v.get("local_size"),
        node_index=v.get("node_index"),
        num_nodes=v.get("num_nodes"),
        nodelist=v.get("nodelist"),
        hostname=hostname if hostname is not None else socket.gethostname(),
        job_id=job_id,
        array_task_id=array_task_id,
        visible_gpus=visible,
        gpu=gpu,
        sources=dict(sources),
        warnings=tuple(warnings),
    )
