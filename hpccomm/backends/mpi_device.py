"""Device (CuPy) arrays on the MPI path, and the choice of backend for device arrays.

On the MPI path device arrays are passed straight to a CUDA-aware MPI, or staged through
pooled pinned host buffers when MPI is not CUDA-aware (or unsure). Either way the producing
stream (``stream=`` or the current CuPy stream at the call) is synchronized before MPI touches
the data: MPI knows nothing of CUDA streams. hpccomm's own kernels run on that stream too
(made current around the body, also on the worker thread): PREMUL_SUM's scaled copy (AVG's:
PREMUL_SUM(1/size), as NCCL makes it) is made and synchronized before MPI reads it.
float16/bfloat16 reductions (and integer ops the MPI library gets wrong, see
``mpi.probe_integer_ops``) are always staged, since their MPI op is a host (NumPy) function.
The staged body wraps the host backend's body for the same call: one implementation of every
operation.

:class:`DeviceBackends` picks NCCL or this path per call, and creates the group's NCCL
communicator on first use (collective, as one step of the group's calls, bounded by its
timeout). With ``device_backend="auto"`` a group whose ranks share a GPU that NCCL refuses
takes this path instead (with a warning saying why).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .. import ops as O
from ..buffers import resolve
from ..cuda_aware import DeviceConfig, DevicePath
from ..errors import (
    BackendError,
    CommTimeoutError,
    GpuBindingError,
    HpccommError,
    InvalidArgumentError,
)
from ..ops import Call, P2POp
from ..staging import StagingPool
from .base import Backend
from .mpi import MPIBackend, reduces_on_host
from .nccl import NcclBackend, WorkerStreams

__all__ = ["DeviceMPIBackend", "DeviceBackends"]


def _current_stream() -> Any:
    import cupy

    return cupy.cuda.get_current_stream()


@contextmanager
def _on(device: int | None, stream: Any) -> Iterator[None]:
    """Make ``device`` and ``stream`` current in this thread (the worker thread too), so
    hpccomm's own CuPy kernels run where the call's data lives, ordered on its stream."""
    import cupy

    with cupy.cuda.Device(device), stream:
        yield


class _StagedPending:
    """Started point-to-point requests on host copies; copies back when they complete."""

    __slots__ = ("inner", "finish")

    def __init__(self, inner: Any, finish: Callable[[Any], Any]) -> None:
        self.inner = inner
        self.finish = finish

    @property
    def seq(self) -> int:
        return self.inner.seq

    @seq.setter
    def seq(self, value: int) -> None:
        self.inner.seq = value

    def test(self) -> bool:
        return self.inner.test()

    def wait(self, timeout: float | None) -> bool:
        return self.inner.wait(timeout)

    def outcome(self) -> Any:
        return self.finish(self.inner.outcome())


class DeviceMPIBackend:
    """Runs calls with device arrays through an :class:`MPIBackend`'s bodies."""

    name = "mpi-device"
    seq = 0  # the blocking body running now (set by the dispatch)

    def __init__(self, host: MPIBackend, path: DevicePath, pool: StagingPool | None = None) -> None:
        self.host = host
        self.path = path
        self.pool = pool if pool is not None else StagingPool()
        self._streams = WorkerStreams()

    def supports(self, call: Call) -> bool:
        return True

    def close(self) -> None:
        self.pool.clear()

    def stream_now(self) -> Any:
        """The current CuPy stream (captured at the call for bodies that run elsewhere)."""
        return _current_stream()

    def worker_stream(self, stream: Any) -> tuple[Any, Any]:
        """(the stream for the worker thread, the stream it synchronizes or None); see
        WorkerStreams."""
        return self._streams.resolve(stream if stream is not None else _current_stream())

    def error(self, call: Call, seq: int, exc: BaseException) -> HpccommError:
        return self.host.error(call, seq, exc)

    def direct(self, call: Call) -> bool:
        """True when this call's device arrays go to MPI as they are."""
        return self.path.cuda_aware and not reduces_on_host(call)

    def prepare(self, call: Call) -> None:
        self.host.prepare(call)
        host_body = call.body
        call.backend = self
        call.blocking_body = None  # the host's probed receive: host memory only, no staging
        if not self.direct(call):

            def staged(call: Call, data: Any, out: Any, stream: Any) -> Any:
                s = stream or _current_stream()
                with _on(call.device, s):
                    return self._staged(host_body, call, data, out, s)

            call.body = staged
        elif call.spec.reducing and call.redop.name in ("PREMUL_SUM", "AVG"):
            call.body = self._prescaled(call, host_body)
        else:

            def direct(call: Call, data: Any, out: Any, stream: Any) -> Any:
                s = stream or _current_stream()
                s.synchronize()  # the producer's work is done before MPI reads the data
                with _on(call.device, s):  # (the body's CuPy work, if any, on the call's stream)
                    return host_body(call, data, out, None)

            call.body = direct

    def _prescaled(self, call: Call, host_body: Any) -> Any:
        """The direct body of a PREMUL_SUM: the scaled copy is made on the call's stream and
        synchronized before MPI reads it (the host body would make it after the stream was
        synchronized, and MPI would read it unfinished), then summed by the host body; the
        in-place result is copied back on the stream."""
        mpi_type, mpi_op, _ = call.how
        inner = call.piece(call.count)
        inner.how = (mpi_type, mpi_op, None)  # a plain SUM of the scaled copy
        factor = call.redop.prescale(self.host.size)
        root = call.peer
        rank = self.host.rank

        def direct(call: Call, data: Any, out: Any, stream: Any) -> Any:
            s = stream or _current_stream()
            with _on(call.device, s):
                scaled = (data * factor).astype(data.dtype, copy=False)
                s.synchronize()  # producer and scaled copy done before MPI reads them
                result = host_body(inner, scaled, out, None)
                if result is not scaled:
                    return result  # reduce_scatter: the result is in out
                if call.spec is O.ALL_REDUCE or rank == root:
                    data[...] = scaled  # ordered on s; scaled is freed to s's pool after
                return data

        return direct

    # -- staging --------------------------------------------------------------------------

    def _host_copy(self, arr: Any, copy_in: bool, stream: Any, lent: list) -> Any:
        h = self.pool.take(arr.nbytes, arr.dtype, tuple(arr.shape))
        lent.append(h)
        if copy_in:
            arr.get(out=h, stream=stream)
        return h

    def _staged(self, body: Any, call: Call, data: Any, out: Any, stream: Any) -> Any:
        spec = call.spec
        if call.in_place:  # the host twins are separate arrays: no MPI_IN_PLACE there
            call = call.piece(call.count)
            call.in_place = False
        lent: list = []
        pairs: list[tuple[Any, Any]] = []  # (device array, host array) to copy back
        if spec.arrays:
            hdata = None
            if data is not None:
                hdata = self._host_copy(data, spec.name != "recv", stream, lent)
                if spec.in_place:
                    pairs.append((data, hdata))
        else:  # batch_isend_irecv: host twins of every item
            hdata = []
            for p in data:
                h = self._host_copy(p.buf.array, p.op == "send", stream, lent)
                hp = P2POp(p.op, h, p.peer, p.tag)
                hp.buf = resolve(h, "staging")
                hdata.append(hp)
                if p.op == "recv":
                    pairs.append((p.buf.array, h))
        hout = None
        if out is not None:
            hout = self._host_copy(out, False, stream, lent)
            pairs.append((out, hout))
        stream.synchronize()  # device-to-host copies done before MPI reads the host buffers

        def finish(result: Any) -> Any:
            for dev, host in pairs:
                dev.set(host, stream=stream)
            stream.synchronize()  # host buffers may be lent again only after the copies
            for h in lent:
                self.pool.give(h)
            if result is hdata and hdata is not None:
                return data
            if result is hout and hout is not None:
                return out
            return result  # a receive's source rank, or None

        try:
            result = body(call, hdata, hout, None)
        except BaseException:
            for h in lent:  # the operation never started: the buffers are free again
                self.pool.give(h)
            raise
        if call.mode == "requests":
            return _StagedPending(result, finish)
        return finish(result)


