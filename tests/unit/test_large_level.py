"""The default debug level "large": its threshold follows the eager limit MPI started with,
and init raises Open MPI's eager limit between ranks of a node (unless the user set it)."""

import os
import subprocess
import sys

import pytest

from hpccomm import debug
from hpccomm.errors import InvalidArgumentError
from hpccomm.runtime import SM_EAGER_LIMIT, tune_open_mpi


def test_default_level_is_large(monkeypatch):
    monkeypatch.delenv(debug.ENV, raising=False)
    assert debug.level_from(None, "init") == "large"
    monkeypatch.setenv(debug.ENV, "off")
    assert debug.level_from(None, "init") == "off"
    assert debug.level_from("LARGE", "init") == "large"
    with pytest.raises(InvalidArgumentError, match="off, large, check, detail"):
        debug.level_from("big", "init")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, 4096 - 1024),  # Open MPI's own default: MPI started before hpccomm.init
        ({"OMPI_MCA_btl_sm_eager_limit": "32768"}, 32768 - 1024),
        ({"OMPI_MCA_btl_vader_eager_limit": "8192"}, 8192 - 1024),  # the old name
        ({"OMPI_MCA_btl_sm_eager_limit": "0x1000"}, 4096 - 1024),
        ({"OMPI_MCA_btl_sm_eager_limit": "512"}, 0),  # below the headroom: check everything
        ({"OMPI_MCA_btl_sm_eager_limit": "lots"}, 4096 - 1024),  # Open MPI refuses it anyway
    ],
)
def test_threshold_follows_the_eager_limit(environ, expected):
    assert debug.large_bytes(environ) == expected


def test_tune_sets_the_eager_limit_and_keeps_the_users(monkeypatch):
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    env: dict[str, str] = {}
    tune_open_mpi(env)
    assert env == {"OMPI_MCA_op": "^avx", "OMPI_MCA_btl_sm_eager_limit": str(SM_EAGER_LIMIT)}
    env = {"OMPI_MCA_btl_vader_eager_limit": "8192", "OMPI_MCA_op": "^sve"}
    tune_open_mpi(env)
    assert env == {"OMPI_MCA_btl_vader_eager_limit": "8192", "OMPI_MCA_op": "^sve"}
    env = {"OMPI_MCA_btl_sm_max_send_size": "16384"}  # the limit may not exceed a fragment
    tune_open_mpi(env)
    assert env["OMPI_MCA_btl_sm_eager_limit"] == "16384"


