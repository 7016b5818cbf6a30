"""Device (CuPy) arrays on the MPI path: passed straight to a CUDA-aware MPI, or staged
through pooled pinned host buffers when MPI is not CUDA-aware (or unsure).

Either way the producing stream (``stream=`` or the current CuPy stream) is synchronized
before MPI touches the data: MPI knows nothing of CUDA streams. float16/bfloat16 reductions
(and integer ops the MPI library gets wrong, see ``mpi.probe_integer_ops``) are always
staged, since their MPI op is a host (NumPy) function.
"""

from __future__ import annotations

from typing import Any

from .. import ops as O
from ..buffers import Buffer, resolve
from ..cuda_aware import DevicePath
from ..ops import P2POp
from ..record import Call
from ..staging import StagingPool
from ..work import Work
from .mpi import MPIBackend, reduces_on_host

__all__ = ["DeviceMPIBackend"]

# Operations whose result is written into the input array itself.
_IN_PLACE = frozenset({O.ALL_REDUCE, O.REDUCE, O.BROADCAST, O.RECV})


class DeviceMPIBackend:
    """Runs calls with device arrays through an :class:`MPIBackend`."""

    name = "mpi-device"

    def __init__(self, host: MPIBackend, path: DevicePath, pool: StagingPool | None = None) -> None:
        self.host = host
        self.path = path
        self.pool = pool if pool is not None else StagingPool()

    def fast(self, call: Call) -> None:
        """No one-call repeats here: device calls are never memoised."""
        return None

    def supports(self, call: Call) -> bool:
        return True

    def close(self) -> None:
        self.pool.clear()

    def direct(self, call: Call) -> bool:
        """True when this call's device arrays go to MPI as they are."""
        return self.path.cuda_aware and not reduces_on_host(call)

    def run(self, call: Call) -> Any:
        import cupy

        stream = call.stream if call.stream is not None else cupy.cuda.get_current_stream()
        if self.direct(call):
            stream.synchronize()
            return self.host.run(call)
        return self._staged(call, stream)

    # -- staging --------------------------------------------------------------------------

    def _host_copy(self, b: Buffer | None, copy_in: bool, stream: Any, lent: list) -> Buffer | None:
        if b is None:
            return None
        arr = b.array
        h = self.pool.take(arr.nbytes, arr.dtype, tuple(arr.shape))
        lent.append(h)
        if copy_in:
            arr.get(out=h, stream=stream)
        return resolve(h, "staging")

    def _staged(self, call: Call, stream: Any) -> Any:
        lent: list = []
        pairs: list[tuple[Any, Any]] = []  # (device array, host array) to copy back
        hbuf = self._host_copy(call.buf, call.op is not O.RECV, stream, lent)
        hout = self._host_copy(call.out, False, stream, lent)
        payload = call.payload
        if call.op is O.BATCH_P2P:
            payload = []
            for p in call.payload:
                hp = P2POp(p.op, None, p.peer, p.tag)
                hp.buf = self._host_copy(p.buf, p.op == "send", stream, lent)
                hp.array = hp.buf.array
                payload.append(hp)
                if p.op == "recv":
                    pairs.append((p.buf.array, hp.buf.array))
        stream.synchronize()  # device-to-host copies done before MPI reads the host buffers
        hcall = Call(
            call.op,
            call.comm,
            call.seq,
            call.peer,
            call.tag,
            hbuf,
            hout,
            call.redop,
            call.async_op,
            None,
            payload,
        )
        hcall.info, hcall.counts, hcall.quiet = call.info, call.counts, True
        if call.out is not None:
            pairs.append((call.out.array, hout.array))
            hcall.result = hout.array if call.result is call.out.array else None
        elif call.op in _IN_PLACE:
            pairs.append((call.buf.array, hbuf.array))
            hcall.result = hbuf.array if call.result is call.buf.array else None

        def finish(value: Any) -> Any:
            for dev, host in pairs:
                dev.set(host, stream=stream)
            stream.synchronize()  # host buffers may be lent again only after the copies
            for h in lent:
                self.pool.give(h)
            return value if isinstance(value, int) else call.result  # a receive's source rank

        try:
            outcome = self.host.run(hcall)
        except BaseException:
            for h in lent:  # the operation never started: the buffers are free again
                self.pool.give(h)
            raise
        if isinstance(outcome, Work):
            inner = outcome
            return Work(call, inner.is_completed, inner.wait, lambda: finish(inner.wait()))
        return finish(outcome)
