"""Departure notices (NoticeBoard.depart / check) without MPI: a fake communicator."""

import pytest

from hpccomm.errors import PeerError
from hpccomm.notices import DEPARTURES, NoticeBoard


class Message:
    def __init__(self, payload):
        self.payload = payload

    def recv(self):
        return self.payload


class Request:
    def Test(self):
        return True


class FakeComm:
    """Two ranks' notice communicators in one process: what one sends, the other probes."""

    def __init__(self, rank, wire):
        self.rank, self.wire = rank, wire

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return 2

    def isend(self, msg, dest, tag):
        self.wire.setdefault(dest, []).append(msg)
        return Request()

    def improbe(self, source, tag):
        queue = self.wire.get(self.rank, [])
        return Message(queue.pop(0)) if queue else None


def test_a_departed_rank_fails_only_the_calls_it_never_reached():
    # A rank whose program ended (fewer steps than its peers) left them waiting out their
    # timeout (torch's default: 30 min). Its departure notice carries the last call number
    # it reached per group: a peer waiting in a later call hears at once; one waiting in a
    # call the departed rank did reach (its data on the way) is left alone.
    wire = {}
    leaving, staying = NoticeBoard(FakeComm(1, wire), -1), NoticeBoard(FakeComm(0, wire), -1)
    leaving.departed[0] = ({}, "gone")  # (the peer has left: depart does not wait for it)
    leaving.depart(
        {"world": 7, "world/3@0": 2}, "its program ended: a normal exit or sys.exit", print
    )
    assert wire[0][0][0] == DEPARTURES
    staying.check("world", 7, "all_reduce #7 on world (rank 0 of 2)", [0, 1])  # it came
    staying.check("world", 8, "all_reduce #8 on world (rank 0 of 2)", [0])  # not a member
    with pytest.raises(PeerError, match=r"^all_reduce #8 on world \(rank 0 of 2\): world "
                       r"rank 1 has left the job \(its program ended: a normal exit or sys.exit\) after "
                       r"call #7 of this group: it will not join this one"):  # fmt: skip
        staying.check("world", 8, "all_reduce #8 on world (rank 0 of 2)", [0, 1])
    # a group the leaving rank does not list (its id differs there, e.g. a node group made
    # at a different point): not judged; it was failed as "after call #0"
    staying.check("world/5@0", 1, "barrier #1 on world/dup (rank 0 of 2)", [0, 1])


def test_a_point_to_point_refusal_reaches_the_ranks_it_names_and_is_kept_per_group():
    # A refused send tells its receiver (world rank 1 here), which keeps the latest
    # P2P_REFUSALS_KEPT per group for its own call's timeout; the refusing rank does not
    # tell itself; a refusal never raises at the receiver (no check() ends a call for it);
    # a retry that was posted clears the refusals it repeats (they explain nothing now).
    from hpccomm.notices import P2P_REFUSALS_KEPT, P2pRefusal
    from hpccomm.ops import Counterpart

    def send(k, tag=0):
        return Counterpart(1, f"a send #{k}", "send", tag, False)

    wire = {}
    refusing, told = NoticeBoard(FakeComm(0, wire), -1), NoticeBoard(FakeComm(1, wire), -1)
    for k in range(P2P_REFUSALS_KEPT + 3):
        refusing.refuse_p2p("world", 0, [(1, send(k)), (0, send(-1))], "DtypeError: x")
    refusing.refuse_p2p("world", 0, [(1, send("t", tag=object()))], "TypeError: tag")
    assert len(wire[1]) == P2P_REFUSALS_KEPT + 4 and 0 not in wire
    told.poll(force=True)
    kept = list(told.p2p_refusals["world"])
    assert len(kept) == P2P_REFUSALS_KEPT
    last = P2pRefusal(0, 0, f"a send #{P2P_REFUSALS_KEPT + 2}", "send", 0, False,
                      "DtypeError: x", kept[-2].wall)  # fmt: skip
    assert kept[-2] == last and kept[0].what == "a send #4" and kept[0].wall > 0
    assert kept[-1].tag is None  # a tag that is no integer: any tag
    told.check("world", 1, "all_reduce #1 on world (rank 1 of 2)", [0, 1])  # not a failure
    refusing.clear_p2p("world", [(1, send("retry"))])  # tag 0 sends: cleared, not the other
    told.poll(force=True)
    assert [r.what for r in told.p2p_refusals["world"]] == ["a send #t"]


