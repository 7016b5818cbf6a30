"""What ``hpccomm info`` and ``hpccomm doctor`` print: the launch table and a correctness
check of every operation on the job's own ranks, each against a NumPy reference."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from . import memory
from .backends.shm import settings as shm_settings
from .comm import Communicator
from .debug import EAGER_ENV, large_bytes
from .dtypes import ReduceOp
from .errors import HpccommError
from .ops import P2POp

__all__ = [
    "gather_launch",
    "format_launch_table",
    "CheckResult",
    "run_checks",
    "format_checks",
    "CHECKS",
]


def gather_launch(comm: Communicator) -> list[dict] | None:
    """Every rank's verified launch description (as dicts, with its device path), on rank 0;
    None elsewhere."""
    info: dict[str, Any] = comm.launch.to_dict() if comm.launch is not None else {"rank": comm.rank}
    info["device"] = comm.device.describe()
    info["memory"] = f"freed memory kept mapped (reuse_memory): {memory.state()}"
    info["checks"] = _checks(comm)
    info["shm"] = _shm(comm)
    return comm.gather_object(info, dst=0)


def _shm(comm: Communicator) -> str:
    """The shared-memory fast path of the world group (its first use happens here: every
    rank of the job runs ``hpccomm info``)."""
    shm = comm._shm()
    if shm is None:
        settings = shm_settings()
        chunk = settings.chunk
        if comm.size < 2:
            why = "one rank"
        elif not settings.enabled:
            why = "HPCCOMM_SHM=0"
        elif comm.num_nodes == 1 and chunk // 16 < comm.size:
            why = (
                f"a chunk of {chunk:,} bytes is too small for {comm.size} ranks (HPCCOMM_SHM_CHUNK)"
            )
        else:  # pragma: no cover - for_group makes one in every other case
            why = "not made"
        return f"shared-memory fast path: off ({why})"
    return f"shared-memory fast path: {shm.describe('hpccomm info')}"


def _checks(comm: Communicator) -> str:
    """The debug level and, for "large", from which size collectives are compared."""
    level = comm.debug
    if level != "large":
        return f"debug level: {level}"
    eager = next((os.environ[n] for n in EAGER_ENV if n in os.environ), "Open MPI's default")
    return (
        f"debug level: large (collectives above {large_bytes():,} bytes compared across "
        f"ranks; node eager limit: {eager})"
    )


_COLUMNS = ("rank", "local", "node", "hostname", "launcher", "gpu", "job")


def format_launch_table(infos: list[dict]) -> str:
    """One line per rank, sorted by rank: rank, local rank/size, node index/count, host,
    launcher, GPU, job id; then every distinct warning once."""
    rows = [_COLUMNS]
    for d in sorted(infos, key=lambda d: d["rank"]):
        job = d.get("job_id") or "-"
        task = d.get("array_task_id")
        if task is not None and not job.endswith(f"_{task}"):  # (Slurm's names it already)
            job += f"[{task}]"
        rows.append(
            (
                str(d["rank"]),
                f"{d['local_rank']}/{d['local_size']}",
                f"{d['node_index']}/{d['num_nodes']}",
                d["hostname"],
                d["launcher"],
                "cpu" if d.get("gpu") is None else str(d["gpu"]),
                job,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(wd) for cell, wd in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    devices = sorted({d["device"] for d in infos if "device" in d})
    lines.extend(devices)
    lines.extend(sorted({d["memory"] for d in infos if "memory" in d}))
    lines.extend(sorted({d["checks"] for d in infos if "checks" in d}))
    lines.extend(sorted({d["shm"] for d in infos if "shm" in d}))
    notes = sorted({w for d in infos for w in d.get("warnings", ())})
    lines.extend(f"warning: {w}" for w in notes)
    return "\n".join(lines)


@dataclass(frozen=True)
class CheckResult:
    """One operation's check: the op, whether every rank passed, and the failing ranks'
    first error."""

    name: str
    ok: bool
    detail: str


class CheckFailed(HpccommError):
    """A doctor check computed a wrong result."""


def _expect(ok: object, detail: object) -> None:
    if not ok:
        raise CheckFailed(f"got {detail}")


def _c_all_reduce(c: Communicator) -> None:
    n, r = c.size, c.rank
    for dt in (np.int32, np.float64, np.complex128, np.float16, ml_dtypes.bfloat16):
        x = np.arange(5, dtype=dt) + r
        c.all_reduce(x)
        expect = np.arange(5) * n + n * (n - 1) // 2
        got = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
        _expect(np.array_equal(got, expect), f"{np.dtype(dt).name}: {x} != {expect}")
    x = np.array([r, -r], dtype=np.int64)
    c.all_reduce(x, op=ReduceOp.MAX)
    _expect(list(x) == [n - 1, 0], x)
    x = np.full(3, float(r))
    c.all_reduce(x, op=ReduceOp.AVG)
    _expect(np.allclose(x, (n - 1) / 2), x)


def _c_reduce(c: Communicator) -> None:
    root = c.size - 1
    x = np.full(4, c.rank + 1, dtype=np.int64)
    c.reduce(x, dst=root, op=ReduceOp.PRODUCT)
    expect = np.full(4, np.prod(np.arange(1, c.size + 1)))
    _expect(c.rank != root or np.array_equal(x, expect), x)


def _c_broadcast(c: Communicator) -> None:
    x = np.arange(6.0) if c.rank == 0 else np.zeros(6)
    c.broadcast(x, src=0)
    _expect(np.array_equal(x, np.arange(6.0)), x)


def _c_all_gather(c: Communicator) -> None:
    n, r = c.size, c.rank
    out = c.all_gather(np.full((2, 3), r, dtype=np.int16))
    _expect(np.array_equal(out, np.repeat(np.arange(n), 2)[:, None] * np.ones(3)), out)
    sizes = [i % 3 for i in range(n)]
    out = c.all_gather(np.full(sizes[r], r, dtype=np.float32), sizes=sizes)
    _expect(np.array_equal(out, np.repeat(np.arange(n), sizes)), out)


def _c_gather_scatter(c: Communicator) -> None:
    n, r = c.size, c.rank
    out = c.gather(np.array([r, r]), dst=0)
    _expect(r != 0 or np.array_equal(out, np.repeat(np.arange(n), 2)), out)
    full = np.arange(3 * n, dtype=np.float64) if r == 0 else None
    blk = c.scatter(full, src=0, out=np.empty(3))
    _expect(np.array_equal(blk, np.arange(3 * r, 3 * r + 3)), blk)


def _c_reduce_scatter(c: Communicator) -> None:
    n, r = c.size, c.rank
    out = c.reduce_scatter(np.arange(2 * n, dtype=np.float64))
    _expect(np.array_equal(out, n * np.arange(2 * r, 2 * r + 2)), out)
    sizes = [i + 1 for i in range(n)]
    total = sum(sizes)
    out = c.reduce_scatter(np.arange(total, dtype=np.int32), sizes=sizes)
    start = sum(sizes[:r])
    _expect(np.array_equal(out, n * np.arange(start, start + sizes[r])), out)


def _c_all_to_all(c: Communicator) -> None:
    n, r = c.size, c.rank
    out = c.all_to_all(np.arange(n) + 100 * r)
    _expect(np.array_equal(out, 100 * np.arange(n) + r), out)
    send = [(r + j) % 3 for j in range(n)]
    recv = [(j + r) % 3 for j in range(n)]
    x = np.concatenate([np.full(k, 10 * r + j) for j, k in enumerate(send)]).astype(np.int64)
    out = c.all_to_all_single(x, input_split_sizes=send, output_split_sizes=recv)
    expect = np.concatenate([np.full(k, 10 * j + r) for j, k in enumerate(recv)]).astype(np.int64)
    _expect(np.array_equal(out, expect), out)


def _c_barrier(c: Communicator) -> None:
    c.barrier()
    c.barrier(async_op=True).wait()


def _c_p2p(c: Communicator) -> None:
    n, r = c.size, c.rank
    right, left = (r + 1) % n, (r - 1) % n
    got = c.sendrecv(np.array([r, r]), dst=right, src=left)
    _expect(list(got) == [left, left], got)
    y = np.empty(3)
    c.batch_isend_irecv([P2POp("send", np.full(3, float(r)), right), P2POp("recv", y, left)]).wait()
    _expect(np.array_equal(y, np.full(3, float(left))), y)
    if n > 1:
        z = np.empty(1, dtype=np.int64)
        work = c.irecv(z, None)
        c.isend(np.array([r]), right).wait()
        _expect(work.wait() == left and z[0] == left, (z, left))


def _c_async(c: Communicator) -> None:
    x = np.ones(1000)
    work = c.all_reduce(x, async_op=True)
    _expect(work.wait(timeout=60) is x and x[0] == c.size, x[:3])
    _expect(work.is_completed(), "is_completed() False after wait()")


def _c_objects(c: Communicator) -> None:
    n, r = c.size, c.rank
    got = c.broadcast_object({"from": r}, src=0)
    _expect(got == {"from": 0}, got)
    got = c.all_gather_object(("r", r))
    _expect(got == [("r", i) for i in range(n)], got)
    got = c.scatter_object([i * i for i in range(n)] if r == 0 else None)
    _expect(got == r * r, got)
    got = c.gather_object(r, dst=0)
    _expect(r != 0 or got == list(range(n)), got)


CHECKS: tuple[tuple[str, Callable[[Communicator], None]], ...] = (
    ("all_reduce", _c_all_reduce),
    ("reduce", _c_reduce),
    ("broadcast", _c_broadcast),
    ("all_gather", _c_all_gather),
    ("gather/scatter", _c_gather_scatter),
    ("reduce_scatter", _c_reduce_scatter),
    ("all_to_all", _c_all_to_all),
    ("barrier", _c_barrier),
    ("send/recv", _c_p2p),
    ("async", _c_async),
    ("objects", _c_objects),
)


def run_checks(comm: Communicator, *, timeout: float = 60.0) -> list[CheckResult]:
    """Run every check on a duplicate of ``comm`` (bounded by ``timeout`` per operation);
    every rank returns the same results."""
    results = []
    with comm.dup() as c:
        c.timeout = timeout
        for name, check in CHECKS:
            try:
                check(c)
                error = ""
            except Exception as exc:  # report, never hide
                error = f"{type(exc).__name__}: {exc}".strip() or traceback.format_exc(limit=1)
            errors = c.all_gather_object(error)
            bad = [(i, e) for i, e in enumerate(errors) if e]
            detail = "" if not bad else f"ranks {[i for i, _ in bad]}: {bad[0][1]}"
            results.append(CheckResult(name, not bad, detail))
    return results


def format_checks(results: list[CheckResult], size: int) -> str:
    lines = [
        f"{'PASS' if r.ok else 'FAIL'}  {r.name}" + (f"  ({r.detail})" if r.detail else "")
        for r in results
    ]
    failed = sum(not r.ok for r in results)
    lines.append(
        f"doctor: {len(results) - failed} of {len(results)} operations passed on {size} ranks"
    )
    return "\n".join(lines)
