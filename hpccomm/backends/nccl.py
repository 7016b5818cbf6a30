"""The NCCL backend: device (CuPy) arrays through ``cupy.cuda.nccl``.

The communicator is bootstrapped over MPI: every rank contributes (host, GPU UUID, PCI bus
id) and rank 0 the 128-byte unique id in one allgather; two ranks on one GPU (same UUID, as
NCCL >= 2.30 compares them, so MIG instances of one GPU are distinct) are refused on every
rank; then every rank creates ``NcclCommunicator`` on its bound GPU. Operations run on
``stream=`` or the caller's current CuPy stream. Unbounded calls are enqueued inline: a
synchronous call returns with its result ordered on that stream, as NCCL does, and
``async_op=True`` returns a :class:`DeviceWork` holding a CUDA event. On a communicator with a
timeout every call is enqueued in the caller's thread too, so calls reach the GPU in the
program's order (those the debug check compares first: on the communicator's worker thread,
after the check); a synchronous one is then waited for on the host, an async one returns at
once, and a watchdog thread looks at the calls on the GPU; past the timeout the NCCL
communicator is aborted (NCCL would spin forever for a rank that never joins, and its lazy
connect on the first call blocks the host). One thread at a time enters NCCL on a
communicator, as NCCL requires.

The tables and checks at the top of this module need no GPU (the CPU tests use them); CuPy is
imported only when a backend is made.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

import numpy as np

from .. import ops as O
from ..dtypes import SUPPORTED_DTYPES, DtypeInfo, ReduceOp
from ..errors import (
    BackendError,
    CommTimeoutError,
    DtypeError,
    GpuBindingError,
    HpccommError,
    InvalidArgumentError,
)
from ..executor import Future, on_worker
from ..gpuselect import format_uuid
from ..ops import Call
from ..work import Work

__all__ = [
    "WorkerStreams",
    "NcclBackend",
    "DeviceWork",
    "NcclPlan",
    "plan_reduction",
    "nccl_dtype",
    "pack_unique_id",
    "unpack_unique_id",
    "check_unique_gpus",
    "check_tags",
    "event_done",
    "gpu_identity",
    "GpuIdentity",
    "multi_rank_gpu_allowed",
    "UNIQUE_ID_BYTES",
]

UNIQUE_ID_BYTES = 128
Transfer = tuple[Any, int, int, int]  # (flat array, peer, element offset, element count)
Step = tuple[Any, Callable[[], None] | None]  # (the call's result, a step to run after it)

# ncclDataType_t and ncclRedOp_t values (NCCL's ABI; cupy.cuda.nccl exposes the same numbers).
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_AVG_SINCE = 21000  # ncclAvg exists from NCCL 2.10
MULTI_RANK_GPU_SINCE = 23000  # NCCL_MULTI_RANK_GPU_ENABLE from NCCL 2.30

# dtype name -> (NCCL type, elements per array element). Complex travels as pairs of reals
# (element-wise SUM/AVG of the pairs is the complex sum); bool as uint8.
_TYPES: dict[str, tuple[int, int]] = {
    "bool": (NCCL_UINT8, 1),
    "int8": (NCCL_INT8, 1),
    "uint8": (NCCL_UINT8, 1),
    "int32": (NCCL_INT32, 1),
    "uint32": (NCCL_UINT32, 1),
    "int64": (NCCL_INT64, 1),
    "uint64": (NCCL_UINT64, 1),
    "float16": (NCCL_FLOAT16, 1),
    "bfloat16": (NCCL_BFLOAT16, 1),
    "float32": (NCCL_FLOAT32, 1),
    "float64": (NCCL_FLOAT64, 1),
    "complex64": (NCCL_FLOAT32, 2),
    "complex128": (NCCL_FLOAT64, 2),
}
_OPS = {
    "SUM": NCCL_SUM,
    "PRODUCT": NCCL_PROD,
    "MAX": NCCL_MAX,
    "MIN": NCCL_MIN,
    "AVG": NCCL_AVG,
    "PREMUL_SUM": NCCL_SUM,
}
# bool as uint8: OR is MAX, AND is MIN.
_BOOL_OPS = {
    "SUM": NCCL_MAX,
    "MAX": NCCL_MAX,
    "BOR": NCCL_MAX,
    "PRODUCT": NCCL_MIN,
    "MIN": NCCL_MIN,
    "BAND": NCCL_MIN,
}


class NcclPlan(NamedTuple):
    """How one reduction runs on NCCL: type, elements per element, op, a factor to scale a
    copy of the input by first (PREMUL_SUM), and a divisor to apply after (AVG on NCCL < 2.10)."""

    dtype: int
    per_element: int
    op: int | None
    prescale: Any
    divide_after: bool


def nccl_dtype(info: DtypeInfo, where: object) -> tuple[int, int]:
    """(NCCL type, elements per element) for a dtype; DtypeError where NCCL has none."""
    entry = _TYPES.get(info.name)
    if entry is None:
        raise DtypeError(
            f"{where}: dtype {info.name} has no NCCL type (NCCL has no 16-bit integers); use "
            f"int32, or move the array to the host (cupy.asnumpy) for the MPI path"
        )
    return entry


def plan_reduction(info: DtypeInfo, redop: ReduceOp, nccl_version: int, where: object) -> NcclPlan:
    """The NCCL plan of a reduction, or DtypeError naming the op and the dtype."""
    dtype, per = nccl_dtype(info, where)
    name = redop.name
    if info.category == "bool":
        op = _BOOL_OPS.get(name)
    elif name in ("BAND", "BOR", "BXOR"):
        op = None
    else:
        op = _OPS[name]
    if op is None:
        raise DtypeError(
            f"{where}: op {name} is not supported on the NCCL path for dtype {info.name} (NCCL has "
            f"no bitwise reductions); reduce host arrays through MPI instead"
        )
    divide = name == "AVG" and nccl_version < NCCL_AVG_SINCE
    if divide:
        op = NCCL_SUM
    prescale = redop.factor if name == "PREMUL_SUM" else None
    return NcclPlan(dtype, per, op, prescale, divide)


def pack_unique_id(uid: Any) -> np.ndarray:
    """An NCCL unique id (128 bytes in CuPy >= 14, a tuple of 128 signed chars before) as the
    128-byte uint8 buffer that MPI broadcasts."""
    if isinstance(uid, (bytes, bytearray)):
        buf = np.frombuffer(bytes(uid), dtype=np.uint8)
    else:
        buf = np.array(uid, dtype=np.int64).astype(np.int8).view(np.uint8)
    if buf.size != UNIQUE_ID_BYTES:
        raise BackendError(f"NCCL unique id has {buf.size} bytes, expected {UNIQUE_ID_BYTES}")
    return np.ascontiguousarray(buf)


def unpack_unique_id(buf: np.ndarray, as_bytes: bool) -> Any:
    """The broadcast buffer back in the form ``NcclCommunicator`` takes."""
    if buf.dtype != np.uint8 or buf.size != UNIQUE_ID_BYTES:
        raise BackendError(
            f"NCCL unique id buffer is {buf.dtype} x {buf.size}, expected uint8 x {UNIQUE_ID_BYTES}"
        )
    return buf.tobytes() if as_bytes else tuple(int(v) for v in buf.view(np.int8))


def multi_rank_gpu_allowed(nccl_version: int, environ: Mapping[str, str] | None = None) -> bool:
    """True when NCCL_MULTI_RANK_GPU_ENABLE=1 and NCCL >= 2.30 lets ranks share a GPU."""
    env = os.environ if environ is None else environ
    return env.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1" and nccl_version >= MULTI_RANK_GPU_SINCE


class GpuIdentity(NamedTuple):
    """What the ranks compare before creating an NCCL communicator: the host, the GPU's UUID
    (a MIG instance has its own) and its PCI bus id (for messages)."""

    host: str
    uuid: str
    bus_id: str


def gpu_identity(runtime: Any, device: int, host: str) -> GpuIdentity:
    """This rank's GpuIdentity, from ``cupy.cuda.runtime`` (no context is created)."""
    props = runtime.getDeviceProperties(device)
    return GpuIdentity(host, format_uuid(props.get("uuid")), runtime.deviceGetPCIBusId(device))