def test_the_counterparts_of_a_point_to_point_call():
    # The ranks a refused call would have sent to or received from, and what with each:
    # wildcards, this rank and values that are no rank of the group are left out; a
    # refusal matches a call of this rank's only the other way round, of the same kind
    # (arrays or objects), with tags that agree.
    from hpccomm.ops import Counterpart, Group, P2POp, matches, p2p_counterparts

    g = Group("world/tp", 1, 4)
    g.world_ranks = [4, 5, 6, 7]
    assert p2p_counterparts(g, "send", None, 2, None, 0) == [
        Counterpart(
            2,
            "a send from rank 1 (world rank 5) to rank 2 (world rank 6) (tag 0)",
            "send",
            0,
            False,
        )  # fmt: skip
    ]
    assert p2p_counterparts(g, "recv_object", None, 0, None, None) == [
        Counterpart(
            0,
            "a recv_object by rank 1 (world rank 5) from rank 0 (world rank 4) (any tag)",
            "recv",
            None,
            True,
        )  # fmt: skip
    ]
    assert p2p_counterparts(g, "recv", None, None, None, 3) == []  # any source
    assert p2p_counterparts(g, "send", None, 1, None, 0) == []  # itself
    assert p2p_counterparts(g, "send", None, 9, None, 0) == []  # no such rank
    assert p2p_counterparts(g, "send", None, True, None, 0) == []  # not an int
    both = p2p_counterparts(g, "sendrecv", None, 3, 0, 5)
    assert [(c.rank, c.way) for c in both] == [(3, "send"), (0, "recv")]
    ops = [P2POp("send", None, 3, tag=1), P2POp("recv", None, 7), "junk", P2POp("irecv", None, 0)]
    got = p2p_counterparts(g, "batch_isend_irecv", ops, None, None, None)
    assert [(c.rank, c.what, c.way, c.tag) for c in got] == [
        (3, "ops[0] of a batch of rank 1 (world rank 5): send to rank 3 (world rank 7) (tag 1)",
         "send", 1),
        (0, "ops[3] of a batch of rank 1 (world rank 5): recv from rank 0 (world rank 4) (tag 0)",
         "recv", 0),
    ]  # fmt: skip
    send = Counterpart(1, "", "send", 2, False)
    assert matches(send, Counterpart(0, "", "recv", 2, False))
    assert matches(send, Counterpart(0, "", "recv", None, False))  # any tag
    assert not matches(send, Counterpart(0, "", "send", 2, False))  # the same way
    assert not matches(send, Counterpart(0, "", "recv", 3, False))  # another tag
    assert not matches(send, Counterpart(0, "", "recv", 2, True))  # objects vs arrays


def test_a_question_asked_a_moment_ago_is_not_asked_again():
    # torch's watchdog fails a group's Works that expire together one after another; each
    # asked anew and waited up to ASK_WAIT for a rank that does not answer. A question to
    # the same ranks of the group that ended less than ASK_REUSE ago is answered from it.
    import time

    from hpccomm.notices import ASK_REUSE, WHERE

    wire = {}
    asking = NoticeBoard(FakeComm(0, wire), -1)
    since, said = asking.ask("world", [0, 1], wait=0.05)
    assert said == {} and [m[0] for m in wire[1]] == [WHERE]
    t = time.monotonic()
    again, said = asking.ask("world", [0, 1], wait=1.0)
    assert again == since and said == {} and len(wire[1]) == 1  # not asked: no wait either
    assert time.monotonic() - t < 0.5
    asking.ask("world/2@0", [0, 1], wait=0.05)  # another group: asked
    assert len(wire[1]) == 2
    time.sleep(ASK_REUSE)
    later, _ = asking.ask("world", [0, 1], wait=0.05)  # too long ago: asked again
    assert later > since and len(wire[1]) == 3


def test_asking_waits_on_for_a_call_every_peer_has_reached():
    # A rank that arrives while the others ask answers at its first look (20 ms into its
    # call): that ended their asking and their call raised a moment before it completed.
    # Where every answer shows the call reached, the asking waits on for it to complete.
    import time

    wire = {}
    answering = NoticeBoard(FakeComm(1, wire), -1)
    answering.locate = lambda gid: (3, "all_reduce #3 on world (rank 1 of 2)", None)

    class Asking(FakeComm):
        def isend(self, msg, dest, tag):
            req = super().isend(msg, dest, tag)
            if dest == 1:
                answering.poll(force=True)  # rank 1 answers at once
            return req

    asking = NoticeBoard(Asking(0, wire), -1)
    for gid, reached, completes_at in [("world", True, 0.3), ("world/2@0", False, 0.3),
                                       ("world/3@0", True, None)]:  # fmt: skip
        t0 = time.monotonic()
        stop = None
        if completes_at is not None:
            stop = lambda t0=t0, at=completes_at: time.monotonic() - t0 > at  # noqa: E731
        since, said = asking.ask(
            gid, [0, 1], wait=5.0, stop=stop, reached=lambda place, r=reached: r
        )
        took = time.monotonic() - t0
        assert said[1][1].seq == 3
        if reached and completes_at is not None:
            assert completes_at <= took < 4, took  # waited on until it completed
            assert gid not in asking._asked  # (no story for another call's timeout)
        else:  # another call (or nothing to wait for): the answers end the asking
            assert took < 0.25, took
            assert gid in asking._asked  # (kept for calls timing out with it)


