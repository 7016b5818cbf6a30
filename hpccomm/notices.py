"""Failure notices: a rank whose collective fails tells the group's other ranks, so that their
bounded waits end promptly with a PeerError naming it and its reason instead of a bare
timeout (or, without a timeout, a hang).

One MPI communicator for the whole job (a duplicate of COMM_WORLD made by ``init``) carries
the notices as small pickled messages; nothing is sent or received unless a call fails or a
rank waits with a time bound (then it looks for notices every 20 ms). A notice names the
group (an id every member computes alike), the call's sequence number, the op, the failing
rank and the error; a waiting rank acts only on a notice for the very call it waits in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .errors import PeerError

__all__ = ["NoticeBoard", "NOTICE_TAG", "POLL_INTERVAL"]

NOTICE_TAG = 7
POLL_INTERVAL = 0.02  # seconds between looks for notices while a rank waits


class NoticeBoard:
    """The job's failure notices, on one communicator (mpi4py's object API: isend, iprobe,
    recv). ``any_source`` is MPI.ANY_SOURCE (passed in: this module does not import MPI)."""

    def __init__(self, comm: Any, any_source: int) -> None:
        self.comm = comm
        self.world_rank = comm.Get_rank()
        self.any_source = any_source
        self.received: dict[str, list[tuple[int, str, int, int, str]]] = {}
        self._sent: list[Any] = []
        self._last = 0.0

    def post(
        self,
        gid: str,
        seq: int,
        op: str,
        group_rank: int,
        members: Sequence[int],
        reason: str,
    ) -> None:
        """Tell every other member (world ranks) that ``op #seq`` failed here."""
        msg = (gid, seq, op, group_rank, self.world_rank, reason)
        for w in members:
            if w != self.world_rank:
                self._sent.append(self.comm.isend(msg, dest=w, tag=NOTICE_TAG))
        self._sent = [r for r in self._sent if not r.Test()]

    def poll(self, force: bool = False) -> None:
        """Receive the notices that arrived (at most every POLL_INTERVAL unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._last < POLL_INTERVAL:
            return
        self._last = now
        while self.comm.iprobe(source=self.any_source, tag=NOTICE_TAG):
            gid, seq, op, group_rank, world_rank, reason = self.comm.recv(
                source=self.any_source, tag=NOTICE_TAG
            )
            self.received.setdefault(gid, []).append((seq, op, group_rank, world_rank, reason))

    def check(self, gid: str, seq: int, where: str) -> None:
        """Raise PeerError if a member reported failing call ``seq`` of group ``gid``."""
        self.poll()
        for nseq, op, group_rank, world_rank, reason in self.received.get(gid, ()):
            if nseq == seq:
                raise PeerError(
                    f"{where}: rank {group_rank} (world rank {world_rank}) failed {op} #{nseq} "
                    f"and will not join it: {reason}"
                )

    def watch(self, gid: str, seq: int, where: Callable[[], str]) -> Callable[[], None]:
        """A callable for bounded waits: raises PeerError once a notice for this call came."""

        def check() -> None:
            self.check(gid, seq, where())

        return check

    def close(self) -> None:
        """Drop what is still unsent (at exit: the receivers may be gone)."""
        for req in self._sent:
            try:
                req.Cancel()
            except Exception:  # already complete or the library is shutting down
                pass
        self._sent.clear()
