"""The MPI backend: every operation on host arrays through mpi4py's buffer (uppercase) API,
and the group operations (split, dup, create) on the communicator it owns.

Collectives have one body each, the blocking MPI call (the dispatch runs it inline or on the
communicator's worker thread); point-to-point bodies start MPI's non-blocking calls and return
:class:`Requests`. float16/bfloat16 travel as 2-byte words reduced by cached user-defined ops;
PREMUL_SUM and AVG sum a scaled copy of the input (``ReduceOp.prescale``: AVG's is 1/size).
Python objects go through ``mpi4py.util.pkl5`` (pickle protocol 5, large buffers out of
band).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from pickle import PickleBuffer
from typing import Any, cast

import numpy as np
from mpi4py import MPI
from mpi4py.util import pkl5

from .. import ops as O
from ..buffers import flat
from ..debug import HEADER_WORDS, decode_header, encode_header
from ..dtypes import ARITHMETIC_UFUNCS, SUPPORTED_DTYPES
from ..errors import (
    BackendError,
    ClosedError,
    HpccommError,
    InvalidArgumentError,
    MismatchError,
    PeerError,
)
from ..ops import Call, P2POp
from ..work import ORPHANS, wait_bounded

__all__ = ["MPIBackend", "Requests", "probe_integer_ops", "reduces_on_host"]

_MPI_TYPE_BY_NAME = {
    # bool as bytes: Open MPI's C_BOOL ops take every byte for 0 or 1 (C's _Bool), so a
    # bool array whose bytes are not (np.frombuffer, .view(bool)) came out of LXOR as their
    # bitwise XOR, [2, 1] ^ [1, 2] = [3, 3], True where NumPy's logical XOR is False; on
    # uint8 MPI's logical ops compare with 0, as NumPy does, and give 0 or 1
    "bool": MPI.UINT8_T,
    "int8": MPI.INT8_T,
    "int16": MPI.INT16_T,
    "int32": MPI.INT32_T,
    "int64": MPI.INT64_T,
    "uint8": MPI.UINT8_T,
    "uint16": MPI.UINT16_T,
    "uint32": MPI.UINT32_T,
    "uint64": MPI.UINT64_T,
    "float16": MPI.UINT16_T,  # 2-byte words, reduced by a user-defined op
    "bfloat16": MPI.UINT16_T,
    "float32": MPI.FLOAT,
    "float64": MPI.DOUBLE,
    "complex64": MPI.C_FLOAT_COMPLEX,
    "complex128": MPI.C_DOUBLE_COMPLEX,
}
_MPI_TYPES: dict[np.dtype, MPI.Datatype] = {
    dt: _MPI_TYPE_BY_NAME[info.name] for dt, info in SUPPORTED_DTYPES.items()
}

_BUILTIN_OPS = {
    "SUM": MPI.SUM,
    "AVG": MPI.SUM,
    "PREMUL_SUM": MPI.SUM,
    "PRODUCT": MPI.PROD,
    "MIN": MPI.MIN,
    "MAX": MPI.MAX,
    "BAND": MPI.BAND,
    "BOR": MPI.BOR,
    "BXOR": MPI.BXOR,
}
_BOOL_OPS = {
    "SUM": MPI.LOR,
    "MAX": MPI.LOR,
    "BOR": MPI.LOR,
    "PRODUCT": MPI.LAND,
    "MIN": MPI.LAND,
    "BAND": MPI.LAND,
    "BXOR": MPI.LXOR,
}
_numpy_ops: dict[tuple[np.dtype, str], MPI.Op] = {}


def _numpy_op(dtype: np.dtype, name: str) -> MPI.Op:
    """A user-defined MPI op that combines with the NumPy ufunc on the real dtype: float16 and
    bfloat16 (MPI has no such types; they travel as 2-byte words), and integer ops the MPI
    library gets wrong (see :func:`probe_integer_ops`)."""
    key = (dtype, name)
    op = _numpy_ops.get(key)
    if op is None:
        ufunc = ARITHMETIC_UFUNCS[name]

        def combine(
            inbuf: Any, inoutbuf: Any, datatype: Any, _dt: np.dtype = dtype, _f: Any = ufunc
        ) -> None:
            a = np.frombuffer(inbuf, dtype=_dt)
            b = np.frombuffer(inoutbuf, dtype=_dt)
            with np.errstate(all="ignore"):  # overflow, inf - inf: as MPI's own ops, silent
                _f(a, b, out=b)

        op = _numpy_ops[key] = MPI.Op.Create(combine, commute=True)
    return op


# (op name, dtype) -> MPI op, for every pair with a builtin MPI op; float16/bfloat16 pairs get
# a NumPy op on first use.
_OPS: dict[tuple[str, np.dtype], MPI.Op] = {}
for _dt, _info in SUPPORTED_DTYPES.items():
    if _info.category == "half":
        continue
    for _name, _op in (_BOOL_OPS if _info.category == "bool" else _BUILTIN_OPS).items():
        _OPS[(_name, _dt)] = _op
    if _info.category == "float":
        # MPI's MIN/MAX keep whichever operand the comparison picks, so a NaN on one rank
        # may vanish (the result depends on which rank holds it); NumPy, torch.minimum and
        # torch.maximum propagate NaN, and so does hpccomm: np.minimum / np.maximum, made
        # on first use (by _mpi_op) like the float16/bfloat16 ops.
        del _OPS[("MIN", _dt)], _OPS[("MAX", _dt)]
_probed = False


def probe_integer_ops() -> list[str]:
    """Check MPI's integer SUM and PRODUCT against NumPy's wrap-around and replace every op
    the library gets wrong by a NumPy op; returns the replaced pairs ("SUM uint8", ...).

    Open MPI's vectorised reduction component (op/avx, active in the PyPI wheel) saturates
    8- and 16-bit integer sums (uint8 255 + 2 gives 255, not 1) on every element that falls
    into a full SIMD vector; ``hpccomm.init()`` excludes that component (``OMPI_MCA_op=^avx``)
    when it starts MPI, and this probe covers an MPI that was started before, or another
    library with the same defect. Runs once per process (MPI_Reduce_local, no communication).
    """
    global _probed
    if _probed:
        return []
    _probed = True
    replaced = []
    for dt, info in SUPPORTED_DTYPES.items():
        if info.category != "int":
            continue
        top = np.iinfo(dt).max
        for name, ufunc, a_val, b_val in (
            ("SUM", np.add, top, 3),
            ("PRODUCT", np.multiply, top, 3),
        ):
            # 67 elements: whole SIMD vectors of every width plus a scalar tail.
            a = np.full(67, a_val, dt)
            b = np.full(67, b_val, dt)
            with np.errstate(over="ignore"):
                expect = ufunc(a, b)
            _OPS[(name, dt)].Reduce_local(a, b)
            if not np.array_equal(b, expect):
                _OPS[(name, dt)] = _numpy_op(dt, name)
                if name == "SUM":
                    _OPS[("AVG", dt)] = _OPS[("PREMUL_SUM", dt)] = _OPS[(name, dt)]
                replaced.append(f"{name} {dt.name}")
    return replaced


def reduces_on_host(call: Call) -> bool:
    """True when the call's reduction runs a NumPy op (so its buffers must be host memory)."""
    return call.spec.reducing and _mpi_op(call) in _numpy_ops.values()


def _mpi_op(call: Call) -> MPI.Op:
    name = call.redop.name
    dtype = call.dtype()
    op = _OPS.get((name, dtype))
    return op if op is not None else _numpy_op(dtype, name)


IN_PLACE = MPI.IN_PLACE
MAX_COUNT = 2**31 - 1  # elements in one MPI argument (a C int) without MPI-4 large counts


def _too_many(call: Call) -> bool:
    if call.count > MAX_COUNT:
        return True
    return (
        any(c > MAX_COUNT for c in call.counts[0])
        or any(c > MAX_COUNT for c in call.send_counts[0])
        or _far_block(call) is not None
    )


# the operations whose MPI call takes displacements (C ints too): gather and scatter always
# (MPI_Gatherv, MPI_Scatterv), all_gather and all_to_all with uneven blocks
_DISPLACED = frozenset({"gather", "scatter"})


def _far_block(call: Call) -> tuple[int, int] | None:
    """(rank, displacement) of the first block that starts past MAX_COUNT elements, where
    the call's MPI function takes displacements; None if none does. Each block fitting a C
    int, one starting past one went to MPI, whose MPI_ERR_ARG named nothing (an outside
    hunt: gather, all_gather and all_to_all_single with sizes of 2**30 + 1 int8 rows at 3
    ranks; the job then aborted at exit on the senders' unfinished calls)."""
    if call.spec.name not in _DISPLACED and not (
        call.uneven and call.spec.name in ("all_gather", "all_to_all")
    ):
        return None
    spans = [call.counts[1], call.send_counts[1]]
    if call.spec.name == "gather" and not call.counts[1]:  # not the destination, which
        # refuses it: the same blocks, so every rank refuses alike (not one entering MPI)
        shape = call.shape or ()
        per_row = math.prod(shape[1:]) if shape else 1
        rows = (
            call.sizes if call.sizes is not None else [shape[0] if shape else 1] * call.group.size
        )
        spans.append(list(itertools.accumulate([0, *(r * per_row for r in rows[:-1])])))
    for displs in spans:
        for rank, d in enumerate(displs):
            if d > MAX_COUNT:
                return rank, d
    return None


