"""The flight recorder: every rank keeps its last calls, writes them out when something goes
wrong, and ``hpccomm trace analyze DIR`` says from all ranks' files who waits where.

Enabled by ``hpccomm.init(trace_dir=...)`` or ``HPCCOMM_TRACE_DIR``; it is a listener of
the record step (so calls take the observed path while it runs). Each entry is a call's
record: op, group, sequence number, peer, dtype, shape, state (started / completed /
failed), times, error, and in ``detail`` mode the call site. A rank writes
``DIR/rank<N>.json`` on a CommTimeoutError or another hpccomm error of a call, on SIGTERM
(what Slurm sends at a time limit; the rank then ends) and SIGUSR1 (what a person sends a
hung job; the rank goes on), and on request (:func:`dump`). Signals are taken by a watcher
thread through ``signal.set_wakeup_fd``, so a rank stuck inside an MPI call still writes.
A dump records its job (:func:`job_identity`: the launcher's PMIx namespace, or the Slurm job
and step, ...), world size, and whether the program had ended (a rank waiting at exit for
the others); the analysis takes the newest job's dumps of a directory and names the files
it leaves out (an earlier job's, files not named ``rank<N>.json``).
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from . import record
from .errors import InvalidArgumentError
from .ops import SPECS
from .record import Record, Refusal

__all__ = [
    "FlightRecorder",
    "Trace",
    "dump",
    "analyze",
    "load",
    "load_trace",
    "job_identity",
    "ENV",
    "recorder",
]

ENV = "HPCCOMM_TRACE_DIR"
# Seconds after an error's dump during which further errors write none (see note_error)
ERROR_DUMP_GAP = 1.0
SIGTERM_GRACE = 0.5  # seconds a rank waits after its SIGTERM dump before it exits
SIGTERM_DUMP_BOUND = 30.0  # seconds the main thread waits for the watcher to end the process
recorder: FlightRecorder | None = None  # the process's recorder, when enabled

# What names one job, the same in every rank of it and different in the next job: the first
# variable set wins. PMIx's namespace is one per mpiexec or srun step (Open MPI's prterun
# writes "prterun-<host>-<pid>@1", srun --mpi=pmix "slurm.pmix.<job>.<step>"); Slurm's job
# and step ids; the job ids of other batch systems, and torchrun's run id.
_JOB_VARS = (
    "PMIX_NAMESPACE",
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "FLUX_JOB_ID",
    "TORCHELASTIC_RUN_ID",
)


def job_identity(environ: Mapping[str, str] | None = None) -> str | None:
    """A name of this process's job that every rank of it shares, from the launcher's
    environment (None when no launcher wrote one, e.g. a singleton)."""
    env = os.environ if environ is None else environ
    for var in _JOB_VARS:
        value = env.get(var, "").strip()
        if value:
            if var == "SLURM_JOB_ID" and env.get("SLURM_STEP_ID", "").strip():
                value += "." + env["SLURM_STEP_ID"].strip()  # one job, several srun steps
            return f"{var}={value}"
    return None


def _departures(departed: Callable[[], dict[int, str]] | None) -> dict[str, str]:
    """The ranks known to have left the job and why, for a dump (never fails it)."""
    try:
        return {str(w): why for w, why in (departed() if departed is not None else {}).items()}
    except Exception:  # noqa: BLE001 - a dump must not fail on a hint
        return {}


def _program_ended() -> bool:
    """Whether this process's program has ended: its main thread is done and no other
    non-daemon thread runs (Python then runs the atexit handlers: hpccomm's exit, which waits
    there for the other ranks to end theirs, is one). Such a rank is alive, and SIGTERM or
    SIGUSR1 has it write a trace; the analysis, with nothing in it saying so, called it "in
    no hpccomm call (computing, or stuck elsewhere)" (hunt AQ)."""
    main = threading.main_thread()
    if main.is_alive():
        return False
    return not any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main)


