"""The profiler in a real job (any world size): a rank that sleeps before a collective is
named as the straggler with about the wait it caused, byte counts equal the arrays' sizes for
every op, the Chrome trace has a track per rank, and layout subgroups are told apart."""

import json
import re
import time

import numpy as np
import pytest

import hpccomm


def _on_rank0(comm, doc):
    """The profile document from rank 0, on every rank."""
    return comm.mpi.bcast(doc, root=0)


@pytest.mark.mpi(min_size=2)
def test_a_sleeping_rank_is_named_the_straggler(comm, tmp_path_factory):
    out = comm.mpi.bcast(str(tmp_path_factory.mktemp("prof")) if comm.rank == 0 else None)
    late, sleep, calls = comm.size - 1, 0.2, 6  # (0.05 s raced a loaded machine)
    x = np.ones(1024, np.float32)
    comm.all_reduce(x)
    with hpccomm.profile(comm, out) as prof:
        for _ in range(calls):
            if comm.rank == late:
                time.sleep(sleep)
            comm.all_reduce(x)
    doc = _on_rank0(comm, prof.doc)
    group = next(g for g in doc["groups"] if g["group"] == comm.name)
    top = group["stragglers"][0]
    assert top["rank"] == comm.world_rank(late), group
    assert top["last"] >= calls - 1, group  # a first call may see other skew
    # the others waited about the sleep each time (the clock bound is microseconds)
    assert 0.6 * sleep * 1e6 < top["mean_wait_us"] < 3 * sleep * 1e6, top
    assert doc["clock"]["bound_us"] < 5000
    if comm.rank == 0:
        summary = open(f"{out}/summary.txt").read()
        assert f"rank {comm.world_rank(late)} arrived last in" in summary


def test_byte_counts_equal_the_arrays(comm):
    n, r = comm.size, comm.rank
    c = comm.dup()
    c.name = "bytes"
    f8 = np.ones(10)  # 80 bytes
    with hpccomm.profile(comm) as prof:
        c.all_reduce(np.ones(10))
        c.broadcast(np.ones(10), 0)
        c.reduce(np.ones(10), 0)
        c.all_gather(np.ones(10), out=np.empty(10 * n))
        c.gather(np.ones(10), dst=0, out=np.empty(10 * n) if r == 0 else None)
        c.reduce_scatter(np.ones(10 * n), out=np.empty(10))
        c.all_to_all(np.ones(10 * n), out=np.empty(10 * n))
        c.scatter(np.ones(10 * n) if r == 0 else None, src=0, out=np.empty(10))
        if n >= 2 and r < 2:
            if r == 0:
                c.send(f8, 1)
            else:
                c.recv(np.empty(10), 0)
    c.free()
    doc = _on_rank0(comm, prof.doc)
    got = {row["op"]: row["bytes_per_rank"] for row in doc["table"] if row["group"] == "bytes"}
    expect = {
        "all_reduce": 80,
        "broadcast": 80,
        "reduce": 80,
        "all_gather": 80,  # each rank passes its block
        "gather": 80,
        "reduce_scatter": 80 * n,  # each rank passes the full input
        "all_to_all": 80 * n,
        "scatter": (80 * n + 80 * (n - 1)) / n,  # the source's input, the others' block
    }
    if n >= 2:
        expect.update(send=80, recv=80)
    assert got == pytest.approx(expect)
    calls = {row["op"]: row["calls_per_rank"] for row in doc["table"] if row["group"] == "bytes"}
    assert set(calls.values()) == {1}


def test_trace_is_chrome_format_with_a_track_per_rank(comm, tmp_path_factory):
    out = comm.mpi.bcast(str(tmp_path_factory.mktemp("trace")) if comm.rank == 0 else None)
    with hpccomm.profile(comm, out):
        for _ in range(3):
            comm.all_reduce(np.ones(4))
        comm.barrier()
    if comm.rank == 0:
        trace = json.load(open(f"{out}/trace.json"))
        events = trace["traceEvents"]
        calls = [e for e in events if e["ph"] == "X"]
        assert {e["pid"] for e in calls} == set(range(comm.size))
        tracks = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        assert tracks == set(range(comm.size))
        assert {e["name"] for e in calls} == {"all_reduce", "barrier"}
        assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in calls)
        doc = json.load(open(f"{out}/profile.json"))
        assert doc["schema"] == "hpccomm.profile/1" and doc["ranks"] == comm.size
    comm.barrier()