def test_a_peer_found_in_the_call_late_in_the_asking_gets_time_to_complete_it():
    # rank 1 came to the call 0.3 s before the end of rank 0's asking (a 1 s timeout in a
    # fresh-clone CI run, on a loaded machine): the asking ended at its own bound, the call
    # completed a moment later, and rank 0 had raised its timeout while rank 1 went on with
    # the group the call made. The asking now waits ``wait`` from when every peer was found
    # in the call.
    import threading
    import time

    wire = {}
    answering = NoticeBoard(FakeComm(1, wire), -1)
    answering.locate = lambda gid: (3, "split #3 on world (rank 1 of 2)", None)
    asking = NoticeBoard(FakeComm(0, wire), -1)
    t0 = time.monotonic()
    threading.Timer(0.35, answering.poll, kwargs={"force": True}).start()  # rank 1 arrives
    since, said = asking.ask(
        "world",
        [0, 1],
        wait=0.5,
        stop=lambda: time.monotonic() - t0 > 0.7,  # the call completes 0.35 s after it came
        reached=lambda place: True,
    )
    took = time.monotonic() - t0
    assert said[1][1].seq == 3
    assert 0.7 <= took < 0.85 + 0.5, took  # waited for it (the asking's own 0.5 s ended)
    assert "world" not in asking._asked  # it completed: no story for another call


def test_a_peer_has_reached_a_call_in_it_with_the_same_arguments_or_past_it():
    from hpccomm.debug import crc, fingerprint
    from hpccomm.dispatch import _reached
    from hpccomm.notices import LEAVING, Place

    mine = fingerprint(None, "all_reduce", 3)
    other = dict(mine, dtype="float32")
    here = "all_reduce #3 on world (rank 1 of 2)"
    c = crc(mine)
    assert _reached(3, "all_reduce", c, Place(3, here, "", (3, mine)))
    assert _reached(3, "all_reduce", c, Place(3, "", "", (3, mine)))  # completed it
    assert _reached(3, "all_reduce", c, Place(4, "", "", None))  # past it
    assert _reached(3, "all_reduce", None, Place(3, here, "", (3, other)))  # mine unknown
    assert not _reached(3, "all_reduce", c, Place(3, here, "", (3, other)))  # differs
    assert not _reached(3, "all_reduce", c, Place(2, "", "", None))  # not yet
    assert not _reached(3, "all_reduce", c, Place(None, "", "", None))  # no such group
    assert not _reached(3, "all_reduce", c, Place(3, "barrier #3 on world (...)", "", None))
    barrier = fingerprint(None, "barrier", 3)
    assert not _reached(3, "all_reduce", None, Place(3, "", "", (3, barrier)))  # ran another
    assert not _reached(3, "all_reduce", None, Place(3, "", "", None))  # ran what?
    # its worker still on an earlier call, #3 (and #4) queued behind it; exiting with a
    # call stuck (it aborts the job: the asking rank must raise, not wait on)
    assert not _reached(3, "all_reduce", c, Place(4, "all_reduce #2 on world (...)", "", None))
    assert not _reached(3, "all_reduce", c, Place(3, here, LEAVING, (3, mine)))


