"""The profiler: what a job spends on communication, per (group, op), per rank, and which
ranks make the others wait.

``hpccomm.profile(comm, "prof")`` (a context manager, or ``.start()`` / ``.stop()``) or
``HPCCOMM_PROFILE=prof`` (started by :func:`hpccomm.init`, stopped at exit) registers a
listener of the record step (:mod:`hpccomm.record`): while it runs, every call takes the
observed path of the dispatch (a few microseconds a call); with no profiler the path is
untouched. Each rank keeps

- per (group, op): calls, bytes (the array this rank passed: its input; for ``recv`` and a
  non-source ``scatter`` its output), time inside the call, and the bus bytes behind busbw
  (nccl-tests' size S times its factor, as in :mod:`hpccomm.bench`);
- the first :data:`EVENT_LIMIT` calls with their start and end times (the trace, and the
  arrival skew of each collective: when each member entered it).

Clocks: at start and at stop rank 0 exchanges a few 8-byte messages with every rank (the
exchange with the smallest round trip wins) and estimates each rank's clock offset; event
times are mapped onto rank 0's clock, interpolating linearly between the two estimates
(drift). The error bound of an offset is half that round trip; the report states it and
counts a collective's late arrival only when it exceeds that bound several times over.

At stop the members of ``comm`` send their data to its rank 0, which writes to the
directory ``summary.txt`` (the text summary), ``profile.json`` (everything, for
:func:`load` and ``hpccomm profile report DIR``) and ``trace.json`` (Chrome trace format:
a track per rank, a lane per group; open it in ui.perfetto.dev or chrome://tracing). When
the ranks do not all reach the stop within :data:`STOP_TIMEOUT` seconds (exit with the
environment variable after a failure), each rank writes its own ``rank<N>.json`` and
``hpccomm profile report DIR`` merges them.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from . import record
from .bench import FACTORS, PLOT_HINT
from .errors import ClosedError, HpccommError, InvalidArgumentError
from .flight import job_identity, make_writable_directory
from .ops import check_timeout
from .record import Record

__all__ = [
    "ENV",
    "SCHEMA",
    "EVENT_LIMIT",
    "STOP_TIMEOUT",
    "Profiler",
    "profile",
    "start_from_env",
    "stop_from_env",
    "analyze",
    "chrome_trace",
    "format_summary",
    "load",
    "timeline",
    "bus_bytes",
]

ENV = "HPCCOMM_PROFILE"
SCHEMA = "hpccomm.profile/1"
EVENT_LIMIT = 200_000  # calls per rank kept with their times (the trace, the skew)
STOP_TIMEOUT = 30.0  # seconds the exit-time stop waits for every rank
_CALLS_KEPT = 4096  # Call objects remembered for a fast lookup
_SYNC_ROUNDS = 16  # message exchanges per rank and clock estimate
_TAG = 7301
_ANSWER_SLACK = 5.0  # seconds added to a stop's wait for answers it is sure to get
_P2P = {"send", "recv", "sendrecv", "batch_isend_irecv", "send_object", "recv_object"}
_TOTAL_IN = {"all_gather", "gather"}  # nccl-tests' S is n times this rank's block


def bus_bytes(op: str, nbytes: int, n: int, is_root: bool) -> float:
    """nccl-tests' size S of one call times its bus factor: busbw = sum of this / time.

    ``nbytes`` is what this rank passed (Call.nbytes): S is n times that for all_gather,
    gather and a non-source scatter (each passes one block), else ``nbytes``."""
    key = "send_recv" if op in _P2P else op
    factor = FACTORS.get(key)
    if factor is None:  # barrier, objects
        return 0.0
    s = nbytes * n if op in _TOTAL_IN or (op == "scatter" and not is_root) else nbytes
    return s * factor(n)


class Profiler:
    """Profile every hpccomm call of this process between :meth:`start` and :meth:`stop`.

    Args:
        comm: the communicator whose ranks take part (start and stop are collective over
            it; rank 0 of it writes the files), usually the world from ``hpccomm.init()``.
            Calls on every communicator of this process are recorded.
        directory: where rank 0 writes summary.txt, profile.json and trace.json (None: write
            nothing, :meth:`stop` still returns the document on rank 0).
        events: calls per rank kept with their times (default :data:`EVENT_LIMIT`).

    Example::

        with hpccomm.profile(comm, "prof") as prof:
            train()
        # rank 0: prof/summary.txt, prof/profile.json, prof/trace.json
    """

    def __init__(self, comm: Any, directory: str | os.PathLike[str] | None = None,
                 *, events: int = EVENT_LIMIT) -> None:  # fmt: skip
        if not all(hasattr(comm, a) for a in ("mpi", "world_rank", "rank", "size")):
            raise InvalidArgumentError(
                f"profile: comm is {type(comm).__name__} {comm!r:.80}, expected a "
                f"Communicator (hpccomm.init()'s, or a group made from it)"
            )
        if isinstance(events, bool) or not isinstance(events, (int, np.integer)) or events < 0:
            raise InvalidArgumentError(
                f"profile (rank {comm.rank} of {comm.size}): events is {events!r}, expected "
                f"an integer >= 0 (calls per rank kept with their times)"
            )
        self.comm = comm
        self.directory = None if directory is None else Path(directory)
        self.limit = events
        self.doc: dict[str, Any] | None = None
        self._mpi: Any = None
        self._pid = 0  # the process that started it
        self._running = False
        self._groups: dict[int, int] = {}  # id(Group) -> index in _group_list
        self._group_list: list[tuple[str, str, list[int], int, int]] = []
        self._by_call: dict[Any, list[Any]] = {}  # Call -> its entry (see _entry)
        self._entries: dict[tuple[Any, Any, bool, int], list[Any]] = {}
        self._entry_list: list[list[Any]] = []
        self._events: list[tuple] = []  # (entry index, seq, t_start, t_end, async, failed)
        self._dropped = 0
        self._t_start = self._t_stop = 0.0
        self._sync_start: list[tuple[float, float]] = []
        self._sync_stop: list[tuple[float, float]] = []
        self._leftovers: list[Any] = []  # requests of a stop that gave up, kept alive
        self._rank = self._world_rank = 0  # in comm and in the world (set by start)
        self._world_size = 1
        self._open: dict[int, Record] = {}  # calls started and not ended (by id)

    @property
    def running(self) -> bool:
        return self._running

    # -- the listener ---------------------------------------------------------------------

    def __call__(self, event: str, rec: Record) -> None:
        if event == "start":
            self._open[id(rec)] = rec
            return
        if event != "end":
            return
        self._open.pop(id(rec), None)
        call = rec.call
        e = self._by_call.get(call)  # the dispatch reuses a Call for every repeat
        if e is None:
            e = self._entry(call, rec.gid)
        e[5] += 1
        e[6] += rec.t_end - rec.t_start
        failed = rec.error is not None
        if failed:
            e[7] += 1
        if len(self._events) < self.limit:
            self._events.append((e[0], rec.seq, rec.t_start, rec.t_end, rec.async_op, failed))
        else:
            self._dropped += 1

    def _entry(self, call: Any, gid: str) -> list[Any]:
        """The entry of a call's (group, op, root or not, bytes): [index, group index, op,
        bytes per call, bus bytes per byte, calls, seconds, failed]. The key holds the Group
        itself (hashed by identity), so its id is never reused while the profiler runs."""
        g = call.group
        key = (g, call.spec, call.peer == g.rank, call.nbytes)
        e = self._entries.get(key)
        if e is None:
            gi = self._groups.get(id(g))
            if gi is None:
                gi = self._groups[id(g)] = len(self._group_list)
                self._group_list.append((gid, g.name, list(g.world_ranks), g.rank, g.size))
            name = call.spec.name
            mult = bus_bytes(name, 1, g.size, key[2])
            e = self._entries[key] = [len(self._entry_list), gi, name, key[3], mult, 0, 0.0, 0]
            self._entry_list.append(e)
        if len(self._by_call) < _CALLS_KEPT:  # uncached calls (objects, batches) are new each time
            self._by_call[call] = e
        return e

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Profiler:
        """Start recording (collective over ``comm``: the clock offsets are estimated now).

        Raises:
            InvalidArgumentError: already started.
        """
        if self._running:
            raise InvalidArgumentError("profile.start: this profiler is already running")
        broken = self.comm._dispatcher.broken  # a fork() child, a call stuck in MPI: the
        if broken is not None:  # Dup below went out as the parent's, or hung
            raise ClosedError(
                f"profile.start on {self.comm.name} (rank {self.comm.rank} of "
                f"{self.comm.size}): {broken}"
            )
        # a new session: nothing of an earlier start/stop carries over
        self._groups.clear()
        self._group_list.clear()
        self._by_call.clear()
        self._entries.clear()
        self._entry_list.clear()
        self._events = []
        self._dropped = 0
        self._sync_stop = []
        self.doc = None
        self._rank, self._world_rank = self.comm.rank, self.comm.world_rank()
        self._world_size = self.comm._world.size  # (rank files name their job by it too)
        self._mpi = self.comm.mpi.Dup()  # the profiler's own messages: never recorded
        self._pid = os.getpid()
        self._check_directory()
        self._sync_start = _clock_offsets(self._mpi)
        self._open.clear()  # (calls of an earlier session)
        self._t_start = time.perf_counter()
        self._running = True
        record.add_listener(self)
        return self

    def _check_directory(self) -> None:
        """At start, on every rank (collective): the directory can be made and written
        here; else every rank raises, naming the ranks (found at the stop, the profile was
        lost, and only rank 0 said so: an outside hunt)."""
        why = ""
        if self.directory is not None:
            try:
                make_writable_directory(self.directory)
            except OSError as exc:
                why = str(exc.strerror or exc)
        said = self._mpi.allgather(why)
        bad = [r for r, w in enumerate(said) if w]
        if bad:
            self._mpi.Free()
            self._mpi = None
            first = said[bad[0]]
            raise InvalidArgumentError(
                f"profile.start (rank {self._rank} of {len(said)}): the directory "
                f"{str(self.directory)!r} cannot be written on rank(s) {bad}: {first}"
            )

    def stop(self, *, timeout: float | None = None) -> dict[str, Any] | None:
        """Stop recording; rank 0 gathers every rank's data, writes the files (when a
        directory was given) and returns the profile document; other ranks return None.
        Collective over ``comm``; idempotent.

        Args:
            timeout: seconds to wait for every rank to reach the stop (None: as long as it
                takes). Past it this rank writes its own ``rank<N>.json`` and returns None.
        """
        if not self._running:
            return self.doc
        if os.getpid() != self._pid:  # its messages would go out as the parent's
            raise ClosedError(
                f"profile.stop (rank {self._rank} of {self.comm.size}): this process is a "
                f"fork() child of the rank that started the profiler (pid {self._pid}); stop "
                f"it there"
            )
        timeout = check_timeout(
            timeout, f"profile.stop (rank {self._rank} of {self.comm.size})", zero=True
        )
        record.remove_listener(self)
        self._running = False
        self._t_stop = time.perf_counter()
        mpi = self._mpi
        if timeout is not None and not _all_arrive(mpi, timeout, self._leftovers):
            self._write_alone("not every rank reached the profiler's stop in time")
            return None
        self._sync_stop = _clock_offsets(mpi)
        mine = self._raw()
        everyone = mpi.gather(mine, root=0)
        mpi.Free()
        self._mpi = None
        if everyone is None:
            return None
        doc = analyze(everyone)
        self.doc = doc
        if self.directory is not None:
            doc["files"] = write(doc, everyone, self.directory)
        return doc

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- this rank's data -----------------------------------------------------------------

    def _raw(self) -> dict[str, Any]:
        """What this rank sends to rank 0: its groups, stats, events and clock estimates
        (the estimates are rank 0's, sent along by every rank for simplicity)."""
        # calls still running at stop (a peer never came; the job ends on an error):
        # [group index, op, seq, t_start]; the tables count only completed calls. First:
        # their group may be one no completed call named yet
        unfinished = [
            [self._entry(r.call, r.gid)[1], r.call.spec.name, r.seq, r.t_start]
            for r in list(self._open.values())
        ]
        return {
            "rank": self._world_rank,  # known since start: comm may be freed by now
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "t_start": self._t_start,
            "t_stop": self._t_stop,
            "groups": [
                {"gid": gid, "name": name, "members": members, "rank": r, "size": n}
                for gid, name, members, r, n in self._group_list
            ],
            "stats": self._merged(),
            "events": [
                (e[1], e[2], seq, t0, t1, e[3], is_async, failed)
                for e, seq, t0, t1, is_async, failed in (
                    (self._entry_list[i], *rest) for i, *rest in self._events
                )
            ],
            "dropped": self._dropped,
            "limit": self.limit,
            "unfinished": unfinished,
            "clock": {
                "start": self._sync_start[self._rank] if self._sync_start else None,
                "stop": self._sync_stop[self._rank] if self._sync_stop else None,
            },
        }

    def _merged(self) -> list[list[Any]]:
        """[group index, op, calls, bytes, seconds, bus bytes, failed] per (group, op)."""
        out: dict[tuple[int, str], list[Any]] = {}
        for _i, gi, op, nbytes, mult, calls, secs, failed in self._entry_list:
            if not calls:  # (an entry made for a call still running at the stop)
                continue
            row = out.setdefault((gi, op), [gi, op, 0, 0, 0.0, 0.0, 0])
            row[2] += calls
            row[3] += calls * nbytes
            row[4] += secs
            row[5] += calls * nbytes * mult
            row[6] += failed
        return list(out.values())

    def _write_alone(self, why: str) -> None:
        raw = self._raw()
        raw["alone"] = why
        # which job wrote it: report's load keeps one job's files (as trace analyze does)
        raw["job"] = job_identity()
        raw["world"] = self._world_size
        if self.directory is None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"rank{raw['rank']:05d}.json"
            path.write_text(json.dumps(raw))
            sys.stderr.write(f"hpccomm profile (rank {raw['rank']}): {why}; wrote {path}\n")
        except OSError as exc:
            sys.stderr.write(f"hpccomm profile (rank {raw['rank']}): {why}; cannot write: {exc}\n")


def profile(comm: Any, directory: str | os.PathLike[str] | None = None,
            *, events: int = EVENT_LIMIT) -> Profiler:  # fmt: skip
    """A :class:`Profiler` over ``comm`` writing to ``directory``; use it as a context
    manager, or call ``start()`` and ``stop()`` on every rank of ``comm``.

    Example::

        comm = hpccomm.init()
        with hpccomm.profile(comm, "prof"):
            train(comm)
        # rank 0 wrote prof/summary.txt, prof/profile.json and prof/trace.json
    """
    return Profiler(comm, directory, events=events)


_from_env: Profiler | None = None


def _none() -> str | None:
    return None


def _nothing() -> None:
    return None


# the name of the exception nobody caught that ends this rank, if any (set by init: the
# runtime's, which imports this module)
uncaught_exception: Callable[[], str | None] = _none
# tells the other ranks that this one leaves (the runtime's departure notice, set by init):
# the exit-time stop, an atexit handler run before hpccomm's own exit, waits for every rank
# up to STOP_TIMEOUT, and a peer waiting for this rank in a call waited out its timeout
# (an outside hunt: 45 s, where without HPCCOMM_PROFILE it heard "has left the job" at once)
depart: Callable[[], None] = _nothing
_from_env_pid = 0  # the process that started the exit-time profiler (a fork() child is not)


def check_directory(directory: str) -> None:
    """init: ``HPCCOMM_PROFILE``'s directory can be made and written (else
    InvalidArgumentError, on every rank alike); found at exit, the whole profile was lost
    with one line on stderr and status 0 (an outside hunt: ``HPCCOMM_PROFILE=/etc/passwd``)."""
    try:
        make_writable_directory(directory)
    except OSError as exc:
        raise InvalidArgumentError(
            f"init: the profile directory {directory!r} ({ENV}) cannot be written: "
            f"{exc.strerror or exc}"
        ) from None


def start_from_env(comm: Any) -> Profiler | None:
    """``HPCCOMM_PROFILE=DIR``: start a profiler over ``comm`` (init's world) and stop it at
    exit (bounded by :data:`STOP_TIMEOUT`). Called by :func:`hpccomm.init` on every rank."""
    global _from_env, _from_env_pid
    directory = os.environ.get(ENV, "").strip()
    if not directory or _from_env is not None:
        return _from_env
    _from_env = Profiler(comm, directory).start()
    _from_env_pid = os.getpid()
    atexit.register(_stop_at_exit)
    return _from_env


def _stop_at_exit() -> None:
    """At exit (atexit, run before hpccomm's own exit handler): this rank's departure notice
    first, where the program ends normally, then :func:`stop_from_env` (not in that function:
    a program that calls it goes on running, and its peers took the notice for a departure)."""
    prof = _from_env
    if prof is None or not prof.running or os.getpid() != _from_env_pid:
        return
    if uncaught_exception() is None:
        try:
            depart()
        except Exception:  # noqa: BLE001 - hpccomm's own exit departs all the same
            pass
    stop_from_env()


def stop_from_env() -> None:
    """Stop the profiler :func:`start_from_env` started, writing its files, as at exit (every
    rank of its communicator calls this; a second call does nothing): for a program that
    leaves without the exit handlers (``hpccomm doctor`` with a call stuck in MPI)."""
    prof = _from_env
    if prof is None or not prof.running or os.getpid() != _from_env_pid:
        return  # (a fork() child's exit ran the stop over MPI as its parent: a hang, or the
        # parent's rank file overwritten, in an outside hunt)
    from mpi4py import MPI

    if MPI.Is_finalized():  # pragma: no cover - the application finalized MPI itself
        prof._write_alone("MPI was finalized before the profiler's exit-time stop")
        return
    uncaught = uncaught_exception()
    if uncaught is not None:  # the job is aborted next: its peers, waiting for it in a
        # call, said at their timeout that it did not answer, where its exception was the
        # cause (it waited up to STOP_TIMEOUT here first: an outside hunt)
        prof._write_alone(f"this rank ends with an exception nobody caught ({uncaught})")
        return
    try:
        doc = prof.stop(timeout=STOP_TIMEOUT)
    except Exception as exc:  # never turn a clean exit into a traceback
        sys.stderr.write(f"hpccomm profile: stop at exit failed: {type(exc).__name__}: {exc}\n")
        return
    if doc is not None and prof.directory is not None:
        sys.stderr.write(f"hpccomm profile: wrote {prof.directory}/summary.txt, profile.json, "
                         f"trace.json\n")  # fmt: skip


def _all_arrive(mpi: Any, timeout: float, keep: list[Any]) -> bool:
    """Whether every rank reached the stop within ``timeout`` seconds, the same answer on
    every rank. Rank 0 polls a non-blocking barrier until its deadline and sends its word
    (come, or no). Another rank that hears no word within twice the timeout (rank 0 never
    came, or came that late) gives up and tells rank 0 so; one that hears "come" answers
    "here". After "come", rank 0 waits for every rank's answer (each has reached the stop:
    it answers within its own wait) and sends the verdict, all here or not, to those that
    answered "here". (A rank that gave up used to leave rank 0, arriving later, to find the
    barrier complete and enter the clock exchange alone, for good: an outside hunt.)
    ``keep`` holds the messages still in flight."""
    rank, n = mpi.Get_rank(), mpi.Get_size()
    barrier = mpi.Ibarrier()
    if rank == 0:
        ok = _poll(barrier, time.monotonic() + timeout)
        word = np.array([1 if ok else 0], dtype=np.int32)
        sends = [mpi.Isend(word, k, _TAG + 1) for k in range(1, n)]
        if not ok:
            keep.extend([word, barrier, *sends])  # a late rank still receives "no"
            return False
        answers = np.zeros(n, dtype=np.int32)
        deadline = time.monotonic() + 2 * timeout + _ANSWER_SLACK
        for k in range(1, n):
            got = mpi.Irecv(answers[k : k + 1], k, _TAG + 2)
            if not _poll(got, deadline):  # (gone since it reached the stop)
                keep.append(got)
        all_here = bool(answers[1:].all())
        verdict = np.array([1 if all_here else 0], dtype=np.int32)
        told = [mpi.Isend(verdict, k, _TAG + 3) for k in range(1, n) if answers[k]]
        for req in sends + told:
            req.Wait()
        return all_here
    box = np.zeros(1, dtype=np.int32)
    recv = mpi.Irecv(box, 0, _TAG + 1)
    if not _poll(recv, time.monotonic() + 2 * timeout):
        gave_up = np.zeros(1, dtype=np.int32)
        keep.extend([box, barrier, recv, gave_up, mpi.Isend(gave_up, 0, _TAG + 2)])
        return False
    if not box[0]:
        return False
    here = np.ones(1, dtype=np.int32)
    mpi.Send(here, 0, _TAG + 2)
    verdict = np.zeros(1, dtype=np.int32)
    got = mpi.Irecv(verdict, 0, _TAG + 3)
    if not _poll(got, time.monotonic() + 4 * timeout + 2 * _ANSWER_SLACK):
        keep.extend([verdict, got])  # (rank 0 gone since it said "come")
        return False
    return bool(verdict[0])


def _poll(req: Any, deadline: float) -> bool:
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _clock_offsets(mpi: Any) -> list[tuple[float, float]]:
    """Every rank's (offset, error bound) in seconds: its ``perf_counter`` minus rank 0's,
    estimated from the exchange with the smallest round trip (the bound is half of it).
    Collective; every rank gets the whole list."""
    rank, n = mpi.Get_rank(), mpi.Get_size()
    buf = np.zeros(1)
    out: list[tuple[float, float]] = [(0.0, 0.0)]
    pc = time.perf_counter
    if rank == 0:
        for k in range(1, n):
            best = (float("inf"), 0.0)
            for _ in range(_SYNC_ROUNDS):
                t0 = pc()
                mpi.Send(buf, k, _TAG)
                mpi.Recv(buf, k, _TAG)
                t1 = pc()
                if t1 - t0 < best[0]:
                    best = (t1 - t0, float(buf[0]) - (t0 + t1) / 2)
            out.append((best[1], best[0] / 2))
    else:
        for _ in range(_SYNC_ROUNDS):
            mpi.Recv(buf, 0, _TAG)
            buf[0] = pc()
            mpi.Send(buf, 0, _TAG)
    return mpi.bcast(out, root=0)


# -- analysis (pure: rank 0 at stop, and `hpccomm profile report` from rank files) ----------


def _to_global(raw: dict[str, Any]) -> tuple[Any, float]:
    """A function mapping this rank's perf_counter times onto rank 0's clock, and its error
    bound (seconds)."""
    a, b = raw["clock"].get("start"), raw["clock"].get("stop")
    if a is None:  # an unsynchronized rank file: its own clock, bound unknown
        return (lambda t: t), float("nan")
    if b is None:
        b = a
    t0, t1 = raw["t_start"], raw["t_stop"]
    o0, o1 = a[0], b[0]
    slope = (o1 - o0) / (t1 - t0) if t1 > t0 else 0.0

    def conv(t: float) -> float:
        return t - (o0 + slope * (t - t0))

    return conv, max(a[1], b[1])


def analyze(raws: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The profile document from every rank's raw data (see the module docstring)."""
    ranks = sorted(raws, key=lambda r: r["rank"])
    if not ranks:
        raise HpccommError("profile: no rank data to analyze")
    conv = {r["rank"]: _to_global(r) for r in ranks}
    bounds = [b for _, b in conv.values() if b == b]
    bound = max(bounds) if bounds else float("nan")
    origin = min(conv[r["rank"]][0](r["t_start"]) for r in ranks)
    walls = {r["rank"]: r["t_stop"] - r["t_start"] for r in ranks}
    wall = statistics.fmean(walls.values())
    # per (group name, op): sums over every rank
    table: dict[tuple[str, str], dict[str, Any]] = {}
    per_rank: dict[int, dict[str, Any]] = {}
    unfinished: list[dict[str, Any]] = []
    for r in ranks:
        comm_t = 0.0
        for gi, op, calls, nbytes, t, bus, errors in r["stats"]:
            g = r["groups"][gi]
            row = table.setdefault(
                (g["name"], op),
                {
                    "group": g["name"],
                    "op": op,
                    "ranks": set(),
                    "calls": 0,
                    "bytes": 0,
                    "time": 0.0,
                    "bus": 0.0,
                    "errors": 0,
                    "sizes": set(),
                },  # fmt: skip
            )
            row["ranks"].add(r["rank"])
            row["calls"] += calls
            row["bytes"] += nbytes
            row["time"] += t
            row["bus"] += bus
            row["errors"] += errors
            row["sizes"].add(g["size"])
            comm_t += t
        # the time some call ran: async calls that overlap (gradient buckets, waited later)
        # count once; summed, a rank's communication was 300-750% of its wall time (an
        # outside hunt). Calls past the event limit (not kept) are added as their sum
        kept = [(e[3], e[4]) for e in r.get("events", ())]
        comm_t = _covered(kept) + max(0.0, comm_t - sum(b - a for a, b in kept))
        per_rank[r["rank"]] = {"rank": r["rank"], "host": r["host"], "wall_s": walls[r["rank"]],
                               "comm_s": comm_t, "waited_s": 0.0, "last": 0,
                               "dropped": r["dropped"]}  # fmt: skip
        for gi, op, seq, t0 in r.get("unfinished", ()):
            unfinished.append({"rank": r["rank"], "group": r["groups"][gi]["name"], "op": op,
                               "seq": seq, "running_s": r["t_stop"] - t0})  # fmt: skip
    rows = []
    for row in table.values():
        k = len(row["ranks"])
        rows.append({
            "group": row["group"],
            "op": row["op"],
            "ranks": k,
            "group_size": max(row["sizes"]),
            "calls_per_rank": row["calls"] / k,
            "bytes_per_rank": row["bytes"] / k,
            "time_per_rank_s": row["time"] / k,
            "mean_us": row["time"] / row["calls"] * 1e6 if row["calls"] else 0.0,
            "busbw_gbs": row["bus"] / row["time"] / 1e9 if row["time"] > 0 else None,
            "share": row["time"] / k / wall if wall > 0 else 0.0,
            "errors": row["errors"],
        })  # fmt: skip
    rows.sort(key=lambda x: -x["time_per_rank_s"])
    # arrival skew: every collective whose members all recorded it
    arrivals: dict[tuple, dict[int, tuple[float, float]]] = {}
    labels: dict[tuple, tuple[str, list[int], str]] = {}
    for r in ranks:
        c, groups = conv[r["rank"]][0], r["groups"]
        for gi, op, seq, t0, t1, _nb, _async, _err in r["events"]:
            if op in _P2P:
                continue
            g = groups[gi]
            key = (g["gid"], tuple(g["members"]), seq)
            arrivals.setdefault(key, {})[r["rank"]] = (c(t0), c(t1))
            labels[key] = (g["name"], g["members"], op)
    threshold = max(20e-6, 5 * bound) if bound == bound else 20e-6
    insts: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
    for key, by_rank in arrivals.items():
        name, members, op = labels[key]
        if len(by_rank) != len(members) or len(members) < 2:
            continue
        inst = insts.setdefault(
            (key[0], key[1]),
            {
                "group": name,
                "members": members,
                "collectives": 0,
                "skew_s": 0.0,
                "max_skew_s": 0.0,
                "last": {},
                "caused_s": {},
                "waited_s": {},
                "ops": {},
            },  # fmt: skip
        )
        inst["collectives"] += 1
        starts = {rk: t[0] for rk, t in by_rank.items()}
        late = max(starts, key=lambda rk: starts[rk])
        t_last = starts[late]
        spread = t_last - min(starts.values())
        inst["skew_s"] += spread
        inst["max_skew_s"] = max(inst["max_skew_s"], spread)
        for rk, t in starts.items():
            inst["waited_s"][rk] = inst["waited_s"].get(rk, 0.0) + (t_last - t)
            per_rank[rk]["waited_s"] += t_last - t
        if spread > threshold:
            others = [t_last - t for rk, t in starts.items() if rk != late]
            inst["last"][late] = inst["last"].get(late, 0) + 1
            inst["caused_s"][late] = inst["caused_s"].get(late, 0.0) + statistics.fmean(others)
            inst["ops"].setdefault(late, {}).setdefault(op, 0)
            inst["ops"][late][op] += 1
            per_rank[late]["last"] += 1
    groups_out = []
    for inst in sorted(insts.values(), key=lambda i: (i["group"], i["members"])):
        stragglers = sorted(inst["last"], key=lambda rk: -inst["caused_s"][rk])
        groups_out.append({
            "group": inst["group"],
            "members": inst["members"],
            "collectives": inst["collectives"],
            "mean_skew_us": inst["skew_s"] / inst["collectives"] * 1e6,
            "max_skew_us": inst["max_skew_s"] * 1e6,
            "stragglers": [
                {"rank": rk, "last": inst["last"][rk],
                 "others_waited_s": inst["caused_s"][rk],
                 "mean_wait_us": inst["caused_s"][rk] / inst["last"][rk] * 1e6,
                 "ops": inst["ops"][rk]}  # fmt: skip
                for rk in stragglers
            ],
            "waited_s": {str(rk): v for rk, v in sorted(inst["waited_s"].items())},
        })  # fmt: skip
    hosts = sorted({r["host"] for r in ranks})
    return {
        "schema": SCHEMA,
        "ranks": len(ranks),
        "hosts": hosts,
        "wall_s": wall,
        "origin": origin,
        "clock": {
            "method": "offsets to rank 0 over MPI at start and stop (smallest of "
            f"{_SYNC_ROUNDS} round trips), interpolated linearly",
            "bound_us": bound * 1e6 if bound == bound else None,
            "threshold_us": threshold * 1e6,
        },
        "table": rows,
        "per_rank": [per_rank[k] for k in sorted(per_rank)],
        "groups": groups_out,
        "events_kept": sum(len(r["events"]) for r in ranks),
        "events_dropped": sum(r["dropped"] for r in ranks),
        # the events= each rank kept (files from before it was written: the default)
        "events_limit": max(r.get("limit", EVENT_LIMIT) for r in ranks),
        "events_dropped_ranks": sorted(r["rank"] for r in ranks if r["dropped"]),
        "alone": sorted({r["alone"] for r in ranks if r.get("alone")}),
        "unfinished": sorted(unfinished, key=lambda u: (u["rank"], u["seq"])),
    }


def _covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals ``spans`` (start, end)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def chrome_trace(doc: dict[str, Any], raws: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Chrome trace format (JSON object form): one process track per rank (pid = world
    rank), one thread lane per group, a complete ("X") event per call with its sequence
    number, bytes and the time it waited for the group's last arrival."""
    events: list[dict[str, Any]] = []
    origin = doc["origin"]
    waits: dict[tuple, float] = {}
    starts: dict[tuple, dict[int, float]] = {}
    raws = sorted(raws, key=lambda r: r["rank"])
    convs = {r["rank"]: _to_global(r)[0] for r in raws}
    for r in raws:
        c = convs[r["rank"]]
        for gi, op, seq, t0, _t1, _nb, _a, _e in r["events"]:
            if op not in _P2P:
                g = r["groups"][gi]
                starts.setdefault((g["gid"], tuple(g["members"]), seq), {})[r["rank"]] = c(t0)
    for key, by_rank in starts.items():
        last = max(by_rank.values())
        for rk, t in by_rank.items():
            waits[key + (rk,)] = last - t
    for r in raws:
        rk, c = r["rank"], convs[r["rank"]]
        events.append({"ph": "M", "name": "process_name", "pid": rk, "tid": 0,
                       "args": {"name": f"rank {rk} ({r['host']})"}})  # fmt: skip
        events.append({"ph": "M", "name": "process_sort_index", "pid": rk, "tid": 0,
                       "args": {"sort_index": rk}})  # fmt: skip
        for gi, g in enumerate(r["groups"]):
            events.append({"ph": "M", "name": "thread_name", "pid": rk, "tid": gi + 1,
                           "args": {"name": f"{g['name']} {g['members']}"}})  # fmt: skip
        for gi, op, seq, t0, t1, nbytes, is_async, failed in r["events"]:
            g = r["groups"][gi]
            args: dict[str, Any] = {"seq": seq, "bytes": nbytes, "group": g["name"],
                                    "members": g["members"]}  # fmt: skip
            w = waits.get((g["gid"], tuple(g["members"]), seq, rk))
            if w is not None:
                args["wait_us"] = round(w * 1e6, 3)
            if is_async:
                args["async"] = True
            if failed:
                args["failed"] = True
            events.append({
                "name": op, "cat": g["name"], "ph": "X", "pid": rk, "tid": gi + 1,
                "ts": round((c(t0) - origin) * 1e6, 3),
                "dur": round(max(t1 - t0, 0.0) * 1e6, 3), "args": args,
            })  # fmt: skip
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "hpccomm profile", "clock_bound_us": doc["clock"]["bound_us"]},
    }


def write(doc: dict[str, Any], raws: list[dict[str, Any]], directory: str | os.PathLike[str]) -> list[str]:  # fmt: skip
    """Write summary.txt, profile.json and trace.json; returns their names."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        names = ["summary.txt", "profile.json", "trace.json"]
        doc = {**doc, "files": names}
        (d / "profile.json").write_text(json.dumps(doc, indent=1) + "\n")
        (d / "trace.json").write_text(json.dumps(chrome_trace(doc, raws)))
        (d / "summary.txt").write_text(format_summary(doc) + "\n")
    except OSError as exc:
        raise HpccommError(f"profile: cannot write {d}: {exc.strerror or exc}") from None
    return names


def timeline(directory: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Draw trace.json of a profile directory as a PNG: a row per (rank, group), a bar per
    call coloured by op (for a look without a browser; Perfetto shows the same file).

    Raises:
        HpccommError: no trace.json, or matplotlib missing (saying how to get it).
    """
    src = Path(directory) / "trace.json"
    try:
        trace = json.loads(src.read_text())
    except (OSError, ValueError) as exc:
        raise HpccommError(f"profile report --timeline: cannot read {src}: {exc}") from None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HpccommError(f"profile report --timeline: {PLOT_HINT}") from None
    events = trace["traceEvents"]
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}  # fmt: skip
    calls = [e for e in events if e["ph"] == "X"]
    rows = sorted({(e["pid"], e["tid"]) for e in calls})
    ops = sorted({e["name"] for e in calls})
    colours = {op: plt.get_cmap("tab10")(i % 10) for i, op in enumerate(ops)}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.5))
    for y, key in enumerate(rows):
        mine = [e for e in calls if (e["pid"], e["tid"]) == key]
        for op in ops:
            bars = [(e["ts"] / 1e3, max(e["dur"] / 1e3, 1e-3)) for e in mine if e["name"] == op]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), color=colours[op])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {p}: {lanes.get((p, t), t)}" for p, t in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms, rank 0's clock)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[op]) for op in ops],
              labels=ops, fontsize=8, loc="upper right")  # fmt: skip
    ax.set_title(f"hpccomm profile: {src}", fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise HpccommError(f"profile report --timeline: cannot write {path}: {exc}") from None
    finally:
        plt.close(fig)


def _read_json(path: Path) -> Any:
    """One file of a profile directory; HpccommError names the file and the problem."""
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise HpccommError(f"profile report: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise HpccommError(
            f"profile report: cannot read {path}: invalid JSON ({exc}; truncated?)"
        ) from None


def load(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The profile document of a directory: its profile.json, or the analysis of the
    ``rank<N>.json`` files the ranks wrote alone."""
    d = Path(directory)
    if not d.is_dir():
        raise InvalidArgumentError(f"profile report: {d} is not a directory")
    path = d / "profile.json"
    paths = sorted(d.glob("rank*.json"))
    if path.exists():
        newer = [p for p in paths if p.stat().st_mtime > path.stat().st_mtime]
        if not newer:
            doc = _read_json(path)
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
                raise HpccommError(f"profile report: {path} is not a profile.json of {SCHEMA}")
            if paths:
                doc = {**doc, "left_out": [*doc.get("left_out", []), _older(paths, "profile.json")]}
            return doc
    raws = [_read_json(p) for p in paths]
    if not raws:
        raise InvalidArgumentError(
            f"profile report: {d} holds neither profile.json nor rank<N>.json files"
        )
    for p, raw in zip(paths, raws, strict=True):
        if not isinstance(raw, dict) or not _RAW_KEYS <= raw.keys():
            hint = (
                " (a flight recorder dump?)" if isinstance(raw, dict) and "entries" in raw else ""
            )
            raise HpccommError(f"profile report: {p} is not a profiler's rank file{hint}")
    raws, left_out = _one_job(paths, raws)
    if not raws:
        raise HpccommError(
            f"profile report: no rank file in {d} records its name's rank: {left_out}"
        )
    if path.exists():  # older than the rank files kept
        left_out.append("profile.json (written before these rank files: another run's)")
    try:
        doc = analyze(raws)
    except DAMAGED as exc:
        raise HpccommError(
            f"profile report: the rank files in {d} are damaged ({type(exc).__name__}: {exc})"
        ) from None
    if left_out:
        doc["left_out"] = left_out
    return doc


def _older(paths: list[Path], newer: str) -> str:
    names = ", ".join(p.name for p in paths[:4]) + (", ..." if len(paths) > 4 else "")
    return f"{names} (written before {newer}: another run's)"


def _one_job(paths: list[Path], raws: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """The rank files of the newest job among ``raws`` (the job of the file written last:
    files record their job and world size), and notes on the files left out: another job's,
    or one whose name is not the rank it records (they were merged: a 2-rank job's files
    over a 4-rank job's gave a "4 ranks" report with calls of both)."""
    notes = []
    kept: dict[tuple[Any, Any], list[tuple[Path, dict[str, Any]]]] = {}
    for p, raw in zip(paths, raws, strict=True):
        named = re.fullmatch(r"rank([0-9]+)\.json", p.name)
        if named is None or int(named.group(1)) != raw.get("rank"):
            notes.append(f"{p.name} (records rank {raw.get('rank')!r}: not this name's)")
            continue
        kept.setdefault((raw.get("job"), raw.get("world")), []).append((p, raw))
    if not kept:
        return [], notes

    def newest(key: tuple[Any, Any]) -> float:
        return max(p.stat().st_mtime for p, _ in kept[key])

    chosen = max(kept, key=newest)
    for key in sorted((k for k in kept if k != chosen), key=newest):
        files = ", ".join(p.name for p, _ in kept[key])
        job, world = key
        notes.append(
            f"{files} (another job: {job or 'no job named'}, {world or '?'} ranks; the newest "
            f"files are {chosen[0] or 'no job named'}'s, {chosen[1] or '?'} ranks)"
        )
    return [raw for _, raw in kept[chosen]], notes


# what reading a damaged document raises (a key, an index or a type not as written)
DAMAGED = (KeyError, TypeError, ValueError, IndexError)

# what every rank file holds (_raw): checked before the analysis reads them
_RAW_KEYS = frozenset({"rank", "host", "t_start", "t_stop", "groups", "stats", "events",
                       "dropped", "clock"})  # fmt: skip


# -- the text summary -------------------------------------------------------------------------


def _rank_list(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    more = f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else ""
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}{more}"


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _secs(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def format_summary(doc: dict[str, Any], top: int = 20) -> str:
    """The text summary: where the communication time goes, per (group, op) and per rank,
    and the ranks that arrive last at collectives."""
    wall = doc["wall_s"]
    bound = doc["clock"]["bound_us"]
    per = doc["per_rank"]
    comm = statistics.fmean(p["comm_s"] for p in per) if per else 0.0
    waited = statistics.fmean(p["waited_s"] for p in per) if per else 0.0
    share = (lambda s: f"{100 * s / wall:.1f}%") if wall > 0 else (lambda s: "-")
    lines = [
        f"hpccomm profile: {doc['ranks']} ranks on {len(doc['hosts'])} host(s) "
        f"({', '.join(doc['hosts'][:4])}{', ...' if len(doc['hosts']) > 4 else ''}), "
        f"wall {_secs(wall)} (mean over ranks)",
        "clocks: offsets to rank 0 estimated over MPI at start and stop, error bound "
        + (f"+-{bound:.1f} us" if bound is not None else "unknown (ranks wrote alone)"),
        f"communication: {_secs(comm)} per rank ({share(comm)} of wall); of it waiting for "
        f"the last rank to arrive at collectives: {_secs(waited)} per rank ({share(waited)})",
    ]
    for why in doc.get("left_out", []):
        lines.append(f"note: left out: {why}")
    for why in doc.get("alone", []):
        lines.append(f"note: {why}: the ranks wrote alone, clocks not synchronized at stop")
    if doc.get("events_dropped"):
        limit = doc.get("events_limit", EVENT_LIMIT)
        dropping = doc.get("events_dropped_ranks")
        who = f" ({_rank_list(dropping)})" if dropping else ""
        lines.append(
            f"note: {doc['events_dropped']} calls in all past the first {limit:,} per rank{who} "
            f"are counted in the tables but not in the trace or the skew"
        )
    for u in doc.get("unfinished", [])[:5]:
        lines.append(
            f"not completed: rank {u['rank']}'s {u['op']} #{u['seq']} on {u['group']}, "
            f"running {_secs(u['running_s'])} at the stop (not in the tables below)"
        )
    if len(doc.get("unfinished", [])) > 5:
        lines.append(f"not completed: {len(doc['unfinished']) - 5} more calls")
    lines += ["", f"top (group, op) by time per rank (of {len(doc['table'])}):"]
    head = f"{'group':<18} {'op':<16} {'calls':>8} {'bytes/rank':>11} {'time/rank':>10} {'mean/call':>10} {'busbw':>11} {'wall':>6}"
    lines.append(head)
    for row in doc["table"][:top]:
        bw = row["busbw_gbs"]
        lines.append(
            f"{row['group']:<18} {row['op']:<16} {row['calls_per_rank']:>8.0f} "
            f"{_bytes(row['bytes_per_rank']):>11} {_secs(row['time_per_rank_s']):>10} "
            f"{_secs(row['mean_us'] / 1e6):>10} "
            f"{('-' if not bw else f'{bw:.3g} GB/s'):>11} {100 * row['share']:>5.1f}%"
            + (
                f"  ({row['errors']} failed, over its {row['ranks']} ranks)"
                if row["errors"]
                else ""
            )
        )
    lines += ["", "stragglers (the rank that entered a collective last; the others waited):"]
    any_late = False
    for g in doc["groups"]:
        where = f"{g['group']} {g['members']}"
        if not g["stragglers"]:
            lines.append(
                f"{where}: no rank late by more than {doc['clock']['threshold_us']:.0f} us in "
                f"{g['collectives']} collectives (mean skew {g['mean_skew_us']:.1f} us)"
            )
            continue
        any_late = True
        parts = []
        for s in g["stragglers"][:3]:
            ops = ", ".join(f"{op} {k}" for op, k in sorted(s["ops"].items(), key=lambda x: -x[1]))
            parts.append(
                f"rank {s['rank']} arrived last in {s['last']} of {g['collectives']} "
                f"collectives ({ops}); the others waited {_secs(s['mean_wait_us'] / 1e6)} each "
                f"time, {_secs(s['others_waited_s'])} in total"
            )
        lines.append(f"{where}: " + "; ".join(parts))
    if not doc["groups"]:
        lines.append("no collective recorded on every member of its group")
    elif not any_late:
        lines.append("(no straggler)")
    lines += ["", f"{'rank':>4} {'host':<12} {'comm':>10} {'wall':>6} {'waited':>10} {'last':>5}"]
    for p in per:
        lines.append(
            f"{p['rank']:>4} {p['host'][:12]:<12} {_secs(p['comm_s']):>10} "
            f"{(100 * p['comm_s'] / p['wall_s'] if p['wall_s'] else 0):>5.1f}% "
            f"{_secs(p['waited_s']):>10} {p['last']:>5}"
        )
    if doc.get("files"):
        lines += ["", f"files: {', '.join(doc['files'])} (trace.json: open in ui.perfetto.dev "
                      f"or chrome://tracing, a track per rank)"]  # fmt: skip
    return "\n".join(lines)