class FlightRecorder:
    """A ring buffer of this process's last ``size`` calls (a listener: register it with
    ``record.add_listener``)."""

    def __init__(self, directory: str | os.PathLike[str], rank: int, size: int,
                 capacity: int = 2000) -> None:  # fmt: skip
        self.directory = Path(directory)
        self.rank = rank
        self.size = size
        self.entries: collections.deque[Record | Refusal] = collections.deque(maxlen=capacity)
        self.recorded = 0  # calls ever recorded (the ring keeps the last ``capacity``)
        self.writer: int | None = None  # the thread writing a dump now
        self.stop_after = False  # SIGTERM came while that thread wrote it (see _ignore)
        self.dumps = 0
        # world rank -> why it left the job (its departure notice), for the dump: a rank
        # whose program ended writes no trace file (set by init: the job's notices)
        self.departed: Callable[[], dict[int, str]] | None = None
        self._last_error_dump = -math.inf  # time.monotonic() of the last dump for an error
        self.errors_skipped = 0  # errors since it that wrote no dump (ERROR_DUMP_GAP)
        self._lock = threading.Lock()
        self._offset = time.time() - time.perf_counter()  # records use perf_counter
        self.job = job_identity()

    def __call__(self, event: str, rec: Record) -> None:
        if event == "start":
            self.entries.append(rec)  # completed in place by the record step
            self.recorded += 1

    def note_refusal(self, refusal: Refusal) -> None:
        """A collective refused here before it ran: kept in its place, state "refused"."""
        self.entries.append(refusal)
        self.recorded += 1

    def groups(self) -> dict[str, dict[str, Any]]:
        """The groups of the recorded calls: id -> name and members (world ranks)."""
        out: dict[str, dict[str, Any]] = {}
        for rec in list(self.entries):
            g = rec.group
            out[rec.gid] = {"name": g.name, "members": list(g.world_ranks)}
        return out

    def snapshot(self) -> list[dict[str, Any]]:
        out = []
        for rec in list(self.entries):
            d = rec.describe()
            d["gid"] = getattr(rec, "gid", d["group"])
            d["state"] = (
                "refused"
                if type(rec) is Refusal
                else "failed"
                if rec.error is not None
                else "completed"
                if rec.t_end
                else "started"
            )
            source = getattr(rec, "source", None)
            if d["state"] == "started" and source is not None and source.test():
                # an async call whose job on the worker has ended, its Work not waited for
                # (yet): its record ends at wait(), and the analysis took it as running
                d["waited"] = False
                if source.error is None:
                    d["state"] = "completed"
                else:
                    d["state"], d["error"] = (
                        "failed",
                        str(source.error),
                    )
            d["t_start"] = rec.t_start + self._offset
            d["t_end"] = rec.t_end + self._offset if rec.t_end else None
            d["site"] = rec.site
            d["shape"] = list(d["shape"]) if d["shape"] is not None else None
            out.append(d)
        return out

    def dump(self, reason: str) -> Path:
        """Write ``DIR/rank<N>.json`` (replacing an earlier dump of this rank)."""
        try:
            with self._lock:
                self.writer = threading.get_ident()
                try:
                    return self._write(reason)
                finally:
                    self.writer = None
        finally:  # SIGTERM came while this (main) thread wrote it: stop now (see _ignore)
            if self.stop_after and threading.current_thread() is threading.main_thread():
                _stop_for_sigterm()

    def _write(self, reason: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        doc = {
            "rank": self.rank,
            "size": self.size,
            "job": self.job,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "reason": reason,
            "errors_not_dumped": self.errors_skipped,
            "time": time.time(),
            "groups": self.groups(),
            "recorded": self.recorded,
            "entries": self.snapshot(),
            "departed": _departures(self.departed),
            "program_ended": _program_ended(),
        }
        path = self.directory / f"rank{self.rank:05d}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, path)
        self.dumps += 1
        return path

    def note_error(self, exc: BaseException) -> None:
        """An hpccomm error reached the caller: write the trace, unless an error wrote it
        less than ERROR_DUMP_GAP seconds ago (each dump writes the whole ring, about 0.7 MB:
        a program retrying 10 ms receive timeouts took 19-45 ms per timeout, and would
        write tens of GB a day). The next dump counts the errors that wrote none; SIGTERM,
        SIGUSR1, hpccomm.dump() and an uncaught error always write."""
        now = time.monotonic()
        if now - self._last_error_dump < ERROR_DUMP_GAP:
            self.errors_skipped += 1
            return
        self._last_error_dump = now
        self.try_dump(f"{type(exc).__name__}: {exc}")
        self.errors_skipped = 0

    def try_dump(self, reason: str) -> None:
        """:meth:`dump`, saying on stderr why it failed instead of raising (never hide the
        real error, or end the signal watcher, behind a failed dump)."""
        try:
            self.dump(reason)
        except OSError as exc:
            sys.stderr.write(
                f"hpccomm (rank {self.rank} of {self.size}): the flight recorder could not "
                f"write its trace ({_short(reason)}) to {self.directory}: "
                f"{exc.strerror or exc}\n"
            )
            sys.stderr.flush()


def make_writable_directory(directory: str | os.PathLike[str]) -> None:
    """Make ``directory`` (with its parents) and write a file there; OSError if either
    fails (init's check of the trace and profile directories)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    # (a name of its own: ranks of several nodes may share the directory and a pid)
    fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
    os.close(fd)
    os.unlink(probe)


def check_directory(directory: str | os.PathLike[str]) -> None:
    """init: the trace directory can be made and written (else InvalidArgumentError); found
    at the first dump, the error hid the dump's cause and ended the signal watcher."""
    try:
        make_writable_directory(directory)
    except OSError as exc:
        raise InvalidArgumentError(
            f"init: the trace directory {str(directory)!r} ({ENV} or trace_dir=) cannot be "
            f"written: {exc.strerror or exc}"
        ) from None


def dump(reason: str = "requested") -> Path | None:
    """Write this rank's flight recorder now; returns the file (None when not enabled)."""
    return None if recorder is None else recorder.dump(reason)


def start(directory: str | os.PathLike[str], rank: int, size: int) -> FlightRecorder:
    """Enable the recorder for this process and the signal watcher (main thread only)."""
    global recorder
    if recorder is None:
        recorder = FlightRecorder(directory, rank, size)
        record.add_listener(recorder)
        record.error_hooks.append(recorder.note_error)
        record.refusal_hooks.append(recorder.note_refusal)
        _watch_signals(recorder)
    return recorder


def _watch_signals(rec: FlightRecorder) -> None:
    """SIGTERM and SIGUSR1 reach a thread that writes the trace even when the main thread is
    inside MPI: Python's signal handler writes the signal number to a pipe, the thread reads
    it. SIGTERM then ends the process at once (status 143, as SIGTERM's own default would:
    MPI is not finalized, the launcher ends the job; the main thread stops at its next
    Python step meanwhile), unless the program had a handler of
    its own for it (a checkpoint on SIGTERM, a requeue on SIGUSR1): that one is kept, run
    after the dump on the main thread, and decides (it was replaced, or cut short 0.5 s
    after the dump)."""
    global _wakeup_fd
    if threading.current_thread() is not threading.main_thread():
        return  # signals can only be set up from the main thread
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # pragma: no cover - not the main thread of the main interpreter
        return
    _wakeup_fd = write_fd
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        _previous[sig] = signal.getsignal(sig)
        signal.signal(sig, _ignore)

    def watch() -> None:
        while True:
            data = os.read(read_fd, 64)
            for signum in data:
                if signum == signal.SIGUSR1:
                    rec.try_dump("SIGUSR1")
                elif signum == signal.SIGTERM:
                    kept = _previous.get(signal.SIGTERM)
                    if callable(kept) or kept == signal.SIG_IGN:
                        rec.try_dump("SIGTERM")  # the program's handler decides
                        continue
                    try:
                        rec.try_dump("SIGTERM")
                        # The launcher signalled every rank at once; the first rank to exit
                        # makes mpiexec kill the others at once, maybe before their dumps
                        # are written (seen under load): give them a moment.
                        time.sleep(SIGTERM_GRACE)
                    finally:  # end as SIGTERM would have (exit status 128 + 15)
                        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="hpccomm-signals", daemon=True).start()


_wakeup_fd = -1  # the watcher's pipe
_previous: dict[int, Any] = {}  # the program's handlers of SIGTERM and SIGUSR1 before init


def _ignore(signum: int, frame: Any) -> None:
    """The Python-level handler (main thread): where another wakeup fd took the watcher's
    place (asyncio's add_signal_handler, left after remove_signal_handler: SIGTERM was then
    swallowed, no trace, the rank ran on), the signal goes to the watcher from here; then
    the program's own handler, if it had one, runs."""
    if _wakeup_fd >= 0:
        try:
            current = signal.set_wakeup_fd(_wakeup_fd, warn_on_full_buffer=False)
            if current != _wakeup_fd:  # not ours: this signal did not reach the watcher
                signal.set_wakeup_fd(current)  # (the other's stays)
                os.write(_wakeup_fd, bytes([signum]))
        except (OSError, ValueError):
            pass
    kept = _previous.get(signum)
    if callable(kept):
        kept(signum, frame)
    elif signum == signal.SIGTERM and kept != signal.SIG_IGN and _wakeup_fd >= 0:
        # the watcher writes the trace, waits SIGTERM_GRACE and ends the process: the
        # program must not run on meanwhile (it called collectives for 0.5 s, and a program
        # that ended in that time exited with status 0: an outside hunt). Inside a dump of
        # its own (hpccomm.dump(), an error's), this thread holds the recorder's lock,
        # which the watcher's dump waits for: it stops once that dump is written (it
        # waited here holding the lock, and the rank ended 31 s later with no SIGTERM
        # dump: a review)
        rec = recorder
        if rec is not None and rec.writer == threading.get_ident():
            rec.stop_after = True
            return
        _stop_for_sigterm()


def _stop_for_sigterm() -> None:
    """The main thread after SIGTERM: wait for the watcher to end the process (bounded,
    should the watcher fail to)."""
    time.sleep(SIGTERM_GRACE + SIGTERM_DUMP_BOUND)
    os._exit(128 + signal.SIGTERM)


