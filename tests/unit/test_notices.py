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
    leaving.depart({"world": 7, "world/3@0": 2}, "its program ended: a normal exit or sys.exit")
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
