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

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from .errors import CommTimeoutError, PeerError
from .work import p2p_waiting, wait_bounded

__all__ = ["NoticeBoard", "NOTICE_TAG", "POLL_INTERVAL", "FAILED", "REFUSED", "ENTERED", "BROKE",
           "DEPARTURES", "ASK_WAIT", "ASK_MAX_RANKS", "Place", "P2pRefusal",
           "P2P_REFUSALS_KEPT", "Unchecked"]  # fmt: skip

NOTICE_TAG = 7
FAILED, REFUSED, ENTERED = "failed", "refused", "entered"  # what a notice says (see post)
# a failure inside MPI that made the group unusable on the failing rank: it joins no later
# call, which a peer that went past the failed call hears at its next bounded wait (check)
BROKE = "broke"
MONITOR_TAG = 8  # monitored_barrier's arrivals and releases
# Freed groups whose last call number a departure notice lists: the latest ones only (every
# freed group was kept: 20,000 groups made one 2-rank exit take 3.9-6.4 s instead of 0.1 s).
# A peer still waiting in a group freed longer ago hears of the departure at its timeout.
FREED_KEPT = 1024
# freed groups whose uncompared calls are kept for the departure notice (the latest; a
# group dropped from it is not judged at the end: see runtime._depart)
FREED_UNCHECKED_KEPT = 64  # (at most 64 calls each: a bounded notice)
# a group's name, members (world ranks) and uncompared calls' fingerprints by number
Unchecked = tuple[str, tuple[int, ...], dict[int, dict[str, Any]]]
REFUSALS_KEPT = 1024  # per group: this rank's own refusals remembered (see _answer_refusal)
POLL_INTERVAL = 0.02  # seconds between looks for notices while a rank waits
DEPARTURES = "<departures>"  # the group id of a departure notice (see depart)
DEPART_WAIT = 1.0  # seconds a leaving rank waits for its departure notices to go out
# a rank at exit waiting for the others' departures (see depart) says so after this many
# seconds, then every EXIT_SAY_EVERY
EXIT_SAY_AFTER = 30.0
EXIT_SAY_EVERY = 600.0
# At a collective's timeout the rank asks the group's other ranks where they are (ask): the
# group ids of the question and of an answer, how long it waits for answers, and the
# largest group it asks (one message to every member and back)
WHERE, HERE = "<where>", "<here>"
# what a rank that exits with a call stuck answers as the wait it is in (see runtime's exit):
# its call will not complete, so a peer asking does not wait on for it
LEAVING = "its exit (its program ended with this call stuck: it aborts the job)"
ASK_WAIT = 1.0
ASK_MAX_RANKS = 64
# A question answered (or waited for) less than this long ago is not asked again for the
# same group: its answers are given (torch's watchdog fails the Works of a group that
# expire together one after the other, and each asked anew: up to ASK_WAIT apiece)
ASK_REUSE = 0.5
WAITING_FRESH = 0.5  # seconds after its last look a bounded wait counts as current
# A point-to-point call refused on one rank (bad arguments: nothing was posted) tells the
# ranks it names (refuse_p2p), so that their side of it, past its timeout, says why the
# message never came; the latest few per group are kept
P2P_REFUSED, P2P_CLEARED = "<p2p-refused>", "<p2p-cleared>"
P2P_REFUSALS_KEPT = 16
# A rank that frees a group (of up to ASK_MAX_RANKS ranks) tells the other members the
# number of its last call there, so that a member waiting (bounded) in a later call of the
# group hears at once that this rank will not join it (the latest FREED_KEPT groups kept)
FREED = "<freed>"
# a failure notice's reason ends with "[its call: ...]", the failing rank's call
# (Dispatcher._post), which the peers' PeerError puts this rank's call beside (check)
ITS_CALL = "its call: "


def _beside(reason: str, mine: Callable[[], str | None] | None, label: str, wrong: str = "") -> str:
    """Where a failure notice's ``reason`` ends with the failing rank's call ("[its call:
    ...]"), this rank's (``mine()``; nothing where None) beside it: ``; {label}: the same
    (...)`` or ``; {label} differs: ...{wrong}``; else ""."""
    if mine is None or not reason.endswith("]") or f"[{ITS_CALL}" not in reason:
        return ""
    own = mine()
    if own is None:
        return ""
    theirs = reason.rpartition(f"[{ITS_CALL}")[2][:-1]
    return f"; {label}: the same ({own})" if own == theirs else f"; {label} differs: {own}{wrong}"


