"""The NCCL backend: device (CuPy) arrays through ``cupy.cuda.nccl``.

The communicator is bootstrapped over MPI: rank 0 makes the unique id, it travels as a
128-byte uint8 buffer with MPI Bcast, and every rank creates ``NcclCommunicator`` on its bound
GPU. Before that, all ranks exchange (host, PCI bus id) and two ranks on one GPU are refused on
every rank. Operations run on the caller's current CuPy stream (or ``stream=``); a synchronous
call returns with the result ordered on that stream, as NCCL does; ``async_op=True`` returns a
:class:`DeviceWork` holding a CUDA event.

The tables and checks at the top of this module need no GPU (the CPU tests use them); CuPy is
imported only when a backend is made.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

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
from ..ops import Call
from ..work import Work

__all__ = [
    "NcclBackend",
    "DeviceWork",
    "NcclPlan",
    "plan_reduction",
    "nccl_dtype",
    "pack_unique_id",
    "unpack_unique_id",
    "check_unique_gpus",
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


def multi_rank_gpu_allowed(nccl_version: int, environ: dict[str, str] | None = None) -> bool:
    """True when NCCL_MULTI_RANK_GPU_ENABLE=1 and NCCL >= 2.30 lets ranks share a GPU."""
    env = os.environ if environ is None else environ
    return env.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1" and nccl_version >= MULTI_RANK_GPU_SINCE


def check_unique_gpus(
    identities: Sequence[tuple[str, str]], rank: int, *, allowed: bool = False
) -> None:
    """Raise GpuBindingError (on every rank that calls it) when two ranks share one GPU.

    Args:
        identities: (host, GPU PCI bus id or UUID) of every rank, in rank order.
        rank: this rank.
        allowed: sharing is explicitly allowed (see :func:`multi_rank_gpu_allowed`).
    """
    if allowed:
        return
    seen: dict[tuple[str, str], list[int]] = {}
    for r, ident in enumerate(identities):
        host, gpu = ident
        seen.setdefault((host, gpu), []).append(r)
    shared = [(ident, ranks) for ident, ranks in seen.items() if len(ranks) > 1]
    if shared:
        (host, gpu), ranks = shared[0]
        more = f" (and {len(shared) - 1} more GPU(s) shared)" if len(shared) > 1 else ""
        raise GpuBindingError(
            f"NCCL init (rank {rank} of {len(identities)}): ranks {ranks} on host {host} would "
            f"share GPU {gpu}{more}; NCCL rejects two ranks of one communicator on one GPU. Give "
            f"each rank its own GPU (srun --gpus-per-task=1, or as many tasks per node as GPUs), "
            f"or allow it with NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL >= 2.30, slow, for testing)"
        )


class _EventPending:
    """A device operation enqueued on a stream: done when its CUDA event is."""

    __slots__ = ("event", "result", "backend", "keep")

    def __init__(self, event: Any, result: Any, backend: NcclBackend, keep: Any = None) -> None:
        self.event = event
        self.result = result
        self.backend = backend
        self.keep = keep  # temporaries the GPU reads until the event (PREMUL_SUM's copy)

    def test(self) -> bool:
        return bool(self.event.done)

    def wait(self, timeout: float | None) -> bool:
        import cupy

        cupy.cuda.get_current_stream().wait_event(self.event)  # ordered, the host not blocked
        return True

    def outcome(self) -> Any:
        return self.result


class DeviceWork(Work):
    """A pending device operation: ``wait()`` makes the current stream wait on the event
    (the host is not blocked); ``synchronize(timeout)`` blocks the host until it is done."""

    __slots__ = ("_event", "_backend")

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
        super().__init__(call, seq, _EventPending(event, result, backend, keep), rec=rec)
        self._event = event
        self._backend = backend

    def wait(self, timeout: float | None = None) -> Any:
        """Order the current stream after the operation (no host blocking); return the result.
        ``timeout`` is accepted for the host-path signature and ignored here: use
        :meth:`synchronize` for a host-side bound."""
        return super().wait(None)

    def is_completed(self) -> bool:
        """True when the GPU has finished the operation (never blocks)."""
        return bool(self._event.done)

    def synchronize(self, timeout: float | None = None) -> Any:
        """Block the host until the operation completes; on timeout abort the communicator
        (NCCL would spin forever) and raise CommTimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._event.done:
            self._backend.check()
            if deadline is not None and time.monotonic() > deadline:
                self._backend.abort(f"{self._where()} did not complete in {timeout:g} s")
                raise CommTimeoutError(
                    f"{self._where()}: not complete after {timeout:g} s on the GPU; the NCCL "
                    f"communicator was aborted (a rank never joined?)"
                )
            time.sleep(1e-4)
        self._backend.check()
        return self.wait()


