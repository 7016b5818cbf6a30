"""Operation specs: the backend-neutral validation every operation runs before any backend.

Each spec's ``prepare(call)`` checks the resolved buffers against the operation's rules
(dtype, op, shape, contiguity, counts, root/peer range, split sizes), allocates the output when
none was given, and stores the rows per rank and elements per row in ``call.counts`` (see
:func:`displacements`). Errors name the operation, the rank, the argument and expected versus
actual.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .buffers import Buffer, empty_like_module, resolve
from .dtypes import (
    ALLOWED_CATEGORIES,
    SUPPORTED_DTYPES,
    ReduceOp,
    as_reduce_op,
    check_op,
    dtype_info,
)
from .errors import DtypeError, InvalidArgumentError
from .record import Call

__all__ = ["OpSpec", "P2POp", "displacements"]


class OpSpec:
    """One operation: its name, kind ("collective" or "p2p", which picks the sequence counter),
    validator, and whether backends have a non-blocking form (object transfers do not)."""

    __slots__ = ("name", "kind", "prepare", "nonblocking", "p2p")

    def __init__(
        self, name: str, kind: str, prepare: Callable[[Call], None], nonblocking: bool = True
    ) -> None:
        self.name = name
        self.kind = kind
        self.prepare = prepare
        self.nonblocking = nonblocking
        self.p2p = kind == "p2p"

    def __repr__(self) -> str:
        return f"<op {self.name}>"


def w(call: Call) -> str:
    return str(call)


def _rows(b: Buffer) -> tuple[int, tuple[int, ...], int]:
    """Rows along axis 0, the shape of one row, and elements per row (0-d counts as 1 row)."""
    shape = b.array.shape
    if len(shape) == 1:
        return shape[0], (), 1
    if not shape:
        return 1, (), 1
    rest = shape[1:]
    return shape[0], rest, math.prod(rest)


def _check_array(call: Call, b: Buffer, arg: str = "array"):
    info = SUPPORTED_DTYPES.get(b.dtype)
    if info is not None and b.contiguous:
        return info
    if not b.contiguous:
        raise InvalidArgumentError(
            f"{w(call)}: {arg} is not C-contiguous (shape {tuple(b.array.shape)}, strides "
            f"{tuple(b.array.strides)}); pass a contiguous copy, e.g. np.ascontiguousarray({arg})"
        )
    return dtype_info(b.dtype, call, arg)


def _as_int(value: Any) -> int | None:
    """``value`` as an int when it is an integer (NumPy integers too, bool not), else None."""
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return None


def _check_writable(call: Call, b: Buffer, arg: str = "array") -> None:
    """Refuse a read-only array the operation writes into (before MPI sees it)."""
    if not b.writable:
        raise InvalidArgumentError(
            f"{w(call)}: {arg} is read-only (its writeable flag is False), expected a writable "
            f"array: {call.op.name} writes its result into it; pass a copy, e.g. np.array({arg})"
        )


def _check_root(call: Call, name: str) -> None:
    n = call.comm.size
    root = call.peer
    if type(root) is not int:
        as_int = _as_int(root)
        if as_int is not None:
            root = call.peer = as_int
    if type(root) is not int or not 0 <= root < n:
        raise InvalidArgumentError(f"{w(call)}: {name} is {root!r}, expected a rank in 0..{n - 1}")


def _check_out(call: Call, shape: tuple[int, ...], template: Buffer) -> None:
    """Check a user's out= (shape, dtype, device, contiguity) or allocate one."""
    if call.out is None:
        call.out = resolve(empty_like_module(template, shape), call, "out")
        return
    out = call.out
    if out.array.shape != shape:
        raise InvalidArgumentError(
            f"{w(call)}: out has shape {tuple(out.array.shape)}, expected {shape}"
        )
    if out.dtype is not template.dtype and out.dtype != template.dtype:
        raise DtypeError(
            f"{w(call)}: out has dtype {out.dtype}, expected {template.dtype} (the input's)"
        )
    if out.device != template.device:
        raise InvalidArgumentError(
            f"{w(call)}: out is on {_dev(out)}, expected {_dev(template)} (the input's)"
        )
    if not out.contiguous:  # its dtype is the input's, already checked
        _check_array(call, out, "out")
    _check_writable(call, out, "out")


