"""A collective that times out says where the group's other ranks are: each rank that times
out asks the others (NoticeBoard.ask), and a rank answers while it waits in a collective
with a timeout (of any group). Every scenario ends with the late rank joining, so the
stuck call completes on its worker and the group goes on."""

import re
import time

import numpy as np
import pytest

import hpccomm
from hpccomm.notices import ASK_WAIT

pytestmark = pytest.mark.mpi(min_size=2)
BOUND = 1.0  # the group's timeout in these tests


@pytest.fixture
def group(world):
    c = world.dup()
    c.timeout = BOUND
    yield c
    c.timeout = 60
    c.barrier()  # every rank past its scenario (the late call has completed)
    c.free()


def test_a_rank_busy_outside_hpccomm_gives_no_answer(group):
    p, r, last = group.size, group.rank, group.size - 1
    x = np.ones(3)
    group.all_reduce(x)
    if r == last:
        time.sleep(BOUND + ASK_WAIT + 1.0)  # past the others' timeout and their asking
        group.all_reduce(x)  # completes the others' call, still running on their workers
        return
    with pytest.raises(hpccomm.CommTimeoutError) as info:
        group.all_reduce(x)
    said = str(info.value)
    assert "all_reduce #2 on" in said and "where the other ranks are (asked at the timeout)" in said
    assert f"no answer within {ASK_WAIT:g} s from rank(s) [{last}] (not waiting in a " in said
    for other in range(p - 1):
        if other != r:
            assert f"rank {other}: waits in it too" in said, said


def test_a_rank_in_another_call_says_where_it_waits(group, world):
    r, last = group.rank, group.size - 1
    x, y = np.ones(3), np.ones(2)
    elsewhere = world.dup()  # (made on every rank: a collective step)
    elsewhere.timeout = BOUND + ASK_WAIT + 1.0
    try:
        if r == last:  # waits (bounded) in a collective the others join only later
            try:
                elsewhere.all_reduce(y)
            except hpccomm.CommTimeoutError:
                pass  # (or it completed while this rank asked: the others came)
            group.all_reduce(x)
            return
        with pytest.raises(hpccomm.CommTimeoutError) as info:
            group.all_reduce(x)
        said = str(info.value)
        assert f"rank(s) [{last}] have not reached it" in said, said
        assert f"rank {last}: last call of this group #0, waits in all_reduce #1 on " in said
        assert "no answer" not in said, said
        elsewhere.all_reduce(y)  # completes the last rank's call
    finally:
        elsewhere.timeout = 60
        elsewhere.barrier()
        elsewhere.free()


def test_a_call_completed_while_the_peers_were_asked_returns_its_result(group):
    # the late rank comes while the others ask (up to ASK_WAIT after their timeout): their
    # call has completed by then, and returns its result instead of raising
    p, r, last = group.size, group.rank, group.size - 1
    x = np.full(3, float(r))
    group.barrier()
    if r == last:
        time.sleep(BOUND + ASK_WAIT / 3)
    group.all_reduce(x)
    assert x.tolist() == [p * (p - 1) / 2] * 3


def test_a_call_the_late_rank_completes_slowly_while_asked_returns_its_result(group, monkeypatch):
    # as above, but the late rank's call takes 0.2 s once it came (a large array, say): it
    # answers "in it" at its first look, 20 ms in, which ended the others' asking, and
    # their call raised CommTimeoutError ("every rank is in it with the same arguments")
    # a moment before it completed; where every rank has reached the call, they wait on
    p, r, last = group.size, group.rank, group.size - 1
    x = np.full(3, float(r))
    group.barrier()
    if r == last:
        from hpccomm.ops import ALL_REDUCE

        bodies = group._backend._bodies  # (the MPI backend's op table)
        real = bodies[ALL_REDUCE]

        def slow(*args):
            time.sleep(0.2)
            return real(*args)

        monkeypatch.setitem(bodies, ALL_REDUCE, slow)
        time.sleep(BOUND + ASK_WAIT / 3)
    group.all_reduce(x)
    assert x.tolist() == [p * (p - 1) / 2] * 3


def test_an_earlier_answer_is_not_taken_for_a_later_one(group, world):
    # the last rank answers at the first timeout (waiting, bounded, in another group's
    # barrier), then is busy outside hpccomm at the second: the second said where it had
    # been at the first ("waits in barrier #1 ..."), not that it gave no answer
    r, last = group.rank, group.size - 1
    x = np.ones(3)
    elsewhere = world.dup()
    elsewhere.timeout = BOUND + ASK_WAIT + 1.0
    try:
        if r == last:
            try:
                elsewhere.all_reduce(np.ones(2))
            except hpccomm.CommTimeoutError:
                pass
            group.all_reduce(x)  # completes the others' first call
            time.sleep(BOUND + ASK_WAIT + 1.0)  # busy while their second times out
            group.all_reduce(x)
            return
        with pytest.raises(hpccomm.CommTimeoutError) as first:
            group.all_reduce(x)
        assert f"rank {last}: last call of this group #0, waits in all_reduce #1" in str(
            first.value
        )
        elsewhere.all_reduce(np.ones(2))
        with pytest.raises(hpccomm.CommTimeoutError) as second:
            group.all_reduce(x)
        said = str(second.value)
        assert f"no answer within {ASK_WAIT:g} s from rank(s) [{last}]" in said, said
        assert "waits in all_reduce #1" not in said, said
    finally:
        elsewhere.timeout = 60
        elsewhere.barrier()
        elsewhere.free()


@pytest.mark.parametrize("level", ["large", "off"])
def test_a_group_creation_completed_while_asked_returns_the_group(group, level):
    # the last rank comes to a split while the others ask (their timeout passed, in the
    # creation's check at the default level, in the creation itself with debug "off"): it
    # raised all the same, and the group's next call then timed out on the late rank
    p, r, last = group.size, group.rank, group.size - 1
    group.debug = level
    group.barrier()
    if r == last:
        time.sleep(BOUND + ASK_WAIT / 3)
    sub = group.split(0)
    try:
        x = np.ones(2)
        sub.all_reduce(x)
        assert (x == p).all()
    finally:
        sub.timeout = 60
        sub.free()
        group.debug = "large"


def test_polling_an_async_collective_past_the_timeout_raises_and_it_goes_on(group):
    # is_completed() only tested the operation: a program polling it while it computes
    # polled for ever past the group's timeout. Now it raises the CommTimeoutError wait()
    # raises there; the operation goes on (a later wait() completes it)
    r, last = group.rank, group.size - 1
    x = np.ones(3)
    if r == last:
        time.sleep(BOUND + ASK_WAIT + 1.0)  # past the others' timeout and their asking
        group.all_reduce(x)
        assert (x == group.size).all()
        return
    w = group.all_reduce(x, async_op=True)
    t0 = time.monotonic()
    with pytest.raises(hpccomm.CommTimeoutError) as info:
        while not w.is_completed():
            time.sleep(0.01)
            assert time.monotonic() - t0 < 30, "is_completed() polled past the timeout"
    assert time.monotonic() - t0 >= BOUND
    said = str(info.value)
    assert f"all_reduce #1 on {group.name} (rank {r} of {group.size}): not complete after " in said
    silent = re.search(rf"no answer within {ASK_WAIT:g} s from rank\(s\) \[([\d, ]+)\]", said)
    assert silent and str(last) in silent.group(1).split(", "), said  # (a poller may be too)
    assert w.exception() is None  # pending still: it goes on
    assert (w.wait(timeout=60) == group.size).all()
