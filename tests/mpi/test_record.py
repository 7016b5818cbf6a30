"""The record step: every operation, sync or async, reaches listeners with its sequence
number, op, group, peer, dtype, shape and times. A call refused by validation never reaches
the record step (nothing is recorded); a call the backend fails is recorded with its error."""

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
