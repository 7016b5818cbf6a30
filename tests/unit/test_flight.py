"""The trace analyzer on recorded dumps (no MPI): the verdict names who waits where, who
never arrived and why, and the ranks without a file."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hpccomm.cli import main
from hpccomm.errors import InvalidArgumentError
from hpccomm.flight import FlightRecorder, analyze, job_identity, load, load_trace

# what the analysis says of a rank with no call of a group in its trace (its ring not full)
NONE = (
    "it completed no recorded call on that group (group creations, split, dup, new_group, are "
    "not recorded)"
)


def entry(op, group, seq, state, shape=(4,), dtype="float32", gid=None, error=None):
    return {
        "op": op,
        "group": group,
        "gid": gid or group,
        "seq": seq,
        "peer": None,
        "dtype": dtype,
        "shape": list(shape) if shape is not None else None,
        "count": 4,
        "redop": None,
        "async": False,
        "t_start": 1.0,
        "t_end": None if state == "started" else 2.0,
        "error": error,
        "state": state,
        "site": None,
    }


def doc(rank, size, entries, reason="CommTimeoutError: ..."):
    groups = {"world": {"name": "world", "members": list(range(size))}}
    groups["world/3"] = {"name": "world/tp", "members": [2, 3]}
    return {"rank": rank, "size": size, "reason": reason, "groups": groups, "entries": entries}


def test_the_rank_that_never_arrived():
    size = 4
    docs = {}
    for r in range(3):
        docs[r] = doc(r, size, [
            entry("broadcast", "world", 11, "completed"),
            entry("all_reduce", "world", 12, "started", shape=(1024,)),
        ])  # fmt: skip
    docs[3] = doc(3, size, [
        entry("broadcast", "world", 11, "completed"),
        entry("barrier", "world/tp", 4, "started", shape=None, dtype=None, gid="world/3"),
    ])  # fmt: skip
    verdict = analyze(docs, size)
    assert verdict.startswith(
        "world #12: ranks 0-2 entered all_reduce #12 on world (1024,) float32 and wait. "
        "rank 3 never did: its last completed call there was broadcast #11 on world (4,) "
        "float32, and it waits in barrier #4 on world/tp"
    ), verdict
    assert f"rank 2 never did: {NONE}, and it waits in all_reduce" in verdict


def test_missing_files_and_failures():
    docs = {
        0: doc(0, 3, [entry("all_reduce", "world", 2, "failed", error="PeerError: rank 2 ...")]),
        1: doc(1, 3, [entry("all_reduce", "world", 2, "failed", error="PeerError: rank 2 ...")]),
    }
    verdict = analyze(docs, 3)
    assert "rank 0: all_reduce #2 on world (4,) float32 failed: PeerError: rank 2" in verdict
    assert "rank 2 left no trace file" in verdict
    assert analyze({}, None) == "no trace files: nothing to analyze"


def test_cli_reads_a_directory(tmp_path, capsys):
    for r in range(2):
        d = doc(r, 2, [entry("barrier", "world", 1, "started", shape=None, dtype=None)], "SIGUSR1")
        (tmp_path / f"rank{r:05d}.json").write_text(json.dumps(d))
    docs, size = load(tmp_path)
    assert size == 2 and sorted(docs) == [0, 1]
    assert main(["trace", "analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("world #1: ranks 0-1 entered barrier #1 on world and wait.")
    assert main(["trace", "analyze", str(tmp_path / "nope")]) == 2
    assert "trace analyze: " in capsys.readouterr().err


def test_a_receive_that_waits_is_named():
    # no collective waits, but a receive does: it said only "no rank waits in a collective
    # call"
    recv = entry("recv", "world", 3, "started")
    recv["peer"] = 0
    docs = {0: doc(0, 2, [entry("all_reduce", "world", 1, "completed")]),
            1: doc(1, 2, [entry("all_reduce", "world", 1, "completed"), recv])}  # fmt: skip
    verdict = analyze(docs, 2)
    assert verdict.startswith("rank 1 waits in recv #3 on world (4,) float32 (peer rank 0)")
    assert "no rank waits" not in verdict


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("CommTimeoutError: split #2 on world (rank 1 of 2): not complete", "it reported"),
        ("requested: checkpoint #3 before step 7", "it is in no hpccomm call"),
    ],
)
def test_what_a_rank_without_a_waiting_call_reported(reason, said):
    # only an hpccomm error about a call is quoted (a user's dump() reason with '#' was)
    docs = {0: doc(0, 2, [entry("all_reduce", "world", 2, "started")]),
            1: doc(1, 2, [entry("all_reduce", "world", 1, "completed")], reason=reason)}  # fmt: skip
    assert said in analyze(docs, 2)


def write(directory, name, d):
    (directory / name).write_text(d if isinstance(d, str) else json.dumps(d))


def test_dumps_of_another_job_are_left_out(tmp_path, capsys):
    # a 3-rank job's dumps, then a 2-rank job's over ranks 0-1: rank 2's file was merged in
    # and the verdict blamed a rank 2 the second job did not have
    for r in range(3):
        old = doc(r, 3, [entry("all_reduce", "world", 7, "started")])
        write(
            tmp_path,
            f"rank{r:05d}.json",
            {**old, "job": "PMIX_NAMESPACE=prterun-a@1", "time": 100.0},
        )
    for r in range(2):
        new = doc(r, 2, [entry("barrier", "world", 1, "started", shape=None, dtype=None)])
        write(
            tmp_path,
            f"rank{r:05d}.json",
            {**new, "job": "PMIX_NAMESPACE=prterun-b@1", "time": 160.0},
        )
    trace = load_trace(tmp_path)
    assert (trace.size, sorted(trace.docs), trace.job) == (2, [0, 1], "PMIX_NAMESPACE=prterun-b@1")
    assert trace.left_out == (
        "rank00002.json (another job: job PMIX_NAMESPACE=prterun-a@1, 3 ranks, its newest dump "
        "60 s older than that of the job analyzed: job PMIX_NAMESPACE=prterun-b@1, 2 ranks)",
    )
    assert main(["trace", "analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("world #1: ranks 0-1 entered barrier #1 on world and wait. (dumps")
    assert "rank 2" not in out.split(". left out: ")[0]
    assert out.rstrip().endswith(". left out: " + trace.left_out[0])


def test_dumps_of_the_same_size_but_another_job_are_left_out(tmp_path):
    write(tmp_path, "rank00000.json", {**doc(0, 2, []), "job": "SLURM_JOB_ID=7.0", "time": 5.0})
    write(tmp_path, "rank00001.json", {**doc(1, 2, []), "job": "SLURM_JOB_ID=8.0", "time": 9.0})
    trace = load_trace(tmp_path)
    assert sorted(trace.docs) == [1] and trace.job == "SLURM_JOB_ID=8.0"
    assert trace.left_out[0].startswith("rank00000.json (another job: job SLURM_JOB_ID=7.0")
    assert "rank 0 left no trace file" in analyze(trace.docs, trace.size)


def test_job_identity_from_the_launcher():
    assert job_identity({"PMIX_NAMESPACE": "prterun-h-1@1", "SLURM_JOB_ID": "5"}) == (
        "PMIX_NAMESPACE=prterun-h-1@1"
    )
    assert job_identity({"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "2"}) == "SLURM_JOB_ID=5.2"
    assert job_identity({"PATH": "/bin"}) is None


started = {"op": "all_reduce", "group": "world", "seq": 1, "state": "started"}


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        (
            "rank00000.json",
            '{"rank": 0, "size": 2, "entr',
            "not a flight recorder dump: invalid JSON",
        ),
        ("rank00000.json", "{}", "not a flight recorder dump: no rank, size, reason, entries"),
        ("rank00000.json", "[1]", "expected a JSON object, got list"),
        ("rank00000.json", json.dumps(doc(1, 2, [])), "records rank 1, expected 0 (the rank in"),
        ("rank00000.json", json.dumps(doc(0, 2, [{"op": "x"}])), "entries is not a list of calls"),
        ("rank00000.json", json.dumps({**doc(0, 2, []), "size": "2"}), "rank 0 of size '2', exp"),
        # valid JSON with a field of another type (an outside review: each was a traceback),
        # and a size the analysis would list the missing ranks of for ever
        *[
            (
                "rank00000.json",
                json.dumps({**doc(0, 2, [{**started, **change}]), **top}),
                said,
            )
            for change, top, said in [
                ({"shape": 5}, {}, "entry 0: shape is 5, not as the flight recorder writes it"),
                ({}, {"reason": 5}, "as it writes them: TypeError: object of type 'int' has no"),
                ({"state": "failed"}, {}, "as it writes them: KeyError: 'error'"),
                ({}, {"time": "abc"}, "as it writes them: ValueError: could not convert string"),
                ({"group": ["w"]}, {}, "entry 0: group is ['w'], not as the flight recorder"),
                # (fields compared across dumps: a traceback only with another dump beside)
                ({"seq": "5"}, {}, "entry 0: seq is '5', not as the flight recorder writes it"),
                ({"gid": 3}, {}, "entry 0: gid is 3, not as the flight recorder writes it"),
                ({"state": "done"}, {}, "entry 0: state is 'done', not as the flight recorder"),
                ({}, {"job": 7}, "job is 7, expected a string"),
            ]
        ],
        (
            "rank00000.json",
            json.dumps({**doc(0, 2, []), "size": 10**11}),
            "size 100,000,000,000, expected a world of at most 1,048,576 ranks",
        ),
    ],
)
def test_a_broken_dump_is_one_line_naming_the_file(tmp_path, capsys, name, content, problem):
    # a truncated dump crashed with a JSONDecodeError traceback, one without 'rank' a KeyError
    write(tmp_path, "rank00001.json", doc(1, 2, []))
    write(tmp_path, name, content)
    assert main(["trace", "analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hpccomm: trace analyze: {tmp_path / name}: "), err
    assert problem in err and len(err.strip().splitlines()) == 1, err


def test_a_file_not_named_like_a_dump_is_skipped_with_a_note(tmp_path, capsys):
    write(tmp_path, "rank_notes.json", {})
    for r in range(2):
        write(
            tmp_path, f"rank{r:05d}.json", doc(r, 2, [entry("all_reduce", "world", 1, "completed")])
        )
    assert main(["trace", "analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("left out: rank_notes.json (not named rank<N>.json: not a dump)")
    assert main(["trace", "analyze", "--json", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["left_out"] == ["rank_notes.json (not named rank<N>.json: not a dump)"]
    assert sorted(data["ranks"]) == ["0", "1"]
    # the verdicts too, as README says (it printed the dumps alone: an outside hunt)
    assert ". ".join(data["verdicts"]) + "\n" == out, data["verdicts"]
    assert data["verdicts"][-1] == "left out: rank_notes.json (not named rank<N>.json: not a dump)"


def test_a_dump_records_its_job(tmp_path, monkeypatch):
    monkeypatch.setenv("PMIX_NAMESPACE", "prterun-x-1@1")
    path = FlightRecorder(tmp_path, 0, 1).dump("requested")
    assert json.loads(path.read_text())["job"] == "PMIX_NAMESPACE=prterun-x-1@1"
    assert load_trace(tmp_path).job == "PMIX_NAMESPACE=prterun-x-1@1"


def test_an_unwritable_trace_directory_is_refused_at_init_and_said_at_a_dump(tmp_path, capsys):
    # A trace directory under a regular file was found only at the first dump: the signal
    # watcher thread died of the NotADirectoryError, and SIGTERM was then ignored
    from hpccomm import flight
    from hpccomm.errors import InvalidArgumentError

    blocker = tmp_path / "afile"
    blocker.write_text("")
    with pytest.raises(InvalidArgumentError, match=r"init: the trace directory .*afile/trace"):
        flight.check_directory(blocker / "trace")
    flight.check_directory(tmp_path / "new" / "trace")  # made, writable
    rec = FlightRecorder(blocker / "trace", 1, 2)
    rec.try_dump("SIGUSR1")  # says why, raises nothing
    err = capsys.readouterr().err
    assert "hpccomm (rank 1 of 2): the flight recorder could not write its trace (SIGUSR1)" in err


def test_a_rank_without_a_file_is_named_once():
    # it was named twice: "never did and left no trace file (killed hard?)", then again
    # "left no trace file (killed hard, or not tracing)"
    docs = {0: doc(0, 2, [entry("all_reduce", "world", 3, "started")])}
    verdict = analyze(docs, 2)
    assert "rank 1 never did and left no trace file (killed hard?)" in verdict
    assert verdict.count("left no trace file") == 1, verdict


def test_a_rank_whose_program_ended_is_said_to_have_left_not_to_be_killed(tmp_path):
    # A rank whose program ended one step early writes no trace file (it did not fail):
    # the verdict called it "killed hard", though the others' dumps knew it had left
    why = "its program ended: a normal exit or sys.exit"
    rec = FlightRecorder(tmp_path, 0, 3)
    rec.departed = lambda: {1: why}
    assert json.loads(rec.dump("x").read_text())["departed"] == {"1": why}
    d = doc(0, 3, [entry("all_reduce", "world", 3, "started")])
    d["departed"] = {"1": why}
    verdict = analyze({0: d}, 3)
    assert f"rank 1 never did: it left the job ({why}) without a trace file" in verdict, verdict
    assert "rank 2 never did and left no trace file (killed hard?)" in verdict, verdict
    d = doc(0, 3, [entry("all_reduce", "world", 3, "completed")])
    d["departed"] = {"1": why, "2": why}
    verdict = analyze({0: d}, 3)
    assert f"ranks 1-2 left the job ({why}) without a trace file (a rank" in verdict, verdict
    assert "killed hard" not in verdict, verdict


def test_ranks_waiting_for_each_other_in_point_to_point_calls_are_called_a_deadlock():
    # both ranks receive first: the verdict listed each rank's receive but did not say that
    # they wait for each other
    def recv(peer, seq, gid="world", is_async=False):
        e = entry("recv", "world" if gid == "world" else "world/split(0)", seq, "started",
                  gid=gid)  # fmt: skip
        e["peer"], e["async"] = peer, is_async
        return e

    docs = {0: doc(0, 2, [recv(1, 1)]), 1: doc(1, 2, [recv(0, 1)])}
    verdict = analyze(docs, 2)
    assert "world ranks 0 -> 1 -> 0 each wait for the next in a blocking point-to-point " in (
        verdict
    ), verdict
    # on a subgroup its ranks are translated (world/3 holds world ranks 2 and 3)
    docs = {r: doc(r, 4, [recv(1 - (r - 2), 1, gid="world/3")]) for r in (2, 3)}
    docs.update({r: doc(r, 4, []) for r in (0, 1)})
    assert "world ranks 2 -> 3 -> 2 each wait" in analyze(docs, 4)
    # an async receive does not block: no deadlock said
    docs = {0: doc(0, 2, [recv(1, 1, is_async=True)]), 1: doc(1, 2, [recv(0, 1)])}
    assert "deadlock" not in analyze(docs, 2)
    # a send facing a receive is no deadlock: they do not match (tags or sizes)
    send = entry("send", "world", 1, "started")
    send["peer"], send["tag"] = 1, 1
    facing = recv(0, 1)
    facing["tag"] = 2
    verdict = analyze({0: doc(0, 2, [send]), 1: doc(1, 2, [facing])}, 2)
    assert "deadlock" not in verdict, verdict
    assert "rank 0's send to rank 1 (tag 1, 4 elements) and rank 1's receive from rank 0 " in (
        verdict
    ), verdict
    # nor is a pair of sendrecv calls (each sends and receives)
    pair = []
    for r in range(2):
        e = entry("sendrecv", "world", 1, "started")
        e["peer"] = 1 - r
        pair.append(e)
    assert "deadlock" not in analyze({0: doc(0, 2, [pair[0]]), 1: doc(1, 2, [pair[1]])}, 2)


def test_errors_close_together_write_one_dump(tmp_path, monkeypatch):
    # every recoverable error wrote the whole ring (about 0.7 MB when full): a program
    # retrying 10 ms receive timeouts took 19-45 ms per timeout (a soak review)
    import json as _json

    from hpccomm import flight as flight_mod

    rec = flight_mod.FlightRecorder(tmp_path, 0, 2)
    clock = [100.0]
    monkeypatch.setattr(flight_mod.time, "monotonic", lambda: clock[0])
    rec.note_error(RuntimeError("first"))
    for i in range(5):
        clock[0] += 0.1
        rec.note_error(RuntimeError(f"again {i}"))
    assert rec.dumps == 1 and rec.errors_skipped == 5
    clock[0] += flight_mod.ERROR_DUMP_GAP
    rec.note_error(RuntimeError("later"))
    doc = _json.loads((tmp_path / "rank00000.json").read_text())
    assert rec.dumps == 2 and doc["reason"] == "RuntimeError: later"
    assert doc["errors_not_dumped"] == 5 and rec.errors_skipped == 0
    rec.try_dump("SIGUSR1")  # asked for: always written
    assert rec.dumps == 3


# the groups of comm.layout(tp=2, dp=2) on 4 ranks (ids as split makes them: the first
# member's world rank ends the id of each of the two groups one split makes)
LAYOUT = {
    "world": {"name": "world", "members": [0, 1, 2, 3]},
    "world/1@0": {"name": "world/tp", "members": [0, 1]},
    "world/1@2": {"name": "world/tp", "members": [2, 3]},
    "world/2@0": {"name": "world/dp", "members": [0, 2]},
    "world/2@1": {"name": "world/dp", "members": [1, 3]},
}
TP = {0: "world/1@0", 1: "world/1@0", 2: "world/1@2", 3: "world/1@2"}
DP = {0: "world/2@0", 1: "world/2@1", 2: "world/2@0", 3: "world/2@1"}


def layout_doc(rank, entries, reason="CommTimeoutError: ..."):
    return {**doc(rank, 4, entries, reason), "groups": LAYOUT}


def stuck_in(rank, where):
    """rank's dump, waiting in its first call of tp or dp (8 float64), or in barrier #3 on
    world."""
    if where == "world":
        return layout_doc(rank, [entry("barrier", "world", 3, "started", None, None)])
    gid = (TP if where == "tp" else DP)[rank]
    return layout_doc(rank, [entry("all_reduce", f"world/{where}", 1, "started", (8,),
                                   "float64", gid=gid)])  # fmt: skip


def test_every_stuck_call_is_in_the_verdict():
    # four calls wait (tp[0,1], tp[2,3], dp[1,3], world): the verdict told of the first
    # three only (world/tp #1 twice, world/dp #1) and never of world #3, where rank 3 waits
    docs = {0: stuck_in(0, "tp"), 1: stuck_in(1, "dp"), 2: stuck_in(2, "tp"),
            3: stuck_in(3, "world")}  # fmt: skip
    verdict = analyze(docs, 4)
    for said in [
        "world/tp #1: rank 0 entered all_reduce #1 on world/tp (8,) float64 and waits. rank 1 "
        f"never did: {NONE}, and it waits in all_reduce #1 on "
        "world/dp",
        "world/dp #1: rank 1 entered all_reduce #1 on world/dp (8,) float64 and waits. rank 3 "
        "never did",
        "world/tp #1: rank 2 entered all_reduce #1 on world/tp (8,) float64 and waits. rank 3 "
        "never did",
        "world #3: rank 3 entered barrier #3 on world and waits. rank 0 never did: "
        f"{NONE}, and it waits in all_reduce #1 on world/tp (8,) float64. rank 1 "
        f"never did: {NONE}, and it waits in all_reduce #1 on "
        "world/dp (8,) float64. rank 2 never did",
    ]:
        assert said in verdict, verdict


def test_a_wait_cycle_across_groups_is_called_a_deadlock():
    # ranks 0 and 3 call tp then dp, ranks 1 and 2 dp then tp: each waits in its first call
    # for a rank in another. The verdict (three calls at most) lost rank 3's call, and with
    # it the link 3 -> 2 of the ring: the deadlock could not be seen
    docs = {0: stuck_in(0, "tp"), 1: stuck_in(1, "dp"), 2: stuck_in(2, "dp"),
            3: stuck_in(3, "tp")}  # fmt: skip
    verdict = analyze(docs, 4)
    assert (
        "world/tp #1: rank 3 entered all_reduce #1 on world/tp (8,) float64 and waits. rank 2 "
        f"never did: {NONE}, and it waits in all_reduce #1 on "
        "world/dp (8,) float64"
    ) in verdict, verdict
    assert (
        "world ranks 0 -> 1 -> 3 -> 2 -> 0 each wait for the next in a collective call the next "
        "has not entered, as it waits in another (rank 0 in all_reduce #1 on world/tp, rank 1 in "
        "all_reduce #1 on world/dp, rank 3 in all_reduce #1 on world/tp, rank 2 in all_reduce #1 "
        "on world/dp): a deadlock (none can complete before another does"
    ) in verdict, verdict
    # a chain that ends in a rank outside any call is no deadlock
    docs[2] = layout_doc(2, [entry("all_reduce", "world/dp", 1, "completed", gid=DP[2])])
    assert "deadlock" not in analyze(docs, 4)


def timeout(call, parts):
    """A stuck call's CommTimeoutError as dispatch words it, with what the others answered."""
    return (
        f"CommTimeoutError: {call}: not complete after 2 s; some rank of the group has not "
        f"joined it (MPI cannot cancel it: abort the job); where the other ranks are (asked at "
        f"the timeout): {parts}"
    )


