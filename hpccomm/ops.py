"""Every operation's facts and checks, in one place.

Each :class:`OpSpec` says what an operation is (collective or point-to-point, which argument
is its root, whether it reduces, writes in place, takes uneven sizes, moves Python objects,
runs on NCCL) and holds its validator. Validation turns the user's arguments into a
:class:`Call`: the dtype, shapes, element counts per rank and normalized root/tag/op that the
backends need. A Call holds no array, so the dispatch caches it by what validation depended
on (op, dtype, shape, strides, arguments) and reuses it for every later call with arrays of
the same description, fresh array objects included. Errors name the operation, the rank, the
argument and expected versus actual.

To change one operation: its spec and validator are here, its MPI body in
``backends/mpi.py``, its method (signature and docstring) in ``comm.py``.
"""

from __future__ import annotations

import itertools
import math
import numbers
import reprlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .buffers import Buffer, resolve
from .dtypes import (
    ALLOWED_CATEGORIES,
    SUPPORTED_DTYPES,
    DtypeInfo,
    ReduceOp,
    as_reduce_op,
    check_op,
    dtype_info,
)
from .errors import DtypeError, HpccommError, InvalidArgumentError, where

__all__ = ["OpSpec", "Call", "Group", "P2POp", "SPECS", "as_int", "check_stream", "check_timeout",
           "p2p_counterparts", "Counterpart", "matches"]  # fmt: skip

Counts = tuple[list[int], list[int]]  # elements per rank, displacement per rank
_NO_COUNTS: Counts = ([], [])


def _unprepared(call: Call, data: Any, out: Any, stream: Any) -> Any:
    raise HpccommError(f"{call}: the call was never prepared by a backend")  # pragma: no cover


class Group:
    """A communicator's identity in messages and records: its name, this rank, its size, and
    the sequence counters of its collectives and point-to-point calls."""

    __slots__ = ("name", "rank", "size", "seq", "p2p_seq", "world_ranks")

    def __init__(self, name: str, rank: int, size: int) -> None:
        self.name = name
        self.rank = rank
        self.size = size
        self.seq = 0
        self.p2p_seq = 0
        self.world_ranks: list[int] = []  # the members' world ranks (set with the group)

    def peer(self, rank: int | None) -> str:
        """A group rank as messages name it: ``"rank 1"`` on the world (or where group and
        world ranks agree), ``"rank 0 (world rank 2)"`` elsewhere."""
        if rank is None or rank < 0:  # (MPI_ANY_SOURCE is negative)
            return "any rank"
        ranks = self.world_ranks
        if rank >= len(ranks) or ranks[rank] == rank:
            return f"rank {rank}"
        return f"rank {rank} (world rank {ranks[rank]})"

    def here(self, op: str) -> str:
        """The prefix of messages about ``op`` on this group before it runs: ``"op (rank r
        of n)"`` on the world, ``"op on world/tp (rank r of n)"`` elsewhere (the rank is the
        group's)."""
        return where(op, self.rank, self.size, group=None if self.name == "world" else self.name)

    def __repr__(self) -> str:
        return f"<Group {self.name} rank {self.rank} of {self.size}>"


class OpSpec:
    """One operation's facts.

    Attributes:
        name: the Communicator method's name ("all_reduce", ...).
        kind: "collective" (every rank of the group calls it, in the same order; counted by
            the group's collective sequence) or "p2p".
        root: the name of the root/peer argument ("src", "dst") or None.
        reducing: takes a ReduceOp.
        in_place: writes its result into the input array (on the ranks that receive).
        uneven: takes uneven per-rank sizes ("sizes" or "splits"), else None.
        objects: moves pickled Python objects, not arrays.
        nccl: NCCL has a form of it (else device arrays take the MPI path).
        arrays: its data are arrays (resolved into Buffers before validation); else the
            validator gets the data as passed (objects, a list of P2POp).
        validate: ``validate(call, buf, out_buf)`` fills the Call or raises.
    """

    __slots__ = (
        "name",
        "kind",
        "root",
        "reducing",
        "in_place",
        "uneven",
        "objects",
        "nccl",
        "validate",
        "p2p",
        "arrays",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        validate: Callable[[Call, Buffer | None, Buffer | None], None],
        *,
        root: str | None = None,
        reducing: bool = False,
        in_place: bool = False,
        uneven: str | None = None,
        objects: bool = False,
        nccl: bool = True,
        arrays: bool = True,
    ) -> None:
        self.name = name
        self.kind = kind
        self.validate = validate
        self.root = root
        self.reducing = reducing
        self.in_place = in_place
        self.uneven = uneven
        self.objects = objects
        self.nccl = nccl
        self.arrays = arrays and not objects
        self.p2p = kind == "p2p"

    def __repr__(self) -> str:
        return f"<op {self.name}>"