def _in_pieces(body: Callable[..., Any], call: Call, x: Any, out: Any, stream: Any) -> Any:
    """Run a one-buffer body on consecutive pieces of at most MAX_COUNT elements (views of
    the same memory); a point-to-point body's requests are gathered into one Requests."""
    whole = flat(x)
    pieces = [whole[i : i + MAX_COUNT] for i in range(0, whole.size, MAX_COUNT)]
    results = [body(call.piece(piece.size), piece, None, stream) for piece in pieces]
    if not call.spec.p2p:
        return x
    reqs = [p.req for p in results]
    if call.spec is O.SEND:
        return Requests(call, reqs, None, keep=x)
    if isinstance(results[0], _SelfReceived):  # from itself: each piece a receive of its
        return _All(results, call.peer)  # own, matched in order (see _SelfQueue)
    mt = call.how
    checks = [(i, p.size, mt, f"piece {i} of the receive") for i, p in enumerate(pieces)]
    return Requests(call, reqs, call.peer, checks=checks, keep=x)


_PROC_FAILED = (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)
_NULL = MPI.REQUEST_NULL


def _completed(reqs: list[MPI.Request]) -> bool:
    """Whether MPI has completed (and let go of) every request already. A completed request
    is MPI_REQUEST_NULL, whose test or wait empties its status: tested again (a wait()
    retried after a Ctrl-C that came as MPI returned), the receive's source, tag and count
    read as -1, -1, 0 (a false MismatchError, kept for good)."""
    return all(r == _NULL for r in reqs)


_ANY_SOURCE = MPI.ANY_SOURCE
_ANY_TAG = MPI.ANY_TAG
_mpi_types = _MPI_TYPES


class Requests:
    """Started MPI point-to-point requests (a :class:`~hpccomm.work.Pending`). It holds the
    buffers until completion and checks that every receive got as many elements as its
    buffer holds: MPI accepts a shorter message and leaves the rest of the buffer as it was,
    which hpccomm reports instead of passing on silently."""

    __slots__ = ("reqs", "statuses", "checks", "result", "keep", "call", "seq")

    def __init__(
        self,
        call: Call,
        reqs: list[MPI.Request],
        result: Any = None,
        *,
        checks: Sequence[tuple[int, int, MPI.Datatype, str]] = (),
        keep: Any = None,
    ) -> None:
        self.call = call
        self.seq = 0  # set by the dispatch: the call's sequence number, for messages
        self.reqs = reqs
        self.statuses = [MPI.Status() for _ in reqs]
        self.checks = checks  # (request index, expected count, datatype, what)
        self.result = result
        self.keep = keep  # the arrays MPI reads or writes until completion

    def test(self) -> bool:
        if _completed(self.reqs):  # (tested again, MPI would empty the statuses)
            return True
        try:
            return MPI.Request.Testall(self.reqs, self.statuses)
        except MPI.Exception as exc:
            raise self._status_error(exc) from None

    def wait(self, timeout: float | None) -> bool:
        if timeout is None:
            if _completed(self.reqs):
                return True
            try:
                MPI.Request.Waitall(self.reqs, self.statuses)
            except MPI.Exception as exc:
                raise self._status_error(exc) from None
            return True
        return wait_bounded(self.test, timeout)

    def _status_error(self, exc: MPI.Exception) -> MPI.Exception:
        """MPI_ERR_IN_STATUS names no error: the failing request's status does."""
        if exc.Get_error_class() == MPI.ERR_IN_STATUS:
            for i, st in enumerate(self.statuses):
                code = st.Get_error()
                if code not in (MPI.SUCCESS, MPI.ERR_PENDING):
                    err = MPI.Exception(code)
                    for at, expected, _, what in self.checks:  # which receive (a batch's)
                        if at == i:
                            err.part = (  # type: ignore[attr-defined]
                                f" ({what}: {expected:,} elements for "
                                f"{self.call.group.peer(st.Get_source())}'s message, tag "
                                f"{st.Get_tag()})"
                            )
                    return err
        return exc

    def outcome(self) -> Any:
        self.keep = None
        for i, expected, mt, what in self.checks:
            st = self.statuses[i]
            got = st.Get_count(mt)
            if got != expected:
                raise MismatchError(
                    f"{self.call.where(self.seq)}: {what} got {_received(st, mt, got)} from {self.call.group.peer(st.Get_source())} (tag "
                    f"{st.Get_tag()}), expected {expected} (the buffer's size); the sender sent "
                    f"a shorter message and the rest of the buffer is unchanged"
                )
        result = self.result
        return result(self.statuses) if callable(result) else result


def _source_tag(call: Call) -> tuple[int, int]:
    """A receive's source and tag, None as MPI's wildcards."""
    src = _ANY_SOURCE if call.peer is None else call.peer
    return src, (_ANY_TAG if call.tag is None else call.tag)


class _Sent:
    """One started send (the common case, kept lean): done when MPI may reuse the buffer."""

    __slots__ = ("req", "keep", "seq")

    def __init__(self, req: MPI.Request, keep: Any) -> None:
        self.req = req
        self.keep = keep
        self.seq = 0

    def test(self) -> bool:
        return self.req.Test()

    def wait(self, timeout: float | None) -> bool:
        if timeout is None:
            self.req.Wait()
            return True
        return wait_bounded(self.req.Test, timeout)

    def outcome(self) -> None:
        self.keep = None


class _Received:
    """One started receive: returns the source rank; a message shorter than the buffer is a
    MismatchError naming sender, tag and both sizes."""

    __slots__ = ("req", "status", "keep", "call", "mt", "seq", "count")

    def __init__(self, call: Call, req: MPI.Request, keep: Any, mt: MPI.Datatype) -> None:
        self.call = call
        self.req = req
        self.status = MPI.Status()
        self.keep = keep
        self.mt = mt
        self.seq = 0
        self.count = keep.size  # the buffer's elements

    def test(self) -> bool:
        req = self.req
        return req == _NULL or req.Test(self.status)  # (see _completed)

    def wait(self, timeout: float | None) -> bool:
        if timeout is None:
            if self.req != _NULL:
                self.req.Wait(self.status)
            return True
        return wait_bounded(self.test, timeout)

    def outcome(self) -> int:
        self.keep = None
        st = self.status
        got = st.Get_count(self.mt)
        expected = self.count
        if got != expected:
            raise MismatchError(
                f"{self.call.where(self.seq)}: the receive got {_received(st, self.mt, got)} from "
                f"{self.call.group.peer(st.Get_source())} (tag {st.Get_tag()}), expected {expected} (the buffer's "
                f"size); the sender sent a shorter message and the rest of the buffer is unchanged"
            )
        return st.Get_source()


def _received(st: Any, mt: Any, got: int) -> str:
    """What a receive got, in words: ``got`` elements of ``mt``, or where the message is not
    a whole number of them (MPI_Get_count is MPI_UNDEFINED: it was printed as -32766
    elements) its size in bytes."""
    if got != MPI.UNDEFINED:
        return f"{got} elements"
    nbytes = st.Get_count(MPI.BYTE)
    return f"{nbytes:,} bytes (not a whole number of its {mt.Get_size()}-byte elements)"