def undo_signals() -> None:
    """In a fork() child: SIGTERM and SIGUSR1 back to their defaults where the watcher set
    them, and no wakeup pipe (the parent's watcher thread reads it: the child has no
    watcher, and a SIGTERM to the child ended the parent); no recorder (its dumps would
    replace the parent's rank file)."""
    global recorder, _wakeup_fd
    rec, recorder = recorder, None
    if rec is None:
        return
    record.remove_listener(rec)
    if rec.note_error in record.error_hooks:
        record.error_hooks.remove(rec.note_error)
    if rec.note_refusal in record.refusal_hooks:
        record.refusal_hooks.remove(rec.note_refusal)
    try:
        if _wakeup_fd >= 0:
            signal.set_wakeup_fd(-1)
            _wakeup_fd = -1
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            if signal.getsignal(sig) is _ignore:
                signal.signal(sig, _previous.get(sig, signal.SIG_DFL) or signal.SIG_DFL)
    except ValueError:  # pragma: no cover - forked from a thread that is not the main one
        pass


# -- analysis of every rank's dump --------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """The dumps of one job in a trace directory.

    ``docs`` maps world rank to its dump, ``size`` is the job's world size, ``job`` what
    names the job (:func:`job_identity`; None when the dumps name none) and ``left_out`` one
    note per file of the directory that is not part of the analysis, saying why.
    """

    docs: dict[int, dict[str, Any]]
    size: int | None
    job: str | None
    left_out: tuple[str, ...] = ()


_DUMP_NAME = re.compile(r"rank([0-9]+)\.json")
MAX_WORLD = 1 << 20  # ranks a dump may record (far above any job's: a damaged size)


def _read_dump(path: Path, named: int) -> dict[str, Any]:
    """One rank's dump (``named``: the rank in its file name), checked for what the analysis
    reads; InvalidArgumentError names the file and what is wrong with it."""
    where = f"trace analyze: {path}"
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise InvalidArgumentError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidArgumentError(
            f"{where}: not a flight recorder dump: invalid JSON ({exc}; truncated?)"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(
            f"{where}: not a flight recorder dump: expected a JSON object, got {type(doc).__name__}"
        )
    missing = [k for k in ("rank", "size", "reason", "entries") if k not in doc]
    if missing:
        raise InvalidArgumentError(
            f"{where}: not a flight recorder dump: no {', '.join(missing)} (expected the keys "
            f"rank, size, reason, entries)"
        )
    rank, size = doc["rank"], doc["size"]
    ints = all(type(v) is int for v in (rank, size))
    if not ints or size < 1 or not 0 <= rank < size:
        raise InvalidArgumentError(
            f"{where}: rank {rank!r} of size {size!r}, expected integers with 0 <= rank < size"
        )
    if named != rank:
        raise InvalidArgumentError(
            f"{where}: records rank {rank}, expected {named} (the rank in its name)"
        )
    entries = doc["entries"]
    keys = ("op", "group", "seq", "state")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and all(k in e for k in keys) for e in entries
    ):
        raise InvalidArgumentError(
            f"{where}: entries is not a list of calls (each with {', '.join(keys)})"
        )
    if not isinstance(doc.get("groups", {}), dict):
        raise InvalidArgumentError(f"{where}: groups is not an object")
    # the fields the analysis compares across dumps, by type (a seq "5" in one dump against
    # 5 in another was a traceback from sorting them together: an outside hunt)
    for i, e in enumerate(entries):
        wrong = [
            k
            for k, kinds in _ENTRY_TYPES.items()
            if k in e and not any(type(e[k]) is kind for kind in kinds)
        ]
        if wrong or e["state"] not in _STATES:
            what = f"{wrong[0]} is {e[wrong[0]]!r}" if wrong else f"state is {e['state']!r}"
            raise InvalidArgumentError(
                f"{where}: entry {i}: {what}, not as the flight recorder writes it"
            )
    if doc.get("job") is not None and type(doc["job"]) is not str:
        raise InvalidArgumentError(f"{where}: job is {doc['job']!r}, expected a string")
    if type(doc.get("program_ended", False)) is not bool:
        raise InvalidArgumentError(
            f"{where}: program_ended is {doc['program_ended']!r}, expected true or false"
        )
    if size > MAX_WORLD:  # (the analysis lists the ranks without a dump: 10**11 ran for ever)
        raise InvalidArgumentError(
            f"{where}: size {size:,}, expected a world of at most {MAX_WORLD:,} ranks"
        )
    try:  # every field the analysis reads, as the recorder writes it: the analysis of this
        # dump alone reads them all (a wrong type was a traceback, not a line naming the file)
        float(doc.get("time") or 0)
        analyze({rank: doc}, size)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise InvalidArgumentError(
            f"{where}: not a flight recorder dump as it writes them: {type(exc).__name__}: {exc}"
        ) from None
    return doc


# an entry's states: a call started (and not seen end), completed, failed (raised after it
# started), or refused on this rank before it ran (it took its number all the same)
_STATES = ("started", "completed", "failed", "refused")

# an entry's fields the analysis reads, and the types the recorder writes them in
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "op": (str,),
    "group": (str,),
    "gid": (str, type(None)),
    "seq": (int,),
    "state": (str,),
    "dtype": (str, type(None)),
    "shape": (list, type(None)),
    "redop": (str, type(None)),
    "async": (bool,),
    "error": (str, type(None)),
    "site": (str, type(None)),
}


def _job_text(job: str | None, size: int) -> str:
    return f"{'job ' + job if job else 'no job named'}, {size} ranks"


def load_trace(directory: str | os.PathLike[str]) -> Trace:
    """The dumps of the newest job in ``directory`` (the job of the most recent dump).

    Dumps belong to one job when they record the same job (:func:`job_identity`) and world
    size; files another job left there are left out, and so are ``rank*.json`` files not
    named ``rank<N>.json``, each with a note in ``Trace.left_out``.

    Raises:
        InvalidArgumentError: a ``rank<N>.json`` is unreadable, not JSON (truncated) or not
            a dump; the message names the file.
    """
    notes: list[str] = []
    found: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(Path(directory).glob("rank*.json")):
        named = _DUMP_NAME.fullmatch(path.name)
        if named is None:
            notes.append(f"{path.name} (not named rank<N>.json: not a dump)")
            continue
        found.append((path, _read_dump(path, int(named.group(1)))))
    if not found:
        return Trace({}, None, None, tuple(notes))
    jobs: dict[tuple[str | None, int], list[tuple[Path, dict[str, Any]]]] = {}
    for path, doc in found:
        jobs.setdefault((doc.get("job") or None, doc["size"]), []).append((path, doc))

    def newest(key: tuple[str | None, int]) -> float:
        return max(float(doc.get("time") or 0) for _, doc in jobs[key])

    chosen = max(jobs, key=newest)
    job, size = chosen
    latest = newest(chosen)
    for key in sorted((k for k in jobs if k != chosen), key=newest):
        files = ", ".join(p.name for p, _ in jobs[key])
        notes.append(
            f"{files} (another job: {_job_text(*key)}, its newest dump {latest - newest(key):.0f} "
            f"s older than that of the job analyzed: {_job_text(job, size)})"
        )
    docs = {doc["rank"]: doc for _, doc in jobs[chosen]}
    return Trace(docs, size, job, tuple(notes))


def load(directory: str | os.PathLike[str]) -> tuple[dict[int, dict[str, Any]], int | None]:
    """Every rank's dump of the newest job in ``directory`` and its world size (see
    :func:`load_trace`)."""
    trace = load_trace(directory)
    return trace.docs, trace.size


def _count(value: Any) -> int:
    """A dump's count field as an int (0 where missing, from an older hpccomm, or not one)."""
    return value if type(value) is int else 0