def check_unique_gpus(
    identities: Sequence[tuple[str, ...]],
    rank: int,
    *,
    allowed: bool = False,
    allowed_on: Sequence[int] = (),
) -> None:
    """Raise GpuBindingError (on every rank that calls it) when two ranks share one GPU.

    GPUs are compared by UUID, as NCCL >= 2.30 does (MIG instances of one GPU have distinct
    UUIDs and are distinct GPUs to NCCL); where a UUID is unknown, by (host, PCI bus id).

    Args:
        identities: :class:`GpuIdentity` (host, UUID, PCI bus id) of every rank, in rank
            order; (host, bus id) pairs are accepted too.
        rank: this rank.
        allowed: sharing is explicitly allowed on every rank (see
            :func:`multi_rank_gpu_allowed`).
        allowed_on: the ranks where it is allowed when not on every rank (for the message).
    """
    if allowed:
        return
    seen: dict[tuple[str, ...], list[int]] = {}
    for r, ident in enumerate(identities):
        if len(ident) >= 3 and ident[1]:
            key: tuple[str, ...] = ("uuid", ident[1])
        else:
            key = ("bus", ident[0], ident[-1])
        seen.setdefault(key, []).append(r)
    shared = [ranks for ranks in seen.values() if len(ranks) > 1]
    if shared:
        ranks = shared[0]
        ident = identities[ranks[0]]
        host = ident[0]
        gpu = f"{ident[1]} (PCI {ident[2]})" if len(ident) >= 3 and ident[1] else ident[-1]
        more = f" (and {len(shared) - 1} more GPU(s) shared)" if len(shared) > 1 else ""
        raise GpuBindingError(
            f"NCCL init (rank {rank} of {len(identities)}): ranks {ranks} on host {host} would "
            f"share GPU {gpu}{more}; NCCL rejects two ranks of one communicator on one GPU. Give "
            f"each rank its own GPU (srun --gpus-per-task=1, or as many tasks per node as GPUs), "
            f"or allow it with NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL >= 2.30, slow, for testing)"
            + (
                f"; it is set on rank(s) {list(allowed_on)} only, and must be on every rank"
                if allowed_on
                else ""
            )
        )


CUDA_SUCCESS = 0
CUDA_NOT_READY = 600  # cudaErrorNotReady: the event's work is still running

# A call the worker took up within this many seconds of being made was not queued behind
# others (the wait is the worker's wake-up): its bound counts from the call (NcclBackend.bounded)
_PROMPT = 0.05
# how often the watchdog looks at the async calls of a bounded communicator still on the GPU
# (PyTorch's NCCL watchdog: every 100 ms)
_WATCHDOG_POLL = 0.05
_CLOSED = "closed"  # NcclBackend.aborted once free() destroyed the communicator


def event_done(runtime: Any, event: Any, where: object) -> bool:
    """Whether ``event`` has completed; raises BackendError naming the CUDA error when the
    query reports one (a sticky error such as an illegal address: CuPy's ``Event.done`` then
    stays False for ever, so polling it would spin or report a timeout instead)."""
    status = runtime.eventQuery(event.ptr)
    if status == CUDA_SUCCESS:
        return True
    if status == CUDA_NOT_READY:
        return False
    try:
        runtime.check_status(status)
    except Exception as exc:
        raise BackendError(f"{where}: CUDA error on the GPU: {exc}") from exc
    raise BackendError(f"{where}: CUDA error {status} on the GPU")  # pragma: no cover


class WorkerStreams:
    """The stream a call the caller ordered on ``stream`` runs on when the worker thread runs
    it (bounded and async calls).

    A stream object names the same CUDA stream on every thread, except CuPy's per-thread
    default stream (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``: ``Stream.ptds``, the handle
    ``cudaStreamPerThread``), which means the calling thread's own stream: used on the worker
    thread it would be the worker's, unordered with the caller's kernels that made the data.
    For that one, :meth:`resolve` (in the caller's thread) makes a stream of hpccomm's own on
    the current device wait for what the caller enqueued so far, and returns it with itself
    as the stream to synchronize before the call completes, so the caller's later kernels
    (enqueued after the call returns or its Work's wait()) find the result done."""

    def __init__(self) -> None:
        self._side: dict[int, Any] = {}  # device id -> hpccomm's stream
        self._lock = threading.Lock()

    def resolve(self, stream: Any) -> tuple[Any, Any]:
        import cupy

        if stream.ptr != cupy.cuda.runtime.streamPerThread:
            return stream, None
        device = getattr(stream, "device_id", None)
        if not isinstance(device, int) or device < 0:
            device = cupy.cuda.Device().id
        with self._lock:
            side = self._side.get(device)
            if side is None:
                with cupy.cuda.Device(device):
                    side = self._side[device] = cupy.cuda.Stream(non_blocking=True)
        side.wait_event(stream.record())  # recorded here, on the caller's own stream
        return side, side


def check_tags(call: Call, tags: Sequence[Any]) -> None:
    """NCCL has no tags: messages between two ranks match in the order they are posted. A
    tag other than 0 (the default) or None (any tag) would be silently ignored, so refuse it."""
    bad = [t for t in tags if t not in (0, None)]
    if bad:
        raise InvalidArgumentError(
            f"{call}: tag is {bad[0]!r}, but NCCL has no tags (messages between two ranks "
            f"match in the order they are posted); drop tag=, or send device arrays through "
            f"MPI (comm.dup(device_backend='mpi'))"
        )


class _EventPending:
    """A device operation enqueued on a stream: done when its CUDA event is."""

    __slots__ = ("event", "result", "backend", "keep", "where", "settled", "__weakref__")

    def __init__(
        self, event: Any, result: Any, backend: NcclBackend, keep: Any, where: str
    ) -> None:
        self.event = event
        self.result = result
        self.backend = backend
        self.keep = keep  # temporaries the GPU reads until the event (PREMUL_SUM's copy)
        self.where = where
        self.settled = False  # seen complete by abort() just before it aborted
        with backend._lock:  # (abort() goes through the set under it, from another thread)
            backend.pending.add(self)

    def test(self) -> bool:
        if not self.backend.event_done(self.event, self.where):
            return False
        self.verify()
        self.done()
        return True

    def done(self) -> None:
        """Seen complete with no abort before: whole for good (a later abort, through CuPy
        too, does not make a synchronize() of it fail), its temporaries free to go."""
        with self.backend._lock:
            self.settled = True
            self.backend.pending.discard(self)  # (nothing left for abort() to mark)
        self.keep = None

    def verify(self) -> None:
        """Its event completed: raise where an abort may have cut it short. An abort
        (another Work's synchronize(timeout), NCCL's asynchronous error) ends the kernels of
        the calls still running, and their events complete with no result: such a Work
        reported success (is_completed()) and wait() returned its result. PyTorch fails the
        outstanding Works of an aborted communicator. Fine: a call abort() saw complete
        before it aborted (``settled``), and every call once free() destroyed the
        communicator cleanly (it waited for each first)."""
        with self.backend._lock:  # (abort() marks ``settled`` under it before aborting)
            if not self.settled:
                self.backend.check_done()

    def wait(self, timeout: float | None) -> bool:
        self.verify()  # (the stream's wait below cannot tell)
        self.backend.stream_now().wait_event(self.event)  # ordered, the host not blocked
        return True

    def outcome(self) -> Any:
        return self.result