def test_a_rank_without_a_file_is_placed_from_what_the_others_heard():
    # rank 0 skipped its tp call and waits in world #5; rank 1 timed out in tp #3 and, not
    # caught, aborted the job before rank 0 (and rank 2) wrote a file. The verdict said "rank 0
    # never did and left no trace file (killed hard?)", though rank 1's dump says where it was
    def waiting(rank, group, seq, reason):
        gid = {"world": "world", "world/tp": TP[rank], "world/dp": DP[rank]}[group]
        return layout_doc(rank, [
            entry("all_reduce", "world", 4, "completed", (8,), "float64"),
            entry("all_reduce", group, seq, "started", (8,), "float64", gid=gid),
        ], reason)  # fmt: skip

    tp_heard = timeout(
        "all_reduce #3 on world/tp (rank 1 of 2)",
        "rank(s) [0] have not reached it; rank 0: last call of this group #2, waits in "
        "all_reduce #5 on world (rank 0 of 4)",
    )
    dp_heard = timeout(  # (group rank 0 of world/dp is world rank 1)
        "all_reduce #3 on world/dp (rank 1 of 2)",
        "rank(s) [0] have not reached it; rank 0 (world rank 1): last call of this group #2, "
        "waits in all_reduce #3 on world/tp (rank 1 of 2)",
    )
    docs = {1: waiting(1, "world/tp", 3, tp_heard), 3: waiting(3, "world/dp", 3, dp_heard)}
    verdict = analyze(docs, 4)
    assert (
        "world/tp #3: rank 1 entered all_reduce #3 on world/tp (8,) float64 and waits. rank 0 "
        "never did and left no trace file, but rank 1 heard at its timeout in all_reduce #3 on "
        "world/tp where it was: last call of world/tp #2, waits in all_reduce #5 on world."
    ) in verdict, verdict
    assert "killed hard?" not in verdict, verdict
    # the ring it closes: rank 0 waits in world #5 for rank 1, which waits in tp #3 for it
    assert "world ranks 0 -> 1 -> 0 each wait for the next in a collective call" in verdict
    # nothing is known of rank 2: that one may have been killed
    assert "rank 2 left no trace file (killed hard, or not tracing)" in verdict, verdict

    # heard in the very call that waits (rank 2 "waits in it too"): it entered it; heard
    # of through a subgroup (world/dp's rank 0 is world rank 1): named by its world rank
    world_heard = timeout(
        "all_reduce #5 on world (rank 0 of 4)",
        "rank(s) [1, 3] have not reached it; rank 1: last call of this group #4, waits in "
        "all_reduce #3 on world/tp (rank 1 of 2); rank 2: waits in it too; rank 3: last call "
        "of this group #4",
    )
    docs = {0: waiting(0, "world", 5, world_heard), 3: docs[3]}
    verdict = analyze(docs, 4)
    assert verdict.startswith("world #5: ranks 0,2 entered all_reduce #5 on world"), verdict
    assert (
        "rank 1 never did and left no trace file, but rank 3 heard at its timeout in "
        "all_reduce #3 on world/dp where it was: last call of world/dp #2, waits in all_reduce "
        "#3 on world/tp."
    ) in verdict, verdict
    assert (
        "rank 2 left no trace file, but rank 0 heard at its timeout in all_reduce #5 on world "
        "where it was: waits in it too."
    ) in verdict, verdict
    assert "killed hard" not in verdict, verdict

    # a departure heard only at a timeout (no departure list in any dump)
    docs[3]["reason"] = timeout(
        "all_reduce #3 on world/dp (rank 1 of 2)",
        "rank 0 (world rank 1) has left the job (its program ended: a normal exit or sys.exit) "
        "after its call #2 of this group",
    )
    verdict = analyze(docs, 4)
    assert (
        "rank 1 never did: it left the job (its program ended: a normal exit or sys.exit) "
        "without a trace file"
    ) in verdict, verdict


