"""The per-call record every operation produces, and the listeners that observe it.

Dispatch fills one :class:`Call` per operation (sequence number on its group, op, group,
root/peer, dtype, shape, count) and, only when a listener is registered, takes start/end
times and notifies. With no listener the cost is one list truth test per call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["Call", "add_listener", "remove_listener", "listeners", "CallLog"]

# Dispatch reads this list directly: an empty list means "no one listens".
listeners: list[Callable[[str, Call], None]] = []


class Call:
    """One operation as dispatch saw it. Listeners receive ("start" | "end", call)."""

    __slots__ = (
        "op",
        "comm",
        "seq",
        "peer",
        "tag",
        "buf",
        "out",
        "redop",
        "info",
        "counts",
        "async_op",
        "stream",
        "payload",
        "result",
        "t_start",
        "t_end",
        "error",
        "quiet",
    )

    def __init__(self, op, comm, seq, peer, tag, buf, out, redop, async_op, stream, payload):
        self.op = op
        self.comm = comm
        self.seq = seq
        self.peer = peer
        self.tag = tag
        self.buf = buf
        self.out = out
        self.redop = redop
        self.info = None
        self.counts = None
        self.async_op = async_op
        self.stream = stream
        self.payload = payload
        self.result = None
        self.t_start = 0.0
        self.t_end = 0.0
        self.error = None
        self.quiet = False  # an inner call of a backend (staging): not reported to listeners

    def __str__(self) -> str:
        """The "op (rank r of n)" prefix of every message about this call."""
        return f"{self.op.name} (rank {self.comm.rank} of {self.comm.size})"

    @property
    def dtype(self) -> str | None:
        return None if self.buf is None else self.buf.dtype.name

    @property
    def shape(self) -> tuple[int, ...] | None:
        return None if self.buf is None else tuple(self.buf.array.shape)

    @property
    def nbytes(self) -> int:
        b = self.buf if self.buf is not None else self.out
        return 0 if b is None else b.count * b.dtype.itemsize

    def describe(self) -> dict[str, Any]:
        """A plain dict of the record (for logs, flight recorders and tests)."""
        return {
            "op": self.op.name,
            "group": self.comm.name,
            "seq": self.seq,
            "peer": self.peer,
            "dtype": self.dtype,
            "shape": self.shape,
            "count": None if self.buf is None else self.buf.count,
            "redop": None if self.redop is None else repr(self.redop),
            "async": self.async_op,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "error": None if self.error is None else str(self.error),
        }


def add_listener(fn: Callable[[str, Call], None]) -> None:
    """Register ``fn(event, call)``; event is "start" or "end". Costs time on every call."""
    listeners.append(fn)


def remove_listener(fn: Callable[[str, Call], None]) -> None:
    """Unregister a listener added with :func:`add_listener` (no error if absent)."""
    if fn in listeners:
        listeners.remove(fn)


def notify(event: str, call: Call) -> None:
    if event == "start":
        call.t_start = time.perf_counter()
    else:
        call.t_end = time.perf_counter()
    for fn in listeners:
        fn(event, call)


class CallLog:
    """A listener that keeps the records of finished calls; a context manager.

    Example::

        with hpccomm.CallLog() as log:
            comm.all_reduce(x)
        log.records[0]["op"] == "all_reduce"
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def __call__(self, event: str, call: Call) -> None:
        if event == "end":
            self.records.append(call.describe())

    def __enter__(self) -> CallLog:
        add_listener(self)
        return self

    def __exit__(self, *exc: object) -> None:
        remove_listener(self)
