"""The record step: the records of calls and the listeners that observe them.

Every call gets a sequence number on its group (collectives and point-to-point counted
separately, since only collectives must be called in the same order on every rank). Only when
someone listens does dispatch build a :class:`Record` (op, group, sequence number, peer, dtype,
shape, times, error) and notify; with no listener the record step is one integer increment.
"""

from __future__ import annotations

import contextlib
import operator
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from .dtypes import as_reduce_op
from .errors import HpccommError, InvalidArgumentError
from .ops import Call

__all__ = [
    "Record",
    "Refusal",
    "CallLog",
    "add_listener",
    "remove_listener",
    "listeners",
    "notify",
    "error_hooks",
    "report_error",
    "refusal_hooks",
    "note_refusal",
    "reported",
]

# Dispatch reads this list directly: an empty list means "no one listens".
listeners: list[Callable[[str, Record], None]] = []
# Called with every hpccomm error a call raises to its caller (the flight recorder's dump).
error_hooks: list[Callable[[BaseException], None]] = []
# Called with every collective refused on this rank before it ran (the flight recorder's ring)
refusal_hooks: list[Callable[[Refusal], None]] = []


class Record:
    """One call as listeners see it: the validated call, its sequence number, whether it was
    asynchronous, its start and end times (``time.perf_counter``) and its error, if any."""

    __slots__ = ("call", "seq", "async_op", "t_start", "t_end", "error", "gid", "site", "source")

    def __init__(
        self, call: Call, seq: int, async_op: bool, gid: str = "", site: str | None = None
    ) -> None:
        self.call = call
        self.seq = seq
        self.async_op = async_op
        self.t_start = 0.0
        self.t_end = 0.0
        self.error: BaseException | None = None
        self.gid = gid or call.group.name  # the group's id, alike on every member
        self.site = site  # the caller's file:line (debug "detail")
        # an async call run on the group's worker thread: its job there (an executor
        # Future), which a flight recorder's dump reads to tell an operation that has
        # completed from one still running while its Work has not been waited for
        self.source: Any = None

    @property
    def group(self) -> Any:
        """The call's group (its name and members)."""
        return self.call.group

    def where(self) -> str:
        """``"op #seq on group (rank r of n)"``, the prefix of messages about this call."""
        return self.call.where(self.seq)

    def describe(self) -> dict[str, Any]:
        """A plain dict of the record (for logs, flight recorders and tests)."""
        c = self.call
        ran = getattr(c.backend, "ran_on", None)  # a backend that may hand a call on
        return {
            "op": c.spec.name,
            "group": c.group.name,
            "seq": self.seq,
            "peer": c.peer,
            "tag": c.tag,
            "dtype": None if c.info is None else c.info.name,
            "shape": c.shape,
            "count": c.count,
            "redop": None if c.redop is None else repr(c.redop),
            "backend": getattr(c.backend, "name", None) if ran is None else ran(self.seq),
            "async": self.async_op,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "error": None if self.error is None else str(self.error),
        }


class Refusal:
    """A collective refused on this rank before it ran (by validation, or a guard before
    it): it takes its sequence number all the same, so the flight recorder keeps it in its
    place, with the arguments as given (which validation refused) and the error. The
    analysis of a trace said such a rank "never did" the call, or that it was in no call."""

    __slots__ = ("op", "group", "gid", "seq", "dtype", "shape", "peer", "redop", "error",
                 "t_start", "t_end", "site")  # fmt: skip

    def __init__(
        self,
        op: str,
        group: Any,
        gid: str,
        seq: int,
        args: tuple[Any, ...] | None,
        redop: Any,
        error: BaseException,
        site: str | None = None,
    ) -> None:
        self.op, self.group, self.gid, self.seq = op, group, gid, seq
        data, peer = (args[0], args[1]) if args else (None, None)
        self.dtype, self.shape = _given(data)
        self.peer = _root(peer)
        self.redop = None
        if redop is not None:
            try:
                self.redop = repr(as_reduce_op(redop, ""))
            except Exception:  # noqa: BLE001 - an op validation refused: its error says it
                pass
        # its text (the exception's traceback would keep the call's arrays alive in the ring)
        self.error = str(error)
        self.t_start = self.t_end = time.perf_counter()
        self.site = site

    def describe(self) -> dict[str, Any]:
        """The fields of :meth:`Record.describe`, as far as the refused arguments give them."""
        return {
            "op": self.op,
            "group": self.group.name,
            "seq": self.seq,
            "peer": self.peer,
            "tag": None,
            "dtype": self.dtype,
            "shape": self.shape,
            "count": None,
            "redop": self.redop,
            "backend": None,
            "async": False,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "error": self.error,
        }