def _dev(b: Buffer) -> str:
    return "the host" if b.device is None else f"GPU {b.device}"


def _check_sizes(call: Call, sizes: Any, arg: str, total: int | None) -> list[int]:
    n = call.comm.size
    if isinstance(sizes, np.ndarray) and sizes.ndim == 1:
        sizes = sizes.tolist()
    if not isinstance(sizes, Sequence) or len(sizes) != n:
        got = len(sizes) if isinstance(sizes, Sequence) else type(sizes).__name__
        raise InvalidArgumentError(
            f"{w(call)}: {arg} has {got} entries, expected {n} (one per rank)"
        )
    out = []
    for i, s in enumerate(sizes):
        value = _as_int(s)
        if value is None or value < 0:
            raise InvalidArgumentError(f"{w(call)}: {arg}[{i}] is {s!r}, expected an integer >= 0")
        out.append(value)
    if total is not None and sum(out) != total:
        raise InvalidArgumentError(
            f"{w(call)}: {arg} sums to {sum(out)}, expected {total} (rows of the array)"
        )
    return out


def displacements(blocks: tuple[list[int], int]) -> tuple[list[int], list[int]]:
    """Element counts and displacements per rank from ``call.counts``'s (rows per rank,
    elements per row); computed only by the paths that need them (the v-variants)."""
    rows, row_elems = blocks
    counts = [r * row_elems for r in rows]
    return counts, [0, *itertools.accumulate(counts[:-1])]


def _equal_blocks(call: Call, rows: int, arg: str = "array") -> int:
    n = call.comm.size
    if rows % n:
        raise InvalidArgumentError(
            f"{w(call)}: {arg} has {rows} rows along axis 0, expected a multiple of {n} "
            f"(one equal block per rank); pass sizes= for uneven blocks"
        )
    return rows // n


# ---- collectives ----------------------------------------------------------------------


def _p_all_reduce(call: Call) -> None:
    """all_reduce's checks, and the reduction checks of reduce and reduce_scatter. The
    common case is tested inline (this is the hottest path); _check_array and check_op
    produce the errors."""
    b = call.buf
    info = SUPPORTED_DTYPES.get(b.dtype)
    if info is None or not b.contiguous:
        info = _check_array(call, b)
    if not b.writable and (call.op is not REDUCE or call.comm.rank == call.peer):
        _check_writable(call, b)
    call.info = info
    redop = call.redop
    if type(redop) is not ReduceOp:
        redop = call.redop = as_reduce_op(redop, call)
    if info.category not in ALLOWED_CATEGORIES[redop.name] or redop.factor is not None:
        check_op(redop, info, call)
    call.result = b.array


def _p_reduce(call: Call) -> None:
    _check_root(call, "dst")
    _p_all_reduce(call)


def _p_broadcast(call: Call) -> None:
    _check_root(call, "src")
    call.info = _check_array(call, call.buf)
    if call.comm.rank != call.peer:
        _check_writable(call, call.buf)
    call.result = call.buf.array


def _p_all_gather(call: Call) -> None:
    b = call.buf
    call.info = _check_array(call, b)
    n = call.comm.size
    rows, rest, row_elems = _rows(b)
    sizes = call.payload
    if sizes is None:
        out_rows = [rows] * n
        shape = (n * rows, *rest)
    else:
        out_rows = _check_sizes(call, sizes, "sizes", None)
        if out_rows[call.comm.rank] != rows:
            raise InvalidArgumentError(
                f"{w(call)}: sizes[{call.comm.rank}] is {out_rows[call.comm.rank]}, expected "
                f"{rows} (this rank's array has {rows} rows)"
            )
        shape = (sum(out_rows), *rest)
    if call.op is GATHER:
        _check_root(call, "dst")
        if call.comm.rank != call.peer:
            call.counts = None
            call.out = None
            call.result = None
            return
    _check_out(call, shape, b)
    call.counts = (out_rows, row_elems)
    call.result = call.out.array


