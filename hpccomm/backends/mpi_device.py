"""Device (CuPy) arrays on the MPI path, and the choice of backend for device arrays.

On the MPI path device arrays are passed straight to a CUDA-aware MPI, or staged through
pooled pinned host buffers when MPI is not CUDA-aware (or unsure). Either way the producing
stream (``stream=`` or the current CuPy stream at the call) is synchronized before MPI touches
the data: MPI knows nothing of CUDA streams. float16/bfloat16 reductions (and integer ops the
MPI library gets wrong, see ``mpi.probe_integer_ops``) are always staged, since their MPI op
is a host (NumPy) function. The staged body wraps the host backend's body for the same call:
one implementation of every operation.

:class:`DeviceBackends` picks NCCL or this path per call, and creates the group's NCCL
communicator on first use (collective).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..buffers import resolve
from ..cuda_aware import DeviceConfig, DevicePath
from ..errors import HpccommError, InvalidArgumentError
from ..ops import Call, P2POp
from ..staging import StagingPool
from .base import Backend
from .mpi import MPIBackend, reduces_on_host
from .nccl import NcclBackend

__all__ = ["DeviceMPIBackend", "DeviceBackends"]


def _current_stream() -> Any:
    import cupy

    return cupy.cuda.get_current_stream()


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

    def __init__(self, host: MPIBackend, path: DevicePath, pool: StagingPool | None = None) -> None:
        self.host = host
        self.path = path
        self.pool = pool if pool is not None else StagingPool()

    def supports(self, call: Call) -> bool:
        return True

    def close(self) -> None:
        self.pool.clear()

    def stream_now(self) -> Any:
        """The current CuPy stream (captured at the call for bodies that run elsewhere)."""
        return _current_stream()

    def error(self, call: Call, seq: int, exc: BaseException) -> HpccommError:
        return self.host.error(call, seq, exc)

    def direct(self, call: Call) -> bool:
        """True when this call's device arrays go to MPI as they are."""
        return self.path.cuda_aware and not reduces_on_host(call)

    def prepare(self, call: Call) -> None:
        self.host.prepare(call)
        host_body = call.body
        call.backend = self
        if self.direct(call):

            def direct(call: Call, data: Any, out: Any, stream: Any) -> Any:
                (stream or _current_stream()).synchronize()
                return host_body(call, data, out, None)

            call.body = direct
        else:

            def staged(call: Call, data: Any, out: Any, stream: Any) -> Any:
                return self._staged(host_body, call, data, out, stream or _current_stream())

            call.body = staged

    # -- staging --------------------------------------------------------------------------

    def _host_copy(self, arr: Any, copy_in: bool, stream: Any, lent: list) -> Any:
        h = self.pool.take(arr.nbytes, arr.dtype, tuple(arr.shape))
        lent.append(h)
        if copy_in:
            arr.get(out=h, stream=stream)
        return h

    def _staged(self, body: Any, call: Call, data: Any, out: Any, stream: Any) -> Any:
        spec = call.spec
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

    @property
    def nccl_comm(self) -> Any:
        return None if self.nccl is None else self.nccl.comm

    def child(self, host: MPIBackend, config: DeviceConfig) -> DeviceBackends:
        """The device backends of a group made from this one."""
        return DeviceBackends(host, config)

    def enable_nccl(self, where: str) -> None:
        """Create the NCCL communicator (collective over the group)."""
        if self.nccl is not None:
            return
        if self.config.gpu is None:
            raise HpccommError(f"{where}: no GPU is bound on this rank (hpccomm.init(gpu=True))")
        self.nccl = NcclBackend(self.host.mpi, self.config.gpu)

    def backend_for(self, call: Call) -> Backend:
        """The backend of a call with device arrays."""
        if self.config.mode == "nccl" and call.spec.nccl:
            if self.nccl is None:
                if call.spec.p2p:
                    raise InvalidArgumentError(
                        f"{call}: the first device operation on {call.group.name} is "
                        f"point-to-point, but creating the NCCL communicator is collective; call "
                        f"comm.enable_nccl() on every rank first (or hpccomm.init(nccl=True))"
                    )
                self.enable_nccl(str(call))
            nccl = self.nccl
            if nccl is not None and nccl.supports(call):
                return nccl
        if self._mpi is None:
            self._mpi = DeviceMPIBackend(self.host, self.config.path)
        return self._mpi

    def close(self) -> None:
        for backend in (self.nccl, self._mpi):
            if backend is not None:
                backend.close()