class Call:
    """A validated operation, without its arrays: what every backend needs to run it.

    Filled by the op's validator (``info`` .. ``uneven``) and by the backend's ``prepare``
    (``backend``, ``body``, ``how``, ``mode``). The dispatch caches Calls and runs them as
    ``call.body(call, data, out)``.
    """

    __slots__ = (
        "spec",
        "group",
        "peer",
        "src",
        "tag",
        "redop",
        "sizes",
        "in_splits",
        "out_splits",
        "info",
        "shape",
        "count",
        "out_shape",
        "counts",
        "send_counts",
        "uneven",
        "device",
        "backend",
        "body",
        "blocking_body",
        "how",
        "mode",
        "checked",
        "deferred",
        "crc",
        "in_place",
        "memory",
    )

    def __init__(
        self,
        spec: OpSpec,
        group: Group,
        *,
        peer: Any = None,
        src: Any = None,
        tag: Any = None,
        redop: Any = None,
        sizes: Any = None,
        in_splits: Any = None,
        out_splits: Any = None,
    ) -> None:
        self.spec = spec
        self.group = group
        self.peer = peer
        self.src = src
        self.tag = tag
        self.redop = redop
        self.sizes = sizes
        self.in_splits = in_splits
        self.out_splits = out_splits
        self.info: DtypeInfo | None = None
        self.shape: tuple[int, ...] | None = None
        self.count = 0
        self.out_shape: tuple[int, ...] | None = None
        self.counts: Counts = _NO_COUNTS  # elements and displacements per rank
        self.send_counts: Counts = _NO_COUNTS
        self.uneven = False
        self.device: int | None = None
        self.backend: Any = None
        self.body: Callable[..., Any] = _unprepared
        # the body for a call that is waited for at once (not async_op), where a backend
        # has a safer one (the MPI backend's probed receive); None: ``body``
        self.blocking_body: Callable[..., Any] | None = None
        self.how: Any = None
        self.mode = "blocking"
        self.checked = False  # compared across ranks before it runs (debug "large")
        # not compared when it runs ("large", every buffer within the eager limit), but with
        # a later compared call of the group (see Dispatcher.verify)
        self.deferred = False
        self.crc: int | None = None  # its fingerprint's CRC without the sequence number
        # all_gather, gather's destination, scatter's source: the array is exactly this
        # rank's block of out (scatter: out is exactly its block of the array): MPI_IN_PLACE
        self.in_place = False
        # on the shared-memory path in the symmetric buffers' range: "symmetric buffer" or
        # "ordinary array" (the two take different paths there: compared across ranks)
        self.memory: str | None = None

    def piece(self, count: int) -> Call:
        """A copy of this call for a part of its buffer of ``count`` elements (the MPI
        backend splits counts beyond a C int)."""
        new = Call.__new__(Call)
        for name in Call.__slots__:
            setattr(new, name, getattr(self, name))
        new.count = count
        return new

    def __str__(self) -> str:
        """The ``"op (rank r of n)"`` prefix of validation messages; on a group other than
        the world ``"op on world/tp (rank r of n)"`` (the rank is the group's)."""
        return self.group.here(self.op_name)

    @property
    def op_name(self) -> str:
        """The operation as the user called it, for validation messages: the spec's name,
        but ``all_to_all_single`` for an all_to_all given split sizes (only that method
        takes them; it runs as ALL_TO_ALL, and its errors said ``all_to_all``). Without
        split sizes the two calls are one and the same (named ``all_to_all``)."""
        spec = self.spec
        if spec is ALL_TO_ALL and (self.in_splits is not None or self.out_splits is not None):
            return "all_to_all_single"
        return spec.name

    def where(self, seq: int | None) -> str:
        """The ``"op #seq on group (rank r of n)"`` prefix of messages about a running call
        (the operation as the user called it: all_to_all_single's split-size mismatch said
        "all_to_all", an outside hunt)."""
        g = self.group
        return where(self.op_name, g.rank, g.size, group=g.name, seq=seq)

    def dtype(self) -> np.dtype:
        """The payload's dtype (validation guarantees one for every array operation)."""
        return self.dtype_info().dtype

    def dtype_info(self) -> DtypeInfo:
        """The payload's DtypeInfo (validation guarantees one for every array operation)."""
        if self.info is None:  # pragma: no cover - objects and barriers have none
            raise HpccommError(f"{self}: no array dtype")
        return self.info

    @property
    def nbytes(self) -> int:
        """Bytes of this rank's input (of its output where it has no input)."""
        return 0 if self.info is None else self.count * self.info.dtype.itemsize

    def largest_bytes(self) -> int:
        """Bytes of the largest message this rank could send in this call, bounded by its
        largest buffer: input, output, all ranks' blocks of a gather or scatter (which MPI's
        tree algorithms forward through intermediate ranks). The same on every rank of a
        correct call, except for an uneven all_to_all (whose per-rank totals differ)."""
        if self.info is None:
            return 0
        elements = max(
            self.count,
            sum(self.counts[0]),
            sum(self.send_counts[0]),
            0 if self.shape is None else math.prod(self.shape),
            0 if self.out_shape is None else math.prod(self.out_shape),
        )
        if self.spec.name in _BLOCKS_PER_RANK and not self.uneven:
            elements = max(elements, self.count * self.group.size)
        shape = self.shape if self.shape is not None else self.out_shape
        if self.sizes is not None and shape:  # the rows of every rank (a gather's too)
            elements = max(elements, sum(self.sizes) * math.prod(shape[1:]))
        return elements * self.info.dtype.itemsize


_BLOCKS_PER_RANK = frozenset({"gather"})  # the others know every rank's blocks (counts)


# ---- shared checks ----------------------------------------------------------------------


def as_int(value: Any) -> int | None:
    """``value`` as an int when it is an integer (NumPy integers too, bool not), else None."""
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return None


def index_in(value: Any, size: int, where: str, label: str, context: str = "") -> int:
    """``value`` as an int in 0..size-1 (NumPy integers too, bools not), else an
    InvalidArgumentError: "{where}: {label} is True, expected an integer in 0..3{context}",
    or for an integer outside, "{where}: {label} 4 is not in 0..3{context}" (a bool is an int
    to Python: "rank True is not in 0..3" was false)."""
    index = as_int(value)
    if index is None:
        raise InvalidArgumentError(
            f"{where}: {label} is {value!r}, expected an integer in 0..{size - 1}{context}"
        )
    if not 0 <= index < size:
        raise InvalidArgumentError(f"{where}: {label} {value!r} is not in 0..{size - 1}{context}")
    return index