def _p_scatter(call: Call) -> None:
    """The source passes the full array; every other rank passes ``out=``, its block. A
    non-source rank with an array and no ``out`` is refused: it cannot tell a full-size array
    (hpccomm's source-side argument) from its own block (torch's ``scatter(tensor, src=)``
    output), and guessing gives a wrong-size result."""
    _check_root(call, "src")
    comm = call.comm
    n = comm.size
    b = call.buf
    sizes = call.payload
    if comm.rank == call.peer:
        if b is None:
            raise InvalidArgumentError(
                f"{w(call)}: the source rank must pass the full array, got None"
            )
        call.info = _check_array(call, b)
        rows, rest, row_elems = _rows(b)
        blocks = (
            [_equal_blocks(call, rows)] * n
            if sizes is None
            else _check_sizes(call, sizes, "sizes", rows)
        )
        template = b
    else:
        if call.out is None:
            if b is None:
                raise InvalidArgumentError(
                    f"{w(call)}: non-source ranks need out= (the block to receive), got neither "
                    f"an array nor out"
                )
            rows, rest, _ = _rows(b)
            guess = (rows // n, *rest) if sizes is None else (f"sizes[{comm.rank}]", *rest)
            raise InvalidArgumentError(
                f"{w(call)}: non-source ranks need out= (the block to receive); got only an "
                f"array of shape {tuple(b.array.shape)}, which could be the full array or this "
                f"rank's block: pass out=<block>, e.g. shape {guess} if it is the full array "
                f"(torch's scatter(tensor, src=) output tensor is hpccomm's out=)"
            )
        call.info = _check_array(call, call.out, "out")
        rest, row_elems = tuple(call.out.array.shape[1:]), math.prod(call.out.array.shape[1:])
        blocks = (
            [call.out.array.shape[0]] * n
            if sizes is None
            else _check_sizes(call, sizes, "sizes", None)
        )
        template = call.out
    _check_out(call, (blocks[comm.rank], *rest), template)
    call.counts = (blocks, row_elems)
    call.result = call.out.array


def _p_reduce_scatter(call: Call) -> None:
    _p_all_reduce(call)
    b = call.buf
    rows, rest, row_elems = _rows(b)
    n = call.comm.size
    sizes = call.payload
    blocks = (
        [_equal_blocks(call, rows)] * n
        if sizes is None
        else _check_sizes(call, sizes, "sizes", rows)
    )
    _check_out(call, (blocks[call.comm.rank], *rest), b)
    call.counts = (blocks, row_elems)
    call.result = call.out.array


def _p_all_to_all(call: Call) -> None:
    b = call.buf
    call.info = _check_array(call, b)
    rows, rest, row_elems = _rows(b)
    in_splits, out_splits = call.payload or (None, None)
    n = call.comm.size
    if in_splits is None:
        send = [_equal_blocks(call, rows)] * n
    else:
        send = _check_sizes(call, in_splits, "input_split_sizes", rows)
    if out_splits is None:
        if call.out is not None:
            recv = [
                _equal_blocks(call, call.out.array.shape[0] if call.out.array.ndim else 1, "out")
            ] * n
        elif in_splits is None:
            recv = send
        else:
            raise InvalidArgumentError(
                f"{w(call)}: output_split_sizes is None with uneven input_split_sizes; pass "
                f"output_split_sizes (what each rank sends here) or out="
            )
    else:
        recv = _check_sizes(call, out_splits, "output_split_sizes", None)
    _check_out(call, (sum(recv), *rest), b)
    call.counts = ((send, row_elems), (recv, row_elems))
    call.result = call.out.array


def _p_barrier(call: Call) -> None:
    call.result = None


# ---- point-to-point ---------------------------------------------------------------------


def _check_peer(call: Call, name: str, allow_any: bool) -> None:
    if call.peer is None and allow_any:
        return
    _check_root(call, name)


def _check_tag(call: Call) -> None:
    tag = call.tag
    if tag is None or type(tag) is int and tag >= 0:
        return
    value = _as_int(tag)
    if value is None or value < 0:
        raise InvalidArgumentError(f"{w(call)}: tag is {tag!r}, expected an integer >= 0")
    call.tag = value


def _p_send(call: Call) -> None:
    _check_peer(call, "dst", False)
    _check_tag(call)
    call.info = _check_array(call, call.buf)
    call.result = None


def _p_recv(call: Call) -> None:
    _check_peer(call, "src", True)
    _check_tag(call)
    call.info = _check_array(call, call.buf)
    _check_writable(call, call.buf)


def _p_sendrecv(call: Call) -> None:
    dst, src = call.payload
    for name, peer in (("dst", dst), ("src", src)):
        call.peer = peer
        _check_peer(call, name, name == "src")
    call.peer = dst
    _check_tag(call)
    call.info = _check_array(call, call.buf)
    if call.out is None:
        call.out = resolve(empty_like_module(call.buf, tuple(call.buf.array.shape)), call, "out")
    if call.out.dtype != call.buf.dtype:
        raise DtypeError(f"{w(call)}: out has dtype {call.out.dtype}, expected {call.buf.dtype}")
    _check_array(call, call.out, "out")
    _check_writable(call, call.out, "out")
    call.result = call.out.array


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
    __slots__ = ("op", "array", "peer", "tag", "buf")

    def __init__(self, op: Any, array: Any, peer: int, tag: int = 0) -> None:
        func = getattr(op, "__name__", op)
        self.op = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv"}.get(func, op)
        if self.op not in ("send", "recv"):
            raise InvalidArgumentError(
                f"P2POp: op is {op!r}, expected 'send' or 'recv' (or isend/irecv)"
            )
        self.array = array
        self.peer = peer
        self.tag = tag
        self.buf: Buffer | None = None


def _p_batch(call: Call) -> None:
    items = call.payload
    if not isinstance(items, Sequence) or not all(isinstance(p, P2POp) for p in items):
        raise InvalidArgumentError(
            f"{w(call)}: expected a list of P2POp, got {type(items).__name__}"
        )
    for i, p in enumerate(items):
        call.peer, call.tag = p.peer, p.tag
        _check_peer(call, f"ops[{i}].peer", False)
        _check_tag(call)
        p.buf = resolve(p.array, call, f"ops[{i}].array")
        _check_array(call, p.buf, f"ops[{i}].array")
        if p.op == "recv":
            _check_writable(call, p.buf, f"ops[{i}].array")
    call.peer = None
    call.result = None


# ---- Python objects ---------------------------------------------------------------------


def _p_rooted_object(call: Call) -> None:
    _check_root(call, "src" if call.op in (BROADCAST_OBJECT, SCATTER_OBJECT) else "dst")
    if call.op is SCATTER_OBJECT and call.comm.rank == call.peer:
        objs = call.payload
        if not isinstance(objs, Sequence) or len(objs) != call.comm.size:
            got = len(objs) if isinstance(objs, Sequence) else type(objs).__name__
            raise InvalidArgumentError(
                f"{w(call)}: objects has {got} entries, expected {call.comm.size} (one per rank)"
            )


def _p_object(call: Call) -> None:
    pass


def _p_send_object(call: Call) -> None:
    _check_peer(call, "dst" if call.op is SEND_OBJECT else "src", call.op is RECV_OBJECT)
    _check_tag(call)


ALL_REDUCE = OpSpec("all_reduce", "collective", _p_all_reduce)
REDUCE = OpSpec("reduce", "collective", _p_reduce)
BROADCAST = OpSpec("broadcast", "collective", _p_broadcast)
ALL_GATHER = OpSpec("all_gather", "collective", _p_all_gather)
GATHER = OpSpec("gather", "collective", _p_all_gather)
SCATTER = OpSpec("scatter", "collective", _p_scatter)
REDUCE_SCATTER = OpSpec("reduce_scatter", "collective", _p_reduce_scatter)
ALL_TO_ALL = OpSpec("all_to_all", "collective", _p_all_to_all)
BARRIER = OpSpec("barrier", "collective", _p_barrier)
SEND = OpSpec("send", "p2p", _p_send)
RECV = OpSpec("recv", "p2p", _p_recv)
SENDRECV = OpSpec("sendrecv", "p2p", _p_sendrecv)
BATCH_P2P = OpSpec("batch_isend_irecv", "p2p", _p_batch)
BROADCAST_OBJECT = OpSpec("broadcast_object", "collective", _p_rooted_object, nonblocking=False)
ALL_GATHER_OBJECT = OpSpec("all_gather_object", "collective", _p_object, nonblocking=False)
GATHER_OBJECT = OpSpec("gather_object", "collective", _p_rooted_object, nonblocking=False)
SCATTER_OBJECT = OpSpec("scatter_object", "collective", _p_rooted_object, nonblocking=False)
SEND_OBJECT = OpSpec("send_object", "p2p", _p_send_object, nonblocking=False)
RECV_OBJECT = OpSpec("recv_object", "p2p", _p_send_object, nonblocking=False)