def _gave_up(where: str, timeout: float | None) -> CommTimeoutError:
    err = CommTimeoutError(
        f"{where}: not complete after {timeout:g} s on the GPU (the group's timeout); some "
        f"rank of the group has not joined it, so the NCCL communicator was aborted (later "
        f"device calls on this group raise)"
    )
    err.final = True  # (its Work is finished with it: it never completes)
    return err


class _Expiry:
    """A call of a bounded communicator, on the GPU: the watchdog gives it up (aborts the
    communicator) ``bound`` seconds after its start: its call, or, where this communicator's
    earlier calls on its stream were still running then, when the watchdog saw them done
    (they are not charged to it). ``seen_done``: the watchdog saw it complete before any
    abort."""

    __slots__ = ("event", "key", "start", "bound", "why", "where", "seen_done")

    def __init__(
        self, event: Any, key: Any, start: float | None, bound: float, why: str, where: str
    ) -> None:
        self.event = event
        self.key = key
        self.start = start
        self.bound = bound
        self.why = why
        self.where = where
        self.seen_done = False

    def overdue(self, now: float) -> bool:
        """Whether its clock has started and run past its bound at ``now``."""
        return self.start is not None and now - self.start >= self.bound


class _HostWait:
    """A call of a bounded communicator, or one queued behind the worker's jobs.

    Enqueued in the caller's thread (NcclBackend.watched): ``future`` is already done, and
    waiting waits for ``event`` on the host, giving the call up past its bound (``expiry``,
    also watched by the watchdog).

    Run on the worker (NcclBackend.bounded: compared first): ``future`` is its job there. A
    synchronous call's job waits on the host until the GPU has finished it; ``deadline``
    (``timeout`` after the call) is when the call is given up: the NCCL communicator is
    aborted, so neither the GPU nor the worker keep waiting for a rank that never comes,
    and CommTimeoutError is raised (the worker's, where it gave up first). An async call's
    job ends once the call is enqueued (``event``: recorded after it), which its caller may
    wait for (until_enqueued); then it is waited for as above."""

    __slots__ = (
        "future",
        "backend",
        "where",
        "timeout",
        "deadline",
        "started",
        "enqueued",
        "event",
        "keep",
        "expiry",
        "why",
        "bound",
        "caller_waits",
        "submitted",
    )

    def __init__(
        self,
        backend: NcclBackend,
        where: str,
        timeout: float | None,
        deadline: float | None,
        bound: float | None,
    ) -> None:
        self.future: Any = None
        self.backend = backend
        self.where = where
        self.timeout = timeout
        self.deadline = deadline
        self.bound = bound
        self.started: list[float | None] = []  # the job's enqueue deadline, once it started
        self.enqueued = threading.Event()  # the job enqueued the call (or failed)
        self.event: Any = None  # an async call's, once enqueued
        self.keep: Any = None  # its temporaries, alive until the GPU is done with them
        self.expiry: _Expiry | None = None
        self.why = "" if timeout is None else f"{where} did not complete in {timeout:g} s"
        self.caller_waits = False  # (an async call's: see until_enqueued)
        self.submitted = time.monotonic()

    def until_enqueued(self) -> None:
        """An async call queued on an idle worker: return once it is enqueued (NCCL calls
        reach the GPU in the program's order, see NcclBackend.watched), or once its job is
        past its own deadline (it is given up then)."""
        if not self.caller_waits:
            return
        while not self.enqueued.wait(_WATCHDOG_POLL):
            if self.future.test():  # (its job failed before it could say so)
                return
            limit = self.started[0] if self.started else None
            if limit is None and self.bound is not None:  # (not started: behind a job)
                limit = self.submitted + self.bound
            if limit is not None and time.monotonic() > limit:
                return

    def _on_gpu(self) -> bool:
        """Whether the job enqueued an async call (what is left is the GPU's)."""
        return self.event is not None and self.future.test() and self.future.error is None

    def test(self) -> bool:
        if not self.future.test():
            deadline = self._deadline()
            if deadline is not None and time.monotonic() >= deadline:
                self.backend.give_up(self.why)  # (its job is stuck: a check, or NCCL)
                raise _gave_up(self.where, self.timeout)
            return False
        if not self._on_gpu() or self._settled():
            return True
        try:
            if not self.backend.event_done(self.event, self.where):
                self._late()
                return False
            self.backend.check_done()  # (aborted meanwhile: the result is not valid)
        except BackendError as exc:
            return self._whole_or_raise(exc)
        return True

    def _whole_or_raise(self, exc: BackendError) -> bool:
        """After an error of the communicator: True where the call had completed before it
        (the abort marks the calls complete then: see NcclBackend._settle; read under the
        lock the abort holds while it marks them); else raise (reraise)."""
        with self.backend._lock:
            if self.expiry is not None and self.expiry.seen_done:
                return True
        self.reraise(exc)

    def _late(self) -> None:
        """Give the call up where it is on the GPU past its bound (the watchdog, which
        looks every _WATCHDOG_POLL s, would)."""
        late = self.expiry
        if late is not None and late.overdue(time.monotonic()):
            self.backend.give_up(self.why)
            raise _gave_up(self.where, late.bound)

    def _settled(self) -> bool:
        """Whether the call is known complete without asking the GPU: the watchdog saw it
        done before any abort, or the communicator was destroyed (free() waits for every
        call first)."""
        return (self.expiry is not None and self.expiry.seen_done) or (
            self.backend.aborted == _CLOSED
        )

    def reraise(self, exc: BackendError) -> NoReturn:
        """Raise ``exc`` (the communicator aborted, or an error of NCCL or CUDA), or this
        call's CommTimeoutError where the abort was its own give-up."""
        if self.why and self.backend.aborted == self.why:
            raise _gave_up(self.where, self.timeout) from exc
        raise exc

    def _deadline(self) -> float | None:
        if self.deadline is None and self.started:
            return self.started[0]
        return self.deadline

    def wait(self, timeout: float | None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        if not self._wait_job(timeout):
            return False
        if not self._on_gpu() or self._settled():
            return True
        try:
            if self.backend.host_wait(self.event, self.where, end):
                return True
        except BackendError as exc:
            return self._whole_or_raise(exc)
        self._late()
        return False

    def _wait_job(self, timeout: float | None) -> bool:
        deadline = self._deadline()
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        if self.future.wait(timeout):
            return True
        deadline = self._deadline()  # (an async call's job may have started meanwhile)
        if deadline is not None and time.monotonic() >= deadline:
            self.backend.give_up(self.why)
            # the abort ends the worker's wait at once (an enqueue blocked in NCCL's lazy
            # connect too); where the worker itself gave up, its error is the call's
            if self.future.wait(1.0) and isinstance(self.future.error, CommTimeoutError):
                return True
            raise _gave_up(self.where, self.timeout)
        return False

    def outcome(self) -> Any:
        return self.future.outcome()


class DeviceWork(Work):
    """A pending device operation: ``wait()`` makes the current stream wait on the event
    (the host is not blocked); ``synchronize(timeout)`` blocks the host until it is done."""

    __slots__ = ("_on_gpu",)

    def __init__(
        self,
        call: Call,
        seq: int,
        event: Any,
        backend: NcclBackend,
        result: Any,
        rec: Any = None,
        keep: Any = None,
    ) -> None:
        pending = _EventPending(event, result, backend, keep, call.where(seq))
        super().__init__(call, seq, pending, rec=rec)
        # its call on the GPU (a point-to-point Work's _pending wraps it; kept: a Work
        # finished by wait(), which only orders the stream, is still on the GPU, and
        # synchronize() must see an abort)
        self._on_gpu = pending

    def wait(self, timeout: float | None = None) -> Any:
        """Order the current stream after the operation (no host blocking); return the result.
        ``timeout`` is accepted for the host-path signature and ignored here: use
        :meth:`synchronize` for a host-side bound."""
        return super().wait(None)

    def synchronize(self, timeout: float | None = None) -> Any:
        """Block the host until the operation completes; on timeout abort the communicator
        (NCCL would spin forever) and raise CommTimeoutError. A CUDA error the GPU reported
        (an illegal address, say) is raised as BackendError, and NCCL's asynchronous errors
        too (the communicator is aborted); the Work keeps that error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 1e-5
        where = self._where()
        on_gpu = self._on_gpu
        backend = on_gpu.backend
        try:
            while not backend.event_done(on_gpu.event, where):
                backend.check()
                if deadline is not None and time.monotonic() > deadline:
                    backend.abort(f"{where} did not complete in {timeout:g} s")
                    raise CommTimeoutError(
                        f"{where}: not complete after {timeout:g} s on the GPU; the NCCL "
                        f"communicator was aborted (a rank never joined?)"
                    )
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
            on_gpu.verify()
            on_gpu.done()
        except HpccommError as exc:
            if not self._done:
                self._finish(exc)
            raise
        return self.wait()


_backends: weakref.WeakSet[NcclBackend] = weakref.WeakSet()


def _keep_in_child() -> None:
    """In a fork() child: CuPy's communicator objects destroy their NCCL communicators
    when collected (the parent's, here), so each is kept for the life of the process."""
    for backend in list(_backends):
        if backend.comm is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(backend.comm))


os.register_at_fork(after_in_child=_keep_in_child)


class NcclBackend:
    """Runs device calls on one NCCL communicator over the ranks of an MPI communicator.
    Making one is collective over that MPI communicator.

    Raises:
        GpuBindingError: two ranks would share a GPU (on every rank).
        BackendError: a rank could not describe its GPU or make the unique id (on every
            rank, naming it), or NCCL failed to create the communicator.
    """

    name = "nccl"

    def __init__(self, mpi_comm: Any, device: int, *, host: str | None = None) -> None:
        import cupy
        from cupy.cuda import nccl

        self._cupy = cupy
        self._nccl_mod = nccl
        self._runtime = cupy.cuda.runtime
        self.comm: Any = None
        self.device = device
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.version = int(nccl.get_version())
        self._aborted: str | None = None
        self._streams = WorkerStreams()
        self._lock = threading.RLock()  # the communicator between abort() and its users
        # the unfinished DeviceWorks' events: abort() marks those complete before it aborts
        self.pending: weakref.WeakSet[_EventPending] = weakref.WeakSet()
        # NCCL allows one thread at a time on a communicator (its "Thread safety" page):
        # point-to-point calls of one group may come from several threads
        self._issue = threading.Lock()
        # per thread: the call's sequence number (set by the dispatch just before its body)
        # and the running call's temporaries (held until the GPU is done with them)
        self._local = threading.local()
        # per stream handle and thread (CuPy's per-thread default stream has one handle for
        # every thread's own stream): an event recorded again after each call enqueued
        # there, and the call; release() waits for them before destroying the communicator
        self._tail: dict[tuple[int, int], tuple[Any, Call, int, threading.Thread]] = {}
        self._orphans: list[tuple[Any, Call, int, threading.Thread]] = []
        self._releasing = False
        # the watchdog of the worker's call (see bounded): its deadline and abort reason
        self._watch_cv = threading.Condition()
        self._watching: tuple[float, str] | None = None
        self._watch_thread: threading.Thread | None = None
        self._expiring: list[_Expiry] = []  # async calls on the GPU, in enqueue order
        self._gave_up: str | None = None  # the reason of the watchdog's abort
        # device calls submitted to the group's worker: not yet enqueued (later device calls
        # go there too, behind them, in order), and not yet finished (see idle)
        self.queued = 0
        self.jobs = 0
        self._watch_stop = False
        self._pid = os.getpid()  # (a fork() child must not touch CUDA or NCCL)
        where = f"NCCL init (rank {self.rank} of {self.size})"
        mine: Any = None
        uid: Any = None
        try:  # every rank reaches the allgather, so a failure here strands no one
            mine = tuple(gpu_identity(self._runtime, device, host or os.uname().nodename))
            if self.rank == 0:
                raw = nccl.get_unique_id()
                uid = (pack_unique_id(raw).tobytes(), isinstance(raw, (bytes, bytearray)))
        except Exception as exc:
            mine = f"{type(exc).__name__}: {exc}"
        # the sharing exception is the group's (each rank's own setting made some ranks
        # refuse while the others entered ncclCommInitRank and waited for them)
        allowed = multi_rank_gpu_allowed(self.version)
        gathered = mpi_comm.allgather((mine, uid, allowed))
        everyone = [(m, u) for m, u, _ in gathered]
        failed = [(r, m) for r, (m, _) in enumerate(everyone) if isinstance(m, str)]
        if everyone[0][1] is None and not failed:
            failed = [(0, "no unique id")]  # pragma: no cover - rank 0 fails above instead
        if failed:
            raise BackendError(
                f"{where}: "
                + "; ".join(f"rank {r} could not describe GPU or unique id: {m}" for r, m in failed)
            )
        identities = [GpuIdentity(*m) for m, _ in everyone]
        allowed_on = [r for r, (_, _, a) in enumerate(gathered) if a]
        check_unique_gpus(
            identities,
            self.rank,
            allowed=len(allowed_on) == self.size,
            allowed_on=allowed_on,
        )
        raw_id, as_bytes = everyone[0][1]
        commid = unpack_unique_id(np.frombuffer(raw_id, dtype=np.uint8), as_bytes)
        with cupy.cuda.Device(device):
            try:
                self.comm = nccl.NcclCommunicator(self.size, commid, self.rank)
            except nccl.NcclError as exc:
                raise BackendError(f"{where}: {exc}") from exc
        _backends.add(self)
        self._table: dict[O.OpSpec, Callable[..., Any]] = {
            O.ALL_REDUCE: self._all_reduce,
            O.REDUCE: self._reduce,
            O.BROADCAST: self._broadcast,
            O.ALL_GATHER: self._all_gather,
            O.GATHER: self._gather,
            O.SCATTER: self._scatter,
            O.REDUCE_SCATTER: self._reduce_scatter,
            O.ALL_TO_ALL: self._all_to_all,
            O.SEND: self._send,
            O.RECV: self._recv,
            O.SENDRECV: self._sendrecv,
            O.BATCH_P2P: self._batch,
        }

    # -- the interface ------------------------------------------------------------------

    @property
    def seq(self) -> int:
        """The sequence number of the call this thread runs (set by the dispatch)."""
        return int(getattr(self._local, "seq", 0))

    @seq.setter
    def seq(self, value: int) -> None:
        self._local.seq = value

    @property
    def _temps(self) -> list[Any]:
        temps = getattr(self._local, "temps", None)
        if temps is None:
            temps = self._local.temps = []
        return temps

    @_temps.setter
    def _temps(self, value: list[Any]) -> None:
        self._local.temps = value

    def supports(self, call: Call) -> bool:
        return call.spec in self._table

    def stream_now(self) -> Any:
        return self._cupy.cuda.get_current_stream()

    def worker_stream(self, stream: Any) -> tuple[Any, Any]:
        """(the stream for the worker thread, the stream it synchronizes or None); see
        WorkerStreams."""
        return self._streams.resolve(stream if stream is not None else self.stream_now())

    def error(self, call: Call, seq: int, exc: BaseException) -> HpccommError:
        return BackendError(f"{call.where(seq)}: {self.name} failed: {exc}")

    def prepare(self, call: Call) -> None:
        if call.device != self.device:
            raise InvalidArgumentError(
                f"{call}: array is on GPU {call.device}, expected GPU {self.device} (this "
                f"rank's GPU)"
            )
        spec = call.spec
        if spec.p2p and spec.arrays:
            check_tags(call, [call.tag])
            source = call.src if spec is O.SENDRECV else call.peer
            if spec is not O.SEND and source is None:
                raise InvalidArgumentError(f"{call}: NCCL cannot receive from any source; name src")
        if spec.reducing:
            call.how = self._plan(call)  # raises the DtypeError NCCL's tables give
        call.backend = self
        call.body = self._run
        call.mode = "stream"

    def _run(self, call: Call, data: Any, out: Any, stream: Any) -> Any:
        """Enqueue the call on ``stream`` (the current stream when None); returns the result,
        ordered on that stream."""
        stream = stream if stream is not None else self.stream_now()
        return self._enqueue(call, self.seq, data, out, stream)[0]

    def _enqueue(
        self,
        call: Call,
        seq: int,
        data: Any,
        out: Any,
        stream: Any,
        limit: float | None = None,
        why: str = "",
        own: bool = False,
    ) -> tuple[Any, Any, Any]:
        """Enqueue the call on ``stream``: (its result, the event recorded after it, which
        the thread's next call records again, and where ``own``, an event of its own, None
        otherwise). ``limit``: where the enqueue blocks the host (NCCL's lazy connect to a
        peer that never comes) past it, the watchdog aborts the communicator (``why``)."""
        try:
            self._take_issue(call, limit, why)
            try:
                if limit is not None:
                    self._watch(limit, why)
                try:
                    # The stream is made current too, so hpccomm's own CuPy work (PREMUL_SUM's
                    # scaled copy, local block copies, AVG's division) is ordered with NCCL's.
                    with self._cupy.cuda.Device(self.device), stream:
                        self._temps = []
                        result, post = self._table[call.spec](call, data, out, stream.ptr)
                        try:
                            self.check()
                            if post is not None:
                                post()
                        finally:  # (enqueued: release() must wait for it whatever came after)
                            event = self._enqueued(call, seq, stream)
                            mine = self._record(stream) if own else None
                finally:
                    if limit is not None:
                        self._watch(None, why)
            finally:
                self._issue.release()
        except self._nccl_mod.NcclError as exc:
            self.abort(f"{call.spec.name} failed: {exc}")
            raise BackendError(f"{call}: NCCL error {exc} (communicator aborted)") from exc
        return result, event, mine

    def _take_issue(self, call: Call, limit: float | None, why: str) -> None:
        """Take the issue lock (one thread at a time inside NCCL on this communicator),
        looking meanwhile for an abort (the holder may be blocked in NCCL's lazy connect) and
        past ``limit`` giving the call up; then refuse an aborted communicator."""
        while not self._issue.acquire(timeout=_WATCHDOG_POLL):
            if self._aborted is None and limit is not None and time.monotonic() > limit:
                self.give_up(why)
            if self._aborted is not None:
                break
        else:
            if self._aborted is None:
                return
            self._issue.release()
        raise BackendError(f"{call}: the NCCL communicator was aborted earlier ({self._aborted})")

    def _record(self, stream: Any) -> Any:
        with self._cupy.cuda.Device(self.device):
            event = self._cupy.cuda.Event(disable_timing=True)
            event.record(stream)
        return event

    def _enqueued(self, call: Call, seq: int, stream: Any) -> Any:
        """Note call ``seq`` just enqueued on ``stream`` by this thread: the (stream, thread)'s
        event, recorded again after it (created the first time), which release() waits
        for; returned. Entries whose event completed are dropped once there are 16."""
        me = threading.current_thread()
        key = (stream.ptr, me.ident or 0)
        with self._lock:
            noted = self._tail.get(key)
        if noted is not None and noted[3] is me:  # (inside _enqueue's device context)
            event = noted[0]
            event.record(stream)
        else:
            event = self._record(stream)
        with self._lock:
            tail = self._tail
            if noted is not None and noted[3] is not me:  # a dead thread's, its id reused
                # (the worker thread ends after idling, and Linux gives the next its id):
                # still waited for, until done
                self._orphans = [o for o in self._orphans if not self._finished(o[0])]
                self._orphans.append(noted)
            elif noted is None and len(tail) >= 16:
                for k, (e, _, _, _) in list(tail.items()):
                    if self._finished(e):
                        del tail[k]
            tail[key] = (event, call, seq, me)  # (named only where release() must)
        return event

    def _finished(self, event: Any) -> bool:
        """Whether ``event`` completed without error (an entry release() need not wait for;
        one with a CUDA error is kept, for release() to report)."""
        return bool(self._runtime.eventQuery(event.ptr) == CUDA_SUCCESS)

    def device_work(self, call: Call, seq: int, result: Any, stream: Any, rec: Any) -> DeviceWork:
        """The Work of an async device call just enqueued on ``stream`` (an event of its
        own: the table's is recorded again by the next call)."""
        stream = stream if stream is not None else self.stream_now()
        temps, self._temps = self._temps, []
        return DeviceWork(call, seq, self._record(stream), self, result, rec, temps)

    def watched(
        self,
        call: Call,
        seq: int,
        data: Any,
        out: Any,
        stream: Any,
        timeout: float | None,
        bound: float | None,
    ) -> _HostWait:
        """A call of a communicator with a timeout (``bound``) that needs no debug check:
        enqueued here, in the caller's thread, so NCCL calls reach the GPU in the order the
        program made them. NCCL matches a communicator's calls across ranks by their order,
        and two communicators' calls on a stream run in the order enqueued: ranks whose calls
        of two groups reached the GPU in different orders would wait for each other there
        until the timeout (while the group's worker thread enqueued each call and waited on
        the host for it before the next, async calls returned at once, and that order
        depended on how long the GPU took on each rank).

        The enqueue is bounded by the watchdog (NCCL's lazy connect may block the host
        there). A synchronous call (``timeout``) is then waited for on the host by its Work,
        given up ``timeout`` after the call: the communicator is aborted and the call's error
        is CommTimeoutError. An async call's Work waits for its event; the watchdog gives it
        up ``bound`` seconds after its start (the call, or where the calls before it on its
        stream were still running, when it saw them done), also where the Work was dropped
        unwaited. PyTorch's NCCL watchdog likewise aborts every Work past the timeout."""
        where = call.where(seq)
        stream = stream if stream is not None else self.stream_now()
        called = time.monotonic()
        limit = timeout if timeout is not None else bound
        wait = _HostWait(self, where, limit, None if timeout is None else called + timeout, bound)
        deadline = None if limit is None else called + limit
        try:
            result, _, event = self._enqueue(call, seq, data, out, stream, deadline, wait.why, True)
        except BackendError as exc:
            wait.reraise(exc)  # (the watchdog's abort of a blocked enqueue: its timeout)
        self._given(wait, event, stream, called, timeout)
        done = Future(where)
        done.value = result
        done.done.set()
        wait.future = done
        return wait

    def _given(self, wait: _HostWait, event: Any, stream: Any, called: float, timeout: Any) -> None:
        """``wait``'s call enqueued, with its own ``event``: what its Work waits for."""
        # (its temporaries: alive until the GPU is done with them, held by the Work alone: the
        # thread's own list kept them until its next call)
        wait.event, wait.keep, self._temps = event, self._temps, []
        bound = timeout if timeout is not None else wait.bound
        if bound is not None:  # the watchdog looks (a synchronous call's caller too, but its
            # wait may end early: a peer's failure notice, a Ctrl-C)
            ptr = stream.ptr  # (CuPy's per-thread default stream: one handle, each thread's)
            key = (ptr, threading.get_ident() if ptr == self._runtime.streamPerThread else 0)
            wait.expiry = self._expire(event, key, called, bound, wait.why, wait.where)

    def bounded(
        self,
        submit: Callable[..., Any],
        call: Call,
        seq: int,
        data: Any,
        out: Any,
        stream: Any,
        check: Callable[[Call, int], None] | None,
        timeout: float | None,
        bound: float | None,
        idle: bool = True,
    ) -> _HostWait:
        """A call the debug check compares first, on a communicator with a timeout or whose
        worker thread has jobs queued: the check (an exchange over MPI, in the order of the
        group's other calls on the worker) and the enqueue run on the worker (``submit``: its
        Executor's submit). A synchronous call is then waited for on the host by the worker
        until the GPU has finished it; one not finished ``timeout`` seconds after it was made
        is given up by its caller's wait (the communicator aborted, CommTimeoutError), and by
        the worker ``bound`` seconds (the group's timeout; None: never) after the call, or
        after its start where it waited behind the worker's earlier jobs. An async call's
        job ends once enqueued; where the worker was ``idle`` its caller waits for that
        (``_HostWait.until_enqueued``, the NCCL order; see watched), and its Work and the
        watchdog go on as there."""
        where = call.where(seq)
        stream, _ = self.worker_stream(stream)  # the job waits for it on the host anyway
        submitted = time.monotonic()
        deadline = None if timeout is None else submitted + timeout
        wait = _HostWait(self, where, timeout if timeout is not None else bound, deadline, bound)
        wait.caller_waits = timeout is None and idle and not on_worker()

        def job() -> Any:
            now = time.monotonic()  # from the call where the worker took it at once (its
            # wake-up), so that a caller's wait bounded alike never ends before it; from here
            # where it waited behind the worker's earlier jobs
            began = submitted if now - submitted < _PROMPT else now
            limit = None if bound is None else began + bound
            wait.started.append(limit)
            why = wait.why
            try:
                try:
                    self._cupy.cuda.Device(self.device).use()  # (this thread's CUDA calls:
                    # not on GPU 0's context, which a thread without a device would make)
                    if check is not None:
                        check(call, seq)  # the debug check, in the call's place in the order
                    result, event, mine = self._enqueue(
                        call, seq, data, out, stream, limit, why, timeout is None
                    )
                    if timeout is None:  # async: the GPU goes on, watched
                        self._given(wait, mine, stream, began, None)
                        return result
                    keep, self._temps = self._temps, []  # alive until the GPU is done
                finally:
                    with self._lock:
                        self.queued -= 1
                    wait.enqueued.set()
                if not self.host_wait(event, where, limit):
                    self.give_up(why)
                    raise _gave_up(where, bound)
                del keep
                return result
            except BackendError as exc:
                wait.reraise(exc)  # (the watchdog's abort of a blocked enqueue: its timeout)

        def finished() -> None:  # (after the Executor's own count: see the dispatch's
            with self._lock:  # "behind", host jobs only)
                self.jobs -= 1

        with self._lock:
            self.queued += 1
            self.jobs += 1
        try:
            wait.future = submit(where, job)
        except BaseException:
            with self._lock:
                self.queued -= 1
                self.jobs -= 1
            raise
        wait.future.add_done_callback(finished)
        return wait

    def _watch(self, deadline: float | None, why: str) -> None:
        """Have the watchdog abort the communicator (reason ``why``) at ``deadline``; None:
        the enqueue ended. (Under _issue: one enqueue at a time.)"""
        with self._watch_cv:
            self._watching = None if deadline is None else (deadline, why)
            self._start_watchdog(deadline is not None)

    def _expire(
        self, event: Any, key: Any, called: float, bound: float, why: str, where: str
    ) -> _Expiry:
        """Have the watchdog give up the async call whose ``event`` was just recorded on
        stream ``key``: ``bound`` seconds after ``called``, or, where an earlier call on the
        stream is still running, after the watchdog sees those done."""
        with self._watch_cv:
            # (the stream runs its calls in order: the latest one on it says for all)
            last = next((e for e in reversed(self._expiring) if e.key == key), None)
            queued = last is not None and not self._finished(last.event)
            expiry = _Expiry(event, key, None if queued else called, bound, why, where)
            self._expiring.append(expiry)
            self._start_watchdog(True)
        return expiry

    def _start_watchdog(self, needed: bool) -> None:
        """(Under _watch_cv.) Start the watchdog thread where ``needed`` and not running;
        wake it."""
        if self._watch_thread is None and needed:
            self._watch_thread = threading.Thread(
                target=self._watchdog,
                name=f"hpccomm NCCL watchdog (rank {self.rank})",
                daemon=True,
            )
            self._watch_thread.start()
        self._watch_cv.notify()

    def _sweep(self, now: float) -> tuple[str, bool] | None:
        """(Under _watch_cv.) Drop the async calls the GPU has finished, start the clocks of
        those whose earlier calls on their stream are done; the reason to abort, if any,
        and whether it is a timeout: a CUDA error the GPU reported (the first call whose
        event says one: a sticky error never completes, and was given up as a timeout), or
        the first call past its bound."""
        if self._aborted is not None:  # (aborted elsewhere: an event done now may be the
            self._expiring = []  # abort's, its call cut short)
            return None
        running: set[Any] = set()
        left: list[_Expiry] = []
        done: list[_Expiry] = []
        late = failed = None
        for e in self._expiring:
            if e.start is None and e.key not in running:
                e.start = now  # (its stream's earlier calls were seen done by now)
            try:
                if self.event_done(e.event, e.where):
                    done.append(e)
                    continue
            except BackendError as exc:
                failed = failed or str(exc)
            running.add(e.key)
            left.append(e)
            if late is None and e.overdue(now):
                late = e.why
        if self._aborted is not None:  # (aborted while the events were asked: abort()
            self._expiring = []  # marks it before ncclCommAbort, so one seen done before
            return None  # this look completed before the abort; not known here)
        for e in done:
            e.seen_done = True
        self._expiring = left
        if failed is not None:
            return failed, False
        return None if late is None else (late, True)

    def _watchdog(self) -> None:
        try:  # (its event queries: not on GPU 0's context, see bounded's job)
            self._cupy.cuda.Device(self.device).use()
        except Exception:  # pragma: no cover - a device that went away: queries still work
            pass
        self._watch_loop()

    def _watch_loop(self) -> None:
        """Abort the communicator where a call passes its deadline where no thread of the
        caller's looks at the time: an enqueue blocked inside NCCL (its lazy connect to a
        peer that never comes blocks the host), and calls on the GPU (an async call's Work
        may have been dropped, a synchronous call's wait ended early). Those are looked at
        every _WATCHDOG_POLL seconds while there are some."""
        cv = self._watch_cv
        while True:
            with cv:
                while True:
                    if self._watch_stop:
                        return
                    now = time.monotonic()
                    watching = self._watching
                    found = None
                    if watching is not None and watching[0] <= now:
                        found = (watching[1], True)
                    elif self._expiring:
                        found = self._sweep(now)
                    if found is not None:
                        why, timed_out = found
                        break
                    naps = [_WATCHDOG_POLL] if self._expiring else []
                    if watching is not None:
                        naps.append(watching[0] - now)
                    cv.wait(min(naps) if naps else None)
            with self._lock:  # (the order release() takes them in)
                with cv:
                    if self._watch_stop:
                        return
                    if watching is not None and why == watching[1]:
                        if self._watching is not watching:  # that call ended meanwhile
                            continue
                        self._watching = None
                if timed_out:  # (the abort marks the calls complete by now: _settle)
                    self.give_up(why)
                else:  # (a CUDA error: the Works waited for raise it, not a timeout)
                    self.abort(why)
                with cv:
                    self._expiring = []

    def event_done(self, event: Any, where: object) -> bool:
        """Whether the event completed; a CUDA error the GPU reported raises BackendError."""
        return event_done(self._runtime, event, where)

    def host_wait(self, event: Any, where: str, deadline: float | None = None) -> bool:
        """Block this thread until ``event`` completes (True) or ``deadline`` (monotonic
        time; None: none) passes (False), watching NCCL's asynchronous errors and an abort
        from another thread (which ends the wait with BackendError)."""
        pause = 1e-5
        while not self.event_done(event, where):
            self.check(done=True)  # (closed cleanly: free() saw every call done; it is)
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        self.check_done()
        return True

    def check_done(self) -> None:
        """check() for a call whose event completed: fine once free() destroyed the
        communicator cleanly (it waited for every call first)."""
        self.check(done=True)

    def check(self, done: bool = False) -> None:
        """Raise the NCCL communicator's asynchronous error, if any, as a BackendError (the
        communicator is aborted); raise if it was aborted (``done``: not where free()
        destroyed it cleanly, which it does once every call it knows of is done)."""
        with self._lock:
            if self._aborted is None and self._released_by_cupy():
                # CuPy's handle is 0: the program aborted or destroyed it (comm.nccl), which
                # NCCL's error query would call an invalid argument
                self._aborted = "aborted or destroyed through CuPy (comm.nccl)"
            if self._aborted is not None:
                if done and self._aborted == _CLOSED:
                    return
                raise BackendError(
                    f"NCCL (rank {self.rank} of {self.size}): the communicator was aborted "
                    f"({self._aborted})"
                )
            try:
                self.comm.check_async_error()
            except self._nccl_mod.NcclError as exc:
                self.abort(f"asynchronous error: {exc}")
                raise BackendError(
                    f"NCCL (rank {self.rank} of {self.size}): asynchronous error {exc} "
                    f"(communicator aborted)"
                ) from exc

    @property
    def aborted(self) -> str | None:
        """Why the communicator was aborted (None: it was not)."""
        return self._aborted

    def give_up(self, why: str) -> None:
        """Abort the communicator because a call passed the group's timeout (``why``
        names it): free() says so where it was waiting for that call."""
        with self._lock:
            if self._aborted is None:
                self._gave_up = why
            self.abort(why)

    def abort(self, why: str) -> None:
        """Abort the communicator so no rank is left spinning; later calls raise. Safe from
        another thread than the one waiting on the communicator."""
        with self._lock:
            if self._aborted is None:
                try:  # (first: the watchdog's sweep, seeing _aborted, would drop the calls
                    # it had not yet seen done without marking them)
                    self._settle()
                finally:  # (whatever happened there: the GPU must not spin for ever)
                    self._aborted = why
                    try:
                        self.comm.abort()
                    except Exception:  # already broken: nothing more to release
                        pass

    def _released_by_cupy(self) -> bool:
        """Whether CuPy's handle is 0: the program aborted or destroyed the communicator
        itself (``comm.nccl.abort()``), not through hpccomm."""
        return getattr(self.comm, "comm", None) == 0

    def _settle(self) -> None:
        """(Under _lock, just before an abort.) The calls complete now are whole, whatever
        comes next: mark the unfinished DeviceWorks' (the set is added to under _lock), and
        the bounded calls' the watchdog has not seen done yet. Not after the program
        aborted the communicator through CuPy: their kernels may have been cut short."""
        if self._released_by_cupy():
            return
        for p in list(self.pending):
            p.settled = self._finished(p.event)
        with self._watch_cv:
            for e in self._expiring:
                e.seen_done = e.seen_done or self._finished(e.event)

    def close(self) -> None:
        """Release the communicator once the GPU has finished the calls enqueued on it
        (no bound; see release); raise what release returns."""
        problem = self.release(None)
        if problem is not None:
            raise problem

    def release(self, timeout: float | None) -> HpccommError | None:
        """Release the communicator once the GPU has finished the calls enqueued on it.

        ncclCommDestroy finalizes the communicator, which waits for its unfinished operations
        inside NCCL, without bound and deaf to Ctrl-C: an async call dropped without
        synchronize() whose peer never came hung free() there. So the host waits first, here,
        for the event after the last call of each stream and thread, watching NCCL's
        asynchronous errors; after ``timeout`` seconds (None: no bound, as the group's calls),
        or on an error, the communicator is aborted instead of destroyed. Returns that error
        (the communicator is released either way), None when all finished. Interrupted
        (KeyboardInterrupt), nothing is released and a later call waits again; in a fork()
        child nothing is touched (the parent's communicator and GPU context are not its).
        NCCL makes destroy and abort collective among a node's ranks: every rank of the
        group should free it."""
        if os.getpid() != self._pid:  # (its CuPy object is kept: see _keep_in_child; no
            # lock taken: another thread of the parent may have held one at the fork)
            if self._aborted is None:
                self._aborted = "left to the parent process (this is a fork() child)"
            return None
        with self._lock:
            if self._aborted is not None or self.comm is None or self._releasing:
                if self._aborted is not None:
                    self._stop_watchdog()
                return None  # (released, or being released by another thread)
            if self._released_by_cupy():
                self._aborted = "released through CuPy (comm.nccl) before free()"
                self._stop_watchdog()
                return None
            self._releasing = True
            pending = [*self._tail.values(), *self._orphans]
        deadline = None if timeout is None else time.monotonic() + timeout
        problem: HpccommError | None = None
        try:
            try:
                for event, call, seq, _ in pending:
                    where = f"free: NCCL (rank {self.rank} of {self.size}), {call.where(seq)}"
                    if not self.host_wait(event, where, deadline):
                        raise CommTimeoutError(
                            f"{where} was not complete on the GPU after {timeout:g} s (some "
                            f"rank of the group has not joined it?), so the NCCL communicator "
                            f"was aborted instead of destroyed; its results are not valid"
                        )
            except HpccommError as exc:
                problem = exc
                late = self._aborted
                if late is not None and late == self._gave_up:  # the watchdog's, meanwhile
                    problem = CommTimeoutError(
                        f"free: NCCL (rank {self.rank} of {self.size}): {late} (the group's "
                        f"timeout), so the NCCL communicator was aborted instead of "
                        f"destroyed; its results are not valid"
                    )
                    problem.__cause__ = exc
            with self._lock:
                if problem is not None:
                    self.abort(str(problem))
                elif self._aborted is None:
                    self.comm.destroy()
                    self._aborted = _CLOSED
                self._tail, self._orphans = {}, []
            self._stop_watchdog()
        finally:  # (interrupted, KeyboardInterrupt: nothing released, a later call waits again)
            with self._lock:
                self._releasing = False
        return problem

    def _stop_watchdog(self) -> None:
        with self._watch_cv:
            self._watch_stop = True
            self._watch_cv.notify()

    # -- helpers ------------------------------------------------------------------------

    def _plan(self, call: Call) -> NcclPlan:
        return plan_reduction(call.dtype_info(), call.redop, self.version, call)

    def _source(self, call: Call, x: Any, plan: NcclPlan) -> Any:
        """The send array of a reduction: a scaled copy for PREMUL_SUM, else the input."""
        if plan.prescale is None:
            return x
        scaled = (x * plan.prescale).astype(x.dtype, copy=False)
        self._temps.append(scaled)  # an async call's DeviceWork holds it until completion
        return scaled

    def _avg(self, plan: NcclPlan, target: Any) -> Callable[[], None] | None:
        if not plan.divide_after:
            return None
        n, cupy = self.size, self._cupy

        def divide() -> None:
            cupy.divide(target, n, out=target)

        return divide

    @staticmethod
    def _type(call: Call) -> tuple[int, int]:
        return nccl_dtype(call.dtype_info(), call)

    @staticmethod
    def _rows(array: Any) -> Any:
        return array.reshape(-1)

    # -- collectives: each returns (result, post-step or None) --------------------------

    def _all_reduce(self, call: Call, x: Any, out: Any, s: int) -> Step:
        plan = call.how
        src = self._source(call, x, plan)
        self.comm.allReduce(
            src.data.ptr, x.data.ptr, x.size * plan.per_element, plan.dtype, plan.op, s
        )
        return x, self._avg(plan, x)

    def _reduce(self, call: Call, x: Any, out: Any, s: int) -> Step:
        plan = call.how
        src = self._source(call, x, plan)
        self.comm.reduce(
            src.data.ptr, x.data.ptr, x.size * plan.per_element, plan.dtype, plan.op, call.peer, s
        )
        return x, self._avg(plan, x) if self.rank == call.peer else None

    def _broadcast(self, call: Call, x: Any, out: Any, s: int) -> Step:
        dt, per = self._type(call)
        self.comm.bcast(x.data.ptr, x.size * per, dt, call.peer, s)
        return x, None

    def _grouped(
        self, sends: list[Transfer], recvs: list[Transfer], dt: int, per: int, s: int
    ) -> None:
        """Post sends and receives as one NCCL group (NCCL's way to build all-to-all and
        friends); each entry is (flat array, peer, element offset, element count), and
        zero-count entries are skipped. Every pointer is computed before groupStart."""
        posts = [
            (self.comm.send, arr[off:].data.ptr, cnt * per, peer)
            for arr, peer, off, cnt in sends
            if cnt
        ] + [
            (self.comm.recv, arr[off:].data.ptr, cnt * per, peer)
            for arr, peer, off, cnt in recvs
            if cnt
        ]
        self._group(posts, dt, s)

    def _group(
        self, posts: list[tuple[Callable[..., Any], int, int, int]], dt: Any, s: int
    ) -> None:
        """One NCCL group of (send or recv, pointer, count, peer); ``dt`` is one NCCL type or
        a list of one per post."""
        nccl = self._nccl_mod
        types = dt if isinstance(dt, list) else [dt] * len(posts)
        nccl.groupStart()
        try:
            for (fn, ptr, n, peer), t in zip(posts, types, strict=True):
                fn(ptr, n, t, peer, s)
        finally:
            nccl.groupEnd()

    def _all_gather(self, call: Call, x: Any, out: Any, s: int) -> Step:
        dt, per = self._type(call)
        if not call.uneven:
            self.comm.allGather(x.data.ptr, out.data.ptr, x.size * per, dt, s)
            return out, None
        counts, displs = call.counts
        flat_out = self._rows(out)
        flat_out[displs[self.rank] : displs[self.rank] + counts[self.rank]] = self._rows(x)
        peers = [p for p in range(self.size) if p != self.rank]
        sends = [(self._rows(x), p, 0, counts[self.rank]) for p in peers]
        recvs = [(flat_out, p, displs[p], counts[p]) for p in peers]
        self._grouped(sends, recvs, dt, per, s)
        return out, None

    def _gather(self, call: Call, x: Any, out: Any, s: int) -> Step:
        dt, per = self._type(call)
        x = self._rows(x)
        root = call.peer
        if self.rank != root:
            self._grouped([(x, root, 0, x.size)], [], dt, per, s)
            return None, None
        counts, displs = call.counts
        flat_out = self._rows(out)
        flat_out[displs[root] : displs[root] + counts[root]] = x
        recvs = [(flat_out, p, displs[p], counts[p]) for p in range(self.size) if p != root]
        self._grouped([], recvs, dt, per, s)
        return out, None

    def _scatter(self, call: Call, x: Any, out: Any, s: int) -> Step:
        dt, per = self._type(call)
        flat = self._rows(out)
        root = call.peer
        counts, displs = call.counts
        if self.rank != root:
            self._grouped([], [(flat, root, 0, counts[self.rank])], dt, per, s)
            return out, None
        x = self._rows(x)
        flat[...] = x[displs[root] : displs[root] + counts[root]]
        sends = [(x, p, displs[p], counts[p]) for p in range(self.size) if p != root]
        self._grouped(sends, [], dt, per, s)
        return out, None

    def _reduce_scatter(self, call: Call, x: Any, out: Any, s: int) -> Step:
        plan = call.how
        src = self._source(call, x, plan)
        if not call.uneven:
            self.comm.reduceScatter(
                src.data.ptr, out.data.ptr, out.size * plan.per_element, plan.dtype, plan.op, s
            )
            return out, self._avg(plan, out)
        counts, displs = call.counts
        flat = self._rows(src)
        reduces = [  # uneven blocks: one reduce per destination, grouped
            (
                flat[displs[j] :].data.ptr,
                out.data.ptr if j == self.rank else flat[displs[j] :].data.ptr,
                counts[j] * plan.per_element,
                j,
            )
            for j in range(self.size)
            if counts[j]
        ]
        nccl = self._nccl_mod
        nccl.groupStart()
        try:
            for send, recv, n, root in reduces:
                self.comm.reduce(send, recv, n, plan.dtype, plan.op, root, s)
        finally:
            nccl.groupEnd()
        return out, self._avg(plan, out)

    def _all_to_all(self, call: Call, x: Any, out: Any, s: int) -> Step:
        dt, per = self._type(call)
        scounts, sdispls = call.send_counts
        rcounts, rdispls = call.counts
        x, flat = self._rows(x), self._rows(out)
        sends = [(x, p, sdispls[p], scounts[p]) for p in range(self.size)]
        recvs = [(flat, p, rdispls[p], rcounts[p]) for p in range(self.size)]
        self._grouped(sends, recvs, dt, per, s)
        return out, None

    # -- point-to-point -----------------------------------------------------------------

    def _send(self, call: Call, x: Any, out: Any, s: int) -> Step:
        dt, per = self._type(call)
        self.comm.send(x.data.ptr, x.size * per, dt, call.peer, s)
        return None, None

    def _recv(self, call: Call, x: Any, out: Any, s: int) -> Step:
        dt, per = self._type(call)
        self.comm.recv(x.data.ptr, x.size * per, dt, call.peer, s)
        return call.peer, None

    def _sendrecv(self, call: Call, x: Any, out: Any, s: int) -> Step:
        dt, per = self._type(call)
        x, flat = self._rows(x), self._rows(out)
        self._grouped([(x, call.peer, 0, x.size)], [(flat, call.src, 0, flat.size)], dt, per, s)
        return out, None

    def _batch(self, call: Call, items: Any, out: Any, s: int) -> Step:
        """batch_isend_irecv as one NCCL group. The whole batch is checked before groupStart
        (an entry refused half-way would leave the others posted and the peers waiting for
        ever): every array on this rank's GPU, with an NCCL type, and no tags (NCCL matches
        the sends and receives between two ranks in the order they are posted)."""
        posts: list[tuple[Callable[..., Any], int, int, int]] = []
        types: list[int] = []
        for i, p in enumerate(items):
            b = p.buffer()
            if b.device != self.device:
                where = "a host array" if b.device is None else f"on GPU {b.device}"
                raise InvalidArgumentError(
                    f"{call}: ops[{i}].array is {where}, expected GPU {self.device} (this "
                    f"rank's GPU): NCCL moves this GPU's arrays only; nothing was posted"
                )
            dt, per = nccl_dtype(SUPPORTED_DTYPES[b.dtype], f"{call}: ops[{i}]")
            fn = self.comm.send if p.op == "send" else self.comm.recv
            posts.append((fn, b.array.data.ptr, b.array.size * per, p.peer))
            types.append(dt)
        check_tags(call, [p.tag for p in items])
        self._group(posts, types, s)
        return None, None
