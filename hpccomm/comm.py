"""The Communicator: the user's object, with operations named as in torch.distributed.

Every operation is one call to the communicator's :class:`~hpccomm.dispatch.Dispatcher`
(resolve -> validate -> record -> choose backend -> run). Group operations (split, dup,
new_group, create_group) ask the MPI backend for a new communicator and run as one step of
the group's collective sequence, bounded by the timeout like any collective.

Across-rank mistakes (one rank passes a different shape, dtype, op or split sizes) cannot be
seen by one rank alone. Today they behave as MPI does, except that a point-to-point receive
shorter than its buffer raises MismatchError: a smaller collective receive than send raises
"message truncated" as a BackendError, a larger one leaves the tail untouched, and
collectives called in different orders hang unless the communicator has a ``timeout`` (then
a CommTimeoutError names the op and its sequence number).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar, cast

import numpy as np

from . import record
from .backends.shm import ShmBackend
from .cuda_aware import CPU_ONLY, DeviceConfig
from .debug import by_rank, level_from
from .dispatch import Dispatcher
from .dtypes import ReduceOp, dtype_info
from .errors import (
    BackendError,
    ClosedError,
    DtypeError,
    HpccommError,
    InvalidArgumentError,
    MismatchError,
)
from .layout import Layout
from .names import Names, lowest_free, numbered
from .notices import REFUSED, NoticeBoard
from .ops import (
    ALL_GATHER,
    ALL_GATHER_OBJECT,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BATCH_P2P,
    BROADCAST,
    BROADCAST_OBJECT,
    C_INT_MAX,
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
    Group,
    P2POp,
    as_int,
    check_timeout,
    index_in,
)
from .parallel import ParallelGroups

if TYPE_CHECKING:
    from mpi4py import MPI

    from .backends.mpi import MPIBackend
    from .backends.mpi_device import DeviceBackends
    from .discovery import LaunchInfo
    from .work import Work

__all__ = ["Communicator", "NodeInfo"]

_SUM = ReduceOp.SUM
# the most bytes one array may span (NumPy indexes with a signed 64-bit integer)
_MAX_BYTES = 2**63 - 1


class NodeInfo(NamedTuple):
    """Where this rank sits among the group's nodes: local rank and size (the group's ranks
    on this node, in rank order), node index (nodes ordered by their lowest rank) and count."""

    local_rank: int
    local_size: int
    node_index: int
    num_nodes: int


def node_info(keys: Sequence[Any], rank: int) -> NodeInfo:
    """NodeInfo of ``rank`` from every rank's node key (any value equal for ranks that share
    a node), as gathered over the group in rank order."""
    mine = keys[rank]
    order: dict[Any, int] = {}
    for k in keys:
        order.setdefault(k, len(order))
    local = [r for r, k in enumerate(keys) if k == mine]
    return NodeInfo(local.index(rank), len(local), order[mine], len(order))


def _not_a_name(value: Any) -> str:
    """What is wrong with ``value`` as a group's name ("" where nothing is)."""
    if isinstance(value, str) and value:
        return ""
    return f"{type(value).__name__} {value!r}, expected a non-empty str"


class Made(NamedTuple):
    """A group creation's result on this rank: its MPI backend (None outside the group),
    its NodeInfo, and the name asked for with the number every member gives it (see
    Communicator._gather)."""

    backend: Any
    nodes: NodeInfo | None
    name: str
    number: int = 1

    @property
    def named(self) -> str:
        """The group's name: ``name``, or ``name-k`` for a number k above 1."""
        return numbered(self.name, self.number)


class NotMember:
    """What ``split`` (color None), ``new_group`` and ``leaders`` return on a rank that is not
    in the new group: falsy (test ``if group:``), and every operation on it raises an
    InvalidArgumentError naming the operation, this rank and the group it is not in, instead
    of an AttributeError on None. ``free()`` does nothing, so code that frees every handle
    runs unchanged."""

    __slots__ = ("_what", "_rank", "_size", "_parent")

    def __init__(self, what: str, rank: int, size: int, parent: str) -> None:
        self._what, self._rank, self._size, self._parent = what, rank, size, parent

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<hpccomm.NotMember: rank {self._rank} of {self._parent} is not in {self._what}>"

    def free(self) -> None:
        """Nothing to free."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise InvalidArgumentError(
            f"{name} (rank {self._rank} of {self._size} in {self._parent}): this rank is not "
            f"a member of the group {self._what} made, and got a non-member handle (falsy: "
            f"test `if group:` before using it)"
        )


_M = TypeVar("_M", bound=Callable[..., Any])


def _creation(what: str) -> Callable[[_M], _M]:
    """A group creation method counted inside its group from its start to the new group's
    adoption (see Dispatcher.inside): another thread's free() of the group refuses
    meanwhile. Counted only while its collective step ran, a free() between that step and
    the adoption freed the group and left the new one outside the tree of groups that the
    exit and a fork() child walk (a review)."""

    def wrap(method: _M) -> _M:
        @functools.wraps(method)
        def counted(self: Communicator, *args: Any, **kwargs: Any) -> Any:
            with self._dispatcher.inside(what):
                return method(self, *args, **kwargs)

        return cast(_M, counted)

    return wrap


def member_gid(base: str, members: Sequence[int]) -> str:
    """A group's id from its creation's (``base``: the parent's id and the step, or a
    name) and its first member's world rank: the groups one split (or node/leaders step)
    makes share the base, and the flight recorder's analysis took a sibling group's members
    for the stuck group's and blamed a rank outside it."""
    return f"{base}@{members[0]}"


