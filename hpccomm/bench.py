"""``hpccomm bench``: what a link is worth, in nccl-tests' conventions, on any group of a
parallel layout, next to raw mpi4py and torch.distributed measured in the same run.

Every rank runs the same sweep of sizes; with ``group=`` (a layout spec such as ``tp=2``) the
world is laid out and every group of that dimension runs at once, each reported on its own.
Sizes, counts and bandwidths follow NVIDIA's nccl-tests (``doc/PERFORMANCE.md`` and the
``*GetBw`` function of each ``src/<op>.cu``):

- ``size`` S is the bytes of the operation as nccl-tests counts them: the buffer of
  all_reduce, broadcast, reduce and send/recv; the gathered output of all_gather and gather;
  the full input of reduce_scatter, all_to_all and scatter (each rank's block is S/n).
- ``count`` is the element count of the call, as nccl-tests prints it (``src/common.cu``
  prints ``nbytes / wordSize``, ``nbytes`` from each op's ``paramcount``): S/itemsize for
  all_reduce, broadcast, reduce and send/recv, the per-rank block (S/n/itemsize) for
  all_gather, gather, reduce_scatter, all_to_all and scatter.
- ``algbw = S / time``; ``busbw = algbw * factor(n)`` with the factors in :data:`FACTORS`.
- ``time`` is the mean time of one call in a block of ``iters`` calls, combined over the
  group's ranks as nccl-tests' ``-a`` says (default: their average), then the median over
  ``rounds`` blocks. send/recv is a ping-pong between rank pairs (0-1, 2-3, ...): its time
  is half a round trip (one way), as OSU's latency test reports it.

Peers (raw mpi4py on the same buffers; torch.distributed in the same processes on tensors
sharing those buffers, on its gloo backend or on hpccomm's own, :mod:`hpccomm.torch`) run in
the same rounds, alternating with hpccomm and in rotating order, so a noisy machine slows all
of them alike; ``ratio`` is the peer's time over hpccomm's (above 1: hpccomm is faster).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import math
import os
import socket
import stat
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TextIO

import numpy as np

from .dtypes import SUPPORTED_DTYPES, ReduceOp, as_reduce_op, check_op, dtype_info
from .errors import HpccommError, InvalidArgumentError
from .layout import DEFAULT_ORDER, TOKENS, Layout
from .ops import as_int

__all__ = [
    "FACTORS",
    "HPCCOMM",
    "PEERS",
    "SCHEMA",
    "BenchOptions",
    "Case",
    "busbw_factor",
    "bandwidths",
    "parse_size",
    "parse_group",
    "size_series",
    "run",
    "format_table",
    "write_json",
    "plot",
    "check_plot_available",
    "check_plot_format",
    "check_writable",
    "iterations",
    "PLOT_HINT",
]

SCHEMA = "hpccomm.bench/1"
PLOT_HINT = "matplotlib is not installed: pip install 'hpccomm[plot]' (or pip install matplotlib)"
PEERS = ("mpi4py", "gloo", "torch")


def _ring(n: int) -> float:
    return (n - 1) / n if n else 0.0


# nccl-tests' bus-bandwidth factors: doc/PERFORMANCE.md ("Summary": AllReduce 2(n-1)/n,
# ReduceScatter, AllGather and AlltoAll (n-1)/n, Broadcast and Reduce 1) and the *GetBw
# functions of src/gather.cu and src/scatter.cu ((n-1)/n) and src/sendrecv.cu (1).
FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * _ring(n),
    "reduce_scatter": _ring,
    "all_gather": _ring,
    "all_to_all": _ring,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "gather": _ring,
    "scatter": _ring,
    "send_recv": lambda n: 1.0,
}

# -o accepts hpccomm's names and nccl-tests' binary names.
_OP_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "bcast": "broadcast",
    "sendrecv": "send_recv",
    "pingpong": "send_recv",
    "ping_pong": "send_recv",
}
# -d accepts NumPy names and nccl-tests' names.
_DTYPE_ALIASES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "int": "int32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp64": "float64",
}
_DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
           "float32", "float64")  # fmt: skip
_BY_NAME = {info.name: dt for dt, info in SUPPORTED_DTYPES.items()}
# -r: nccl-tests' reduce ops less its mulsum (PREMUL_SUM); hpccomm's bitwise ops (BAND, BOR,
# BXOR) have no NCCL counterpart to compare with and are not benchmarked
_REDOPS = ("sum", "prod", "min", "max", "avg")
# nccl-tests' column names for the redops whose name is wider than the column ("product"
# shifted the rest of its row by a character)
_SHORT = {"product": "prod"}
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_AVERAGE = {0: "rank 0", 1: "average", 2: "minimum", 3: "maximum"}


def _over_ranks(average: str) -> str:
    """-a as the header says it ("rank 0 over ranks" read as nonsense)."""
    return (
        "rank 0's (the group's rank 0 with --group)"
        if average == "rank 0"
        else (f"{average} over ranks")
    )


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``op`` on ``n`` ranks (see :data:`FACTORS`)."""
    return FACTORS[op](n)


