"""The record step: every operation, sync or async, reaches listeners with its sequence
number, op, group, peer, dtype, shape and times. A call refused by validation never reaches
the record step (nothing is recorded); a call the backend fails is recorded with its error."""

import re

import numpy as np
import pytest

import hpccomm
from hpccomm import CallLog, UnwaitedWorkWarning


def test_records_sync_async_and_p2p(comm):
    n, r = comm.size, comm.rank
    with CallLog() as log:
        comm.all_reduce(np.ones((2, 3), dtype=np.float32))
        comm.broadcast(np.ones(4), src=n - 1)
        work = comm.all_gather(np.ones(2, dtype=np.int16), async_op=True)
        assert len(log.records) == 2  # the async one is recorded when it completes
        work.wait()
        comm.sendrecv(np.ones(1), dst=(r + 1) % n, src=(r - 1) % n)
    ops = [rec["op"] for rec in log.records]
    assert ops == ["all_reduce", "broadcast", "all_gather", "sendrecv"]
    first = log.records[0]
    assert (first["dtype"], first["shape"], first["count"], first["redop"]) == (
        "float32",
        (2, 3),
        6,
        "ReduceOp.SUM",
    )
    assert first["group"] == comm.name and first["t_end"] >= first["t_start"] > 0
    assert log.records[1]["peer"] == n - 1
    seqs = [rec["seq"] for rec in log.records[:3]]
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2]  # collective sequence on this group
    assert log.records[3]["seq"] == 1  # the first point-to-point call on this group
    assert log.records[2]["async"] is True


def test_records_errors(comm):
    with CallLog() as log:
        with pytest.raises(hpccomm.DtypeError):
            comm.all_reduce(np.ones(2), op=hpccomm.ReduceOp.BAND)
    # Validation failed before the record step: nothing reached the backend, nothing recorded.
    assert log.records == []


@pytest.mark.mpi(min_size=2)  # a peer to send a longer message than the receiver expects
def test_records_backend_errors(comm):
    r = comm.rank
    with CallLog() as log:
        if r == 0:
            comm.send(np.ones(8), 1, tag=3)
        elif r == 1:
            with pytest.raises(hpccomm.BackendError, match="MPI_ERR_TRUNCATE"):
                # async: posted at once (a blocking recv probes first: a MismatchError)
                comm.recv(np.empty(2), 0, tag=3, async_op=True).wait()
    comm.barrier()  # every rank is past the pair before anything is asserted
    if r == 1:
        (rec,) = log.records
        assert rec["op"] == "recv" and rec["peer"] == 0
        assert rec["error"].startswith(f"recv #{rec['seq']} on {comm.name} (rank 1 of")
        assert "MPI_ERR_TRUNCATE" in rec["error"]
    elif r == 0:
        assert [rec["error"] for rec in log.records] == [None]


def test_no_listener_after_exit(comm):
    log = CallLog()
    with log:
        comm.barrier()
    comm.barrier()
    assert [rec["op"] for rec in log.records] == ["barrier"]
    assert not hpccomm.record.listeners


