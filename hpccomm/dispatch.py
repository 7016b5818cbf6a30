"""The one path every operation takes: resolve -> validate -> record -> choose backend -> run.

A :class:`Dispatcher` belongs to one communicator. It is handed the communicator's identity
(:class:`~hpccomm.record.Group`), its host backend and a function that picks the backend of a
call with device arrays; it imports nothing above it.

- **Validate once per description.** Validation produces a :class:`~hpccomm.ops.Call` that
  holds no array; the dispatch caches it under what validation depended on (op, dtype, shape,
  strides, root/tag/op, sizes, the output's description) and reuses it for any later call
  with arrays of that description, new array objects included. A cached call that then fails
  in the library is validated again from scratch, so a read-only or otherwise bad array
  still gets its precise error.
- **Record.** Each call gets the next sequence number of its group. Only when someone listens
  (or a Work is handed out) is a :class:`~hpccomm.record.Record` made.
- **Run.** ``call.mode`` (set by the backend) says how: a blocking collective runs inline, or
  on the communicator's worker thread (:mod:`hpccomm.executor`) when the caller asked for a
  Work or a time bound, or when earlier calls still wait there; point-to-point bodies return
  MPI requests that are waited for here or handed out in a Work; NCCL enqueues on a stream.
  Whether a rank waits, how long, and whether it asked for a Work never changes which MPI call
  it makes.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from . import record
from .backends.base import Backend, HostBackend
from .buffers import allocate, on_host, resolve
from .debug import (
    CHECKING,
    call_site,
    crc,
    crc_base,
    disagreement,
    earlier_difference,
    earlier_left_messages,
    fingerprint,
    large_bytes,
    out_of_step,
    with_seq,
)
from .dtypes import ReduceOp
from .errors import (
    BackendError,
    ClosedError,
    CommTimeoutError,
    HpccommError,
    InvalidArgumentError,
    MismatchError,
    PeerError,
    where,
)
from .executor import Executor, Future, on_worker
from .notices import (
    ASK_MAX_RANKS,
    ASK_WAIT,
    BROKE,
    ENTERED,
    FAILED,
    ITS_CALL,
    LEAVING,
    P2P_REFUSALS_KEPT,
    POLL_INTERVAL,
    REFUSED,
    NoticeBoard,
    Place,
    Unchecked,
)
from .ops import (
    BARRIER,
    BATCH_P2P,
    BROADCAST,
    OVERLAP_CHECKED,
    RECV,
    RECV_OBJECT,
    REDUCE,
    SCATTER_OBJECT,
    Call,
    Counterpart,
    Group,
    OpSpec,
    as_int,
    check_async_op,
    check_stream,
    matches,
    p2p_counterparts,
)
from .record import Record, Refusal
from .work import ORPHANS, Done, Work, batch_tags, reap, wait_watching, withdrawn_receive

if TYPE_CHECKING:
    from .backends.shm import ShmBackend

__all__ = ["Dispatcher", "CACHE_LIMIT"]

_get_ident = threading.get_ident  # (the worker-thread test of every dispatch: see _on_own_worker)

CACHE_LIMIT = 512  # validated call descriptions kept per communicator (then one at random
# makes room for each new one)
_EVICT = random.Random(0)  # (its own generator: the program's random state is left alone)
# What a timeout says of a peer that did not answer where it is, and of one that has no
# such group (whereabouts, p2p_whereabouts)
_SILENT_WHY = (
    "(not waiting in a call with a timeout: busy outside hpccomm, in a call without a "
    "timeout, or gone)"
)
_NO_SUCH_GROUP = "has no such group (not made there yet, or freed and forgotten)"
# Seconds between two notices of refused point-to-point calls to one rank (see _refuse_p2p)
P2P_REFUSAL_GAP = 0.1
# Seconds after which a rank that refused a collective, waiting without a timeout to hear
# that every other member refused it too, says on stderr whom it waits for (see settle)
REFUSAL_WAIT = 10.0
# At the "large" level a collective whose buffers are all within the eager limit is not
# compared when it runs (the exchange would about double a small call's time); it is
# compared with the group's next compared call instead, and at the latest the call after
# this many such calls is compared (so is a barrier after any): a difference is found
# late, but found, and named (see Dispatcher.verify)
DEFERRED_LIMIT = 64
# Errors that are consequences of another rank's failure: never reported to the others.
_CONSEQUENCES = (CommTimeoutError, PeerError, ClosedError)
_ndarray = np.ndarray
_CRC_OF = attrgetter("crc")


_RUN_SEQ = re.compile(r"^\S+ #(\d+) on ")  # the number in a worker's "op #seq on group ..."


def _reached(seq: int, op: str, mine: int | None, place: Place) -> bool:
    """Whether a rank that answered (``place``) is in call ``seq`` (``op``) of the group
    with the arguments of this rank's (``mine``: the CRC of its fingerprint, where known),
    has completed it, or is past it: then the call can complete at any moment. Not where
    its worker still runs an earlier call, or it is exiting with a call stuck."""
    if place.seq is None or place.seq < seq or place.waiting == LEAVING:
        return False
    running = _RUN_SEQ.match(place.running) if place.running else None
    if running is not None and int(running.group(1)) < seq:
        return False  # its worker is still on an earlier call (#seq queued behind it)
    if place.seq > seq:
        return True
    theirs = place.call
    if place.running:
        if not place.running.startswith(f"{op} #{seq} on "):
            return False  # another call with this number
    elif theirs is None or theirs[0] != seq or theirs[1].get("op") != op:
        return False  # completed #seq, but what it ran is not known
    if mine is None or theirs is None or theirs[0] != seq:
        return True
    return crc(theirs[1]) == mine


def _base_crc(call: Call, seq: int) -> int:
    """The CRC of ``call``'s fingerprint without its sequence number, made once and kept
    with the (cached) call."""
    if call.crc is None:
        call.crc = crc_base(fingerprint(call, call.spec.name, seq))
    return call.crc


_listeners = record.listeners


class Dispatcher:
    """Runs every operation of one communicator.

    Args:
        group: the communicator's name, rank, size and sequence counters.
        backend: the host backend (MPI).
        device_backend: picks the backend of a call with device arrays (NCCL or the MPI
            device path); called only for such calls.
        timeout: seconds after which a blocking call raises CommTimeoutError (None: none).
    """

    __slots__ = (
        "group",
        "backend",
        "device_backend",
        "cache",
        "executor",
        "closed",
        "broken",
        "interrupted",
        "notices",
        "gid",
        "members",
        "debug",
        "shm",
        "large",
        "_checking",
        "current",
        "_timeout",
        "_slow",
        "_unsettled",
        "_refused_receive",
        "_inside",
        "_threads",
        "freed",
        "_fenced_refusal",
        "_settling",
        "_p2p",
        "_p2p_refused",
        "_p2p_refused_at",
        "_deferred",
        "_uncompared",
        "_failed_in_mpi",
    )

    def __init__(
        self,
        group: Group,
        backend: HostBackend,
        device_backend: Callable[[Call], Backend],
        *,
        timeout: float | None = None,
        debug: str = "large",
    ) -> None:
        self.group = group
        self.backend = backend
        self.device_backend = device_backend
        self.cache: dict[tuple, Call] = {}
        self.executor: Executor | None = None
        self.closed = False
        self.broken: str | None = None  # why calls can no longer run (a stuck call)
        # broken by a collective that failed inside MPI here (see failed): its peers may have
        # completed that call, so its uncompared calls still go to the exit's comparison
        self._failed_in_mpi = False
        self.interrupted: str | None = None  # a fast-path call left half done (see dispatch)
        # Failure notices (set by the communicator): the job's board, this group's id
        # (alike on every member) and its members' world ranks.
        self.notices: NoticeBoard | None = None
        self.gid = group.name
        self.members: list[int] = []
        self.debug = debug  # "off", "large", "check" or "detail" (see debug.py)
        # "large": calls on the host MPI path whose largest buffer exceeds this are checked
        self.large = large_bytes()
        self._checking = 0  # the sequence number of the call in its debug check, else 0
        # the latest collective run with a Work (bounded or async): (number, call)
        self.current: tuple[int, Call] | None = None
        # The group's shared-memory fast path (set by the communicator when its ranks share
        # one node): large host reductions take it instead of the host backend.
        self.shm: ShmBackend | None = None
        self._timeout = timeout
        # refusals whose peers' word is still to be heard (see refused): seq, where, the
        # error's name and when
        self._unsettled: list[tuple[int, str, str, float]] = []
        # a receive refused here (nothing posted): its sender's message may come unreceived
        self._refused_receive: str | None = None
        # the thread in a plain collective of this group now, and that call's place (another
        # thread's collective meanwhile is refused: see _concurrent)
        self._inside: tuple[int, Call, int] | None = None
        # every thread inside an operation or step of this group now, and what it runs
        # there (see calls_elsewhere)
        self._threads: dict[int, str] = {}
        self.freed = False  # closed for good by free() (see close)
        # a collective refused here while a free() had closed the group (see fence, reopen)
        self._fenced_refusal = False
        self._settling = threading.Lock()  # settle runs on the caller's or the worker thread
        self._slow = timeout is not None or debug in CHECKING
        # the point-to-point Works handed out and not seen complete (free() refuses while
        # one runs: MPI would go on using its arrays on a communicator freed under it)
        self._p2p: weakref.WeakSet[Work] = weakref.WeakSet()
        # point-to-point refusals told to peers: (world rank, way, tag, objects), and when
        # this rank last told each world rank of one (see _refuse_p2p, _cleared_p2p)
        self._p2p_refused: dict[tuple[int, str, int | None, bool], float] = {}
        self._p2p_refused_at: dict[int, float] = {}
        # "large": the calls not compared when they ran, (seq, Call) in order, until the next
        # comparison takes them (verify, agree); and how many were made since the last call
        # that was compared (counted at the dispatch, alike on every rank of a group in step)
        self._deferred: deque[tuple[int, Call]] = deque()
        self._uncompared = 0

    # -- settings ---------------------------------------------------------------------------

    @property
    def timeout(self) -> float | None:
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._timeout = value
        self._update_slow()

    def _update_slow(self) -> None:
        """Plain calls may run inline only without a timeout, a broken group, or calls still
        on the worker thread (rechecked by run(), which takes every call while this holds)."""
        ex = self.executor
        self._slow = (
            self._timeout is not None
            or self.broken is not None
            or bool(self._unsettled)
            or self.debug in CHECKING
            or (ex is not None and ex.pending > 0)
        )

    def set_debug(self, level: str | None, refused: BaseException | None = None) -> None:
        """Collective over the group: a step of its sequence, as a group creation is, in
        which the ranks compare the level they set (at every level, "off" included); where
        it differs every rank raises MismatchError and keeps its level. Set on one rank only
        (it used to be a plain assignment), its point-to-point messages carried headers the
        other side took for the data: a receive of 16 int64 got the header's words, with no
        error anywhere. ``refused``: the value was refused on this rank (a misspelt level):
        it takes part all the same, so the others raise naming it, and the caller raises
        its own error (a group creation refused on one rank does the same)."""
        if refused is not None:
            why = f"{type(refused).__name__}: {refused}"
            try:
                self.collective(
                    "debug", self._same_level, f"refused ({why})", agree={"refused": why}
                )
            except HpccommError:
                pass  # this rank raises its own error
            return
        assert level is not None
        self.collective("debug", self._same_level, level)
        self.debug = level
        self.cache.clear()  # cached calls hold whether the "large" level checks them
        self._deferred.clear()  # (the level's step compared them)
        self._uncompared = 0
        self._update_slow()

    def _same_level(self, level: str) -> None:
        group = self.group
        levels = self.backend.allgather_object(level)
        if len(set(levels)) > 1:
            said = disagreement([{"level": lv} for lv in levels])
            raise MismatchError(
                f"debug #{group.seq} on {group.name} (rank {group.rank} of {group.size}): "
                f"the ranks set different debug levels: {said}; the level is unchanged on "
                f"every rank (set the same level on every rank of the group)"
            )

    # -- the path ---------------------------------------------------------------------------

    def dispatch(
        self,
        spec: OpSpec,
        data: Any = None,
        out: Any = None,
        *,
        peer: Any = None,
        src: Any = None,
        tag: Any = None,
        redop: Any = None,
        sizes: Any = None,
        in_splits: Any = None,
        out_splits: Any = None,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Run one operation; returns its result, or a Work when ``async_op``. The thread is
        counted inside the group from its first step (a call taken from the validation
        cache) to its last, for free() and the exit (see calls_elsewhere)."""
        me = _get_ident()
        threads = self._threads
        outer = threads.get(me)  # (an operation run from inside another, e.g. a hook's)
        threads[me] = spec.name
        try:
            return self._operation(
                me, spec, data, out, peer, src, tag, redop, sizes, in_splits, out_splits,
                async_op, stream,
            )  # fmt: skip
        finally:
            if outer is None:
                threads.pop(me, None)  # (a fork() child drops the others' entries)
            else:
                threads[me] = outer

    def _operation(
        self,
        me: int,
        spec: OpSpec,
        data: Any,
        out: Any,
        peer: Any,
        src: Any,
        tag: Any,
        redop: Any,
        sizes: Any,
        in_splits: Any,
        out_splits: Any,
        async_op: bool,
        stream: Any,
    ) -> Any:
        ex = self.executor
        if ex is not None and not async_op and ex.ident == me and not spec.p2p:
            self._on_own_worker(spec, ex, (data, peer, src, tag))
        held = _HELD and spec.arrays and self.debug != "off"
        if held and ORPHANS:  # a dropped Work's arrays are free once MPI is done with them
            reap()
            held = bool(_HELD)
        if held or stream is not None or (async_op is not False and async_op is not True):
            # refused here, before validation, and the others told: an array an async call
            # not waited for holds (read-only; validation would call it read-only), whether
            # this call is async or not, on one rank or on all; a stream= that is no stream;
            # an async_op that is no bool ("no" was taken as True, an outside audit)
            g = self.group
            # (a point-to-point call refused takes no number, as validation's refusals say:
            # "send #2" was named, and the next call was #2 too, an outside hunt)
            nxt = None if spec.p2p else g.seq + 1
            here = where(spec.name, g.rank, g.size, group=g.name, seq=nxt)
            try:
                if async_op is not False and async_op is not True:
                    async_op = check_async_op(async_op, here)
                if held:
                    writes = ReadOnlyWhileRunning.writes_data(spec, g.rank, peer, data, out)
                    ReadOnlyWhileRunning.refuse_held(data, out, here, writes)
                if stream is not None:
                    check_stream(stream, here)
            except InvalidArgumentError as exc:
                self.refused(spec, exc, (data, peer, src, tag), redop)
                raise
        # resolve + validate, once per description of host arrays (the key holds only what
        # validation depends on; a freed communicator has an empty cache and is refused by
        # prepare)
        if (out is None or type(out) is _ndarray) and (
            type(data) is _ndarray or (data is None and spec.arrays)
        ):  # (no data: a barrier, a scatter's receiving rank; it validated every call)
            d: Any = data
            nodata = d is None
            shm = self.shm
            key: tuple = (
                spec,
                None if nodata else d.dtype,
                None if nodata else d.shape,
                None if nodata else d.strides,
                peer,
                tag,
                redop,
                src,
                sizes,
                in_splits,
                out_splits,
                stream,
                None
                if out is None
                else (
                    out.dtype,
                    out.shape,
                    out.strides,
                    out.flags.writeable if spec.p2p else None,
                    _overlap(d, out) if spec in OVERLAP_CHECKED and not nodata else None,
                ),
                # the arguments' types: True == 1 == 1.0 and 2.0 == 2+0j as keys, but not
                # in validation (a root of True, a complex factor on a real dtype)
                type(peer),
                type(tag),
                type(src),
                (type(redop[1]), _signs(redop[1])) if type(redop) is ReduceOp else type(redop),
                None
                if sizes is None and in_splits is None and out_splits is None
                else (_types(sizes), _types(in_splits), _types(out_splits)),
                # a receive into a read-only array is refused by validation: seen cached, it
                # matched its message before mpi4py refused the buffer (the message was
                # lost). Collectives find it at the call: the shared-memory path's header
                # makes every rank raise (tests/mpi/test_shm.py), mpi4py refuses it before
                # MPI, and the precise error follows
                d.flags.writeable if spec.p2p and not nodata else None,
                # a symmetric buffer (comm.empty) or not, once the group has any: the two
                # take different paths (see prepare)
                None if shm is None or not shm.allocs or nodata else shm.kind_of(spec, d),
            )
            try:
                call = self.cache.get(key)
            except TypeError:  # sizes given as lists or arrays: freeze them for the key
                frozen = (_frozen(sizes), _frozen(in_splits), _frozen(out_splits))
                call = None
                if _UNHASHABLE in frozen:  # not a list of ints: validation says what it is
                    key = ()
                else:
                    sizes, in_splits, out_splits = frozen
                    key = (*key[:8], sizes, in_splits, out_splits, *key[11:])
                    try:
                        call = self.cache.get(key)
                    except Exception:  # noqa: BLE001 - a root, tag or op that is no
                        # hashable value (or whose hash raises): validation names it
                        key = ()
            except Exception:  # noqa: BLE001 - a hash that raises otherwise (a root's
                # __hash__ raising ValueError escaped raw, the ranks out of step)
                key, call = (), None
        elif spec.objects and not spec.p2p:
            # an object collective: validation depends on the root alone (and on the list
            # on scatter_object's root, never cached), so the call, its checks' choice and
            # its fingerprint's CRC are kept by root (and the root's type, as for arrays)
            key = (spec, peer, type(peer))
            if type(peer) not in _PLAIN_ROOTS:  # keyed by its value only where that cannot
                # change: an int-like object hashed by identity kept its first value's call
                key = ()
            call = self.cache.get(key) if key else None
        else:
            key, call = (), None  # not cached
        if call is None:
            try:
                call, data, out = self.prepare(
                    spec, data, out, peer, src, tag, redop, sizes, in_splits, out_splits
                )
            except HpccommError as exc:
                self.refused(spec, exc, (data, peer, src, tag), redop)
                raise
            # (scatter_object's root: validated every call, its list being data)
            if key and not (spec is SCATTER_OBJECT and call.peer == self.group.rank):
                self._keep(key, call)
        if spec.p2p and spec is not RECV and spec is not RECV_OBJECT and self.notices is not None:
            try:
                self._to_freed(spec, data, call.peer)
            except HpccommError as exc:
                if record.error_hooks:
                    record.report_error(exc)
                raise
        if spec.objects and not spec.p2p:
            # pickled now, not inside MPI: one that cannot be pickled is a refusal (this
            # rank joins the others' comparison, saying why), where before its peers waited
            # in MPI for good, or a scatter_object had sent the first ranks their objects
            try:
                data = self.backend.pickled(call, data, self.group.seq + 1)
            except HpccommError as exc:
                self.refused(spec, exc, (data, peer, src, tag), redop)
                raise
        # record: the group's next sequence number
        group = self.group
        plain = False  # a plain collective: this thread is inside it (see _concurrent)
        if spec.p2p:
            group.p2p_seq += 1
            seq = group.p2p_seq
        else:
            inside = self._inside
            if inside is not None and inside[0] != me:
                self._concurrent(call, inside, data)
            group.seq += 1
            seq = group.seq
            if not async_op:
                plain = True
                self._inside = (me, call, seq)
        try:
            check = call.checked
            if call.deferred:  # compared later, or now with the calls before it (see verify)
                if self._uncompared < DEFERRED_LIMIT and call.spec is not BARRIER:
                    self._uncompared += 1
                    self._deferred.append((seq, call))
                else:
                    check = self._defer(call, seq)
            elif check:
                self._uncompared = 0
            # run: plain calls here (blocking collectives inline, point-to-point started and
            # waited for), everything else through run(). _slow covers a timeout, a broken
            # group and a worker thread that may still hold earlier calls.
            if async_op or self._slow or _listeners:
                return self.run(call, seq, data, out, async_op, stream, key, check)
            if ORPHANS and spec.p2p:
                reap()
            if call.out_shape is not None and out is None:
                out = allocate(call.out_shape, call.dtype(), call.device, stream)
            mode = call.mode
            if mode == "blocking":
                try:
                    if check:
                        self.verify(call, seq)
                    call.backend.seq = seq
                    return call.body(call, data, out, stream)
                except HpccommError as exc:
                    self.report(call, seq, exc)
                    raise
                except Exception as exc:
                    err = self.failed(call, seq, exc, key, data, out)
                    self.report(call, seq, err)
                    raise err from exc
                except BaseException as exc:  # KeyboardInterrupt, SystemExit: an MPI call ends
                    # before Python sees the signal, but the fast path's body runs between its
                    # barriers in Python: the peers may be inside the call for good
                    if call.backend is self.shm:
                        self.interrupted = (
                            f"{call.where(seq)} (interrupted by {type(exc).__name__} inside the "
                            f"shared-memory path, where its peers may still be)"
                        )
                        self.broken = f"the group is unusable: {self.interrupted}"
                        self._update_slow()
                    raise
            if mode != "requests":
                return self.run(call, seq, data, out, async_op, stream, key, check)
            try:
                pending = (call.blocking_body or call.body)(call, data, out, stream)
                pending.seq = seq
                pending.wait(None)
                return pending.outcome()
            except HpccommError:
                raise
            except Exception as exc:
                raise self.failed(call, seq, exc, key, data, out) from exc
        finally:
            if plain:
                self._inside = None

    def _to_freed(self, spec: OpSpec, data: Any, peer: Any) -> None:
        """Refuse a send to a member that has freed this group (its notice came): Open MPI
        gives a freed communicator's id to the next group made, and a message that arrives
        for the old one is received there: an outside hunt's send of 111s on a group its
        receiver had freed was the next group's first recv, which was sent 222s (silently,
        the 222s never received)."""
        notices = self.notices
        if notices is None:  # (no init: refused elsewhere)
            return
        notices.poll()
        freed = notices.freed_by.get(self.gid)
        if not freed:
            return
        g = self.group
        for c in p2p_counterparts(g, spec.name, data, peer, None, 0):
            w = self.members[c.rank]
            if c.way == "send" and w in freed:
                raise PeerError(
                    f"{where(spec.name, g.rank, g.size, group=g.name)}: {g.peer(c.rank)} freed "
                    f"this group after its call #{freed[w]}, expected a member that has not: "
                    f"a message to it would be received by a group made later (MPI gives a "
                    f"freed communicator's id to the next one); nothing was sent"
                )

    def _keep(self, key: tuple, call: Call) -> None:
        """Cache a validated call under ``key``."""
        if len(self.cache) >= CACHE_LIMIT:  # one out, at random: clearing them all (or
            # dropping the least recently used) made a program cycling over 513
            # descriptions validate every call, 10x slower (an outside hunt); at random,
            # most of such a cycle stays
            self.cache.pop(_EVICT.choice(list(self.cache)), None)
        self.cache[key] = call

    def _concurrent(self, call: Call, inside: tuple[int, Call, int], data: Any) -> None:
        """A collective of this group while another thread is inside a plain one: the ranks'
        threads may issue the two in different orders (MPI would match one rank's first with
        another's second: wrong results, silently, in an outside review's runs). Refused as
        validation refuses a call (it takes its number, the others are told, and this rank's
        next call hears whether they refused it too): another rank, where the threads did
        not overlap, may have run it, and must not pair it with this rank's next call."""
        g = self.group
        thread = next((t.name for t in threading.enumerate() if t.ident == inside[0]), "?")
        exc = InvalidArgumentError(
            f"{where(call.spec.name, g.rank, g.size, group=g.name, seq=g.seq + 1)}: another "
            f"thread ({thread}) is inside {inside[1].where(inside[2])}: collectives of one "
            f"group must come from one thread at a time, in the same order on every rank "
            f"(MPI matches them by order: two threads' calls could pair up differently on "
            f"each rank); refused here (give each thread its own group: comm.dup())"
        )
        self.refused(call.spec, exc, (data, call.peer, call.src, call.tag), call.redop)
        raise exc

    def prepare(
        self,
        spec: OpSpec,
        data: Any,
        out: Any,
        peer: Any,
        src: Any,
        tag: Any,
        redop: Any,
        sizes: Any,
        in_splits: Any,
        out_splits: Any,
    ) -> tuple[Call, Any, Any]:
        """Resolve and validate one call and let its backend prepare it; returns the Call and
        the data and output as the backend takes them (NumPy or CuPy arrays for DLPack and
        CUDA-array-interface objects)."""
        if self.closed:
            if not self.freed:  # closed by another thread's free() that is still looking
                self._fenced_refusal = True
            raise ClosedError(
                f"{spec.name} (rank {self.group.rank} of {self.group.size}): "
                f"communicator {self.group.name} {self.closed_state()}"
            )
        call = Call(
            spec,
            self.group,
            peer=peer,
            src=src,
            tag=tag,
            redop=redop,
            sizes=sizes,
            in_splits=in_splits,
            out_splits=out_splits,
        )
        b = o = None
        try:
            if not spec.arrays:
                spec.validate(call, data, None)  # Python objects, or a list of P2POp
            else:
                if data is not None:
                    b = resolve(data, call)
                    data = b.array
                if out is not None:
                    o = resolve(out, call, "out")
                    out = o.array
                spec.validate(call, b, o)
        except HpccommError:
            raise
        except Exception as exc:  # a case validation did not foresee: still a refusal
            # (an IndexError here took no sequence number: the ranks went out of step)
            raise InvalidArgumentError(
                f"{call}: its arguments could not be checked ({type(exc).__name__}: {exc}); refused"
            ) from exc
        # the one place a call's backend is chosen (a cached Call keeps the choice)
        backend: Backend
        shm = self.shm
        if call.device is not None:
            backend = self.device_backend(call)
        elif shm is not None and shm.supports(call):
            backend = shm
        else:
            backend = self.backend
        backend.prepare(call)
        if backend is shm and shm.symmetric_range(call):  # (shm: not None)
            # a symmetric buffer takes the symmetric path; an ordinary array the single-copy
            # or copy path, or MPI: ranks whose arrays differ so waited in different calls
            # (a barrier against MPI's allreduce) until a timeout that said they were in the
            # same call with the same arguments (an outside hunt). Their fingerprints differ
            # (validated: C-contiguous, so locate finds it as the body does)
            found = shm.locate(data) is not None
            call.memory = "symmetric buffer" if found else "ordinary array"
        call.checked = (
            self.debug == "large"
            and (backend is self.backend or backend is self.shm)  # the fast path too: a
            # rank whose call differs may be on MPI (another size), where no header is seen
            and not spec.p2p
            and (
                # an object collective: every call (only the source knows the pickled size,
                # and two calls' sizes or roots that differ hang in mpi4py's exchange)
                spec.objects
                # an all_to_all on arrays: every rank must decide alike, and an uneven one's
                # totals differ by rank; and one rank passing split sizes (its call checked,
                # then MPI's alltoallv) against another passing none (MPI's alltoall) hung,
                # or timed out naming the wrong cause, where it is a MismatchError now
                or (spec.arrays and spec.name == "all_to_all")
                or (spec.arrays and call.largest_bytes() > self.large)
            )
        )
        call.deferred = (
            self.debug == "large"
            and not call.checked
            and (backend is self.backend or backend is self.shm)
            and not spec.p2p
            and not spec.objects
        )
        return call, data, out

    def _defer(self, call: Call, seq: int) -> bool:
        """A call the "large" level does not compare when it runs, past the dispatch's
        common case: whether it is compared all the same (after DEFERRED_LIMIT such calls
        in a row, or a barrier after any), with the calls before it; else it is kept for
        the next comparison (a barrier with none before it)."""
        if self._uncompared:
            self._uncompared = 0
            return True
        self._uncompared = 1
        self._deferred.append((seq, call))
        return False

    def _summary_of(self, seq: int) -> str | None:
        """This rank's call #seq (shape, dtype, root, op) where it is still uncompared (the
        "large" level's deferred calls); None otherwise (a compared call matched)."""
        for s, call in list(self._deferred):
            if s == seq:
                return _summary(call)
        return None

    def unchecked(self) -> Unchecked | None:
        """This group's name, members and the fingerprints, by call number, of its calls
        that the "large" level has not compared yet (no compared call came after them), for
        the comparison at the program's end (see runtime._depart; kept at free()); None
        where there are none, or for a group made unusable (its error was raised), unless a
        collective failed inside MPI here: a peer may have completed that call with wrong
        data (an MPI_ERR_TRUNCATE here: rank 0 passed 4 elements, rank 1 6 and got
        [3, 3, 3, 3, 4, 4], exit status 0 and no word, before 2026-12-05, an outside hunt)."""
        pending = list(self._deferred)
        if not pending or (self.broken is not None and not self._failed_in_mpi):
            return None
        calls = {seq: fingerprint(call, call.spec.name, seq) for seq, call in pending}
        return self.group.name, tuple(self.members), calls

    def run(
        self,
        call: Call,
        seq: int,
        data: Any,
        out: Any,
        async_op: bool,
        stream: Any,
        key: tuple = (),
        check: bool = False,
    ) -> Any:
        """The run step when the call is not a plain inline one: listeners, a Work, a time
        bound, point-to-point requests, a device stream, or earlier calls still queued.
        ``check``: the "large" level compares it (see dispatch)."""
        if self._unsettled and not call.spec.p2p:
            self.settle()
        if self.broken is not None:
            raise self._unusable(call.spec.name, seq, call.where(seq), call.spec.p2p)
        if ORPHANS:
            reap()
        if self._slow and not async_op:
            self._update_slow()  # the worker may have drained since the last call
        site = call_site() if self.debug == "detail" else None
        rec = None
        if _listeners:
            rec = Record(call, seq, async_op, self.gid, site)
            record.notify("start", rec)
        notices = self.notices
        watch: Callable[..., Any] | None = None
        on_failure = None
        started = None
        if notices is not None and not call.spec.p2p:
            watch = notices.watch(
                self.gid,
                seq,
                partial(call.where, seq),
                self.members,
                partial(_summary, call),
                self._summary_of,
            )
            on_failure = partial(self.report, call)
            self.current = (seq, call)  # (told to a peer that times out and asks)
        elif notices is not None:  # a bounded wait answers a peer's question (Work.wait)
            watch = notices.answer
            if self._p2p_refused:  # a retry of a call refused here: no longer a reason
                self._cleared_p2p(call, data)
            started = (time.time(), data if call.spec is BATCH_P2P else None)
        pending: Any = None
        checking = self.debug in CHECKING
        checked = (checking and not call.spec.p2p) or check
        guard = None
        if async_op and self.debug != "off" and call.device is None and call.spec.arrays:
            # a write before wait() raises at once; so does passing the array to another call
            writes = ReadOnlyWhileRunning.writes_data(
                call.spec, call.group.rank, call.peer, data, out
            )
            guard = ReadOnlyWhileRunning(data, out, partial(call.where, seq), writes)
            data, out = guard.data, guard.out
        try:
            if out is None and call.out_shape is not None:
                out = allocate(call.out_shape, call.dtype(), call.device, stream)
            mode = call.mode
            if mode == "blocking":
                ex = self.executor
                if not async_op and self._timeout is None and (ex is None or not ex.pending):
                    if checked:
                        self.verify(call, seq, site)
                    call.backend.seq = seq
                    pending = Done(call.body(call, data, out, stream))
                else:
                    settle = None
                    if call.device is not None:  # the caller's stream, not the worker's
                        stream, settle = call.backend.worker_stream(stream)
                    job = partial(self.verify, site=site) if checked else None
                    # a library error: validated again from scratch first, as inline
                    fail = partial(self.failed, call, seq, key=key, data=data, out=out)
                    pending = self.worker().submit(
                        call.where(seq),
                        _run_job,
                        call,
                        seq,
                        data,
                        out,
                        stream,
                        job,
                        fail,
                        self.before_job,
                        settle,
                    )
                    self._slow = True  # later plain calls queue behind it until it is done
                    if rec is not None and async_op:
                        rec.source = pending  # (its end, for the flight recorder's dumps)
            elif mode == "requests":
                headers = checking and not call.spec.objects
                if headers and call.backend is self.backend:  # host arrays: checked headers
                    pending = self.backend.start_checked(call, seq, data, out, not async_op)
                else:
                    body = call.body if async_op else (call.blocking_body or call.body)
                    pending = body(call, data, out, stream)
                pending.seq = seq  # names the call in its errors
            else:  # "stream": enqueued on a CUDA stream, here where no debug check must
                # wait for the worker's queued calls (NCCL's calls are not MPI's: only the
                # order of a group's NCCL calls matters, and the caller's is the program's)
                ex = self.executor
                nccl = call.backend
                # host jobs queued on the worker (not this group's own device calls)
                behind = ex is not None and ex.pending > nccl.jobs
                bound = self._timeout
                # on the worker: compared behind the group's host calls there, or behind its
                # device calls queued there (a communicator's NCCL calls keep their order)
                worker = (checked and (behind or bound is not None)) or nccl.queued > 0
                if bound is None and not worker:
                    if checked:
                        self.verify(call, seq, site)
                    nccl.seq = seq  # (names the call in its release, see NcclBackend)
                    result = call.body(call, data, out, stream)
                    if async_op:
                        return nccl.device_work(call, seq, result, stream, rec)
                    pending = Done(result)
                elif not worker:  # bounded: the host waits for the GPU, at most the
                    # timeout, past which the NCCL communicator is aborted (async_op too:
                    # the watchdog's; see NcclBackend.watched)
                    pending = nccl.watched(
                        call, seq, data, out, stream, None if async_op else bound, bound
                    )
                else:
                    pending = nccl.bounded(
                        self.worker().submit,
                        call,
                        seq,
                        data,
                        out,
                        stream,
                        partial(self.verify, site=site) if checked else None,
                        None if async_op else bound,
                        bound,
                        not behind,
                    )
                    self._slow = True
        except Exception as exc:
            if guard is not None:
                guard.release(None)
            err = (
                exc
                if isinstance(exc, HpccommError)
                else self.failed(call, seq, exc, key, data, out)
            )
            if rec is not None:
                rec.error = err
                record.notify("end", rec)
            self.report(call, seq, err)
            if record.error_hooks:
                record.report_error(err)
            if err is exc:
                raise
            raise err from exc
        # an NCCL call is bounded by its own waits and the watchdog, which abort the NCCL
        # communicator (the Work's own bound came first at times, saying MPI cannot cancel it)
        limit = None if call.mode == "stream" else self._timeout
        work = Work(
            call,
            seq,
            pending,
            timeout=limit,
            watch=watch,
            rec=rec,
            closed=self._is_closed,
            on_failure=on_failure,
            after=None if guard is None else guard.release,
            explain=partial(self.timed_out, call, seq, pending, started),
        )
        if async_op:
            if call.spec.p2p:
                self._p2p.add(work)
            if call.mode == "stream":  # (an async NCCL call compared on the worker returns
                pending.until_enqueued()  # once enqueued, see NcclBackend.bounded; a Ctrl-C
                # here drops the Work)
            return work
        try:
            return work.wait(limit)
        except CommTimeoutError as exc:
            work.disown()
            if withdrawn_receive(call.spec.name, pending):
                # withdrawn: a message sent to it later stays unmatched (see strays)
                self._refused_receive = (
                    self._refused_receive or f"a {call.spec.name} timed out here"
                )
                if rec is not None and call.spec.name != "sendrecv":  # nothing stays
                    # posted (a sendrecv's send may be): its record ends, failed (it
                    # stayed "started", and trace analyze said this rank still waited in
                    # it long after: an outside hunt)
                    rec.error = exc
                    record.notify("end", rec)
                    work._record = None
            raise exc from None  # explained by timed_out, reported, in the Work's wait
        except PeerError as exc:
            work.disown()
            if isinstance(pending, Future):  # the worker stays inside MPI for good
                self.broken = f"the group is unusable: {exc}"
                self._update_slow()
            raise

    def _on_own_worker(self, spec: OpSpec, ex: Executor, args: tuple[Any, Any, Any, Any]) -> None:
        """A plain collective called on this group's worker thread (from a done-callback of
        one of its Works): where it would queue on that worker (a timeout, or calls queued)
        it waits behind the callback running it, for ever: refused (it waited until the
        timeout, whose message then said the calls differed)."""
        if self._timeout is None and not ex.pending:
            return  # it runs inline, here
        g = self.group
        exc = InvalidArgumentError(
            f"{where(spec.name, g.rank, g.size, group=g.name, seq=g.seq + 1)}: called on "
            f"the group's own worker thread (in a done-callback of one of its Works), where "
            f"it would wait behind the callback that runs it; call it from another thread, "
            f"or with async_op=True without waiting for it there"
        )
        self.refused(spec, exc, args)
        raise exc

    def refused(
        self,
        spec: OpSpec,
        exc: BaseException,
        args: tuple[Any, Any, Any, Any] | None = None,
        redop: Any = None,
    ) -> None:
        """A collective refused by validation on this rank takes its sequence number all the
        same (the other ranks may have entered it: their counters moved on too; or they
        refused it too), and the others are told, since they may be waiting in it.

        A peer that entered it may complete it without this rank (a broadcast's root, a
        gather's sender: their messages go out eagerly) and leave messages that this group's
        next call on this rank would match: stale data, silently. So unless the debug check
        ran (every rank compared the call: nobody entered it) this rank's next collective on
        the group first waits (see settle) for every other member's word that it refused the
        call too; without it, or told that one entered the call, the group is unusable on
        this rank (that call and later ones: ClosedError, and the others are told).

        A point-to-point call refused here (``args``: its data, peer, src and tag) takes
        no number (they are not matched across ranks) and tells the ranks it names, whose
        side of it then says so at its timeout (see p2p_whereabouts).

        A refused collective is recorded in its place (``args`` and ``redop`` as given) for
        the flight recorder before the error reaches the error hooks (its dump)."""
        if spec.p2p:
            if record.error_hooks:
                record.report_error(exc)
            if _receives(spec) and self._refused_receive is None:
                self._refused_receive = f"a {spec.name} was refused here ({type(exc).__name__})"
            if args is not None:
                self._tell_p2p_refusal(spec, args, exc)
            return
        self.group.seq += 1
        seq = self.group.seq
        if record.refusal_hooks:
            try:  # (on the error path: nothing here may replace the caller's error)
                site = call_site() if self.debug == "detail" else None
                refusal = Refusal(spec.name, self.group, self.gid, seq, args, redop, exc, site)
            except Exception:  # noqa: BLE001 - an argument whose repr or shape raises
                refusal = Refusal(spec.name, self.group, self.gid, seq, None, None, exc)
            record.note_refusal(refusal)
        if record.error_hooks:
            record.report_error(exc)
        # an object collective at "large": the others are in the comparison, told there
        # (the notice after it: seen first, a bounded peer raised a PeerError instead)
        # object collectives and all_to_all on arrays: compared at "large" too (see prepare)
        objects = self.debug == "large" and (
            spec.objects
            # (a device array's all_to_all runs uncompared, on NCCL or device MPI)
            or (spec.arrays and spec.name == "all_to_all" and on_host(args[0] if args else None))
        )
        # on the group's own worker (a done-callback): the comparison would run on this
        # thread's queue behind itself, so the others are told by the notice alone
        ex = self.executor
        compare = ex is None or ex.ident != _get_ident()
        objects = objects and compare
        # where it joins the others' comparison (below) they learn of the refusal there: a
        # notice sent first was seen first by a bounded peer, whose worker was still on an
        # earlier call, and it raised a PeerError instead of the comparison's MismatchError,
        # made the group unusable and never joined the comparison, where this rank then
        # waited for good without a timeout (hunt AN, 2026-12-05; test_debug's refusal test
        # under coverage); the notice goes out only where the comparison fails
        joins = (self.debug in CHECKING and compare) or objects
        if self.notices is not None and not joins:
            self._post(spec.name, seq, exc, REFUSED)
        g = self.group
        where_ = where(spec.name, g.rank, g.size, group=g.name, seq=seq)
        if self.closed:  # freed here: nothing to agree on (its communicators are gone)
            return
        fp = {"op": spec.name, "seq": seq, "refused": f"{type(exc).__name__}: {exc}"}
        if (self.debug in CHECKING and compare) or objects:
            # it joins the others' comparison, which takes the calls not compared before
            # (see _same): their count restarts here as it does there (it did not: the next
            # barrier compared on this rank alone, while the others went into MPI's barrier,
            # for good; an outside audit, 2026-12-04)
            self._uncompared = 0
        if self.debug in CHECKING and compare:  # the others compare fingerprints: join
            try:
                self.bounded(where_, self.agree, where_, fp)
            except HpccommError:  # (this rank raises its own error) not compared: a peer
                if self.notices is not None:  # that comes later is told by notice
                    self._post(spec.name, seq, exc, REFUSED)
            return
        if objects:  # (compared at "large" too) joined as a refused group creation joins
            # its comparison (where the others never make the call, it waits there for
            # their next compared one)
            self._join_refused(where_, fp)
            if self.notices is not None:
                self._post(spec.name, seq, exc, REFUSED)
            return
        if (
            self.notices is None
            or self.broken is not None
            or g.size == 1
            or isinstance(exc, _CONSEQUENCES)
        ):
            return
        self._expect_refusals(seq, where_, exc)

    def _tell_p2p_refusal(
        self, spec: OpSpec, args: tuple[Any, Any, Any, Any], exc: BaseException
    ) -> None:
        """A point-to-point call refused here (by validation, or in the library before
        anything was sent): the ranks it names are told (without a timeout nobody asks:
        notices nobody receives pile up in MPI). Only a hint for the peer: this rank raises
        its own error whatever happens here."""
        if self.notices is None or self._timeout is None:
            return
        try:
            self._refuse_p2p(spec, args, exc)
        except Exception:  # noqa: BLE001
            pass

    def _refuse_p2p(
        self, spec: OpSpec, args: tuple[Any, Any, Any, Any], exc: BaseException
    ) -> None:
        """Tell the ranks a refused point-to-point call names: the same refusal (rank, way,
        tag, kind) not again within P2P_REFUSAL_GAP seconds unless a retry cleared it, and
        with more than P2P_REFUSALS_KEPT different ones outstanding, one per rank in that
        time (a loop of refused calls sent one notice per call, and a rank that never asks
        kept them all inside MPI: 66 MB for 50,000 in a review)."""
        if self.closed or self.notices is None:
            return
        now = time.monotonic()
        told = []
        outstanding = self._p2p_refused
        for c in p2p_counterparts(self.group, spec.name, *args):
            key = self._refusal_key(c)
            w = key[0]
            if now - outstanding.get(key, -math.inf) < P2P_REFUSAL_GAP:
                continue
            if (
                key not in outstanding
                and len(outstanding) >= P2P_REFUSALS_KEPT
                and now - self._p2p_refused_at.get(w, -math.inf) < P2P_REFUSAL_GAP
            ):
                continue
            if len(outstanding) >= 4 * P2P_REFUSALS_KEPT:  # the oldest go (dicts keep order)
                del outstanding[next(iter(outstanding))]
            outstanding.pop(key, None)
            outstanding[key] = self._p2p_refused_at[w] = now
            told.append((w, c))
        if told:
            self.notices.refuse_p2p(self.gid, self.group.rank, told, f"{type(exc).__name__}: {exc}")

    def _refusal_key(self, c: Counterpart) -> tuple[int, str, int | None, bool]:
        """What identifies a refusal told to a rank: its world rank, way, tag and kind."""
        return (self.members[c.rank], c.way, c.int_tag, c.objects)

    def _cleared_p2p(self, call: Call, data: Any) -> None:
        """A point-to-point call posted here repeats a refused one (a retry): the ranks told
        of that refusal drop it (it no longer explains anything)."""
        items = data if call.spec is BATCH_P2P else None
        done = []
        for c in p2p_counterparts(self.group, call.spec.name, items, call.peer, call.src, call.tag):
            key = self._refusal_key(c)
            if key in self._p2p_refused:
                del self._p2p_refused[key]
                done.append((key[0], c))
        if done and self.notices is not None:
            self.notices.clear_p2p(self.gid, done)

    def refused_creation(self, what: str, exc: BaseException) -> None:
        """A group creation (split, new_group, a layout group) refused on this rank before
        its collective step: it takes the creation's sequence number, as the others do, and
        unless the debug level is "off" joins the creation's comparison with its reason, so
        the others raise a MismatchError naming it (``rank 0 refused it: ...``) instead of
        waiting in the creation for ever (without a timeout) or until the timeout without
        the cause. Every rank of a creation compares first, so the others are in that
        comparison, on the checks' own communicator; it runs on the worker, waited for
        REFUSAL_GRACE seconds at most: where the others are elsewhere (a program out of
        step), this rank still raises its own error, as before, and the comparison waits
        there for their next one. With "off" the others are told by a notice (a PeerError
        where bounded)."""
        if record.error_hooks:
            record.report_error(exc)
        if self.closed:
            return
        group = self.group
        group.seq += 1
        seq = group.seq
        if self.notices is not None:
            self._post(what, seq, exc, REFUSED)
        if self.debug == "off":
            return
        name = where(what, group.rank, group.size, group=group.name, seq=seq)
        fp = {"op": what, "seq": seq, "refused": f"{type(exc).__name__}: {exc}"}
        self._uncompared = 0  # (as collective does: see refused)
        self._join_refused(name, fp)

    def _join_refused(self, name: str, fp: dict[str, Any]) -> None:
        """Join the others' comparison with a refusal's fingerprint, on the worker, waited
        for REFUSAL_GRACE seconds at most: done at once where the others are in it (free()
        then finds nothing running); else it stays queued for their next compared call."""
        fut = self.worker().submit(name, self._agree_refused, name, fp)
        self._slow = True  # later calls queue behind it, in order on the checks' communicator
        bound = REFUSAL_GRACE if self._timeout is None else min(self._timeout, REFUSAL_GRACE)
        fut.wait(bound)

    def _agree_refused(self, name: str, fp: dict[str, Any]) -> None:
        try:
            self.agree(name, fp)
        except HpccommError:
            pass  # this rank raised its own error already

    def refused_late(self, spec: OpSpec, seq: int, exc: BaseException) -> None:
        """A collective from the cache whose library call failed on an argument that
        validation refuses (a read-only array): refused after it took its sequence number
        (and after the debug check, which the others passed: they are inside it). The others
        are told, and its next call settles it (see refused)."""
        if self.notices is None or self.closed or self.broken is not None:
            return
        self._post(spec.name, seq, exc, REFUSED)
        g = self.group
        if g.size > 1:
            self._expect_refusals(seq, where(spec.name, g.rank, g.size, group=g.name, seq=seq), exc)

    def _expect_refusals(self, seq: int, where_: str, exc: BaseException) -> None:
        # settled by the next collective on the group (the error reaches the caller at once)
        self._unsettled.append((seq, where_, type(exc).__name__, time.monotonic()))
        self._slow = True

    def strays(self) -> str | None:
        """Why a message of this group may still come to this rank that none of its calls
        will take (None: no known reason), for free(): a freed communicator's context id
        goes back to MPI, and Open MPI hands a message that arrives for it later to the next
        communicator given the same id (an outside hunt: a broadcast refused here, completed
        by its root, then free() and dup(): the new group's first broadcast received the old
        data, silently; a refused recv alike). The reasons: the group is unusable; a
        refusal some peer has not refused too (one look at the notices, no wait); a
        receive refused here, or a blocking one that timed out with nothing posted. The
        peers' word on a refusal is waited for up to STRAYS_WAIT (a group freed right after
        a refusal every rank made, as ``with comm.dup() as g:`` does, was kept for good when
        their notices had not come yet)."""
        if self.broken is not None:
            return self.broken
        if self._unsettled and self.notices is not None:
            g = self.group
            others = [r for r in range(g.size) if r != g.rank]
            deadline = time.monotonic() + STRAYS_WAIT
            for seq, where_, name, _ in sorted(self._unsettled):
                try:
                    entered, missing = self.notices.refused_by(self.gid, seq, others, deadline)
                except Exception as exc:  # noqa: BLE001 - unknown: keep the communicators
                    return f"{where_} was refused here ({name}); its peers' word: {exc}"
                if entered or missing:
                    return (
                        f"{where_} was refused here ({name}) and rank(s) "
                        f"{entered or missing} did not refuse it"
                    )
        return self._refused_receive

    def settle(self, before: float = math.inf) -> None:
        """Before the next collective after a refusal (on the caller's thread, or on the
        worker before a queued call): did every other member refuse it too? Their notices
        are waited for until the group's timeout after the refusal (without a timeout, as
        long as it takes, saying on stderr after REFUSAL_WAIT whom it waits for); a rank
        that waited inside the call says so when it hears of the refusal. If any entered
        it, or some said nothing in time, the group is unusable here (see refused).
        ``before``: only refusals of calls numbered lower (a call queued before them)."""
        if self.notices is None:
            return
        with self._settling:
            g = self.group
            others = [r for r in range(g.size) if r != g.rank]
            while self.broken is None:
                # the lowest number first (a cached call's late refusal, appended by the
                # worker, may come after a later call's refusal made by the caller)
                below = [u for u in self._unsettled if u[0] < before]
                if not below:
                    break
                entry = min(below)
                seq, where_, name, since = entry
                bound = self._timeout
                entered, missing = self._hear(seq, where_, name, since, others, bound)
                self._unsettled.remove(entry)
                self.notices.forget(self.gid, seq)
                if not entered and not missing:
                    continue
                why = (
                    f"rank(s) {entered} entered it"
                    if entered
                    else f"rank(s) {missing} did not refuse it within {bound:g} s (the "
                    f"timeout): they may have entered it"
                )
                self.broken = (
                    f"the group is unusable: {where_} was refused here ({name}) but {why}, "
                    f"and this group's later calls could match its messages"
                )
            if self.broken is not None:
                self._unsettled.clear()
            self._update_slow()

    def _hear(
        self, seq: int, where_: str, name: str, since: float, others: list[int],
        bound: float | None,
    ) -> tuple[list[int], list[int]]:  # fmt: skip
        """The others' word on refused call ``seq``: (ranks that entered it, ranks silent
        until the bound)."""
        notices = self.notices
        assert notices is not None
        if bound is not None:
            return notices.refused_by(self.gid, seq, others, since + bound)
        entered, missing = notices.refused_by(self.gid, seq, others, since + REFUSAL_WAIT)
        if entered or not missing:
            return entered, missing
        sys.stderr.write(
            f"hpccomm: {where_} was refused here ({name}); this rank's next collective on "
            f"the group waits to hear that every rank refused it too, and rank(s) {missing} "
            f"said nothing for {REFUSAL_WAIT:g} s: they may be inside it (a rank that "
            f"completed it without this one cannot say so); a timeout (init(timeout=...)) "
            f"ends such a wait with an error\n"
        )
        sys.stderr.flush()
        return notices.refused_by(self.gid, seq, others, float("inf"))

    def before_job(self, call: Call, seq: int) -> None:
        """On the worker thread before a queued collective: a refusal found after the call
        was queued (a cached call's library failure) is settled first, and a group made
        unusable by it refuses the call (its peers told) instead of matching the refused
        call's messages."""
        if call.spec.p2p:
            return
        # only refusals numbered before it: a call queued before a refusal comes first (its
        # peers may be inside it, and the refusal's word waited for would never come: they
        # waited for this call, the group unusable at the timeout, and without one for good)
        if self._unsettled and any(u[0] < seq for u in self._unsettled):
            self.settle(before=seq)
        if self.broken is not None:
            raise self._unusable(call.spec.name, seq, call.where(seq))

    def _unusable(self, op: str, seq: int, where_: str, p2p: bool = False) -> ClosedError:
        """The ClosedError of call ``seq`` on a group made unusable; a collective's peers are
        told (one may wait in it), so the error is not reported again (``refused``)."""
        closed = ClosedError(f"{where_}: {self.broken}")
        closed.refused = True
        if not p2p:
            self._post(op, seq, closed, REFUSED)
        return closed

    def report(self, call: Call, seq: int, exc: BaseException, stuck: bool = False) -> None:
        """A collective that failed on this rank: tell the group's other ranks (unless the
        failure is itself the consequence of another rank's: a timeout, a peer's failure).
        ``stuck``: an async call that failed by a peer's notice while its MPI call still runs
        or waits on the worker thread: the group is unusable (as for a plain call, in run()),
        so later calls fail at once instead of queueing behind it until their timeout."""
        if stuck and isinstance(exc, PeerError) and self.broken is None:
            self.broken = f"the group is unusable: {exc}"
            self._update_slow()
        if self.notices is None or call.spec.p2p or getattr(exc, "refused", False):
            return  # (a refusal told the others itself)
        if getattr(exc, "local", False):
            return
        if not isinstance(exc, _CONSEQUENCES):
            kind = BROKE if getattr(exc, "broke", False) else FAILED
            self._post(call.spec.name, seq, exc, kind, mine=_summary(call))
        elif isinstance(exc, PeerError) and exc.told:  # a peer refused it: it learns that
            self._post(call.spec.name, seq, exc, ENTERED)  # this rank took part (settle)

    def _post(
        self, op: str, seq: int, exc: BaseException, kind: str = FAILED, mine: str = ""
    ) -> None:
        """``mine``: this rank's call (shape, dtype, root, op), said to the peers with the
        failure, which say theirs beside it: a call MPI ran with another dtype on one rank
        failed on a peer (MPI_ERR_TRUNCATE), and the others heard only that it failed."""
        if self.notices is None:  # pragma: no cover - callers check
            return
        reason = f"{type(exc).__name__}: {exc}"
        if mine:
            reason += f" [{ITS_CALL}{mine}]"
        try:
            self.notices.post(self.gid, seq, op, self.group.rank, self.members, reason, kind)
        except Exception:  # never hide the real error behind a failed notice
            pass

    # -- debug checks ---------------------------------------------------------------

    def verify(self, call: Call, seq: int, site: str | None = None) -> None:
        """``check``: every rank of the group compares this call's fingerprint before MPI is
        called; a difference raises the same MismatchError on every rank. The fingerprint's
        CRC without the sequence number is kept with the (cached) call.

        The calls the "large" level did not compare when they ran (seq below this one's)
        are compared in the same exchange: their CRCs and sequence numbers, folded into the
        upper half of the compared value. Where they differ, every rank raises a
        MismatchError naming the first that differs (its result, and maybe later ones, may
        be wrong on some ranks: MPI ran it) and this call is not run."""
        self._checking = seq
        same, earlier = self._same(with_seq(_base_crc(call, seq), seq), seq)
        self._checking = 0
        if not same:
            raise self._differ(
                call.where(seq), fingerprint(call, call.spec.name, seq, site), earlier
            )
        if call.spec.name == "all_to_all" and call.uneven:
            self.check_splits(call, call.where(seq))

    def agree(self, where_: str, fp: dict[str, Any]) -> None:
        """One tiny allreduce comparing the fingerprint's CRC (and the calls not compared
        before it, as in verify); the full fingerprints only when they differ (every rank
        learns the same outcome, so all take the same path)."""
        same, earlier = self._same(crc(fp), fp.get("seq", 0))
        if not same:
            raise self._differ(where_, fp, earlier)

    def _same(self, value: int, seq: int) -> tuple[bool, list[tuple[int, Call]]]:
        """Whether every rank passed ``value`` (a 32-bit CRC), the calls not compared before
        call ``seq`` folded into its upper half; and those calls (taken)."""
        earlier = self._take_deferred(seq)
        if earlier:
            value |= self._fold(earlier) << 32
        return self.backend.same_int(value), earlier

    def _take_deferred(self, seq: int) -> list[tuple[int, Call]]:
        """The calls not compared when they ran that come before call ``seq`` (taken: each
        is compared once). Appended by the dispatching thread, taken by the comparing one
        (the caller's, or the worker's for a queued call: later calls stay)."""
        pending = self._deferred
        if not pending or pending[0][0] >= seq:
            return []
        if pending[-1][0] < seq and not on_worker():  # all of them, on the dispatching
            # thread (nothing is appended meanwhile): the common case
            taken = list(pending)
            pending.clear()
            return taken
        taken = []  # on the worker: later calls may be appended meanwhile, and stay
        while pending and pending[0][0] < seq:
            taken.append(pending.popleft())
        return taken

    @staticmethod
    def _fold(earlier: list[tuple[int, Call]]) -> int:
        """31 bits standing for the calls' fingerprints and sequence numbers, in order
        (the hash of a tuple of ints: the same in every process)."""
        seqs, calls = zip(*earlier, strict=True)
        crcs = tuple(map(_CRC_OF, calls))
        if None in crcs:  # first seen here (a cached call keeps its CRC)
            crcs = tuple(_base_crc(call, seq) for seq, call in earlier)
        return hash((seqs, crcs)) & 0x7FFFFFFF

    def _differ(
        self, where_: str, fp: dict[str, Any], earlier: list[tuple[int, Call]] | None = None
    ) -> MismatchError:
        """The fingerprints differ somewhere: gather them all and say how (every rank).
        ``earlier``: the calls not compared when they ran, compared in this exchange too.

        Sequence numbers that differ mean some rank made a call on the group that another
        did not meet in the same place (one made on some ranks only, or one that the
        "large" level did not compare on some rank: a rooted call's message goes out eagerly
        and the call completes there): every later call would differ too, so every rank
        (each gets the same fingerprints) makes the group unusable, saying why, instead of
        raising a MismatchError per call for good."""
        mine = dict(fp)
        if earlier:
            mine["earlier"] = [fingerprint(c, c.spec.name, s) for s, c in earlier]
        fps = self.backend.allgather_object(mine)
        before = earlier_difference(fps, self.large, fp.get("seq", 0))
        unusable = ""
        if before is not None and earlier_left_messages(fps):
            # (every rank has every fingerprint: each makes the group unusable alike)
            unusable = (
                ", and the group is unusable: that call (or another not compared when it ran) "
                "moved other messages on some ranks (another root, size or call), which may be "
                "left unreceived, and the group's later calls would receive them as theirs "
                "(free() it and make another)"
            )
            self.broken = (
                f"the group is unusable: {where_} found that an earlier call differed and may "
                f"have left messages that later calls would receive as theirs: {before}"
            )
            self._update_slow()
        fps = [{k: v for k, v in f.items() if k != "earlier"} for f in fps]
        if before is not None and len({crc(f) for f in fps}) == 1:
            # this call is the same everywhere: an earlier one was not
            err = MismatchError(
                f"{where_}: an earlier call on the group differed across ranks: {before}; "
                f"this call was not run{unusable}{self._world_of()}"
            )
            # every rank raises the same error (each has every fingerprint): no failure
            # notice, which a rank still in the exchange, waiting with a bound, could read
            # first and raise a PeerError instead
            err.local = True
            return err
        said = disagreement(fps)
        if before is not None:
            said = f"{said}; and an earlier call differed too: {before}{unusable}"
        step = out_of_step(fps)
        if step is not None:
            said = (
                f"{said}; {step} (a call made on some ranks only, or one the default level "
                f"did not compare: {self.large:,} bytes or less in every buffer on some rank "
                f"and more on another), so every later call would differ too: the group is "
                f"unusable (free() it and make another; debug='check' on every rank compares "
                f"every call and names the first that differs)"
            )
            self.broken = f"the group is unusable: {where_}: {step}"
            self._update_slow()
        err = MismatchError(f"{where_}: the ranks' calls differ: {said}{self._world_of()}")
        err.local = True  # every rank raises it (see below): no failure notice
        return err

    def _world_of(self) -> str:
        """Where the group's ranks are not the world's: which world ranks they are (a
        comparison names group ranks: "rank 0" on world/dp read as world rank 0, which is not
        in it; an outside hunt)."""
        ranks = list(self.group.world_ranks)
        if ranks == list(range(len(ranks))):
            return ""
        return f" (ranks of {self.group.name}, which are world ranks {ranks} in order)"

    def check_splits(self, call: Call, where_: str) -> None:
        """all_to_all_single: what rank i sends to j must be what j expects from i."""
        sends, expects = call.send_counts[0], call.counts[0]  # elements per peer
        arriving = self.backend.alltoall_ints(sends)
        mine = [
            (j, got, want)
            for j, (got, want) in enumerate(zip(arriving, expects, strict=True))
            if got != want
        ]
        # one 16-byte allreduce says whether every rank found its splits right; the pickled
        # allgather naming them runs only when some did not (it ran on every call: +8-12
        # us per call at 2 ranks, an outside hunt). Equal values on every rank: all take
        # the same path
        if self.backend.same_int(1 if mine else 0) and not mine:
            return
        everyone = self.backend.allgather_object(mine)
        bad = [
            f"rank {j} sends {got} elements to rank {i}, which expects {want}"
            for i, lst in enumerate(everyone)
            for j, got, want in lst
        ]
        if bad:
            raise MismatchError(f"{where_}: the split sizes disagree: {'; '.join(bad)}")

    def bounded(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        late: str = "the debug check did not complete after {t} s; some rank of the group "
        "has not reached this call",
        timeout: Any = None,
        step: tuple[int, str] | None = None,
        some: Sequence[int] = (),
    ) -> Any:
        """Run a small exchange inline, or on the worker with the timeout (not a step of the
        group's sequence: it belongs to the call it checks, or concerns some ranks only);
        ``late`` says what a timeout means; ``timeout``: a bound of its own (seconds)
        instead of the group's; ``step``: the (number, op) of the group's call it checks,
        whose timeout asks the other ranks where they are (whereabouts); ``some``: the
        ranks of an exchange among some ranks only (create_group's list), which answer
        each other's questions while they wait in it and are asked at its timeout."""
        bound = self._timeout if timeout is None else timeout
        ex = self.executor
        if bound is None and (ex is None or not ex.pending):
            return fn(*args)
        fut = self.worker().submit(what, fn, *args)
        self._slow = True
        notices = self.notices if some else None
        if bound is not None and notices is not None:  # answering while it waits
            deadline = time.monotonic() + bound
            while not fut.wait(0) and (left := deadline - time.monotonic()) > 0:
                notices.waits_in(what)
                fut.wait(min(POLL_INTERVAL, left))
        if bound is not None and not fut.wait(0 if notices is not None else bound):
            running = self.worker().running
            queued = running is not None and running is not fut
            behind = (
                f"; it is queued behind {running.what}, which has not completed"
                if running is not None and queued
                else ""
            )  # (not that a rank is missing: every rank may be here, behind a stuck call)
            where_ = ""
            if step is not None:
                where_ = self.whereabouts(step[0], step[1], fut.wait, in_it=not queued)
            elif notices is not None:
                where_ = self.some_whereabouts(what, some, fut.wait, deadline - bound)
            if not fut.wait(0):  # (or it completed while the others were asked)
                raise CommTimeoutError(f"{what}: {late.format(t=f'{bound:g}')}{behind}{where_}")
        fut.wait(None)
        return fut.outcome()

    def failed(
        self,
        call: Call,
        seq: int,
        exc: Exception,
        key: tuple = (),
        data: Any = None,
        out: Any = None,
    ) -> HpccommError:
        """A library error as a BackendError naming the call. When the call came from the
        cache, validation runs again on the actual arrays first, so an array that should have
        been refused (read-only, say) gets its precise error instead."""
        if key:
            self.cache.pop(key, None)
            spec = call.spec
            try:
                self.prepare(
                    spec,
                    data,
                    out,
                    call.peer,
                    call.src,
                    call.tag,
                    call.redop,
                    call.sizes,
                    call.in_splits,
                    call.out_splits,
                )
            except HpccommError as precise:
                precise.refused = True
                if not spec.p2p:
                    self.refused_late(spec, seq, precise)
                return precise
        err = call.backend.error(call, seq, exc)
        if (
            not call.spec.p2p
            and type(err) is BackendError
            and not getattr(err, "local", False)
            and self.broken is None
        ):  # MPI failed inside a collective (MPI_ERR_TRUNCATE: sizes that differ): part of
            # its messages may be left unreceived on some ranks, which the group's next calls
            # would match. Calls queued behind it ran on and returned wrong sums on every
            # rank, with no error (an outside hunt, 4 ranks): the group is unusable here, and
            # its later calls are refused, their peers told
            self.broken = f"the group is unusable: {err}"
            self._failed_in_mpi = True
            err.broke = True  # (its notice says so: a peer past it hears at its next call)
            self._update_slow()
        if call.spec.p2p and isinstance(err, InvalidArgumentError):  # refused in the library,
            # nothing sent (an object that cannot be pickled): its peer is told, as of a
            # refusal by validation (it said only that no message came, at its timeout)
            self._tell_p2p_refusal(call.spec, (data, call.peer, call.src, call.tag), err)
        return err

    def timed_out(
        self,
        call: Call,
        seq: int,
        pending: Any,
        p2p: tuple[float, Any] | None,
        exc: CommTimeoutError,
    ) -> CommTimeoutError:
        """The error of a bounded call that did not complete; says when it waits behind an
        earlier call of the group that is stuck, and, where the group's own bound ran out,
        where the other ranks are (whereabouts; for a point-to-point call, ``p2p``: when
        it began (time.time()) and a batch's ops, where its peers are)."""
        said = str(exc)
        ex = self.executor
        running = ex.running if isinstance(pending, Future) and ex is not None else None
        queued = running is not None and running is not pending
        if running is not None and queued:
            said = f"{said}; it is queued behind {running.what}, which has not completed"
        elif self._checking == seq and self.debug == "large" and call.spec.objects:
            said = (
                f"{said}; this rank waits in the check that compares the call across ranks "
                f"(object collectives are compared at every size): some rank has not reached "
                f"this call, or is in a collective of this group that is not compared (an "
                f"array call of {self.large:,} bytes or less)"
            )
        elif self._checking == seq and self.debug == "large" and call.spec is BARRIER:
            said = (
                f"{said}; this rank waits in the check that compares the group's calls not "
                f"compared when they ran ({self.large:,} bytes or less), which debug "
                f"'large' runs at a barrier: some rank has not reached it, or is in another "
                f"collective of this group"
            )
        elif self._checking == seq and self.debug == "large":
            said = (
                f"{said}; this rank waits in the check that compares the call across ranks, "
                f"which debug 'large' runs for calls with more than {self.large:,} bytes in "
                f"a buffer: a rank with smaller buffers goes straight to MPI, so the ranks' "
                f"sizes may differ (debug='check' on every rank compares every call)"
            )
        if exc.stuck and p2p is not None:
            said += self.p2p_whereabouts(call, *p2p)
        elif exc.stuck and not call.spec.p2p:
            done = pending.wait if isinstance(pending, Future) else None
            said = _every_rank_joined(
                said, self.whereabouts(seq, call.spec.name, done, call, in_it=not queued)
            )
        if said == str(exc):
            return exc
        err = CommTimeoutError(said)
        err.stuck = exc.stuck
        return err

    def whereabouts(
        self,
        seq: int,
        op: str,
        done: Callable[[float], bool] | None = None,
        call: Call | None = None,
        *,
        in_it: bool = True,
    ) -> str:
        """At the timeout of call ``seq`` (``op``): where the group's other ranks are, as
        they answer (NoticeBoard.ask: a rank answers while it waits in a collective with a
        timeout, of any group); "" where there is no one to ask. ``done(0)``: whether the
        call has completed meanwhile (then the asking stops). Where every rank is in this
        call (``call``; ``in_it``: this rank's worker runs it, not queued behind another),
        their fingerprints are compared: arguments that differ in a way MPI does not report
        (small calls are compared only later) are named. Only answers to this question
        count, and the questions of ranks that timed out in this call before this rank
        asked (an older answer says where a rank was, not where it is)."""
        notices = self.notices
        if notices is None or len(self.members) < 2 or len(self.members) > ASK_MAX_RANKS:
            return ""
        mine = fingerprint(call, op, seq) if call is not None and in_it else None
        try:
            since, said = notices.ask(
                self.gid,
                self.members,
                stop=None if done is None else partial(done, 0),
                reached=partial(_reached, seq, op, None if mine is None else crc(mine)),
            )
        except Exception:  # noqa: BLE001 - the timeout is the error; this only explains it
            return ""
        recent = since - (self._timeout or 0.0) - ASK_WAIT  # (older: another call's timeout)
        me = self.members[self.group.rank]
        parts, behind, silent, past = [], [], [], []
        fps: dict[int, dict[str, Any]] = {}
        if mine is not None:
            fps[self.group.rank] = mine
        # the members that told this rank they refused or failed call #seq (a notice that
        # came after this rank's wait ended, while it asked: a refusal of a group made
        # unusable there comes when its settling ends, up to the timeout after the refusal
        # that made it so; said as "completed there", or as no answer, before 2026-12-03)
        told: dict[int, tuple[str, str, str]] = {}
        for nseq, nop, _, nw, reason, kind in list(notices.received.get(self.gid, ())):
            if nseq == seq and kind != ENTERED:
                told.setdefault(nw, (nop, kind, reason))
        for g, w in enumerate(self.members):
            if w == me:
                continue
            who = f"rank {g}" if g == w else f"rank {g} (world rank {w})"
            gone = notices.departed.get(w)
            if w in told:
                nop, kind, reason = told[w]
                verb = "refused" if kind == REFUSED else "failed"
                since_ = "" if gone is None else f", and has left the job since ({gone[1]})"
                parts.append(f"{who} {verb} {nop} #{seq} and will not join it{since_}: {reason}")
                continue
            got = said.get(w)
            fresh = got is not None and (
                got[0] >= since  # an answer to this question
                or (got[2] and got[0] >= recent and (got[1].seq or 0) >= seq)  # its own, here
            )
            if got is None or not fresh:  # (fresh implies got; said for the type checker)
                if gone is None:
                    silent.append(g)
                    continue
                last = gone[0].get(self.gid)
                if last is None:
                    text = "without a call on this group"
                elif last >= seq:  # (a rooted call's sender completes without the others)
                    text = (
                        f"after its call #{last} of this group: its #{seq} completed there "
                        f"without this rank (another call, or a rooted call's sender)"
                    )
                    # its departure notice lists its calls no comparison took: #seq's
                    # arguments beside this rank's (float32 there, float64 here: it was
                    # said as another call, and no rank named the dtype; an outside hunt)
                    kept = notices.unchecked_of.get(w, {}).get(self.gid)
                    theirs = None if kept is None else kept[2].get(seq)
                    if theirs is not None and mine is not None and crc(theirs) != crc(mine):
                        diffs = [
                            f"{k} {theirs.get(k, 'not given')!r} there, "
                            f"{mine.get(k, 'not given')!r} here"
                            for k in sorted((set(theirs) | set(mine)) - {"seq", "site"})
                            if theirs.get(k) != mine.get(k)
                        ]
                        text = (
                            f"after its call #{last} of this group: its #{seq} completed there "
                            f"without this rank, with other arguments ({'; '.join(diffs)}): the "
                            f"calls differ, and its result there may be wrong"
                        )
                else:
                    text = f"after its call #{last} of this group"
                parts.append(f"{who} has left the job ({gone[1]}) {text}")
                continue
            when, place, asked = got
            their, running, waiting = place.seq, place.running, place.waiting
            ahead = _RUN_SEQ.match(running) if running else None
            runs = None if ahead is None else int(ahead.group(1))  # the number its worker runs
            # its worker runs call #seq (later calls of its may wait behind it): this call,
            # or another with this number (it said "reached it and #2 after it" of a rank
            # whose worker ran a split #1 where this rank waits in all_reduce #1)
            in_call = runs == seq and running.startswith(f"{op} #{seq} on ")
            if in_call and place.call is not None and place.call[0] == seq:
                fps[g] = place.call[1]  # (its worker runs this call, not one queued behind)
            # what it made as #seq, where its latest bounded or async call there is #seq
            ran = None if place.call is None or place.call[0] != seq else place.call[1].get("op")
            behind_it = (  # its later calls, queued behind #seq on its worker
                "" if their is None or their <= seq else f"its calls up to #{their} wait behind it"
            )
            if their is None:
                text = _NO_SUCH_GROUP
            elif their < seq:
                behind.append(g)
                text = f"last call of this group #{their}"
                if running:  # (it waits in an earlier call: a root's broadcast completed
                    # alone, or the sizes straddle the "large" level's threshold, an outside
                    # hunt)
                    text += f", its worker runs {running}"
            elif in_call:
                text = "waits in it too"
                if behind_it:
                    text += f" (its worker runs it; {behind_it})"
            elif runs == seq:
                text = f"in {running}, another call with this number: the calls differ"
                if behind_it:
                    text += f" ({behind_it})"
            elif ran is not None and ran != op:
                text = f"its #{seq} is {ran}, another call with this number: the calls differ"
                if their > seq:
                    text += f", and it reached #{their} after it"
                if runs is None or runs > seq:
                    past.append(g)
                if running:
                    text += f", its worker runs {running}"
            else:
                text = "reached it" if their == seq else f"reached it and #{their} after it"
                if runs is None or runs > seq:  # (not #seq queued behind
                    past.append(g)  # an earlier call its worker still runs)
                if running:
                    text += f", its worker runs {running}"
            if waiting and waiting != running:
                text += f", waits in {waiting}"
            if asked and when < since:
                text += f" (it timed out and asked {since - when:.1f} s before this rank)"
            parts.append(f"{who}: {text}")
        if silent:
            parts.append(self._no_answer(silent))
        head = f"rank(s) {behind} have not reached it; " if behind else ""
        tail = ""
        if past and not behind and not silent and len(parts) == len(self.members) - 1:
            # every other rank is in it or past it: it cannot be waiting for one to come
            tail = (
                f"; rank(s) {past} completed call #{seq} while this rank waits in it: the "
                f"calls differ (another root or op: a rooted call's sender or a broadcast's "
                f"root completes without the others), or an earlier call differed"
            )
        listed = [fps[g] for g in range(len(self.members)) if g in fps]
        # every rank in this call (the same op: another op is said above): do they agree?
        if len(listed) == len(self.members) and len({fp["op"] for fp in listed}) == 1:
            if any(crc(fp) != crc(listed[0]) for fp in listed):
                why = {  # why MPI ran calls that differ (at "check" it does not)
                    "large": f"a call of {self.large:,} bytes or less is compared only after "
                    f"MPI ran it",
                    "off": "debug is 'off': calls are not compared",
                }.get(self.debug)
                tail = f"; every rank is in it, but the calls differ: {disagreement(listed)}"
                if why is not None:
                    tail += f" ({why}; debug='check' compares every call before MPI runs it)"
            else:
                tail = (
                    "; every rank is in it with the same arguments: an earlier call may have "
                    "differed (debug='check' compares every call before MPI runs it), or a "
                    "rank is stuck inside MPI"
                )
        return f"; where the other ranks are (asked at the timeout): {head}{'; '.join(parts)}{tail}"

    def _no_answer(self, silent: Sequence[int]) -> str:
        """What an asking says of the ranks of this group that did not answer (with their
        world ranks where those differ)."""
        world = [self.members[g] for g in silent]
        also = "" if world == list(silent) else f" (world rank(s) {world})"
        return f"no answer within {ASK_WAIT:g} s from rank(s) {silent}{also} {_SILENT_WHY}"

    def some_whereabouts(
        self, what: str, ranks: Sequence[int], done: Callable[[float], bool], started: float
    ) -> str:
        """At the timeout of ``what``, an exchange among ``ranks`` of this group only (a
        create_group) that began at ``started`` (time.monotonic()): where the others of them
        are, as they answer (each answers while it waits in such an exchange or in a bounded
        call); one waiting in an exchange of the same kind on this group with another list
        is named so. A rank that timed out in such an exchange since ``started`` and asked
        first is described by its question where its answer no longer says it (it left for
        its exit, or did not answer): with the same timeout everywhere, the first rank's
        question often comes a moment before the second rank's, which then heard only
        "waits in its exit" (an outside flake of a fault test)."""
        notices = self.notices
        g = self.group
        others = [r for r in ranks if r != g.rank]
        if notices is None or not others or len(ranks) > ASK_MAX_RANKS:
            return ""
        try:
            since, said = notices.ask(
                self.gid, [self.members[r] for r in ranks], stop=partial(done, 0)
            )
        except Exception:  # noqa: BLE001 - the timeout is the error; this only explains it
            return ""
        asked = notices.questions.get(self.gid, {})
        mine, _, _ = what.partition(" (rank ")
        kind, _, rest = mine.partition(" ")
        on = rest[rest.find(" on ") :]

        differ = ": the calls differ (every rank listed passes the same ranks and tag)"

        def another(theirs: str) -> bool:
            """Whether ``theirs`` names an exchange of this kind on this group with
            another list (or tag)."""
            return theirs != mine and theirs.startswith(f"{kind} [") and theirs.endswith(on)

        def in_it(place: Any) -> str | None:
            """What a Place waiting in an exchange of this kind on this group says, else
            None."""
            theirs, _, _ = place.waiting.partition(" (rank ")
            if theirs == mine:
                return "in it too"
            return f"in {theirs}{differ}" if another(theirs) else None

        def behind(place: Any) -> str:
            """Where the exchange it waits in is queued behind another call that its
            worker runs: which (its earlier create_group with another list, say, which
            timed out there: "waits in it too" alone misled, an outside review)."""
            run = place.running
            if not run or run == place.waiting:
                return ""
            theirs, _, _ = run.partition(" (rank ")
            return f", queued behind {theirs}, which its worker runs{differ if another(theirs) else ''}"

        parts, silent = [], []
        for r in others:
            w = self.members[r]
            got = said.get(w)
            answer = got[1] if got is not None and got[0] >= since else None  # (its Place)
            now_ = None if answer is None else in_it(answer)
            question = asked.get(w)
            if now_ is None and question is not None and question[0] >= started:
                then = in_it(question[1])
                if then is not None:  # it timed out in such an exchange and asked first
                    text = (
                        f"waited {then}{behind(question[1])} (it timed out and asked "
                        f"{max(0.0, since - question[0]):.1f} s before this rank)"
                    )
                    if answer is not None and answer.waiting:
                        text += f", and waits in {answer.waiting} now"
                    elif answer is not None:
                        text += f", and its last call of this group is #{answer.seq} now"
                    parts.append(f"{g.peer(r)}: {text}")
                    continue
            if answer is None:
                gone = notices.departed.get(w)
                if gone is not None:
                    parts.append(f"{g.peer(r)} has left the job ({gone[1]})")
                else:
                    silent.append(r)
                continue
            if now_ is not None:
                text = f"waits {now_}{behind(answer)}"
            elif answer.waiting:
                text = f"waits in {answer.waiting}{behind(answer)}"
            else:
                text = f"last call of this group #{answer.seq}"
            parts.append(f"{g.peer(r)}: {text}")
        if silent:
            parts.append(self._no_answer(silent))
        return f"; where the other ranks listed are (asked at the timeout): {'; '.join(parts)}"

    def p2p_whereabouts(self, call: Call, started: float, items: Any) -> str:
        """At a point-to-point call's timeout: the refusals its peers told of (a call of
        theirs with this rank, refused there: nothing was posted) from one timeout before
        this call began on, and where each peer is, as it answers (NoticeBoard.ask: a rank
        answers while it waits in a call with a timeout); a receive from any rank asks
        every other member (up to ASK_MAX_RANKS). ``items``: a batch's ops."""
        notices = self.notices
        g = self.group
        named = p2p_counterparts(g, call.spec.name, items, call.peer, call.src, call.tag)
        if not named and _only_itself(call, items, g.rank):  # nobody else to ask or blame
            if (
                call.spec.name == "send_object"
            ):  # (no irecv_object to post first: advice it could not
                # follow, an outside hunt)
                return (
                    "; its peer is this rank itself: an object sent to itself completes only "
                    "where it goes out at once (a small one; this one did not), since there "
                    "is no async receive of objects to post first: pass it on in Python, or "
                    "send an array with isend and irecv"
                )
            return (
                "; its peer is this rank itself: a message to itself is received only by a "
                "receive of its own, so a blocking send to itself needs the receive posted "
                "first (irecv, then send; or isend, then recv), and a receive from itself a "
                "send of its own"
            )
        if notices is None or g.size < 2:
            return ""
        peers = sorted({c.rank for c in named}) or [r for r in range(g.size) if r != g.rank]
        if not named:  # a receive from any rank: from each of them
            objects = call.spec.name.endswith("_object")
            named = [Counterpart(r, "", "recv", call.tag, objects) for r in peers]
        try:
            if len(peers) < ASK_MAX_RANKS:
                since, said = notices.ask(self.gid, [self.members[r] for r in peers])
            else:
                notices.poll(force=True)
                since, said = time.monotonic(), {}
        except Exception:  # noqa: BLE001 - the timeout is the error; this only explains it
            return ""
        hints, parts = [], []
        now = time.time()
        mine: dict[int, list[Counterpart]] = {}
        for c in named:
            mine.setdefault(self.members[c.rank], []).append(c)
        for ref in list(notices.p2p_refusals.get(self.gid, ())):  # (a poll may append)
            theirs = Counterpart(g.rank, ref.what, ref.way, ref.tag, ref.objects)
            if ref.wall >= started - (self._timeout or 0.0) and any(
                matches(theirs, c) for c in mine.get(ref.world_rank, ())
            ):
                hints.append(
                    f"{g.peer(ref.group_rank)} refused {ref.what} {max(0.0, now - ref.wall):.1f} s "
                    f"before this timeout (nothing was sent or posted there): {ref.reason}"
                )
        if items is not None:
            hints += batch_tags(call, items)
        silent = []
        for r in peers:
            got = said.get(self.members[r])
            gone = notices.departed.get(self.members[r])
            freed = notices.freed_by.get(self.gid, {}).get(self.members[r])
            if (got is None or got[0] < since) and gone is not None:
                parts.append(f"{g.peer(r)} has left the job ({gone[1]})")
                continue
            fresh = got is not None and got[0] >= since
            if freed is not None:
                text = f"{g.peer(r)} freed this group (after its collective #{freed})"
                if got is not None and fresh and got[1].waiting:
                    text += f" and waits in {got[1].waiting}"
                parts.append(text)
                continue
            if got is None or not fresh:
                silent.append(g.peer(r))
                continue
            place = got[1]
            if place.seq is None:
                text = _NO_SUCH_GROUP
            else:
                text = f"last collective of this group #{place.seq}"
            if place.running:
                text += f", its worker runs {place.running}"
            if place.waiting and place.waiting != place.running:
                text += f", waits in {place.waiting}"
            parts.append(f"{g.peer(r)}: {text}")
        if silent and len(peers) < ASK_MAX_RANKS:
            parts.append(f"no answer within {ASK_WAIT:g} s from {', '.join(silent)} {_SILENT_WHY}")
        said_ = "".join(f"; {h}" for h in hints)
        if parts:
            said_ += f"; where its peers are (asked at the timeout): {'; '.join(parts)}"
        return said_

    def running_p2p(self) -> list[str]:
        """The point-to-point operations handed out (Works) not yet seen complete (wait(),
        is_completed()). MPI is not asked: a thread of the caller's (torch's point-to-point
        driver) may be waiting on the same request, and MPI forbids two threads on one."""
        running = []
        for _ in range(100):  # (a WeakSet is iterated in Python: another thread's isend
            try:  # meanwhile raised "Set changed size during iteration" in free())
                works = list(self._p2p)
                break
            except RuntimeError:
                continue
        else:
            works = []
        for work in works:
            if work.finished:
                self._p2p.discard(work)
            else:
                running.append(repr(work))
        return running

    def worker(self) -> Executor:
        """The communicator's worker thread (started on first use)."""
        if self.executor is None:
            self.executor = Executor(self.group.name)
        return self.executor

    def collective(
        self, what: str, fn: Callable[..., Any], *args: Any, agree: dict[str, Any] | None = None
    ) -> Any:
        """Run a collective that is not an array operation (split, dup, ...) as one step of
        the group's sequence: inline, or bounded by the timeout on the worker thread. Unless
        the debug level is "off" (these steps are rare: the default "large" checks them too),
        the ranks first compare the op, its sequence number and ``agree`` (e.g. new_group's
        rank list, a layout group's layout and dimensions). Its errors reach the error hooks
        (the flight recorder's dump), as an operation's do."""
        with self.inside(what), record.reported():
            return self._collective(what, fn, *args, agree=agree)

    @contextlib.contextmanager
    def inside(self, what: str) -> Iterator[None]:
        """This thread counted inside a step of the group (``what``) for free() and the exit
        (see calls_elsewhere); dispatch does the same inline (its every call's cost)."""
        me = _get_ident()
        threads = self._threads
        outer = threads.get(me)
        threads[me] = what
        try:
            yield
        finally:
            if outer is None:
                threads.pop(me, None)  # (a fork() child drops the others' entries)
            else:
                threads[me] = outer

    def _collective(
        self, what: str, fn: Callable[..., Any], *args: Any, agree: dict[str, Any] | None = None
    ) -> Any:
        if self.closed:  # (not numbered: the others' next step pairs with this rank's next)
            raise ClosedError(
                f"{what} (rank {self.group.rank} of {self.group.size}): communicator "
                f"{self.group.name} {self.closed_state()}"
            )
        group = self.group
        group.seq += 1
        name = f"{what} #{group.seq} on {group.name} (rank {group.rank} of {group.size})"
        if self._unsettled:
            self.settle()
        if self.broken is not None:
            raise self._unusable(what, group.seq, name)
        if self.debug != "off":
            fp = {"op": what, "seq": group.seq, **(agree or {})}
            if self.debug == "detail":
                fp["site"] = call_site()
            self._uncompared = 0  # (the comparison takes the calls not compared before)
            self.bounded(name, self.agree, name, fp, step=(group.seq, what))
        ex = self.executor
        if self._timeout is None and (ex is None or not ex.pending):
            return fn(*args)
        fut = self.worker().submit(name, fn, *args)
        self._slow = True
        if self._timeout is None:
            fut.wait(None)
        else:
            notices = self.notices
            seq = group.seq
            watch = (
                None
                if notices is None
                else notices.watch(self.gid, seq, lambda: name, self.members)
            )
            done = (
                fut.wait(self._timeout)
                if watch is None
                else (wait_watching(fut, self._timeout, watch))
            )
            if not done:
                where_ = self.whereabouts(seq, what, fut.wait)
                if not fut.wait(0):  # (or it completed while the others were asked)
                    raise CommTimeoutError(
                        _every_rank_joined(
                            f"{name}: not complete after {self._timeout:g} s; some rank of "
                            f"the group has not joined it (MPI cannot cancel it: abort the "
                            f"job)",
                            where_,
                        )
                    )
        try:
            return fut.outcome()
        except HpccommError as exc:
            if not isinstance(exc, _CONSEQUENCES) and not getattr(exc, "local", False):
                self._post(what, group.seq, exc)  # (local: its own peers raise it too)
            raise

    def _is_closed(self) -> bool:
        return self.closed

    def calls_elsewhere(self) -> list[str]:
        """The calls of this group that threads other than this one are inside now (a plain
        call runs on its caller's thread, not the worker's), as dispatch and collective
        count them. free() refuses while one runs (it freed the communicator under a
        blocking recv: a fatal MPI_ERR_COMM; the shared segment under a fast-path
        all_reduce: the peer hung), and exit waits for them. (It read the threads' frames
        before, f_locals of frames other threads were executing: CPython 3.11 does not make
        that safe: a fault run's free() racing another thread's calls segfaulted there once, in
        the interpreter's attribute lookup.)"""
        me = threading.get_ident()
        inside = self._threads.copy()  # (one step under the GIL: other threads change it)
        inside.pop(me, None)
        if not inside:
            return []
        names = {t.ident: t.name for t in threading.enumerate()}
        return [
            f"{what} on {self.group.name} (thread {names.get(ident, ident)})"
            for ident, what in inside.items()
        ]

    def closed_state(self) -> str:
        """Why a closed group takes no call, as its ClosedError says after its name."""
        if self.freed:
            return "already freed"
        return "is being freed by another thread (its free() closed it to new calls)"

    def fence(self) -> bool:
        """Close the group to new calls for a free() that then looks for calls running;
        True where this call closed it (reopen opens it again if that free() is refused)."""
        if self.closed:
            return False
        self.closed = True
        self.cache.clear()
        self._fenced_refusal = False
        return True

    def reopen(self) -> None:
        """A free() that closed the group (fence) was refused: calls are taken again. Not a
        group freed meanwhile (by another thread's free(): its calls reached MPI on the
        freed communicator). A collective refused here meanwhile took its number while its
        peers may be inside it (this rank's next call would pair with theirs: wrong data,
        silently, where not compared): the group is then unusable (a review)."""
        if self.freed:
            return
        self.closed = False
        if self._fenced_refusal and self.broken is None:
            self.broken = (
                "the group is unusable: a collective of it was refused here (ClosedError) "
                "while another thread's free() had closed it, and that free() was refused: "
                "its peers may be inside that call, out of step with this rank"
            )
            self._update_slow()
        self._fenced_refusal = False

    def close(self) -> str | None:
        """Stop the worker thread; returns what is stuck in it, if anything."""
        self.freed = True
        self.closed = True
        self.cache.clear()
        self._slow = True
        if self.shm is not None:
            self.shm.close()  # local: a body still running keeps its mapping
        ex = self.executor
        # (an unusable group's call is stuck for good: a peer failed or refused it)
        if ex is not None and not ex.close(0.1 if self.broken and ex.pending else 5.0):
            return ex.stuck
        return None


