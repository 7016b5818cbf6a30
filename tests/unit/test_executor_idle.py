"""The worker thread of a communicator ends when idle and starts again on demand."""

import threading
import time

from hpccomm import executor
from hpccomm.executor import Executor


def _alive(name):
    return [t for t in threading.enumerate() if t.name == f"hpccomm-{name}"]


def test_an_idle_worker_thread_ends_and_the_next_job_starts_another(monkeypatch):
    # kept for good, every group that had made a bounded or async call held a thread:
    # 4,003 threads after 4,000 groups dropped without free() (a soak review)
    monkeypatch.setattr(executor, "IDLE_SECONDS", 0.05)
    ex = Executor("idle-test")
    done = []
    assert ex.submit("a", done.append, 1).wait(5)
    deadline = time.monotonic() + 5
    while _alive("idle-test") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive("idle-test")
    futs = [ex.submit(f"job {i}", done.append, i) for i in range(2, 50)]
    assert all(f.wait(5) for f in futs)
    assert done == list(range(1, 50)) and ex.pending == 0  # in order, none lost
    assert ex.close(timeout=5)


def test_a_busy_worker_is_not_ended_by_the_idle_bound(monkeypatch):
    monkeypatch.setattr(executor, "IDLE_SECONDS", 0.01)
    ex = Executor("busy-test")
    gate = threading.Event()
    first = ex.submit("slow", gate.wait, 5)
    time.sleep(0.1)  # longer than the idle bound, with a job running
    later = ex.submit("next", lambda: 7)
    gate.set()
    assert first.wait(5) and later.wait(5) and later.outcome() == 7
    assert ex.close(timeout=5)


def test_the_worker_keeps_nothing_of_a_finished_job():
    # the loop's locals held the last job's Future (its result), function and arguments
    # until the next job or the idle exit: a dropped symmetric buffer returned by a bounded
    # comm.empty stayed mapped and registered for up to 5 s (an outside hunt)
    import gc
    import weakref
    from operator import attrgetter

    class Thing:
        pass

    ex = Executor("keeps-test")
    arg = Thing()
    arg.result = Thing()
    refs = [weakref.ref(arg), weakref.ref(arg.result)]
    fut = ex.submit("job", attrgetter("result"), arg)
    assert fut.wait(5) and fut.outcome() is arg.result
    del fut, arg
    gc.collect()
    deadline = time.monotonic() + 5
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        time.sleep(0.01)  # (the worker clears its locals just after setting the Future)
    assert [r() for r in refs] == [None, None]
    assert _alive("keeps-test")  # still running, idle: nothing it holds keeps them
    assert ex.close(timeout=5)
