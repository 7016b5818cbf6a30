"""Work: the handle an ``async_op=True`` operation returns.

A Work wraps a :class:`Pending` source (the communicator's worker thread for collectives,
MPI requests for point-to-point, a CUDA event for NCCL) and turns its outcome into the
operation's result or one error, kept for every later ``wait()``/``exception()``.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, overload

from . import record
from .errors import (
    BackendError,
    ClosedError,
    CommTimeoutError,
    HpccommError,
    UnwaitedWorkWarning,
)
from .executor import Future, said_callback_failed
from .ops import Call, check_timeout

__all__ = ["Work", "Pending", "ORPHANS", "reap", "wait_bounded", "wait_watching", "idle_while",
           "batch_tags", "p2p_waiting"]  # fmt: skip

_DEFAULT: Any = object()  # wait() without an argument: the communicator's timeout
# In a fork() child of a rank (set there by the runtime): why its Works pending at the fork
# never complete (their MPI requests and the worker threads stayed in the parent)
fork_child: str | None = None

# Operations whose Work was dropped unfinished (never waited for, or a blocking call that
# timed out), each with its call's name: MPI may still read or write their buffers, which
# the Pending holds, so they stay alive here until MPI is done with them (reap). Dropped,
# the memory went back to the allocator while MPI still wrote into it (a later array
# received the message) or read it (the peer received whatever was there by then).
ORPHANS: deque[tuple[Any, str]] = deque()


class Pending(Protocol):
    """Something started: ``test()`` never blocks, ``wait(timeout)`` returns True once done
    (None: wait forever), ``outcome()`` returns the result or raises the library's error."""

    def test(self) -> bool: ...

    def wait(self, timeout: float | None) -> bool: ...

    def outcome(self) -> Any: ...


def wait_bounded(
    test: Callable[[], bool], timeout: float, watch: Callable[[], None] | None = None
) -> bool:
    """Poll ``test`` until it is true or ``timeout`` seconds pass: for the first
    SPIN_SECONDS without sleeping, then backing off from 50 us to 1 ms
    between polls; ``watch`` runs between polls and may raise (a peer's failure notice).
    Returns whether ``test`` became true. (Sleeping from the first poll made a bounded
    8-byte send/recv round trip take 276-436 us against 6 us unbounded: Linux sleeps at
    least about 50 us however short the pause asked.)"""
    if test():
        return True
    now = time.monotonic()
    deadline = now + timeout
    spin_until = now + min(SPIN_SECONDS, timeout)
    pause = 5e-5
    while not test():
        if watch is not None:
            watch()
        now = time.monotonic()
        if now >= deadline:
            return test()
        if now < spin_until:  # (not sleep(0): Linux's nanosleep(0) takes 50-100 us too)
            os.sched_yield()  # the CPU to a rank or thread that shares this core, as Open
            continue  # MPI's mpi_yield_when_idle does in its own waits
        idle = _idle.__dict__.get("hook")
        if idle is not None:
            idle[0](idle[1], idle[2])
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)
    return True


# What a bounded wait of this thread does between its polls once it sleeps (idle_while)
_idle = threading.local()


def idle_while(
    answer: Callable[[Call, int], None],
    call: Call,
    seq: int,
    wait: Callable[[float], bool],
    timeout: float,
) -> bool:
    """``wait(timeout)`` with ``answer(call, seq)`` run between the polls of every bounded
    wait it makes on this thread (wait_bounded, after its first SPIN_SECONDS): a
    point-to-point wait answers a peer's question that way (NoticeBoard.answer). Its
    requests are polled as without it (a wait cut into slices would end a blocking checked
    receive's header receive at the first slice). ``answer`` must not raise."""
    before = _idle.__dict__.get("hook")
    _idle.hook = (answer, call, seq)
    try:
        return wait(timeout)
    finally:
        _idle.hook = before


# How long a bounded wait polls without sleeping: a message between ranks of a node arrives
# within tens of microseconds, and MPI's own blocking waits spin the same way.
SPIN_SECONDS = 1e-3