class DeviceBackends:
    """The backends of one communicator's device-array calls: NCCL when the device mode is
    "nccl" and NCCL has the op (its communicator created on first use, collectively), else the
    MPI device path."""

    def __init__(self, host: MPIBackend, config: DeviceConfig) -> None:
        self.host = host
        self.config = config
        self.nccl: NcclBackend | None = None
        self._mpi: DeviceMPIBackend | None = None
        self.dispatcher: Any = None  # the communicator's Dispatcher (see attach)
        self.refused: str | None = None  # why NCCL refused this group ("auto" fell back)
        self.broken: str | None = None  # NCCL creation timed out: it can never complete

    @property
    def nccl_comm(self) -> Any:
        return None if self.nccl is None else self.nccl.comm

    def attach(self, dispatcher: Any) -> None:
        """Let the communicator's Dispatcher run the NCCL creation: as one collective step
        of the group (ordered with its other calls) bounded by the group's timeout."""
        self.dispatcher = dispatcher

    def child(self, host: MPIBackend, config: DeviceConfig) -> DeviceBackends:
        """The device backends of a group made from this one."""
        return DeviceBackends(host, config)

    def enable_nccl(self, where: str) -> None:
        """Create the NCCL communicator (collective over the group); GpuBindingError when its
        ranks share a GPU NCCL refuses, whatever the device mode."""
        self._create(where, fallback=False)

    def _create(self, where: str, fallback: bool) -> None:
        if self.nccl is not None:
            return
        if self.broken is not None:
            raise BackendError(f"{where}: {self.broken}")
        if self.config.gpu is None:
            raise HpccommError(f"{where}: no GPU is bound on this rank (hpccomm.init(gpu=True))")
        d = self.dispatcher
        try:
            made = self._make() if d is None else d.collective("enable_nccl", self._make)
        except CommTimeoutError as exc:
            self.broken = (
                f"creating the group's NCCL communicator did not complete ({exc}); "
                f"ncclCommInitRank cannot be aborted before it returns, so device calls on "
                f"this group cannot run"
            )
            raise CommTimeoutError(f"{where}: {self.broken}") from exc
        if isinstance(made, GpuBindingError):
            if not fallback:
                raise made
            self.refused = str(made)
            warnings.warn(
                f"hpccomm: {where}: device collectives of this group take the MPI device path "
                f"(device_backend='auto'), since NCCL refuses it: {made}",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self.nccl = made

    def _make(self) -> NcclBackend | GpuBindingError:
        """Runs on every rank of the group at the same step. A refusal to share a GPU is
        returned, not raised: every rank computes it from the same allgathered identities,
        and "auto" falls back on all of them alike."""
        gpu = self.config.gpu
        if gpu is None:  # pragma: no cover - _create checks first
            raise HpccommError("no GPU is bound on this rank")
        try:
            return NcclBackend(self.host.mpi, gpu)
        except GpuBindingError as exc:
            return exc

    def backend_for(self, call: Call) -> Backend:
        """The backend of a call with device arrays."""
        if self.config.mode == "nccl" and call.spec.nccl and self.refused is None:
            if self.nccl is None:
                if call.spec.p2p:
                    raise InvalidArgumentError(
                        f"{call}: the first device operation on {call.group.name} is "
                        f"point-to-point, but creating the NCCL communicator is collective; call "
                        f"comm.enable_nccl() on every rank first (or hpccomm.init(nccl=True))"
                    )
                self._create(str(call), fallback=self.config.auto)
            nccl = self.nccl
            if nccl is not None and nccl.supports(call):
                return nccl
        if self._mpi is None:
            self._mpi = DeviceMPIBackend(self.host, self.config.path)
        return self._mpi

    def close(self) -> HpccommError | None:
        """Release the backends; the NCCL communicator once the GPU has finished its calls,
        waiting at most the group's timeout (then it is aborted and the CommTimeoutError, or
        the NCCL / CUDA error met meanwhile, is returned)."""
        problem = None
        if self.nccl is not None:
            d = self.dispatcher
            problem = self.nccl.release(None if d is None else d.timeout)
        if self._mpi is not None:
            self._mpi.close()
        return problem