def check_timeout(value: Any, what: str, zero: bool = False) -> float | None:
    """A timeout: None, or finite seconds > 0 (>= 0 where ``zero``: a wait that only polls).

    Any real number is taken (NumPy's floats and ints included); NaN, infinities, negatives,
    bools (Python's or NumPy's) and strings are refused with an error naming ``what``. The one
    rule for every timeout hpccomm takes: init's, a communicator's, a call's, Work.wait's.
    """
    if value is None:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if not ok or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise InvalidArgumentError(
            f"{what}: timeout is {value!r}, expected finite seconds {'>=' if zero else '>'} 0 "
            f"or None"
        )
    if value > MAX_TIMEOUT:  # (Python's waits overflow past threading.TIMEOUT_MAX, 9.2e9 s
        # here: a bare OverflowError from every bounded call, the job aborted at exit)
        raise InvalidArgumentError(
            f"{what}: timeout is {value!r}, more than {MAX_TIMEOUT:,.0f} seconds (about 31 "
            f"years, the most hpccomm's waits take); pass None for no bound"
        )
    return float(value)


MAX_TIMEOUT = 1e9


def check_async_op(value: Any, what: str) -> bool:
    """``async_op=`` is a bool (Python's or NumPy's), else an InvalidArgumentError naming
    ``what``: any other value was taken for its truth, so ``async_op="no"`` returned a Work."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    shown = (
        _kind(value)
        if isinstance(value, np.ndarray)
        else (f"{type(value).__name__} {reprlib.repr(value)}")
    )
    raise InvalidArgumentError(f"{what}: async_op is {shown}, expected True or False")


def check_stream(stream: Any, what: str) -> None:
    """``stream=`` is a CuPy stream (``cupy.cuda.Stream`` or ``ExternalStream``: an int
    ``ptr`` and ``synchronize``/``record``), else an InvalidArgumentError naming ``what``
    (anything else failed inside the backend, after the peers had entered the call)."""
    ptr = getattr(stream, "ptr", None)
    if (
        not isinstance(ptr, int)
        or isinstance(ptr, bool)
        or not callable(getattr(stream, "synchronize", None))
        or not callable(getattr(stream, "record", None))
    ):
        raise InvalidArgumentError(
            f"{what}: stream is {_kind(stream)}, expected a CuPy stream "
            f"(cupy.cuda.Stream or cupy.cuda.ExternalStream) or None"
        )


def _rows(shape: tuple[int, ...]) -> tuple[int, tuple[int, ...], int]:
    """Rows along axis 0, the shape of one row, and elements per row (0-d counts as 1 row)."""
    if len(shape) == 1:
        return shape[0], (), 1
    if not shape:
        return 1, (), 1
    rest = shape[1:]
    return shape[0], rest, math.prod(rest)


def _check_array(call: Call, b: Buffer, arg: str = "array") -> DtypeInfo:
    info = SUPPORTED_DTYPES.get(b.dtype)
    if info is not None and b.contiguous:
        return info
    if not b.contiguous:
        raise InvalidArgumentError(
            f"{call}: {arg} is not C-contiguous (shape {tuple(b.array.shape)}, strides "
            f"{tuple(b.array.strides)}); pass a contiguous copy, e.g. np.ascontiguousarray({arg})"
        )
    return dtype_info(b.dtype, call, arg)


def _check_writable(call: Call, b: Buffer, arg: str = "array") -> None:
    """Refuse a read-only array the operation writes into (before MPI sees it)."""
    if not b.writable:
        raise read_only(call, arg)


def _check_disjoint(call: Call, b: Buffer, o: Buffer | None) -> None:
    """Refuse an out= that shares memory with the array where the operation sends from the
    array while it receives into out (MPI forbids the overlap: the results were silently
    wrong, a peer's data written over what was still to be sent)."""
    if o is not None and o.device == b.device and b.xp.may_share_memory(b.array, o.array):
        raise InvalidArgumentError(
            f"{call}: out shares memory with the array, expected separate arrays: "
            f"{call.op_name} sends from the array while it receives into out, and MPI "
            f"forbids their overlap; pass another out (or none: a new array is returned)"
        )


def _address(b: Buffer) -> int:
    return b.array.ctypes.data if b.device is None else b.array.data.ptr


def _check_block(call: Call, whole: Buffer, part: Buffer, part_arg: str, whole_arg: str) -> bool:
    """all_gather, gather's destination, scatter's source (``call.counts`` set): ``part``
    (this rank's contribution or result) may share memory with ``whole`` (every rank's
    blocks) only as exactly this rank's block, torch's in-place form (True: the call runs
    as MPI_IN_PLACE); any other overlap is refused: what a peer's block writes over would
    still be sent, or this rank's data lands in a block that is then overwritten."""
    if part.device != whole.device or not whole.xp.may_share_memory(whole.array, part.array):
        return False
    counts, displs = call.counts
    me = call.group.rank
    lo, n = displs[me], counts[me]
    if (
        part.contiguous
        and whole.contiguous
        and part.elements == n
        and _address(part) == _address(whole) + lo * whole.dtype.itemsize
    ):
        return True
    raise InvalidArgumentError(
        f"{call}: {part_arg} shares memory with {whole_arg} but is not exactly this rank's "
        f"block of it (elements {lo}..{lo + n - 1} of {whole_arg}), expected separate arrays "
        f"or exactly that block (the in-place form); pass a copy"
    )


def read_only(call: Call, arg: str = "array") -> InvalidArgumentError:
    """The error for a read-only array the operation writes into."""
    return InvalidArgumentError(
        f"{call}: {arg} is read-only (its writeable flag is False), expected a writable "
        f"array: {call.op_name} writes its result into it; pass a copy, e.g. np.array({arg})"
    )


def _check_rank(call: Call, value: Any, name: str, allow_any: bool = False) -> int | None:
    """A rank of the group (NumPy integers accepted), or None when ``allow_any``."""
    if value is None and allow_any:
        return None
    n = call.group.size
    rank = as_int(value)
    if rank is None or not 0 <= rank < n:
        raise InvalidArgumentError(f"{call}: {name} is {value!r}, expected a rank in 0..{n - 1}")
    return rank


def _check_root(call: Call) -> None:
    call.peer = _check_rank(call, call.peer, call.spec.root or "root")


C_INT_MAX = 2**31 - 1  # MPI's tags, split colours and keys are C ints (Open MPI's MPI_TAG_UB)


def _check_tag(call: Call, *, sends: bool = False, what: str = "tag") -> None:
    """``call.tag``: an integer in 0..C_INT_MAX; None (any tag) where nothing is sent with
    it (a send took None to MPI: "an integer is required", after a batch's receives were
    posted)."""
    tag = call.tag
    if type(tag) is int and 0 <= tag <= C_INT_MAX:
        return
    if tag is None:
        if not sends:
            return
        raise InvalidArgumentError(
            f"{call}: {what} is None, expected an integer in 0..{C_INT_MAX} (None, any tag, "
            f"is for receives: a send gives its message one tag)"
        )
    value = as_int(tag)
    if value is None or not 0 <= value <= C_INT_MAX:
        raise InvalidArgumentError(
            f"{call}: {what} is {tag!r}, expected an integer in 0..{C_INT_MAX}"
        )
    call.tag = value


def _dev(b: Buffer) -> str:
    return "the host" if b.device is None else f"GPU {b.device}"


def _check_out(call: Call, o: Buffer | None, shape: tuple[int, ...], template: Buffer) -> None:
    """Check a user's out= (shape, dtype, device, contiguity, writability); without one the
    dispatch allocates ``shape`` in the input's dtype and array module."""
    call.out_shape = shape
    if o is None:
        return
    if o.array.shape != shape:
        raise InvalidArgumentError(
            f"{call}: out has shape {tuple(o.array.shape)}, expected {shape}"
        )
    if o.dtype is not template.dtype and o.dtype != template.dtype:
        raise DtypeError(
            f"{call}: out has dtype {o.dtype}, expected {template.dtype} (the input's)"
        )
    if o.device != template.device:
        raise InvalidArgumentError(
            f"{call}: out is on {_dev(o)}, expected {_dev(template)} (the input's)"
        )
    if not o.contiguous:  # its dtype is the input's, already checked
        _check_array(call, o, "out")
    _check_writable(call, o, "out")


def _kind(value: Any) -> str:
    return f"{value.ndim}-d array" if isinstance(value, np.ndarray) else type(value).__name__


def _check_sizes(call: Call, sizes: Any, arg: str, total: int | None) -> list[int]:
    n = call.group.size
    if isinstance(sizes, np.ndarray) and sizes.ndim == 1:
        sizes = sizes.tolist()
    if not isinstance(sizes, Sequence):
        raise InvalidArgumentError(
            f"{call}: {arg} is a {_kind(sizes)}, expected a list of {n} ints (one per rank)"
        )
    if len(sizes) != n:
        raise InvalidArgumentError(
            f"{call}: {arg} has {_entries(len(sizes))}, expected {n} (one per rank)"
        )
    out = []
    for i, s in enumerate(sizes):
        value = as_int(s)
        if value is None or value < 0:
            raise InvalidArgumentError(f"{call}: {arg}[{i}] is {s!r}, expected an integer >= 0")
        out.append(value)
    if total is not None and sum(out) != total:
        raise InvalidArgumentError(
            f"{call}: {arg} sums to {sum(out)}, expected {total} (rows of the array)"
        )
    return out


def _counts(rows: list[int], row_elems: int) -> Counts:
    """Element counts and displacements per rank from rows per rank."""
    counts = [r * row_elems for r in rows]
    return counts, [0, *itertools.accumulate(counts[:-1])]


def _equal_blocks(call: Call, rows: int, arg: str = "array") -> int:
    n = call.group.size
    if rows % n:
        uneven = {
            "all_to_all": "all_to_all_single with input_split_sizes= and output_split_sizes=",
            "all_to_all_single": "input_split_sizes= and output_split_sizes=",
        }.get(call.op_name, "sizes=")
        raise InvalidArgumentError(
            f"{call}: {arg} has {rows} rows along axis 0, expected a multiple of {n} "
            f"(one equal block per rank); pass {uneven} for uneven blocks"
        )
    return rows // n


def _describe(call: Call, b: Buffer, info: DtypeInfo) -> tuple[int, ...]:
    """Record the payload's dtype, shape, element count and device; returns the shape."""
    call.info = info
    shape = call.shape = tuple(b.array.shape)
    call.count = b.elements
    call.device = b.device
    return shape


# ---- collectives ----------------------------------------------------------------------


def _v_all_reduce(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    """all_reduce's checks, and the reduction checks of reduce and reduce_scatter."""
    b = _need(call, b)
    info = SUPPORTED_DTYPES.get(b.dtype)
    if info is None or not b.contiguous:
        info = _check_array(call, b)
    spec = call.spec
    if spec.in_place and not b.writable and (spec.root is None or call.group.rank == call.peer):
        _check_writable(call, b)
    _describe(call, b, info)
    redop = call.redop
    if type(redop) is not ReduceOp:
        redop = call.redop = as_reduce_op(redop, call)
    if info.category not in ALLOWED_CATEGORIES[redop.name] or redop.factor is not None:
        check_op(redop, info, call)


def _need(call: Call, b: Buffer | None) -> Buffer:
    if b is None:
        raise InvalidArgumentError(f"{call}: array is None, expected an array")
    return b


def _v_reduce(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    _check_root(call)
    _v_all_reduce(call, b, o)


def _v_broadcast(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    _check_root(call)
    b = _need(call, b)
    _describe(call, b, _check_array(call, b))
    if call.group.rank != call.peer:
        _check_writable(call, b)


def _v_all_gather(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    """all_gather and gather: every rank's rows along axis 0, in rank order."""
    b = _need(call, b)
    shape = _describe(call, b, _check_array(call, b))
    n, me = call.group.size, call.group.rank
    rows, rest, row_elems = _rows(shape)
    if call.sizes is None:
        out_rows = [rows] * n
    else:
        out_rows = _check_sizes(call, call.sizes, "sizes", None)
        if out_rows[me] != rows:
            raise InvalidArgumentError(
                f"{call}: sizes[{me}] is {out_rows[me]}, expected {rows} (this rank's array "
                f"has {rows} rows)"
            )
        _set_sizes(call, out_rows)
    if call.spec.root is not None:
        _check_root(call)
        if me != call.peer:  # gather: only the destination receives
            return
    _check_out(call, o, (sum(out_rows), *rest), b)
    call.counts = _counts(out_rows, row_elems)
    if o is not None:
        call.in_place = _check_block(call, o, b, "the array", "out")


def _v_scatter(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    """The source passes the full array; every other rank passes ``out=``, its block. A
    non-source rank with an array and no ``out`` is refused: it cannot tell a full-size array
    (hpccomm's source-side argument) from its own block (torch's ``scatter(tensor, src=)``
    output), and guessing gives a wrong-size result."""
    _check_root(call)
    n, me = call.group.size, call.group.rank
    sizes = call.sizes
    if me == call.peer:
        if b is None:
            raise InvalidArgumentError(
                f"{call}: the source rank must pass the full array, got None"
            )
        shape = _describe(call, b, _check_array(call, b))
        rows, rest, row_elems = _rows(shape)
        blocks = (
            [_equal_blocks(call, rows)] * n
            if sizes is None
            else _check_sizes(call, sizes, "sizes", rows)
        )
        template = b
    else:
        if o is None:
            if b is None:
                raise InvalidArgumentError(
                    f"{call}: non-source ranks need out= (the block to receive), got neither an "
                    f"array nor out"
                )
            rows, rest, _ = _rows(tuple(b.array.shape))
            rows_said = f"{rows} row{'s' if rows != 1 else ''}"
            if b.array.ndim == 0:
                hint = "of at least one axis (a 0-d array is neither a full array nor a block)"
            elif sizes is not None:
                blocks = _check_sizes(call, sizes, "sizes", None)
                if sum(blocks) == rows:
                    hint = f"e.g. shape {(blocks[me], *rest)} if it is the full array"
                else:  # (then it is no full array: the source would refuse it)
                    hint = (
                        f"of shape {(blocks[me], *rest)} (its {rows_said} are not the "
                        f"{sum(blocks)} rows sizes= adds up to, so it is no full array)"
                    )
            elif rows % n == 0:
                hint = f"e.g. shape {(rows // n, *rest)} if it is the full array"
            else:  # (a floor-divided shape was suggested, which the source then refuses)
                hint = (
                    f"shaped as this rank's block: as a full array its {rows_said} do not make "
                    f"{n} equal blocks (uneven blocks: sizes= on every rank)"
                )
            raise InvalidArgumentError(
                f"{call}: non-source ranks need out= (the block to receive); got only an array "
                f"of shape {tuple(b.array.shape)}, which could be the full array or this rank's "
                f"block: pass out=<block>, {hint} (torch's scatter(tensor, src=) output tensor "
                f"is hpccomm's out=)"
            )
        info = _check_array(call, o, "out")
        call.info, call.device = info, o.device
        rows, rest, row_elems = _rows(tuple(o.array.shape))  # (0-d: one row, refused below)
        call.shape = None
        blocks = [rows] * n if sizes is None else _check_sizes(call, sizes, "sizes", None)
        template = o
    if sizes is not None:
        _set_sizes(call, blocks)
    out_shape = (blocks[me], *rest)
    _check_out(call, o, out_shape, template)
    if me != call.peer:
        call.count = math.prod(out_shape)
    call.counts = _counts(blocks, row_elems)
    if me == call.peer and o is not None and b is not None:
        call.in_place = _check_block(call, b, o, "out", "the array")


def _set_sizes(call: Call, blocks: list[int]) -> None:
    """``sizes=`` as given: a call with uneven blocks; all equal, the plain call, as where
    no sizes are given (one rank passing ``sizes=[4, 4]`` and another none is a correct
    call: the ranks then ran different MPI collectives, and hung, or differed in the debug
    check's comparison)."""
    if len(set(blocks)) > 1:
        call.sizes = blocks
        call.uneven = True
    else:
        call.sizes = None


def _v_reduce_scatter(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    _v_all_reduce(call, b, o)
    b = _need(call, b)
    rows, rest, row_elems = _rows(tuple(b.array.shape))
    n = call.group.size
    if call.sizes is None:
        blocks = [_equal_blocks(call, rows)] * n
    else:
        blocks = _check_sizes(call, call.sizes, "sizes", rows)
        _set_sizes(call, blocks)
    _check_out(call, o, (blocks[call.group.rank], *rest), b)
    call.counts = _counts(blocks, row_elems)


def _v_all_to_all(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    b = _need(call, b)
    rows, rest, row_elems = _rows(_describe(call, b, _check_array(call, b)))
    in_splits, out_splits = call.in_splits, call.out_splits
    n = call.group.size
    if in_splits is None:
        send = [_equal_blocks(call, rows)] * n
    else:
        send = call.in_splits = _check_sizes(call, in_splits, "input_split_sizes", rows)
    if out_splits is None:
        if in_splits is None:
            # no split sizes: every rank receives what it sends, so out= has the input's
            # shape (it was taken as equal blocks of out=: a wrong out= passed the check,
            # compared with itself, and MPI truncated, leaving the group unusable; an
            # outside hunt, 2026-12-05)
            recv = send
        elif o is not None:
            out_rows = o.array.shape[0] if o.array.ndim else 1
            recv = [_equal_blocks(call, out_rows, "out")] * n
        else:
            raise InvalidArgumentError(
                f"{call}: output_split_sizes is None with input_split_sizes given; pass "
                f"output_split_sizes (the rows each rank sends here; with only out=, they "
                f"are taken as equal blocks of it)"
            )
    else:
        recv = call.out_splits = _check_sizes(call, out_splits, "output_split_sizes", None)
    # (split sizes all equal stay uneven: a rank's splits may be equal in a correct call
    # whose other ranks' are not, and every rank of it must take the same MPI collective;
    # pass split sizes on every rank or on none)
    call.uneven = in_splits is not None or out_splits is not None
    _check_out(call, o, (sum(recv), *rest), b)
    _check_disjoint(call, b, o)
    call.send_counts = _counts(send, row_elems)
    call.counts = _counts(recv, row_elems)


def _v_barrier(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    pass


# ---- point-to-point ---------------------------------------------------------------------


def _v_send(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    call.peer = _check_rank(call, call.peer, "dst")
    _check_tag(call, sends=True)
    b = _need(call, b)
    _describe(call, b, _check_array(call, b))


def _v_recv(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    call.peer = _check_rank(call, call.peer, "src", allow_any=True)
    _check_tag(call)
    b = _need(call, b)
    _describe(call, b, _check_array(call, b))
    _check_writable(call, b)


def _v_sendrecv(call: Call, b: Buffer | None, o: Buffer | None) -> None:
    call.peer = _check_rank(call, call.peer, "dst")
    call.src = _check_rank(call, call.src, "src", allow_any=True)
    _check_tag(call, sends=True)
    b = _need(call, b)
    call.out_shape = _describe(call, b, _check_array(call, b))
    if o is not None:
        if o.dtype != b.dtype:
            raise DtypeError(f"{call}: out has dtype {o.dtype}, expected {b.dtype}")
        _check_array(call, o, "out")
        _check_writable(call, o, "out")
        _check_disjoint(call, b, o)
        call.out_shape = tuple(o.array.shape)


class P2POp:
    """One send or receive of a batch (``Communicator.batch_isend_irecv``).

    Args:
        op: ``"send"``/``"recv"`` (or ``P2POp.SEND``/``P2POp.RECV``, or a communicator's
            ``isend``/``irecv`` method, as torch writes it).
        array: the data (send) or the destination (recv).
        peer: the other rank.
        tag: message tag (default 0).
    """

    SEND = "send"
    RECV = "recv"
    __slots__ = ("op", "array", "peer", "tag", "buf", "group", "_made_with")

    def __init__(self, op: Any, array: Any, peer: Any, tag: Any = 0) -> None:
        func = getattr(op, "__name__", op)
        self.op = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv"}.get(func, op)
        if self.op not in ("send", "recv"):
            raise InvalidArgumentError(
                f"P2POp: op is {op!r}, expected 'send' or 'recv' (or isend/irecv)"
            )
        # a communicator's own method (comm.isend): the batch must run on that group (it
        # ran on the batch's communicator, silently: a peer using the other group waited)
        self.group = getattr(getattr(op, "__self__", None), "_group", None)
        self._made_with = func
        self.array = array
        self.peer = peer
        self.tag = tag
        self.buf: Buffer | None = None

    def buffer(self) -> Buffer:
        """The resolved array (set when the batch is checked)."""
        if self.buf is None:  # pragma: no cover - check_batch resolves every item first
            raise HpccommError(f"P2POp: {self.op} to/from {self.peer} was never checked")
        return self.buf


def check_batch(call: Call, items: Any) -> list[P2POp]:
    """Validate a batch_isend_irecv list (the whole batch, before anything is posted): resolve
    every item's array into ``item.buf`` and normalize peers and tags."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise InvalidArgumentError(f"{call}: expected a list of P2POp, got {type(items).__name__}")
    for i, p in enumerate(items):
        if not isinstance(p, P2POp):
            raise InvalidArgumentError(
                f"{call}: ops[{i}] is {_kind(p)}, expected a P2POp (hpccomm.P2POp('send', "
                f"array, peer) or 'recv')"
            )
    for i, p in enumerate(items):
        if p.group is not None and p.group is not call.group:
            raise InvalidArgumentError(
                f"{call}: ops[{i}] was made with {p.group.name}'s {p._made_with}, but the "
                f"batch runs on {call.group.name}; nothing was posted (call "
                f"batch_isend_irecv on {p.group.name}, or make the P2POp with "
                f"'{p.op}')"
            )
        p.peer = _check_rank(call, p.peer, f"ops[{i}].peer")
        call.tag = p.tag
        _check_tag(call, sends=p.op == "send", what=f"ops[{i}].tag")
        p.tag = call.tag
        p.buf = resolve(p.array, call, f"ops[{i}].array")
        info = _check_array(call, p.buf, f"ops[{i}].array")
        if p.op == "recv":
            _check_writable(call, p.buf, f"ops[{i}].array")
        if call.info is None:
            _describe(call, p.buf, info)
        elif p.buf.device != call.device:  # one batch takes one path (MPI host, or a GPU's)
            raise InvalidArgumentError(
                f"{call}: ops[{i}].array is {_where_memory(p.buf.device)} but ops[0].array is "
                f"{_where_memory(call.device)}; nothing was posted: a batch runs on one path, "
                f"so make one batch per device (or copy the arrays to one)"
            )
    call.tag = None
    _check_batch_disjoint(call, items)
    return list(items)


def _check_batch_disjoint(call: Call, items: Sequence[P2POp]) -> None:
    """Refuse a receive whose array shares memory with another item's (MPI forbids it, as
    for sendrecv: a batch that received into the array it sent from gave a mix of both
    ranks' data, silently). The arrays are contiguous (checked): each is one byte range,
    and the ranges are compared in address order (a batch of n items costs n log n)."""
    if len(items) < 2 or not any(p.op == "recv" for p in items):
        return
    spans = []
    for i, p in enumerate(items):
        b = p.buffer()
        if b.array.nbytes == 0:
            continue
        a = b.array  # NumPy's array interface; a device array's, CuPy's CUDA one
        face = getattr(
            a, "__array_interface__" if b.device is None else "__cuda_array_interface__", None
        )
        if face is None:  # (no address to compare: not checked)
            continue
        ptr = face["data"][0]
        spans.append((-1 if b.device is None else b.device, ptr, ptr + b.array.nbytes, i))
    spans.sort()
    place = None
    widest = widest_recv = (0, -1)  # the largest end so far on this device, and its item
    for device, start, end, j in spans:
        if device != place:
            place, widest, widest_recv = device, (0, -1), (0, -1)
        recv = items[j].op == "recv"
        hit = widest if recv else widest_recv  # a receive overlaps nothing; a send no receive
        if start < hit[0]:
            r, o = (j, hit[1]) if recv else (hit[1], j)
            way = "sends from" if items[o].op == "send" else "receives into"
            raise InvalidArgumentError(
                f"{call}: ops[{r}].array (a receive) shares memory with ops[{o}].array "
                f"(which {way} it), expected separate arrays: MPI forbids the overlap and "
                f"the results would be wrong; nothing was posted (receive into another "
                f"array and copy)"
            )
        widest = max(widest, (end, j))
        if recv:
            widest_recv = max(widest_recv, (end, j))


def _where_memory(device: int | None) -> str:
    return "host memory" if device is None else f"on GPU {device}"


def _v_batch(call: Call, items: Any, o: Any) -> None:
    check_batch(call, items)  # the items are data: a batch is never cached


# ---- Python objects ---------------------------------------------------------------------


def _v_rooted_object(call: Call, obj: Any, o: Any) -> None:
    _check_root(call)
    if call.spec is SCATTER_OBJECT and call.group.rank == call.peer:
        check_scatter_objects(call, obj)


def _v_object(call: Call, obj: Any, o: Any) -> None:
    pass


def _v_p2p_object(call: Call, obj: Any, o: Any) -> None:
    is_recv = call.spec is RECV_OBJECT
    call.peer = _check_rank(call, call.peer, "src" if is_recv else "dst", allow_any=is_recv)
    _check_tag(call, sends=not is_recv)


def _entries(k: int) -> str:
    """ "1 entry", "3 entries"."""
    return "1 entry" if k == 1 else f"{k:,} entries"


def check_scatter_objects(call: Call, objs: Any) -> None:
    """scatter_object's list on the source: one object per rank."""
    n = call.group.size
    if not isinstance(objs, Sequence):  # ("objects has int entries" before)
        raise InvalidArgumentError(
            f"{call}: objects is {type(objs).__name__} {objs!r:.40}, expected a list of {n} "
            f"objects (one per rank)"
        )
    if len(objs) != n:
        raise InvalidArgumentError(
            f"{call}: objects has {_entries(len(objs))}, expected {n} (one per rank)"
        )


C, P = "collective", "p2p"
ALL_REDUCE = OpSpec("all_reduce", C, _v_all_reduce, reducing=True, in_place=True)
REDUCE = OpSpec("reduce", C, _v_reduce, root="dst", reducing=True, in_place=True)
BROADCAST = OpSpec("broadcast", C, _v_broadcast, root="src", in_place=True)
ALL_GATHER = OpSpec("all_gather", C, _v_all_gather, uneven="sizes")
GATHER = OpSpec("gather", C, _v_all_gather, root="dst", uneven="sizes")
SCATTER = OpSpec("scatter", C, _v_scatter, root="src", uneven="sizes")
REDUCE_SCATTER = OpSpec("reduce_scatter", C, _v_reduce_scatter, reducing=True, uneven="sizes")
ALL_TO_ALL = OpSpec("all_to_all", C, _v_all_to_all, uneven="splits")
BARRIER = OpSpec("barrier", C, _v_barrier, nccl=False)
SEND = OpSpec("send", P, _v_send, root="dst")
RECV = OpSpec("recv", P, _v_recv, root="src", in_place=True)
SENDRECV = OpSpec("sendrecv", P, _v_sendrecv, root="dst")
# the operations whose validation depends on how out= overlaps the array: refused for the
# first two, allowed only as exactly this rank's block for the others (the dispatch's cache
# key holds the overlap: validation is skipped for a description seen before)
OVERLAP_CHECKED = frozenset({ALL_TO_ALL, SENDRECV, ALL_GATHER, GATHER, SCATTER})
BATCH_P2P = OpSpec("batch_isend_irecv", P, _v_batch, arrays=False)
BROADCAST_OBJECT = OpSpec(
    "broadcast_object", C, _v_rooted_object, root="src", objects=True, nccl=False
)
ALL_GATHER_OBJECT = OpSpec("all_gather_object", C, _v_object, objects=True, nccl=False)
GATHER_OBJECT = OpSpec("gather_object", C, _v_rooted_object, root="dst", objects=True, nccl=False)
SCATTER_OBJECT = OpSpec("scatter_object", C, _v_rooted_object, root="src", objects=True, nccl=False)
SEND_OBJECT = OpSpec("send_object", P, _v_p2p_object, root="dst", objects=True, nccl=False)
RECV_OBJECT = OpSpec("recv_object", P, _v_p2p_object, root="src", objects=True, nccl=False)

SPECS: tuple[OpSpec, ...] = (
    ALL_REDUCE,
    REDUCE,
    BROADCAST,
    ALL_GATHER,
    GATHER,
    SCATTER,
    REDUCE_SCATTER,
    ALL_TO_ALL,
    BARRIER,
    SEND,
    RECV,
    SENDRECV,
    BATCH_P2P,
    BROADCAST_OBJECT,
    ALL_GATHER_OBJECT,
    GATHER_OBJECT,
    SCATTER_OBJECT,
    SEND_OBJECT,
    RECV_OBJECT,
)


class Counterpart(NamedTuple):
    """A rank a point-to-point call sends to or receives from (see p2p_counterparts)."""

    rank: int  # the group rank
    what: str  # what the call does with it: "a send from rank 0 to rank 1 (tag 0)"
    way: str  # "send" or "recv": what the call does with that rank
    tag: Any  # the tag (None: any tag)
    objects: bool  # send_object / recv_object (they travel apart from arrays)

    @property
    def int_tag(self) -> int | None:
        """The tag where it is an integer, else None (any tag: a refused call's tag may be
        what was wrong with it): what a refusal's notice carries and is matched by."""
        return self.tag if type(self.tag) is int else None


def p2p_counterparts(
    group: Group, name: str, data: Any, peer: Any, src: Any, tag: Any
) -> list[Counterpart]:
    """The ranks a point-to-point call (op ``name`` with the dispatch's arguments) sends to
    or receives from, and what it does with each, leaving out this rank, wildcards and
    arguments that are no rank of the group (the call may have been refused for them).
    For a refusal's notice and a timeout's question."""

    def rank(value: Any) -> int | None:
        if type(value) is not int or not 0 <= value < group.size or value == group.rank:
            return None
        return value

    def tagged(value: Any) -> str:
        return "any tag" if value is None else f"tag {value!r}"

    out: list[Counterpart] = []
    me = group.peer(group.rank)
    objects = name.endswith("_object")
    if name in ("send", "send_object", "sendrecv") and (to := rank(peer)) is not None:
        what = f"a {name} from {me} to {group.peer(to)} ({tagged(tag)})"
        out.append(Counterpart(to, what, "send", tag, objects))
    if name in ("recv", "recv_object") and (frm := rank(peer)) is not None:
        what = f"a {name} by {me} from {group.peer(frm)} ({tagged(tag)})"
        out.append(Counterpart(frm, what, "recv", tag, objects))
    if name == "sendrecv" and (frm := rank(src)) is not None:
        what = f"a sendrecv by {me} from {group.peer(frm)} ({tagged(tag)})"
        out.append(Counterpart(frm, what, "recv", tag, False))
    if name == "batch_isend_irecv" and isinstance(data, (list, tuple)):
        for i, item in enumerate(data):
            if isinstance(item, P2POp) and (other := rank(item.peer)) is not None:
                way = "to" if item.op == "send" else "from"
                what = (f"ops[{i}] of a batch of {me}: {item.op} {way} {group.peer(other)} "
                        f"({tagged(item.tag)})")  # fmt: skip
                out.append(Counterpart(other, what, item.op, item.tag, False))
    return out


def matches(refused: Counterpart, mine: Counterpart) -> bool:
    """Whether ``refused`` (what a peer's refused call would have done with this rank, its
    ``rank`` being this rank) could have been the other side of ``mine`` (this rank's call
    with that peer): opposite ways, the same kind (arrays or objects), tags that agree
    (any tag agrees with every tag)."""
    return (
        refused.way != mine.way
        and refused.objects == mine.objects
        and (refused.tag is None or mine.tag is None or refused.tag == mine.tag)
    )