class Place(NamedTuple):
    """What a rank says of itself on a group when a peer that timed out asks (ask)."""

    seq: int | None  # the number of its last collective call there (None: no such group)
    running: str  # what the group's worker runs now ("" for nothing)
    waiting: str  # the bounded wait it is in, of any group ("" for none)
    call: tuple[int, dict[str, Any]] | None  # its latest bounded or async collective there:
    # (number, fingerprint), compared with the asker's where the numbers agree


class P2pRefusal(NamedTuple):
    """A peer's point-to-point call refused there (see NoticeBoard.refuse_p2p)."""

    world_rank: int
    group_rank: int
    what: str  # what it would have done with this rank: "a send to rank 1 (tag 0)"
    way: str  # "send" or "recv": what it would have done with this rank
    tag: int | None  # its tag (None: any tag, or a tag that was no integer)
    objects: bool  # send_object / recv_object
    reason: str  # its error
    wall: float  # time.time() there when it was refused


def _ranks(ranks: Sequence[int], members: Sequence[int]) -> str:
    """Ranks of a group as messages name them: ``"rank(s) [1]"``, with their world ranks
    where those differ (``"rank(s) [1] (world rank(s) [3])"``; ``members``: world ranks)."""
    world = [members[g] for g in ranks]
    return f"rank(s) {list(ranks)}" + ("" if world == list(ranks) else f" (world rank(s) {world})")