class Communicator:
    """A group of ranks and the operations among them.

    Made by :func:`hpccomm.init` (the world) and by :meth:`split`, :meth:`new_group`,
    :meth:`create_group`, :meth:`dup`, :meth:`node` and :meth:`leaders`. The wrapped mpi4py
    communicator is :attr:`mpi`, for anything hpccomm does not cover.

    Args:
        backend: the MPI backend owning this group's mpi4py communicator (freed by
            :meth:`free`).
        devices: picks (and creates) the backends for device arrays.
        name: a label used in messages and records ("world", "world/split(1)", ...).
        timeout: seconds after which a blocking operation raises CommTimeoutError instead of
            hanging (None: wait forever, as MPI does). Subgroups inherit it.
        nodes: this rank's NodeInfo in the group.
        node_key: a value identifying this process's node (the same in every group).
        launch: the world's verified LaunchInfo.
        world: the world communicator (None: this is it).
        device: this rank's GPU and device paths.
    """

    def __init__(
        self,
        backend: MPIBackend,
        devices: DeviceBackends,
        *,
        name: str = "world",
        timeout: float | None = None,
        nodes: NodeInfo,
        node_key: Any,
        launch: LaunchInfo | None = None,
        world: Communicator | None = None,
        device: DeviceConfig = CPU_ONLY,
        node: Any = None,
        notices: NoticeBoard | None = None,
        gid: str = "world",
        debug: str = "large",
    ) -> None:
        self._backend = backend
        self._devices = devices
        self._group = Group(name, backend.rank, backend.size)
        self._dispatcher = Dispatcher(
            self._group, backend, devices.backend_for, timeout=timeout, debug=debug
        )
        self._dispatch = self._dispatcher.dispatch
        # large host reductions among ranks of one node: shared memory (HPCCOMM_SHM=0: off)
        self._dispatcher.shm = ShmBackend.for_group(backend, nodes)
        devices.attach(self._dispatcher)  # NCCL creation: a bounded step of the group
        self._notices = notices
        self._dispatcher.notices = notices
        world_backend = backend if world is None else world._backend
        self._dispatcher.members = (
            list(range(backend.size))
            if world is None
            else [r for r in backend.translate(range(backend.size), world_backend) if r is not None]
        )
        members = self._dispatcher.members
        self._dispatcher.gid = gid if world is None else member_gid(gid, members[:1] or [0])
        self._group.world_ranks = self._dispatcher.members
        self._created: dict[tuple, int] = {}  # create_group calls so far, per (ranks, tag)
        self._nodes = nodes
        self._node_key = node_key
        self._launch = launch
        self._world = self if world is None else world
        self._device = device
        self._node_backend = node  # the world's node communicator, from init
        self._node: Communicator | None = None
        self._leaders: Communicator | NotMember | bool = False  # False: not made yet
        self._children: list[Communicator] = []
        self._parent: Communicator | None = None  # the group this one was made from
        # the numbers the live groups made from this one hold per name ("world/dup" is 1,
        # "world/dup-2" 2: see _gather); this group's own (name, number) in its parent
        self._names = Names()
        self._named: tuple[str, int] | None = None
        self._freed = False
        self._kept: str | None = None  # why free() kept the MPI communicators (strays)

    # -- properties --------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._group.rank

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return self._group.size

    @property
    def name(self) -> str:
        """The group's label in messages and records."""
        return self._group.name

    @name.setter
    def name(self, value: str) -> None:
        odd = _not_a_name(value)
        if odd:
            raise InvalidArgumentError(
                f"name ({self._group.name}, rank {self.rank} of {self.size}): the name is {odd}"
            )
        self._group.name = value

    @property
    def mpi(self) -> MPI.Intracomm:
        """The wrapped mpi4py communicator (MPI's own names: ``comm.mpi.Allreduce`` ...).

        It is the group's own communicator: a raw collective on it must not overlap an
        ``async_op`` or bounded (timeout) hpccomm collective of the group, which runs on the
        group's worker thread (two threads' collectives on one communicator match each
        other's messages: results swapped between the calls, silently). Taken while one
        runs, it warns; for calls of your own beside hpccomm's, take ``own = comm.mpi.Dup()``
        once, while nothing of the group runs (Dup is a collective on it too)."""
        self._check_open("mpi")
        ex = self._dispatcher.executor
        if ex is not None and ex.pending:
            warnings.warn(
                f"{self._here('mpi')}: the group's communicator taken while "
                f"{ex.oldest() or 'a call'} runs on its worker thread: a raw collective on "
                f"it now can match that call's messages (results swapped, silently); wait() "
                f"for it first, or use a duplicate (comm.mpi.Dup(), taken while nothing runs) for calls of your own",
                RuntimeWarning,
                stacklevel=2,
            )
        return self._backend.mpi

    @property
    def launch(self) -> LaunchInfo | None:
        """The verified launch description (world communicator only)."""
        return self._launch

    @property
    def timeout(self) -> float | None:
        """Seconds after which a blocking operation raises CommTimeoutError (None: none)."""
        return self._dispatcher.timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._dispatcher.timeout = check_timeout(value, self._here("timeout"))

    @property
    def debug(self) -> str:
        """The debug level: "off", "large" (the default: collectives whose buffers exceed
        MPI's eager limit compared across ranks before MPI), "check" (every collective, and
        headers on point-to-point messages) or "detail" (plus call sites). Setting it is
        collective over the group (a step of its sequence): every rank sets the same level,
        else every rank raises MismatchError and keeps its level."""
        return self._dispatcher.debug

    @debug.setter
    def debug(self, value: str) -> None:
        """Collective over the group (see Dispatcher.set_debug); a value refused here still
        takes part, so the other ranks raise naming it instead of waiting for this one."""
        try:
            level = level_from(value, self._here("debug"))
        except HpccommError as exc:
            self._dispatcher.set_debug(None, refused=exc)
            raise
        self._dispatcher.set_debug(level)

    @property
    def local_rank(self) -> int:
        """Rank among this group's ranks on the same node (known since the group was made:
        reading it never communicates)."""
        return self._nodes.local_rank

    @property
    def local_size(self) -> int:
        """Number of this group's ranks on this node."""
        return self._nodes.local_size

    @property
    def node_index(self) -> int:
        """Index of this node among the group's nodes (ordered by their lowest rank)."""
        return self._nodes.node_index

    @property
    def num_nodes(self) -> int:
        """Number of nodes the group spans."""
        return self._nodes.num_nodes

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
        return self._devices.nccl_comm

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
        self._devices.enable_nccl(self._here("enable_nccl"))

    def __repr__(self) -> str:
        state = " freed" if self._freed else ""
        return f"<hpccomm.Communicator {self.name} rank {self.rank} of {self.size}{state}>"

    def _node_gid(self) -> str:
        """The id of :meth:`node`'s group before :func:`member_gid` (named, not numbered:
        the world's is made at init or on a first call, no step of its sequence on every
        rank alike)."""
        return f"{self._dispatcher.gid}/node"

    def _here(self, opname: str) -> str:
        """The prefix of this group's messages (:meth:`Group.here`)."""
        return self._group.here(opname)

    def _check_open(self, opname: str) -> None:
        if self._freed:
            raise ClosedError(f"{self._here(opname)}: communicator {self.name} already freed")

    # -- collectives -------------------------------------------------------------------

    def all_reduce(
        self, array: Any, op: ReduceOp = _SUM, *, async_op: bool = False, stream: Any = None
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
            InvalidArgumentError: a non-contiguous or read-only array.

        Example (4 ranks, ``x = np.full(2, rank)``): every rank ends with ``[6, 6]``.
        """
        return self._dispatch(ALL_REDUCE, array, redop=op, async_op=async_op, stream=stream)

    def reduce(
        self,
        array: Any,
        dst: int = 0,
        op: ReduceOp = _SUM,
        *,
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
        return self._dispatch(REDUCE, array, peer=dst, redop=op, async_op=async_op, stream=stream)

    def broadcast(
        self, array: Any, src: int = 0, *, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Copy ``src``'s array into every rank's ``array``, in place.

        All ranks of the group must call this, in the same order, with arrays of the same
        shape and dtype; non-source ranks' contents are overwritten.

        Returns:
            ``array``, or a Work.
        """
        return self._dispatch(BROADCAST, array, peer=src, async_op=async_op, stream=stream)

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
        return self._dispatch(ALL_GATHER, array, out, sizes=sizes, async_op=async_op, stream=stream)

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
        return self._dispatch(
            GATHER, array, out, peer=dst, sizes=sizes, async_op=async_op, stream=stream
        )

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
        array; every other rank passes ``out=`` (its block; torch's ``scatter(tensor, src=)``
        output tensor). A non-source rank passing only an array is refused: hpccomm cannot
        tell the full array from a block and does not guess.

        Returns:
            this rank's block (``out``).

        Example (2 ranks, src has ``[0, 1, 2, 3]``): rank 0 gets ``[0, 1]``, rank 1 ``[2, 3]``.
        """
        return self._dispatch(
            SCATTER, array, out, peer=src, sizes=sizes, async_op=async_op, stream=stream
        )

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
        return self._dispatch(
            REDUCE_SCATTER, array, out, redop=op, sizes=sizes, async_op=async_op, stream=stream
        )

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
        return self._dispatch(ALL_TO_ALL, array, out, async_op=async_op, stream=stream)

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
        return self._dispatch(
            ALL_TO_ALL,
            array,
            out,
            in_splits=input_split_sizes,
            out_splits=output_split_sizes,
            async_op=async_op,
            stream=stream,
        )

    def barrier(self, *, async_op: bool = False) -> Any:
        """Wait until every rank of the group has called barrier.

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(BARRIER, async_op=async_op)

    def monitored_barrier(self, timeout: float | None = None) -> None:
        """A barrier that names the ranks that did not arrive (as gloo's in torch).

        All ranks of the group must call this, in the same order. Every rank reports to the
        group's rank 0, which waits ``timeout`` seconds (default: the communicator's timeout,
        else 60) for the others and then releases them.

        Raises:
            CommTimeoutError: on every rank that arrived, naming the ranks (of this group)
                that did not, e.g. ``monitored_barrier #7 on world (rank 0 of 4): rank(s)
                [3] of the group did not arrive within 5 s``.
        """
        self._check_open("monitored_barrier")
        notices = self._notices
        broken = self._dispatcher.broken
        if notices is None and broken is not None:  # a fork() child (it said "no init()")
            raise ClosedError(f"{self._here('monitored_barrier')}: {broken}")
        if notices is None:  # pragma: no cover - init always makes the board
            raise HpccommError(f"{self._here('monitored_barrier')}: no init()")
        self._group.seq += 1  # (a refused one too: the group's calls stay in step)
        seq = self._group.seq
        w = f"monitored_barrier #{seq} on {self.name} (rank {self.rank} of {self.size})"
        members = self._dispatcher.members
        try:
            bound = check_timeout(timeout if timeout is not None else (self.timeout or 60.0), w)
        except HpccommError as exc:  # the others, waiting in it, hear of it at once
            why = f"{type(exc).__name__}: {exc}"
            notices.post(self._dispatcher.gid, seq, "monitored_barrier", self.rank, members,
                         why, REFUSED)  # fmt: skip
            raise
        with record.reported():  # the flight recorder's dump, as for an operation
            notices.monitored_barrier(
                self._dispatcher.gid, seq, members, self.rank, bound or 60.0, w
            )

    # -- point-to-point -----------------------------------------------------------------

    def send(
        self, array: Any, dst: int, *, tag: int = 0, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Send ``array`` to rank ``dst`` (returns when the buffer may be reused)."""
        return self._dispatch(SEND, array, peer=dst, tag=tag, async_op=async_op, stream=stream)

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

        Raises:
            MismatchError: the message was shorter or longer than ``array`` (naming sender,
                tag and both sizes; a longer one is received into scratch memory and
                dropped, ``array`` unchanged); with ``async_op`` a longer one is MPI's
                BackendError (MPI_ERR_TRUNCATE).
        """
        return self._dispatch(RECV, array, peer=src, tag=tag, async_op=async_op, stream=stream)

    def isend(self, array: Any, dst: int, *, tag: int = 0, stream: Any = None) -> Work:
        """Start a send; returns a Work. Keep ``array`` unchanged until it completes."""
        return self._dispatch(SEND, array, peer=dst, tag=tag, async_op=True, stream=stream)

    def irecv(
        self, array: Any, src: int | None = None, *, tag: int | None = 0, stream: Any = None
    ) -> Work:
        """Start a receive; returns a Work whose ``wait()`` returns the source rank."""
        return self._dispatch(RECV, array, peer=src, tag=tag, async_op=True, stream=stream)

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
        return self._dispatch(
            SENDRECV, array, out, peer=dst, src=src, tag=tag, async_op=async_op, stream=stream
        )

    def batch_isend_irecv(self, p2p_ops: Sequence[P2POp], *, async_op: bool = True) -> Any:
        """Post several sends and receives together; one Work completes them all. The whole
        batch is checked before anything is posted.

        Example (ring): ``comm.batch_isend_irecv([P2POp("send", x, right), P2POp("recv", y,
        left)]).wait()``.
        """
        return self._dispatch(BATCH_P2P, p2p_ops, async_op=async_op)

    # -- Python objects -----------------------------------------------------------------

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """Return ``src``'s object on every rank (pickled; large buffers out of band).

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(BROADCAST_OBJECT, obj, peer=src)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Return the list of every rank's object, in rank order, on every rank.

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(ALL_GATHER_OBJECT, obj)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Return the list of every rank's object on ``dst``; None on other ranks.

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(GATHER_OBJECT, obj, peer=dst)

    def scatter_object(self, objects: Sequence[Any] | None = None, src: int = 0) -> Any:
        """Give ``objects[i]`` (a list of group-size items on ``src``) to rank i.

        All ranks of the group must call this, in the same order.
        """
        return self._dispatch(SCATTER_OBJECT, objects, peer=src)

    def send_object(self, obj: Any, dst: int, *, tag: int = 0) -> None:
        """Send a picklable object to ``dst``."""
        return self._dispatch(SEND_OBJECT, obj, peer=dst, tag=tag)

    def recv_object(self, src: int | None = None, *, tag: int | None = 0) -> Any:
        """Receive an object from ``src`` (None: any source)."""
        return self._dispatch(RECV_OBJECT, None, peer=src, tag=tag)

    # -- symmetric buffers ----------------------------------------------------------------

    def empty(self, shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
        """A symmetric buffer: a NumPy array in memory the group's ranks share, so that
        ``all_reduce``, ``reduce`` and ``reduce_scatter`` on it need no copy in (peers read
        it in place) and ``all_reduce`` writes its result straight into every rank's array.

        All ranks of the group must call this, in the same order, with the same shape and
        dtype. The group must be on one node with the shared-memory path on; otherwise
        (several nodes, ``HPCCOMM_SHM=0``, a rank that cannot map the memory: the same on
        every rank) it returns an ordinary array, on which every operation works as usual
        (:meth:`is_symmetric` tells). The contents are zero (fresh pages), but do not rely on
        that: :meth:`zeros` says it.

        A call takes the symmetric path when every rank passes its array (or the same
        C-contiguous part of it) from the same ``empty`` call, from 256 KiB of input
        (``HPCCOMM_SHM_THRESHOLD`` when set); ranks passing different buffers get a
        MismatchError. Between the call's two barriers another rank may read and write
        this rank's array: do not touch it until the call has returned (or its Work has
        completed). The memory lives as long as the array or any view of it; after
        :meth:`free` the array stays valid, an ordinary array no longer shared by calls.

        Args:
            shape: the array's shape.
            dtype: a dtype hpccomm reduces (default float32).

        Returns:
            this rank's array (symmetric when the group can share memory).

        Raises:
            DtypeError: an unsupported dtype.
            MismatchError: the ranks asked for different shapes or dtypes (on every rank).

        Example (2 ranks): ``x = comm.empty(1 << 20); x[:] = rank; comm.all_reduce(x)``:
        both ranks' ``x`` hold 1.0 everywhere.
        """
        return self._symmetric(shape, dtype, stacklevel=3, what="empty")

    def zeros(self, shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
        """:meth:`empty`, filled with zeros (free: its memory is fresh pages). Collective,
        like :meth:`empty`."""
        return self._symmetric(shape, dtype, stacklevel=3, what="zeros")

    def _symmetric(self, shape: Any, dtype: Any, *, stacklevel: int, what: str) -> np.ndarray:
        """:meth:`empty`; a fall-back warning points ``stacklevel`` frames up (the user's
        line, also when the allocation ran on the group's worker thread)."""
        self._check_open(what)
        here = self._here(what)
        with self._refusing(what):  # (the others are in the step: they hear of it)
            try:
                dt = np.dtype(dtype)
            except TypeError as exc:
                raise DtypeError(f"{here}: dtype is {dtype!r}: {exc}") from exc
            dtype_info(dt, here, "dtype")
            try:
                dims: tuple[Any, ...] = (
                    (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
                )
            except TypeError:
                dims = (shape,)
            if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
                raise InvalidArgumentError(f"{here}: shape is {shape!r}, expected integers >= 0")
            dims = tuple(int(d) for d in dims)
            nbytes = math.prod(dims) * dt.itemsize  # (Python ints: exact)
            # NumPy refuses a shape whose nonzero dimensions' product overflows, with no
            # element at all too ((0, 2**70): a raw OverflowError, an outside hunt)
            spans = math.prod(d for d in dims if d) * dt.itemsize
            if max(nbytes, spans) > _MAX_BYTES:  # (NumPy's products wrapped: another size
                # on each rank)
                size = f"is {nbytes:,} bytes" if nbytes else f"spans {spans:,} bytes (no element)"
                raise InvalidArgumentError(
                    f"{here}: shape {dims} of {dt} {size}, more than any array can hold "
                    f"({_MAX_BYTES:,})"
                )
        shm = self._shm()
        mpi = self._backend.mpi

        def job() -> np.ndarray | str | None:
            asked = mpi.allgather((dims, dt.name))
            if any(a != asked[0] for a in asked):
                wants = "; ".join(f"rank {r}: {a[0]} {a[1]}" for r, a in enumerate(asked))
                raise MismatchError(
                    f"{here}: the ranks ask for different arrays ({wants}); expected the "
                    f"same shape and dtype on every rank"
                )
            return None if shm is None else shm.allocate(here, dims, dt)

        made = self._dispatcher.collective("empty", job, agree={"shape": dims, "dtype": dt.name})
        if isinstance(made, str):  # (the same on every rank: the reasons are agreed)
            warnings.warn(
                f"{here}: an ordinary array, not a symmetric buffer: the shared memory "
                f"could not be mapped: {made}",
                RuntimeWarning,
                stacklevel=stacklevel,
            )
        if made is None or isinstance(made, str):
            return np.zeros(dims, dt)
        self._dispatcher.cache.clear()  # calls of any description may now take the path
        return made

    def is_symmetric(self, array: Any) -> bool:
        """True when ``array`` (a C-contiguous NumPy array) lies in this rank's part of one
        of this group's symmetric buffers (:meth:`empty`). Local: no communication."""
        shm = self._shm()
        return not self._freed and shm is not None and shm.locate(array) is not None

    def _shm(self) -> ShmBackend | None:
        shm = self._dispatcher.shm
        return shm if isinstance(shm, ShmBackend) else None

    # -- groups -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _refusing(self, what: str) -> Iterator[None]:
        """Around a group creation's argument checks: a refusal on this rank is told to
        the others, which are in the creation (see Dispatcher.refused_creation)."""
        try:
            yield
        except HpccommError as exc:
            self._dispatcher.refused_creation(what, exc)
            raise

    def _make(
        self,
        what: str,
        name: str,
        create: Any,
        *args: Any,
        agree: dict[str, Any] | None = None,
    ) -> Made:
        """Run a group creation as one bounded collective step: the new MPI backend (None
        on ranks outside it), this rank's NodeInfo in it and the group's name (``name``,
        numbered where taken: see _gather)."""

        def job() -> Made:
            try:
                backend = create(*args)
            except Exception as exc:  # mpi4py's MPI.Exception (MPI_ERR_INTERN, bare)
                raise self._not_created(what, exc) from exc
            if backend is None:
                return Made(None, None, name)
            return self._gather(backend, name, what)

        return cast(Made, self._dispatcher.collective(what, job, agree=agree))

    def _gather(self, backend: Any, name: str, what: str) -> Made:
        """One small allgather over a new group (on its creation's step): every member's
        node key, so that local_rank & co never communicate later, its name for the group
        (they must agree: a split's name=, a layout's dimensions), and the numbers of its
        live groups of that name made from this communicator. The group is ``name`` where
        no member holds one (number 1), else ``name-k`` with the lowest k that none holds,
        so that two live groups of one name are told apart (two splits of one color, two
        layouts' "tp", two new_groups of one list were all "world/split(0)" & co: a
        message or a trace could not say which, an outside hunt) and every member gives the
        group the same one (a split's members differ in the other groups they made). The
        number is taken here, on the thread that ran the creation, before the next one."""
        # (compared below this group's own name, which a program may have set per rank:
        # "/split(0)", or a split's name= whole)
        parent = f"{self.name}/"
        own = name[len(self.name) :] if name.startswith(parent) else name
        mine = (self._node_key, name, own, self._names.mask(name), self.rank)
        got = backend.mpi.allgather(mine)
        if any(o != own for _, _, o, _, _ in got):
            backend.free()
            named = by_rank((r, repr(n)) for _, n, _, _, r in got)
            if len(named) < 2:  # (alike in full: their parents' names differ per rank)
                named = by_rank((r, repr(o)) for _, _, o, _, r in got)
            err = MismatchError(
                f"{self._here(what)}: the new group's members name it differently: "
                f"{', '.join(named[:-1])} but {named[-1]} (ranks of {self.name}; a group's "
                f"members pass the same split name=, and a layout's ask for the same group)"
            )
            err.local = True  # (every member raises it; the others' creations are fine)
            raise err
        number = lowest_free(mask for _, _, _, mask, _ in got)
        self._names.take(name, number)
        return Made(backend, node_info([g[0] for g in got], backend.rank), name, number)

    def _tree(self) -> Iterator[Communicator]:
        """This group and every group made from it, at any depth (freed ones included
        until they are let go)."""
        stack = [self]
        while stack:
            c = stack.pop()
            yield c
            stack.extend(c._children)

    def _not_created(self, what: str, exc: BaseException) -> BackendError:
        """MPI refused to make a group's communicators: how many groups this process holds
        (each has four: its own, the checks', the checked messages' data and mpi4py's for
        objects; Open MPI 5 runs out of communicator ids at 65,532, about 16,380 groups).
        Groups dropped without free() keep theirs for good."""
        live = sum(not c.freed for c in self._world._tree())
        kept = Communicator._kept_count
        also = (
            f" and {kept:,} freed groups whose communicators free() kept (a message could "
            f"still come to them, or a call of theirs is stuck; the latest: "
            f"{Communicator._kept_latest})"
            if kept
            else ""
        )
        return BackendError(
            f"{self._here(what)}: MPI could not create the group's communicators: "
            f"{type(exc).__name__}: {exc}; this process holds {live:,} groups not freed (the "
            f"world included){also}, each with 4 MPI communicators (Open MPI runs out at "
            f"about 16,380 groups): free() the groups no longer used (a group dropped "
            f"without free() keeps its communicators for good)"
        )

    def _adopt(
        self,
        made: Made,
        device: DeviceConfig | None = None,
        gid: str | None = None,
    ) -> Communicator | None:
        backend, nodes, base, number = made
        if backend is None or nodes is None:
            return None
        device = device or self._device
        # (a second live dup() was "world/dup" too, and a timeout read as two calls of one
        # group that differed; the names of all live children were gathered and searched at
        # every creation once: 15 ms a dup() with 6,200 live ones, quadratic in all, hunt
        # AM, 2026-12-05; _gather sends one int per name: Names)
        try:
            child = Communicator(
                backend,
                self._devices.child(backend, device),
                name=made.named,
                timeout=self.timeout,
                nodes=nodes,
                node_key=self._node_key,
                world=self._world,
                device=device,
                notices=self._notices,
                # the same on every member: the parent's id and the creation's sequence
                # number
                gid=gid or f"{self._dispatcher.gid}/{self._group.seq}",
                debug=self.debug,
            )
        except BaseException:
            self._names.release(base, number)
            raise
        self._children.append(child)
        child._parent = self
        child._named = (base, number)
        return child

    @_creation("split")
    def split(
        self,
        color: int | None,
        *,
        key: int | None = None,
        expect: Any = None,
        name: str | None = None,
    ) -> Communicator | NotMember:
        """Split into groups by ``color`` (None: this rank joins no group and gets a
        :class:`NotMember`, which is falsy and refuses every operation),
        ordered by ``key`` (default: this rank). All ranks of the group must call this.
        Unless the debug level is "off" the ranks compare ``expect`` (any value every rank
        should agree on, such as the layout and dimension the groups are for) and raise a
        MismatchError naming those that differ. ``name``: the group's name in messages and
        records (default ``"<this name>/split(color)"``; a group's members must pass the
        same); where a live group made from this communicator has it on some member, the
        new one is ``name-2`` (``-3`` ...), the same on every member.

        Example (4 ranks, ``color = rank % 2``): ranks 0, 2 form one group, 1, 3 another.
        """
        self._check_open("split")
        w = self._here("split")
        with self._refusing("split"):
            if color is not None:
                value = as_int(color)
                if value is None or not 0 <= value <= C_INT_MAX:
                    raise InvalidArgumentError(
                        f"{w}: color is {color!r}, expected an integer in 0..{C_INT_MAX} or None"
                    )
                color = value
            if key is not None:
                value = as_int(key)
                if value is None or not -C_INT_MAX - 1 <= value <= C_INT_MAX:
                    raise InvalidArgumentError(
                        f"{w}: key is {key!r}, expected an integer in "
                        f"{-C_INT_MAX - 1}..{C_INT_MAX} or None"
                    )
                key = value
            odd = None if name is None else _not_a_name(name)
            if odd:
                raise InvalidArgumentError(f"{w}: name is {odd}")
        made = self._make(
            "split",
            f"{self.name}/split({color})" if name is None else name,
            self._backend.split,
            color,
            self.rank if key is None else key,
            agree=None if expect is None else {"expect": expect},
        )
        child = self._adopt(made)
        if child is None:
            return NotMember("split(None)", self.rank, self.size, self.name)
        return child

    def _check_ranks(self, what: str, ranks: Sequence[int]) -> list[int]:
        # taken once, as a list (a generator was read twice: a bare ValueError from zip,
        # and a TypeError for an int, neither told to the other ranks: an outside hunt)
        if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
            raise InvalidArgumentError(
                f"{self._here(what)}: ranks is {type(ranks).__name__} {ranks!r}, expected a "
                f"sequence of ranks"
            )
        ranks = list(ranks)
        values = [as_int(r) for r in ranks]
        pairs = list(zip(ranks, values, strict=True))
        odd = [r for r, v in pairs if v is None]  # (bools too: True == 1 to Python)
        out = [r for r, v in pairs if v is not None and not 0 <= v < self.size]
        if odd or out or len(set(values)) != len(values) or not values:
            raise InvalidArgumentError(
                f"{self._here(what)}: ranks {list(ranks)} must be distinct "
                f"ranks in 0..{self.size - 1}, at least one"
                + (f"; not integers: {odd}" if odd else "")
                + (f"; out of range: {out}" if out else "")
            )
        return values  # type: ignore[return-value]

    @_creation("new_group")
    def new_group(self, ranks: Sequence[int]) -> Communicator | NotMember:
        """A group of ``ranks`` (in that order); ranks outside get a :class:`NotMember`.

        All ranks of this communicator must call this, with the same list (see
        :meth:`create_group` for a call made by the members only).
        """
        self._check_open("new_group")
        with self._refusing("new_group"):
            ranks = self._check_ranks("new_group", ranks)
        made = self._make(
            "new_group",
            f"{self.name}/group{ranks}",
            self._backend.create,
            ranks,
            agree={"ranks": ranks},
        )
        child = self._adopt(made)
        if child is None:
            return NotMember(f"new_group({ranks})", self.rank, self.size, self.name)
        return child

    @_creation("create_group")
    def create_group(
        self, ranks: Sequence[int], *, tag: int = 0, timeout: float | None = None
    ) -> Communicator:
        """A group of ``ranks`` (in that order), made by those ranks alone
        (``MPI_Comm_create_group``): the other ranks of this communicator do not call it.

        Every member must call this with the same list and ``tag`` (MPI's tag of the
        creation). A group's creations run one at a time, in each rank's call order (on its
        worker thread), so two creations made from two threads in a different order on
        different ranks wait for each other until the timeout, whatever their tags (MPI
        itself can run them at once given different tags). This rank must be in ``ranks``.
        ``timeout``:
        seconds the creation may take (default: this communicator's timeout), after which
        CommTimeoutError (a member that never calls it, or passed another list).
        """
        self._check_open("create_group")
        ranks = self._check_ranks("create_group", ranks)
        if self.rank not in ranks:
            raise InvalidArgumentError(
                f"{self._here('create_group')}: this rank is not in ranks "
                f"{ranks}; only members call create_group (new_group is the call for all ranks)"
            )
        tag_value = as_int(tag)
        top = self._backend.creation_tag_max
        if tag_value is None or not 0 <= tag_value <= top:
            raise InvalidArgumentError(
                f"{self._here('create_group')}: tag is {tag!r}, expected an integer in 0..{top:,}"
            )

        def job() -> Made:
            try:
                made = self._backend.create_group(ranks, tag_value)
            except Exception as exc:  # mpi4py's MPI.Exception (MPI_ERR_INTERN, bare)
                raise self._not_created("create_group", exc) from exc
            return self._gather(made, f"{self.name}/group{ranks}", "create_group")

        # the members only: not a step of this group's sequence, bounded by its timeout;
        # counted inside the group (_creation: free() from another thread refuses meanwhile;
        # it ran on the caller's thread unseen, and free() freed the communicator under it,
        # an outside review), and refused if free() closed the group first
        d = self._dispatcher
        with record.reported():  # (the flight recorder's dump, as for an operation)
            if d.closed:
                raise ClosedError(
                    f"{self._here('create_group')}: communicator {self.name} {d.closed_state()}"
                )
            if d.broken is not None:  # (a fork() child's MPI, or a call stuck on the group)
                raise ClosedError(f"{self._here('create_group')}: {d.broken}")
            made = d.bounded(
                f"create_group {ranks}{f' (tag {tag_value})' if tag_value else ''} on "
                f"{self.name} (rank {self.rank} of {self.size})",
                job,
                late="not complete after {t} s; some rank of the list has not called "
                "create_group, or called it with another list or tag, or made this group's "
                "creations in another order (they run one at a time, in each rank's call "
                "order) (MPI cannot cancel it: abort the job)",
                timeout=check_timeout(timeout, self._here("create_group")),
                some=ranks,
            )
        count = self._created.get((tuple(ranks), tag_value), 0)
        self._created[(tuple(ranks), tag_value)] = count + 1
        child = self._adopt(made, gid=f"{self._dispatcher.gid}/create{ranks}:{tag_value}:{count}")
        if child is None:  # pragma: no cover - MPI gives every member its group
            raise HpccommError(f"{self._here('create_group')}: MPI returned no group")
        return child

    @_creation("dup")
    def dup(self, *, device_backend: str | None = None) -> Communicator:
        """A new communicator with the same ranks and separate message space.

        Args:
            device_backend: "nccl" or "mpi" to change how device arrays travel on the copy
                (default: as on this one). All ranks must call this.
        """
        self._check_open("dup")
        device = self._device
        if device_backend is not None:
            with self._refusing("dup"):  # (the others are in the dup: they hear of it)
                if device_backend not in ("nccl", "mpi"):
                    raise InvalidArgumentError(
                        f"{self._here('dup')}: device_backend is "
                        f"{device_backend!r}, expected 'nccl' or 'mpi'"
                    )
            device = device._replace(mode=device_backend, auto=False)
        child = self._adopt(self._make("dup", f"{self.name}/dup", self._backend.dup), device)
        if child is None:  # pragma: no cover - a dup always includes this rank
            raise HpccommError(f"{self._here('dup')}: MPI returned no communicator")
        return child

    def translate(self, ranks: Sequence[int], other: Communicator) -> list[int | None]:
        """This group's ``ranks`` as ranks of ``other`` (None where a rank is not in ``other``).

        Local: nothing is communicated. Ranks may be NumPy integers (bools are refused).

        Example (4 ranks, ``half = comm.split(comm.rank % 2)``): on ranks 1 and 3,
        ``half.translate([0, 1], comm)`` is [1, 3] and ``comm.translate([0, 1], half)`` is
        [None, 0].

        Raises:
            InvalidArgumentError: a rank that is not in 0..size-1 of this group (or not an
                integer), or ``other`` is not a Communicator (a NotMember has no ranks).
            ClosedError: this group or ``other`` was freed.
        """
        self._check_open("translate")
        if not isinstance(other, Communicator):
            raise InvalidArgumentError(
                f"{self._here('translate')}: other is {other!r}, expected a Communicator"
            )
        try:
            given = list(ranks)
        except TypeError:
            raise InvalidArgumentError(
                f"{self._here('translate')}: ranks is {ranks!r}, expected a sequence of ranks "
                f"of {self.name} (0..{self.size - 1})"
            ) from None
        checked = [
            self._rank_in("translate", r, self.size, "group rank", f" (ranks[{i}] of {given})")
            for i, r in enumerate(given)
        ]
        return self._translated("translate", checked, other)

    def world_rank(self, group_rank: int | None = None) -> int:
        """The world rank of ``group_rank`` (default: this rank); local.

        Raises:
            InvalidArgumentError: ``group_rank`` is not in 0..size-1 (or not an integer).
            ClosedError: the group was freed.
        """
        self._check_open("world_rank")
        given = self.rank if group_rank is None else group_rank
        r = self._rank_in("world_rank", given, self.size, "group rank")
        value = self._translated("world_rank", [r], self._world)[0]
        if value is None:  # pragma: no cover - every rank of a group is a world rank
            raise HpccommError(f"{self._here('world_rank')}: rank {r} not in world")
        return value

    def group_rank(self, world_rank: int) -> int | None:
        """This group's rank of ``world_rank`` (None if that rank is not in the group); local.

        Example (4 ranks, ``half = comm.split(comm.rank % 2)``): on ranks 1 and 3,
        ``half.group_rank(3)`` is 1 and ``half.group_rank(2)`` is None.

        Raises:
            InvalidArgumentError: ``world_rank`` is not in 0..world size-1 (or not an
                integer).
            ClosedError: the group was freed.
        """
        self._check_open("group_rank")
        r = self._rank_in("group_rank", world_rank, self._world.size, "world rank")
        return self._world._translated("group_rank", [r], self, here=self)[0]

    def _rank_in(self, what: str, value: Any, size: int, label: str, context: str = "") -> int:
        """``value`` as a rank in 0..size-1 (NumPy integers too, bools not), else an
        InvalidArgumentError naming ``what``, the ``label``led value and the range (MPI
        crashes on a rank outside the group, and passes MPI_PROC_NULL through)."""
        return index_in(value, size, self._here(what), label, context)

    def _translated(
        self, what: str, ranks: list[int], other: Communicator, *, here: Communicator | None = None
    ) -> list[int | None]:
        """Checked ``ranks`` of this group as ranks of ``other``; ClosedError where either
        was freed (MPI raised its bare MPI_ERR_COMM) or another thread's free() closed it.
        ``here``: the group whose call it is (default this one), for the message. Counted
        inside both groups (Dispatcher.inside) before they are checked: it reads their
        communicators, which another thread's free() otherwise freed under it (checked
        before and unseen by the free(), a review)."""
        with self._dispatcher.inside(what), other._dispatcher.inside(what):
            for c in (self, other):
                d = c._dispatcher
                if c._freed or d.closed:
                    raise ClosedError(
                        f"{(here or self)._here(what)}: communicator {c.name} {d.closed_state()}"
                    )
            return self._backend.translate(ranks, other._backend)

    def layout(
        self,
        layout: Layout | None = None,
        *,
        tp: int | None = None,
        pp: int | None = None,
        dp: int | None = None,
        cp: int | None = None,
        ep: int | None = None,
        order: str | None = None,
    ) -> ParallelGroups:
        """This rank's tensor/pipeline/data/context/expert parallel groups.

        Pass a :class:`~hpccomm.layout.Layout` or its sizes (each 1 when not given, dp
        derived; order "tp-cp-ep-dp-pp"), not both. Groups are made with :meth:`split` on
        first use and cached; that first use is collective.

        Example (4 ranks, ``g = comm.layout(tp=2, dp=2)``): ``g.tp`` on rank 3 holds ranks
        [2, 3], ``g.dp`` holds [1, 3]; ``g.group("tp-dp")`` holds all four.
        """
        self._check_open("layout")
        given = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "order": order}
        passed = {k: v for k, v in given.items() if v is not None}
        if layout is None:  # the rest takes Layout's defaults
            try:
                layout = Layout(self.size, **passed)  # type: ignore[arg-type]
            except InvalidArgumentError as exc:  # ("layout: ..."): named with this rank
                said = str(exc).removeprefix("layout: ")
                raise InvalidArgumentError(f"{self._here('layout')}: {said}") from None
        elif passed:  # they were ignored: the layout passed decides everything
            raise InvalidArgumentError(
                f"{self._here('layout')}: both a Layout and {passed} were given, expected "
                f"one of them (the Layout's own sizes and order are {layout!r})"
            )
        return ParallelGroups(self, layout)

    @_creation("node")
    def node(self) -> Communicator:
        """The ranks of this group on this node (MPI shared-memory split), ordered by rank.

        Collective over the group on its first call (cached after). Its ranks number the
        node's ranks in rank order, for the world too; the world's :attr:`local_rank` is the
        launcher's numbering, which may differ (Open MPI 5 oversubscribed: local ranks 0, 2,
        1, 3 for ranks 0..3).

        Example (4 ranks on one node): ``comm.node().translate(range(4), comm)`` is
        [0, 1, 2, 3] and its ``all_gather`` returns the blocks in rank order.
        """
        self._check_open("node")
        if self._node is None:
            made: Made
            if self._node_backend is not None:  # made at init, ordered by rank
                nb = self._node_backend
                made = Made(nb, NodeInfo(nb.rank, nb.size, 0, 1), f"{self.name}/node")
                self._names.take(made.name, 1)  # (_gather takes it for the others)
                self._node_backend = None
            else:
                made = self._make("node", f"{self.name}/node", self._backend.node)
            self._node = self._adopt(made, gid=self._node_gid())
        if self._node is None:  # pragma: no cover - every rank is on its node
            raise HpccommError(f"{self._here('node')}: MPI returned no group")
        return self._node

    @_creation("leaders")
    def leaders(self) -> Communicator | NotMember:
        """The group's node leaders (local rank 0 of each node), ordered by node; a
        :class:`NotMember` on ranks that are not leaders. Collective over the group on its
        first call."""
        self._check_open("leaders")
        if self._leaders is False:
            leader = self.local_rank == 0
            made = self._make(
                "leaders",
                f"{self.name}/leaders",
                self._backend.split,
                0 if leader else None,
                self.node_index,
            )
            self._leaders = self._adopt(made) or NotMember(
                "leaders()", self.rank, self.size, self.name
            )
        return self._leaders  # type: ignore[return-value]

    # -- lifecycle ----------------------------------------------------------------------

    def free(self) -> None:
        """Free this communicator and the groups made from it; idempotent.

        Use after free raises ClosedError ("... already freed"). Collective: all ranks of
        the group should free together. A group made unusable by a peer's failure or
        refusal is freed with its call still inside MPI (it never completes): its MPI
        communicators and worker thread stay, and the exit aborts the job, naming it.
        A group's NCCL communicator is released once the GPU has finished the calls
        enqueued on it (an ``async_op`` Work dropped unwaited, say): without a timeout this
        waits until they finish; with one at most that long (a call given up meanwhile, or
        before, aborted the communicator instead).

        Raises:
            InvalidArgumentError: an ``async_op`` operation of the group (a collective, or a
                point-to-point Work handed out) is still running (wait() for it first);
                nothing is freed then. (Device calls on NCCL once enqueued are waited for
                instead, as above.)
            CommTimeoutError: a device call on NCCL was not finished on the GPU within the
                group's timeout; its NCCL communicator was aborted, and everything freed
                (where several groups failed so, one error of the first's type says all).
            BackendError: NCCL or CUDA reported an error while the GPU finished them (the
                communicator aborted, everything freed).
        """
        if self._freed:
            return
        Communicator._look([self], self._here("free"))
        Communicator._raise_late(self._free_after())

    @staticmethod
    def _raise_late(problems: list[HpccommError]) -> None:
        """Raise what freeing met on the GPU (a device call still unfinished after the
        group's timeout, an NCCL or CUDA error), once every group is freed."""
        if len(problems) == 1:
            raise problems[0]
        if problems:  # (the first chained as the cause)
            said = "; and ".join(f"{type(p).__name__}: {p}" for p in problems[1:])
            raise type(problems[0])(f"{problems[0]}; and {said}") from problems[0]

    @staticmethod
    def _look(groups: list[Communicator], here: str) -> None:
        """Close ``groups`` and the groups made from them to new calls, then look for calls
        running on them; InvalidArgumentError naming them where some run (the groups are
        opened again: nothing is freed). Closed first (no cached descriptions: a call
        starting now gets ClosedError from validation), since a thread could start a call
        from the cache after the look and reach MPI on the freed communicator (a segfault;
        MPI_ERR_COMM in MPI_Mprobe: an outside review, with another thread calling in a
        loop); one that started before is inside the dispatch, where the look finds it."""
        fenced: list[Dispatcher] = []
        busy: list[str] | None = None
        try:
            for g in groups:
                g._fence(fenced)
            busy = [b for g in groups for b in g._running()]
        finally:
            if busy != []:  # refused (or interrupted): nothing freed, open them again
                for d in fenced:
                    d.reopen()
        if busy:
            raise InvalidArgumentError(
                f"{here}: {'; '.join(busy)}; wait() for them first (nothing was freed; an "
                f"async collective whose Work was dropped unwaited holds free() up only while "
                f"it runs, its arrays kept alive until MPI is done with them: a barrier() of "
                f"the group waits for it)"
            )

    def _free_after(self) -> list[HpccommError]:
        """Free this group and those made from it, closed and looked at by _look (not
        looked at again: a thread refused by the closed group meanwhile is still counted
        inside it, and a second look made a layout's free() raise after freeing some).
        Returns what the NCCL communicators' release met (see DeviceBackends.close), for
        the caller to raise once all are freed."""
        problems: list[HpccommError] = []
        if self._freed:
            return problems
        for child in reversed(list(self._children)):
            problems += child._free_after()
        self._children.clear()
        parent, self._parent = self._parent, None
        if parent is not None:  # (kept there, every freed group stayed in memory for good:
            # about 20 KB each, 0.6 MB with the fast path's buffers, in a soak review)
            parent._children[:] = [c for c in parent._children if c is not self]
            if self._named is not None:  # (its name may be given to the parent's next)
                parent._names.release(*self._named)
        shm = self._shm()
        strays = self._dispatcher.strays()  # (before forget_group: it reads the notices)
        if self._notices is not None:  # its last call, for this rank's departure notice
            d = self._dispatcher  # (and its uncompared calls, compared at the program's end)
            self._notices.forget_group(d.gid, self._group.seq, d.members, d.unchecked())
        stuck = self._dispatcher.close()
        problem = self._devices.close()
        if problem is not None:
            problems.append(problem)
        self._freed = True
        node, self._node_backend = self._node_backend, None  # (the world's, if node() never
        # took it: its four communicators were lost at every init / free() cycle)
        if stuck is not None:  # a call of an unusable group stays inside MPI: nothing of
            # it can be freed; the exit still finds it (it aborts the job, see runtime)
            Communicator._abandoned.append(self)
            self._note_kept(f"a call stays inside MPI ({stuck})")
            return problems
        if shm is not None:
            shm.free()
        if node is not None:
            node.free()
        if strays is None:
            self._backend.free()
        else:  # kept (its context id taken) for as long as the process lives: a
            # message still coming to it would match a later group's call instead
            self._backend.close()
            self._note_kept(strays)
        return problems

    # freed groups whose MPI communicators were kept (see free): how many, and the latest
    # reason, for the error of a group MPI could not create (_not_created)
    _kept_count = 0
    _kept_latest = ""
    # freed groups with a call stuck inside MPI on their worker (see free; runtime's exit)
    _abandoned: ClassVar[list[Communicator]] = []

    def _note_kept(self, why: str) -> None:
        self._kept = why
        Communicator._kept_count += 1
        Communicator._kept_latest = f"{self.name}: {why}"

    def _fence(self, marked: list[Dispatcher]) -> None:
        """Close this group and the groups made from it to new calls (see _look); the
        dispatchers it closed are added to ``marked`` as it goes (a refused free() opens
        them again, also where an interrupt came half way)."""
        d = self._dispatcher
        if d.fence():
            marked.append(d)
        for child in self._children:
            if not child._freed:
                child._fence(marked)

    def _running(self) -> list[str]:
        """What still runs on this group and the groups made from it (free() refuses)."""
        busy = []
        ex = self._dispatcher.executor
        # (not on an unusable group: its call stays inside MPI for good, a peer failed or
        # refused it; free() said "wait() for them first", which could never succeed)
        if ex is not None and ex.pending and self._dispatcher.broken is None:
            running = ex.oldest() or "a queued call"
            busy.append(f"{ex.pending} operation(s) on {self.name} still running ({running})")
        busy += [f"{c} still running" for c in self._dispatcher.calls_elsewhere()]
        p2p = self._dispatcher.running_p2p()
        if p2p:
            more = ", ..." if len(p2p) > 3 else ""
            busy.append(
                f"{len(p2p)} point-to-point operation(s) on {self.name} still running "
                f"({', '.join(p2p[:3])}{more})"
            )
        for child in self._children:
            if not child.freed:
                busy += child._running()
        return busy

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """free() the group; where the block raised, its error goes on and a free() refused
        (an async call still running) is added to it as a note, not raised in its place
        (it hid the program's own error, left only as ``__context__``)."""
        if exc is None:
            self.free()
            return
        try:
            self.free()
        except HpccommError as refused:  # (or freed, and the GPU's calls failed: see free)
            how = "was refused" if isinstance(refused, InvalidArgumentError) else "raised"
            note = f"and leaving the `with` block, free() {how}: {refused}"
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(note)
            else:  # pragma: no cover - Python 3.10
                sys.stderr.write(f"hpccomm: {note}\n")