def wait_watching(pending: Pending, timeout: float, watch: Callable[[], None]) -> bool:
    """Wait for ``pending`` at most ``timeout`` seconds, in slices of 20 ms with ``watch()``
    (which may raise: a peer's failure notice) between them."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if pending.wait(max(0.0, min(0.02, remaining))):
            return True
        try:
            watch()
        except BaseException:
            if pending.wait(0):  # its own outcome came in meanwhile: that one counts
                return True
            raise
        if remaining <= 0:
            return False


class Work:
    """A pending operation: ``wait()`` returns its result (the output array, the source rank
    of a receive, or None), ``is_completed()`` polls (it blocks only once a collective is
    past its timeout, asking the peers before it raises), ``exception()`` gives the error
    of a failed one. A failed operation stays failed: every later ``wait()`` raises the same
    error. A handle dropped before its operation completed is reported with a
    :class:`~hpccomm.errors.UnwaitedWorkWarning`.
    """

    __slots__ = (
        "_call",
        "_seq",
        "_pending",
        "_timeout",
        "_watch",
        "_record",
        "_done",
        "_exc",
        "_result",
        "_closed",
        "_on_failure",
        "_after",
        "_explain",
        "_callbacks",
        "_finishing",
        "_waited",
        "_started",
        "__weakref__",
    )

    def __init__(
        self,
        call: Call,
        seq: int,
        pending: Pending,
        *,
        timeout: float | None = None,
        watch: Callable[..., Any] | None = None,
        rec: record.Record | None = None,
        closed: Callable[[], bool] | None = None,
        on_failure: Callable[[int, BaseException, bool], None] | None = None,
        after: Callable[[Any], Any] | None = None,
        explain: Callable[[CommTimeoutError], CommTimeoutError] | None = None,
    ) -> None:
        self._call = call
        self._seq = seq
        # point-to-point requests: tested and waited for by one thread at a time
        self._pending = _OneAtATime(pending) if call.spec.p2p else pending
        self._timeout = timeout  # the communicator's, for wait() without an argument
        # a collective's: raises a peer's failure notice (called between slices of its
        # wait); a point-to-point call's: answers a peer's question, given the call and
        # its number (NoticeBoard.answer; see idle_while)
        self._watch = watch
        self._record = rec
        self._closed = closed
        self._on_failure = on_failure  # tells the group's other ranks (failure notices)
        self._after = after  # maps the result back once done (debug buffer guard)
        self._explain = explain  # adds what the dispatch knows to a timeout's message
        self._callbacks: list[Callable[[Work], None]] = []
        self._waited = False  # a wait() that timed out (the caller saw CommTimeoutError)
        self._started = time.monotonic()  # is_completed() counts the group's bound from it
        self._done = False
        self._exc: BaseException | None = None
        self._result: Any = None
        # finished once, by whichever thread first sees its source done: the caller in
        # wait()/is_completed(), or the worker thread running a done-callback (the torch
        # backend). A lock per Work: finishing may wait (a PeerError waits up to 1 s for
        # MPI's failure notice), which must not hold up other Works' completion
        self._finishing = threading.Lock()

    def _where(self) -> str:
        return self._call.where(self._seq)

    def _finish(self, failure: BaseException | None = None) -> None:
        """The source is done (or failed while completing: ``failure``): keep its result or
        its error for every later call, tell the listeners."""
        with self._finishing:
            if self._done:  # another thread finished it meanwhile
                return
            try:
                if failure is not None:
                    raise failure
                self._result = self._pending.outcome()
            except HpccommError as exc:
                self._exc = exc
            except Exception as exc:  # the library's own error, named
                backend = self._call.backend
                if backend is not None:
                    self._exc = backend.error(self._call, self._seq, exc)
                else:  # pragma: no cover - every started call has its backend
                    self._exc = BackendError(f"{self._where()}: failed while completing: {exc}")
                self._exc.__cause__ = exc
            except BaseException as exc:  # KeyboardInterrupt or SystemExit raised inside the
                # call (an object's unpickling): the call ended; wait() raises it, as inline.
                # Escaping here, the Work stayed unfinished: dropped, it warned that its
                # operation was still pending (an outside hunt)
                self._exc = exc
            # the source is never asked again: a completed MPI request tested a second time
            # is MPI_REQUEST_NULL, whose status is empty
            source, self._pending = self._pending, _Finished
            # failed (a peer's notice) while its MPI call is still running or queued on the
            # worker thread: that call may never end
            stuck = isinstance(source, Future) and not source.test()
            if self._after is not None:
                self._result = self._after(self._result)
            self._done = True
        rec = self._record
        if rec is not None:
            rec.error = self._exc
            if record.listeners:
                record.notify("end", rec)
        if isinstance(self._exc, Exception):  # (not a KeyboardInterrupt: no call's error)
            if self._on_failure is not None:
                self._on_failure(self._seq, self._exc, stuck)
            if record.error_hooks:
                record.report_error(self._exc)
        with self._finishing:  # (add_done_callback appends under the same lock)
            callbacks, self._callbacks = self._callbacks, []
        if isinstance(source, Future) and not stuck:
            return  # the worker runs them, as its call has ended (they run there)
        for fn in callbacks:
            fn(self)

    def is_completed(self) -> bool:
        """True when the operation has finished, successfully or not. For a collective: one
        a peer's failure notice ends (the peer refused or failed it, or left the job) has
        finished (exception() is that PeerError and wait() raises it), and past the
        communicator's timeout, counted from the call, it raises the CommTimeoutError
        wait() raises then (asking the peers where they are takes up to 1 s; the operation
        goes on, as after wait()). Otherwise it never blocks. A point-to-point Work is only
        tested (MPI's Irecv + Test idiom: a message may come at any time).

        (It only tested collectives too: a program polling one, as torch programs poll
        their Works while they compute, polled for ever past the timeout, or after a peer's
        refusal that wait() raised at once.)"""
        return self._completed(bounded=True)

    def _stranded(self) -> bool:
        """In a fork() child: whether this Work cannot complete here (a call that had run on
        the worker thread before the fork has its outcome in this process's memory)."""
        source = self._pending
        return not (isinstance(source, Future) and source.test())

    def _forked(self) -> ClosedError:
        """A Work pending at a fork(), asked in the child: it waited for ever there (or
        timed out saying that some rank had not joined the call), while the parent's call
        completed (an outside hunt)."""
        return ClosedError(
            f"{self._where()}: {fork_child}; this operation was pending when the process "
            f"forked: it runs on in the parent, and never completes here"
        )

    def _completed(self, bounded: bool) -> bool:
        """is_completed(); past the timeout only where ``bounded`` (else False then: the
        torch backend's watchdog fails its Works at the timeout itself)."""
        if not self._done:
            if fork_child is not None and self._stranded():
                raise self._forked()
            try:
                done = self._pending.test()
            except Exception as exc:  # it failed (a receive truncated inside MPI): finished,
                self._finish(exc)  # exception() gives the error and wait() raises it (both
                return self._done  # raised it once, when the test found it)
            if done:
                self._finish()
            elif not self._call.spec.p2p:
                self._look(bounded)
        return self._done

    def _look(self, bounded: bool) -> None:
        """A pending collective: a peer's failure notice ends it; past the group's bound
        (``bounded``) the wait's CommTimeoutError is raised."""
        watch = self._watch
        if watch is not None:
            try:
                watch()  # (looks for notices at most every 20 ms)
            except HpccommError as exc:
                if self._pending.test():  # its own outcome came meanwhile: that wins
                    self._finish()
                else:
                    self._finish(exc)
                return
        bound = self._timeout
        if not bounded or bound is None:
            return
        elapsed = time.monotonic() - self._started
        if elapsed < bound:
            return
        self._waited = True
        err = self._timed_out(bound, completing=True)
        if err is None:  # it completed while the peers were asked
            if not self._done:
                self._finish()
            return
        raise err

    def wait(self, timeout: float | None = _DEFAULT) -> Any:
        """Block until the operation completes; return its result.

        Args:
            timeout: seconds to wait at most; None waits forever; without an argument, the
                communicator's timeout (None if it has none).

        Raises:
            CommTimeoutError: not complete in time; the operation stays pending (MPI cannot
                cancel a started collective), so a later wait() may still complete it.
            HpccommError: the operation failed (every later wait() raises it again).
        """
        if timeout is not _DEFAULT:
            timeout = check_timeout(timeout, f"{self._where()}: wait", zero=True)
        if not self._done:
            if fork_child is not None and self._stranded():
                raise self._forked()
            if timeout is _DEFAULT:
                timeout = self._timeout
            try:
                watch = self._watch
                if watch is not None and self._call.spec.p2p:  # bounded: answers questions
                    done = (  # (never raises: see idle_while; made once a test failed)
                        self._pending.wait(None)
                        if timeout is None
                        else self._pending.test()
                        or idle_while(watch, self._call, self._seq, self._pending.wait, timeout)
                    )
                elif watch is None:
                    done = self._pending.wait(timeout)
                else:  # without a bound too: a peer's failure notice ends the wait
                    bound = math.inf if timeout is None else timeout
                    done = wait_watching(self._pending, bound, watch)
            except CommTimeoutError as exc:
                if not exc.final:
                    raise
                self._finish(exc)  # (given up for good: an NCCL call whose communicator
                done = True  # was aborted; dropped afterwards, it is no "unwaited" Work)
            except Exception as exc:  # the library failed while completing: final
                self._finish(exc)
                done = True
            if not done:
                self._waited = True
                err = self._timed_out(timeout or 0.0, completing=True)
                if err is not None:
                    raise err
            if not self._done:  # (or it completed while its timeout was being explained)
                self._finish()
        if self._exc is not None:
            raise self._exc
        return self._result

    @overload
    def _timed_out(self, timeout: float) -> CommTimeoutError: ...
    @overload
    def _timed_out(self, timeout: float, completing: bool) -> CommTimeoutError | None: ...

    def _timed_out(self, timeout: float, completing: bool = False) -> CommTimeoutError | None:
        """The error of a wait that ran out; ``completing`` (wait()): None where the
        operation completed while the error was explained (the peers asked where they are:
        a late rank came meanwhile), and the wait returns its result instead."""
        bound = self._timeout
        if bound is None or timeout < bound:  # a shorter wait than the group's bound
            err = CommTimeoutError(
                f"{self._where()}: not complete after {timeout:g} s; it goes on (a later "
                f"wait() may complete it; if some rank never joins it, MPI cannot cancel it)"
            )
        elif self._call.spec.p2p:
            err = CommTimeoutError(
                f"{self._where()}: not complete after {timeout:g} s"
                f"{_p2p_left(self._call, self._pending)}"
            )
            err.stuck = True  # the group's own bound: the explanation asks the peer
        else:
            err = CommTimeoutError(
                f"{self._where()}: not complete after {timeout:g} s; some rank of the group "
                f"has not joined it (MPI cannot cancel it: abort the job)"
            )
            err.stuck = True  # the group's own bound: the explanation asks the peers
        if self._explain is not None:
            err = self._explain(err)
            if completing and err.stuck and not self._call.spec.p2p and self._pending.wait(0):
                return None
        if record.error_hooks and self._closed is not _always:
            record.report_error(err)
        return err

    def add_done_callback(self, fn: Callable[[Work], None]) -> None:
        """Call ``fn(work)`` when the operation completes (successfully or not): from the
        worker thread for collectives, at once when it already completed; for
        point-to-point requests, when the caller next finds it complete (wait() or
        is_completed()). The torch backend completes its Futures this way."""
        source = self._pending
        once = _Once(fn, self)  # (a callback that raises is said on stderr, not raised)
        if isinstance(source, Future) and not self._done:
            # from the worker when the call ends, or from _finish when a peer's failure
            # notice ends the Work first (its MPI call may then never end): once
            with self._finishing:
                if not self._done:
                    self._callbacks.append(once.run)
            source.add_done_callback(once.run)
            if self._done:  # finished meanwhile, its callbacks taken before ours came
                once.run()
            return
        if not self._done:  # finishes it (keeping the status, or the error for exception())
            self._completed(bounded=False)
        with self._finishing:  # not between _finish's taking of the list and its end
            if not self._done:
                self._callbacks.append(once.run)
                return
        once.run()

    def completes_by_itself(self) -> bool:
        """Whether the operation completes without anyone waiting (it runs on the worker
        thread) and is still running; point-to-point requests complete when tested."""
        return isinstance(self._pending, Future)

    @property
    def finished(self) -> bool:
        """Whether the operation has been seen complete (by wait(), is_completed() or a
        done-callback). Never asks MPI: another thread may be waiting on the request."""
        return self._done

    def disown(self) -> None:
        """Stop reporting this handle when it is dropped unfinished (the dispatch's own
        handle of a bounded call that timed out: the caller got the CommTimeoutError)."""
        self._closed = _always

    def result(self) -> Any:
        """The operation's result, waiting for it first."""
        return self.wait()

    def exception(self) -> BaseException | None:
        """The error the finished operation raised, or None (None too while pending, and
        past the timeout: is_completed() and wait() raise that)."""
        if not self._done and fork_child is not None and self._stranded():
            return self._forked()
        self._completed(bounded=False)
        return self._exc

    def __del__(self) -> None:
        # Reported whenever the caller never saw the operation complete (wait(), or
        # is_completed() returning True): whether it happened to finish meanwhile is a race,
        # and an unsynchronized read of its buffers is the bug being reported.
        if self._done:
            return
        if fork_child is not None:  # a fork() child ending: the parent's Works pending at the
            return  # fork are the parent's to wait for (the child's exit warned of them, as if
            # dropped by the program: an outside hunt)
        try:
            parts = _posted(self._pending)
            after, source, rec = self._after, self._pending, self._record
            if rec is not None:  # the flight recorder's and profiler's record ends when the
                # operation does (it stayed "started": trace analyze said ranks waited in
                # calls long complete, and the profiler kept it for good)
                after = partial(_end_dropped, rec, source, after)
            if after is not None and isinstance(source, Future):  # the async guard's
                # read-only arrays, of a call on the worker: writable again once it has run
                # (no wait() will release them)
                source.add_done_callback(partial(after, None))
            elif after is not None:  # point-to-point: once MPI is done with the arrays (a
                # later call tests it, as it tests every dropped part)
                ORPHANS.append((_Release(parts, after), self._where()))
            else:
                for part in parts:
                    ORPHANS.append((part, self._where()))
        except Exception:  # (interpreter teardown: the module's globals are gone)
            pass
        closed = self._closed
        if closed is not None and closed():
            return
        how = "after its wait() timed out" if self._waited else "without wait()"
        _DROPPED[0] += 1
        if _DROPPED[0] > DROPS_SAID:  # counted, said once at exit (each text is new to
            return  # warnings' registry: 40,000 drops were 160,000 stderr lines and memory)
        more = (
            f" (the {DROPS_SAID}th such warning of this process: further ones are counted and "
            f"their number said at exit)"
            if _DROPPED[0] == DROPS_SAID
            else ""
        )
        if _DROPPED[0] == 1:
            atexit.register(_say_dropped)
        warnings.warn(
            f"{self._where()}: Work handle dropped {how}, its operation still pending; its "
            f"buffers may be read or written only after the operation completes{more}",
            UnwaitedWorkWarning,
            stacklevel=1,
        )

    def __repr__(self) -> str:
        # (a collective's Future is done before its done-callbacks run: the Work read
        # "pending" inside its own callback, an outside hunt)
        source = self._pending
        done = self._done or (isinstance(source, Future) and source.test())
        return f"<Work {self._where()} {'done' if done else 'pending'}>"


# UnwaitedWorkWarnings said one by one per process; the rest are counted (_DROPPED)
DROPS_SAID = 20
_DROPPED = [0]


def _say_dropped() -> None:
    """At exit: how many dropped Work handles were not reported one by one."""
    unsaid = _DROPPED[0] - DROPS_SAID
    if unsaid > 0:
        sys.stderr.write(
            f"hpccomm: {_DROPPED[0]} Work handles in all were dropped with their operation "
            f"pending ({unsaid} not reported one by one; UnwaitedWorkWarning said the first "
            f"{DROPS_SAID})\n"
        )


class _FinishedSource:
    def test(self) -> bool:
        return True

    def wait(self, timeout: float | None) -> bool:
        return True

    def outcome(self) -> Any:  # pragma: no cover - never asked after _finish
        return None


_Finished = _FinishedSource()


class _Once:
    """A done-callback that two paths may call (the worker's Future, a Work finished by a
    peer's notice): runs ``fn(work)`` the first time only."""

    __slots__ = ("_fn", "_work", "_lock")

    def __init__(self, fn: Callable[[Work], None], work: Work) -> None:
        self._fn: Callable[[Work], None] | None = fn
        self._work = work
        self._lock = threading.Lock()

    def run(self, *_: Any) -> None:
        """(from the worker's Future, without arguments; from _finish, given the Work)"""
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            try:
                fn(self._work)
            except Exception:  # said on stderr (on the worker it was dropped silently)
                said_callback_failed(repr(self._work))


def _always() -> bool:
    return True


def p2p_waiting(call: Call, seq: int) -> str:
    """A point-to-point call as a rank waiting in it tells a peer that asks where it is:
    ``recv #3 on world (rank 1 of 2) from rank 0 (tag 0)``."""
    g = call.group
    text = call.where(seq)
    tag = "any tag" if call.tag is None else f"tag {call.tag}"
    name = call.spec.name
    if name in ("recv", "recv_object"):
        return f"{text} from {g.peer(call.peer)} ({tag})"
    if name in ("send", "send_object"):
        return f"{text} to {g.peer(call.peer)} ({tag})"
    if name == "sendrecv":
        return f"{text} to {g.peer(call.peer)}, from {g.peer(call.src)} ({tag})"
    return text


def withdrawn_receive(name: str, pending: Any) -> bool:
    """Whether a point-to-point call that timed out withdrew its receive (a probed receive
    that matched no message: nothing stays posted), so a message sent to it later stays
    unmatched: a recv's or recv_object's, or a sendrecv's receive part."""
    if name in ("recv", "recv_object"):
        return not getattr(pending, "posted", True)
    parts = getattr(pending, "parts", None)
    return name == "sendrecv" and parts is not None and not getattr(parts[0], "posted", True)


def _p2p_left(call: Call, pending: Any) -> str:
    """What a point-to-point call that timed out leaves behind (the end of its error)."""
    name = call.spec.name
    peer = "any rank" if call.peer is None else call.group.peer(call.peer)
    tag = "any tag" if call.tag is None else f"tag {call.tag}"
    withdrawn = withdrawn_receive(name, pending)
    if withdrawn and name != "sendrecv":
        return (
            f"; no message from {peer} with {tag} arrived{_other_tag(call)}. Nothing stays "
            f"posted: a later receive may take that message"
        )
    if name == "recv":
        return (
            f"; no matching message from {peer} ({tag}) has completed{_other_tag(call)}. The "
            f"receive stays posted: MPI may still write the array (hpccomm keeps it alive), "
            f"so do not read or reuse it before a wait() completes"
        )
    if name in ("send", "send_object"):
        return (
            f"; {peer} has not received it ({tag}). The send stays posted: MPI may still "
            f"read the data (hpccomm keeps it alive), so do not modify it before a wait() "
            f"completes; if {peer} never receives it, end the job"
        )
    if withdrawn:  # a sendrecv's
        src = "any rank" if call.src is None else call.group.peer(call.src)
        return (
            f"; no message from {src} with {tag} arrived{_other_tag(call)}, and nothing of "
            f"the receive stays posted (a later receive may take that message); the send to "
            f"{peer} stays posted: MPI may still read the array (hpccomm keeps it alive)"
        )
    return (
        "; its sends and receives stay posted: MPI may still read and write the arrays "
        "(hpccomm keeps them alive), so do not touch them before a wait() completes"
    )


def _other_tag(call: Call) -> str:
    """For a receive (a recv, or a sendrecv's) with a tag that timed out: a message from its
    source with another tag waiting in MPI (the sender's tag differs), or else one with its
    tag from another rank (the source differs), named; else "". A recv or recv_object: a
    message of the other kind (an object for recv, an array for recv_object) from its source
    with its tag, named first."""
    name = call.spec.name
    other = _other_kind(call)
    if other:
        return other
    if call.tag is None or name not in ("recv", "sendrecv", "recv_object"):
        return ""
    source = call.src if name == "sendrecv" else call.peer
    objects = name == "recv_object"  # (send_object's messages: on a communicator of theirs)
    found = _waiting_message(call, source, objects=objects)
    if found is not None and found[1] != call.tag:
        return (
            f"; a message from {call.group.peer(found[0])} with tag {found[1]} is waiting (do "
            f"the tags differ?)"
        )
    if found is None and source is not None:
        found = _waiting_message(call, None, call.tag, objects=objects)
        if found is not None and found[0] != source:
            return (
                f"; a message from {call.group.peer(found[0])} with tag {found[1]} is waiting "
                f"(is the source right?)"
            )
    return ""


def _other_kind(call: Call) -> str:
    """For a recv or recv_object that timed out: a message from its source with its tag sent
    the other way (send_object's on the objects' communicator for a recv, an array's for a
    recv_object), which this receive can never take, named; else "" (the timeout said that
    no message arrived, though one waited: an outside hunt)."""
    name = call.spec.name
    if name not in ("recv", "recv_object"):
        return ""
    found = _waiting_message(call, call.peer, call.tag, objects=name == "recv")
    if found is None:
        return ""
    sent, takes = ("send_object", "recv_object") if name == "recv" else ("send", "recv")
    return (
        f"; a message that {call.group.peer(found[0])} sent with {sent} (tag {found[1]}) is "
        f"waiting, which only {takes} receives (send/recv and send_object/recv_object never "
        f"match each other)"
    )


def batch_tags(call: Call, items: Any) -> list[str]:
    """For a batch that timed out: each of its receives (with a source and a tag) from a
    rank that has a message with another tag waiting in MPI, named, as _other_tag does for
    a receive (a receive that matched its message has taken it: what waits matched none)."""
    said = []
    wanted: dict[int, set[Any]] = {}
    for item in items:
        if getattr(item, "op", None) == "recv" and type(item.peer) is int:
            wanted.setdefault(item.peer, set()).add(item.tag)
    for i, item in enumerate(items):
        if getattr(item, "op", None) != "recv" or type(item.peer) is not int:
            continue
        found = _waiting_message(call, item.peer)
        if found is not None and found[1] not in wanted[item.peer]:
            said.append(
                f"ops[{i}] receives from {call.group.peer(item.peer)} with tag {item.tag!r}; "
                f"a message from there with tag {found[1]} is waiting (do the tags differ?)"
            )
            wanted[item.peer].add(found[1])  # (said once per waiting tag)
    return said


def _waiting_message(
    call: Call, source: int | None, tag: int | None = None, *, objects: bool = False
) -> tuple[int, int] | None:
    """(source, tag) of a message from ``source`` (None: any rank) with ``tag`` (None: any)
    that waits in MPI on the call's communicator (``objects``: send_object's), matched by
    no receive; None if there is none or MPI cannot say."""
    mpi = getattr(call.backend, "checks" if objects else "mpi", None)
    if mpi is None:
        return None
    try:
        from mpi4py import MPI

        status = MPI.Status()
        if mpi.Iprobe(
            source=MPI.ANY_SOURCE if source is None else source,
            tag=MPI.ANY_TAG if tag is None else tag,
            status=status,
        ):
            return status.Get_source(), status.Get_tag()
    except Exception:  # noqa: BLE001 - only a hint: the timeout is the error
        pass
    return None


def _posted(pending: Any) -> list[Any]:
    """The parts of an unfinished operation that MPI may still use the arrays of (kept in
    ORPHANS when its Work is dropped): not a call queued on the worker (the worker holds
    its arrays), nor a probed receive that matched no message (nothing is posted: driven
    on, it would take a later receive's message); a sendrecv's or batch's parts one by one."""
    if isinstance(pending, (Future, Done)):
        return []
    parts = getattr(pending, "parts", None)
    if parts is not None:
        return [q for p in parts for q in _posted(p)]
    return [pending] if getattr(pending, "posted", True) else []


class _OneAtATime:
    """A point-to-point Work's requests, tested or waited for by one thread at a time and
    never again once complete. MPI forbids two threads on one request, and a completed
    request tested again reads back an empty status: wait() on two threads, or wait()
    against is_completed() polling, made a received message a false MismatchError ("got 0
    elements from rank -1 (tag -1)", kept for good) in 6-10 of 10 runs, or hung a thread in
    MPI_Wait, or segfaulted (an outside review)."""

    __slots__ = ("source", "lock", "done")

    def __init__(self, source: Any) -> None:
        self.source = source
        self.lock = threading.Lock()
        self.done = False

    def test(self) -> bool:
        if self.done:
            return True
        if not self.lock.acquire(blocking=False):
            return False  # another thread is testing or waiting: it finishes the Work
        try:
            if not self.done:
                self.done = bool(self.source.test())
            return self.done
        finally:
            self.lock.release()

    def wait(self, timeout: float | None) -> bool:
        if self.done:
            return True
        if timeout is None:
            with self.lock:  # behind another thread's wait, until its request completes
                if not self.done:
                    self.source.wait(None)
                    self.done = True
            return True
        deadline = time.monotonic() + timeout
        if not self.lock.acquire(timeout=timeout):
            return self.done
        try:  # the source's own bounded wait (a blocking checked receive withdraws its
            if not self.done:  # header receive when it times out)
                self.done = bool(self.source.wait(max(0.0, deadline - time.monotonic())))
            return self.done
        finally:
            self.lock.release()

    def outcome(self) -> Any:
        return self.source.outcome()

    def __getattr__(self, name: str) -> Any:  # parts, posted, seq, cancel: the source's
        return getattr(self.source, name)


class _Release:
    """A dropped Work's parts still running and its debug guard's release: tested by
    reap() like any dropped part; once every part is done the arrays are writable again."""

    __slots__ = ("parts", "after")

    def __init__(self, parts: list[Any], after: Callable[[Any], Any]) -> None:
        self.parts = parts
        self.after = after

    def test(self) -> bool:
        self.parts = [p for p in self.parts if not _done(p)]
        if self.parts:
            return False
        self.after(None)
        return True


def _end_dropped(rec: Any, source: Any, after: Callable[[Any], Any] | None, result: Any) -> Any:
    """A dropped Work's operation has completed: its guard's release (``after``), then its
    record ends (failed where the worker's job raised)."""
    if after is not None:
        after(result)
    if rec.error is None and isinstance(source, Future):
        rec.error = source.error
    if record.listeners:
        record.notify("end", rec)
    return result


def _done(part: Any) -> bool:
    try:
        return bool(part.test())
    except Exception:  # failed: MPI has let go of its buffers
        return True


REAP_BATCH = 16  # dropped operations tested per reap(): they go round, oldest first


def reap() -> None:
    """Let go of the dropped operations MPI has finished (ORPHANS): up to REAP_BATCH of
    them are tested, oldest first, the unfinished going to the back, so a call's cost stays
    bounded however many dropped sends never match (each was tested on every call) and
    every one is tested again within len(ORPHANS) / REAP_BATCH calls. Safe against drops on
    other threads (a garbage collection): deque appends and pops are atomic."""
    for _ in range(min(len(ORPHANS), REAP_BATCH)):
        try:
            pending, name = ORPHANS.popleft()
        except IndexError:  # another thread took the last one meanwhile
            break
        if not _done(pending):
            ORPHANS.append((pending, name))


class Done:
    """A Pending that is already complete (an operation that ran inline)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def test(self) -> bool:
        return True

    def wait(self, timeout: float | None) -> bool:
        return True

    def outcome(self) -> Any:
        return self.value