# seconds free() waits for the peers' word on a refusal of the group (see strays)
STRAYS_WAIT = 1.0


# roots an object collective's cached call is keyed by (immutable, hashed by value); any
# other object is validated on every call (one whose __hash__ raised ValueError escaped
# raw, and the ranks went out of step: a review)
_PLAIN_ROOTS = frozenset(
    {int, bool, type(None)}
    | {np.dtype(c).type for c in "bBhHiIlLqQ"}  # NumPy's integer scalar types
)


def _summary(call: Call) -> str:
    """A collective call's arguments every rank must pass alike, for a failure notice:
    ``(16,) float32, op SUM`` (shape and dtype where it has data; root; reduce op)."""
    parts = []
    if call.shape is not None and call.info is not None:
        parts.append(f"{call.shape} {call.info.name}")
    if call.spec.root is not None and call.peer is not None:
        parts.append(f"{call.spec.root} {call.peer}")
    if call.redop is not None:  # (the op: PREMUL_SUM's factor is each rank's own)
        parts.append(f"op {str(call.redop).partition('(')[0]}")
    return ", ".join(parts)


def _receives(spec: OpSpec) -> bool:
    """Whether a point-to-point op receives (a message may come to it: see strays)."""
    return spec.p2p and spec.name not in ("send", "send_object")