def test_a_rank_that_did_not_answer_is_not_called_killed():
    # rank 3 was alive, busy outside hpccomm, when rank 1 (in tp #3) and rank 0 (in world #5)
    # asked; the job was aborted before it wrote a file. The verdict said "killed hard?"
    # where the asking ranks' dumps say that it did not answer
    silence = (
        "no answer within 1 s from rank(s) [1] (world rank(s) [3]) (not waiting in a call "
        "with a timeout: busy outside hpccomm, in a call without a timeout, or gone)"
    )
    docs = {
        r: layout_doc(
            r,
            [
                entry("all_reduce", "world", 4, "completed", (8,), "float64"),
                entry("all_reduce", "world/dp", 3, "started", (8,), "float64", gid=DP[r]),
            ],
            timeout(f"all_reduce #3 on world/dp (rank {r // 2} of 2)", silence),
        )  # fmt: skip
        for r in (1,)
    }
    docs[0] = layout_doc(0, [
        entry("all_reduce", "world", 5, "started", (8,), "float64"),
    ], timeout("all_reduce #5 on world (rank 0 of 4)",
               "rank(s) [1, 3] have not reached it; rank 1: last call of this group #4, waits "
               "in all_reduce #3 on world/dp (rank 0 of 2); rank 2: waits in it too; "
               "no answer within 1 s from rank(s) [3] (not waiting in a call with a timeout: "
               "busy outside hpccomm, in a call without a timeout, or gone)"))  # fmt: skip
    verdict = analyze(docs, 4)
    assert "killed hard" not in verdict, verdict
    assert (
        "rank 3 never did and left no trace file; rank 0 asked where it was at its timeout in "
        "all_reduce #5 on world: it did not answer within 1 s (not waiting in a call with a "
        "timeout: busy outside hpccomm, in a call without a timeout, or gone)"
    ) in verdict or (
        "rank 3 never did and left no trace file; rank 1 asked where it was at its timeout in "
        "all_reduce #3 on world/dp: it did not answer within 1 s"
    ) in verdict, verdict
    # an answer counts before a silence: rank 2 answered rank 0 ("waits in it too")
    assert "rank 2 left no trace file, but rank 0 heard" in verdict, verdict