def test_tune_does_nothing_once_mpi4py_loaded_mpi(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", object())
    env: dict[str, str] = {}
    tune_open_mpi(env)
    assert env == {}


def test_init_starts_mpi_with_the_raised_limit():
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for name in debug.EAGER_ENV + (debug.ENV,):
        env.pop(name, None)
    code = (
        "import os, hpccomm\n"
        "c = hpccomm.init()\n"
        "print(os.environ['OMPI_MCA_btl_sm_eager_limit'], c.debug, c._dispatcher.large)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(SM_EAGER_LIMIT), "large", str(SM_EAGER_LIMIT - 1024)]


def _printed_under_hash_seeds(code: str, seeds: int) -> set[str]:
    """What ``python -c code`` prints under PYTHONHASHSEED 0..seeds-1 (one entry each
    distinct output)."""
    return {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in range(seeds)
    }


def test_fingerprints_of_equal_sets_and_dicts_agree_across_processes():
    # split(expect={...}) is compared at the default level now: a set's order follows the
    # per-process string hash, so equal sets gave different CRCs on two ranks (a false
    # MismatchError that read "the ranks' calls differ: the ranks' calls differ")

    code = (
        "from hpccomm.debug import crc\n"
        "print(crc({'op': 'split', 'seq': 1, 'expect': {'tp', 'dp', 'pp', 'cp', 'ep', 'sp'}}))"
    )
    crcs = _printed_under_hash_seeds(code, 8)
    assert len(crcs) == 1, crcs
    from hpccomm.debug import crc, disagreement

    a = {"op": "split", "seq": 1, "expect": {"x": 1, "y": 2}}
    b = {"op": "split", "seq": 1, "expect": {"y": 2, "x": 1}}
    assert crc(a) == crc(b)
    other = {"op": "split", "seq": 1, "extra": 3}
    assert disagreement([{"op": "split", "seq": 1, "extra": 2}, other]) == (
        "extra is 2 on rank 0 but 3 on rank 1"
    )


def test_reap_from_two_threads_at_once():
    # Each thread read len(ORPHANS) and then popped: two could both read 1 and one popped
    # an empty deque (IndexError inside a user's call)
    import sys
    import threading

    from hpccomm import work

    class NotDone:
        def test(self):
            return False

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    work.ORPHANS.append((NotDone(), "x"))
    errors = []

    def loop():
        try:
            for _ in range(200000):
                work.reap()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
        work.ORPHANS.clear()
    assert errors == []


def test_reap_tests_a_bounded_number_of_dropped_operations():
    # every dropped operation was tested on every point-to-point call: 10,000 dropped sends
    # that never match made each call test 10,000 requests; now at most REAP_BATCH, in turn
    from hpccomm import work

    class Pending:
        def __init__(self, done):
            self.done, self.tests = done, 0

        def test(self):
            self.tests += 1
            return self.done

    import gc

    saved = list(work.ORPHANS)
    gc.collect()  # (an earlier test's dropped Work, collected during this one, joined the
    gc.disable()  # queue and took one of the batch's tests: 15 == 16 in a full run)
    work.ORPHANS.clear()
    try:
        stuck = [Pending(False) for _ in range(1000)]
        last = Pending(True)  # finished, behind all of them
        work.ORPHANS.extend((p, "send") for p in stuck + [last])
        work.reap()
        assert sum(p.tests for p in stuck) == work.REAP_BATCH
        rounds = 1
        while any(p is last for p, _ in work.ORPHANS):
            work.reap()
            rounds += 1
        assert rounds == -(-(len(stuck) + 1) // work.REAP_BATCH)  # reached in its turn
        assert last.tests == 1 and len(work.ORPHANS) == len(stuck)
        assert all(p.tests in (1, 2) for p in stuck)
    finally:
        gc.enable()
        work.ORPHANS.clear()
        work.ORPHANS.extend(saved)


def test_the_fold_of_uncompared_calls_agrees_across_processes():
    # the default level folds the calls it did not compare into a later comparison with a
    # hash of their sequence numbers and CRCs: it must not follow the per-process hash seed
    code = (
        "from types import SimpleNamespace as C\n"
        "from hpccomm.dispatch import Dispatcher\n"
        "print(Dispatcher._fold([(3, C(crc=2**32 - 5)), (4, C(crc=17)), (9, C(crc=0))]))"
    )
    folds = _printed_under_hash_seeds(code, 6)
    assert len(folds) == 1, folds
    assert 0 <= int(folds.pop()) < 2**31  # the upper half of a positive int64


def _fp(seq, **fields):
    return {"op": "all_reduce", "seq": seq, "dtype": "float32", "shape": (4,), **fields}


def test_the_first_uncompared_call_that_differs_is_named():
    same = [_fp(2), _fp(3)]
    assert debug.earlier_difference([{"earlier": same}, {"earlier": same}], 3072, 9) is None
    assert debug.earlier_difference([{}, {}], 3072, 9) is None
    said = debug.earlier_difference(
        [
            {"earlier": [_fp(2), _fp(3, shape=(5,)), _fp(4, dtype="int32")]},
            {"earlier": [_fp(2), _fp(3), _fp(4)]},
        ],
        3072,
        9,
    )
    assert said.startswith("all_reduce #3: shape is (5,) on rank 0 but (4,) on rank 1. "), said
    assert "(3,072 bytes or less in every buffer" in said
    assert "its result, and those of the calls after it up to #8, may be wrong" in said
    last = debug.earlier_difference(
        [{"earlier": [_fp(7, op="broadcast")]}, {"earlier": [_fp(7)]}], 3072, 8
    )
    assert last.startswith("broadcast #7: the call is 'broadcast' on rank 0 but 'all_reduce'")
    assert "so MPI ran it: its result may be wrong on some ranks" in last
    missing = debug.earlier_difference(
        [{"earlier": [_fp(2)]}, {"earlier": [_fp(2)]}, {"earlier": []}], 3072, 4
    )
    assert missing.startswith("all_reduce #2: compared when it ran on rank 2 (a buffer over"), (
        missing
    )


def test_a_difference_that_moved_other_messages_is_told_apart():
    """debug.earlier_left_messages: whether the first earlier call that differs may have
    left messages unreceived (the group is then unusable, see Dispatcher._differ)."""

    def left(*rows):
        return debug.earlier_left_messages([{"earlier": row} for row in rows])

    assert not left([_fp(2)], [_fp(2)])  # alike
    assert not left([_fp(2, **{"reduce op": "ReduceOp.SUM"})], [_fp(2)])
    assert not left([_fp(2, dtype="int32")], [_fp(2)])  # the same bytes
    assert not left([_fp(2, shape=(2, 2))], [_fp(2)])
    assert not left([_fp(2, dtype="float64", shape=(2,))], [_fp(2)])  # 16 bytes each
    assert left([_fp(2, dtype="float64")], [_fp(2)])  # 32 bytes against 16
    assert left([_fp(2, shape=(5,))], [_fp(2)])
    assert left([_fp(2, op="broadcast", src=0)], [_fp(2, op="broadcast", src=1)])  # roots
    assert left([_fp(2, op="broadcast")], [_fp(2)])  # another call
    assert left([_fp(2)], [])  # compared on one rank only
    assert left([_fp(2, dtype="no such")], [_fp(2)])  # bytes unknown: not trusted
    # any call that differs counts, not only the first (the one the error names)
    assert left([_fp(2, dtype="int32"), _fp(3, shape=(9,))], [_fp(2), _fp(3)])
    assert left([_fp(2, shape=(9,)), _fp(3, dtype="int32")], [_fp(2), _fp(3)])
    assert not left([_fp(2, dtype="int32"), _fp(3, shape=(2, 2))], [_fp(2), _fp(3)])


def test_the_first_call_no_comparison_took_at_the_end_is_named():
    """debug.exit_difference, the comparison at the program's end (runtime._depart): rows
    of (last call number, uncompared calls by number) per group rank."""
    calls = {2: _fp(2), 3: _fp(3)}
    assert debug.exit_difference([(3, calls), (3, dict(calls))], 3072) is None
    assert debug.exit_difference([(3, {}), (3, {})], 3072) is None
    said = debug.exit_difference(
        [
            (4, {2: _fp(2), 3: _fp(3, src=0, op="broadcast")}),
            (4, {2: _fp(2), 3: _fp(3, src=1, op="broadcast")}),
        ],
        3072,
    )
    assert said.startswith("broadcast #3: src is 0 on rank 0 but 1 on rank 1. "), said
    assert "(3,072 bytes or less in every buffer" in said
    assert "the program ended, or freed the group, first" in said
    # a call some rank passed without listing it (compared or refused there) is not judged
    assert (
        debug.exit_difference([(3, {3: _fp(3)}), (3, {3: _fp(3, shape=(5,))}), (3, {})], 3072)
        is None
    )
    # ... but a later one is
    later = debug.exit_difference(
        [
            (4, {3: _fp(3), 4: _fp(4)}),
            (4, {3: _fp(3, shape=(5,)), 4: _fp(4, dtype="int8")}),
            (4, {4: _fp(4)}),
        ],
        3072,
    )
    assert later.startswith(
        "all_reduce #4: dtype is 'float32' on ranks 0,2 but 'int8' on rank 1"
    ), later
    # a rank whose last call comes before a listed one never made it
    never = debug.exit_difference(
        [(5, {5: _fp(5, op="broadcast")}), (4, {}), (5, {5: _fp(5, op="broadcast")})], 3072
    )
    assert never.startswith(
        "broadcast #5: made on ranks [0, 2] but never on rank 1 (their last calls on the group: #4 on rank 1)"
    ), never
