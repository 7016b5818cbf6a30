"""What ``hpccomm info`` and ``hpccomm doctor`` print: the launch table and a correctness
check of every operation on the job's own ranks, each against a NumPy reference."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import ml_dtypes
import numpy as np

from . import arena, memory, profiler
from .backends.shm import settings as shm_settings
from .comm import Communicator
from .debug import EAGER_ENV, large_bytes
from .dtypes import ReduceOp
from .errors import InvalidArgumentError
from .ops import P2POp
from .record import CallLog

__all__ = [
    "gather_launch",
    "format_launch_table",
    "Check",
    "CheckResult",
    "run_checks",
    "format_checks",
    "format_stuck",
    "leave",
    "CHECKS",
    "GRACE",
]


def gather_launch(comm: Communicator) -> list[dict] | None:
    """Every rank's verified launch description (as dicts, with its device path), on rank 0;
    None elsewhere."""
    info: dict[str, Any] = comm.launch.to_dict() if comm.launch is not None else {"rank": comm.rank}
    info["device"] = comm.device.describe()
    info["memory"] = f"freed memory kept mapped (reuse_memory): {memory.state()}"
    info["arena"] = f"arena allocator ({arena.ENV}): {arena.state()}"
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
    lines.extend(sorted({d["arena"] for d in infos if "arena" in d}))
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
    paths: str = ""  # the backends that ran the check's calls on rank 0 ("shm 5, mpi 2")
    large: bool = False  # a check of large arrays: its line shows ``paths``
    stuck: tuple[int, ...] = ()  # ranks where a call of the check never completed (timed out)


def _expect(found: list[str], ok: object, detail: object) -> None:
    """A wrong result goes into ``found`` (the check goes on: every rank must make the same
    calls, or a rank that stopped at its first wrong result would leave its peers in a call
    it never makes)."""
    if not ok:
        found.append(f"got {detail}")


def _c_all_reduce(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    for dt in (np.int32, np.float64, np.complex128, np.float16, ml_dtypes.bfloat16):
        x = np.arange(5, dtype=dt) + r
        c.all_reduce(x)
        expect = np.arange(5) * n + n * (n - 1) // 2
        got = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
        _expect(found, np.array_equal(got, expect), f"{np.dtype(dt).name}: {x} != {expect}")
    x = np.array([r, -r], dtype=np.int64)
    c.all_reduce(x, op=ReduceOp.MAX)
    _expect(found, list(x) == [n - 1, 0], x)
    x = np.full(3, float(r))
    c.all_reduce(x, op=ReduceOp.AVG)
    _expect(found, np.allclose(x, (n - 1) / 2), x)


def _c_reduce(c: Communicator, found: list[str]) -> None:
    root = c.size - 1
    x = np.full(4, c.rank + 1, dtype=np.int64)
    c.reduce(x, dst=root, op=ReduceOp.PRODUCT)
    expect = np.full(4, np.prod(np.arange(1, c.size + 1)))
    _expect(found, c.rank != root or np.array_equal(x, expect), x)


def _c_broadcast(c: Communicator, found: list[str]) -> None:
    x = np.arange(6.0) if c.rank == 0 else np.zeros(6)
    c.broadcast(x, src=0)
    _expect(found, np.array_equal(x, np.arange(6.0)), x)


def _c_all_gather(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    out = c.all_gather(np.full((2, 3), r, dtype=np.int16))
    _expect(found, np.array_equal(out, np.repeat(np.arange(n), 2)[:, None] * np.ones(3)), out)
    sizes = [i % 3 for i in range(n)]
    out = c.all_gather(np.full(sizes[r], r, dtype=np.float32), sizes=sizes)
    _expect(found, np.array_equal(out, np.repeat(np.arange(n), sizes)), out)


def _c_gather_scatter(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    out = c.gather(np.array([r, r]), dst=0)
    _expect(found, r != 0 or np.array_equal(out, np.repeat(np.arange(n), 2)), out)
    full = np.arange(3 * n, dtype=np.float64) if r == 0 else None
    blk = c.scatter(full, src=0, out=np.empty(3))
    _expect(found, np.array_equal(blk, np.arange(3 * r, 3 * r + 3)), blk)


def _c_reduce_scatter(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    out = c.reduce_scatter(np.arange(2 * n, dtype=np.float64))
    _expect(found, np.array_equal(out, n * np.arange(2 * r, 2 * r + 2)), out)
    sizes = [i + 1 for i in range(n)]
    total = sum(sizes)
    out = c.reduce_scatter(np.arange(total, dtype=np.int32), sizes=sizes)
    start = sum(sizes[:r])
    _expect(found, np.array_equal(out, n * np.arange(start, start + sizes[r])), out)


def _c_all_to_all(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    out = c.all_to_all(np.arange(n) + 100 * r)
    _expect(found, np.array_equal(out, 100 * np.arange(n) + r), out)
    send = [(r + j) % 3 for j in range(n)]
    recv = [(j + r) % 3 for j in range(n)]
    x = np.concatenate([np.full(k, 10 * r + j) for j, k in enumerate(send)]).astype(np.int64)
    out = c.all_to_all_single(x, input_split_sizes=send, output_split_sizes=recv)
    expect = np.concatenate([np.full(k, 10 * j + r) for j, k in enumerate(recv)]).astype(np.int64)
    _expect(found, np.array_equal(out, expect), out)


def _c_barrier(c: Communicator, found: list[str]) -> None:
    c.barrier()
    c.barrier(async_op=True).wait()


def _c_p2p(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    right, left = (r + 1) % n, (r - 1) % n
    got = c.sendrecv(np.array([r, r]), dst=right, src=left)
    _expect(found, list(got) == [left, left], got)
    y = np.empty(3)
    c.batch_isend_irecv([P2POp("send", np.full(3, float(r)), right), P2POp("recv", y, left)]).wait()
    _expect(found, np.array_equal(y, np.full(3, float(left))), y)
    if n > 1:
        z = np.empty(1, dtype=np.int64)
        work = c.irecv(z, None)
        c.isend(np.array([r]), right).wait()
        _expect(found, work.wait() == left and z[0] == left, (z, left))


def _c_async(c: Communicator, found: list[str]) -> None:
    x = np.ones(1000)
    work = c.all_reduce(x, async_op=True)
    _expect(found, work.wait(timeout=60) is x and x[0] == c.size, x[:3])
    _expect(found, work.is_completed(), "is_completed() False after wait()")


def _c_objects(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    got = c.broadcast_object({"from": r}, src=0)
    _expect(found, got == {"from": 0}, got)
    got = c.all_gather_object(("r", r))
    _expect(found, got == [("r", i) for i in range(n)], got)
    got = c.scatter_object([i * i for i in range(n)] if r == 0 else None)
    _expect(found, got == r * r, got)
    got = c.gather_object(r, dst=0)
    _expect(found, r != 0 or got == list(range(n)), got)


# -- large arrays: the sizes where the cross-rank check, MPI's rendezvous protocol and the
# shared-memory fast path (single copy, symmetric buffers) take over, with odd element counts
# (pieces and chunks end mid-way), pseudo-random data seeded by rank, integers that overflow
# and wrap, NaN and inf; every result against NumPy, exactly (integer-valued floats sum
# exactly in any order, so the check does not depend on the path's association order).
# A tiny array with a pattern (values 0..3, say) can come out right from a wrong operation.
_SEED = 0x646F63  # "doc"
_MIB = 1 << 20
_ODD = 3  # elements past a round size: the last piece or chunk is partial


def _data(rank: int, what: str, dtype: Any, count: int) -> np.ndarray:
    """Rank ``rank``'s input for check ``what``: every rank makes every rank's (the
    reference needs them), alike on each. Integers take their dtype's whole range (sums
    wrap); floats are integers small enough that any order of summing is exact."""
    rng = np.random.default_rng([_SEED, rank, sum(map(ord, what))])
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)
    bound = 8 if dt.itemsize <= 2 else 1 << 20  # (bfloat16/float16: 8 bits of mantissa)
    return rng.integers(-bound, bound, count).astype(dt)


def _inputs(c: Communicator, what: str, dtype: Any, count: int) -> list[np.ndarray]:
    return [_data(j, what, dtype, count) for j in range(c.size)]


def _floating(dtype: Any) -> bool:
    return np.dtype(dtype).kind not in "biu"  # (bfloat16's kind is "V")


def _same(
    found: list[str], got: np.ndarray, want: np.ndarray, what: str, *, moved: bool = False
) -> None:
    """Bitwise equal, except that any NaN matches any NaN where values were computed (the
    sign and payload of a NaN made by inf - inf depend on the operands' order); ``moved``:
    data only moved, every bit must arrive. Else the first differing elements, into
    ``found`` (see _expect)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        found.append(f"{what}: {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
        return
    a = np.ascontiguousarray(got).view(np.uint8).reshape(got.size, -1)
    b = np.ascontiguousarray(want).view(np.uint8).reshape(want.size, -1)
    differs = (a != b).any(axis=1)
    if _floating(got.dtype) and not moved:
        wide = np.float64 if got.dtype.itemsize <= 8 else got.dtype
        differs &= ~(np.isnan(got.astype(wide)) & np.isnan(want.astype(wide)))
    if not differs.any():
        return
    bad = np.flatnonzero(differs)
    first = ", ".join(f"[{i}] {got[i]} != {want[i]}" for i in bad[:3])
    found.append(f"{what}: {bad.size:,} of {got.size:,} elements wrong: {first}")


def _label(x: np.ndarray, op: str = "") -> str:
    return f"{x.nbytes:,} B {np.dtype(x.dtype).name}{' ' + op if op else ''}"


def _c_all_reduce_large(c: Communicator, found: list[str]) -> None:
    cases = (  # (dtype, op, elements): above the check's limit, then the fast path's starts
        (np.int32, ReduceOp.SUM, 10_000 + _ODD),
        (np.int32, ReduceOp.SUM, _MIB // 4 + _ODD),
        (np.float32, ReduceOp.SUM, _MIB // 4 + _ODD),
        (ml_dtypes.bfloat16, ReduceOp.SUM, _MIB // 2 + _ODD),
        (np.float64, ReduceOp.MAX, 2 * _MIB // 8 + _ODD),
        (np.int64, ReduceOp.BXOR, 2 * _MIB // 8 + _ODD),
        (np.int32, ReduceOp.SUM, 5 * _MIB // 4 + _ODD),
    )
    for k, (dt, op, count) in enumerate(cases):
        what = f"case {k}"
        xs = _inputs(c, what, dt, count)
        if _floating(dt):  # NaN on one rank, +inf and -inf (NaN together) on others
            xs[0][1::997] = np.inf
            xs[-1][2::1009] = -np.inf
            xs[c.size // 2][3::1013] = np.nan
        ufunc = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum, ReduceOp.BXOR: np.bitwise_xor}
        want = xs[0].copy()
        with np.errstate(invalid="ignore"):  # (inf - inf)
            for y in xs[1:]:
                ufunc[op](want, y, out=want)
        x = xs[c.rank].copy()
        if k % 2:
            c.all_reduce(x, op=op, async_op=True).wait()
        else:
            c.all_reduce(x, op=op)
        _same(found, x, want, _label(x, op.name))


def _c_reduce_scatter_large(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    for k, each in enumerate((_MIB // 8, 2 * _MIB // 8)):
        sizes = [each + 3 * j + _ODD for j in range(n)]  # uneven blocks
        xs = _inputs(c, f"rs {k}", np.int64, sum(sizes))
        want = np.add.reduce(np.stack(xs), axis=0)
        start = sum(sizes[:r])
        out = c.reduce_scatter(xs[r].copy(), sizes=sizes)
        _same(found, out, want[start : start + sizes[r]], _label(xs[r], "SUM"))


def _c_reduce_large(c: Communicator, found: list[str]) -> None:
    root = c.size - 1
    for k, count in enumerate((_MIB + _ODD, 9 * _MIB + _ODD)):  # int8: wraps at once
        xs = _inputs(c, f"reduce {k}", np.int8, count)
        want = np.add.reduce(np.stack(xs), axis=0, dtype=np.int8)
        x = xs[c.rank].copy()
        c.reduce(x, dst=root, op=ReduceOp.SUM)
        _same(found, x, want if c.rank == root else xs[c.rank], _label(x, f"SUM to rank {root}"))


def _c_broadcast_gather_large(c: Communicator, found: list[str]) -> None:
    n, r = c.size, c.rank
    src = n - 1
    for count in (40_000 + _ODD, 4 * _MIB + _ODD):  # eager, then rendezvous
        want = _data(src, f"bcast {count}", np.uint8, count)
        x = want.copy() if r == src else np.zeros(count, np.uint8)
        c.broadcast(x, src=src)
        _same(found, x, want, _label(x, f"broadcast from rank {src}"), moved=True)
    count = _MIB // 2 + _ODD  # float16 of every bit pattern, NaNs included: moved, not read
    xs = [_data(j, "gather", np.uint16, count).view(np.float16) for j in range(n)]
    out = c.all_gather(xs[r])
    _same(found, out.reshape(-1), np.concatenate(xs), _label(xs[r], "all_gather"), moved=True)


def _c_symmetric(c: Communicator, found: list[str]) -> None:
    count = _MIB // 4 + _ODD
    x = c.empty(count, np.int32)
    xs = _inputs(c, "symmetric", np.int32, count)
    want = np.add.reduce(np.stack(xs), axis=0, dtype=np.int32)
    for _ in range(2):  # (the second call reuses what the first prepared)
        x[:] = xs[c.rank]
        c.all_reduce(x)
        kind = "symmetric" if c.is_symmetric(x) else "ordinary (no shared memory)"
        _same(found, x, want, f"{_label(x, 'SUM')} in comm.empty's {kind} array")


@dataclass(frozen=True)
class Check:
    """One of the doctor's checks: its name, its function (run on every rank of the group;
    it appends each wrong result it finds to its list and goes on), and whether it uses
    large arrays, where the cross-rank check, MPI's rendezvous protocol and the
    shared-memory fast path take over (its line names the backends that ran its calls)."""

    name: str
    run: Callable[[Communicator, list[str]], None]
    large: bool = False


CHECKS: tuple[Check, ...] = (
    Check("all_reduce", _c_all_reduce),
    Check("reduce", _c_reduce),
    Check("broadcast", _c_broadcast),
    Check("all_gather", _c_all_gather),
    Check("gather/scatter", _c_gather_scatter),
    Check("reduce_scatter", _c_reduce_scatter),
    Check("all_to_all", _c_all_to_all),
    Check("barrier", _c_barrier),
    Check("send/recv", _c_p2p),
    Check("async", _c_async),
    Check("objects", _c_objects),
    Check("all_reduce, large", _c_all_reduce_large, large=True),
    Check("reduce_scatter, large", _c_reduce_scatter_large, large=True),
    Check("reduce, large", _c_reduce_large, large=True),
    Check("broadcast/all_gather, large", _c_broadcast_gather_large, large=True),
    Check("comm.empty (symmetric)", _c_symmetric, large=True),
)


def run_checks(comm: Communicator, *, timeout: float = 60.0) -> list[CheckResult]:
    """Run every check on a duplicate of ``comm`` (bounded by ``timeout`` per operation);
    every rank returns the same results.

    A call that timed out cannot be cancelled: it stays inside MPI on its duplicate, and a
    rank that went on in the check leaves calls there that are never matched. So after a
    check that raised on some rank the next one gets a fresh duplicate, made from a
    duplicate of ``comm`` that carries only the doctor's own steps (make a duplicate for
    the checks, gather each check's errors), the same on every rank whatever its checks
    did; it has no time bound, as every call of a check has one. A check whose duplicate
    still has a call running on some rank after every check ran (given :data:`GRACE`
    seconds to complete) lists those ranks in ``stuck``; such a rank cannot finalize MPI
    (see :func:`leave`)."""
    results = []
    kept: list[tuple[int, Communicator]] = []  # (a check that raised somewhere, its group)
    ctl = comm.dup()
    ctl.timeout = None
    c: Communicator | None = None
    for k, check in enumerate(CHECKS):
        if c is None:
            c = ctl.dup()
            c.timeout = timeout
        log = CallLog()
        found: list[str] = []  # wrong results (the check goes on after one)
        raised = False
        try:
            with log:
                check.run(c, found)
            error = f"wrong result: {found[0]}" if found else ""
        except Exception as exc:  # report, never hide
            raised = True
            error = f"{type(exc).__name__}: {exc}".strip() or traceback.format_exc(limit=1)
        errors, raises = zip(*ctl.all_gather_object((error, raised)), strict=True)
        bad = [(i, e) for i, e in enumerate(errors) if e]
        detail = "" if not bad else f"ranks {[i for i, _ in bad]}: {bad[0][1]}"
        ran = Counter(d["backend"] for d in log.records if d["group"] == c.name)
        paths = ", ".join(f"{b} {n}" for b, n in sorted(ran.items(), key=lambda t: -t[1]))
        results.append(CheckResult(check.name, not bad, detail, paths, check.large))
        if any(raises):  # a peer may wait there in calls this rank never makes: a new one
            kept.append((k, c))
            c = None
    if c is not None:
        c.free()
    deadline = time.monotonic() + GRACE
    mine = [k for k, group in kept if not _freed(group, deadline)]
    stuck: dict[int, list[int]] = {}
    for rank, ks in enumerate(ctl.all_gather_object(mine)):
        for k in ks:
            stuck.setdefault(k, []).append(rank)
    if not mine:
        ctl.free()
    return [replace(r, stuck=tuple(stuck.get(k, ()))) for k, r in enumerate(results)]


# seconds the calls of the checks that raised get to complete (a call past its time bound
# on one rank may be one its peers joined meanwhile) before the doctor calls them stuck
GRACE = 1.0


def _freed(c: Communicator, deadline: float) -> bool:
    """free() ``c`` once nothing runs on it here (until ``deadline``); whether it was."""
    while True:
        try:
            c.free()
            return True
        except InvalidArgumentError:  # (a call still inside MPI: free refuses)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def leave(comm: Communicator, status: int) -> NoReturn:
    """End this process with ``status`` without finalizing MPI, once every rank of ``comm``
    (the world, with no call of its own stuck) is here: for a job where a timed-out call of
    the checks never completed on some rank (MPI cannot cancel it; MPI_Finalize would wait
    for it, and hpccomm's exit would abort the job). Output is flushed, and
    ``HPCCOMM_PROFILE``'s files written; the other exit handlers do not run."""
    profiler.stop_from_env()
    sys.stdout.flush()
    sys.stderr.flush()
    comm.barrier()  # (rank 0 has printed the report)
    os._exit(status)


def format_checks(results: list[CheckResult], size: int) -> str:
    lines = [
        f"{'PASS' if r.ok else 'FAIL'}  {r.name}"
        + (f"  ({r.detail})" if r.detail else "")
        + (f"  [calls by path: {r.paths}]" if r.paths and r.large else "")
        + (f"  [a call still inside MPI on ranks {list(r.stuck)}]" if r.stuck else "")
        for r in results
    ]
    failed = sum(not r.ok for r in results)
    lines.append(
        f"doctor: {len(results) - failed} of {len(results)} operations passed on {size} "
        f"rank{'s' if size != 1 else ''}"
    )
    return "\n".join(lines)


def format_stuck(results: list[CheckResult]) -> str:
    """The line saying how a job with calls stuck in MPI ends (see :func:`leave`); "" when
    every call completed."""
    stuck = [r for r in results if r.stuck]
    if not stuck:
        return ""
    ranks = sorted({i for r in stuck for i in r.stuck})
    names = ", ".join(repr(r.name) for r in stuck)
    return (
        f"doctor: calls of {len(stuck)} check(s) that failed never completed on rank(s) "
        f"{ranks} (MPI cannot cancel a call: {names}); every rank exits with status 1 "
        f"without finalizing MPI"
    )