class _ProbedRecv(_Received):
    """A blocking receive: the message is matched first (MPI_Mprobe, or MPI_Improbe polled
    under a timeout), its size compared with the buffer, and only then received. A posted
    receive cannot do this: above the eager limit Open MPI's single-copy transport copies a
    longer message whole, past the end of the buffer, before it reports MPI_ERR_TRUNCATE
    (README "Failures"). Here a longer message is received into scratch memory and dropped,
    and the call raises a MismatchError naming sender, tag and both sizes; the buffer is
    unchanged. Not for async receives: a receive must be posted when the call returns, or
    two ranks that each irecv and then send a large message would wait for each other."""

    __slots__ = ("comm", "src", "tag", "longer", "matched", "done")

    def __init__(
        self, call: Call, comm: MPI.Comm, x: np.ndarray, mt: MPI.Datatype, src: int, tag: int
    ) -> None:
        super().__init__(call, MPI.REQUEST_NULL, x, mt)
        self.comm = comm
        self.src = src
        self.tag = tag
        self.longer = 0  # bytes of a message too long for the buffer (dropped)
        # MPI sets a completed request to MPI_REQUEST_NULL, whose Test empties the status:
        # the state is kept here
        self.matched = False
        self.done = False

    @property
    def posted(self) -> bool:
        """Whether MPI holds the buffer now (a matched message being received): until a
        message is matched nothing is posted, and a receive that timed out then is over."""
        return self.matched and not self.done

    def _fits(self, msg: MPI.Message) -> bool:
        """Whether the matched message fits the buffer; if not, it is received into
        scratch memory (and so taken off the queue) and dropped."""
        self.matched = True
        size = self.status.Get_elements(MPI.BYTE)  # (Get_count is MPI_UNDEFINED from 2 GiB)
        if 0 <= size <= self.count * self.mt.Get_size():
            return True
        try:
            scratch = np.empty(size, np.uint8)
        except MemoryError:
            raise MismatchError(
                f"{self.call.where(self.seq)}: the receive matched a message of {size:,} bytes "
                f"from {self.call.group.peer(self.status.Get_source())} (tag {self.status.Get_tag()}), longer "
                f"than the buffer's {self.count * self.mt.Get_size():,} bytes, and there is not "
                f"enough memory to receive and drop it: the message stays matched and "
                f"unreceived (its sender may wait for it until its timeout); the buffer is "
                f"unchanged"
            ) from None
        msg.Recv([scratch, MPI.BYTE])
        self.longer = size
        return False

    def test(self) -> bool:
        if self.done:
            return True
        if not self.matched:
            msg = self.comm.Improbe(self.src, self.tag, self.status)
            if msg is None:
                return False
            if not self._fits(msg):
                self.done = True
                return True
            self.req = msg.Irecv([self.keep, self.mt])
        self.done = self.req == _NULL or self.req.Test(self.status)
        return self.done

    def wait(self, timeout: float | None) -> bool:
        if timeout is not None:
            return wait_bounded(self.test, timeout)
        if self.done:
            return True
        if self.matched:
            if self.req != _NULL:
                self.req.Wait(self.status)
        else:
            msg = self.comm.Mprobe(self.src, self.tag, self.status)
            if self._fits(msg):
                msg.Recv([self.keep, self.mt], self.status)
        self.done = True
        return True

    def outcome(self) -> int:
        if self.longer:
            self.keep = None
            st = self.status
            item = self.mt.Get_size()
            n = self.count
            raise MismatchError(
                f"{self.call.where(self.seq)}: the receive matched a message of "
                f"{self.longer // item:,} elements ({self.longer:,} bytes) from "
                f"{self.call.group.peer(st.Get_source())} (tag {st.Get_tag()}), longer than the buffer's {n:,} "
                f"elements ({n * item:,} bytes); the message was received into scratch memory "
                f"and dropped, the buffer is unchanged"
            )
        return super().outcome()


class _SelfQueue:
    """This rank's receives from itself on one communicator, in the order they were posted,
    matched only when one of them is tested or waited for (only this process's own sends
    can match them). A posted receive cannot be used: Open MPI 5.0.11's self transport cut
    a longer message to a receive posted before the send without an error up to its eager
    limit (btl_self_eager_limit, 1,024 bytes: an Irecv of 2 doubles from itself, then a
    send of 6, gave the first 2), and above it copied the whole message past the end of the
    buffer (an outside hunt: an irecv of 2 doubles, then a send of 70,000, segfaulted or
    hung; 130-8,000 raised MPI_ERR_TRUNCATE and the heap was corrupt, a segfault at exit).
    Matched here, a message's size is known before any data moves, as a blocking receive's
    is (_ProbedRecv). The order is MPI's: a receive takes a message only when no receive
    posted before it that could take that message (the same tag, or any tag) is waiting, so
    two receives with one tag get the messages in the order they were sent. Matched when a
    receive is posted and when this rank has posted a send to itself, as MPI matches: a
    blocking send to itself above the eager limit, after an irecv from itself, waits for
    its receive to be matched."""

    __slots__ = ("comm", "lock", "waiting", "closed")

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.lock = threading.Lock()
        self.waiting: list[_SelfReceived] = []
        self.closed = False

    def _first_free(self, src: int, blocked: set[int]) -> bool:
        """Whether the first message waiting from ``src`` (in the order sent) has a tag no
        earlier receive still waiting holds (``blocked``): an any-tag receive may take it.
        (An any-tag receive waited for good behind an earlier one of another tag, though
        MPI gives it the message: review AJ.) A message of a held tag goes to that receive
        at the next match, and the any-tag one looks again then."""
        if not blocked:
            return True
        status = MPI.Status()
        if not self.comm.Iprobe(src, _ANY_TAG, status):
            return False
        return status.Get_tag() not in blocked

    def close(self) -> None:
        """The group is freed: the receives still waiting (of Works dropped unwaited:
        free() refuses while others run) will never be matched, and are over (probed on
        the freed communicator, MPI_Improbe aborted the job: MPI_ERR_COMM)."""
        with self.lock:
            self.closed = True
            for r in self.waiting:
                r.done = r.abandoned = True
            self.waiting = []

    def add(self, receive: _SelfReceived) -> None:
        """Queue a receive just posted, and match it at once if its message is there."""
        with self.lock:
            self.waiting.append(receive)
        self.match()

    def withdraw(self, receive: _SelfReceived) -> bool:
        """Take ``receive`` off the queue if no message has matched it yet (returns whether
        it was taken off: then no message is or will be received into its buffer)."""
        with self.lock:
            if receive.matched:
                return False
            self.waiting = [r for r in self.waiting if r is not receive]
            return True

    def match(self) -> None:
        """Match what messages this rank has sent itself to the waiting receives, in order."""
        with self.lock:
            if self.closed:
                return
            left: list[_SelfReceived] = []
            blocked: set[int] = set()  # tags a receive still waiting before holds
            waiting = self.waiting
            i = 0
            try:
                for i, r in enumerate(waiting):  # noqa: B007 - (i: see finally)
                    if (
                        _ANY_TAG in blocked
                        or r.tag in blocked
                        or (r.tag == _ANY_TAG and not self._first_free(r.src, blocked))
                    ):
                        left.append(r)
                        blocked.add(r.tag)
                        continue
                    msg = self.comm.Improbe(r.src, r.tag, r.status)
                    if msg is None:
                        left.append(r)
                        blocked.add(r.tag)
                    else:
                        r.take(msg)
                i = len(waiting)
            finally:  # (an error in one: the rest stay, the matched ones go)
                self.waiting = left + [r for r in waiting[i:] if not r.matched]


