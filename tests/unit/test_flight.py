"""The trace analyzer on recorded dumps (no MPI): the verdict names who waits where, who
never arrived and why, and the ranks without a file."""

import json

import pytest

from hpccomm.cli import main
from hpccomm.flight import analyze, load


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
    assert "rank 2 never did: it completed no call on that group, and it waits in all_reduce" in (
        verdict
    )


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
