"""A Work is finished once, under a lock of its own: one Work whose finishing waits (a
PeerError waits up to 1 s for MPI's failure notice) must not hold up the completion of
another Work on another thread."""

import threading
import time

from hpccomm import ops as O
from hpccomm.errors import PeerError
from hpccomm.work import Work


class _SlowBackend:
    """Translates a failure the way the MPI backend does after a process failure: slowly."""

    def __init__(self, started: threading.Event) -> None:
        self.started = started

    def error(self, call, seq, exc):
        self.started.set()
        time.sleep(1.0)
        return PeerError(f"{call.where(seq)}: rank(s) [1] of this group failed")


class _Call:
    spec = O.ALL_REDUCE  # what a Work reads of its call: the op (a collective here)

    def __init__(self, backend) -> None:
        self.backend = backend

    def where(self, seq):
        return f"all_reduce #{seq} on world (rank 0 of 2)"


class _Source:
    def __init__(self, exc=None) -> None:
        self.exc = exc

    def test(self):
        return True

    def wait(self, timeout):
        return True

    def outcome(self):
        if self.exc is not None:
            raise self.exc
        return "result"


def test_a_work_failing_slowly_does_not_hold_up_another():
    started = threading.Event()
    slow = Work(_Call(_SlowBackend(started)), 1, _Source(RuntimeError("MPI_ERR_PROC_FAILED")))
    thread = threading.Thread(target=slow.exception)
    thread.start()
    assert started.wait(5)
    t0 = time.monotonic()
    fast = Work(_Call(None), 2, _Source())
    assert fast.wait() == "result"
    waited = time.monotonic() - t0
    thread.join(5)
    assert waited < 0.5, f"the other Work's completion waited {waited:.2f} s"
    err = slow.exception()
    assert isinstance(err, PeerError) and "rank(s) [1]" in str(err)


def test_the_point_to_point_works_are_listed_while_another_thread_adds_one():
    # free() lists the group's point-to-point Works from a WeakSet, which Python iterates
    # in Python: another thread's isend meanwhile raised "Set changed size during iteration"
    # out of free() (84 of 20,000 tries in an outside review), and the group stayed closed
    # for good ("already freed") though nothing was freed
    from hpccomm.dispatch import Dispatcher

    class Work:
        finished = False

        def __repr__(self):
            return "<Work send #1>"

    class Changing:  # iterating fails the first time, as a WeakSet changed meanwhile
        def __init__(self):
            self.tries = 0
            self.items = [Work()]

        def __iter__(self):
            self.tries += 1
            if self.tries == 1:
                raise RuntimeError("Set changed size during iteration")
            return iter(self.items)

        def discard(self, item):
            self.items.remove(item)

    d = object.__new__(Dispatcher)
    d._p2p = Changing()
    assert d.running_p2p() == ["<Work send #1>"]


def test_a_group_freed_meanwhile_is_not_opened_again():
    # a free() that had closed a group and was then refused opened it again even where
    # another thread's free() had freed it meanwhile: its next call reached MPI on the
    # freed communicator (a review)
    from hpccomm.dispatch import Dispatcher

    d = object.__new__(Dispatcher)
    d.closed, d.freed, d._fenced_refusal, d.broken = True, True, False, None
    d.reopen()
    assert d.closed