def _every_rank_joined(said: str, where_: str) -> str:
    """A timeout's text ``said`` followed by where the others are (``where_``): where every
    rank was found in the call, its "some rank of the group has not joined it" goes (the
    text said both, an outside hunt)."""
    if "; every rank is in it" in where_:
        said = said.replace("; some rank of the group has not joined it (", " (", 1)
    return said + where_


# seconds a rank that refused a group creation waits for the others' comparison before it
# raises its error (they are in it, or arrive within it, unless the program is out of step)
REFUSAL_GRACE = 0.5


class _Hold(weakref.ref):
    """An array some async calls hold read-only (a weak reference to it: an id is reused once
    the array is freed): the calls (each named when asked, and whether it writes the array);
    writable again once the last one has released it."""

    __slots__ = ("key", "holders")

    def __new__(cls, array: Any, key: int) -> _Hold:
        return super().__new__(cls, array, _forget)

    def __init__(self, array: Any, key: int) -> None:
        self.key = key  # (weakref.ref's __init__ takes what __new__ took, and does nothing)
        self.holders: list[tuple[Callable[[], str], bool]] = []

    def writes(self) -> bool:
        return any(writes for _, writes in self.holders)


def _forget(hold: _Hold) -> None:
    """An array freed while held (its calls never waited): its entry goes."""
    held = ReadOnlyWhileRunning.held
    if held.get(hold.key) is hold:
        del held[hold.key]