def _ranks(ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    if not rs:
        return "no rank"
    runs: list[str] = []
    start = prev = rs[0]
    for r in [*rs[1:], -1]:  # -1 closes the last run
        if r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(runs)


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _desc(e: dict[str, Any]) -> str:
    return f"{e['op']} #{e['seq']} on {e['group']}{_args(e)}"


def _args(e: dict[str, Any]) -> str:
    """A record's shape, dtype and call site, as _desc writes them after the call."""
    what = ""
    if e.get("shape") is not None:
        what += f" {tuple(e['shape'])} {e['dtype']}"
    if e.get("site"):
        what += f" at {e['site']}"
    return what


def _entered(by_rank: dict[int, dict[str, Any]]) -> str:
    """One call as the ranks waiting in it entered it: each rank's arguments where they
    differ (the first rank's alone named them all before)."""
    sample = next(iter(by_rank.values()))
    args: dict[str, list[int]] = {}
    for r in sorted(by_rank):
        args.setdefault(_args(by_rank[r]), []).append(r)
    if len(args) == 1:
        return _desc(sample)
    each = "; ".join(f"{a.strip() or 'no array'} on {_ranks(rs)}" for a, rs in args.items())
    return f"{sample['op']} #{sample['seq']} on {sample['group']} ({each})"


def _differs(r: int, mine: dict[str, Any], by_rank: dict[int, dict[str, Any]]) -> str:
    """How world rank ``r``'s record of a call (``mine``, which it completed or failed)
    differs from those of the ranks waiting in it (``by_rank``) in what every rank must pass
    alike, with both sides' values: ``dtype float32 on rank 0 but float64 on rank 1``; ""
    where it does not."""
    other_op = {r2: e for r2, e in by_rank.items() if e["op"] != mine["op"]}
    if other_op:
        return f"the call is {mine['op']} on rank {r} but {_values(other_op, lambda e: e['op'])}"
    said = []
    for field, label in _compared(mine["op"]):
        value = partial(_shown, field=field)
        own = value(mine)
        others = {r2: e for r2, e in by_rank.items() if value(e) not in (None, own)}
        if own is not None and others:
            said.append(f"{label} {own} on rank {r} but {_values(others, value)}")
    return "; ".join(said)


def _values(by_rank: dict[int, dict[str, Any]], value: Callable[[dict[str, Any]], Any]) -> str:
    """``float64 on rank 1, float16 on ranks 2-3``: each value of the ranks' records."""
    ranks: dict[str, list[int]] = {}
    for r, e in sorted(by_rank.items()):
        ranks.setdefault(str(value(e)), []).append(r)
    return ", ".join(f"{v} on {_ranks(rs)}" for v, rs in ranks.items())


def _unseen(by_rank: dict[int, dict[str, Any]]) -> bool:
    """Whether only async_op calls hold a call that ranks are "in": a Work's record stays
    "started" until the Work is waited for, though its operation may have completed long
    before (a kept, never waited Work led the verdict as "ranks 0-1 entered all_reduce #1
    ... and wait", ahead of the real hang; a one-member group's call too: hunt AQ)."""
    return all(e.get("async") for e in by_rank.values())


# the start of a dump's reason when an exception nobody caught ends the rank (runtime)
UNCAUGHT = "not caught:"

# a dump's reason that is an hpccomm error about a call ("CommTimeoutError: split #2 on ...")
_CALL_ERROR = re.compile(r"\w+Error: \w+ #\d+ on ")

_P2P = ("send", "recv", "sendrecv", "batch_isend_irecv", "send_object", "recv_object")

# what every rank of a collective must pass alike, by op (shapes may differ by rank in the
# others: uneven all_gather / all_to_all, a gather's or scatter's other ranks)
_SAME_SHAPE = ("all_reduce", "broadcast", "reduce")
_ROOTED = frozenset(spec.name for spec in SPECS if spec.root is not None and not spec.p2p)


def _compared(op: str) -> list[tuple[str, str]]:
    """The record fields every rank must pass alike in ``op``, each with its name in words."""
    fields = [("dtype", "dtype"), ("redop", "op")]
    if op in _SAME_SHAPE:
        fields.append(("shape", "shape"))
    if op in _ROOTED:
        fields.append(("peer", "root"))
    return fields


def _shown(e: dict[str, Any], field: str) -> str | None:
    """A record's value of a compared field as said; None where it has none (no data on that
    rank: a rooted call's other ranks)."""
    value = e.get(field)
    if value is None and field in ("dtype", "shape"):
        return None
    if value is None and field == "redop":  # (none: an op refused as given, or no op)
        return None
    if field == "redop":  # the op, not PREMUL_SUM's factor (each rank its own)
        value = str(value).partition("(")[0]
    return str(tuple(value or ())) if field == "shape" else str(value)


def _calls_differ(docs: dict[int, dict[str, Any]]) -> list[str]:
    """The collective calls whose records differ across ranks in what every rank must pass
    alike (dtype, root, reduce op; shape where the op needs it): ``world #1: the ranks'
    calls differ: dtype float64 on rank 0 but float32 on ranks 1-2``. Such a call is
    compared before MPI only above the debug level's size; below it MPI ran it, and the
    rank whose receive was cut short (MPI_ERR_TRUNCATE) was the one the analysis blamed,
    not the rank whose call differed (an outside hunt)."""
    calls: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    names: dict[tuple[str, int], str] = {}
    for r, doc in docs.items():
        for e in doc["entries"]:
            if e["op"] in _P2P:
                continue
            key = (e.get("gid") or e["group"], e["seq"])
            calls.setdefault(key, {})[r] = e
            names[key] = e["group"]
    lines = []
    for key, by_rank in sorted(calls.items(), key=lambda kv: kv[0][1]):
        if len(by_rank) < 2 or len({e["op"] for e in by_rank.values()}) > 1:
            continue  # (ops that differ are said where the ranks wait)
        op = next(iter(by_rank.values()))["op"]
        said = []
        for field, label in _compared(op):
            values: dict[str, list[int]] = {}
            for r, e in sorted(by_rank.items()):
                shown = _shown(e, field)
                if shown is not None:
                    values.setdefault(shown, []).append(r)
            if len(values) > 1:
                first, *rest = sorted(values.items(), key=lambda kv: len(kv[1]))
                said.append(
                    f"{label} {first[0]} on {_ranks(first[1])} but "
                    + ", ".join(f"{v} on {_ranks(rs)}" for v, rs in rest)
                )
        if said:
            lines.append(
                f"{names[key]} #{key[1]} ({op}): the ranks' calls differ: {'; '.join(said)}"
            )
    return lines


# how a blocking call's error starts where it ran past its timeout (CommTimeoutError)
_TIMED_OUT = ": not complete after "


def _timed_out_p2p(docs: dict[int, dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Each rank whose last call was a blocking send or recv that ran past its timeout, no
    call of the rank starting after it ended: (world rank, its entry). Where the program set
    a timeout a receive that waited for ever without one is cancelled there and recorded
    failed, so the analysis, which read the calls still running, said nothing of a
    mistagged send or of two ranks both receiving first; it named the receive's own error
    only (an outside hunt). A timeout the rank went on from is not where it waits."""
    out = []
    for r, doc in sorted(docs.items()):
        entries = doc["entries"]
        last = entries[-1] if entries else None
        if last is None or last["op"] not in ("send", "recv") or last.get("async"):
            continue
        if last["state"] != "failed" or _TIMED_OUT not in (last.get("error") or ""):
            continue
        end = last.get("t_end")
        if end is not None and any((e.get("t_start") or 0.0) > end for e in entries):
            continue
        out.append((r, last))
    return out


def _overlap(entries: list[dict[str, Any]]) -> bool:
    """Whether the calls of ``entries`` ran at one time (a ring of waits is one only then)."""
    start = max((e.get("t_start") or 0.0) for e in entries)
    end = min((e["t_end"] if e.get("t_end") is not None else math.inf) for e in entries)
    return start < end


def _p2p_waits(
    p2p: list[tuple[int, dict[str, Any]]], groups: dict[str, dict[str, Any]]
) -> dict[int, tuple[str, int, dict[str, Any]]]:
    """Each rank's latest blocking send or recv with a named peer: world rank -> (op, the
    peer's world rank, entry)."""
    waits: dict[int, tuple[str, int, dict[str, Any]]] = {}
    for r, e in p2p:  # (in entry order: the latest call of a rank wins)
        peer = e.get("peer")
        if peer is None or e.get("async") or e["op"] not in ("send", "recv"):
            continue
        waits[r] = (e["op"], _to_world(e, groups), e)
    return waits


def _peer_tag(e: dict[str, Any]) -> str:
    """ " (peer rank 1, tag 2)" for an entry that names them."""
    parts = [f"peer rank {e['peer']}"] if e.get("peer") is not None else []
    if e.get("tag") is not None:
        parts.append(f"tag {e['tag']}")
    return f" ({', '.join(parts)})" if parts else ""


def _to_world(e: dict[str, Any], groups: dict[str, dict[str, Any]]) -> Any:
    """An entry's peer as a world rank (its group rank where the group is not known)."""
    members = groups.get(e.get("gid") or e["group"], {}).get("members")
    peer = e.get("peer")
    if members and peer is not None and 0 <= peer < len(members):
        return members[peer]
    return peer


def _accountable(doc: dict[str, Any], gid: str, receiver: bool) -> bool:
    """Whether a rank's trace can count its point-to-point messages on group ``gid`` one
    by one. The receiver's: it dropped no entry, and took none with a sendrecv, a batch or
    a receive from any rank or with any tag (their records do not say which message they
    took). The sender's: no sendrecv or batch of it still runs (it may hold the send
    waited for)."""
    if receiver and _count(doc.get("recorded")) > len(doc["entries"]):
        return False
    for f in doc["entries"]:
        if (f.get("gid") or f["group"]) != gid:
            continue
        if f["op"] in ("sendrecv", "batch_isend_irecv") and (receiver or f["state"] == "started"):
            return False
        if receiver and f["op"] == "recv" and (f.get("peer") is None or f.get("tag") is None):
            return False
    return True


def _tags_unmatched(
    blocked: dict[int, tuple[str, int, dict[str, Any]]],
    docs: dict[int, dict[str, Any]],
    groups: dict[str, dict[str, Any]],
) -> list[tuple[int, str]]:
    """A blocking receive whose sender sent it messages that, by both ranks' traces, no
    receive of it took (sends of every state but failed, less its completed receives of
    each tag), none with the receive's tag: (its world rank, said naming their tags: a
    skipped or mistagged send). Sends that completed count too: a send of another tag
    completes (eager) before any receive takes it, and was missed, the ring of waits
    then called a deadlock with the wrong advice (an outside hunt)."""
    out = []
    for r, (op, peer, e) in sorted(blocked.items()):
        if op != "recv" or e.get("tag") is None or peer not in docs or r not in docs:
            continue
        gid = e.get("gid") or e["group"]
        if not _accountable(docs[r], gid, True) or not _accountable(docs[peer], gid, False):
            continue  # (review AJ: a real deadlock was called a tag mismatch where rank 0
            # had taken the messages with sendrecv, a batch, a wildcard, or dropped them)
        left: dict[Any, int] = {}
        for f in docs[peer]["entries"]:
            if (
                f["op"] == "send"
                and f.get("tag") is not None
                and f["state"] != "failed"
                and (f.get("gid") or f["group"]) == gid
                and _to_world(f, groups) == r
            ):
                left[f["tag"]] = left.get(f["tag"], 0) + 1
        for f in docs[r]["entries"]:
            if (
                f["op"] == "recv"
                and f["state"] == "completed"
                and f.get("tag") in left
                and (f.get("gid") or f["group"]) == gid
                and _to_world(f, groups) == peer
            ):
                left[f["tag"]] -= 1
        tags = sorted(t for t, n in left.items() if n > 0)
        if tags and e["tag"] not in tags:
            out.append((r, (
                f"rank {r}'s receive from rank {peer} (tag {e['tag']}) has no matching send: "
                f"rank {peer}'s sends to rank {r} that no receive of rank {r} took (by their "
                f"traces) have tag(s) {tags} (a send skipped, or the tags differ)"
            )))  # fmt: skip
    return out


def _p2p_cycle(waits: dict[int, tuple[str, int, dict[str, Any]]]) -> list[int] | None:
    """World ranks that wait for one another (``waits``: :func:`_p2p_waits`) in a ring of
    blocking calls of one kind (each receiving from the next, or each sending to the next:
    no send of the ring can be taken by a receive of it), in ring order; None when there is
    no such ring. A send facing a receive is no deadlock (see _p2p_facing)."""
    for start in sorted(waits):
        kind = waits[start][0]
        ring = [start]
        at = waits[start][1]
        while at in waits and at not in ring and waits[at][0] == kind:
            ring.append(at)
            at = waits[at][1]
        if at == start and len(ring) > 1:
            return ring
    return None


def _p2p_facing(waits: dict[int, tuple[str, int, dict[str, Any]]]) -> str | None:
    """A blocking send and a blocking receive (``waits``: :func:`_p2p_waits`) that wait on
    each other yet do not match (their tags, or sizes above the eager limit, differ),
    described; else None."""
    for r in sorted(waits):
        op, peer, e = waits[r]
        other = waits.get(peer)
        if op == "send" and other is not None and other[0] == "recv" and other[1] == r:
            f = other[2]
            if "failed" in (e["state"], f["state"]) and not _overlap([e, f]):
                continue  # (one timed out before the other began: they never faced)
            return (
                f"rank {r}'s send to rank {peer} (tag {e.get('tag')}, {e.get('count')} "
                f"elements) and rank {peer}'s receive from rank {r} (tag {f.get('tag')}, "
                f"{f.get('count')} elements) wait on each other: their tags or sizes differ"
            )
    return None


# What a rank's timeout error says of the others, asked at the timeout (dispatch's
# whereabouts): "...; where the other ranks are (asked at the timeout): rank 0: last call of
# this group #2, waits in all_reduce #5 on world (rank 0 of 4); rank 1 (world rank 3) has
# left the job (...) ...", and the same of a point-to-point call's peers
_ASKED = re.compile(
    r"; where (?:the other ranks(?: listed)? are|its peers are) \(asked at the timeout\): "
)
_ABOUT = re.compile(r"(\w+) #(\d+) on (\S+) \(rank \d+ of \d+\)")  # the call that asked
_PART = re.compile(
    r"rank (\d+)(?: \(world rank (\d+)\))?(: | has left the job | freed | refused | failed )(.*)"
)
_NO_ANSWER = re.compile(  # the ranks that did not answer (Dispatcher._no_answer)
    r"no answer within (\S+) s from rank\(s\) \[([\d, ]*)\]"
    r"(?: \(world rank\(s\) \[([\d, ]*)\]\))? \((.*)\)"
)
_GROUP_RANK = re.compile(r" \(rank \d+ of \d+\)")  # a group rank in a call's name
_WAITS_IN = re.compile(r"waits in (\w+) #(\d+) on (\S+)")
_IN_IT = "waits in it too"

_Call = tuple[str, int]  # a collective call: group id, sequence number


@dataclass(frozen=True)
class _Heard:
    """What the dump of world rank ``by`` says of another rank: where it was when ``by``
    asked at its timeout in call ``about`` (its group id and number ``call``, where known),
    in the words of the error (``text``), and the departure it heard of (``left``); or
    that it did not answer (``answered`` False, ``text`` saying so)."""

    by: int
    about: str  # "all_reduce #3 on world/tp" ("" where the error does not name it)
    call: _Call | None
    text: str  # "last call of world/tp #2, waits in all_reduce #5 on world"
    left: str | None
    time: float
    answered: bool = True


def _gid_of(groups: Mapping[str, Any], name: str, world_rank: int) -> str | None:
    """The id of the group named ``name`` that holds ``world_rank`` (the groups one split
    makes share a name, not a member)."""
    for gid, g in groups.items():
        if g.get("name") == name and world_rank in (g.get("members") or ()):
            return gid
    return None


def _in_parens(text: str) -> str:
    """What the parentheses opening ``text`` hold: ``"(a (b)) c"`` -> ``"a (b)"``."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return text[1:i] if i else text
    return text[1:]


def _heard(docs: dict[int, dict[str, Any]]) -> dict[int, list[_Heard]]:
    """What the dumps' timeout errors (a dump's reason, its failed calls' errors) say of
    where the other ranks were, asked at the timeout: world rank -> what each dump heard."""
    out: dict[int, list[_Heard]] = {}
    for by, doc in docs.items():
        texts = [(doc["reason"], float(doc.get("time") or 0))]
        texts += [
            (e["error"], float(e.get("t_end") or e.get("t_start") or 0))
            for e in doc["entries"]
            if e["state"] == "failed" and isinstance(e.get("error"), str)
        ]
        for text, when in texts:
            asked = _ASKED.search(text) if isinstance(text, str) else None
            if asked is None:
                continue
            about = _ABOUT.search(text, 0, asked.start())  # (after "not caught: " too)
            name, call, what = "", None, ""
            if about is not None:
                op, seq, name = about.group(1), int(about.group(2)), about.group(3)
                what = f"{op} #{seq} on {name}"
                gid = next(
                    (
                        e.get("gid") or e["group"]
                        for e in reversed(doc["entries"])
                        if e["group"] == name and e["seq"] == seq
                    ),
                    None,
                ) or _gid_of(doc.get("groups", {}), name, by)
                call = None if gid is None or op in _P2P else (gid, seq)
            for part in text[asked.end() :].split("; "):
                m = _PART.fullmatch(part)
                silent = _NO_ANSWER.fullmatch(part) if m is None else None
                if silent is not None:  # alive or not, it was not waiting in a bounded call
                    said = f"it did not answer within {silent.group(1)} s ({silent.group(4)})"
                    for w in (silent.group(3) or silent.group(2)).split(","):
                        if w.strip():
                            out.setdefault(int(w), []).append(
                                _Heard(by, what, call, said, None, when, answered=False)
                            )
                    continue
                if m is None:  # (a tail about every rank)
                    continue
                world = int(m.group(2) or m.group(1))
                said = _GROUP_RANK.sub("", m.group(4)).replace("this rank", f"rank {by}")
                said = said.replace("this group", name or "its group")
                why = None
                if m.group(3) == " has left the job ":
                    why = _in_parens(said)
                    said = "it has left the job " + said
                elif m.group(3) != ": ":  # freed the group, refused or failed the call
                    said = f"it{m.group(3)}{said}"
                out.setdefault(world, []).append(_Heard(by, what, call, said, why, when))
    return out


def _heard_text(lead: str, h: _Heard) -> str:
    """A rank without a trace file, with what another rank's dump heard of it."""
    at = f"at its timeout in {h.about}" if h.about else "at its timeout"
    if not h.answered:
        return f"{lead}; rank {h.by} asked where it was {at}: {_short(h.text, 160)}"
    return f"{lead}, but rank {h.by} heard {at} where it was: {_short(h.text, 160)}"


def _collective_waits(
    pending: dict[int, list[dict[str, Any]]],
    heard: dict[int, list[_Heard]],
    waits: dict[_Call, dict[int, dict[str, Any]]],
    groups: dict[str, dict[str, Any]],
    finished: Mapping[_Call, set[int]] | None = None,
) -> tuple[dict[int, _Call], dict[_Call, list[int]], dict[int, str]]:
    """Where each rank is blocked in a collective call (its latest blocking one; for a rank
    without a file, the newest one another rank heard it wait in): world rank -> the call;
    each such call -> its members blocked in another call (not those whose own records hold
    it completed or failed: ``finished``, call -> such ranks); world rank -> the call's
    name."""
    blocked: dict[int, _Call] = {}
    named: dict[int, str] = {}
    for r, es in pending.items():
        for e in es:
            if e["op"] not in _P2P and not e.get("async"):
                blocked[r] = (e.get("gid") or e["group"], e["seq"])
                named[r] = f"{e['op']} #{e['seq']} on {e['group']}"
    for w, hs in heard.items():
        for h in sorted(hs, key=lambda h: h.time):
            m = _WAITS_IN.search(h.text)
            gid = None if m is None else _gid_of(groups, m.group(3), w)
            if m is not None and gid is not None and m.group(1) not in _P2P:
                blocked[w] = (gid, int(m.group(2)))
                named[w] = f"{m.group(1)} #{m.group(2)} on {m.group(3)}"
            elif h.text == _IN_IT and h.call is not None and h.call in waits:
                blocked[w], named[w] = h.call, h.about
    entered = {c: set(by_rank) for c, by_rank in waits.items()}
    for r, c in blocked.items():
        entered.setdefault(c, set()).add(r)
    for c, ranks in (finished or {}).items():  # past it, not waiting for it to be entered: a
        if c in entered:  # rank that completed a call whose dtype differed, then waited in
            entered[c] |= ranks  # another group's, was a link of a "deadlock" (hunt AQ)
    needs = {
        c: [
            m
            for m in groups.get(c[0], {}).get("members") or ()
            if m in blocked and m not in entered[c]
        ]
        for c in set(blocked.values())
    }
    return blocked, needs, named


def _wait_cycle(blocked: dict[int, _Call], needs: dict[_Call, list[int]]) -> list[int] | None:
    """World ranks that wait for one another across collective calls: each blocked in its
    call (``blocked``), which the next rank has not entered (``needs``: call -> the members
    blocked in another call), in wait order from the lowest rank; None when there is none."""
    edges: dict[_Call, dict[_Call, int]] = {c: {} for c in needs}
    for c, ms in needs.items():
        for m in ms:
            edges[c].setdefault(blocked[m], m)  # call -> the call it waits for, through m
    state: dict[_Call, int] = {}  # 1: on the path, 2: explored
    for start in sorted(edges):
        if start in state:
            continue
        path, via = [start], list[int]()  # via[i]: the rank from path[i]'s call to path[i+1]'s
        todo = [iter(edges[start].items())]
        state[start] = 1
        while path:
            step = next(todo[-1], None)
            if step is None:
                state[path.pop()] = 2
                todo.pop()
                if via:
                    via.pop()
                continue
            nxt, m = step
            if state.get(nxt) == 1:  # m (blocked in nxt) closes the ring
                ring = [m, *via[path.index(nxt) :]]
                low = ring.index(min(ring))
                return ring[low:] + ring[:low]
            if nxt not in state and nxt in edges:
                state[nxt] = 1
                path.append(nxt)
                via.append(m)
                todo.append(iter(edges[nxt].items()))
    return None


def analyze(
    docs: dict[int, dict[str, Any]], size: int | None, *, left_out: Sequence[str] = ()
) -> str:
    """:func:`verdicts` as one paragraph (what ``hpccomm trace analyze`` prints)."""
    return ". ".join(verdicts(docs, size, left_out=left_out))


def verdicts(
    docs: dict[int, dict[str, Any]], size: int | None, *, left_out: Sequence[str] = ()
) -> list[str]:
    """The verdicts from every rank's dump (ranks are world ranks): calls whose records
    differ across ranks (dtype, root, op, shape), for every collective call some ranks wait
    in (those only async_op calls hold, whose Works may not have been waited for, last),
    which ranks entered it, which completed or failed it by their own records (with their
    arguments where they differ) and which never did (with their last completed call on
    that group), and where they are instead (another call, or gone: their program ended;
    for a rank without a file, what another rank's timeout heard of it), a ring of ranks
    waiting for one another across calls, the ranks that left no file, and the failed
    calls when nobody waits; then the files ``left_out`` (:attr:`Trace.left_out`)."""
    tail = [f"left out: {'; '.join(left_out)}"] if left_out else []
    if not docs:
        return ["no trace files: nothing to analyze", *tail]
    world = size or (max(docs) + 1)
    lines = []
    missing = [r for r in range(world) if r not in docs]
    # ranks whose program ended (a departure notice another rank's dump lists): no trace
    # file is theirs to write, where a rank killed hard cannot write one
    left: dict[int, str] = {}
    for doc in docs.values():
        for w, why in (doc.get("departed") or {}).items():
            left.setdefault(int(w), why)
    # where the ranks without a file were, as the others' timeouts heard (their departures
    # too: a notice may have reached only the asking)
    heard = {w: hs for w, hs in _heard(docs).items() if w not in docs}
    for w, hs in heard.items():
        for h in hs:
            if h.left is not None:
                left.setdefault(w, h.left)
    groups: dict[str, dict[str, Any]] = {}
    for doc in docs.values():
        groups.update(doc.get("groups", {}))
    pending: dict[int, list[dict[str, Any]]] = {}
    last: dict[int, dict[str, dict[str, Any]]] = {}
    failed: dict[int, list[dict[str, Any]]] = {}
    waits: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    # each rank's record of each collective call it completed or failed: a rank past the call
    # others wait in was said to have "never did" it (hunt AQ)
    own: dict[int, dict[_Call, dict[str, Any]]] = {}
    finished: dict[_Call, set[int]] = {}
    for r, doc in docs.items():
        for e in doc["entries"]:
            gid = e.get("gid") or e["group"]
            if e["state"] != "started" and e["op"] not in _P2P:
                own.setdefault(r, {})[(gid, e["seq"])] = e
                finished.setdefault((gid, e["seq"]), set()).add(r)
            if e["state"] == "started":
                pending.setdefault(r, []).append(e)
                if e["op"] not in _P2P:
                    waits.setdefault((gid, e["seq"]), {})[r] = e
            elif e["state"] in ("failed", "refused"):
                failed.setdefault(r, []).append(e)
            elif e["op"] not in _P2P:
                last.setdefault(r, {})[gid] = e
    for w, hs in heard.items():  # a rank without a file that another heard in its call
        for h in hs:
            if h.text == _IN_IT and h.call in waits and h.by in waits[h.call]:
                waits[h.call].setdefault(w, waits[h.call][h.by])
    lines.extend(_calls_differ(docs))  # the cause first, where the records show one
    # calls some rank waits in, before those only async_op calls hold (see _unseen)
    stuck = sorted(waits.items(), key=lambda kv: (_unseen(kv[1]), -len(kv[1]), kv[0][1]))
    told: set[int] = set()  # ranks without a file named already
    for (gid, seq), by_rank in stuck:  # (every one: a cap hid calls, and a ring's links)
        sample = next(iter(by_rank.values()))
        members = groups.get(gid, {}).get("members") or sorted(by_rank)
        ops = sorted({e["op"] for e in by_rank.values()})
        if len(ops) > 1:
            kinds = "; ".join(
                f"{_ranks([r for r, e in by_rank.items() if e['op'] == op])} {op}" for op in ops
            )
            what = f"different calls ({kinds})"
        else:
            what = _entered(by_rank)
        head = f"{sample['group']} #{seq}: {_ranks(by_rank)} "
        if _unseen(by_rank):
            head += f"started {what} with async_op, not seen complete (not waited for yet, or "
            head += "waited for now" + (
                "; every member started it: it may have completed)"
                if len(ops) == 1 and set(members) <= set(by_rank)
                else ")"
            )
        else:
            head += f"entered {what} and wait" + ("s" if len(by_rank) == 1 else "")
        lines.append(head)
        for r in [m for m in members if m not in by_rank]:
            if r not in docs:
                if r in left:
                    lines.append(
                        f"rank {r} never did: it left the job ({left[r]}) without a trace file"
                    )
                elif r in heard:  # best: heard at a timeout in this group, then the newest
                    h = max(  # (an answer before a silence)
                        heard[r],
                        key=lambda h: (h.answered, h.call is not None and h.call[0] == gid, h.time),
                    )
                    reached = h.answered and h.call == (gid, seq) and not h.text.startswith("last ")
                    lead = f"rank {r} {'' if reached else 'never did and '}left no trace file"
                    lines.append(_heard_text(lead, h))
                else:
                    lines.append(f"rank {r} never did and left no trace file (killed hard?)")
                told.add(r)
                continue
            this = own.get(r, {}).get((gid, seq))
            mine = last.get(r, {}).get(gid)
            if this is not None:  # its own record of the call: past it, not waiting for it
                text = f"rank {r} {this['state']} it (its call: {_desc(this)}"
                diff = _differs(r, this, by_rank)
                text += f", which differs: {diff})" if diff else ")"
                if this["state"] != "completed":  # failed, or refused before it ran
                    text += f": {_short(str(this.get('error')))}"
            elif mine is not None:
                text = f"rank {r} never did: its last completed call there was {_desc(mine)}"
            elif any((e.get("gid") or e["group"]) == gid for e in docs[r]["entries"]):
                # calls of the group, none completed (failed, or waiting: said below)
                text = f"rank {r} never did: none of its calls on that group completed"
            else:  # none in its trace: its ring may have dropped them (it said "it
                # completed no call on that group" after 2,500 calls: an outside hunt)
                kept = len(docs[r]["entries"])
                dropped = _count(docs[r].get("recorded")) - kept
                text = f"rank {r} never did: " + (
                    f"its trace holds no call of that group (it keeps a rank's last {kept:,} "
                    f"calls and dropped {dropped:,} older ones)"
                    if dropped > 0
                    else "it completed no recorded call on that group (group creations, "
                    "split, dup, new_group, are not recorded)"
                )
            # where it waits instead: another group's call, or another call of this group
            # (rank 1 in barrier #2 while #3 waits for it was "in no hpccomm call")
            elsewhere = [
                e
                for e in pending.get(r, [])
                if ((e.get("gid") or e["group"]), e["seq"]) != (gid, seq)
            ]
            blocking = [e for e in elsewhere if not e.get("async")]
            # its program ended: it waits at exit for the others, alive, and wrote its file on
            # a signal; the departures were read for ranks without a file only, and it was
            # "in no hpccomm call (computing, or stuck elsewhere)" (hunt AQ)
            ended = left.get(r) or (
                "its program ended: its trace was written at exit"
                if docs[r].get("program_ended") is True
                else None
            )
            uncaught = docs[r].get("reason", "").startswith(UNCAUGHT)
            if blocking or (elsewhere and not uncaught and ended is None):
                there = (blocking or elsewhere)[-1]
                text += f", and it waits in {_desc(there)}"
                if there["op"] in _P2P:  # (its peer and tag: a pipeline's recv, an outside hunt)
                    text += _peer_tag(there)
            elif r in failed and failed[r][-1] is not this:
                text += f", and its call {_desc(failed[r][-1])} {failed[r][-1]['state']}: {_short(failed[r][-1]['error'])}"
                if ended is not None and not uncaught:
                    text += f"; it has left the job ({ended})"
            elif uncaught:
                text += f", and it ended with an exception nobody caught: {_short(docs[r]['reason'].removeprefix(UNCAUGHT).strip())}"
            elif ended is not None:
                text += f", and it has left the job ({ended})"
            elif _CALL_ERROR.match(docs[r].get("reason", "")):  # a call's error, no record
                # (split, dup, new_group, monitored_barrier, create_group)
                text += f", and it reported {_short(docs[r]['reason'])}"
            else:
                text += ", and it is in no hpccomm call (computing, or stuck elsewhere)"
            lines.append(text)
    p2p = [(r, e) for r, es in sorted(pending.items()) for e in es if e["op"] in _P2P]
    # each rank's blocking send or recv with a peer: running, or its last, past its timeout
    blocked = _p2p_waits(_timed_out_p2p(docs) + p2p, groups)
    if waits:  # a receive that waits for a mistagged send, beside the collectives' waits
        lines.extend(text for _, text in _tags_unmatched(blocked, docs, groups))
    in_call, needs, named = _collective_waits(pending, heard, waits, groups, finished)
    cycle = _wait_cycle(in_call, needs)
    if cycle:
        lines.append(
            f"world ranks {' -> '.join(map(str, cycle + cycle[:1]))} each wait for the next in "
            f"a collective call the next has not entered, as it waits in another "
            f"({', '.join(f'rank {r} in {named[r]}' for r in cycle)}): a deadlock (none can "
            f"complete before another does: the ranks call their groups' collectives in "
            f"different orders, or one skipped a call)"
        )
    if not waits:
        # where each rank waits: its latest blocking call (every rank); then async calls not
        # seen complete (an isend never waited for stays "started" after its receive took
        # it), a few. The first three entries in rank order were listed, so one rank's
        # unwaited isends hid the receive that waited (an outside hunt)
        latest = {r: e for r, e in p2p if not e.get("async")}
        unwaited = [(r, e) for r, e in p2p if e.get("async")]
        for r, e in sorted(latest.items()):
            lines.append(f"rank {r} waits in {_desc(e)}{_peer_tag(e)}")
        for r, e in unwaited[:3]:
            lines.append(
                f"rank {r} has {_desc(e)}{_peer_tag(e)} not seen complete (async: not waited "
                f"for, or waited for now)"
            )
        if len(unwaited) > 3:
            lines.append(f"and {len(unwaited) - 3} more async point-to-point calls so")
        mistagged = _tags_unmatched(blocked, docs, groups)
        lines.extend(text for _, text in mistagged)
        ring = _p2p_cycle(blocked)
        until = ""
        if ring and any(blocked[r][2]["state"] == "failed" for r in ring):
            until = " (until their timeouts)"
            if not _overlap([blocked[r][2] for r in ring]):
                ring = None  # (one timed out before another began: no ring of waits)
        facing = None if ring else _p2p_facing(blocked)
        if ring and any(r in ring for r, _ in mistagged):
            lines.append(
                f"world ranks {' -> '.join(map(str, ring + ring[:1]))} each wait for the next "
                f"in a blocking point-to-point call{until}, because a receive's tag matches no "
                f"send (above): fix the tags, or send what was skipped"
            )
        elif ring:
            lines.append(
                f"world ranks {' -> '.join(map(str, ring + ring[:1]))} each wait for the next "
                f"in a blocking point-to-point call{until}: a deadlock (none can complete "
                f"before another does: post one side's call first, or use sendrecv or "
                f"isend/irecv)"
            )
        elif facing:
            lines.append(facing)
        if failed:
            lines.extend(
                f"rank {r}: {_desc(es[-1])} {es[-1]['state']}: {_short(es[-1]['error'])}"
                for r, es in sorted(failed.items())
            )
        elif not p2p:
            lines.append("no rank waits in a collective call")
    missing = [r for r in missing if r not in told]
    for why in sorted({left[r] for r in missing if r in left}):
        gone = [r for r in missing if left.get(r) == why]
        lines.append(
            f"{_ranks(gone)} left the job ({why}) without a trace file (a rank writes one on "
            f"a failure, not when its program ends)"
        )
    missing = [r for r in missing if r not in left]
    for r in [r for r in missing if r in heard]:  # alive when another rank asked
        newest = max(heard[r], key=lambda h: (h.answered, h.time))
        lines.append(_heard_text(f"rank {r} left no trace file", newest))
    missing = [r for r in missing if r not in heard]
    if missing:
        lines.append(f"{_ranks(missing)} left no trace file (killed hard, or not tracing)")
    reasons = sorted({_short(doc["reason"]) for doc in docs.values()})
    more = f" and {len(reasons) - 3} more" if len(reasons) > 3 else ""
    lines.append("(dumps written on: " + "; ".join(reasons[:3]) + more + ")")
    return lines + tail