def test_async_work_never_waited_is_reported(comm):
    import gc
    import warnings

    x = np.ones(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        work = comm.all_reduce(x, async_op=True)
        while not work.is_completed():  # complete it, but never call wait()
            pass
        del work
        gc.collect()
        pending = comm.barrier(async_op=True)
        del pending
        gc.collect()
    texts = [str(w.message) for w in caught if issubclass(w.category, UnwaitedWorkWarning)]
    assert any("barrier #" in t and "dropped without wait()" in t for t in texts), texts
    assert not any("all_reduce #" in t for t in texts)  # a completed handle is fine
    comm.barrier()


def test_a_receive_dropped_after_its_wait_timed_out_says_so(world):
    # irecv(...).wait(timeout=) with no sender: CommTimeoutError that says the operation
    # goes on (it said "abort the job", though a later wait() may complete it); dropping the
    # handle then warned "dropped without wait()", though it had been waited for
    import gc
    import warnings

    if world.size < 2:
        pytest.skip("needs 2 ranks")
    c = world.dup()
    try:
        c.timeout = 30
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if c.rank == 1:
                work = c.irecv(np.empty(2), 0, tag=5)
                with pytest.raises(hpccomm.CommTimeoutError, match=r"not complete after 0.2 s; "
                                   r"it goes on \(a later wait\(\) may complete it"):  # fmt: skip
                    work.wait(timeout=0.2)
            c.barrier()
            if c.rank == 0:
                c.send(np.full(2, 7.0), 1, tag=5)
            if c.rank == 1:
                assert work.wait() == 0
                work = c.irecv(np.empty(2), 0, tag=6)
                with pytest.raises(hpccomm.CommTimeoutError):
                    work.wait(timeout=0.2)
                del work
                gc.collect()
            c.barrier()
            if c.rank == 0:
                c.send(np.full(2, 8.0), 1, tag=6)  # the dropped receive's message
            c.barrier()  # (sent before rank 1 frees the group: after, it is refused)
        texts = [str(w.message) for w in caught if issubclass(w.category, UnwaitedWorkWarning)]
        if c.rank == 1:
            assert any("dropped after its wait() timed out" in t for t in texts), texts
            assert not any("without wait()" in t for t in texts), texts
    finally:
        c.free()


def test_records_name_mpi_where_the_fast_path_handed_the_call_on(world):
    # An ordinary array in the symmetric buffers' size range goes to the fast path, which
    # hands it to MPI at run time: its record said "shm"
    from hpccomm.backends import shm as shm_mod
    from hpccomm.backends.shm import ShmBackend

    c = world.dup()
    try:
        if c.size < 2 or c.num_nodes != 1:
            pytest.skip("the fast path needs 2 or more ranks on one node")
        # symmetric buffers only: ordinary arrays of any size are the MPI path's
        fast = ShmBackend(c._backend, None, 1 << 20, direct=False)
        fast.ranges = dict.fromkeys(fast.ranges, (shm_mod.NEVER, shm_mod.NEVER))
        c._dispatcher.shm = fast
        c._dispatcher.cache.clear()
        keep = c.zeros(1 << 16, np.float32)  # from now on calls of this size go to the path
        with CallLog() as log:
            c.all_reduce(np.ones(1 << 16, np.float32))  # 256 KiB ordinary: MPI runs it
            keep[:] = 1
            c.all_reduce(keep)  # the symmetric path
        assert [rec["backend"] for rec in log.records] == ["mpi", "shm"], log.records
        assert (keep == c.size).all()
    finally:
        c.free()


def test_dropped_works_past_the_first_ones_are_counted_and_said_at_exit(comm):
    # each warning's text is new (it names the call), so Python's registry kept one entry
    # per drop and printed two stderr lines per drop (40,000 drops: 160,000 lines)
    import gc
    import warnings

    from hpccomm import work

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(work.DROPS_SAID + 5):
            comm.all_reduce(np.ones(2), async_op=True)  # dropped at once
            gc.collect()
        comm.barrier()
    said = [w for w in caught if issubclass(w.category, UnwaitedWorkWarning)]
    assert len(said) == work.DROPS_SAID and "further ones are counted" in str(said[-1].message)
    assert work._DROPPED[0] == work.DROPS_SAID + 5


def test_a_dropped_works_record_ends_when_its_operation_does(comm):
    # a dropped Work's record stayed "started" for good: the flight recorder's dumps had
    # completed calls as running (trace analyze: "ranks 0-1 entered all_reduce #1 ... and
    # wait"), and the profiler kept each one and listed it as not completed
    import gc
    import warnings

    n, r = comm.size, comm.rank
    with CallLog() as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the UnwaitedWorkWarning is this test's premise
        comm.all_reduce(np.ones(3), async_op=True)  # dropped at once
        if n > 1:
            got = np.empty(2)
            w = comm.irecv(got, (r - 1) % n, tag=9)
            comm.isend(np.ones(2), (r + 1) % n, tag=9)  # dropped at once
            w.wait()
        gc.collect()
        comm.barrier()  # after the dropped all_reduce on the worker, or inline after it
        if n > 1:  # a later point-to-point call lets go of the finished send
            comm.sendrecv(np.ones(1), dst=(r + 1) % n, src=(r - 1) % n, out=np.empty(1))
    ended = [(rec["op"], rec["error"]) for rec in log.records]
    assert ("all_reduce", None) in ended
    if n > 1:
        assert ("send", None) in ended


@pytest.mark.parametrize("event", ["start", "end"])
def test_a_listener_that_raises_on_one_rank_never_stops_its_call(comm, event, capfd):
    # A listener raising on rank 1 only (a profiler whose disk is full): its error reached
    # the caller, the call was never made there while the others ran it, and the ranks were
    # out of step from then on: wrong sums, then a hang (an outside hunt). It is said on
    # stderr now, once per listener, and every call runs on every rank.
    failures = []

    def full_disk(ev, rec):
        if ev == event and comm.rank == min(1, comm.size - 1):
            failures.append(rec.seq)
            raise OSError(28, "No space left on device")

    hpccomm.add_listener(full_disk)
    try:
        for step in range(1, 4):
            x = np.full(3, float(step * (comm.rank + 1)))
            comm.all_reduce(x)
            assert (x == step * comm.size * (comm.size + 1) / 2).all(), (step, x)
        w = comm.all_reduce(np.ones(2), async_op=True)
        w.wait()
    finally:
        hpccomm.remove_listener(full_disk)
    err = capfd.readouterr().err
    if comm.rank == min(1, comm.size - 1):
        assert len(failures) == 4
        assert err.count("hpccomm: the listener") == 1, err
        assert re.search(rf"raised at the {event} of all_reduce #\d+ on .*\(the call goes on; "
                         r"later failures of this listener are not said\):\n.*Traceback.*"
                         r"OSError: \[Errno 28\] No space left on device", err, re.S), err  # fmt: skip
    else:
        assert "the listener" not in err


def test_a_dump_tells_an_async_call_that_ended_from_one_still_running(comm, tmp_path):
    # A Work's record ends when the Work is waited for: a dump taken after its operation
    # had completed on the worker thread said "started", and trace analyze called the
    # ranks "in" it ("not seen complete")
    from hpccomm.flight import FlightRecorder
    from hpccomm.record import add_listener, remove_listener

    rec = FlightRecorder(tmp_path, comm.rank, comm.size)
    add_listener(rec)
    try:
        w = comm.all_reduce(np.arange(1000, dtype=np.float64), async_op=True)
        comm.barrier()  # queued behind it on the group: it has completed
        (e,) = [e for e in rec.snapshot() if e["op"] == "all_reduce"]
        assert (e["state"], e.get("waited")) == ("completed", False)
        w.wait()
        (e,) = [e for e in rec.snapshot() if e["op"] == "all_reduce"]
        assert e["state"] == "completed" and "waited" not in e
    finally:
        remove_listener(rec)


@pytest.mark.parametrize("op", ["recv", "recv_object"])
def test_a_blocking_receive_that_timed_out_ends_its_record_failed(world, tmp_path, op):
    # nothing stays posted after a blocking receive times out, but its record stayed
    # "started": trace analyze said the rank still waited in it after later calls (an
    # outside hunt)
    from hpccomm.flight import FlightRecorder
    from hpccomm.record import add_listener, remove_listener

    comm = world.dup()
    comm.timeout = 0.3
    rec = FlightRecorder(tmp_path, comm.rank, comm.size)
    add_listener(rec)
    try:
        with pytest.raises(hpccomm.CommTimeoutError):
            if op == "recv":
                comm.recv(np.empty(2), comm.rank, tag=77)  # from itself: nothing comes
            else:
                comm.recv_object(comm.rank, tag=77)
        (e,) = [e for e in rec.snapshot() if e["op"] == op]
        assert e["state"] == "failed" and "not complete after 0.3 s" in str(e.get("error")), e
    finally:
        remove_listener(rec)
        comm.free()