def test_a_blocking_receive_is_named_before_other_ranks_unwaited_sends():
    # rank 0 skipped the send with tag 1 and left two isends unwaited; rank 1 blocks in its
    # recv of tag 1. The verdict listed rank 0's first three entries only ("waits in send
    # #1", which rank 1 had received) and never named the receive that waited
    def p2p(op, seq, state, peer, tag, is_async):
        e = entry(op, "world", seq, state)
        e["peer"], e["tag"], e["async"] = peer, tag, is_async
        return e

    docs = {
        0: doc(0, 2, [p2p("send", 1, "started", 1, 0, True), p2p("send", 2, "started", 1, 2, True),
                      p2p("send", 3, "started", 1, 3, True), p2p("send", 4, "started", 1, 4, True),
                      p2p("batch_isend_irecv", 5, "completed", None, None, True)]),
        1: doc(1, 2, [p2p("recv", 1, "completed", 0, 0, False),
                      p2p("recv", 2, "started", 0, 1, False)]),
    }  # fmt: skip
    verdict = analyze(docs, 2)
    assert verdict.startswith("rank 1 waits in recv #2 on world (4,) float32 (peer rank 0, tag 1)")
    assert (
        "rank 0 has send #1 on world (4,) float32 (peer rank 1, tag 0) not seen complete (async"
    ) in verdict, verdict
    assert "and 1 more async point-to-point calls so" in verdict, verdict
    assert (
        "rank 1's receive from rank 0 (tag 1) has no matching send: rank 0's sends to rank 1 "
        "that no receive of rank 1 took (by their traces) have tag(s) [2, 3, 4] (a send "
        "skipped, or the tags differ)"
    ) in verdict, verdict