class ReadOnlyWhileRunning:
    """The guard of async calls (every debug level but "off"): while the operation runs, the
    caller's NumPy arrays are read-only (MPI gets writable views of the same memory), so
    writing one before ``wait()`` raises at the write instead of racing with MPI;
    ``release`` restores them and maps the result back to the caller's arrays. An array
    still held so (its call not
    waited for) given to another call is refused there, on every rank alike, where either
    call writes it: handed on read-only, the second call's outcome depended on whether the
    first's wait() ran before the worker reached it. Two calls that only read it (one buffer
    sent to two peers) both hold it: it is writable again once both are done."""

    __slots__ = ("data", "out", "_owned")

    # id of each array held now -> its _Hold (the array weakly: an id is reused once the
    # array is freed)
    held: ClassVar[dict[int, _Hold]] = {}
    # arrays whose release failed: a view of an array another call held read-only then
    # (NumPy makes a view writable only once its base is); retried at every release
    _unreleased: ClassVar[list[Any]] = []

    def __init__(self, data: Any, out: Any, where_: Callable[[], str], writes_data: bool) -> None:
        # (caller's array, what MPI got instead, this call's entry in the array's _Hold)
        self._owned: list[tuple[Any, Any, tuple[Callable[[], str], bool]]] = []
        self.data = self._take(data, where_, writes_data)
        # the same array as both (an in-place form in a group of one): one view for both
        self.out = self.data if out is data else self._take(out, where_, True)

    @staticmethod
    def writes_data(spec: OpSpec, rank: int, peer: Any, data: Any, out: Any) -> bool:
        """Whether the call writes its data argument on this rank: an in-place operation
        (a broadcast's root and a reduce's other ranks only read it), or an output inside
        it (reduce_scatter's in-place form)."""
        if type(data) is _ndarray and type(out) is _ndarray and np.may_share_memory(data, out):
            return True
        if not spec.in_place:
            return False
        root = as_int(peer)
        if spec is BROADCAST:
            return root != rank
        if spec is REDUCE:
            return root is None or root == rank
        return True

    @classmethod
    def refuse_held(cls, data: Any, out: Any, where_: str, writes_data: bool) -> None:
        """Raise if ``data`` or ``out`` is held by an async call not waited for yet and
        either call writes it."""
        for array, arg, writes in ((data, "array", writes_data), (out, "out", True)):
            hold = cls.held.get(id(array)) if type(array) is _ndarray else None
            if hold is not None and hold() is array and (writes or hold.writes()):
                raise InvalidArgumentError(
                    f"{where_}: {arg} is in use by {hold.holders[0][0]()}, an async_op call not "
                    f"waited for yet, expected an array no operation is using; wait() for that "
                    f"call first"
                )

    def _take(self, array: Any, where_: Callable[[], str], writes: bool) -> Any:
        if type(array) is not _ndarray:
            return array
        key, held = id(array), self.held
        entry = (where_, writes)
        hold = held.get(key)
        if hold is not None and hold() is array:  # another call reads it too
            hold.holders.append(entry)
            self._owned.append((array, array, entry))
            return array
        if not array.flags.writeable or not _restorable(array):
            return array
        view = array.view()
        array.flags.writeable = False
        hold = held[key] = _Hold(array, key)
        hold.holders.append(entry)
        self._owned.append((array, view, entry))
        return view

    def release(self, result: Any) -> Any:
        # last taken first: data may be a view of out (an in-place all_gather), which NumPy
        # makes writable again only once out is
        held, waiting = self.held, self._unreleased
        for array, view, entry in reversed(self._owned):
            if result is view:
                result = array
            hold = held.get(id(array))
            if hold is not None and hold() is array:
                hold.holders[:] = [h for h in hold.holders if h is not entry]
                if hold.holders:  # another call still reads it
                    continue
                del held[id(array)]  # the last of its calls: writable again
            elif view is array:  # (never held by this check: nothing to restore)
                continue
            try:
                array.flags.writeable = True
            except ValueError:  # its base is held by another call: once that one is done
                waiting.append(array)
        self._owned = []
        for array in list(waiting):
            try:
                array.flags.writeable = True
            except ValueError:
                continue
            waiting[:] = [a for a in waiting if a is not array]
        return result