class _SelfReceived(_ProbedRecv):
    """A receive from this rank itself (see _SelfQueue): matched in order when tested or
    waited for; a longer message is received into scratch memory and dropped (a
    MismatchError, the buffer unchanged), a shorter one is a MismatchError as from any
    rank. ``blocking``: a blocking recv or sendrecv, which a timeout withdraws (nothing
    stays posted, as for a blocking receive from another rank); an async one stays in the
    queue, as a posted receive stays posted."""

    __slots__ = ("queue", "what", "blocking", "abandoned", "ready")

    def __init__(
        self, call: Call, queue: _SelfQueue, x: Any, mt: MPI.Datatype, src: int, tag: int,
        what: str = "the receive", *, blocking: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(call, queue.comm, x, mt, src, tag)
        self.queue = queue
        self.what = what
        self.blocking = blocking
        self.abandoned = False  # its group freed before a message matched it
        # set last by take(), once the message's receive is posted (or it is dropped):
        # "matched" is set first, and a test() on another thread between the two took the
        # empty request for a completed receive (wrong data, silently: review AJ)
        self.ready = False
        queue.add(self)

    @property
    def posted(self) -> bool:
        """Whether a message sent to itself later may still be received into the buffer."""
        return not self.done

    def take(self, msg: MPI.Message) -> None:
        """The message the queue matched to this receive."""
        if self._fits(msg):
            self.req = msg.Irecv([self.keep, self.mt])
        else:
            self.done = True
        self.ready = True

    def test(self) -> bool:
        if self.done:
            return True
        if not self.ready:
            self.queue.match()
            if not self.ready or self.done:
                return self.done
        self.done = self.req == _NULL or self.req.Test(self.status)
        return self.done

    def wait(self, timeout: float | None) -> bool:
        done = wait_bounded(self.test, math.inf if timeout is None else timeout)
        if not done:
            self.timed_out()
        return done

    def timed_out(self) -> None:
        """A blocking receive's timeout withdraws it (nothing stays posted, as for a
        blocking receive from another rank); an async one stays, as a posted one would."""
        if self.blocking and self.queue.withdraw(self):
            self.done = True  # (its Work is over)

    def withdraw(self) -> None:
        """Off the queue (a batch that failed to post); one matched already completes."""
        if not self.queue.withdraw(self) and not self.done:
            self.req.Wait(self.status)
            self.done = True

    def outcome(self) -> int:
        if self.abandoned:
            self.keep = None
            raise ClosedError(
                f"{self.call.where(self.seq)}: the group was freed before a message from this "
                f"rank itself matched {self.what}"
            )
        if self.longer:
            self.keep = None
            n = self.count
            raise MismatchError(
                f"{self.call.where(self.seq)}: {self.what} matched a message from this rank "
                f"itself (tag {self.status.Get_tag()}) of {self.longer:,} bytes, longer than the "
                f"buffer's {n:,} elements ({n * self.mt.Get_size():,} bytes); it was received "
                f"into scratch memory and dropped, the buffer is unchanged"
            )
        return super().outcome()


# Set once this process has raised a PeerError (a process failure or a peer's revoke, under
# ULFM): at exit it then leaves as a survivor, without MPI_Finalize, even when MPI has not
# told it which rank failed (a rank released by a peer's revoke may never hear of it).
peer_failure_seen = False


def failed_in(comm: MPI.Comm) -> list[int] | None:
    """The ranks of ``comm`` MPI knows to have failed, sorted (ULFM's MPI_Comm_get_failed,
    available when the job runs with ``mpiexec --with-ft ulfm``; empty without a failure or
    without that option); None where the MPI lacks the calls."""
    try:
        failed = comm.Get_failed()
        try:
            n = failed.Get_size()
            if n == 0:
                return []
            mine = comm.Get_group()
            try:
                return sorted(MPI.Group.Translate_ranks(failed, list(range(n)), mine))
            finally:
                mine.Free()
        finally:
            failed.Free()
    except Exception:  # pragma: no cover - an MPI without ULFM's calls
        return None


def _world_ranks(comm: MPI.Comm, ranks: list[int]) -> list[int] | None:
    """The ranks in MPI_COMM_WORLD of ``comm``'s ``ranks`` (as :func:`failed_in` gives
    them), for messages; None where MPI cannot say (a freed communicator)."""
    try:
        mine, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
        try:
            return list(MPI.Group.Translate_ranks(mine, ranks, world))
        finally:
            mine.Free()
            world.Free()
    except Exception:  # pragma: no cover - a freed communicator: the group's ranks only
        return None


_CODES = {dt: i for i, dt in enumerate(SUPPORTED_DTYPES)}  # dtype <-> number in a header
_DTYPES = list(SUPPORTED_DTYPES)


# tags of checked data messages: MPI guarantees tags up to 32767 everywhere (the least
# cycle); a group uses the odd ones of all its MPI allows (MPI_TAG_UB; Open MPI's is
# 2**31 - 1; the even ones are create_group's), so a tag is unique per sender among its last
# 2**30 checked sends.
_DATA_TAGS = 32768


class _CheckedRecv:
    """A receive under the debug check: the sender's header (op sequence, dtype, shape) comes
    first; the data is received only into a buffer that matches it, else into a scratch
    buffer of the sender's description (so the message is consumed) and the receive fails
    with a MismatchError naming the sender.

    The data travels on a communicator of its own with the tag the header names (unique
    per sender): with data and header on one communicator and tag, a second receive
    posted for the same source and tag took the first message's data for its header
    (two irecvs outstanding, or a blocking receive retried after a timeout: the data of a
    large message was then written into the 128-byte header buffer and the process
    crashed). ``blocking``: a receive whose header has not arrived when its wait times
    out cancels its header receive, so nothing stays posted."""

    __slots__ = (
        "data",
        "blocking",
        "cancelled",
        "mpi",
        "call",
        "buf",
        "what",
        "tag",
        "header",
        "hreq",
        "hstatus",
        "dreq",
        "dstatus",
        "error",
        "seq",
        "result",
    )

    def __init__(self, mpi: MPI.Intracomm, data: MPI.Intracomm, call: Call, buf: np.ndarray,
                 src: int, tag: int, what: str, blocking: bool = False) -> None:  # fmt: skip
        self.mpi, self.call, self.buf, self.what = mpi, call, buf, what
        self.data, self.blocking, self.cancelled = data, blocking, False
        self.tag = tag
        self.header = np.zeros(HEADER_WORDS, np.int64)
        self.hstatus = MPI.Status()
        self.hreq = mpi.Irecv([self.header, MPI.INT64_T], src, tag)
        self.dreq: MPI.Request | None = None
        self.dstatus = MPI.Status()
        self.error: str | None = None
        self.seq = 0
        self.result: Any = None

    def _start_data(self) -> None:
        src = self.hstatus.Get_source()
        self.result = src
        head = decode_header(self.header)
        buf = self.buf
        if head is None:
            self.error = (
                f"{self.what} got a message from {self.call.group.peer(src)} without hpccomm's debug header: "
                f"the sender does not run with debug checks (set the same level everywhere)"
            )
            self.dreq = MPI.REQUEST_NULL  # that message was the data: nothing more to take
            return
        seq, code, count, shape, data_tag = head
        dtype = _DTYPES[code] if 0 <= code < len(_DTYPES) else None
        if dtype != buf.dtype or count != buf.size:
            sent = f"{dtype.name if dtype is not None else code} {shape}"
            self.error = (
                f"{self.what} expects {buf.dtype.name} {tuple(buf.shape)} ({buf.size} "
                f"elements), but {self.call.group.peer(src)} sent {sent} ({count} elements) with its "
                f"point-to-point call #{seq}; the buffer was not written"
            )
            scratch = np.empty(count, dtype if dtype is not None else np.uint8)
            buf = scratch
        self.dreq = self.data.Irecv([buf, _mpi_types[buf.dtype]], src, data_tag)

    @property
    def posted(self) -> bool:
        """Whether MPI may still write this receive's buffers (header or data posted)."""
        return not self.cancelled and not (self.dreq is not None and self.dreq == MPI.REQUEST_NULL)

    def cancel(self) -> bool:
        """Withdraw the header receive if no header has matched it; True when withdrawn
        (nothing of this receive stays posted). A header that arrived meanwhile is taken
        (its data receive posted) and False returned."""
        if self.dreq is not None:
            return False
        self.hreq.Cancel()
        self.hreq.Wait(self.hstatus)
        if self.hstatus.Is_cancelled():
            self.cancelled = True
            return True
        self._start_data()
        return False

    def test(self) -> bool:
        if self.cancelled:
            return True
        if self.dreq is None:
            if self.hreq != _NULL and not self.hreq.Test(self.hstatus):
                return False
            self._start_data()
        dreq = self.dreq
        return dreq is not None and (dreq == _NULL or bool(dreq.Test(self.dstatus)))

    def wait(self, timeout: float | None) -> bool:
        if timeout is not None:
            done = wait_bounded(self.test, timeout)
            if not done and self.blocking:
                self.cancel()
            return done
        if self.dreq is None:
            if self.hreq != _NULL:
                self.hreq.Wait(self.hstatus)
            self._start_data()
        if self.dreq is not None and self.dreq != _NULL:
            self.dreq.Wait(self.dstatus)
        return True

    def outcome(self) -> Any:
        if self.error is not None:
            raise MismatchError(f"{self.call.where(self.seq)}: {self.error}")
        return self.result


def _withdraw(req: MPI.Request) -> None:
    """Cancel a posted receive of a batch that failed to post (one that a message has
    matched meanwhile completes: its data is in the buffer, which the caller was told
    nothing of; the next receive does not lose a message to it)."""
    try:
        req.Cancel()
        req.Wait()
    except MPI.Exception:  # pragma: no cover - a receive MPI cannot cancel
        pass


def _abandon(call: Call, seq: int, parts: list[Any]) -> None:
    """A checked batch that failed while posting: its receives' header receives are
    withdrawn; what MPI may still use (a data receive whose header had matched, the sends)
    is kept in ORPHANS until MPI is done with it, so no buffer is freed under MPI."""
    for part in parts:
        if isinstance(part, _CheckedRecv):
            try:
                part.cancel()
            except MPI.Exception:  # pragma: no cover - e.g. a revoked communicator
                pass
    for part in parts:
        if getattr(part, "posted", True) and not _test_quietly(part):
            ORPHANS.append((part, f"{call.where(seq)}: part of a batch that failed"))


def _test_quietly(part: Any) -> bool:
    try:
        return bool(part.test())
    except Exception:  # pragma: no cover - its error has nowhere to go: the batch failed
        return True


class _All:
    """Several pendings as one (a checked sendrecv or batch)."""

    __slots__ = ("parts", "result", "_seq")

    def __init__(self, parts: list[Any], result: Any) -> None:
        self.parts, self.result, self._seq = parts, result, 0

    @property
    def seq(self) -> int:
        return self._seq

    @seq.setter
    def seq(self, value: int) -> None:
        self._seq = value
        for p in self.parts:
            p.seq = value

    def test(self) -> bool:
        return all([p.test() for p in self.parts])

    def wait(self, timeout: float | None) -> bool:
        if timeout is not None:
            done = wait_bounded(self.test, timeout)
            if not done:  # a blocking checked sendrecv's receive withdraws its header
                for p in self.parts:  # receive, as a checked recv's (else it took the
                    if isinstance(p, _CheckedRecv) and p.blocking:  # next message)
                        p.cancel()
                    elif isinstance(p, _SelfReceived):  # (a blocking one is withdrawn)
                        p.timed_out()
            return done
        for p in self.parts:
            p.wait(None)
        return True

    def outcome(self) -> Any:
        for p in self.parts:
            p.outcome()
        return self.result


def _pickle_stage(exc: BaseException) -> str | None:
    """Where an object transfer failed: "dumps" (pickling, before anything was sent),
    "loads" (unpickling what was received) or None (MPI), from pkl5's frames in the
    traceback."""
    names = set()
    tb = exc.__traceback__
    while tb is not None:
        names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    if names & {"_pickle_loads", "loads_oob"}:
        return "loads"
    if names & {"_pickle_dumps", "dumps_oob"}:
        return "dumps"
    return None


def _unpickle(data: Any, *bufs: Any) -> Any:
    """What a _Pickled stands for, on the receiving rank (its parts: pkl5's own form)."""
    return pkl5.pickle.loads_oob(data, list(bufs))


class _Pickled:
    """An object of a collective pickled before the call (pkl5's form: the pickle and its
    out-of-band buffers), so that one that cannot be pickled is refused before the ranks'
    comparison and before anything is sent (Dispatcher: it refused the call on every rank,
    where it hung the others in MPI, or a scatter_object had sent the first ranks their
    objects). pkl5 then pickles only this wrapper: its parts go as out-of-band buffers
    (PickleBuffer; small ones in-band, as pkl5 does), and the receiver gets the object."""

    __slots__ = ("bufs", "data")

    def __init__(self, obj: Any) -> None:
        self.data, self.bufs = pkl5.pickle.dumps_oob(obj)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, tuple[Any, ...]]:
        bufs = (PickleBuffer(cast(Any, b)) for b in self.bufs)  # (mpi4py buffers)
        return _unpickle, (PickleBuffer(self.data), *bufs)