def test_a_completed_send_with_another_tag_is_named_not_called_a_deadlock():
    # stage 0 sent tag 8 (completed, eager) and waits for the reply; stage 1 waits in its
    # recv of tag 7. The ring of receives was called a deadlock, "post one side's call
    # first", and the send was never named (an outside hunt); with a collective waiting
    # too, the receive's peer and tag were not said at all
    def p2p(op, seq, state, peer, tag, group="world/pp", gid="world/pp"):
        e = entry(op, group, seq, state, gid=gid)
        e["peer"], e["tag"] = peer, tag
        return e

    docs = {
        0: doc(0, 2, [p2p("send", 1, "completed", 1, 6), p2p("send", 2, "completed", 1, 8),
                      p2p("recv", 3, "started", 1, 9)]),
        1: doc(1, 2, [p2p("recv", 1, "completed", 0, 6), p2p("recv", 2, "started", 0, 7)]),
    }  # fmt: skip
    verdict = analyze(docs, 2)
    assert (
        "rank 1's receive from rank 0 (tag 7) has no matching send: rank 0's sends to rank 1 "
        "that no receive of rank 1 took (by their traces) have tag(s) [8]"
    ) in verdict, verdict
    assert "because a receive's tag matches no send (above)" in verdict, verdict
    assert "post one side's call first" not in verdict, verdict
    # a real deadlock stays one where the receiver's trace cannot count the messages: it
    # took them with a sendrecv, a batch, a wildcard, or dropped them (review AJ)
    for taken in ("sendrecv", "batch_isend_irecv", "any tag", "dropped"):
        d = {r: {**v, "entries": [dict(e) for e in v["entries"]]} for r, v in docs.items()}
        d[0]["entries"][1]["tag"] = 6  # (every message received: a true deadlock)
        first = d[1]["entries"][0]
        if taken == "any tag":
            first["tag"] = None
        elif taken == "dropped":
            d[1]["recorded"] = 10
        else:
            first["op"] = taken
        d[1]["entries"].insert(1, p2p("recv", 9, "completed", 0, 6))  # (the second tag 6)
        if taken == "dropped":
            d[1]["entries"].pop(1)
        said = analyze(d, 2)
        assert "has no matching send" not in said and "post one side's call first" in said, (
            taken,
            said,
        )
    docs[1]["entries"].insert(0, entry("all_reduce", "world", 1, "started"))  # a collective
    verdict = analyze(docs, 2)
    assert "it waits in recv #3 on world/pp (4,) float32 (peer rank 1, tag 9)" in verdict, verdict
    assert (
        "rank 0's sends to rank 1 that no receive of rank 1 took (by their traces) have tag(s) [8]"
        in (verdict)
    ), verdict


def test_a_rank_waiting_in_another_call_of_the_same_group_is_said_to_wait_there():
    # rank 0 started an async all_reduce #2 that rank 1 never called, then both a barrier
    # (#3 on rank 0, #2 on rank 1). Rank 1's dump shows it in barrier #2, yet the analysis
    # of #3 said it "is in no hpccomm call (computing, or stuck elsewhere)" (an outside hunt)
    async_call = entry("all_reduce", "world", 2, "started")
    async_call["async"] = True
    docs = {
        0: doc(0, 2, [entry("all_reduce", "world", 1, "completed"), async_call,
                      entry("barrier", "world", 3, "started", None, None)]),
        1: doc(1, 2, [entry("all_reduce", "world", 1, "completed"),
                      entry("barrier", "world", 2, "started", None, None)]),
    }  # fmt: skip
    verdict = analyze(docs, 2)
    assert (
        "world #3: rank 0 entered barrier #3 on world and waits. rank 1 never did: its last "
        "completed call there was all_reduce #1 on world (4,) float32, and it waits in barrier "
        "#2 on world"
    ) in verdict, verdict
    assert "in no hpccomm call" not in verdict, verdict