class NoticeBoard:
    """The job's failure notices, on one communicator (mpi4py's object API: isend, iprobe,
    recv). ``any_source`` is MPI.ANY_SOURCE, ``failures`` the error classes of a process
    failure (MPI_ERR_PROC_FAILED, _PENDING; passed in: this module does not import MPI)."""

    def __init__(self, comm: Any, any_source: int, failures: tuple[int, ...] = ()) -> None:
        self.comm = comm
        self.world_rank = comm.Get_rank()
        self.any_source = any_source
        self.failures = failures
        # the first process failure a poll acknowledged (ULFM): it ends a departure's wait
        self.failure: BaseException | None = None
        # per group id: (seq, op, group rank, world rank, reason, kind: see post)
        self.received: dict[str, list[tuple[int, str, int, int, str, str]]] = {}
        # (group id, call number) of the peers' failures this rank was told of while in the
        # call (check): such a call is not said again at the next call (a BROKE notice)
        self._told: set[tuple[str, int]] = set()
        self._sent: list[Any] = []
        self.announced = False  # this rank's departure went out (see depart)
        # (threads send at once: a failure notice, an answer from another thread's poll)
        self._sent_lock = threading.Lock()
        self._monitor: dict[int, list[tuple]] = {}  # monitor messages that came early
        self._monitor_lock = threading.Lock()  # (threads in monitored barriers at once)
        self._last = 0.0
        # world rank -> (its last call number per group id, why it left): see depart
        self.departed: dict[int, tuple[dict[str, int], str]] = {}
        # group id -> its last call number, at free() (the latest FREED_KEPT groups)
        self.freed_seqs: dict[str, int] = {}
        # group id -> (its name, members, the fingerprints of its calls no comparison took,
        # by number) at free(), for the departure notice (the latest FREED_UNCHECKED_KEPT)
        self.freed_unchecked: dict[str, Unchecked] = {}
        # world rank -> the same of every group it had, from its departure notice
        self.unchecked_of: dict[int, dict[str, Unchecked]] = {}
        # where this rank is on a group, for the answers to ask(): group id -> (the number
        # of its last collective call, what the group's worker runs now or "", its latest
        # bounded or async collective as (number, fingerprint) or None), None for a group
        # this rank does not have (set by init: it walks the job's groups)
        self.locate: Callable[[str], tuple[int, str, Any] | None] | None = None
        # (group rank, number of the last collective call) of this rank on a group id, or
        # None: set by init (see _answer_refusal)
        self.progress: Callable[[str], tuple[int, int] | None] | None = None
        # this rank's own refusals per group id (its latest REFUSALS_KEPT call numbers) and
        # the highest number dropped from them: no answer at or below it (see
        # _answer_refusal); a lock, as several threads post and poll
        self._refused_here: dict[str, tuple[set[int], int]] = {}
        self._refused_lock = threading.Lock()
        # the bounded wait this rank is in (any group): (where, when it last looked)
        self._waiting: tuple[str, float] = ("", 0.0)
        self.leaving = False  # exiting with a call stuck: answers say so (LEAVING)
        # group id -> world rank -> what that rank said of itself on the group (ask):
        # (time.monotonic() when heard, its Place, whether it was asking: timed out itself)
        self.heard: dict[str, dict[int, tuple[float, Place, bool]]] = {}
        # group id -> world rank -> its latest question there (time.monotonic() when heard,
        # its Place): kept apart from ``heard``, where its answers to this rank's own
        # question replace it (a member that timed out first and left for its exit)
        self.questions: dict[str, dict[int, tuple[float, Place]]] = {}
        self.last_question = 0.0  # time.monotonic() of the latest question heard
        # group id -> the latest question this rank asked there: (when its wait ended,
        # when it was asked, the world ranks asked), time.monotonic()
        self._asked: dict[str, tuple[float, float, frozenset[int]]] = {}
        # group id -> world rank -> the last call number there of a member that freed it
        self.freed_by: dict[str, dict[int, int]] = {}
        # group id -> the latest point-to-point refusals peers told this rank of
        self.p2p_refusals: dict[str, deque[P2pRefusal]] = {}

    def post(
        self,
        gid: str,
        seq: int,
        op: str,
        group_rank: int,
        members: Sequence[int],
        reason: str,
        kind: str = FAILED,
    ) -> None:
        """Tell every other member (world ranks) about ``op #seq`` here: it failed inside
        (FAILED; BROKE where that made the group unusable here), was refused before any MPI
        call, so this rank's part of it was never posted (REFUSED), or, waiting inside it,
        this rank heard of a peer's refusal (ENTERED: the refusing rank learns that this one
        took part, see Dispatcher.settle)."""
        msg = (gid, seq, op, group_rank, self.world_rank, reason, kind)
        if kind == REFUSED:
            with self._refused_lock:
                mine, floor = self._refused_here.get(gid, (set(), 0))
                mine.add(seq)
                if len(mine) > REFUSALS_KEPT:
                    oldest = min(mine)
                    mine.discard(oldest)
                    floor = max(floor, oldest)
                self._refused_here[gid] = (mine, floor)
        for w in members:
            if w != self.world_rank:
                self._send(msg, w)
        self._drop_sent()

    def _send(self, msg: Any, dest: int, tag: int = NOTICE_TAG) -> None:
        """Send ``msg`` (kept until MPI has sent it: the request holds the pickled bytes)."""
        req = self.comm.isend(msg, dest=dest, tag=tag)
        with self._sent_lock:
            self._sent.append(req)

    def _drop_sent(self) -> None:
        """Let go of the notices MPI has sent (the rest are cancelled at close)."""
        with self._sent_lock:
            self._sent = [r for r in self._sent if not self._sent_yet(r)]

    def _sent_yet(self, req: Any) -> bool:
        """Whether MPI is done with a notice's send (one to a failed rank is, under ULFM:
        its error is no error of the call this rank is making)."""
        try:
            return bool(req.Test())
        except Exception as exc:
            if self._failure(exc):
                return True
            raise

    def _failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is MPI's word of a failed process (ULFM)."""
        get = getattr(exc, "Get_error_class", None)
        return get is not None and get() in self.failures

    def poll(self, force: bool = False) -> None:
        """Receive the notices that arrived (at most every POLL_INTERVAL unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._last < POLL_INTERVAL:
            return
        self._last = now
        acks = 0
        while True:  # matched probes: another thread polling cannot take the message
            try:
                msg = self.comm.improbe(source=self.any_source, tag=NOTICE_TAG)
            except Exception as exc:
                # under ULFM a receive from any rank fails once a rank of the job has
                # failed, until the failure is acknowledged; it escaped into the call this
                # rank was waiting in, whose group (without the failed rank) was revoked:
                # survivors could not go on on their own groups (an outside hunt)
                if not self._failure(exc):
                    raise
                if self.failure is None:
                    self.failure = exc
                if acks == 3:  # (failures keep coming: the next poll looks again)
                    return
                acks += 1
                try:
                    self.comm.Ack_failed()
                except Exception:  # noqa: BLE001 - an MPI without the call: no notices
                    return
                continue
            if msg is None:
                return
            gid, *rest = msg.recv()
            if gid in (WHERE, HERE):
                self._heard(gid, *rest)
                continue
            if gid == DEPARTURES:
                world_rank, seqs, reason, unchecked = rest
                self.departed[world_rank] = (seqs, reason)
                self.unchecked_of[world_rank] = unchecked
                continue
            if gid == FREED:
                group_id, world_rank, seq = rest
                by = self.freed_by.pop(group_id, {})  # (latest last: dropped last)
                by[world_rank] = seq
                self.freed_by[group_id] = by
                while len(self.freed_by) > FREED_KEPT:
                    del self.freed_by[next(iter(self.freed_by))]
                continue
            if gid == P2P_REFUSED:
                group_id, *refusal = rest
                kept = self.p2p_refusals.setdefault(group_id, deque(maxlen=P2P_REFUSALS_KEPT))
                kept.append(P2pRefusal(*refusal))
                continue
            if gid == P2P_CLEARED:  # the refusing rank made that call since: stale
                group_id, world_rank, way, tag, objects = rest
                held = self.p2p_refusals.get(group_id)
                if held:
                    stale = [
                        r for r in held if r.world_rank == world_rank
                        and (r.way, r.tag, r.objects) == (way, tag, objects)
                    ]  # fmt: skip
                    for r in stale:
                        held.remove(r)
                continue
            self.received.setdefault(gid, []).append(tuple(rest))
            if rest[-1] == REFUSED:
                self._answer_refusal(gid, *rest)

    def _answer_refusal(
        self, gid: str, seq: int, op: str, group_rank: int, world_rank: int, *_: Any
    ) -> None:
        """A peer refused call ``seq`` of group ``gid``, and its next call there waits to
        hear whether every other rank refused it too (Dispatcher.settle). This rank has
        gone past that call without refusing it (a rooted call's sender, whose message went
        out eagerly): it says so (ENTERED) at once, where the refusing rank waited until its
        timeout for a word that never came (an outside hunt: torch's default, 30 minutes)."""
        if self.progress is None:
            return
        with self._refused_lock:
            mine, floor = self._refused_here.get(gid, (set(), 0))
            if seq in mine or seq <= floor:  # (below the floor: not known, no answer)
                return
        try:
            here = self.progress(gid)
        except Exception:  # noqa: BLE001 - an answer must not fail the poll
            return
        if here is None or here[1] <= seq:  # (in the call itself: it says so when told)
            return
        msg = (gid, seq, op, here[0], self.world_rank, f"went past {op} #{seq}", ENTERED)
        self._send(msg, world_rank)

    def _position(self, gid: str) -> Place:
        """Where this rank is on group ``gid`` (a Place)."""
        place = None
        if self.locate is not None:
            try:
                place = self.locate(gid)
            except Exception:  # noqa: BLE001 - an answer must not fail the poll
                place = None
        where, when = self._waiting
        waiting = where if time.monotonic() - when < WAITING_FRESH else ""
        if self.leaving:
            waiting = LEAVING
        if place is None:
            return Place(self.freed_seqs.get(gid), "", waiting, None)
        return Place(place[0], place[1], waiting, place[2])

    def _heard(self, kind: str, gid: str, world_rank: int, *place: Any) -> None:
        """A question (WHERE: a peer timed out in a call of ``gid`` and tells where it is;
        it gets this rank's answer) or an answer (HERE)."""
        asking = kind == WHERE
        now = time.monotonic()
        self.heard.setdefault(gid, {})[world_rank] = (now, Place(*place), asking)
        if asking:
            self.last_question = now
            self.questions.setdefault(gid, {})[world_rank] = (now, Place(*place))
            msg = (HERE, gid, self.world_rank, *self._position(gid))
            self._send(msg, world_rank)

    def answer(self, call: Any, seq: int) -> None:
        """Run between the polls of a bounded point-to-point wait (call ``seq``, a Call; see
        work.idle_while): looks for notices every POLL_INTERVAL, so that a peer that timed
        out and asks hears where this rank is. It never raises: a point-to-point call is
        not matched by number, so no notice ends it."""
        now = time.monotonic()
        if now - self._last >= POLL_INTERVAL:
            self._waiting = (p2p_waiting(call, seq), now)
            self.poll()

    def waits_in(self, where: str) -> None:
        """Run between the slices of a bounded wait that is no call of a group's sequence
        (a create_group, made by its members only): looks for notices every POLL_INTERVAL,
        so that a member that timed out and asks hears that this rank waits in ``where``."""
        now = time.monotonic()
        if now - self._last >= POLL_INTERVAL:
            self._waiting = (where, now)
            self.poll()

    def refuse_p2p(
        self, gid: str, group_rank: int, told: Sequence[tuple[int, Any]], reason: str
    ) -> None:
        """A point-to-point call refused here (nothing posted): tell each rank it names
        (``told``: world rank, the ops.Counterpart of that rank), which keeps the latest
        P2P_REFUSALS_KEPT per group and says it at its own call's timeout."""
        wall = time.time()
        for w, c in told:
            if w != self.world_rank:
                msg = (P2P_REFUSED, gid, self.world_rank, group_rank, c.what, c.way, c.int_tag,
                       c.objects, reason, wall)  # fmt: skip
                self._send(msg, w)
        self._drop_sent()

    def clear_p2p(self, gid: str, told: Sequence[tuple[int, Any]]) -> None:
        """The calls refused here that ``told`` (world rank, ops.Counterpart) repeat were
        made since (a retry that was posted): their receivers drop the refusals."""
        for w, c in told:
            self._send((P2P_CLEARED, gid, self.world_rank, c.way, c.int_tag, c.objects), w)
        self._drop_sent()

    def ask(
        self,
        gid: str,
        members: Sequence[int],
        wait: float = ASK_WAIT,
        stop: Callable[[], bool] | None = None,
        reached: Callable[[Place], bool] | None = None,
    ) -> tuple[float, dict[int, tuple[float, Place, bool]]]:
        """At a timeout in a call of group ``gid`` (its members: world ranks): ask every
        other member where it is on the group and wait up to ``wait`` seconds for their
        answers (a member answers while it waits in a collective with a timeout, of any
        group: it looks for notices every POLL_INTERVAL; a member known to have left the job
        is not asked, and not waited for). Returns the time of the question
        and what each member said (answers, and the questions of members that timed out
        before this rank and asked first), by world rank; members that said nothing are
        missing. ``stop()`` true ends the wait early (the call that timed out completed).
        Where every member's answer has ``reached(place)`` (it is in the call that timed
        out, or past it), the call may complete at any moment: the wait goes on for
        ``stop()`` until ``wait`` is over, rather than ending with the answers (a rank that
        arrives while asked answers at its first look, 20 ms into its call, which would
        otherwise end the others' call a moment before it completes), and for ``wait``
        seconds from the moment the last of them was found there, where that came late in
        the question's own ``wait`` (a rank arriving 0.3 s before the end of the asking: on
        a loaded machine the call then had too little time, and raised on this rank while
        the late rank completed it).
        Within ASK_REUSE seconds of the end of a question to the same ranks (or more) of
        the group, that question's time and answers are returned instead, with what came
        since (another call of the group that timed out with it: no second wait)."""
        since = time.monotonic()
        if len(members) > ASK_MAX_RANKS:
            return since, {}
        self.poll(force=True)  # (departures that came: a rank that left is not asked)
        others = [w for w in members if w != self.world_rank and w not in self.departed]
        if not others:
            return since, {}
        heard = self.heard.setdefault(gid, {})
        last = self._asked.get(gid)
        if last is not None and since - last[0] < ASK_REUSE and last[2].issuperset(others):
            self.poll(force=True)
            return last[1], {w: heard[w] for w in others if w in heard}
        msg = (WHERE, gid, self.world_rank, *self._position(gid))
        for w in others:
            self._send(msg, w)

        completed = False
        found_in_it: float | None = None  # when every answer first showed the call reached

        def answered() -> bool:
            nonlocal completed, found_in_it
            self.poll(force=True)
            if stop is not None and stop():
                completed = True
                return True
            if not all(w in heard and heard[w][0] >= since for w in others):
                return False
            if stop is None or reached is None or not all(reached(heard[w][1]) for w in others):
                return True
            if found_in_it is None:
                found_in_it = time.monotonic()
            return False

        wait_bounded(answered, wait)
        if not completed and found_in_it is not None:
            # the same test on: the notices read, the call's completion, and a peer's newer
            # answer that is not in it (it left, its call stuck) ends the wait
            rest = found_in_it + wait - time.monotonic()
            if rest > 0:
                wait_bounded(answered, rest)
        self._drop_sent()
        if not completed:  # (answers to a call that completed are no story for the next)
            self._asked[gid] = (time.monotonic(), since, frozenset(others))
        return since, {w: heard[w] for w in others if w in heard}

    def depart(
        self,
        seqs: dict[str, int],
        reason: str,
        say: Callable[[str], None],
        bound: float = 120.0,
        *,
        wait: bool = True,
        unchecked: dict[str, Unchecked] | None = None,
    ) -> None:
        """This rank leaves the job (at exit, its program done): tell every other rank,
        with the number of the last collective it reached on each of its groups (``seqs``,
        by group id), so that a rank waiting (bounded) in a later call of one of them hears
        at once that this rank will not join it, instead of waiting out its timeout (torch's
        default: 30 min).

        Then wait until every other rank has said that it leaves too (answering the
        questions of those still running), and this rank's notices have gone out: a
        message to a rank that has finalized MPI ends the job (two Slurm nodes, srun: the
        ranks of one node left 3 s before the other's, whose departure notices then ended
        a correct job with status 14, every time, in an outside hunt; raw mpi4py alike).
        The wait ends after ``bound`` seconds all the same (a rank that finalized MPI
        itself, or left without hpccomm's exit, never says it leaves: the others waited for
        good): ``say`` is told so, and which ranks it waits for after EXIT_SAY_AFTER
        seconds, then every EXIT_SAY_EVERY. A failure MPI reports (ULFM) ends the wait
        (raised). ``wait`` False: only tell them (once; a later call only waits).
        ``unchecked``: the calls no comparison took on this rank's groups (see
        runtime._depart), told with it."""
        others = [w for w in range(self.comm.Get_size()) if w != self.world_rank]
        if not self.announced:
            self.announced = True
            msg = (DEPARTURES, self.world_rank, seqs, reason, unchecked or {})
            for w in others:
                self._send(msg, w)
        if not wait:
            return
        start = time.monotonic()
        said_at, pause = start + EXIT_SAY_AFTER, 0.001
        all_left: float | None = None
        while True:
            self.poll(force=True)
            if self.failure is not None:  # (a failed rank never says it leaves)
                raise self.failure
            self._drop_sent()
            now = time.monotonic()
            waiting = [w for w in others if w not in self.departed]
            listed = f"{waiting[:8]}{' and more' if len(waiting) > 8 else ''}"
            if not waiting:
                all_left = now if all_left is None else all_left
                # (every peer heard from: this rank's own notices are on their way; a
                # peer gone meanwhile leaves them unsent, cancelled at close)
                if not self._sent or now - all_left > DEPART_WAIT:
                    return
            elif now - start >= bound:
                say(
                    f"exiting: world rank(s) {listed} did not say they leave within {bound:g} "
                    f"s; finalizing MPI all the same (a message to this rank from one of them "
                    f"now may end the job)"
                )
                return
            elif now >= said_at:
                say(
                    f"exiting: waits {now - start:.0f} s so far for world rank(s) "
                    f"{listed} to end their programs too (MPI_Finalize is collective; a message "
                    f"to a rank that has left MPI ends the job)"
                )
                said_at = now + EXIT_SAY_EVERY
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def check(
        self,
        gid: str,
        seq: int,
        where: str,
        members: Sequence[int] = (),
        mine: Callable[[], str] | None = None,
        earlier: Callable[[int], str | None] | None = None,
    ) -> None:
        """Raise PeerError if a member reported failing call ``seq`` of group ``gid``, or a
        member (world ranks ``members``) left the job or freed the group before reaching
        it, or a member's failure inside MPI of an earlier call made the group unusable
        there (``earlier(n)``: this rank's call #n, where it is still known, said beside
        the peer's: where that call returned here, its data may be wrong), unless this rank
        was told of that failure inside the call."""
        self._waiting = (where, time.monotonic())
        self.poll()
        for nseq, op, group_rank, world_rank, reason, kind in self.received.get(gid, ()):
            if kind == BROKE and nseq < seq and (gid, nseq) not in self._told:
                # (a rank that went past that call heard only that the peer refused this
                # one, or, where the peer made no later call, waited until its timeout; an
                # outside hunt, 2026-12-05)
                here = _beside(
                    reason,
                    None if earlier is None else partial(earlier, nseq),
                    f"this rank's {op} #{nseq}",
                    " (where it returned here, its data may be wrong)",
                )
                err = PeerError(
                    f"{where}: rank {group_rank} (world rank {world_rank}) failed {op} "
                    f"#{nseq}, and the group is unusable there: it will join no later call: "
                    f"{reason}{here}"
                )
                err.told = True
                raise err
        for w in members:
            gone = self.departed.get(w)
            # (a group the leaving rank does not list is not judged: a member lists every
            # group it had, so its id there differs, and its last call is unknown)
            if gone is not None and gid in gone[0] and gone[0][gid] < seq:
                err = PeerError(
                    f"{where}: world rank {w} has left the job ({gone[1]}) after call "
                    f"#{gone[0][gid]} of this group: it will not join this one"
                )
                err.told = True
                raise err
        freed = self.freed_by.get(gid)
        if freed:
            for g, w in enumerate(members):
                if w in freed and freed[w] < seq:
                    err = PeerError(
                        f"{where}: rank {g} (world rank {w}) freed this group after call "
                        f"#{freed[w]}: it will not join this one"
                    )
                    err.told = True
                    raise err
        for nseq, op, group_rank, world_rank, reason, kind in self.received.get(gid, ()):
            if nseq == seq and kind != ENTERED:
                verb = "refused" if kind == REFUSED else "failed"  # as the timeout's answer
                here = _beside(reason, mine, "this rank's call")
                err = PeerError(
                    f"{where}: rank {group_rank} (world rank {world_rank}) {verb} {op} #{nseq} "
                    f"and will not join it: {reason}{here}"
                )
                err.told = True  # by a notice, while this rank waited inside the call
                if kind == BROKE:
                    self._told.add((gid, seq))
                raise err

    def refused_by(
        self, gid: str, seq: int, others: Sequence[int], deadline: float
    ) -> tuple[list[int], list[int]]:
        """Wait until every group rank in ``others`` has said that it refused call ``seq`` of
        group ``gid`` too or that it entered it, or until ``deadline`` (time.monotonic()), or
        until one said it entered; returns (those that entered, those that said nothing)."""
        pause = 1e-4
        while True:
            self.poll(force=True)
            seen = [(r, k) for s, _, r, _, _, k in self.received.get(gid, ()) if s == seq]
            entered = sorted({r for r, k in seen if k != REFUSED and r in others})
            said = {r for r, _ in seen}
            missing = [r for r in others if r not in said]
            if entered or not missing or time.monotonic() >= deadline:
                return entered, missing
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def forget(self, gid: str, seq: int) -> None:
        """Drop the notices of call ``seq`` of group ``gid`` (a settled refusal: a group that
        refuses calls over and over keeps no growing list)."""
        kept = self.received.get(gid)
        if kept:
            kept[:] = [n for n in kept if n[0] != seq]

    def watch(
        self,
        gid: str,
        seq: int,
        where: Callable[[], str],
        members: Sequence[int] = (),
        mine: Callable[[], str] | None = None,
        earlier: Callable[[int], str | None] | None = None,
    ) -> Callable[[], None]:
        """A callable for bounded waits: raises PeerError once a notice for this call came
        (or a departure of one of ``members`` before it, or a peer's failure of an earlier
        call that made the group unusable there). ``mine``: this rank's call, said beside
        the failing peer's where its notice gives it; ``earlier``: the same for an earlier
        call by number (None where not known)."""

        def check() -> None:
            self.check(gid, seq, where(), members, mine, earlier)

        return check

    def monitored_barrier(
        self, gid: str, seq: int, members: Sequence[int], group_rank: int, timeout: float,
        where: str,
    ) -> None:  # fmt: skip
        """A barrier that names the ranks that did not arrive: every member reports to the
        group's rank 0, which waits for them until ``timeout`` and then releases every rank
        that came, with the list of those that did not; everyone raises CommTimeoutError
        naming them (rank numbers of the group)."""
        root = members[0]
        deadline = time.monotonic() + timeout
        # a member that refused it (a bad timeout) or left the job: a PeerError naming it
        told = self.watch(gid, seq, lambda: where, members)
        if group_rank != 0:
            self._drop_sent()  # (one more per call was kept for good)
            self._send((gid, seq, "arrived"), root, MONITOR_TAG)
            # rank 0 may spend the whole timeout waiting for others: give it that and more
            msg = self._wait_for(root, (gid, seq, "release"), deadline + timeout + 1.0, told)
            if msg is None:
                raise CommTimeoutError(
                    f"{where}: rank 0 of the group (world rank {root}) did not release it "
                    f"within {2 * timeout + 1:g} s"
                )
            missing = msg[3]
            if group_rank in missing:  # rank 0 gave up before this rank's arrival came
                raise CommTimeoutError(
                    f"{where}: this rank came after rank 0 of the group (world rank {root}) "
                    f"gave up waiting ({timeout:g} s): {_ranks(missing, members)} of the "
                    f"group did not arrive in time"
                )
        else:
            missing = []
            for i, w in enumerate(members[1:], start=1):
                if self._wait_for(w, (gid, seq, "arrived"), deadline, told) is None:
                    missing.append(i)
            self._drop_sent()
            # the late ones too: one that comes after all finds its answer waiting (it waited
            # 2 x timeout + 1 s for a release that never came)
            for w in members[1:]:
                self._send((gid, seq, "release", missing), w, MONITOR_TAG)
        if missing:
            raise CommTimeoutError(
                f"{where}: {_ranks(missing, members)} of the group did not arrive within "
                f"{timeout:g} s"
            )

    def _wait_for(
        self, source: int, key: tuple, deadline: float, told: Callable[[], None]
    ) -> tuple | None:
        """The first monitor message from ``source`` whose first fields equal ``key``
        (others are kept for later), or None at the deadline. Threads share the kept
        messages (monitored barriers of several groups at once): each looks through them at
        every poll, under a lock, and takes messages with a matched probe (an iprobe then a
        recv let another thread take the probed message; a message of another group taken
        by one thread was never seen by the thread it was for, which then named a rank that
        had arrived as missing)."""
        kept = self._monitor.setdefault(source, [])
        got: list[tuple] = []

        def arrived() -> bool:
            with self._monitor_lock:
                for msg in kept:
                    if msg[: len(key)] == key:
                        kept.remove(msg)
                        got.append(msg)
                        return True
                while True:
                    matched = self.comm.improbe(source=source, tag=MONITOR_TAG)
                    if matched is None:
                        return False
                    msg = matched.recv()
                    if msg[: len(key)] == key:
                        got.append(msg)
                        return True
                    kept.append(msg)

        # polled as bounded waits are (sleeping from the first poll, from 0.1 ms up to
        # 10 ms, made every monitored_barrier take 26-30 ms with every rank there)
        if wait_bounded(arrived, max(0.0, deadline - time.monotonic()), told):
            return got[0]
        return None

    def forget_group(
        self,
        gid: str,
        seq: int,
        members: Sequence[int] = (),
        unchecked: Unchecked | None = None,
    ) -> None:
        """A group freed here after call ``seq``: kept for the departure notice (the latest
        FREED_KEPT such groups); its other ``members`` (world ranks; groups of up to
        ASK_MAX_RANKS) are told, so that one waiting in a later call of it hears that this
        rank will not join (check). ``unchecked``: its name, members and uncompared calls
        (Dispatcher.unchecked), kept for the departure notice where there are any."""
        if len(members) <= ASK_MAX_RANKS:
            for w in members:
                if w != self.world_rank:
                    self._send((FREED, gid, self.world_rank, seq), w)
            self._drop_sent()
        # (what was heard of it: kept for good, a refusal's notice grew a job that made and
        # freed groups by 0.75 MB per 1,000, an outside hunt)
        self._asked.pop(gid, None)
        self.received.pop(gid, None)
        self.heard.pop(gid, None)
        self.questions.pop(gid, None)
        self.p2p_refusals.pop(gid, None)
        with self._refused_lock:
            self._refused_here.pop(gid, None)
        seqs = self.freed_seqs
        seqs.pop(gid, None)
        seqs[gid] = seq
        while len(seqs) > FREED_KEPT:
            del seqs[next(iter(seqs))]
        kept = self.freed_unchecked
        kept.pop(gid, None)
        if unchecked is not None and unchecked[2]:
            kept[gid] = unchecked
            while len(kept) > FREED_UNCHECKED_KEPT:
                del kept[next(iter(kept))]

    def close(self) -> None:
        """Drop what is still unsent (at exit: the receivers may be gone)."""
        for req in self._sent:
            try:
                req.Cancel()
            except Exception:  # already complete or the library is shutting down
                pass
        self._sent.clear()
