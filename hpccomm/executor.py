"""An ordered worker thread per communicator, for collectives that must not block the caller.

MPI never matches a non-blocking collective (MPI_Iallreduce) with a blocking one
(MPI_Allreduce), and Open MPI's non-blocking collectives are up to 2.5x slower for large
messages here. So hpccomm issues every collective in its blocking form, always: a call with
``async_op=True`` or a time bound runs that same blocking call on the communicator's worker
thread (the caller gets a Work, or waits with a deadline), and a plain call runs inline unless
the worker still has earlier calls of the group queued, in which case it queues behind them.
Every rank therefore issues the same MPI calls in the same order whatever it waits for, as
torch's own ProcessGroupMPI does with its progress thread. mpi4py releases the GIL inside MPI
calls, so the caller keeps computing while the worker waits.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["Executor", "Future", "on_worker"]

# A worker thread with nothing to do for this long ends; the group's next call on the worker
# starts another (a thread start, about 0.1 ms). Kept for good, every group that had made a
# bounded or async call held a thread while it lived: 4,003 threads after 4,000 groups
# (dropped without free()) in a soak review.
IDLE_SECONDS = 5.0

_thread_kind = threading.local()


def on_worker() -> bool:
    """Whether the calling thread is a communicator's worker thread (a done-callback runs
    there: the torch backend completes its Futures elsewhere from it, see hpccomm.torch)."""
    return getattr(_thread_kind, "worker", False)


def said_callback_failed(what: str) -> None:
    """A done-callback raised: its traceback on stderr (it was dropped silently), as
    concurrent.futures logs one; the operation's own outcome is unchanged."""
    sys.stderr.write(
        f"hpccomm: a done-callback of {what} raised (the operation's outcome is unchanged):\n"
        f"{traceback.format_exc()}"
    )
    sys.stderr.flush()


class Future:
    """The outcome of one job on an :class:`Executor`: ``done`` is set when it has run."""

    __slots__ = ("done", "value", "error", "what", "callbacks", "submitted")

    def __init__(self, what: str) -> None:
        self.submitted = time.monotonic()
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.what = what
        self.callbacks: list[Callable[[], None]] = []

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the job has run (on the worker thread; at once if it has)."""
        self.callbacks.append(fn)
        if self.done.is_set() and fn in self.callbacks:
            self.callbacks.remove(fn)
            fn()

    def test(self) -> bool:
        return self.done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True when the job has run (waits at most ``timeout`` seconds; None: forever)."""
        return self.done.wait(timeout)

    def outcome(self) -> Any:
        """The job's return value, or its exception raised."""
        if self.error is not None:
            raise self.error
        return self.value


class Executor:
    """One daemon thread running jobs in submission order.

    ``pending`` counts jobs submitted and not yet finished; the dispatch runs a plain call
    inline only when it is 0, so calls on a group are issued in the order the user made them.
    A job stuck in MPI (a peer that never joins) keeps the thread forever: ``stuck`` then
    names it, the communicator refuses further calls, and exit aborts the job rather than
    finalizing MPI under a thread that is inside it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.pending = 0
        self._queued: list[Future] = []  # submitted and not finished, oldest first
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.running: Future | None = None
        self.stuck: str | None = None
        self.ident: int | None = None  # the thread's (threading.get_ident) while it runs

    def submit(self, what: str, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue ``fn(*args)``; ``what`` names the job in messages ("all_reduce #3 on world")."""
        fut = Future(what)
        with self._lock:
            self.pending += 1
            self._queued.append(fut)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name=f"hpccomm-{self.name}", daemon=True
                )
                self._thread.start()
        self._queue.put((fut, fn, args))
        return fut

    def _loop(self) -> None:
        _thread_kind.worker = True
        self.ident = threading.get_ident()
        while True:
            try:
                item = self._queue.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:  # idle: the thread goes (the next submit starts another)
                    if self.pending == 0:  # (a submit under the lock before this saw it
                        self._thread = None  # running and its job is on the way)
                        self.ident = None  # (Linux gives a later thread the same ident)
                        return
                continue
            if item is None:
                self.ident = None
                return
            fut, fn, args = item
            self.running = fut
            try:
                fut.value = fn(*args)
            except BaseException as exc:  # delivered to the caller through the Future
                fut.error = exc
            finally:
                self.running = None
                with self._lock:
                    self.pending -= 1
                    self._queued.remove(fut)
                fut.done.set()
                callbacks, fut.callbacks = fut.callbacks, []
                for fn in callbacks:
                    try:
                        fn()
                    except Exception:  # a callback must not stop the worker: said
                        said_callback_failed(fut.what)
            # the job, its arguments and result are the caller's now: kept here until the
            # next job (or the idle exit, 5 s), a dropped symmetric buffer stayed mapped
            # and registered that long (an outside hunt)
            item = fut = fn = args = callbacks = None

    def oldest_submitted(self) -> float | None:
        """When the oldest unfinished job was submitted (time.monotonic()), if any."""
        with self._lock:
            return self._queued[0].submitted if self._queued else None

    def oldest(self) -> str | None:
        """What the oldest unfinished job is ("all_reduce #3 on world"), if any."""
        with self._lock:
            return self._queued[0].what if self._queued else None

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the thread after the queued jobs; True when it has stopped (False: a job is
        stuck inside MPI, and ``stuck`` names it)."""
        thread = self._thread
        if thread is None:
            return True
        self._queue.put(None)
        thread.join(timeout)
        if thread.is_alive():
            running = self.running
            self.stuck = running.what if running is not None else "a queued call"
            return False
        self._thread = None
        return True