class NcclBackend:
    """Runs device calls on one NCCL communicator over the ranks of an MPI communicator.
    Making one is collective over that MPI communicator."""

    name = "nccl"

    def __init__(self, mpi_comm: Any, device: int) -> None:
        import cupy
        from cupy.cuda import nccl

        self._cupy = cupy
        self._nccl_mod = nccl
        self.device = device
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.version = int(nccl.get_version())
        self._aborted: str | None = None
        self._temps: list[Any] = []  # the running call's temporaries (held by its DeviceWork)
        host = os.uname().nodename
        bus = cupy.cuda.runtime.deviceGetPCIBusId(device)
        identities = mpi_comm.allgather((host, bus))
        check_unique_gpus(identities, self.rank, allowed=multi_rank_gpu_allowed(self.version))
        buf = np.empty(UNIQUE_ID_BYTES, dtype=np.uint8)
        as_bytes = None
        if self.rank == 0:
            uid = nccl.get_unique_id()
            as_bytes = isinstance(uid, (bytes, bytearray))
            buf[:] = pack_unique_id(uid)
        mpi_comm.Bcast(buf, root=0)
        as_bytes = mpi_comm.bcast(as_bytes, root=0)
        with cupy.cuda.Device(device):
            try:
                self.comm = nccl.NcclCommunicator(
                    self.size, unpack_unique_id(buf, as_bytes), self.rank
                )
            except nccl.NcclError as exc:
                raise BackendError(f"NCCL init (rank {self.rank} of {self.size}): {exc}") from exc
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

    def supports(self, call: Call) -> bool:
        return call.spec in self._table

    def stream_now(self) -> Any:
        return self._cupy.cuda.get_current_stream()

    def error(self, call: Call, seq: int, exc: BaseException) -> HpccommError:
        return BackendError(f"{call.where(seq)}: {self.name} failed: {exc}")

    def prepare(self, call: Call) -> None:
        if call.device != self.device:
            raise InvalidArgumentError(
                f"{call}: array is on GPU {call.device}, expected GPU {self.device} (this "
                f"rank's GPU)"
            )
        if call.spec.reducing:
            call.how = self._plan(call)  # raises the DtypeError NCCL's tables give
        call.backend = self
        call.body = self._run
        call.mode = "stream"

    def _run(self, call: Call, data: Any, out: Any, stream: Any) -> Any:
        """Enqueue the call on ``stream`` (the current stream when None); returns the result,
        ordered on that stream."""
        if self._aborted:
            raise BackendError(
                f"{call}: the NCCL communicator was aborted earlier ({self._aborted})"
            )
        stream = stream if stream is not None else self._cupy.cuda.get_current_stream()
        try:
            # The stream is made current too, so hpccomm's own CuPy work (PREMUL_SUM's scaled
            # copy, local block copies, AVG's division) is ordered with the NCCL calls.
            with self._cupy.cuda.Device(self.device), stream:
                self._temps = []
                result, post = self._table[call.spec](call, data, out, stream.ptr)
                self.comm.check_async_error()
                if post is not None:
                    post()
        except self._nccl_mod.NcclError as exc:
            self.abort(f"{call.spec.name} failed: {exc}")
            raise BackendError(f"{call}: NCCL error {exc} (communicator aborted)") from exc
        return result

    def device_work(self, call: Call, seq: int, result: Any, stream: Any, rec: Any) -> DeviceWork:
        """The Work of an async device call just enqueued on ``stream``."""
        stream = stream if stream is not None else self._cupy.cuda.get_current_stream()
        event = self._cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        temps, self._temps = self._temps, []
        return DeviceWork(call, seq, event, self, result, rec, temps)

    def check(self) -> None:
        """Raise the NCCL communicator's asynchronous error, if any, as a BackendError."""
        try:
            self.comm.check_async_error()
        except self._nccl_mod.NcclError as exc:
            self.abort(f"asynchronous error: {exc}")
            raise BackendError(
                f"NCCL (rank {self.rank} of {self.size}): asynchronous error {exc} (communicator aborted)"
            ) from exc

    def abort(self, why: str) -> None:
        """Abort the communicator so no rank is left spinning; later calls raise."""
        if self._aborted is None:
            self._aborted = why
            try:
                self.comm.abort()
            except Exception:  # already broken: nothing more to release
                pass

    def close(self) -> None:
        if self._aborted is None and getattr(self, "comm", None) is not None:
            self.comm.destroy()
            self._aborted = "closed"

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
        zero-count entries are skipped."""
        nccl = self._nccl_mod
        nccl.groupStart()
        try:
            for arr, peer, off, cnt in sends:
                if cnt:
                    self.comm.send(arr[off:].data.ptr, cnt * per, dt, peer, s)
            for arr, peer, off, cnt in recvs:
                if cnt:
                    self.comm.recv(arr[off:].data.ptr, cnt * per, dt, peer, s)
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
        nccl = self._nccl_mod
        nccl.groupStart()  # uneven blocks: one reduce per destination, grouped
        try:
            for j in range(self.size):
                if counts[j]:
                    dst = out.data.ptr if j == self.rank else flat[displs[j] :].data.ptr
                    self.comm.reduce(
                        flat[displs[j] :].data.ptr,
                        dst,
                        counts[j] * plan.per_element,
                        plan.dtype,
                        plan.op,
                        j,
                        s,
                    )
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
        if call.peer is None:
            raise InvalidArgumentError(f"{call}: NCCL cannot receive from any source; name src")
        dt, per = self._type(call)
        self.comm.recv(x.data.ptr, x.size * per, dt, call.peer, s)
        return call.peer, None

    def _sendrecv(self, call: Call, x: Any, out: Any, s: int) -> Step:
        if call.src is None:
            raise InvalidArgumentError(f"{call}: NCCL cannot receive from any source; name src")
        dt, per = self._type(call)
        x, flat = self._rows(x), self._rows(out)
        self._grouped([(x, call.peer, 0, x.size)], [(flat, call.src, 0, flat.size)], dt, per, s)
        return out, None

    def _batch(self, call: Call, items: Any, out: Any, s: int) -> Step:
        types = [nccl_dtype(SUPPORTED_DTYPES[p.buf.dtype], call) for p in items]  # all first
        nccl = self._nccl_mod
        nccl.groupStart()
        try:
            for p, (dt, per) in zip(items, types, strict=True):
                ptr, n = p.buf.array.data.ptr, p.buf.array.size * per
                if p.op == "send":
                    self.comm.send(ptr, n, dt, p.peer, s)
                else:
                    self.comm.recv(ptr, n, dt, p.peer, s)
        finally:
            nccl.groupEnd()
        return None, None