def test_a_group_whose_calls_the_ring_dropped_is_not_said_to_have_none():
    # 2,500 world calls after 5 on a split group: the ring (2,000) had dropped the split
    # group's, and the analysis said "it completed no call on that group"
    waiting = entry("all_reduce", "world/tp", 6, "started", gid="world/3")
    other = [entry("barrier", "world", 2502, "started", None, None)]
    docs = {2: doc(2, 4, [waiting]), 3: doc(3, 4, other)}
    docs[3]["recorded"] = 2503
    verdict = analyze(docs, 4)
    assert (
        "rank 3 never did: its trace holds no call of that group (it keeps a rank's last 1 "
        "calls and dropped 2,502 older ones), and it waits in barrier #2502 on world"
    ) in verdict, verdict
    docs[3]["recorded"] = 1  # nothing dropped: none recorded
    assert f"rank 3 never did: {NONE}, and it waits in barrier" in analyze(docs, 4)


def test_calls_that_differ_across_ranks_name_the_odd_rank_first():
    # a float64 all_reduce on rank 0 against float32 on ranks 1-2 (16 elements: below the
    # size compared before MPI): rank 1's receive was cut short (MPI_ERR_TRUNCATE) and the
    # analysis led with rank 1's failure, never naming rank 0's dtype (an outside hunt)
    failed = entry("all_reduce", "world", 1, "failed", (16,), error="MPI_ERR_TRUNCATE: ...")
    docs = {
        0: doc(0, 3, [entry("all_reduce", "world", 1, "started", (16,), "float64")]),
        1: doc(1, 3, [failed]),
        2: doc(2, 3, [entry("all_reduce", "world", 1, "started", (16,))]),
    }
    verdict = analyze(docs, 3)
    assert verdict.startswith(
        "world #1 (all_reduce): the ranks' calls differ: dtype float64 on rank 0 but float32 "
        "on ranks 1-2. world #1: ranks 0,2 entered"
    ), verdict
    # the stuck call names each rank's arguments (rank 0's alone named both before)
    assert (
        "ranks 0,2 entered all_reduce #1 on world ((16,) float64 on rank 0; (16,) float32 on "
        "rank 2) and wait"
    ) in verdict, verdict
    docs[0]["entries"][0]["dtype"] = "float32"  # alike: said once, as before
    assert "ranks 0,2 entered all_reduce #1 on world (16,) float32 and wait" in analyze(docs, 3)

    # roots, reduce ops and shapes; not what may differ by rank (an uneven all_gather's
    # shapes, a gather's other ranks without data)
    def call(op, seq, shape=(4,), dtype="float32", peer=None, redop=None):
        e = entry(op, "world", seq, "completed", shape, dtype)
        e.update(peer=peer, redop=redop)
        return e

    docs = {
        r: doc(r, 3, [
            call("broadcast", 1, peer=r % 2),
            call("all_reduce", 2, redop="SUM" if r else "MAX"),
            call("all_reduce", 3, shape=(4 + (r == 2),)),
            call("all_gather", 4, shape=(r + 1,)),
            call("gather", 5, shape=(4,) if r == 0 else None, dtype="float32" if r == 0 else None,
                 peer=0),
            entry("barrier", "world", 6, "started", None, None),
        ])
        for r in range(3)
    }  # fmt: skip
    verdict = analyze(docs, 3)
    assert "world #1 (broadcast): the ranks' calls differ: root 1 on rank 1 but 0 on ranks 0,2" in (
        verdict
    ), verdict
    assert (
        "world #2 (all_reduce): the ranks' calls differ: op MAX on rank 0 but SUM on ranks 1-2"
        in (verdict)
    ), verdict
    assert (
        "world #3 (all_reduce): the ranks' calls differ: shape (5,) on rank 2 but (4,) on ranks 0-1"
        in (verdict)
    ), verdict
    assert "#4" not in verdict and "#5" not in verdict, verdict


def test_sigterm_while_the_main_thread_writes_a_dump_ends_the_rank_at_once(tmp_path):
    # the main thread, inside a dump of its own (hpccomm.dump(), an error's), held the
    # recorder's lock while it waited for the watcher to end the process; the watcher's
    # SIGTERM dump waited for that lock: the rank ended 31 s later with no SIGTERM dump
    # (a review)
    code = f"""
import os, signal, sys, threading, time
from hpccomm import flight
rec = flight.start({str(tmp_path)!r}, 0, 1)
def kill():
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=kill, daemon=True).start()
while True:
    rec.dump("requested")
"""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 128 + signal.SIGTERM, out.stderr
    assert time.monotonic() - t0 < 15, time.monotonic() - t0
    assert json.loads((tmp_path / "rank00000.json").read_text())["reason"] == "SIGTERM"


def test_premul_sum_factors_that_differ_by_rank_are_no_difference():
    # each rank scales its own input by its own factor (a weighted average): the analysis
    # compared the recorded op with its factor and led with "the ranks' calls differ"
    # (a review)
    docs = {
        r: doc(r, 2, [
            {**entry("all_reduce", "world", 1, "completed"), "redop": f"ReduceOp.PREMUL_SUM({f})"},
            entry("barrier", "world", 2, "started", None, None),
        ])
        for r, f in ((0, 0.25), (1, 0.75))
    }  # fmt: skip
    assert "differ" not in analyze(docs, 2)
    docs[1]["entries"][0]["redop"] = "ReduceOp.SUM"
    assert "op ReduceOp.PREMUL_SUM on rank 0 but ReduceOp.SUM on rank 1" in analyze(docs, 2)


def test_a_rank_whose_calls_on_the_group_failed_is_not_said_to_have_none():
    # (rank 0 waits in #2: a rank's failed record of the call waited in is said as such, below)
    failed = entry("all_reduce", "world", 1, "failed", error="MPI_ERR_TRUNCATE: ...")
    docs = {0: doc(0, 2, [entry("all_reduce", "world", 2, "started")]), 1: doc(1, 2, [failed])}
    docs[1]["recorded"] = 3000
    verdict = analyze(docs, 2)
    assert (
        "rank 1 never did: none of its calls on that group completed, and its call all_reduce #1 "
        "on world (4,) float32 failed"
    ) in verdict, verdict