_HELD = ReadOnlyWhileRunning.held  # (the class's table: empty unless async calls run)


def _restorable(array: np.ndarray) -> bool:
    """Whether NumPy lets the array be made writable again once made read-only (its rule:
    it owns its memory, or an array it views is writable, or its memory's final owner is
    a writable buffer): not over another library's memory without a buffer interface
    (torch's ``tensor.numpy()``), which the check then leaves writable rather than
    read-only for good."""
    base = array.base
    if base is None or array.flags.owndata:
        return True
    while isinstance(base, _ndarray):
        if base.flags.writeable:
            return True
        if base.base is None or base.flags.owndata:
            return False
        base = base.base
    try:
        return not memoryview(base).readonly
    except TypeError:
        return False


def _run_job(
    call: Call,
    seq: int,
    data: Any,
    out: Any,
    stream: Any,
    check: Callable[[Call, int], None] | None = None,
    fail: Callable[[Exception], HpccommError] | None = None,
    before: Callable[[Call, int], None] | None = None,
    settle: Any = None,
) -> Any:
    """A blocking body on the worker thread (after the debug check, if any): library errors
    become HpccommErrors naming the call (a PeerError when a peer process died), by ``fail``
    where given (the dispatch's: a call from the cache is validated again first). ``settle``:
    a CUDA stream the call's GPU work is done on before it completes (WorkerStreams)."""
    if before is not None:
        before(call, seq)  # a refusal found after this call was queued (Dispatcher.before_job)
    try:
        if check is not None:
            check(call, seq)
        call.backend.seq = seq
        result = call.body(call, data, out, stream)
        if settle is not None:
            settle.synchronize()
        return result
    except HpccommError:
        raise
    except Exception as exc:
        raise (call.backend.error(call, seq, exc) if fail is None else fail(exc)) from exc


