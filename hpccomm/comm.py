"""The Communicator: the user's object, with operations named as in torch.distributed.

Every operation goes through :meth:`Communicator._dispatch`: resolve buffers -> validate
(``OpSpec.prepare``) -> record (sequence number, op, group, peer, dtype, shape) -> choose the
backend -> run -> return the result or a :class:`~hpccomm.work.Work`.

Across-rank mistakes (one rank passes a different shape, dtype, op or split sizes) cannot be
seen by one rank alone. Today they behave as MPI does: a smaller receive than send raises
"Message truncated" as a BackendError on the receiving rank, a larger one leaves the tail
untouched, and collectives called in different orders hang unless the communicator has a
``timeout`` (then a CommTimeoutError names the op and its sequence number).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from . import record
from .buffers import resolve
from .cuda_aware import CPU_ONLY, DeviceConfig
from .dtypes import ReduceOp
from .errors import BackendError, ClosedError, HpccommError, InvalidArgumentError, where
from .memo import Memo, eligible
from .ops import (
    ALL_GATHER,
    ALL_GATHER_OBJECT,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BATCH_P2P,
    BROADCAST,
    BROADCAST_OBJECT,
    GATHER,
    GATHER_OBJECT,
    RECV,
    RECV_OBJECT,
    REDUCE,
    REDUCE_SCATTER,
    SCATTER,
    SCATTER_OBJECT,
    SEND,
    SEND_OBJECT,
    SENDRECV,
    OpSpec,
    P2POp,
    _as_int,
)
from .record import Call

if TYPE_CHECKING:
    from mpi4py import MPI

    from .backends.mpi_device import DeviceMPIBackend
    from .backends.nccl import NcclBackend
    from .discovery import LaunchInfo
    from .layout import Layout
    from .parallel import ParallelGroups
    from .work import Work

__all__ = ["Communicator"]

_SUM = ReduceOp.SUM
_INT_MAX = 2**31 - 1  # MPI's colours and keys are C ints


class Communicator:
    """A group of ranks and the operations among them.

    Made by :func:`hpccomm.init` (the world) and by :meth:`split`, :meth:`new_group`,
    :meth:`dup`, :attr:`node` and :attr:`leaders`. The wrapped mpi4py communicator is
    :attr:`mpi`, for anything hpccomm does not cover.

    Args:
        mpi_comm: the mpi4py intracommunicator to own (freed by :meth:`free`).
        name: a label used in messages and records ("world", "world/split(1)", ...).
        timeout: seconds after which a blocking operation raises CommTimeoutError instead of
            hanging (None: wait forever, as MPI does). Subgroups inherit it.
        launch: the world's verified LaunchInfo (kept for :attr:`launch`).
    """

    def __init__(
        self,
        mpi_comm: MPI.Intracomm,
        *,
        name: str = "world",
        timeout: float | None = None,
        launch: LaunchInfo | None = None,
        node_comm: MPI.Intracomm | None = None,
        node_index: int | None = None,
        num_nodes: int | None = None,
        device: DeviceConfig = CPU_ONLY,
    ) -> None:
        from .backends.mpi import MPIBackend

        self._mpi = mpi_comm
        self._rank = mpi_comm.Get_rank()
        self._size = mpi_comm.Get_size()
        self.name = name
        self._timeout = timeout
        self._launch = launch
        self._backend = MPIBackend(mpi_comm)
        self._seq = 0
        self._p2p_seq = 0
        self._freed = False
        self._node_mpi = node_comm
        self._node_index = node_index
        self._num_nodes = num_nodes
        self._node: Communicator | None = None
        self._leaders: Communicator | None | bool = False  # False: not computed yet
        self._children: list[Communicator] = []
        self._device = device
        self._nccl: NcclBackend | None = None
        self._device_mpi: DeviceMPIBackend | None = None
        self._memos: dict[OpSpec, Memo] = {}

    # -- properties --------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return self._size

    @property
    def mpi(self) -> MPI.Intracomm:
        """The wrapped mpi4py communicator (MPI's own names: ``comm.mpi.Allreduce`` ...)."""
        self._check_open("mpi")
        return self._mpi

    @property
    def launch(self) -> LaunchInfo | None:
        """The verified launch description (world communicator only)."""
        return self._launch

    @property
    def timeout(self) -> float | None:
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        if value is not None and not value > 0:
            raise InvalidArgumentError(
                f"timeout (rank {self._rank} of {self._size}): {value!r}, expected seconds > 0 or None"
            )
        self._timeout = value

    @property
    def local_rank(self) -> int:
        """Rank among this group's ranks on the same node."""
        return self.node.rank

    @property
    def local_size(self) -> int:
        """Number of this group's ranks on this node."""
        return self.node.size

    @property
    def node_index(self) -> int:
        """Index of this node among the group's nodes (ordered by their lowest rank)."""
        self._node_layout()
        return self._node_index

    @property
    def num_nodes(self) -> int:
        """Number of nodes the group spans."""
        self._node_layout()
        return self._num_nodes

    @property
    def freed(self) -> bool:
        return self._freed

    @property
    def device(self) -> DeviceConfig:
        """This rank's GPU, the device-collective backend and the MPI device path."""
        return self._device

    @property
    def nccl(self) -> Any:
        """The ``cupy.cuda.nccl.NcclCommunicator`` of this group (None until enabled)."""
        return None if self._nccl is None else self._nccl.comm

    def enable_nccl(self) -> None:
        """Create this group's NCCL communicator now (collective over the group: rank 0 makes
        the unique id, MPI broadcasts it, every rank joins on its bound GPU). Device
        collectives create it on first use anyway; call this first when the first device
        operation is a send/recv.

        Raises:
            GpuBindingError: two ranks of the group share a GPU (raised on every rank).
            HpccommError: no GPU is bound on this rank, or CuPy/NCCL are missing.
        """
        self._check_open("enable_nccl")
        if self._nccl is not None:
            return
        if self._device.gpu is None:
            raise HpccommError(
                f"enable_nccl (rank {self._rank} of {self._size}): no GPU is bound on this rank (hpccomm.init(gpu=True))"
            )
        from .backends.nccl import NcclBackend

        self._nccl = NcclBackend(self._mpi, self._device.gpu)

    def _device_backend(self, call: Call) -> Any:
        """The backend for a call with device arrays (NCCL, or MPI direct/staged)."""
        if self._device.mode == "nccl":
            if self._nccl is None:
                if call.op.p2p:
                    raise InvalidArgumentError(
                        f"{call}: the first device operation on {self.name} is point-to-point, but "
                        f"creating the NCCL communicator is collective; call comm.enable_nccl() on "
                        f"every rank first (or hpccomm.init(nccl=True))"
                    )
                self.enable_nccl()
            if self._nccl.supports(call):
                return self._nccl
        if self._device_mpi is None:
            from .backends.mpi_device import DeviceMPIBackend

            self._device_mpi = DeviceMPIBackend(self._backend, self._device.path)
        return self._device_mpi

    def __repr__(self) -> str:
        state = " freed" if self._freed else ""
        return f"<hpccomm.Communicator {self.name} rank {self._rank} of {self._size}{state}>"

    # -- dispatch: the one path every operation takes ----------------------------------

    def _check_open(self, opname: str) -> None:
        if self._freed:
            raise ClosedError(
                f"{where(opname, self._rank, self._size)}: communicator {self.name} already freed"
            )

    def _dispatch(
        self,
        op: OpSpec,
        array: Any,
        out: Any,
        peer: int | None,
        tag: int | None,
        redop: ReduceOp | None,
        async_op: bool,
        payload: Any = None,
        stream: Any = None,
    ) -> Any:
        if self._freed:
            self._check_open(op.name)
        if op.p2p:
            self._p2p_seq += 1
            seq = self._p2p_seq
        else:
            self._seq += 1
            seq = self._seq
        # A repeat of the last identical call skips resolve and validate (see memo.py);
        # listeners, timeouts, async calls, split sizes and streams always take the full path.
        observed = record.listeners or self._timeout is not None
        plain = not (async_op or observed) and payload is None and stream is None
        if plain:
            memo = self._memos.get(op)
            if memo is not None and memo.matches(array, out, peer, tag, redop):
                call = memo.call
                call.seq = seq
                if memo.fast is None:
                    return self._run(op, call, self._backend)
                try:
                    memo.fast()
                except Exception as exc:
                    self._reraise(op, call, self._backend, exc)
                return call.result
        call = Call(op, self, seq, peer, tag, None, None, redop, async_op, stream, payload)
        b = None
        if array is not None:
            call.buf = b = resolve(array, call)
        if out is not None:
            call.out = resolve(out, call, "out")
        op.prepare(call)
        if b is None:
            b = (
                call.out
                if call.out is not None
                else (payload[0].buf if op is BATCH_P2P and payload else None)
            )
        if b is None or b.device is None:
            backend = self._backend
            if plain and eligible(call, array, out):
                self._memos[op] = Memo(call, backend.fast(call), array, out, peer, tag, redop)
        else:
            backend = self._device_backend(call)
        if observed:
            return self._run_observed(call, backend)
        return self._run(op, call, backend)

    def _run(self, op: OpSpec, call: Call, backend: Any) -> Any:
        """The run step: a backend failure becomes a BackendError naming the call (and
        forgets the memoised validation of the op)."""
        try:
            return backend.run(call)
        except Exception as exc:
            self._reraise(op, call, backend, exc)

    def _reraise(self, op: OpSpec, call: Call, backend: Any, exc: Exception) -> NoReturn:
        """Forget the op's memoised validation and raise: hpccomm's own errors as they are,
        a library's as a BackendError naming the call."""
        self._memos.pop(op, None)
        if isinstance(exc, HpccommError):
            raise exc
        raise BackendError(f"{call}: {backend.name} failed: {exc}") from exc

    def _run_observed(self, call: Call, backend: Any) -> Any:
        """The run step when someone listens or a timeout bounds blocking calls."""
        listening = bool(record.listeners)
        if listening:
            record.notify("start", call)
        timeout = self._timeout
        async_op = call.async_op
        bounded = timeout is not None and not async_op and call.op.nonblocking
        if bounded:
            call.async_op = True
        try:
            result = backend.run(call)
        except HpccommError as exc:
            call.error = exc
            raise
        except Exception as exc:
            call.error = BackendError(f"{call}: {backend.name} failed: {exc}")
            raise call.error from exc
        finally:
            if listening and call.error is not None:
                record.notify("end", call)
        if bounded:
            return result.wait(timeout)
        if listening and not async_op:
            record.notify("end", call)
        return result

    # -- collectives -------------------------------------------------------------------

    def all_reduce(
        self, array: Any, *, op: ReduceOp = _SUM, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Reduce ``array`` over all ranks, in place; every rank gets the result.

        All ranks of the group must call this, in the same order, with arrays of the same
        shape and dtype.

        Args:
            array: this rank's contribution; overwritten with the reduced array.
            op: a :class:`ReduceOp` (default SUM).
            async_op: return a Work instead of waiting.

        Returns:
            ``array`` (or a Work whose ``wait()`` returns it).

        Raises:
            DtypeError: unsupported dtype, or ``op`` not defined for it.
            InvalidArgumentError: a non-contiguous array.

        Example (4 ranks, ``x = np.full(2, rank)``): every rank ends with ``[6, 6]``.
        """
        return self._dispatch(ALL_REDUCE, array, None, None, None, op, async_op, None, stream)

    def reduce(
        self,
        array: Any,
        dst: int = 0,
        *,
        op: ReduceOp = _SUM,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Reduce ``array`` over all ranks into ``dst``'s array, in place.

        All ranks of the group must call this, in the same order. Non-destination ranks keep
        their input unchanged.

        Returns:
            ``array`` (reduced on ``dst``), or a Work.

        Example (2 ranks, ``x = [r + 1]``, dst=1): rank 1 ends with ``[3]``, rank 0 keeps ``[1]``.
        """
        return self._dispatch(REDUCE, array, None, dst, None, op, async_op, None, stream)

    def broadcast(
        self, array: Any, src: int = 0, *, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Copy ``src``'s array into every rank's ``array``, in place.

        All ranks of the group must call this, in the same order, with arrays of the same
        shape and dtype; non-source ranks' contents are overwritten.

        Returns:
            ``array``, or a Work.
        """
        return self._dispatch(BROADCAST, array, None, src, None, None, async_op, None, stream)

    def all_gather(
        self,
        array: Any,
        *,
        sizes: Sequence[int] | None = None,
        out: Any = None,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Concatenate every rank's ``array`` along axis 0, in rank order, on every rank.

        All ranks of the group must call this, in the same order. With ``sizes=None`` every
        rank gives the same shape; for uneven shards pass ``sizes`` (rows per rank, the same
        list on every rank; zero is allowed).

        Returns:
            ``out``, shape ``(sum of rows, *array.shape[1:])`` (``(n,)`` for 0-d inputs).

        Example (2 ranks, rank r gives ``[r, r]``): both get ``[0, 0, 1, 1]``.
        """
        return self._dispatch(ALL_GATHER, array, out, None, None, None, async_op, sizes, stream)

    def gather(
        self,
        array: Any,
        *,
        dst: int = 0,
        sizes: Sequence[int] | None = None,
        out: Any = None,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Like :meth:`all_gather`, but only ``dst`` receives; other ranks get None.

        All ranks of the group must call this, in the same order.

        Example (3 ranks, rank r gives ``[r]``, dst=0): rank 0 gets ``[0, 1, 2]``, ranks 1
        and 2 get None.
        """
        return self._dispatch(GATHER, array, out, dst, None, None, async_op, sizes, stream)

    def scatter(
        self,
        array: Any = None,
        *,
        src: int = 0,
        sizes: Sequence[int] | None = None,
        out: Any = None,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Split ``src``'s array along axis 0 and give block i to rank i.

        All ranks of the group must call this, in the same order. ``src`` passes the full
        array; other ranks pass ``out=`` (their block) or an array of the full shape.

        Returns:
            this rank's block (``out``).

        Example (2 ranks, src has ``[0, 1, 2, 3]``): rank 0 gets ``[0, 1]``, rank 1 ``[2, 3]``.
        """
        return self._dispatch(SCATTER, array, out, src, None, None, async_op, sizes, stream)

    def reduce_scatter(
        self,
        array: Any,
        *,
        op: ReduceOp = _SUM,
        sizes: Sequence[int] | None = None,
        out: Any = None,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Reduce the full ``array`` over ranks; rank i gets reduced block i (axis 0).

        All ranks of the group must call this, in the same order, with the same shape.
        ``sizes`` gives uneven blocks (rows per rank).

        Example (2 ranks, each gives ``[1, 2, 3, 4]``): rank 0 gets ``[2, 4]``, rank 1
        ``[6, 8]``.
        """
        return self._dispatch(REDUCE_SCATTER, array, out, None, None, op, async_op, sizes, stream)

    def all_to_all(
        self, array: Any, *, out: Any = None, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Rank i's block j (axis 0, equal blocks) goes to rank j's block i.

        All ranks of the group must call this, in the same order, with the same shape (rows a
        multiple of the group size).

        Returns:
            ``out`` (allocated like ``array`` if None), or a Work.

        Example (2 ranks, rank r gives ``[10r, 10r+1]``): rank 0 gets ``[0, 10]``, rank 1
        gets ``[1, 11]``.
        """
        return self._dispatch(ALL_TO_ALL, array, out, None, None, None, async_op, None, stream)

    def all_to_all_single(
        self,
        array: Any,
        *,
        out: Any = None,
        input_split_sizes: Sequence[int] | None = None,
        output_split_sizes: Sequence[int] | None = None,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """All-to-all with uneven blocks (MPI's alltoallv), split sizes in rows of axis 0.

        All ranks of the group must call this, in the same order. ``input_split_sizes[j]``
        rows go to rank j; ``output_split_sizes[j]`` rows arrive from rank j (they must match
        what rank j sends here: a mismatch is only visible across ranks). Without split sizes
        this is :meth:`all_to_all`.

        Returns:
            ``out``, ``sum(output_split_sizes)`` rows, blocks in source-rank order.

        Example (2 ranks; rank 0 sends ``[a]`` to 0 and ``[b, c]`` to 1, rank 1 sends ``[d]``
        to 0 and nothing to 1): rank 0 gets ``[a, d]``, rank 1 gets ``[b, c]``.
        """
        splits = (
            None
            if input_split_sizes is None and output_split_sizes is None
            else (input_split_sizes, output_split_sizes)
        )
        return self._dispatch(ALL_TO_ALL, array, out, None, None, None, async_op, splits, stream)

    def barrier(self, *, async_op: bool = False) -> Any:
        """Wait until every rank of the group has called barrier.

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(BARRIER, None, None, None, None, None, async_op)

    # -- point-to-point -----------------------------------------------------------------

    def send(
        self, array: Any, dst: int, *, tag: int = 0, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Send ``array`` to rank ``dst`` (blocks until the buffer may be reused)."""
        return self._dispatch(SEND, array, None, dst, tag, None, async_op, None, stream)

    def recv(
        self,
        array: Any,
        src: int | None = None,
        *,
        tag: int | None = 0,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Receive into ``array`` from ``src`` (None: any source; ``tag=None``: any tag).

        Returns:
            the rank the message came from (or a Work whose ``wait()`` returns it).
        """
        return self._dispatch(RECV, array, None, src, tag, None, async_op, None, stream)

    def isend(self, array: Any, dst: int, *, tag: int = 0, stream: Any = None) -> Work:
        """Start a send; returns a Work. Keep ``array`` unchanged until it completes."""
        return self._dispatch(SEND, array, None, dst, tag, None, True, None, stream)

    def irecv(
        self, array: Any, src: int | None = None, *, tag: int | None = 0, stream: Any = None
    ) -> Work:
        """Start a receive; returns a Work whose ``wait()`` returns the source rank."""
        return self._dispatch(RECV, array, None, src, tag, None, True, None, stream)

    def sendrecv(
        self,
        array: Any,
        *,
        dst: int,
        src: int | None,
        out: Any = None,
        tag: int = 0,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Send ``array`` to ``dst`` and receive ``out`` (allocated like ``array`` if None)
        from ``src`` at once, without deadlock.

        Returns:
            ``out``.
        """
        return self._dispatch(SENDRECV, array, out, dst, tag, None, async_op, (dst, src), stream)

    def batch_isend_irecv(self, p2p_ops: Sequence[P2POp], *, async_op: bool = True) -> Any:
        """Post several sends and receives together; one Work completes them all.

        Example (ring): ``comm.batch_isend_irecv([P2POp("send", x, right), P2POp("recv", y,
        left)]).wait()``.
        """
        return self._dispatch(BATCH_P2P, None, None, None, None, None, async_op, p2p_ops)

    # -- Python objects -----------------------------------------------------------------

    def broadcast_object(self, obj: Any = None, *, src: int = 0) -> Any:
        """Return ``src``'s object on every rank (pickled; large buffers out of band).

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(BROADCAST_OBJECT, None, None, src, None, None, False, obj)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Return the list of every rank's object, in rank order, on every rank.

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(ALL_GATHER_OBJECT, None, None, None, None, None, False, obj)

    def gather_object(self, obj: Any, *, dst: int = 0) -> list[Any] | None:
        """Return the list of every rank's object on ``dst``; None on other ranks.

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(GATHER_OBJECT, None, None, dst, None, None, False, obj)

    def scatter_object(self, objects: Sequence[Any] | None = None, *, src: int = 0) -> Any:
        """Give ``objects[i]`` (a list of group-size items on ``src``) to rank i.

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(SCATTER_OBJECT, None, None, src, None, None, False, objects)

    def send_object(self, obj: Any, dst: int, *, tag: int = 0) -> None:
        """Send a picklable object to ``dst``."""
        return self._dispatch(SEND_OBJECT, None, None, dst, tag, None, False, obj)

    def recv_object(self, src: int | None = None, *, tag: int | None = 0) -> Any:
        """Receive an object from ``src`` (None: any source)."""
        return self._dispatch(RECV_OBJECT, None, None, src, tag, None, False, None)

    # -- groups -------------------------------------------------------------------------

    def _adopt(
        self, mpi_comm: MPI.Intracomm, name: str, device: DeviceConfig | None = None
    ) -> Communicator | None:
        from mpi4py import MPI

        if mpi_comm == MPI.COMM_NULL:
            return None
        child = Communicator(
            mpi_comm, name=name, timeout=self._timeout, device=device or self._device
        )
        self._children.append(child)
        return child

    def split(self, color: int | None, *, key: int | None = None) -> Communicator | None:
        """Split into groups by ``color`` (None: this rank joins no group and gets None),
        ordered by ``key`` (default: this rank). All ranks of the group must call this.

        Example (4 ranks, ``color = rank % 2``): ranks 0, 2 form one group, 1, 3 another.
        """
        self._check_open("split")
        from mpi4py import MPI

        if color is not None:
            value = _as_int(color)
            if value is None or not 0 <= value <= _INT_MAX:
                raise InvalidArgumentError(
                    f"split (rank {self._rank} of {self._size}): color is {color!r}, expected an "
                    f"integer in 0..{_INT_MAX} or None"
                )
            color = value
        if key is not None:
            value = _as_int(key)
            if value is None or not -_INT_MAX - 1 <= value <= _INT_MAX:
                raise InvalidArgumentError(
                    f"split (rank {self._rank} of {self._size}): key is {key!r}, expected an "
                    f"integer in {-_INT_MAX - 1}..{_INT_MAX} or None"
                )
            key = value
        mpi_color = MPI.UNDEFINED if color is None else color
        new = self._mpi.Split(mpi_color, self._rank if key is None else key)
        return self._adopt(new, f"{self.name}/split({color})")

    def new_group(self, ranks: Sequence[int]) -> Communicator | None:
        """A group of ``ranks`` (in that order); ranks outside get None.

        All ranks of this communicator must call this, with the same list.
        """
        self._check_open("new_group")
        ranks = [r if _as_int(r) is None else _as_int(r) for r in ranks]
        bad = [r for r in ranks if type(r) is not int or not 0 <= r < self._size]
        if bad or len(set(ranks)) != len(ranks) or not ranks:
            raise InvalidArgumentError(
                f"new_group (rank {self._rank} of {self._size}): ranks {ranks} must be distinct "
                f"ranks in 0..{self._size - 1}, at least one" + (f"; bad: {bad}" if bad else "")
            )
        group = self._mpi.Get_group()
        sub = group.Incl(ranks)
        try:
            new = self._mpi.Create(sub)
        finally:
            sub.Free()
            group.Free()
        return self._adopt(new, f"{self.name}/group{ranks}")

    def dup(self, *, device_backend: str | None = None) -> Communicator:
        """A new communicator with the same ranks and separate message space.

        Args:
            device_backend: "nccl" or "mpi" to change how device arrays travel on the copy
                (default: as on this one). All ranks must call this.
        """
        self._check_open("dup")
        device = self._device
        if device_backend is not None:
            if device_backend not in ("nccl", "mpi"):
                raise InvalidArgumentError(
                    f"dup (rank {self._rank} of {self._size}): device_backend is {device_backend!r}, expected 'nccl' or 'mpi'"
                )
            device = device._replace(mode=device_backend)
        child = self._adopt(self._mpi.Dup(), f"{self.name}/dup", device)
        assert child is not None
        return child

    def translate(self, ranks: Sequence[int], other: Communicator) -> list[int | None]:
        """This group's ranks as ranks of ``other`` (None where a rank is not in ``other``)."""
        self._check_open("translate")
        from mpi4py import MPI

        mine, theirs = self._mpi.Get_group(), other.mpi.Get_group()
        try:
            out = MPI.Group.Translate_ranks(mine, list(ranks), theirs)
        finally:
            mine.Free()
            theirs.Free()
        return [None if r == MPI.UNDEFINED else r for r in out]

    def world_rank(self, group_rank: int | None = None) -> int:
        """The world rank of ``group_rank`` (default: this rank)."""
        from .runtime import world

        r = self._rank if group_rank is None else group_rank
        if not 0 <= r < self._size:
            raise InvalidArgumentError(
                f"world_rank (rank {self._rank} of {self._size}): group rank {r} is not in 0..{self._size - 1}"
            )
        return self.translate([r], world())[0]

    def group_rank(self, world_rank: int) -> int | None:
        """This group's rank of ``world_rank`` (None if that rank is not in the group)."""
        from .runtime import world

        return world().translate([world_rank], self)[0]

    def layout(
        self,
        layout: Layout | None = None,
        *,
        tp: int = 1,
        pp: int = 1,
        dp: int | None = None,
        cp: int = 1,
        ep: int = 1,
        order: str = "tp-cp-ep-dp-pp",
    ) -> ParallelGroups:
        """This rank's tensor/pipeline/data/context/expert parallel groups.

        Pass a :class:`~hpccomm.layout.Layout` or its sizes (dp derived when None). Groups
        are made with :meth:`split` on first use and cached; that first use is collective.

        Example (4 ranks, ``g = comm.layout(tp=2, dp=2)``): ``g.tp`` on rank 3 holds ranks
        [2, 3], ``g.dp`` holds [1, 3]; ``g.group("tp-dp")`` holds all four.
        """
        from .layout import Layout
        from .parallel import ParallelGroups

        if layout is None:
            layout = Layout(self._size, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, order=order)
        return ParallelGroups(self, layout)

    @property
    def node(self) -> Communicator:
        """The ranks of this group on this node (MPI shared-memory split), ordered by rank."""
        self._check_open("node")
        if self._node is None:
            from mpi4py import MPI

            mpi_node = self._node_mpi
            if mpi_node is None:
                mpi_node = self._mpi.Split_type(MPI.COMM_TYPE_SHARED, key=self._rank)
            self._node = Communicator(
                mpi_node, name=f"{self.name}/node", timeout=self._timeout, device=self._device
            )
            self._children.append(self._node)
        return self._node

    @property
    def leaders(self) -> Communicator | None:
        """The group's node leaders (local rank 0 of each node), ordered by node; None on
        ranks that are not leaders. Collective over the group on first use."""
        self._node_layout()
        return self._leaders  # type: ignore[return-value]

    def _node_layout(self) -> None:
        if self._leaders is not False:
            return
        from mpi4py import MPI

        node = self.node
        first = node.mpi.allreduce(self._rank, op=MPI.MIN)
        leader = node.rank == 0
        mpi_leaders = self._mpi.Split(0 if leader else MPI.UNDEFINED, first)
        self._leaders = self._adopt(mpi_leaders, f"{self.name}/leaders")
        layout = (self._leaders.rank, self._leaders.size) if leader else None
        index, count = node.mpi.bcast(layout, root=0)
        if self._node_index is None:
            self._node_index, self._num_nodes = index, count

    # -- lifecycle ----------------------------------------------------------------------

    def free(self) -> None:
        """Free this communicator and the groups made from it; idempotent.

        Use after free raises ClosedError ("... already freed"). Collective: all ranks of
        the group should free together.
        """
        if self._freed:
            return
        for child in reversed(self._children):
            child.free()
        self._children.clear()
        self._memos.clear()
        for backend in (self._nccl, self._device_mpi, self._backend):
            if backend is not None:
                backend.close()
        self._freed = True
        from mpi4py import MPI

        if not MPI.Is_finalized() and self._mpi != MPI.COMM_NULL:
            self._mpi.Free()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()