class _ObjectRecv:
    """A pending ``recv_object``: probes until a message matches, then receives it."""

    __slots__ = ("comm", "source", "tag", "value", "done", "seq")
    posted = False  # nothing is posted before a message matches, and then received at once

    def __init__(self, comm: pkl5.Intracomm, source: int, tag: int) -> None:
        self.comm, self.source, self.tag = comm, source, tag
        self.value: Any = None
        self.done = False

    def test(self) -> bool:
        if not self.done:
            msg = self.comm.improbe(self.source, self.tag)
            if msg is not None:
                self.value = msg.recv()
                self.done = True
        return self.done

    def wait(self, timeout: float | None) -> bool:
        if timeout is None:
            if not self.done:
                self.value = self.comm.recv(None, self.source, self.tag)
                self.done = True
            return True
        return wait_bounded(self.test, timeout)

    def outcome(self) -> Any:
        return self.value


class _ObjectSend:
    """A pending ``send_object`` (pkl5's non-blocking send)."""

    __slots__ = ("req", "seq")

    def __init__(self, req: Any) -> None:
        self.req = req

    def test(self) -> bool:
        return bool(self.req.test()[0])

    def wait(self, timeout: float | None) -> bool:
        if timeout is None:
            self.req.wait()
            return True
        return wait_bounded(self.test, timeout)

    def outcome(self) -> Any:
        return None


# Open MPI 5.0.11's single-copy path (smsc/cma, messages above the eager limit) copies a
# truncated message whole, past the receive buffer: measured, an 8 MiB send into a 4 MiB
# receive wrote 4 MiB beyond it (a segfault where that memory is unmapped). Within the eager
# limit the cut is clean; debug "large" keeps longer collective messages from mismatching.
_TRUNCATED = (
    "the sender's message was longer than this rank's buffer: a size that differs across "
    "ranks (debug='check' names it before MPI is called)"
)
# a collective's: its message may be another call's (an outside hunt: a rank that skipped an
# all_reduce of 4 met its peer's with its next one, of 3, and was told only of sizes)
_TRUNCATED_COLLECTIVE = (
    "the sender's message was longer than this rank's buffer: a size that differs across "
    "ranks, or ranks out of step (one skipped a call or made the calls in another order, and "
    "this call met another) (debug='check' names either before MPI is called)"
)
_TRUNCATED_P2P = (
    "; a message above Open MPI's eager limit may have been copied past the buffer by its "
    "single-copy transport: end the job (debug='check' compares the sizes before the data "
    "moves; OMPI_MCA_smsc=^cma avoids the overwrite, at a cost for large messages)"
)
_TRUNCATED_UNCHECKED = (
    "; with debug='off', or an MPI started before hpccomm.init, a message above Open MPI's "
    "eager limit may have been copied past the buffer by its single-copy transport: end the "
    "job"
)


def _buffer_of(call: Call) -> str:
    """A truncated receive's own side, for its error: ``" (this rank's buffer: 512
    float32 for rank 0's message, tag 3)"``; "" where the call has none to name."""
    if not call.spec.p2p or call.spec.name not in ("recv", "sendrecv"):
        return ""
    try:
        src = call.peer if call.spec.name == "recv" else call.src
        who = "any rank's" if src is None else f"{call.group.peer(src)}'s"
        tag = "any tag" if call.tag is None else f"tag {call.tag}"
        count = call.count  # a sendrecv's: the array it sends; it receives into out=
        if call.spec.name == "sendrecv" and call.out_shape is not None:
            count = math.prod(call.out_shape)
        return f" (this rank's buffer: {count:,} {call.dtype()} for {who} message, {tag})"
    except Exception:  # noqa: BLE001 - only detail for the message
        return ""