def _only_itself(call: Call, items: Any, me: int) -> bool:
    """Whether a point-to-point call names only this rank as its peer (no wildcard)."""
    name = call.spec.name
    if name == "batch_isend_irecv":
        return isinstance(items, (list, tuple)) and all(
            getattr(p, "peer", None) == me for p in items
        )
    if name == "sendrecv":
        return call.peer == me and call.src == me
    return call.peer == me


def _types(value: Any) -> Any:
    """The types of a sizes list's entries (a NumPy array's dtype), for the cache key."""
    if isinstance(value, (list, tuple)):
        return tuple(map(type, value))
    if isinstance(value, np.ndarray):
        return value.dtype
    return type(value)


def _signs(factor: Any) -> Any:
    """The signs of a float or complex factor's parts: -0.0 == 0.0 as keys, so
    PREMUL_SUM(-0.0) after PREMUL_SUM(0.0) ran cached with +0.0 (zeros of the wrong sign,
    against the bits promised; an outside hunt)."""
    if isinstance(factor, (float, np.floating)):
        return math.copysign(1.0, factor)
    if isinstance(factor, (complex, np.complexfloating)):
        return (math.copysign(1.0, factor.real), math.copysign(1.0, factor.imag))
    return None


def _overlap(data: np.ndarray, out: np.ndarray) -> int | None:
    """Where ``data`` starts in bytes from ``out``'s start if they share memory, else None
    (with the arrays' shapes and strides, what validation's overlap checks depend on)."""
    if not np.may_share_memory(data, out):
        return None
    return data.ctypes.data - out.ctypes.data


_UNHASHABLE = object()  # _frozen's answer for what is no list of sizes


def _frozen(value: Any) -> Any:
    """A hashable form of a sizes list (a list, tuple or 1-d array of hashable entries) for
    the cache key, else _UNHASHABLE (such a call is validated, and refused, uncached: a
    dict is not read as its keys, nor a 2-d array as its rows)."""
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 else None
    elif not isinstance(value, (list, tuple)):
        return value if value is None else _UNHASHABLE
    if value is None:
        return _UNHASHABLE
    frozen = tuple(value)
    try:
        hash(frozen)
    except TypeError:
        return _UNHASHABLE
    return frozen