def bandwidths(op: str, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second) of ``nbytes`` (nccl-tests' size S) in
    ``seconds`` on ``n`` ranks."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * busbw_factor(op, n)


def parse_size(text: str | int) -> int:
    """``"64M"`` -> 67108864 (K, M, G are powers of 1024, as in nccl-tests)."""
    if isinstance(text, int):
        return text
    t = text.strip().upper().removesuffix("B")
    try:
        if t and t[-1] in _UNITS:
            value = int(float(t[:-1]) * _UNITS[t[-1]])
        else:
            value = int(t)
    except (ValueError, OverflowError):  # OverflowError: "infK"
        raise InvalidArgumentError(
            f"bench: size {text!r} is not a byte count (e.g. 8, 64K, 16M, 1G)"
        ) from None
    if value > MAX_BYTES:
        raise InvalidArgumentError(
            f"bench: size {text!r} is {value:,} bytes, expected at most {MAX_BYTES:,} (1 TiB)"
        )
    return value


_REDUCING = ("all_reduce", "reduce", "reduce_scatter")
# the ops whose S is n blocks of S/n (the count column shows one block, as nccl-tests does)
_BLOCKED = ("all_gather", "gather", "reduce_scatter", "all_to_all", "scatter")
MAX_BYTES = 1 << 40  # a message size no machine here holds: beyond it, a typo


def size_series(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """nccl-tests' -b/-e/-f: min, min*f, min*f^2, ... up to max."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise InvalidArgumentError(f"bench: sizes {min_bytes}..{max_bytes}, expected 1 <= -b <= -e")
    if factor < 2:
        raise InvalidArgumentError(f"bench: -f is {factor}, expected an integer >= 2")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def _group_spec(spec: str) -> tuple[dict[str, int], str | None, str]:
    """The syntax of a --group spec, which needs no world size: (sizes, order, dims after
    the colon); raises InvalidArgumentError naming --group."""
    head, _, dims = spec.partition(":")
    sizes: dict[str, int] = {}
    order = None
    for item in filter(None, (p.strip() for p in head.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if key == "order" and eq:
            if order is not None:
                raise InvalidArgumentError(
                    f"bench: --group {spec!r}: order is given twice ({order!r} and {value!r}), "
                    f"expected it once"
                )
            order = value
            continue
        if key not in TOKENS or not eq or not value.isdigit():
            raise InvalidArgumentError(
                f"bench: --group {spec!r}: {item!r} is not DIM=SIZE (DIM one of tp, pp, dp, "
                f"cp, ep; e.g. --group tp=2 or --group tp=2,pp=2:pp)"
            )
        if key in sizes:
            raise InvalidArgumentError(
                f"bench: --group {spec!r}: {key} is given twice ({key}={sizes[key]} and "
                f"{key}={int(value)}), expected each dimension once"
            )
        if int(value) < 1:
            raise InvalidArgumentError(
                f"bench: --group {spec!r}: {key} is {int(value)}, expected a size >= 1"
            )
        sizes[key] = int(value)
    if not sizes:
        raise InvalidArgumentError(
            f"bench: --group {spec!r} names no dimension (e.g. --group tp=2)"
        )
    return sizes, order, dims.strip() or next(iter(sizes))


def parse_group(spec: str, world: int | None) -> tuple[Layout, str]:
    """``"tp=2"`` -> (Layout(world, tp=2), "tp"); ``"tp=2,pp=2:pp"`` names the dimension to
    run on after a colon (default: the first one given); ``order=...`` passes an order.
    ``world`` None (before MPI): a world the sizes fit, to check the syntax, order and dims.

    Raises:
        InvalidArgumentError: naming --group: not DIM=SIZE, a dimension given twice, a size
            below 1, an unknown order or dimension, or sizes that do not fit ``world``.
    """
    sizes, order, dims = _group_spec(spec)
    if world is None:
        world = math.prod(sizes.values())
    try:
        layout = Layout(world, order=order or DEFAULT_ORDER, **sizes)
        return layout, "-".join(layout.normalize(dims))
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"bench: --group {spec!r}: {exc}") from None


# -- options and one case --------------------------------------------------------------


@dataclass
class BenchOptions:
    """What ``hpccomm bench`` runs (the CLI's flags, by the same names)."""

    ops: list[str] = field(default_factory=lambda: ["all_reduce"])
    min_bytes: int = 8
    max_bytes: int = 64 << 20
    factor: int = 2
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    iters: int = 0  # 0: auto (see iterations())
    warmup: int = 5
    check: bool = True
    average: int = 1  # nccl-tests -a: 0 rank 0, 1 average, 2 minimum, 3 maximum
    rounds: int = 5
    group: str | None = None
    device: bool = False
    symmetric: bool = False  # reductions' inputs from comm.zeros (symmetric buffers)
    peers: list[str] = field(default_factory=list)
    progress: TextIO | None = None

    def normalized(self) -> BenchOptions:
        """Checked, with aliases resolved; raises InvalidArgumentError naming the flag."""
        ops: list[str] = []
        for raw in self.ops:
            for name in filter(None, (o.strip().lower() for o in raw.split(","))):
                if name == "all":
                    ops.extend(FACTORS)
                    continue
                name = _OP_ALIASES.get(name, name)
                if name not in FACTORS:
                    raise InvalidArgumentError(
                        f"bench: -o {raw!r}: unknown operation {name!r}, expected one of "
                        f"{', '.join(FACTORS)} or all"
                    )
                ops.append(name)
        if not ops:  # ("-o ''" or "-o ,": a table of nothing, status 0)
            given = ", ".join(repr(raw) for raw in self.ops)
            raise InvalidArgumentError(
                f"bench: -o {given}: no operation given, expected one of {', '.join(FACTORS)} "
                f"or all"
            )
        dtype = _DTYPE_ALIASES.get(self.dtype.lower(), self.dtype.lower())
        if dtype not in _DTYPES:
            raise InvalidArgumentError(
                f"bench: -d {self.dtype!r}, expected one of {', '.join(_DTYPES)} (or half, "
                f"float, double)"
            )
        if self.redop.lower() not in _REDOPS:  # nccl-tests' ops; -c checks exactly these
            raise InvalidArgumentError(
                f"bench: -r {self.redop!r}, expected one of {', '.join(_REDOPS)}"
            )
        redop = as_reduce_op(self.redop.lower(), "bench: -r")
        if any(op in _REDUCING for op in ops):  # refused here, before MPI starts
            where = f"bench: -d {dtype} -r {self.redop.lower()}"  # (it said "-r: op AVG ...")
            check_op(redop, dtype_info(np.dtype(_BY_NAME[dtype]), "bench"), where)
        peers = []
        for raw in self.peers:
            for p in filter(None, (q.strip().lower() for q in raw.split(","))):
                if p not in PEERS:
                    raise InvalidArgumentError(
                        f"bench: --peer {p!r}, expected one of {', '.join(PEERS)}"
                    )
                if p not in peers:
                    peers.append(p)
        for name, value, low in (("-n", self.iters, 0), ("-w", self.warmup, 0),
                                 ("--rounds", self.rounds, 1), ("--root", self.root, 0)):  # fmt: skip
            if as_int(value) is None or value < low:  # (bools: True ran as root 1)
                raise InvalidArgumentError(
                    f"bench: {name} is {value!r}, expected an integer >= {low}"
                )
        if self.average not in _AVERAGE:
            raise InvalidArgumentError(f"bench: -a is {self.average!r}, expected 0, 1, 2 or 3")
        size_series(self.min_bytes, self.max_bytes, self.factor)
        if self.group is not None:  # its syntax; whether it fits the world is known at init
            parse_group(self.group, None)
        return BenchOptions(**{**self.__dict__, "ops": list(dict.fromkeys(ops)), "dtype": dtype,
                               "redop": self.redop.lower(), "peers": peers})  # fmt: skip


def iterations(nbytes: int, given: int) -> int:
    """-n, or (auto) enough calls to move about 32 MiB per timed block: 1000 calls at the
    smallest sizes, down to 10 at 4 MiB and above."""
    if given:
        return given
    return max(10, min(1000, (32 << 20) // max(nbytes, 1)))


# the seed of the -c check's data, with the rank ("hpcc")
_CHECK_SEED = 0x68706363


class Case:
    """One operation at one size on one group: its buffers (shared by hpccomm and the
    peers), element counts and the data of the ``-c`` check.

    ``block`` elements per rank; ``total`` the elements of S (``block * n`` for all_gather,
    gather, reduce_scatter, all_to_all, scatter); ``count`` nccl-tests' count column, the
    count of the call (``block`` for those, per rank); ``nbytes`` nccl-tests' size S."""

    def __init__(self, op: str, size: int, dtype: np.dtype, n: int, rank: int, root: int,
                 redop: ReduceOp, xp: Any = np) -> None:  # fmt: skip
        self.op, self.dtype, self.n, self.rank, self.root, self.redop = (
            op,
            dtype,
            n,
            rank,
            root,
            redop,
        )
        self.xp = xp
        self._values: dict[int, np.ndarray] = {}  # each rank's check data (values)
        isz = dtype.itemsize
        blocked = op in _BLOCKED
        self.block = max(1, size // (isz * n)) if blocked else max(1, size // isz)
        self.total = self.block * n if blocked else self.block  # elements of S
        # nccl-tests' count column: its paramcount, the count passed to the call (per rank
        # for the blocked ops: src/all_gather.cu's AllGatherGetCollByteCount and the others)
        self.count = self.block
        self.nbytes = self.total * isz
        self.partner: int | None = None
        if op == "send_recv":
            p = rank ^ 1
            self.partner = p if p < n else None
        zeros = xp.zeros
        c, b = self.total, self.block
        in_n = {"all_gather": b, "gather": b}.get(op, c)
        out_n = {"all_gather": c, "gather": c if rank == root else 0, "reduce_scatter": b,
                 "all_to_all": c, "scatter": b, "send_recv": c}.get(op, 0)  # fmt: skip
        has_input = op != "scatter" or rank == root
        self.x = zeros(in_n, dtype) if has_input else None
        self.out = zeros(out_n, dtype) if out_n else None

    @property
    def participates(self) -> bool:
        """False for the rank without a ping-pong partner (odd group size)."""
        return self.op != "send_recv" or self.partner is not None

    # -- the -c check: small integers, exact in every dtype of the table --------------------

    def values(self, r: int, count: int, offset: int = 0) -> np.ndarray:
        """Rank ``r``'s check data: pseudo-random integers 1..3 (1..2 for PRODUCT), from a
        generator seeded with the rank, so no two ranks' data and no two stretches of one
        array are alike (a periodic pattern, ``(i + 7r) % 3 + 1``, made every 3-rank sum the
        constant 6 and ranks r and r+3 alike: a result reversed, a wrong root or two blocks
        swapped passed the check with 0 wrong). Exact in every dtype of the table (bfloat16
        holds integers to 256: sums of up to 85 ranks)."""
        need = offset + count
        have = self._values.get(r)
        if have is None or have.size < need:
            high = 2 if self.redop.name == "PRODUCT" else 3
            rng = np.random.default_rng([_CHECK_SEED, r])
            have = rng.integers(1, high + 1, size=max(need, self.total), dtype=np.int8)
            have = self._values[r] = have.astype(self.dtype)
        return have[offset:need]

    def fill(self) -> None:
        """Check data into the input, zeros into the output."""
        if self.x is not None:
            self.x[...] = self.xp.asarray(self.values(self.rank, self.x.size))
        if self.out is not None:
            self.out[...] = 0

    def expected(self) -> tuple[Any, np.ndarray] | None:
        """(the array to compare, its expected values) after one call, or None (nothing
        lands on this rank)."""
        op, n, me, b = self.op, self.n, self.rank, self.block
        if op in _REDUCING:
            if op == "reduce" and me != self.root:
                return None
            acc = _reduce([self.values(r, self.total) for r in range(n)], self.redop, self.dtype)
            if op == "reduce_scatter":
                return self.out, acc[me * b : (me + 1) * b]
            return self.x, acc
        if op == "broadcast":
            return self.x, self.values(self.root, self.total)
        if op in ("all_gather", "gather"):
            if op == "gather" and me != self.root:
                return None
            return self.out, np.concatenate([self.values(r, b) for r in range(n)])
        if op == "all_to_all":
            return self.out, np.concatenate(
                [self.values(r, self.total)[me * b : (me + 1) * b] for r in range(n)]
            )
        if op == "scatter":
            return self.out, self.values(self.root, self.total)[me * b : (me + 1) * b]
        if self.partner is None:  # send_recv
            return None
        return self.out, self.values(self.partner, self.total)

    def wrong(self) -> int:
        """Elements of this rank's result that differ from the expected values."""
        exp = self.expected()
        if exp is None:
            return 0
        got = exp[0]
        got = got.get() if hasattr(got, "get") else np.asarray(got)  # CuPy -> host
        want = exp[1]
        g, w = got.astype(np.float64), want.astype(np.float64)
        if self.dtype.kind not in "iu":  # float16, bfloat16, float32, float64
            rtol = 1e-2 if self.dtype.itemsize == 2 else 1e-5
            return int(np.count_nonzero(~np.isclose(g, w, rtol=rtol, atol=rtol)))
        return int(np.count_nonzero(g != w))


def _reduce(arrays: list[np.ndarray], redop: ReduceOp, dtype: np.dtype) -> np.ndarray:
    wide = np.stack([a.astype(np.int64 if dtype.kind in "iu" else np.float64) for a in arrays])
    name = redop.name
    if name == "SUM":
        r = wide.sum(0)
    elif name == "PRODUCT":
        r = wide.prod(0)
    elif name == "MIN":
        r = wide.min(0)
    elif name == "MAX":
        r = wide.max(0)
    elif name == "AVG":
        r = wide.mean(0)
    else:  # pragma: no cover - -r is checked against these
        raise InvalidArgumentError(f"bench: -c cannot check -r {name.lower()}")
    return r.astype(dtype)


# -- the calls: hpccomm, raw mpi4py, gloo (tables: op -> builder of a zero-argument call) ----


def _h_pingpong(c: Any, k: Case) -> Callable[[], Any]:
    p, x, y = k.partner, k.x, k.out
    if p is None:
        return lambda: None
    if k.rank % 2 == 0:

        def first() -> None:
            c.send(x, p)
            c.recv(y, p)

        return first

    def second() -> None:
        c.recv(y, p)
        c.send(x, p)

    return second


HPCCOMM: dict[str, Callable[[Any, Case], Callable[[], Any]]] = {
    "all_reduce": lambda c, k: lambda: c.all_reduce(k.x, op=k.redop),
    "reduce": lambda c, k: lambda: c.reduce(k.x, k.root, op=k.redop),
    "broadcast": lambda c, k: lambda: c.broadcast(k.x, k.root),
    "all_gather": lambda c, k: lambda: c.all_gather(k.x, out=k.out),
    "gather": lambda c, k: lambda: c.gather(k.x, dst=k.root, out=k.out),
    "reduce_scatter": lambda c, k: lambda: c.reduce_scatter(k.x, op=k.redop, out=k.out),
    "all_to_all": lambda c, k: lambda: c.all_to_all(k.x, out=k.out),
    "scatter": lambda c, k: lambda: c.scatter(k.x, src=k.root, out=k.out),
    "send_recv": _h_pingpong,
}


def _mpi4py_calls(m: Any, k: Case) -> Callable[[], Any]:
    """Raw mpi4py (uppercase methods) on ``m``, the group's duplicated MPI communicator."""
    from mpi4py import MPI

    types = {"int8": MPI.INT8_T, "uint8": MPI.UINT8_T, "int32": MPI.INT32_T,
             "uint32": MPI.UINT32_T, "int64": MPI.INT64_T, "uint64": MPI.UINT64_T,
             "float32": MPI.FLOAT, "float64": MPI.DOUBLE, "float16": MPI.UINT16_T,
             "bfloat16": MPI.UINT16_T}  # fmt: skip
    ops = {"SUM": MPI.SUM, "PRODUCT": MPI.PROD, "MIN": MPI.MIN, "MAX": MPI.MAX}
    name = k.dtype.name
    t = types[name]
    op, x, out, root = k.op, k.x, k.out, k.root
    if op in _REDUCING:
        if name in ("float16", "bfloat16") or k.redop.name not in ops:
            what = name if k.redop.name in ops else f"ReduceOp.{k.redop.name}"
            raise HpccommError(f"raw MPI has no {what} reduction")
        o = ops[k.redop.name]
        if op == "all_reduce":
            return lambda: m.Allreduce(MPI.IN_PLACE, [x, t], o)
        if op == "reduce_scatter":
            return lambda: m.Reduce_scatter_block([x, t], [out, t], o)
        if k.rank == root:
            return lambda: m.Reduce(MPI.IN_PLACE, [x, t], o, root)
        return lambda: m.Reduce([x, t], None, o, root)
    if op == "broadcast":
        return lambda: m.Bcast([x, t], root)
    if op == "all_gather":
        return lambda: m.Allgather([x, t], [out, t])
    if op == "gather":
        return lambda: m.Gather([x, t], [out, t] if out is not None else None, root)
    if op == "all_to_all":
        return lambda: m.Alltoall([x, t], [out, t])
    if op == "scatter":
        return lambda: m.Scatter([x, t] if x is not None else None, [out, t], root)
    p = k.partner  # send_recv
    if p is None:
        return lambda: None
    if k.rank % 2 == 0:
        return lambda: (m.Send([x, t], p, 0), m.Recv([out, t], p, 0))
    return lambda: (m.Recv([out, t], p, 0), m.Send([x, t], p, 0))


class _Torch:
    """torch.distributed in these processes: a default gloo group (a TCP store on world rank
    0, its port sent over MPI), and per benchmarked group a gloo group (``--peer gloo``)
    and a group of hpccomm's torch backend (``--peer torch``, :mod:`hpccomm.torch`)."""

    def __init__(self, mpi: Any, rank: int, size: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        timeout = datetime.timedelta(seconds=120)
        hosts = mpi.allgather(socket.gethostname())
        host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
        store, why = None, None
        if rank == 0:
            try:
                store = dist.TCPStore(host, 0, size, True, timeout=timeout, wait_for_workers=False)
            except Exception as exc:  # every rank must hear of it
                why = f"rank 0 could not start torch's TCP store: {exc}"
        host, port, why = mpi.bcast((host, store.port if store else None, why), root=0)
        if why is not None:
            raise HpccommError(f"bench --peer gloo: {why}")
        if store is None:
            store = dist.TCPStore(host, port, size, False, timeout=timeout)
        self.owned = not dist.is_initialized()
        if self.owned:
            dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                                    timeout=timeout)  # fmt: skip

    def group(self, all_groups: list[list[int]], mine: list[int], backend: str) -> Any:
        """This rank's group of ``backend`` ("gloo" or "hpccomm"); every rank creates every
        group, in the same order (torch calls the backend's creator on the members)."""
        if backend == "hpccomm":
            from . import torch as hpccomm_torch  # imports torch: optional

            hpccomm_torch.register()
        made = None
        for members in all_groups:
            g = self.dist.new_group(sorted(members), backend=backend)
            if members == mine:
                made = g
        return made

    def tensor(self, a: Any) -> Any:
        if a is None:
            return None
        if hasattr(a, "__cuda_array_interface__"):
            return self.torch.from_dlpack(a)
        if a.dtype.name == "bfloat16":
            return self.torch.from_numpy(a.view(np.uint16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(a)

    def calls(self, g: Any, k: Case, peer: str) -> Callable[[], Any]:
        dist, T = self.dist, self.tensor
        x, out, root, n, b = T(k.x), T(k.out), k.root, k.n, k.block
        op = k.op
        if k.redop.name not in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):  # pragma: no cover
            raise HpccommError(f"gloo has no {k.redop.name}")
        ro = getattr(dist.ReduceOp, k.redop.name)
        if op == "all_reduce":
            return lambda: dist.all_reduce(x, op=ro, group=g)
        if op == "reduce":
            return lambda: dist.reduce(x, group_dst=root, op=ro, group=g)
        if op == "broadcast":
            return lambda: dist.broadcast(x, group_src=root, group=g)
        if op == "all_gather":  # torch 2.13 renamed all_gather_into_tensor
            ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: ag(out, x, group=g)
        if op == "reduce_scatter":
            rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return lambda: rs(out, x, op=ro, group=g)
        if op == "all_to_all":
            return lambda: dist.all_to_all_single(out, x, group=g)
        if op == "gather":
            blocks = None if out is None else [out[i * b : (i + 1) * b] for i in range(n)]
            return lambda: dist.gather(x, blocks, group_dst=root, group=g)
        if op == "scatter":
            blocks = None if x is None else [x[i * b : (i + 1) * b] for i in range(n)]
            return lambda: dist.scatter(out, blocks, group_src=root, group=g)
        p = k.partner  # send/recv as torch's isend/irecv + wait (what dist.send/recv do)
        if p is None:
            return lambda: None

        def send() -> None:
            dist.isend(x, group_dst=p, group=g).wait()

        def recv() -> None:
            dist.irecv(out, group_src=p, group=g).wait()

        def first() -> None:
            send()
            recv()

        def second() -> None:
            recv()
            send()

        return first if k.rank % 2 == 0 else second

    def close(self) -> None:
        if self.owned and self.dist.is_initialized():
            self.dist.destroy_process_group()


# -- the run ---------------------------------------------------------------------------------


class _Group(NamedTuple):
    name: str  # "world", "tp [0, 1]"
    gi: int  # its index among the groups of the dimension
    members: list[int]  # world ranks
    comm: Any  # this rank's hpccomm Communicator of it
    mpi: Any  # a duplicate of its MPI communicator (raw mpi4py peer)
    torch: dict[str, Any]  # its torch.distributed groups: "gloo", "torch" (hpccomm's backend)


def _say(opts: BenchOptions, text: str, *, end: str = "\n") -> None:
    """A progress line on rank 0: rewritten in place on a terminal, else one per line."""
    out = opts.progress
    if out is None:
        return
    tty = getattr(out, "isatty", lambda: False)()
    if not tty:
        text, end = text.lstrip("\r").rstrip(), "\n"
    out.write(text + end)
    out.flush()


def _human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _device_module(comm: Any) -> tuple[Any, str | None]:
    """(cupy, None) when device arrays can be benchmarked on this rank, else (None, why)."""
    try:
        import cupy
    except ImportError:
        return None, (
            "CuPy is not installed (pip install 'hpccomm[gpu-cuda13]', or 'hpccomm[gpu-cuda12]' "
            "for a CUDA 12 driver)"
        )
    if comm.device.gpu is None:
        return None, "no GPU is bound on this rank (hpccomm.init(gpu=...) found none)"
    return cupy, None


def run(comm: Any, options: BenchOptions) -> dict[str, Any] | None:
    """Run the sweep on every rank of ``comm`` (collective); returns the result document
    (the JSON schema, see the README) on rank 0 and None elsewhere.

    Raises:
        InvalidArgumentError: a bad option (the same on every rank).
        HpccommError: an operation hpccomm refuses (say, -r avg with an integer -d).
    """
    opts = options.normalized()
    world = comm
    me, n = world.rank, world.size
    raw_world = world.mpi.Dup()
    try:
        return _run(world, raw_world, opts, me, n)
    finally:
        raw_world.Free()


def _run(world: Any, raw_world: Any, opts: BenchOptions, me: int, n: int) -> dict[str, Any] | None:
    notes: list[str] = []
    xp: Any = np
    sync: Callable[[], Any] = _nothing
    if opts.device:
        cupy, why = _device_module(world)
        whys = raw_world.allgather(why)
        bad = [f"rank {r}: {w}" for r, w in enumerate(whys) if w]
        if bad:
            _say(opts, f"hpccomm bench: --device skipped: {bad[0]}" +
                 (f" (and {len(bad) - 1} more ranks)" if len(bad) > 1 else ""))  # fmt: skip
            return {"schema": SCHEMA, "skipped": f"--device: {bad[0]}"} if me == 0 else None
        xp = cupy
        sync = cupy.cuda.get_current_stream().synchronize
        if "mpi4py" in opts.peers and not world.device.path.cuda_aware:
            opts.peers.remove("mpi4py")
            notes.append("mpi4py peer left out for --device: this MPI is not CUDA-aware "
                         "(raw mpi4py would be handed device pointers)")  # fmt: skip
    if opts.warmup == 0 and opts.peers:
        notes.append(_PEER_WARMUP)
    # the groups: the world, or every group of one layout dimension (all at once)
    if opts.group:
        layout, dim = parse_group(opts.group, n)
        everyone = layout.groups(dim)
        mine = layout.group_of(me, dim)
        index = everyone.index(mine)
        hp = world.layout(layout).group(dim)
        label = f"{dim} {mine}"
    else:
        everyone, mine, index, hp, label, dim = (
            [list(range(n))],
            list(range(n)),
            0,
            world,
            "world",
            "",
        )
    gloo = None
    pgs: dict[str, Any] = {}
    if "gloo" in opts.peers or "torch" in opts.peers:
        try:
            gloo = _Torch(raw_world, me, n)
        except ImportError:
            raise HpccommError(
                "bench: --peer gloo/torch needs torch (pip install 'hpccomm[torch]')"
            ) from None
        for peer, backend in (("gloo", "gloo"), ("torch", "hpccomm")):
            if peer in opts.peers:
                pgs[peer] = gloo.group(everyone, mine, backend)
    group = _Group(label, index, mine, hp, hp.mpi.Dup() if "mpi4py" in opts.peers else None, pgs)
    redop = as_reduce_op(opts.redop, "bench: -r")
    dtype = _BY_NAME[opts.dtype]
    sizes = size_series(opts.min_bytes, opts.max_bytes, opts.factor)
    sides = ["hpccomm", *opts.peers]
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    total = len(sizes) * len(opts.ops)
    done = 0
    for op in opts.ops:  # every op's root before any runs (it was said after the earlier
        # ops' whole sweep, whose results were then lost)
        if op in _ROOTED and opts.root >= len(mine):
            raise InvalidArgumentError(
                f"bench: --root {opts.root} for {op}, expected a rank of the group "
                f"(0..{len(mine) - 1})"
            )
    try:
        for op in opts.ops:
            if op == "send_recv" and len(mine) < 2:
                notes.append("send_recv skipped: it needs groups of 2 ranks or more")
                done += len(sizes)
                continue
            root = opts.root if op in _ROOTED else 0  # --root means nothing to the others
            if root >= len(mine):
                raise InvalidArgumentError(
                    f"bench: --root {root} for {op}, expected a rank of the group "
                    f"(0..{len(mine) - 1})"
                )
            last = -1
            for size in sizes:
                done += 1
                try:
                    case = Case(op, size, dtype, len(mine), hp.rank, root, redop, xp)
                    short = ""
                except MemoryError as exc:  # (a traceback on every rank; a rank alone
                    # would have left the others waiting in the first call)
                    short = f"MemoryError: {exc}"
                lacking = hp.mpi.allgather(short)
                if any(lacking):
                    ranks = [r for r, why in enumerate(lacking) if why]
                    raise InvalidArgumentError(
                        f"bench: {op} at {_human(size)}: the buffers do not fit in memory on "
                        f"rank(s) {ranks} of the group ({next(w for w in lacking if w)}); "
                        f"lower -e"
                    )
                if case.nbytes == last:  # rounded to the same element count as the last size
                    continue
                last = case.nbytes
                if opts.symmetric and op in _SYMMETRIC and case.x is not None and xp is np:
                    case.x = hp.zeros(case.x.shape, dtype)  # collective: every rank is here
                _say(opts, f"\rbench: {op} {_human(case.nbytes)} ({done}/{total}), "
                     f"{time.perf_counter() - started:.0f} s", end="")  # fmt: skip
                row = _measure(case, group, gloo, sides, opts, raw_world, sync, notes)
                if me == 0 and row is not None:
                    results.extend(row)
        _say(opts, f"\rbench: done in {time.perf_counter() - started:.1f} s" + " " * 30)
    finally:
        if group.mpi is not None:
            group.mpi.Free()
        if gloo is not None:
            gloo.close()
    hosts = raw_world.gather(socket.gethostname(), root=0)
    if me != 0:
        return None
    return _document(world, opts, results, everyone, dim, notes, sorted(set(hosts)))


# -w 0 with peers: what the header and the notes say
_PEER_WARMUP = (
    "-w 0: hpccomm ran no warm-up call; each peer ran 1 call before timing (it tells every "
    "rank whether the peer can run the case, so a peer failing on one rank drops out "
    "instead of leaving the others waiting in a timed block)"
)

# the ops that have a root (--root); the others ignore it
_ROOTED = ("broadcast", "reduce", "gather", "scatter")

# the ops whose input --symmetric takes from comm.zeros (the peers use the same arrays)
_SYMMETRIC = ("all_reduce", "reduce", "reduce_scatter")


def _nothing() -> None:
    return None


def _agree(raw_world: Any, ok: bool) -> bool:
    """True when ``ok`` holds on every rank."""
    return all(raw_world.allgather(ok))


def _measure(case: Case, group: _Group, gloo: Any, sides: list[str], opts: BenchOptions,
             raw_world: Any, sync: Callable[[], Any], notes: list[str]) -> list[dict[str, Any]] | None:  # fmt: skip
    """One size of one op on this rank's group; rank 0 gets one row per group."""
    calls: dict[str, Callable[[], Any]] = {"hpccomm": HPCCOMM[case.op](group.comm, case)}
    errors: dict[str, str] = {}
    for side in sides[1:]:
        try:
            calls[side] = (_mpi4py_calls(group.mpi, case) if side == "mpi4py"
                           else gloo.calls(group.torch[side], case, side))  # fmt: skip
        except Exception as exc:
            errors[side] = f"{type(exc).__name__}: {exc}"
        if not _agree(raw_world, side in calls):  # every rank runs a peer, or none does
            calls.pop(side, None)
            errors.setdefault(side, "could not be set up on another rank")
    for side in sides:  # warm-up; a peer that fails on any rank drops out of this case
        ok, why = True, ""
        # -w 0: no call for hpccomm; a peer still makes one, which tells every rank whether
        # it can run this case (one failing in a timed block would leave the others waiting)
        warm = opts.warmup if side == "hpccomm" else max(opts.warmup, 1)
        if side in calls:
            try:
                for _ in range(warm):
                    calls[side]()
                sync()
            except Exception as exc:
                if side == "hpccomm":
                    raise
                first = (str(exc).splitlines() or [""])[0]
                ok, why = False, f"{type(exc).__name__}: {first[:160]}"
        else:
            ok = False
        if not _agree(raw_world, ok) and side != "hpccomm":
            calls.pop(side, None)
            errors.setdefault(side, why or "failed on another rank")
    iters = iterations(case.nbytes, opts.iters)
    times: dict[str, list[float]] = {s: [] for s in calls}
    order = list(calls)
    for i in range(opts.rounds):
        k = i % len(order)
        for side in order[k:] + order[:k]:  # rotate who goes first
            fn = calls[side]
            raw_world.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            sync()
            dt = (time.perf_counter() - t0) / iters
            times[side].append(dt / 2 if case.op == "send_recv" else dt)
    wrong = None
    if opts.check:
        case.fill()
        raw_world.Barrier()
        calls["hpccomm"]()
        sync()
        wrong = case.wrong()
    mine = (group.gi, group.comm.rank, case.participates, times, wrong, errors)
    everything = raw_world.gather(mine, root=0)
    if everything is None:
        return None
    return _rows(case, everything, sides, opts, iters)


def _combine(values: list[float], how: int) -> float:
    if how == 0:
        return values[0]
    if how == 2:
        return min(values)
    if how == 3:
        return max(values)
    return statistics.fmean(values)


def _rows(case: Case, everything: list[Any], sides: list[str], opts: BenchOptions,
          iters: int) -> list[dict[str, Any]]:  # fmt: skip
    by_group: dict[int, list[Any]] = {}
    for entry in everything:
        by_group.setdefault(entry[0], []).append(entry)
    rows = []
    for gi, entries in sorted(by_group.items()):
        entries.sort(key=lambda e: e[1])
        size = len(entries)
        active = [e for e in entries if e[2]]
        row: dict[str, Any] = {
            "group": gi,
            "op": case.op,
            "bytes": case.nbytes,
            "count": case.count,
            "dtype": case.dtype.name,
            "redop": case.redop.name.lower()
            if case.op in ("all_reduce", "reduce", "reduce_scatter")
            else None,
            "root": case.root if case.op in _ROOTED else None,
            "iters": iters,
            "wrong": None if entries[0][4] is None else sum(e[4] for e in entries),
        }
        peers: dict[str, Any] = {}
        for side in sides:
            errs = sorted({e[5][side] for e in entries if side in e[5]})
            if side not in active[0][3] or errs and side != "hpccomm":
                peers[side] = {"error": errs[0] if errs else "not run"}
                continue
            rounds = [_combine([e[3][side][i] for e in active], opts.average)
                      for i in range(len(active[0][3][side]))]  # fmt: skip
            t = statistics.median(rounds)
            algbw, busbw = bandwidths(case.op, case.nbytes, t, size)
            peers[side] = {"time_us": t * 1e6, "algbw": algbw, "busbw": busbw,
                           "rounds_us": [r * 1e6 for r in rounds]}  # fmt: skip
        base = peers["hpccomm"]
        row.update({k: base[k] for k in ("time_us", "algbw", "busbw")})
        row["rounds_us"] = base["rounds_us"]
        row["peers"] = {}
        for side in sides[1:]:
            p = peers[side]
            if "time_us" in p:
                p["ratio"] = p["time_us"] / base["time_us"] if base["time_us"] else None
            row["peers"][side] = p
        rows.append(row)
    return rows


def _avg_busbw(rows: list[dict[str, Any]], peers: list[str]) -> dict[str, float | None]:
    """The mean bus bandwidth of the rows, per side (hpccomm and each peer)."""
    avg = {}
    for side in ["hpccomm", *peers]:
        vals = [r["busbw"] if side == "hpccomm" else r["peers"][side].get("busbw")
                for r in rows]  # fmt: skip
        vals = [v for v in vals if v is not None]
        avg[side] = statistics.fmean(vals) if vals else None
    return avg


def _avg_line(label: str, avg: dict[str, float | None], peers: list[str]) -> str:
    """``label: 1.234 GB/s`` (``(hpccomm); ... GB/s (peer)`` with peers)."""
    text = f"{label}: {_f(avg['hpccomm'], 0, 3).strip()} GB/s"
    if peers:
        text += " (hpccomm); " + "; ".join(f"{_f(avg[p], 0, 3).strip()} GB/s ({p})" for p in peers)
    return text


def _document(world: Any, opts: BenchOptions, rows: list[dict[str, Any]],
              everyone: list[list[int]], dim: str, notes: list[str],
              hosts: list[str]) -> dict[str, Any]:  # fmt: skip
    from mpi4py import MPI

    groups = []
    for gi, members in enumerate(everyone):
        mine = [{k: v for k, v in r.items() if k != "group"} for r in rows if r["group"] == gi]
        name = "world" if not dim else f"{dim} {members}"
        group: dict[str, Any] = {"name": name, "members": members, "rows": mine}
        group["avg_busbw"] = _avg_busbw(mine, opts.peers)
        if len(opts.ops) > 1:  # nccl-tests' one line per binary is one op's: one per op too
            group["avg_busbw_by_op"] = {
                op: _avg_busbw([r for r in mine if r["op"] == op], opts.peers) for op in opts.ops
            }
        groups.append(group)
    o = {k: v for k, v in vars(opts).items() if k != "progress"}
    return {
        "schema": SCHEMA,
        "ranks": world.size,
        "hosts": hosts,
        "mpi": MPI.Get_library_version().splitlines()[0].split(",")[0].strip(),
        "python": sys.version.split()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "options": o,
        "average": _AVERAGE[opts.average],
        "groups": groups,
        "notes": notes,
    }


# -- output -----------------------------------------------------------------------------


def _f(value: float | None, width: int, digits: int = 2) -> str:
    if value is None:
        return f"{'-':>{width}}"
    if digits == 2 and abs(value) >= 1e5:
        return f"{value:>{width}.4g}"
    return f"{value:>{width}.{digits}f}"


def format_table(doc: dict[str, Any]) -> str:
    """nccl-tests' table: one row per size, per group; an average busbw line per group."""
    if doc.get("skipped"):
        return f"# hpccomm bench skipped: {doc['skipped']}"
    o = doc["options"]
    peers = o["peers"]
    warmup = f"{o['warmup']}" + (" (peers 1)" if peers and not o["warmup"] else "")
    lines = [
        f"# hpccomm bench: {doc['ranks']} ranks, {doc['mpi']}",
        f"# {','.join(o['ops'])}, -d {o['dtype']}, -r {o['redop']}, -n {o['iters'] or 'auto'}, "
        f"-w {warmup}, -c {int(o['check'])}, time = {_over_ranks(doc['average'])} of the "
        f"mean of n calls, median of {o['rounds']} rounds"
        + (", --device" if o["device"] else "")
        + (", --symmetric" if o.get("symmetric") else ""),
    ]
    if peers:
        lines.append(
            f"# peers measured in the same rounds, alternating: {', '.join(peers)}; "
            f"ratio = peer time / hpccomm time (> 1: hpccomm is faster)"
        )
    head = f"#{'size':>11} {'count':>11} {'type':>8} {'redop':>6} {'root':>5} {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
    unit = f"#{'(B)':>11} {'(elements)':>11} {'':>8} {'':>6} {'':>5} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"
    for p in peers:
        head += f" | {p + ' time':>12} {'busbw':>7} {'ratio':>6}"
        unit += f" | {'(us)':>12} {'(GB/s)':>7} {'':>6}"
    for g in doc["groups"]:
        lines.append(f"# group {g['name']}" if g["name"] != "world" else "# group world")
        lines += [head, unit]
        current_op = None
        for r in g["rows"]:
            if len(o["ops"]) > 1 and r["op"] != current_op:
                current_op = r["op"]
                lines.append(f"# {current_op}")
            line = (
                f"{r['bytes']:>12} {r['count']:>11} {r['dtype']:>8} "
                f"{_SHORT.get(r['redop'], r['redop']) or '-':>6} "
                f"{'-' if r['root'] is None else r['root']:>5} {_f(r['time_us'], 9)} "
                f"{_f(r['algbw'], 7)} {_f(r['busbw'], 7)} "
                f"{'N/A' if r['wrong'] is None else r['wrong']:>6}"
            )
            for p in peers:
                q = r["peers"][p]
                if "time_us" in q:
                    line += f" | {_f(q['time_us'], 12)} {_f(q['busbw'], 7)} {_f(q['ratio'], 6)}"
                else:
                    line += f" | {'-':>12} {'-':>7} {'-':>6}"
            lines.append(line)
        by_op = g.get("avg_busbw_by_op", {})
        for op, avg in by_op.items():
            lines.append(_avg_line(f"# Avg bus bandwidth ({op})", avg, peers))
        label = "# Avg bus bandwidth " + ("(all operations)" if by_op else "   ")
        lines.append(_avg_line(label, g["avg_busbw"], peers))
        wrong = sum(r["wrong"] or 0 for r in g["rows"])
        if o["check"]:
            lines.append(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
    errors = sorted({f"{p}: {r['peers'][p]['error']}" for g in doc["groups"] for r in g["rows"]
                     for p in peers if "error" in r["peers"][p]})  # fmt: skip
    for e in errors:
        lines.append(f"# not measured: {e}")
    for note in doc.get("notes", []):
        lines.append(f"# note: {note}")
    return "\n".join(lines)


def write_json(doc: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the result document (schema ``hpccomm.bench/1``)."""
    try:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    except OSError as exc:
        raise HpccommError(f"bench: cannot write {path}: {exc.strerror or exc}") from None


def plot(doc: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """busbw and time against size, log axes, one line per peer (and per op and group).

    Raises:
        HpccommError: matplotlib is not installed (saying how to get it), or the file cannot
            be written (its folder, or a format matplotlib does not write).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HpccommError(f"bench --plot: {PLOT_HINT}") from None
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    o = doc["options"]
    for g in doc["groups"]:
        for op in o["ops"]:
            rows = [r for r in g["rows"] if r["op"] == op]
            if not rows:
                continue
            tag = (f"{op} " if len(o["ops"]) > 1 else "") + (
                f"{g['name']} " if len(doc["groups"]) > 1 else ""
            )
            for side in ["hpccomm", *o["peers"]]:
                pts = [(r["bytes"], r if side == "hpccomm" else r["peers"][side]) for r in rows]
                pts = [(s, q) for s, q in pts if "time_us" in q]
                if not pts:
                    continue
                xs = [s for s, _ in pts]
                ax_bw.plot(xs, [q["busbw"] for _, q in pts], marker="o", ms=3, label=tag + side)
                ax_t.plot(xs, [q["time_us"] for _, q in pts], marker="o", ms=3, label=tag + side)
    for ax, what in ((ax_bw, "busbw (GB/s)"), (ax_t, "time (us)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"hpccomm bench: {', '.join(o['ops'])}, {o['dtype']}, {doc['ranks']} ranks "
                 f"({doc['mpi'][:60]})", fontsize=10)  # fmt: skip
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise HpccommError(f"bench --plot: cannot write {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # a format matplotlib does not write (check_plot_format)
        raise HpccommError(f"bench --plot: cannot write {path}: {exc}") from None
    finally:
        plt.close(fig)


def check_plot_available(what: str = "bench --plot") -> None:
    """Raise HpccommError (saying how to install it) when matplotlib is missing, before a
    long sweep starts; ``what`` names the option (``profile report --timeline``)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise HpccommError(f"{what}: {PLOT_HINT}")


def check_plot_format(path: str | os.PathLike[str], what: str = "bench --plot") -> None:
    """Raise HpccommError when ``path``'s extension is not a format matplotlib writes, or it
    has none (matplotlib would write ``path.png`` instead, a file the user did not name),
    before a long sweep starts; ``what`` names the option. Needs matplotlib
    (:func:`check_plot_available` first)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    ext = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    if ext in formats:
        return
    why = (f"the extension .{ext} is not a format matplotlib writes" if ext else
           f"it has no extension (matplotlib would write {os.fspath(path)}.png instead)")  # fmt: skip
    raise HpccommError(
        f"{what}: cannot write {os.fspath(path)}: {why}, expected one of "
        f"{', '.join('.' + f for f in formats)}"
    )


def check_writable(path: str | os.PathLike[str], what: str) -> None:
    """Raise HpccommError when ``path`` cannot be written (its folder is missing or not
    writable, or it is a folder or a read-only file), before a long sweep starts; ``what``
    names the option (``bench --json``). Tried, not asked: os.access() says yes to root
    for every path, so ``/proc/x.json`` failed after the whole sweep (an outside hunt). An
    existing file is opened for appending (its contents kept), a new one made with O_EXCL
    and removed again (every rank of rank 0's node checks at once: each removes only the
    file it made), a FIFO or a device only looked at (a FIFO's open waits for a reader),
    and a dangling symbolic link is left as it is (its target's folder looked at)."""
    if os.fspath(path).endswith(os.sep):  # (abspath drops it: open() then failed)
        why: str | None = "it names a directory"
    else:
        why = _unwritable(os.path.abspath(os.fspath(path)))
    if why is not None:
        raise HpccommError(f"{what}: cannot write {os.fspath(path)}: {why}")


def _unwritable(target: str) -> str | None:
    """Why ``target`` (absolute) cannot be written, or None (see check_writable)."""
    try:
        st = os.stat(target)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return exc.strerror or str(exc)
    else:
        if stat.S_ISDIR(st.st_mode):
            return "it is a directory"
        if not stat.S_ISREG(st.st_mode):  # (a FIFO or a device: looked at only)
            return None if os.access(target, os.W_OK) else "it is not writable"
        return _try_open(target, os.O_WRONLY | os.O_APPEND, made=False)
    dangling = os.path.islink(target)  # (writing creates its target)
    folder = os.path.dirname(os.path.realpath(target) if dangling else target)
    if not os.path.isdir(folder):
        return f"no directory {folder}"
    if dangling:
        ok = os.access(folder, os.W_OK | os.X_OK)
        return None if ok else f"the directory {folder} is not writable"
    return _try_open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, made=True)


def _try_open(target: str, flags: int, made: bool) -> str | None:
    """Open ``target`` with ``flags`` and close it (removing it where ``made``); why it
    could not be, or None. Another process making it meanwhile (``made``: O_EXCL), or
    removing it (not ``made``), is another rank's own try: no refusal. (ENOENT where it is
    made is the folder's: /proc takes no new file.)"""
    race = FileExistsError if made else FileNotFoundError
    try:
        fd = os.open(target, flags, 0o666)
    except race:
        return None  # (another rank's try, made or removed meanwhile: the folder takes it)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    if made:
        with contextlib.suppress(OSError):
            os.unlink(target)
    return None