class MPIBackend:
    """Runs calls on an mpi4py intracommunicator (which it owns: :meth:`free` frees it)."""

    name = "mpi"
    seq = 0  # the blocking body running now (set by the dispatch)

    def __init__(self, comm: MPI.Comm, *, objects: bool = True) -> None:
        if not _probed:
            probe_integer_ops()
        self.mpi = cast(MPI.Intracomm, comm)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        # pkl5's object transfers use a duplicate of the communicator that mpi4py makes on
        # their first use, a collective that holds the GIL while it waits: made here, while
        # every member is creating the group, a rank that never joins a later object
        # transfer cannot freeze this process past its timeout (kept for the failure path's
        # revoke). The debug checks' exchanges run on a communicator of their own
        # (``checks``): a rank checking a call can never match another rank's data (a
        # mismatch that straddles the ``large`` level's threshold waits, or times out,
        # instead of exchanging wrong bytes). Its point-to-point space carries
        # send_object/recv_object (the checks are collectives, which never match
        # point-to-point messages): on the array communicator an array send matched a
        # recv_object, whose pkl5 took it for a header and waited in MPI for parts that
        # never come, past any timeout; a send_object matched an array recv. ``data``
        # carries the data of checked point-to-point messages, each with a tag of its own
        # that its header names (see _CheckedRecv).
        # (Where one of these fails, Open MPI out of communicator ids, the ones made are not
        # freed: Open MPI 5.0.11 keeps the failed creation's id agreement running on them,
        # and freeing them made its progress engine segfault at exit.)
        # (``objects=False``: not made, for a communicator of internal use made on a worker
        # thread, the shared-memory path's node and cross-node groups: holding the GIL in
        # its collective there, one rank's first hierarchical calls on several groups at
        # once waited for each other's threads for good, 5 runs in 35 in an outside hunt)
        self._objects_comm = MPI._commctx_intra(self.mpi)[0] if objects else None
        self.checks = self.mpi.Dup()
        self.data = self.mpi.Dup()
        self._selves = _SelfQueue(self.mpi)  # receives from this rank itself, in order
        # (next() on a count is one step under the GIL: two threads sending at once never
        # draw the same tag, as a read-add-write of an int could)
        self._data_tag = itertools.count(1)
        # tags of checked data messages cycle through the odd tags MPI allows here (Open
        # MPI: 2**30 of them): through 32,768, two unreceived messages of one sender shared
        # a tag after 32,768 sends, and a receive by tag took the other's data
        bound = self.data.Get_attr(MPI.TAG_UB)
        self._data_tags = max(_DATA_TAGS, int(bound) + 1 if bound else 0) // 2
        # create_group's tags: even ones on ``data`` (see create_group), the checked data's
        # odd ones; the largest tag a creation may take
        self.creation_tag_max = (int(bound) if bound else _DATA_TAGS - 1) // 2
        # the check's buffers, made once (a group's calls never check concurrently)
        self._mine = np.zeros(2, np.int64)
        self._most = np.zeros(2, np.int64)
        self._check_args = ([self._mine, MPI.INT64_T], [self._most, MPI.INT64_T], MPI.MAX)
        self._pkl5: pkl5.Intracomm | None = None
        self._pkl5_p2p: pkl5.Intracomm | None = None
        self._bodies: dict[O.OpSpec, Callable[..., Any]] = {
            O.ALL_REDUCE: self._all_reduce,
            O.REDUCE: self._reduce,
            O.BROADCAST: self._broadcast,
            O.ALL_GATHER: self._all_gather,
            O.GATHER: self._gather,
            O.SCATTER: self._scatter,
            O.REDUCE_SCATTER: self._reduce_scatter,
            O.ALL_TO_ALL: self._all_to_all,
            O.BARRIER: self._barrier,
            O.SEND: self._send,
            O.RECV: self._recv,
            O.SENDRECV: self._sendrecv,
            O.BATCH_P2P: self._batch,
            O.BROADCAST_OBJECT: self._bcast_object,
            O.ALL_GATHER_OBJECT: self._allgather_object,
            O.GATHER_OBJECT: self._gather_object,
            O.SCATTER_OBJECT: self._scatter_object,
            O.SEND_OBJECT: self._send_object,
            O.RECV_OBJECT: self._recv_object,
        }
        # calls waited for at once: receives matched before any data moves (_ProbedRecv)
        self._blocking_bodies: dict[O.OpSpec, Callable[..., Any]] = {
            O.RECV: self._recv_blocking,
            O.SENDRECV: self._sendrecv_blocking,
        }

    # -- the interface ------------------------------------------------------------------

    def supports(self, call: Call) -> bool:
        return True

    def prepare(self, call: Call) -> None:
        spec = call.spec
        call.backend = self
        call.body = self._bodies[spec]
        call.mode = "requests" if spec.p2p else "blocking"
        # host arrays only: a wrapping backend (device staging) replaces the body
        call.blocking_body = self._blocking_bodies.get(spec) if call.device is None else None
        if call.info is None:
            call.how = None
        elif spec.reducing:
            scale = call.redop.prescale(self.size)
            call.how = (_mpi_types[call.info.dtype], _mpi_op(call), scale)
        else:
            call.how = _mpi_types[call.info.dtype]
        if call.info is not None and _too_many(call):
            self._large(call)

    # -- counts beyond a C int ----------------------------------------------------------

    def _large(self, call: Call) -> None:
        """A call with more than MAX_COUNT elements in one MPI argument. The embedded Open
        MPI 5.0 implements MPI 3.1, without MPI-4's large-count calls, and refuses such counts
        (MPI_ERR_ARG). Operations on one buffer run in pieces of at most MAX_COUNT elements
        (every rank cuts the same pieces, so they match); the others are refused."""
        spec = call.spec
        if spec in (O.ALL_REDUCE, O.REDUCE, O.BROADCAST, O.SEND) or (
            spec is O.RECV and call.peer is not None
        ):
            call.body = partial(_in_pieces, self._bodies[spec])
            call.blocking_body = None
            return
        counts = [call.count, *call.counts[0], *call.send_counts[0]]
        most = max(counts)
        far = _far_block(call)
        if far is not None and most <= MAX_COUNT:
            rank, start = far
            raise InvalidArgumentError(
                f"{call}: rank {rank}'s block starts at element {start:,}, past {MAX_COUNT:,} "
                f"(MPI's displacements are C ints): this MPI ({MPI.Get_version()[0]}."
                f"{MPI.Get_version()[1]}) has no large-count calls; split the call into calls "
                f"whose blocks start within {MAX_COUNT:,} elements of their array"
            )
        blocks = call.counts[0] if most in call.counts[0] else call.send_counts[0]
        whose = (  # a block of sizes=/splits: the rank it stands for
            f" (rank {list(blocks).index(most)}'s block)"
            if most != call.count and most in blocks
            else ""
        )
        raise InvalidArgumentError(
            f"{call}: {most:,} elements in one MPI argument{whose}, more than {MAX_COUNT:,} "
            f"(a C int): this MPI ({MPI.Get_version()[0]}.{MPI.Get_version()[1]}) has no "
            f"large-count calls, and hpccomm splits only all_reduce, reduce, broadcast, send "
            f"and recv from a named source into pieces; split the array into parts of at most "
            f"{MAX_COUNT:,} elements"
        )

    def close(self) -> None:
        self._pkl5 = self._pkl5_p2p = None

    def error(self, call: Call, seq: int, exc: BaseException) -> HpccommError:
        where = call.where(seq)
        if call.spec.objects:
            stage = _pickle_stage(exc)
            if stage == "loads":  # after the transfer: this rank's own failure
                err = BackendError(
                    f"{where}: unpickling the object received failed: {type(exc).__name__}: {exc}"
                )
                err.local = True
                return err
            if stage == "dumps":
                return InvalidArgumentError(
                    f"{where}: the object cannot be pickled: {type(exc).__name__}: {exc}"
                )
        if isinstance(exc, MPI.Exception) and self._process_failed(exc):
            global peer_failure_seen
            peer_failure_seen = True
            self.revoke()
            return PeerError(f"{where}: {self.failed_ranks()}; MPI reports {exc}")
        if isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE:
            p2p = call.spec.p2p
            more = _TRUNCATED_P2P if p2p else _TRUNCATED_UNCHECKED
            why = _TRUNCATED if p2p else _TRUNCATED_COLLECTIVE
            part = _buffer_of(call) or getattr(exc, "part", "")  # (a batch's receive)
            return BackendError(f"{where}: {self.name} failed: {exc}; {why}{part}{more}")
        return BackendError(f"{where}: {self.name} failed: {exc}")

    # -- point-to-point under the debug check (a header before every message) -----------

    def start_checked(
        self, call: Call, seq: int, data: Any, out: Any, blocking: bool = False
    ) -> Any:
        """Start a point-to-point call with headers (debug check): each send is preceded by
        a header with this rank's sequence number, dtype and shape, which each receive
        compares with its buffer before taking the data (see _CheckedRecv). ``blocking``:
        a receive that times out withdraws its header receive."""
        spec = call.spec
        if spec is O.SEND:
            return self._send_checked(call, seq, data, call.peer, call.tag)
        if spec is O.RECV:
            return _CheckedRecv(
                self.mpi, self.data, call, data, *_source_tag(call), "the receive", blocking
            )
        if spec is O.SENDRECV:
            src = _ANY_SOURCE if call.src is None else call.src
            recv = _CheckedRecv(
                self.mpi, self.data, call, out, src, call.tag, "the receive", blocking
            )
            return _All([recv, self._send_checked(call, seq, data, call.peer, call.tag)], out)
        parts: list[Any] = []
        try:
            for i, p in enumerate(data):  # batch_isend_irecv
                b = p.buffer()
                if p.op == "send":
                    parts.append(self._send_checked(call, seq, b.array, p.peer, p.tag))
                else:
                    parts.append(
                        _CheckedRecv(
                            self.mpi,
                            self.data,
                            call,
                            b.array,
                            p.peer,
                            _ANY_TAG if p.tag is None else p.tag,
                            f"ops[{i}]",
                        )
                    )
        except BaseException:  # withdraw the receives posted (they took later messages);
            _abandon(call, seq, parts)  # what MPI may still use stays referenced
            raise
        return _All(parts, None)

    def _send_checked(self, call: Call, seq: int, x: np.ndarray, dst: int, tag: int) -> Any:
        """The header, then the data on the data communicator. The data goes from a copy
        and the send completes with its header: the receiver posts the data's receive only
        once it has read the header (in its own test or wait), so a sender waiting for the
        data to be taken could wait for a receiver that is itself waiting in a send to it
        (two ranks that irecv and then send), or in a collective. Every size: a message
        above the eager limit needs the receiver's receive, and that limit may be below
        the node's 4 KiB-32 KiB (Open MPI's transport to the rank itself: about 1 KiB; a
        user's OMPI_MCA_btl_sm_eager_limit): a 2 KiB send to itself, the array itself
        sent, waited until its timeout. The copy is kept (work.ORPHANS) until MPI has
        sent it."""
        data_tag = 2 * (next(self._data_tag) % self._data_tags) + 1  # (odd: see create_group)
        words = encode_header(seq, _CODES[x.dtype], x.size, x.shape, data_tag)
        header = np.array(words, np.int64)
        head = self.mpi.Isend([header, MPI.INT64_T], dst, tag)
        copy = np.array(x, copy=True)
        sent = _Sent(self.data.Isend([copy, _mpi_types[copy.dtype]], dst, data_tag), copy)
        ORPHANS.append(
            (sent, f"{call.where(seq)}: its data to {call.group.peer(dst)} (debug check)")
        )
        return Requests(call, [head], None, keep=(header,))

    # -- small exchanges for the debug checks -------------------------------------------

    def same_int(self, value: int) -> bool:
        """Whether every rank passed the same value: one allreduce (MAX) of (v, -v)."""
        mine = self._mine
        mine[0] = value
        mine[1] = -value
        self.checks.Allreduce(*self._check_args)
        most = self._most
        return bool(most[0] == -most[1])

    def allgather_object(self, obj: Any) -> list[Any]:
        return self.checks.allgather(obj)

    def alltoall_ints(self, values: list[int]) -> list[int]:
        got = np.empty(self.size, np.int64)
        self.checks.Alltoall([np.array(values, np.int64), MPI.INT64_T], [got, MPI.INT64_T])
        return got.tolist()

    def _process_failed(self, exc: MPI.Exception) -> bool:
        """Whether ``exc`` comes from a process failure (ULFM): a failure class, or
        MPI_ERR_IN_STATUS from a Waitall that hpccomm does not hold the statuses of
        (pkl5's object transfers) while MPI knows a rank of this group failed."""
        cls = exc.Get_error_class()
        return cls in _PROC_FAILED or (cls == MPI.ERR_IN_STATUS and bool(failed_in(self.mpi)))

    def revoke(self) -> None:
        """Revoke this group's communicators (ULFM's MPI_Comm_revoke) after a process failure:
        a rank that saw the failure leaves the collective, and a peer still waiting for it
        in the same call, which may never learn of the failure itself, is released with
        MPI_ERR_REVOKED (measured: without it, 1 run in 7-24 left a survivor waiting). Also
        mpi4py's duplicate that pkl5's object transfers use (made in ``__init__``): a rank
        waiting there for the root of a ``scatter_object`` that failed before sending to it
        stayed inside MPI until exit."""
        if self.mpi == MPI.COMM_NULL:  # freed: mpi4py's duplicate went with it (revoking
            return  # that stale handle crashed in MPI)
        for comm in (self.mpi, self.checks, self.data, self._objects_comm):
            if comm is None:
                continue
            try:
                comm.Revoke()
            except Exception:  # pragma: no cover - an MPI without ULFM's calls
                pass

    def failed_ranks(self) -> str:
        """Which ranks of this group MPI knows to have failed (:func:`failed_in`). A rank
        released by a peer's revoke may not have heard of the failure yet: wait up to 1 s
        for the notice."""
        deadline = time.monotonic() + 1.0
        ranks = failed_in(self.mpi)
        while ranks == [] and time.monotonic() <= deadline:
            time.sleep(0.01)
            ranks = failed_in(self.mpi)
        if ranks is None:  # pragma: no cover - an MPI without ULFM's calls
            return "a peer process failed"
        if not ranks:
            return "another rank saw a process failure and revoked this group"
        in_world = _world_ranks(self.mpi, ranks)
        also = "" if in_world in (ranks, None) else f" (world rank(s) {in_world})"
        return f"rank(s) {ranks}{also} of this group failed (the process died)"

    # -- reductions ---------------------------------------------------------------------

    def _source(self, x: np.ndarray, scale: Any) -> Any:
        """The send side of a scaled reduction (PREMUL_SUM, AVG): the scaled copy, a
        temporary that lives until the blocking call returns."""
        with np.errstate(all="ignore"):  # inf * 0, overflow: as MPI's own ops, silent
            return (x * scale).astype(x.dtype, copy=False)

    # -- collectives (blocking bodies) --------------------------------------------------

    def _all_reduce(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> np.ndarray:
        mt, op, scale = call.how
        if scale is None:  # the hottest path of all: nothing else happens
            self.mpi.Allreduce(IN_PLACE, [x, mt], op)
            return x
        self.mpi.Allreduce([self._source(x, scale), mt], [x, mt], op)
        return x

    def _reduce(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> np.ndarray:
        mt, op, scale = call.how
        send = x if scale is None else self._source(x, scale)
        root = call.peer
        if self.rank == root:
            self.mpi.Reduce(IN_PLACE if send is x else [send, mt], [x, mt], op, root)
        else:
            self.mpi.Reduce([send, mt], None, op, root)
        return x

    def _broadcast(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> np.ndarray:
        self.mpi.Bcast([x, call.how], call.peer)
        return x

    def _all_gather(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> np.ndarray:
        mt = call.how
        send: Any = [x, mt]
        if call.in_place:  # x is exactly this rank's block of out: MPI asks every rank or
            # none to pass MPI_IN_PLACE to an allgather, and another rank may not: a copy
            # (host arrays; a device array, on a CUDA-aware MPI, goes in place)
            send = [x.copy(), mt] if type(x) is np.ndarray else IN_PLACE
        if call.uneven:
            counts, displs = call.counts
            self.mpi.Allgatherv(send, [out, counts, displs, mt])
        else:
            self.mpi.Allgather(send, [out, mt])
        return out

    def _gather(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> Any:
        mt = call.how
        recv = None
        if out is not None:
            counts, displs = call.counts
            recv = [out, counts, displs, mt]
        self.mpi.Gatherv(IN_PLACE if call.in_place else [x, mt], recv, call.peer)
        # only dst receives: an out= passed elsewhere is left as it was, not a result (it
        # was returned, unwritten, where the documented None was expected)
        return out if self.rank == call.peer else None

    def _scatter(self, call: Call, x: Any, out: np.ndarray, stream: Any) -> np.ndarray:
        mt = call.how
        send = None
        if self.rank == call.peer:
            counts, displs = call.counts
            send = [x, counts, displs, mt]
        self.mpi.Scatterv(send, IN_PLACE if call.in_place else [out, mt], call.peer)
        return out

    def _reduce_scatter(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> np.ndarray:
        mt, op, scale = call.how
        send = x if scale is None else self._source(x, scale)
        # out= inside the array (this rank's block, as the shared-memory path allows): MPI
        # forbids a send and receive buffer that overlap (Open MPI computed it right, another
        # MPI may not: an outside hunt), so the result goes through a temporary
        into = np.empty_like(out) if np.may_share_memory(send, out) else out
        if call.uneven:
            self.mpi.Reduce_scatter([send, mt], [into, mt], call.counts[0], op)
        else:
            self.mpi.Reduce_scatter_block([send, mt], [into, mt], op)
        if into is not out:
            np.copyto(out, into)
        return out

    def _all_to_all(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> np.ndarray:
        mt = call.how
        if call.uneven:
            scounts, sdispls = call.send_counts
            rcounts, rdispls = call.counts
            self.mpi.Alltoallv([x, scounts, sdispls, mt], [out, rcounts, rdispls, mt])
        else:
            self.mpi.Alltoall([x, mt], [out, mt])
        return out

    def _barrier(self, call: Call, x: Any, out: Any, stream: Any) -> None:
        self.mpi.Barrier()

    # -- point-to-point (started; the dispatch waits or hands out a Work) ---------------

    def _send(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> _Sent:
        sent = _Sent(self.mpi.Isend([x, call.how], call.peer, call.tag), x)
        if call.peer == self.rank:  # (see _SelfQueue)
            self._selves.match()
        return sent

    def _recv(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> _Received:
        mt = call.how
        src, tag = _source_tag(call)
        if src == self.rank:  # (see _SelfQueue)
            return _SelfReceived(call, self._selves, x, mt, src, tag)
        return _Received(call, self.mpi.Irecv([x, mt], src, tag), x, mt)

    def _recv_blocking(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> _ProbedRecv:
        src, tag = _source_tag(call)
        if src == self.rank:  # (see _SelfQueue: in order with the posted ones)
            return _SelfReceived(call, self._selves, x, call.how, src, tag, blocking=True)
        return _ProbedRecv(call, self.mpi, x, call.how, src, tag)

    def _sendrecv_blocking(self, call: Call, x: np.ndarray, out: np.ndarray, stream: Any) -> _All:
        """A sendrecv waited for at once: the send is posted, the receive probed (as a
        blocking recv is) while it is in flight."""
        sent = _Sent(self.mpi.Isend([x, call.how], call.peer, call.tag), x)
        if call.peer == self.rank:  # (see _SelfQueue)
            self._selves.match()
        src = _ANY_SOURCE if call.src is None else call.src
        if src == self.rank:  # (see _SelfQueue)
            own = _SelfReceived(call, self._selves, out, call.how, src, call.tag, blocking=True)
            return _All([own, sent], out)
        return _All([_ProbedRecv(call, self.mpi, out, call.how, src, call.tag), sent], out)

    def _sendrecv(self, call: Call, x: np.ndarray, out: np.ndarray, stream: Any) -> Requests | _All:
        mt = call.how
        src = _ANY_SOURCE if call.src is None else call.src
        tag = call.tag
        if src == self.rank:  # (see _SelfQueue)
            recv = _SelfReceived(call, self._selves, out, mt, src, tag)
            sent = _Sent(self.mpi.Isend([x, mt], call.peer, tag), x)
            if call.peer == self.rank:
                self._selves.match()
            return _All([recv, sent], out)
        reqs = [
            self.mpi.Irecv([out, mt], src, tag),
            self.mpi.Isend([x, mt], call.peer, tag),
        ]
        if call.peer == self.rank:  # (see _SelfQueue)
            self._selves.match()
        return Requests(call, reqs, out, checks=((0, out.size, mt, "the receive"),), keep=(x, out))

    def _batch(self, call: Call, items: list[P2POp], out: Any, stream: Any) -> Requests | _All:
        reqs: list[MPI.Request] = []
        checks: list[tuple[int, int, MPI.Datatype, str]] = []
        selves: list[_SelfReceived] = []  # receives from this rank itself (_SelfReceived)
        try:
            for i, p in enumerate(items):
                b = p.buffer()
                mt = _mpi_types[b.dtype]
                if p.op == "send":
                    reqs.append(self.mpi.Isend([b.array, mt], p.peer, p.tag))
                    continue
                tag = _ANY_TAG if p.tag is None else p.tag  # (None: any tag)
                if p.peer == self.rank:
                    own = _SelfReceived(
                        call, self._selves, b.array, mt, p.peer, tag, f"ops[{i}] (recv)"
                    )
                    selves.append(own)
                    continue
                checks.append((len(reqs), b.elements, mt, f"ops[{i}] (recv)"))
                reqs.append(self.mpi.Irecv([b.array, mt], p.peer, tag))
        except BaseException:  # withdraw the receives posted (they took later messages);
            receives = {at for at, *_ in checks}  # the sends stay referenced until sent
            for at, req in enumerate(reqs):
                if at in receives:
                    _withdraw(req)
                else:
                    ORPHANS.append((_Sent(req, items), f"{call}: a send of a batch that failed"))
            for own in selves:
                own.withdraw()
            raise
        if any(p.op == "send" and p.peer == self.rank for p in items):  # (see _SelfQueue)
            self._selves.match()
        requests = Requests(call, reqs, None, checks=checks, keep=items)
        return _All([requests, *selves], None) if selves else requests

    # -- Python objects (pickle protocol 5, out-of-band buffers) -------------------------

    @property
    def objects(self) -> pkl5.Intracomm:
        """pkl5 on this group (its collectives run on mpi4py's duplicate made at init)."""
        if self._pkl5 is None:
            self._pkl5 = pkl5.Intracomm(self.mpi)
        return self._pkl5

    @property
    def object_messages(self) -> pkl5.Intracomm:
        """pkl5 for send_object/recv_object: apart from the arrays' messages (see checks)."""
        if self._pkl5_p2p is None:
            self._pkl5_p2p = pkl5.Intracomm(self.checks)
        return self._pkl5_p2p

    def pickled(self, call: Call, obj: Any, seq: int) -> Any:
        """An object collective's object(s) that this rank sends, pickled now (_Pickled):
        the root's of broadcast_object, each of scatter_object's list on its root, every
        rank's of all_gather_object and gather_object; the argument as it is where this rank
        sends nothing. One that cannot be pickled: InvalidArgumentError naming it (call
        number ``seq``)."""
        spec = call.spec
        sends = spec is O.ALL_GATHER_OBJECT or spec is O.GATHER_OBJECT or self.rank == call.peer
        if not sends:
            return obj
        items = list(obj) if spec is O.SCATTER_OBJECT else [obj]
        out = []
        for i, item in enumerate(items):
            try:
                out.append(_Pickled(item))
            except Exception as exc:  # noqa: BLE001 - whatever pickling raises: refused
                what = f"the object for rank {i}" if spec is O.SCATTER_OBJECT else "the object"
                raise InvalidArgumentError(
                    f"{call.where(seq)}: {what} cannot be pickled: {type(exc).__name__}: {exc}; "
                    f"nothing was sent"
                ) from exc
        return out if spec is O.SCATTER_OBJECT else out[0]

    def _bcast_object(self, call: Call, obj: Any, out: Any, stream: Any) -> Any:
        return self.objects.bcast(obj, root=call.peer)

    def _allgather_object(self, call: Call, obj: Any, out: Any, stream: Any) -> Any:
        return self.objects.allgather(obj)

    def _gather_object(self, call: Call, obj: Any, out: Any, stream: Any) -> Any:
        return self.objects.gather(obj, root=call.peer)

    def _scatter_object(self, call: Call, objs: Any, out: Any, stream: Any) -> Any:
        return self.objects.scatter(objs if self.rank == call.peer else None, root=call.peer)

    def _send_object(self, call: Call, obj: Any, out: Any, stream: Any) -> _ObjectSend:
        return _ObjectSend(self.object_messages.isend(obj, dest=call.peer, tag=call.tag))

    def _recv_object(self, call: Call, obj: Any, out: Any, stream: Any) -> _ObjectRecv:
        return _ObjectRecv(self.object_messages, *_source_tag(call))

    # -- groups (collective over this communicator unless said otherwise) -----------------

    def split(self, color: int | None, key: int, *, objects: bool = True) -> MPIBackend | None:
        """``MPI_Comm_split``; None on ranks with ``color=None`` (``objects``: see
        __init__)."""
        new = self.mpi.Split(MPI.UNDEFINED if color is None else color, key)
        return None if new == MPI.COMM_NULL else MPIBackend(new, objects=objects)

    def dup(self) -> MPIBackend:
        return MPIBackend(self.mpi.Dup())

    def create(self, ranks: Sequence[int]) -> MPIBackend | None:
        """``MPI_Comm_create`` of ``ranks`` (in that order): collective over this whole
        communicator; None on ranks outside."""
        group = self.mpi.Get_group()
        sub = group.Incl(list(ranks))
        try:
            new = self.mpi.Create(sub)
        finally:
            sub.Free()
            group.Free()
        return None if new == MPI.COMM_NULL else MPIBackend(new)

    def create_group(self, ranks: Sequence[int], tag: int) -> MPIBackend:
        """``MPI_Comm_create_group`` of ``ranks``: collective over those ranks only.

        MPI makes it with point-to-point messages of ``tag`` on the communicator it is
        called on (the standard: the tag must not conflict with the program's): on the
        array communicator, a user's message of that tag in flight matched them (both
        ranks waited until the timeout, saying the lists differed, and a receive posted
        there got Open MPI's internal bytes, 12 where nothing was sent: an outside hunt).
        It runs on ``data`` instead, with tag 2 * ``tag``: the checked data messages there
        take odd tags (up to creation_tag_max)."""
        group = self.data.Get_group()
        sub = group.Incl(list(ranks))
        try:
            new = self.data.Create_group(sub, 2 * tag)
        finally:
            sub.Free()
            group.Free()
        # The members' lists in one 16-byte allreduce on the new communicator, before
        # mpi4py's context setup (MPIBackend: a collective that holds the GIL). Open MPI
        # makes the communicator from lists of the same ranks in different orders, each
        # rank numbering it by its own list; mpi4py's setup on it then waited for good
        # holding the GIL, so no timeout could fire (rank 0 passing [1, 0] and rank 1
        # [0, 1], an outside review). This allreduce releases the GIL: on such a
        # communicator it waits (the timeout fires and names each rank's list; so it did
        # for every permutation tried at 2 and 3 ranks), and should it complete with
        # lists that differ, they are refused here on every rank.
        mark = zlib.crc32(np.asarray(ranks, np.int64).tobytes())
        seen = np.array([mark, -mark], np.int64)
        new.Allreduce(IN_PLACE, [seen, MPI.INT64_T], MPI.MAX)
        if seen[0] != mark or -seen[1] != mark:
            raise MismatchError(
                f"create_group {list(ranks)}: the ranks listed passed other lists (another "
                f"order or other ranks); every rank listed passes the same list"
            )
        return MPIBackend(new)

    def node(self) -> MPIBackend:
        """The ranks sharing this node's memory (``COMM_TYPE_SHARED``), ordered by rank."""
        return MPIBackend(self.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank))

    def node_layout(self, node: MPIBackend) -> tuple[int, int, MPIBackend | None]:
        """(this node's index among the group's nodes ordered by their lowest rank, number of
        nodes, the leaders' communicator on local rank 0 of each node, else None)."""
        first = node.mpi.allreduce(self.rank, op=MPI.MIN)
        leader = node.rank == 0
        leaders = self.split(0 if leader else None, first)
        layout = (leaders.rank, leaders.size) if leaders is not None else None
        index, count = node.mpi.bcast(layout, root=0)
        return index, count, leaders

    def translate(self, ranks: Sequence[int], other: MPIBackend) -> list[int | None]:
        """``ranks`` of this group as ranks of ``other`` (None where not a member)."""
        mine, theirs = self.mpi.Get_group(), other.mpi.Get_group()
        try:
            out = MPI.Group.Translate_ranks(mine, list(ranks), theirs)
        finally:
            mine.Free()
            theirs.Free()
        return [None if r == MPI.UNDEFINED else r for r in out]

    def free(self) -> None:
        """Free the communicator (idempotent; nothing once MPI is finalized)."""
        self.close()
        self._selves.close()
        if not MPI.Is_finalized():
            for comm in (self.checks, self.data, self.mpi):
                if comm != MPI.COMM_NULL:
                    comm.Free()