@pytest.mark.mpi(min_size=4)
def test_layout_subgroups_are_reported_apart(world):
    comm = world.dup()
    groups = comm.layout(tp=2)
    tp = groups.tp
    with hpccomm.profile(comm) as prof:
        for _ in range(4):
            if tp.rank == 1 and comm.rank >= 2:  # late in the second tp group only
                time.sleep(0.15)
            tp.all_reduce(np.ones(8))
    doc = _on_rank0(comm, prof.doc)
    tps = {tuple(g["members"]): g for g in doc["groups"] if g["group"].endswith("/tp")}
    assert set(tps) == {(2 * i, 2 * i + 1) for i in range(comm.size // 2)}
    assert tps[(2, 3)]["stragglers"][0]["rank"] == 3
    assert tps[(2, 3)]["stragglers"][0]["last"] >= 3
    row = next(r for r in doc["table"] if r["group"].endswith("/tp"))
    assert row["ranks"] == comm.size and row["group_size"] == 2
    groups.free()
    comm.free()


def test_profiler_off_leaves_the_hot_path_alone(comm):
    from hpccomm import record

    assert not record.listeners
    p = hpccomm.profile(comm).start()
    assert record.listeners == [p]
    p.stop()
    assert not record.listeners
    with pytest.raises(ValueError, match="already running"):
        with hpccomm.profile(comm) as q:
            q.start()
    assert not record.listeners


def test_a_second_session_starts_afresh(comm):
    p = hpccomm.profile(comm)
    with p:
        comm.all_reduce(np.ones(4))
    with p:
        comm.barrier()
    doc = _on_rank0(comm, p.doc)
    assert [(r["op"], r["calls_per_rank"]) for r in doc["table"]] == [("barrier", 1)]


def test_a_call_running_at_the_stop_is_reported_once(comm):
    # a receive still running at the stop, on a group no completed call of the session
    # named: the stop raised IndexError (the group was added after the list was copied);
    # and a second session reported the first one's call again
    c = comm.dup()
    prof = hpccomm.profiler.Profiler(c)
    buf = np.zeros(2)
    prof.start()
    work = c.recv(buf, src=c.rank, tag=1, async_op=True)  # from itself: sent after the stop
    doc = prof.stop()
    c.send(np.ones(2), dst=c.rank, tag=1)
    work.wait()
    if c.rank == 0:
        assert all(row["calls_per_rank"] > 0 for row in doc["table"]), doc["table"]
        assert [(u["rank"], u["group"], u["op"], u["seq"]) for u in doc["unfinished"]] == [
            (c.world_rank(r), c.name, "recv", 1) for r in range(c.size)
        ], doc["unfinished"]
    prof2 = hpccomm.profiler.Profiler(c)
    prof2.start()
    c.barrier()
    doc2 = prof2.stop()
    if c.rank == 0:
        assert doc2["unfinished"] == []
    c.free()


def test_the_dropped_events_note_names_the_limit_in_use(comm, tmp_path_factory):
    # with events=5 the note said "... past 200000 per rank" (the default, not the limit
    # used) and counted the calls of every rank as per rank
    out = comm.mpi.bcast(str(tmp_path_factory.mktemp("prof")) if comm.rank == 0 else None)
    with hpccomm.profile(comm, out, events=5) as prof:
        for _ in range(12):
            comm.all_reduce(np.ones(4))
    doc = _on_rank0(comm, prof.doc)
    assert doc["events_limit"] == 5 and doc["events_dropped"] == 7 * comm.size, doc
    if comm.rank == 0:
        summary = open(f"{out}/summary.txt").read()
        ranks = "rank 0" if comm.size == 1 else "ranks " + ", ".join(map(str, range(comm.size)))
        assert (
            f"note: {7 * comm.size} calls in all past the first 5 per rank ({ranks}) are counted"
            in summary
        ), summary


def test_bad_profiler_arguments_are_refused_naming_the_rank(comm, tmp_path_factory):
    # profile(None) was an AttributeError, events=-1 and stop(timeout="1"/-1) went through
    # (a TypeError at the stop, or each rank writing alone), and an unwritable directory
    # lost the whole profile at the stop, said on rank 0 alone (an outside hunt)
    with pytest.raises(hpccomm.InvalidArgumentError, match=r"profile: comm is NoneType None, "
                       r"expected a Communicator"):  # fmt: skip
        hpccomm.profile(None, "x")
    with pytest.raises(hpccomm.InvalidArgumentError, match=rf"profile \(rank {comm.rank} of "
                       rf"{comm.size}\): events is -1, expected an integer >= 0"):  # fmt: skip
        hpccomm.profile(comm, None, events=-1)
    with pytest.raises(hpccomm.InvalidArgumentError, match=rf"profile.start \(rank {comm.rank}"
                       rf" of {comm.size}\): the directory '/proc/nope/x' cannot be written on "
                       rf"rank\(s\) {re.escape(str(list(range(comm.size))))}: No such file"):  # fmt: skip
        hpccomm.profile(comm, "/proc/nope/x").start()
    out = comm.mpi.bcast(str(tmp_path_factory.mktemp("prof")) if comm.rank == 0 else None)
    prof = hpccomm.profile(comm, out).start()
    comm.all_reduce(np.ones(4))
    for bad in ("1", -1, float("nan"), True):
        with pytest.raises(hpccomm.InvalidArgumentError, match=r"profile.stop \(rank \d+ of "
                           r"\d+\): timeout is .*, expected finite seconds >= 0 or None"):  # fmt: skip
            prof.stop(timeout=bad)
    assert prof.running  # (refused before anything was stopped)
    doc = _on_rank0(comm, prof.stop(timeout=30))
    assert doc["ranks"] == comm.size
