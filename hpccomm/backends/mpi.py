"""The MPI backend: every operation on host arrays through mpi4py's buffer (uppercase) API.

float16/bfloat16 travel as 2-byte words reduced by cached user-defined ops; AVG is SUM
followed by a division by the group size; PREMUL_SUM sums a scaled copy of the input.
Python objects go through ``mpi4py.util.pkl5`` (pickle protocol 5, large buffers out of band).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI
from mpi4py.util import pkl5

from .. import ops as O
from ..dtypes import SUPPORTED_DTYPES
from ..record import Call
from ..work import Work

__all__ = ["MPIBackend"]

_MPI_TYPE_BY_NAME = {
    "bool": MPI.C_BOOL,
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
_UFUNCS = {
    "SUM": np.add,
    "AVG": np.add,
    "PREMUL_SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
}
_numpy_ops: dict[tuple[np.dtype, str], MPI.Op] = {}


def _numpy_op(dtype: np.dtype, name: str) -> MPI.Op:
    """A user-defined MPI op that combines with the NumPy ufunc on the real dtype: float16 and
    bfloat16 (MPI has no such types; they travel as 2-byte words), and integer ops the MPI
    library gets wrong (see :func:`probe_integer_ops`)."""
    key = (dtype, name)
    op = _numpy_ops.get(key)
    if op is None:
        ufunc = _UFUNCS[name]

        def combine(inbuf, inoutbuf, datatype, _dt=dtype, _f=ufunc):
            a = np.frombuffer(inbuf, dtype=_dt)
            b = np.frombuffer(inoutbuf, dtype=_dt)
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
# Ops that need work around the MPI call: PREMUL_SUM scales a copy first, AVG divides after.
_SCALED = frozenset({"AVG", "PREMUL_SUM"})
_REDUCING = frozenset({O.ALL_REDUCE, O.REDUCE, O.REDUCE_SCATTER})
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
    return call.op in _REDUCING and _mpi_op(call) in _numpy_ops.values()


def _mpi_op(call: Call) -> MPI.Op:
    name = call.redop.name
    op = _OPS.get((name, call.info.dtype))
    return op if op is not None else _numpy_op(call.info.dtype, name)


class MPIBackend:
    """Runs calls on an mpi4py intracommunicator."""

    name = "mpi"

    def __init__(self, comm: MPI.Intracomm) -> None:
        if not _probed:
            probe_integer_ops()
        self.mpi = comm
        self._pkl5: pkl5.Intracomm | None = None
        self._table: dict[O.OpSpec, Callable[[Call], Any]] = {
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

    # -- the interface ------------------------------------------------------------------

    def supports(self, call: Call) -> bool:
        return True

    def run(self, call: Call) -> Any:
        return self._table[call.op](call)

    def close(self) -> None:
        self._pkl5 = None

    def fast(self, call: Call) -> Callable[[], Any] | None:
        """A zero-argument callable that runs this validated plain call (synchronous, no split
        sizes, no stream: the only ones the dispatch memoises) again with one MPI call (its
        result is ``call.result``); None for calls that need more (AVG/PREMUL_SUM steps, an
        any-source receive's status)."""
        op, m = call.op, self.mpi
        b = call.buf
        mt = _MPI_TYPES[b.dtype]
        x = [b.array, mt]
        if op in _REDUCING:
            if call.redop.name in _SCALED:
                return None
            mpi_op = _mpi_op(call)
            if op is O.ALL_REDUCE:
                return partial(m.Allreduce, MPI.IN_PLACE, x, mpi_op)
            if op is O.REDUCE_SCATTER:
                return partial(m.Reduce_scatter_block, x, [call.out.array, mt], mpi_op)
            if m.Get_rank() == call.peer:
                return partial(m.Reduce, MPI.IN_PLACE, x, mpi_op, call.peer)
            return partial(m.Reduce, x, None, mpi_op, call.peer)
        if op is O.BROADCAST:
            return partial(m.Bcast, x, call.peer)
        if op is O.ALL_GATHER:
            return partial(m.Allgather, x, [call.out.array, mt])
        if op is O.ALL_TO_ALL:
            return partial(m.Alltoall, x, [call.out.array, mt])
        if op is O.SEND:
            return partial(m.Send, x, call.peer, call.tag)
        if op is O.RECV and call.peer is not None and call.tag is not None:
            call.result = call.peer  # a receive from a named source returns that source
            return partial(m.Recv, x, call.peer, call.tag)
        return None

    # -- helpers ------------------------------------------------------------------------
    #
    # Every operation has the same shape: build the MPI buffer specs, then either start the
    # non-blocking form and return a Work (async_op), or run the blocking form and return the
    # result. The sync path is the hot one: nothing else is built for it.

    @staticmethod
    def _started(
        call: Call, req: MPI.Request, post: Callable[[], Any] | None = None, keep: Any = None
    ) -> Work:
        """A Work for a started request; ``keep`` holds the buffer specs (and temporaries such
        as PREMUL_SUM's scaled copy) until completion: mpi4py keeps no reference to the
        buffers of a non-blocking collective."""
        return Work(call, req.Test, req.Wait, post, keep)

    def _reduction(self, call: Call, x: Any, mt: MPI.Datatype) -> tuple[Any, Any, Any]:
        """(send spec, MPI op, post-step) of a reduction over ``x``: PREMUL_SUM sends a
        scaled copy, AVG divides the result by the group size afterwards."""
        name = call.redop.name
        op = _mpi_op(call)
        if name not in _SCALED:
            return [x, mt], op, None
        if name == "PREMUL_SUM":
            return [(x * call.redop.factor).astype(x.dtype, copy=False), mt], op, None
        n = self.mpi.Get_size()
        return [x, mt], op, n

    @staticmethod
    def _divide(target: Any, n: int | None) -> Callable[[], None] | None:
        if n is None:
            return None

        def divide() -> None:
            np.divide(target, n, out=target)

        return divide

    # -- collectives --------------------------------------------------------------------

    def _all_reduce(self, call: Call) -> Any:
        x = call.buf.array
        mt = _MPI_TYPES[call.buf.dtype]
        name = call.redop.name
        if name in _SCALED:  # AVG / PREMUL_SUM: the general form
            send, op, n = self._reduction(call, x, mt)
            if send[0] is x:
                send = MPI.IN_PLACE
        else:  # the hottest path of all: _mpi_op's builtin lookup inlined, no helper frames
            send, n = MPI.IN_PLACE, None
            op = _OPS.get((name, call.info.dtype)) or _mpi_op(call)
        if call.async_op:
            req = self.mpi.Iallreduce(send, [x, mt], op)
            return self._started(call, req, self._divide(x, n), send)
        self.mpi.Allreduce(send, [x, mt], op)
        if n is not None:
            np.divide(x, n, out=x)
        return x

    def _reduce(self, call: Call) -> Any:
        x = call.buf.array
        mt = _MPI_TYPES[call.buf.dtype]
        send, op, n = self._reduction(call, x, mt)
        if self.mpi.Get_rank() == call.peer:
            recv = [x, mt]
            if send[0] is x:
                send = MPI.IN_PLACE
        else:
            recv, n = None, None
        if call.async_op:
            req = self.mpi.Ireduce(send, recv, op, call.peer)
            return self._started(call, req, self._divide(x, n), send)
        self.mpi.Reduce(send, recv, op, call.peer)
        if n is not None:
            np.divide(x, n, out=x)
        return x

    def _broadcast(self, call: Call) -> Any:
        x = call.buf.array
        buf = [x, _MPI_TYPES[call.buf.dtype]]
        if call.async_op:
            return self._started(call, self.mpi.Ibcast(buf, call.peer), keep=buf)
        self.mpi.Bcast(buf, call.peer)
        return x

    def _all_gather(self, call: Call) -> Any:
        mt = _MPI_TYPES[call.buf.dtype]
        send = [call.buf.array, mt]
        out = call.out.array
        if call.payload is None:
            recv = [out, mt]
            if call.async_op:
                return self._started(call, self.mpi.Iallgather(send, recv), keep=(send, recv))
            self.mpi.Allgather(send, recv)
            return out
        counts, displs = O.displacements(call.counts)
        recv = [out, counts, displs, mt]
        if call.async_op:
            return self._started(call, self.mpi.Iallgatherv(send, recv), keep=(send, recv))
        self.mpi.Allgatherv(send, recv)
        return out

    def _gather(self, call: Call) -> Any:
        mt = _MPI_TYPES[call.buf.dtype]
        send = [call.buf.array, mt]
        recv = None
        if call.out is not None:
            counts, displs = O.displacements(call.counts)
            recv = [call.out.array, counts, displs, mt]
        if call.async_op:
            return self._started(call, self.mpi.Igatherv(send, recv, call.peer), keep=(send, recv))
        self.mpi.Gatherv(send, recv, call.peer)
        return call.result

    def _scatter(self, call: Call) -> Any:
        mt = _MPI_TYPES[call.out.dtype]
        send = None
        if self.mpi.Get_rank() == call.peer:
            counts, displs = O.displacements(call.counts)
            send = [call.buf.array, counts, displs, mt]
        recv = [call.out.array, mt]
        if call.async_op:
            return self._started(call, self.mpi.Iscatterv(send, recv, call.peer), keep=(send, recv))
        self.mpi.Scatterv(send, recv, call.peer)
        return call.result

    def _reduce_scatter(self, call: Call) -> Any:
        mt = _MPI_TYPES[call.buf.dtype]
        send, op, n = self._reduction(call, call.buf.array, mt)
        out = call.out.array
        recv = [out, mt]
        if call.payload is None:
            if call.async_op:
                req = self.mpi.Ireduce_scatter_block(send, recv, op)
                return self._started(call, req, self._divide(out, n), (send, recv))
            self.mpi.Reduce_scatter_block(send, recv, op)
        else:
            counts = O.displacements(call.counts)[0]
            if call.async_op:
                req = self.mpi.Ireduce_scatter(send, recv, counts, op)
                return self._started(call, req, self._divide(out, n), (send, recv, counts))
            self.mpi.Reduce_scatter(send, recv, counts, op)
        if n is not None:
            np.divide(out, n, out=out)
        return out

    def _all_to_all(self, call: Call) -> Any:
        mt = _MPI_TYPES[call.buf.dtype]
        out = call.out.array
        if call.payload is None:
            send, recv = [call.buf.array, mt], [out, mt]
            if call.async_op:
                return self._started(call, self.mpi.Ialltoall(send, recv), keep=(send, recv))
            self.mpi.Alltoall(send, recv)
            return out
        (scounts, sdispls), (rcounts, rdispls) = map(O.displacements, call.counts)
        send = [call.buf.array, scounts, sdispls, mt]
        recv = [out, rcounts, rdispls, mt]
        if call.async_op:
            return self._started(call, self.mpi.Ialltoallv(send, recv), keep=(send, recv))
        self.mpi.Alltoallv(send, recv)
        return out

    def _barrier(self, call: Call) -> Any:
        if call.async_op:
            return self._started(call, self.mpi.Ibarrier())
        self.mpi.Barrier()
        return None

    # -- point-to-point -----------------------------------------------------------------

    def _send(self, call: Call) -> Any:
        buf = [call.buf.array, _MPI_TYPES[call.buf.dtype]]
        if call.async_op:
            return self._started(call, self.mpi.Isend(buf, call.peer, call.tag))
        self.mpi.Send(buf, call.peer, call.tag)
        return None

    def _recv(self, call: Call) -> Any:
        status = MPI.Status()
        src = MPI.ANY_SOURCE if call.peer is None else call.peer
        tag = MPI.ANY_TAG if call.tag is None else call.tag
        buf = [call.buf.array, _MPI_TYPES[call.buf.dtype]]
        if call.async_op:
            req = self.mpi.Irecv(buf, src, tag)
            return Work(call, lambda: req.Test(status), lambda: req.Wait(status), status.Get_source)
        self.mpi.Recv(buf, src, tag, status)
        return status.Get_source()

    def _sendrecv(self, call: Call) -> Any:
        mt = _MPI_TYPES[call.buf.dtype]
        dst, src = call.payload
        src = MPI.ANY_SOURCE if src is None else src
        tag = call.tag
        if call.async_op:
            reqs = [
                self.mpi.Irecv([call.out.array, mt], src, tag),
                self.mpi.Isend([call.buf.array, mt], dst, tag),
            ]
            return Work(call, lambda: MPI.Request.Testall(reqs), lambda: MPI.Request.Waitall(reqs))
        self.mpi.Sendrecv([call.buf.array, mt], dst, tag, [call.out.array, mt], src, tag)
        return call.result

    def _batch(self, call: Call) -> Any:
        reqs = []
        for p in call.payload:
            buf = [p.buf.array, _MPI_TYPES[p.buf.dtype]]
            if p.op == "send":
                reqs.append(self.mpi.Isend(buf, p.peer, p.tag))
            else:
                reqs.append(self.mpi.Irecv(buf, p.peer, p.tag))
        work = Work(call, lambda: MPI.Request.Testall(reqs), lambda: MPI.Request.Waitall(reqs))
        return work if call.async_op else work.wait()

    # -- Python objects (pickle protocol 5, out-of-band buffers) -------------------------

    @property
    def objects(self) -> pkl5.Intracomm:
        if self._pkl5 is None:
            self._pkl5 = pkl5.Intracomm(self.mpi)
        return self._pkl5

    def _bcast_object(self, call: Call) -> Any:
        return self.objects.bcast(call.payload, root=call.peer)

    def _allgather_object(self, call: Call) -> Any:
        return self.objects.allgather(call.payload)

    def _gather_object(self, call: Call) -> Any:
        return self.objects.gather(call.payload, root=call.peer)

    def _scatter_object(self, call: Call) -> Any:
        objs = call.payload if self.mpi.Get_rank() == call.peer else None
        return self.objects.scatter(objs, root=call.peer)

    def _send_object(self, call: Call) -> Any:
        self.objects.send(call.payload, dest=call.peer, tag=call.tag)
        return None

    def _recv_object(self, call: Call) -> Any:
        src = MPI.ANY_SOURCE if call.peer is None else call.peer
        tag = MPI.ANY_TAG if call.tag is None else call.tag
        return self.objects.recv(None, source=src, tag=tag)