def _root(peer: Any) -> int | str | None:
    """A root as given, as the recorder writes roots: an int where it is an integer (a NumPy
    integer too: written as its repr, the analysis said the roots differ), else its repr."""
    if peer is None or type(peer) is int:
        return peer
    if not isinstance(peer, bool) and hasattr(type(peer), "__index__"):
        try:
            return operator.index(peer)
        except Exception:  # noqa: BLE001 - an array of several values, a float tensor
            pass
    try:
        return f"{peer!r:.60}"
    except Exception:  # noqa: BLE001 - a repr that raises
        return f"a {type(peer).__name__}"


def _given(data: Any) -> tuple[str | None, tuple[int, ...] | None]:
    """The dtype name and shape of an argument as given, where it has them (an array of any
    library); (None, None) for anything else."""
    try:
        shape = tuple(int(n) for n in data.shape)
        dtype = data.dtype
        name = getattr(dtype, "name", None)  # (NumPy's and CuPy's dtypes; torch's has none:
        # "torch.float32" beside the others' "float32" was said to differ)
        return (name if isinstance(name, str) else str(dtype).removeprefix("torch.")), shape
    except Exception:  # noqa: BLE001 - no array: a list, None, an object whose shape raises
        return None, None


def note_refusal(refusal: Refusal) -> None:
    """Tell the refusal hooks about a collective refused on this rank (never raises)."""
    for fn in refusal_hooks:
        try:
            fn(refusal)
        except Exception:  # noqa: BLE001 - a hook must not replace the real error
            pass


def add_listener(fn: Callable[[str, Record], None]) -> None:
    """Register ``fn(event, record)``; event is "start" or "end". Costs time on every call.
    An exception from ``fn`` is said on stderr (its first one, with the traceback), never
    raised: the call goes on as on the other ranks."""
    if not callable(fn):  # (found at the next call, with a traceback on stderr, before)
        raise InvalidArgumentError(
            f"add_listener: fn is {type(fn).__name__} {fn!r:.60}, expected a callable "
            f"fn(event, record)"
        )
    listeners.append(fn)


def remove_listener(fn: Callable[[str, Record], None]) -> None:
    """Unregister a listener added with :func:`add_listener` (no error if absent)."""
    if fn in listeners:
        listeners.remove(fn)
        _failed.pop(id(fn), None)  # (its id may be another listener's later)


def report_error(exc: BaseException) -> None:
    """Tell the error hooks about an error about to reach the caller (never raises)."""
    for fn in error_hooks:
        try:
            fn(exc)
        except Exception:  # a hook must not replace the real error
            pass


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """An hpccomm error raised inside reaches the error hooks (the flight recorder's dump) on
    its way to the caller: for steps that make no Record (group creation, monitored_barrier)."""
    try:
        yield
    except HpccommError as exc:
        report_error(exc)
        raise


def notify(event: str, record: Record) -> None:
    """Stamp the start or end time on ``record`` and tell every listener."""
    if event == "start":
        record.t_start = time.perf_counter()
    else:
        record.t_end = time.perf_counter()
    for fn in listeners:
        try:
            fn(event, record)
        except Exception:  # noqa: BLE001 - an observer must not stop a call on one rank
            _said_listener_failed(fn, event, record)


# the listeners whose failure was said (by id; only the first of each is, with its traceback)
_failed: dict[int, int] = {}


def _said_listener_failed(fn: Any, event: str, record: Record) -> None:
    """A listener raised: raised to the caller, its error stopped this rank's call before
    MPI (or failed one that had completed) while the other ranks ran it, and the ranks were
    out of step from then on: wrong sums, then a hang (an outside hunt). Said on stderr
    instead, the first time for each listener with its traceback."""
    key = id(fn)
    count = _failed.get(key, 0)
    _failed[key] = count + 1
    if count:
        return
    sys.stderr.write(
        f"hpccomm: the listener {fn!r} raised at the {event} of {record.where()} (the call "
        f"goes on; later failures of this listener are not said):\n{traceback.format_exc()}"
    )
    sys.stderr.flush()


class CallLog:
    """A listener that keeps the records of finished calls; a context manager.

    Example::

        with hpccomm.CallLog() as log:
            comm.all_reduce(x)
        log.records[0]["op"] == "all_reduce"
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def __call__(self, event: str, record: Record) -> None:
        if event == "end":
            self.records.append(record.describe())

    def __enter__(self) -> CallLog:
        add_listener(self)
        return self

    def __exit__(self, *exc: object) -> None:
        remove_listener(self)