def test_a_rank_whose_own_record_holds_the_call_completed_or_failed_is_said_so():
    # rank 1 passed float64 to all_reduce #4, rank 0 float32: MPI let rank 0 complete it, go
    # on to broadcast #5 and wait in world/dup #2. The verdict said "rank 0 never did: its
    # last completed call there was broadcast #5", then called the two waits a deadlock
    # (hunt AQ)
    dup = {"gid": "world/1@0"}
    docs = {
        0: doc(0, 2, [
            entry("all_reduce", "world", 4, "completed", shape=(1001,)),
            entry("broadcast", "world", 5, "completed", shape=(37,), dtype="float64"),
            {**entry("all_reduce", "world/dup", 2, "started", dtype="float64"), **dup},
        ]),
        1: doc(1, 2, [
            {**entry("all_reduce", "world/dup", 1, "completed", dtype="float64"), **dup},
            entry("all_reduce", "world", 4, "started", shape=(1001,), dtype="float64"),
        ]),
    }  # fmt: skip
    for d in docs.values():
        d["groups"]["world/1@0"] = {"name": "world/dup", "members": [0, 1]}
    verdict = analyze(docs, 2)
    assert (
        "world #4: rank 1 entered all_reduce #4 on world (1001,) float64 and waits. rank 0 "
        "completed it (its call: all_reduce #4 on world (1001,) float32, which differs: dtype "
        "float32 on rank 0 but float64 on rank 1), and it waits in all_reduce #2 on world/dup"
    ) in verdict, verdict
    assert "rank 0 never did" not in verdict and "deadlock" not in verdict, verdict
    # arguments alike: its call alone
    docs[1]["entries"][1]["dtype"] = "float32"
    assert "rank 0 completed it (its call: all_reduce #4 on world (1001,) float32), and" in (
        analyze(docs, 2)
    )
    # failed there, with another call than the waiting rank's (async calls issued in
    # another order, debug "check"): both "never did" before
    mismatch = "all_reduce #4 on world (rank 0 of 2): the ranks' calls differ: ..."
    docs[0]["entries"][0].update(state="failed", error=mismatch)
    docs[1]["entries"][1].update(op="broadcast", dtype="float64", shape=[37])
    verdict = analyze(docs, 2)
    assert (
        "rank 0 failed it (its call: all_reduce #4 on world (1001,) float32, which differs: the "
        "call is all_reduce on rank 0 but broadcast on rank 1): all_reduce #4 on world (rank 0 "
        "of 2): the ranks' calls differ: ..., and it waits in all_reduce #2 on world/dup"
    ) in verdict, verdict
    assert "never did" not in verdict.split("world #4:")[1] and "deadlock" not in verdict