def test_a_rank_past_a_call_it_did_not_refuse_answers_a_refusal_of_it():
    # A root refused a small reduce whose sender went on (its message went out eagerly);
    # the root's next call waited its whole timeout (torch's default: 30 min) to hear that
    # the sender refused it too. The sender, past the call, now answers ENTERED at once;
    # it never answers for a call it refused too, one it is still in, a group it does not
    # have, or a refusal older than the ones it remembers (no false "entered").
    from hpccomm.notices import ENTERED, REFUSALS_KEPT

    wire = {}
    root, sender = NoticeBoard(FakeComm(0, wire), -1), NoticeBoard(FakeComm(1, wire), -1)
    progress = {"world": (1, 3)}  # the sender's group rank and last call number
    sender.progress = progress.get
    root.post("world", 2, "reduce", 0, [0, 1], "InvalidArgumentError: read-only", "refused")
    sender.poll(force=True)
    assert wire[0] == [("world", 2, "reduce", 1, 1, "went past reduce #2", ENTERED)]
    root.poll(force=True)
    assert root.refused_by("world", 2, [1], 0.0) == ([1], [])
    for seq in (3, 4):  # the call it is in, and one it has not reached: no answer
        root.post("world", seq, "reduce", 0, [0, 1], "x", "refused")
    root.post("other", 1, "reduce", 0, [0, 1], "x", "refused")  # a group it does not have
    sender.post("world", 1, "barrier", 1, [0, 1], "y", "refused")  # one it refused itself
    root.post("world", 1, "barrier", 0, [0, 1], "y", "refused")
    wire[0].clear()
    sender.poll(force=True)
    assert wire[0] == [], wire[0]  # (its own refusal of #1 went out before, as posted)
    # its own refusals are remembered per group up to REFUSALS_KEPT: older ones are not
    # known, so a late notice of one of them gets no answer (it could be a false "entered")
    wire.clear()
    for seq in range(10, 10 + REFUSALS_KEPT + 5):
        sender.post("world", seq, "all_reduce", 1, [0, 1], "z", "refused")
    progress["world"] = (1, 10**6)
    wire.clear()
    for seq in (10, 14, 12 + REFUSALS_KEPT):
        root.post("world", seq, "all_reduce", 0, [0, 1], "z", "refused")
    sender.poll(force=True)
    assert wire.get(0) is None, wire.get(0)


def test_a_leaving_rank_waits_for_every_other_departure_and_says_for_whom(monkeypatch):
    # A rank left at once after its departure notices: the notices of a rank leaving later
    # then reached a rank that had finalized MPI, which ended the job (status 14 on two
    # Slurm nodes, an outside hunt). depart now returns only once every other rank has
    # said it leaves too, saying on stderr (here: say) for whom it waits after a while.
    import threading
    import time

    import hpccomm.notices as notices_mod

    monkeypatch.setattr(notices_mod, "EXIT_SAY_AFTER", 0.05)
    wire = {}
    leaving, later = NoticeBoard(FakeComm(1, wire), -1), NoticeBoard(FakeComm(0, wire), -1)
    said = []
    done = threading.Event()

    def leave():
        leaving.depart({"world": 3}, "its program ended: a normal exit or sys.exit", said.append)
        done.set()

    t = threading.Thread(target=leave)
    t.start()
    time.sleep(0.3)
    assert not done.is_set() and said, said  # waits for rank 0, and says so
    assert "waits 0 s so far for world rank(s) [0] to end their programs too" in said[0], said
    later.departed[1] = ({}, "gone")
    later.depart({"world": 3}, "its program ended: a normal exit or sys.exit", said.append)
    t.join(5)
    assert done.is_set()


def test_a_departure_carries_the_uncompared_calls_and_freed_groups_keep_a_bounded_number():
    # The calls no comparison took on a rank's groups (runtime._depart compares them once
    # every rank has left) travel with its departure notice; a freed group's are kept until
    # then, for the latest FREED_UNCHECKED_KEPT freed groups that had any.
    from hpccomm.notices import FREED_UNCHECKED_KEPT

    wire = {}
    leaving, staying = NoticeBoard(FakeComm(1, wire), -1), NoticeBoard(FakeComm(0, wire), -1)
    calls = {3: {"op": "broadcast", "seq": 3, "src": 1}}
    for k in range(FREED_UNCHECKED_KEPT + 5):
        leaving.forget_group(f"g{k}", 3, (), (f"world/split({k})", (0, 1), dict(calls)))
    leaving.forget_group("none", 2, (), None)  # no uncompared calls: nothing kept
    kept = leaving.freed_unchecked
    assert len(kept) == FREED_UNCHECKED_KEPT and "none" not in kept
    assert next(iter(kept)) == "g5" and kept["g5"][2] == calls  # the oldest were dropped
    leaving.departed[0] = ({}, "gone")
    leaving.depart(
        {"world": 3}, "its program ended", print, unchecked={"world": ("world", (0, 1), calls)}
    )
    staying.poll(force=True)
    assert staying.departed[1] == ({"world": 3}, "its program ended")
    assert staying.unchecked_of[1] == {"world": ("world", (0, 1), calls)}