def test_a_rank_whose_program_ended_is_said_to_have_left_the_job(tmp_path):
    # a rank whose program ended waits at exit for the others, alive, and writes its file on
    # SIGTERM: the verdict said it "is in no hpccomm call (computing, or stuck elsewhere)",
    # though the peer's dump listed its departure (hunt AQ)
    why = "its program ended: a normal exit or sys.exit"
    docs = {
        0: doc(0, 2, [entry("all_reduce", "world", 3, "completed")], reason="SIGTERM"),
        1: doc(1, 2, [entry("all_reduce", "world", 3, "completed"),
                      entry("all_reduce", "world", 4, "started")]),
    }  # fmt: skip
    docs[1]["departed"] = {"0": why}
    verdict = analyze(docs, 2)
    assert (
        f"rank 0 never did: its last completed call there was all_reduce #3 on world (4,) "
        f"float32, and it has left the job ({why})"
    ) in verdict, verdict
    assert "in no hpccomm call" not in verdict, verdict
    # no peer heard of it (the peer waits inside MPI without a timeout): its own dump says so
    docs[1]["departed"] = {}
    docs[0]["program_ended"] = True
    assert "and it has left the job (its program ended: its trace was written at exit)" in (
        analyze(docs, 2)
    )
    # the recorder writes it: a dump at exit (an atexit handler), and one during the program
    code = (
        "import atexit, json, sys; from hpccomm.flight import FlightRecorder; "
        "rec = FlightRecorder(sys.argv[1], 0, 1); "
        "print(json.loads(rec.dump('x').read_text())['program_ended']); "
        "atexit.register(lambda: rec.dump('at exit'))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "False", out
    assert json.loads((tmp_path / "rank00000.json").read_text())["program_ended"] is True
    docs[0]["program_ended"] = "yes"
    write(tmp_path, "rank00000.json", docs[0])
    with pytest.raises(InvalidArgumentError, match="program_ended is 'yes', expected true"):
        load(tmp_path)


def test_calls_only_unwaited_async_works_hold_come_after_the_waits():
    # a Work kept and never waited for stays "started" though its operation completed: the
    # verdict opened with "ranks 0-1 entered all_reduce #1 ... and wait", before the real
    # hang, and said a one-member group's call waited (hunt AQ)
    kept = {**entry("all_reduce", "world", 1, "started"), "async": True}
    alone = {**entry("all_reduce", "world/tp", 3, "started", gid="world/3"), "async": True}
    docs = {
        0: doc(0, 2, [kept, entry("all_reduce", "world", 2, "started")]),
        1: doc(1, 2, [kept, alone, entry("broadcast", "world", 2, "started")]),
    }
    docs[1]["groups"]["world/3"] = {"name": "world/tp", "members": [1]}
    verdict = analyze(docs, 2)
    assert verdict.startswith(
        "world #2: ranks 0-1 entered different calls (rank 0 all_reduce; rank 1 broadcast) and "
        "wait. world #1: ranks 0-1 started all_reduce #1 on world (4,) float32 with async_op, "
        "not seen complete (not waited for yet, or waited for now; every member started it: it "
        "may have completed). world/tp #3: rank 1 started all_reduce #3 on world/tp (4,) "
        "float32 with async_op, not seen complete (not waited for yet, or waited for now; every "
        "member started it: it may have completed)"
    ), verdict
    # one that some member never started may not have
    docs[0]["entries"] = docs[0]["entries"][1:]
    assert (
        "world #1: rank 1 started all_reduce #1 on world (4,) float32 with async_op, not seen "
        "complete (not waited for yet, or waited for now). rank 0 never did"
    ) in analyze(docs, 2)


def test_a_refused_call_is_said_as_refused_with_its_arguments():
    # rank 1's validation refused all_reduce #4 (it took the number); rank 0 waits in it.
    # The refusal was not recorded: "rank 1 never did: its last completed call there was #3"
    docs = {
        0: doc(0, 2, [
            entry("all_reduce", "world", 3, "completed"),
            entry("all_reduce", "world", 4, "started"),
        ]),
        1: doc(1, 2, [
            entry("all_reduce", "world", 3, "completed"),
            entry("all_reduce", "world", 4, "refused", dtype="complex64",
                  error="all_reduce (rank 1 of 2): op MAX is not defined for dtype complex64"),
        ], reason="DtypeError: all_reduce (rank 1 of 2): op MAX is not defined ..."),
    }  # fmt: skip
    verdict = analyze(docs, 2)
    assert (
        "world #4: rank 0 entered all_reduce #4 on world (4,) float32 and waits. rank 1 "
        "refused it (its call: all_reduce #4 on world (4,) complex64, which differs: dtype "
        "complex64 on rank 1 but float32 on rank 0): all_reduce (rank 1 of 2): op MAX is not "
        "defined for dtype complex64"
    ) in verdict, verdict
    assert "never did" not in verdict, verdict


class _Group:
    name = "world/tp"
    world_ranks = (2, 3)


class _TorchDtype:  # what torch.float32 says of itself: no .name
    def __str__(self):
        return "torch.float32"


class _Tensor:
    shape = (2, 3)
    dtype = _TorchDtype()


class _BadRepr:  # a root whose repr raises: the refusal's record must not raise
    def __repr__(self):
        raise RuntimeError("repr fails")


@pytest.mark.parametrize(
    ("data", "peer", "redop", "said"),
    [
        (np.ones((3, 5), np.complex64), None, "max", ("complex64", [3, 5], None, "ReduceOp.MAX")),
        ([1, 2], 7, None, (None, None, 7, None)),
        (np.ones(2), "0", "nonsense", ("float64", [2], "'0'", None)),
        # a NumPy root as the others' records write it (its repr was said to differ), a
        # torch dtype by its name ("torch.float32" beside "float32" likewise)
        (np.ones(2), np.int64(1), "sum", ("float64", [2], 1, "ReduceOp.SUM")),
        (_Tensor(), None, None, ("float32", [2, 3], None, None)),
        (np.ones(1), _BadRepr(), None, ("float64", [1], "a _BadRepr", None)),
        (np.ones(1), np.array([1, 2]), None, ("float64", [1], "array([1, 2])", None)),
    ],
)
def test_the_recorder_keeps_a_refusal_as_given(tmp_path, data, peer, redop, said):
    from hpccomm.record import Refusal

    rec = FlightRecorder(tmp_path, 0, 4)
    exc = InvalidArgumentError("broadcast (rank 0 of 2): ...")
    rec.note_refusal(
        Refusal("broadcast", _Group(), "world/2", 6, (data, peer, None, None), redop, exc)
    )
    path = rec.dump("DtypeError: ...")
    d = json.loads(path.read_text())
    (e,) = d["entries"]
    assert (e["state"], e["seq"], e["gid"], e["error"]) == ("refused", 6, "world/2", str(exc))
    assert (e["dtype"], e["shape"], e["peer"], e["redop"]) == said
    assert d["groups"] == {"world/2": {"name": "world/tp", "members": [2, 3]}}
    assert d["recorded"] == 1
    load(tmp_path)  # the analysis reads it
    assert rec.entries[0].error == str(exc)  # its text: no traceback keeping arrays alive


def test_receives_that_timed_out_are_read_as_where_their_ranks_waited():
    # with a timeout the receives are cancelled and recorded failed: the analysis read only
    # the calls still running, and said neither the mistagged send nor the deadlock of two
    # ranks both receiving first, as it does without a timeout (an outside hunt)
    def p2p(op, seq, state, peer, tag):
        error = None
        if state == "failed":
            error = (
                f"{op} #{seq} on world (rank {1 - peer} of 2): not complete after 4 s; no "
                f"message from rank {peer} with tag {tag} arrived"
            )
        e = entry(op, "world", seq, state, error=error)
        e["peer"], e["tag"] = peer, tag
        return e

    mistagged = {
        0: doc(0, 2, [p2p("send", 1, "completed", 1, 8),
                      entry("barrier", "world", 4, "started", shape=None, dtype=None)]),
        1: doc(1, 2, [p2p("recv", 1, "failed", 0, 7)]),
    }  # fmt: skip
    verdict = analyze(mistagged, 2)
    assert (
        "rank 1's receive from rank 0 (tag 7) has no matching send: rank 0's sends to rank 1 "
        "that no receive of rank 1 took (by their traces) have tag(s) [8]"
    ) in verdict, verdict
    both = {r: doc(r, 2, [p2p("recv", 1, "failed", 1 - r, 0)]) for r in range(2)}
    verdict = analyze(both, 2)
    assert (
        "world ranks 0 -> 1 -> 0 each wait for the next in a blocking point-to-point call "
        "(until their timeouts): a deadlock"
    ) in verdict, verdict
    # one that timed out before the other began is no ring of waits (a review)
    both[1]["entries"][0]["t_start"], both[1]["entries"][0]["t_end"] = 20.0, 24.0
    assert "a deadlock" not in analyze(both, 2)
    # a timeout the rank went on from is not where it waits: rank 0 caught it, both passed
    # a barrier, then rank 1 waits in a receive from rank 0 (called a deadlock, a review)
    moved_on = {
        0: doc(0, 2, [p2p("recv", 1, "failed", 1, 0),
                      {**entry("barrier", "world", 2, "completed", shape=None, dtype=None),
                       "t_start": 6.0, "t_end": 7.0}]),
        1: doc(1, 2, [{**entry("barrier", "world", 2, "completed", shape=None, dtype=None),
                       "t_start": 6.0, "t_end": 7.0},
                      {**p2p("recv", 1, "started", 0, 0), "t_start": 20.0}]),
    }  # fmt: skip
    verdict = analyze(moved_on, 2)
    assert "a deadlock" not in verdict and "rank 1 waits in recv #1" in verdict, verdict
    # nor a send that timed out before the other rank's receive began (a review)
    facing = {
        0: doc(0, 2, [p2p("send", 1, "failed", 1, 1)]),
        1: doc(1, 2, [{**p2p("recv", 1, "started", 0, 2), "t_start": 20.0}]),
    }
    assert "wait on each other" not in analyze(facing, 2)
    facing[1]["entries"][0]["t_start"] = 1.5  # (they did face each other)
    assert "wait on each other: their tags or sizes differ" in analyze(facing, 2)
    # a receive that failed otherwise (truncated) is no wait
    both[1]["entries"][0]["t_start"], both[1]["entries"][0]["t_end"] = 1.0, 2.0
    for d in both.values():
        d["entries"][0]["error"] = "recv #1 on world: MPI_ERR_TRUNCATE"
    assert "a deadlock" not in analyze(both, 2)
