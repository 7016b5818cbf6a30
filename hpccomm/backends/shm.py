"""The node-local shared-memory fast path: large all_reduce, reduce and reduce_scatter of
host arrays among ranks that share one node's memory.

Open MPI moves a large intra-node reduction through its shared-memory transport in several
copies per rank (about 4.5 times the array's bytes of memory traffic per rank, by issue 12's
count) and, with the large temporaries of its reduction, leaves the caches. Here
every rank maps one shared segment and the work is split by rank, chunk by chunk:

1. each rank copies a chunk of its input into its part of the segment;
2. barrier;
3. rank r reduces slice r of that chunk over every rank's copy, in the FIXED order rank 0,
   1, ..., p-1, into its result area (ufuncs with ``out=``, no temporaries);
4. barrier; every rank copies every rank's result slice into its output (all_reduce; only
   the destination for reduce). reduce_scatter reduces straight into the caller's output and
   has no copy-out.

Memory traffic per rank for n bytes: all_reduce reads about 3n and writes about 2n + n/p
(copy in, reduce, copy out); the segment's chunks stay in the caches. Input areas and result areas are double-buffered, and chunk k's copy-out runs
in the same phase as chunk k+1's reduction and chunk k+2's copy-in, so one barrier separates
the phases (``chunks + 1`` barriers per call, ``chunks`` for reduce_scatter). Chunk k uses
buffer ``(tick + k) % 2`` where ``tick`` counts chunks over the communicator's calls, so
consecutive calls never write what a slower rank may still be reading.

Results: every rank computes the same slices in the same order, so all ranks get bitwise
identical results, the same from run to run. Floating-point sums may differ from MPI's result
in the last bits (MPI associates the operands in another order); integers are exact and wrap
as NumPy's do; MIN/MAX propagate NaN (as hpccomm's MPI path does). float16/bfloat16 round to
their type after each pairwise step, as on the MPI path.

Across-rank checks: each call writes a header (op, dtype, count, root, the call's sequence
number in its group, tick) that every rank compares after the first barrier; ranks whose
calls differ raise MismatchError on every rank instead of reading each other's memory out of
step. The sequence number makes that so whatever the timing: a rank whose peer's barrier
matched the path's first barrier (another collective, debug "off") may find the peer's
header of its next call already written, with the same description.

Memory ordering: the segment is plain shared memory (a shared file, mmap); stores made before
an MPI barrier are assumed visible to loads made after it on every rank. This holds for Open
MPI's shared-memory barrier on x86-64 (total store order; the barrier's atomic operations are
full fences) and on weakly ordered CPUs through the fences its transport issues around every
fragment; it is the same assumption MPI's own unified memory model makes for
``MPI_Win_sync`` + barrier on a shared window.

Single copy (ordinary arrays, where the kernel allows it): a rank reads its part of every
peer's array straight from the peer's memory (``process_vm_readv``, Linux's cross-memory
attach, one piece in cache at a time), reduces it in the same order, and writes each reduced
piece into every peer's array (``process_vm_writev``): between two synchronisations, no copy
in, no copy out; the kernel moves 2n(p-1)/p bytes per rank for an all_reduce of n bytes
(n at 2 ranks). Each call publishes the array's
address in its header; the closing synchronisation is an allreduce of a failure flag, so a
rank that could not reach a peer fails the call on every rank instead of leaving a part
unreduced. The first call probes it (each rank reads a token from every peer and writes into
its inbox); where that fails on any rank (Yama's ptrace_scope above 0, a container's seccomp
profile, PID namespaces) every rank uses the copy path in its ranges, MPI elsewhere.
``HPCCOMM_SHM_CMA=0`` turns it off.

Why not ``MPI_Win_allocate_shared``: freeing an MPI window is collective (Open MPI's osc/sm
free runs a barrier), so freeing a communicator would block on a peer that is stuck or gone,
and a rank that timed out must be able to free and exit. The segment here is created once per
communicator on the first large call (rank 0 creates and sizes a nameless file, the others
open and map it: :func:`_map_shared`), and freeing drops the mapping locally: NumPy views keep
it mapped until the last body using it has returned. Its size is fixed (two chunks of input
and two result slices per rank), whatever the message size: nothing grows.

Settings (read once per process; every rank must use the same): ``HPCCOMM_SHM=0`` turns the
path off, ``HPCCOMM_SHM_THRESHOLD`` (bytes, K/M suffixes) makes every input from that size
take it (default: the measured ranges of :class:`ShmBackend`), ``HPCCOMM_SHM_CHUNK`` the
bytes of one chunk (default 1 MiB), ``HPCCOMM_SHM_CMA=0`` keeps ordinary arrays off the
single-copy path.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
import uuid
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import arena, record
from .. import ops as O
from ..buffers import flat as _flat
from ..dtypes import ARITHMETIC_UFUNCS, SUPPORTED_DTYPES, ReduceOp
from ..errors import (
    BackendError,
    ClosedError,
    HpccommError,
    InvalidArgumentError,
    MismatchError,
    PeerError,
)
from ..ops import Call, read_only
from ..switches import switch

__all__ = ["ShmBackend", "Settings", "settings", "ENV"]

ENV = "HPCCOMM_SHM"
THRESHOLD_ENV = "HPCCOMM_SHM_THRESHOLD"
CHUNK_ENV = "HPCCOMM_SHM_CHUNK"
CMA_ENV = "HPCCOMM_SHM_CMA"
NEVER = 2**63  # a size no call reaches
# (smallest, largest) bytes of input the copy path takes by default, from the measurements
# in the README: reduce_scatter from 1 MiB; all_reduce from 1 MiB up to 8 MiB in groups of
# 3 or more ranks (from 256 KiB before 2026-12-04: it lost to MPI below 1 MiB, 0.50-0.64);
# all_reduce and reduce never in groups of 2, reduce never at all (Open MPI's reduce is
# cheaper than its all_reduce: the copy path lost at every size)
DEFAULT_RANGES = {"reduce_scatter": (1 << 20, NEVER), "all_reduce": (1 << 20, 8 << 20),
                  "reduce": (NEVER, NEVER), "pair": (NEVER, NEVER)}  # fmt: skip
# the single-copy path (ordinary arrays, process_vm_readv/writev), where the ranks may
# reach each other's memory: all_reduce and reduce_scatter from these sizes of input in
# groups of 2 ("pair") and of 3 or more ("group"), reduce from its own (measured: README);
# below them the copy path's ranges apply
DIRECT_RANGES = {"pair": (256 << 10, NEVER), "group": (1 << 20, NEVER),
                 "reduce pair": (1 << 20, NEVER), "reduce group": (8 << 20, NEVER)}  # fmt: skip
DEFAULT_CHUNK = 1 << 20  # bytes of the array per chunk
# symmetric buffers: calls on them take the path from this size of input (measured: README)
SYM_MIN = 256 << 10
SYM_PIECE = 256 << 10  # bytes each rank reduces at a time from symmetric buffers (in cache)
SHM_DIR = "/dev/shm"

_HEADER = 128  # bytes per header slot (two slots per rank)
_ADDR = _HEADER // 8 - 1  # the header word with the address of the rank's array (single copy)
# words the header check does not compare (they may differ by rank), read by every rank
_READONLY = _ADDR - 1  # 1: the array the call writes into is read-only on this rank
_FACTOR = _ADDR - 2  # PREMUL_SUM: a CRC of this rank's factor (its type and value)
_DIRECT = -1  # the header's buffer word on the single-copy path
_WITHDRAWN = -1  # the tick word of a header whose call failed its check
_ALIGN = 64  # slice boundaries and areas on cache-line multiples
_KEPT = 4096  # sequence numbers of calls handed to MPI kept for their records (ran_on)

_LOGICAL: dict[str, Any] = {
    "SUM": np.logical_or,
    "MAX": np.logical_or,
    "BOR": np.logical_or,
    "PRODUCT": np.logical_and,
    "MIN": np.logical_and,
    "BAND": np.logical_and,
    "BXOR": np.logical_xor,
}
_BITWISE: dict[str, Any] = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
# (dtype category, op name) -> ufunc; ALLOWED_CATEGORIES (dtypes.py) already refused the rest
_UFUNCS: dict[tuple[str, str], Callable[..., Any]] = {}
for _name, _f in _LOGICAL.items():
    _UFUNCS[("bool", _name)] = _f
for _cat in ("int", "float", "half", "complex"):
    for _name, _f in ARITHMETIC_UFUNCS.items():
        _UFUNCS[(_cat, _name)] = _f
for _name, _f in _BITWISE.items():
    _UFUNCS[("int", _name)] = _f

_SPECS = (O.ALL_REDUCE, O.REDUCE, O.REDUCE_SCATTER)
_DTYPE_CODES = {dt: i for i, dt in enumerate(SUPPORTED_DTYPES)}
_OP_CODES = {n: i for i, n in enumerate(("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR",
                                         "BXOR", "PREMUL_SUM"))}  # fmt: skip


class Settings:
    """The fast path's settings: on or off, the smallest input (bytes), the chunk (bytes),
    and whether ordinary arrays may take the single-copy path (``cma``)."""

    __slots__ = ("enabled", "threshold", "chunk", "cma")

    def __init__(self, enabled: bool, threshold: int | None, chunk: int,
                 cma: bool = True) -> None:  # fmt: skip
        self.enabled = enabled
        self.threshold = threshold
        self.chunk = chunk
        self.cma = cma

    def __repr__(self) -> str:
        state = "on" if self.enabled else "off"
        limit = "default" if self.threshold is None else f"{self.threshold} B"
        single = "on" if self.cma else "off"
        return f"<shm {state}, threshold {limit}, chunk {self.chunk} B, single-copy {single}>"


def _size(raw: str, name: str) -> int:
    text = raw.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = (text[:-1] if scale > 1 else text).strip()  # ("1 MB" as "1MB")
    # ASCII digits only, as every launcher integer (int() took '1_000' and Arabic-Indic '٣')
    value = int(digits) * scale if digits.isascii() and digits.isdigit() else -1
    if value < 0:
        raise InvalidArgumentError(
            f"hpccomm: {name} is {raw!r}, expected a size in bytes (K/M/G suffixes allowed)"
        )
    return value


_settings: Settings | None = None


def settings(env: Any = None) -> Settings:
    """The settings from the environment (read once per process unless ``env`` is given)."""
    global _settings
    if env is None and _settings is not None:
        return _settings
    e = os.environ if env is None else env
    enabled = switch(e, ENV, default=True, where="hpccomm")
    # (blank is unset, as for every other setting: a blank threshold was refused)
    raw_threshold = (e.get(THRESHOLD_ENV) or "").strip() or None
    threshold = None if raw_threshold is None else _size(raw_threshold, THRESHOLD_ENV)
    chunk = _size((e.get(CHUNK_ENV) or "").strip() or str(DEFAULT_CHUNK), CHUNK_ENV)
    if chunk < 4096 or chunk % _ALIGN:
        raise InvalidArgumentError(
            f"hpccomm: {CHUNK_ENV} is {chunk}, expected at least 4096 and a multiple of "
            f"{_ALIGN} bytes (every dtype's elements must tile a chunk)"
        )
    cma = switch(e, CMA_ENV, default=True, where="hpccomm")
    s = Settings(enabled, threshold, chunk, cma)
    if env is None:
        _settings = s
    return s


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Segment:
    """The mapped segment and its typed views: per rank two header slots (int64), two input
    areas of one chunk and two result areas of one slice."""

    __slots__ = ("mm", "size", "chunk", "res", "seg", "raw", "typed", "headers")

    def __init__(self, mm: Any, size: int, chunk: int) -> None:
        self.mm = mm
        self.size = size
        self.chunk = chunk
        self.res = _round_up(chunk // size + 2 * _ALIGN, _ALIGN)
        self.seg = _round_up(2 * _HEADER + 2 * chunk + 2 * self.res, 4096)
        self.raw = np.frombuffer(mm, np.uint8)
        # every rank's two header slots: (rank, slot, word), int64
        self.headers = np.lib.stride_tricks.as_strided(
            self.raw[:_HEADER].view(np.int64),
            shape=(size, 2, _HEADER // 8),
            strides=(self.seg, _HEADER, 8),
            writeable=True,
        )
        self.typed: dict[np.dtype, tuple[list[list[np.ndarray]], list[list[np.ndarray]]]] = {}

    @staticmethod
    def nbytes(size: int, chunk: int) -> int:
        res = _round_up(chunk // size + 2 * _ALIGN, _ALIGN)
        return size * _round_up(2 * _HEADER + 2 * chunk + 2 * res, 4096)

    def views(self, dtype: np.dtype) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
        """Per rank, its two input areas and its two result areas as arrays of ``dtype``."""
        got = self.typed.get(dtype)
        if got is None:
            inputs, results = [], []
            for r in range(self.size):
                base = r * self.seg + 2 * _HEADER
                inputs.append(
                    [
                        self.raw[base + i * self.chunk : base + (i + 1) * self.chunk].view(dtype)
                        for i in (0, 1)
                    ]
                )
                rbase = base + 2 * self.chunk
                results.append(
                    [
                        self.raw[rbase + i * self.res : rbase + (i + 1) * self.res].view(dtype)
                        for i in (0, 1)
                    ]
                )
            got = self.typed[dtype] = (inputs, results)
        return got


class ShmBackend:
    """Runs large reductions of host arrays through a segment shared by the group's ranks
    (all on one node). ``supports`` takes all_reduce, reduce and reduce_scatter (even or
    uneven) whose input has ``ranges[spec]`` bytes (smallest, largest); ``calls`` counts the
    calls it ran.

    Default ranges (``threshold=None``), from the measurements in the README: the
    single-copy path (``direct``, where the first call's probe allows it) for all_reduce
    and reduce_scatter from 256 KiB in groups of 2 and from 1 MiB in larger ones, for
    reduce from 1 MiB and 8 MiB (``DIRECT_RANGES``); below that, or without it, the copy
    path (``DEFAULT_RANGES``): reduce_scatter from 1 MiB; all_reduce from 1 MiB up to
    8 MiB in groups of 3 or more ranks, never in groups of 2; reduce never. ``threshold`` (bytes, or ``HPCCOMM_SHM_THRESHOLD``) makes every size from
    it on take the path (single copy where allowed), for all three. Across nodes
    (``node``) only all_reduce, only from ``threshold``: single copy or the copy path inside
    each node, every node alike (the probe's verdict is the group's)."""

    name = "shm"
    seq = 0  # the call running now: its sequence number in the group (set by the dispatch)

    def __init__(
        self,
        host: Any,
        threshold: int | None,
        chunk: int,
        *,
        node: tuple[int, int, int] | None = None,
        direct: bool = False,
    ) -> None:
        self.host = host  # the group's MPIBackend: its communicator, barriers, fallback
        # A group spanning nodes (``node``: this rank's node index, local rank and local
        # size) runs all_reduce hierarchically: shared memory among the node's ranks, MPI
        # among the ranks holding the same slice on every node (``cross``). Both
        # communicators are made by the first call (see _ensure).
        self.hier = node
        self.threshold = threshold  # (HPCCOMM_SHM_THRESHOLD; None: not set)
        self.rank: int = host.rank if node is None else node[1]
        self.size: int = host.size if node is None else node[2]
        self.node: Any = host if node is None else None  # the segment's ranks (MPIBackend)
        self.cross: Any = None
        self.members = list(range(self.size))  # the group's rank of each of the node's ranks
        self.ranges: dict[O.OpSpec, tuple[int, int]]
        if node is not None:  # not measured across real nodes: only with a threshold
            self.ranges = dict.fromkeys(_SPECS, (NEVER, NEVER))
            self.ranges[O.ALL_REDUCE] = (NEVER if threshold is None else threshold, NEVER)
        elif threshold is None:
            pair = host.size < 3
            self.ranges = {O.ALL_REDUCE: DEFAULT_RANGES["pair" if pair else "all_reduce"],
                           O.REDUCE: DEFAULT_RANGES["pair" if pair else "reduce"],
                           O.REDUCE_SCATTER: DEFAULT_RANGES["reduce_scatter"]}  # fmt: skip
        else:
            self.ranges = dict.fromkeys(_SPECS, (threshold, NEVER))
        # the single-copy path (ordinary arrays): wanted (``direct``), then found possible
        # or not by the first call's probe (``cma``, ``cma_why``); across nodes inside each
        # node, for all_reduce from the threshold, as the copy path
        self.direct = direct
        if not self.direct:
            self.direct_ranges = dict.fromkeys(_SPECS, (NEVER, NEVER))
        elif node is not None:
            self.direct_ranges = dict(self.ranges)
        elif threshold is not None:
            self.direct_ranges = dict.fromkeys(_SPECS, (threshold, NEVER))
        else:
            key = "pair" if host.size == 2 else "group"
            self.direct_ranges = dict.fromkeys(_SPECS, DIRECT_RANGES[key])
            self.direct_ranges[O.REDUCE] = DIRECT_RANGES[f"reduce {key}"]
        self.cma: _Cma | None = None
        self.cma_why = "" if self.direct else "off"  # why the single-copy path does not run
        self.pids: list[int] = []  # every rank's process id (single-copy path)
        # every peer's arena mapped here (hpccomm.arena), or why not (a str); None: this rank
        self.peers: list[arena.PeerArena | str | None] = []
        self.direct_calls = 0  # calls that ran on the single-copy path
        self.mapped_calls = 0  # ... of which every peer's array was in its mapped arena
        # the sequence numbers of calls handed to MPI at run time, kept while someone
        # listens to the records (the last _KEPT of them): see ran_on
        self._on_mpi: dict[int, None] = {}
        # arrays of single-copy calls that ended abnormally: a peer may still write into
        # them, so their memory is never given back
        self._held: list[np.ndarray] = []
        self._verdict = np.zeros(1, np.int64)  # the single-copy path's closing allreduce
        # (mpi4py is imported here, not with the module: hpccomm initializes MPI itself)
        from mpi4py import MPI

        self._max_in_place = (MPI.IN_PLACE, MPI.MAX)
        # symmetric buffers (allocate): from this size of input their calls take the path
        self.sym_min = SYM_MIN if threshold is None else threshold
        self.chunk = chunk
        self.calls = 0
        self.sym_calls = 0  # calls that ran on symmetric buffers (no copy in)
        self.tick = 0  # chunks run so far (alike on every rank): picks the buffers
        self.segment: _Segment | None = None
        self.failed: str | None = None  # why the segment could not be made (then MPI runs)
        self.closed = False
        self.allocs: dict[int, _Allocation] = {}  # live symmetric allocations, by id
        self.allocated = 0  # allocations made so far (alike on every rank): their ids
        # the accumulator and the scaled/peer piece of the symmetric and single-copy paths:
        # one piece each, made here, so that no call allocates before its first barrier (a
        # rank failing there would be out of the call its peers are in)
        self.piece = _round_up(SYM_PIECE, _ALIGN)  # bytes reduced at a time (in cache)
        self._scratch = (np.empty(self.piece, np.uint8), np.empty(self.piece, np.uint8))
        self._scratch_at = (self._scratch[0].ctypes.data, self._scratch[1].ctypes.data)
        self._bodies: dict[O.OpSpec, Callable[..., Any]] = {
            O.ALL_REDUCE: self._all_reduce,
            O.REDUCE: self._all_reduce,
            O.REDUCE_SCATTER: self._reduce_scatter,
        }

    @classmethod
    def for_group(cls, host: Any, nodes: Any) -> ShmBackend | None:
        """The fast path of a group with at least two ranks, unless turned off: on one node
        the shared-memory path; across nodes (``nodes``: the rank's NodeInfo) the
        hierarchical all_reduce, which the first call checks (every node the same number
        of ranks, at least two) before it runs."""
        s = settings()
        if not s.enabled or host.size < 2:
            return None
        if nodes.num_nodes == 1:
            if s.chunk // 16 < host.size:
                return None
            return cls(host, s.threshold, s.chunk, direct=s.cma)
        node = (nodes.node_index, nodes.local_rank, nodes.local_size)
        return cls(host, s.threshold, s.chunk, node=node, direct=s.cma)

    # -- the interface ------------------------------------------------------------------

    def supports(self, call: Call) -> bool:
        """A host reduction this path serves, of a size in its range; once the group has
        symmetric buffers (allocate), also every such call from ``sym_min`` bytes: the body
        then runs calls on symmetric buffers here and hands the others to MPI."""
        info = call.info
        return (
            call.device is None
            and call.spec in self._bodies
            and info is not None
            and (self._copies(call) or self._directs(call) or self.symmetric_range(call))
            and (info.category, call.redop.name) in _UFUNCS
            and self.failed is None
        )

    def kind_of(self, spec: O.OpSpec, x: np.ndarray) -> bool | None:
        """For the dispatch's validation cache: whether ``x`` is in a symmetric buffer where
        that decides the path (a reduction of at least ``sym_min`` bytes of input while the
        group has buffers: see symmetric_range); None elsewhere, without looking (a look
        per call of every op cost 4.5-16 us, a review)."""
        if not self.allocs or spec not in self._bodies or x.nbytes < self.sym_min:
            return None
        return self._locate(x) is not None

    def symmetric_range(self, call: Call) -> bool:
        """True when a call on a symmetric buffer would take the symmetric path (the group
        has some, the size is in their range); the dispatch then compares across ranks
        whether each passed one (see ops.Call.memory)."""
        return self.allocated > 0 and call.nbytes >= self.sym_min

    def _copies(self, call: Call) -> bool:
        """True when the call's size is in the copy path's range."""
        lo, hi = self.ranges[call.spec]
        return lo <= call.nbytes <= hi

    def _directs(self, call: Call) -> bool:
        """True when the call's size is in the single-copy path's range (where wanted)."""
        lo, hi = self.direct_ranges[call.spec]
        return lo <= call.nbytes <= hi and self.cma_why == ""

    def prepare(self, call: Call) -> None:
        self.host.prepare(call)  # refuses what MPI refuses (the fallback prepares again)
        call.backend = self
        call.body = self._bodies[call.spec]
        call.blocking_body = None
        call.mode = "blocking"
        call.how = _Plan(call, self.size, self.rank, self.chunk, self._copies(call),
                         self.host.size, self._directs(call))  # fmt: skip

    def error(self, call: Call, seq: int, exc: BaseException) -> HpccommError:
        if isinstance(exc, _Said):  # the body's own verdict, named with the call's number
            err = exc.kind(f"{call.where(seq)}: {exc.text}")
            # every rank reaches a verdict of its own (they read the same headers, or the
            # same allreduced flags): no failure notice, which a rank still waiting with a
            # bound could read before its own verdict and raise a PeerError instead, the
            # group then unusable (an outside review, hierarchical path: 2 runs of 13)
            err.local = True
            return err
        from mpi4py import MPI

        if not isinstance(exc, MPI.Exception):  # the path's own Python code failed
            return BackendError(
                f"{call.where(seq)}: the shared-memory path failed: {type(exc).__name__}: {exc}"
            )
        err = self.host.error(call, seq, exc)
        if isinstance(err, PeerError):  # the host revoked the group's communicators; the
            # hierarchical path's node and cross-node ones too, where a peer may be waiting
            for sub in self._own_comms():
                sub.revoke()
        return err

    def close(self) -> None:
        """Drop the mapping (local; a body still running keeps it mapped through its views).
        A call still queued behind a stuck one then raises instead of making a new one."""
        self.segment = None
        self.closed = True
        self.peers = []  # (a peer's arena stays mapped while some group's path holds it)
        self.allocs = {}  # the arrays handed out keep their memory (their views map it)

    def free(self) -> None:
        """Free the hierarchical path's node and cross-node communicators (collective: with
        the group's own free, on every rank that made them)."""
        for sub in self._own_comms():
            sub.free()
        self.cross = None
        self.node = None if self.hier is not None else self.host

    def _own_comms(self) -> list[Any]:
        """The communicators this path made itself (the hierarchical path's node and
        cross-node ones, once made); the group's own (``host``) is not among them."""
        return [c for c in (self.cross, self.node) if c is not None and c is not self.host]

    def _layout_refused(self) -> str | None:
        """Across nodes: why the hierarchical path cannot run on this group's layout (None:
        it can). Collective over the group."""
        index = self.hier[0] if self.hier is not None else 0
        per_node = dict(self.host.mpi.allgather((index, self.size)))
        counts = [per_node[k] for k in sorted(per_node)]
        if len(set(counts)) > 1 or counts[0] < 2:
            return f"ranks per node {counts}: not the same on every node, or < 2"
        if self.chunk // 16 < counts[0]:
            return (
                f"a chunk of {self.chunk:,} bytes is too small for {counts[0]} ranks per node "
                f"(HPCCOMM_SHM_CHUNK)"
            )
        return None

    def describe(self, call: Any) -> str:
        """One line for ``hpccomm info``: the path's form and whether ordinary arrays take
        the single-copy path here. Collective on a group that has not made its segment yet
        (it makes it, and probes, as a first call would; ``call`` names the step)."""
        if self.hier is not None and self.threshold is None:
            # (it named the hierarchical path, "from HPCCOMM_SHM_THRESHOLD only", where no
            # call took it: an outside hunt; the threshold is alike on every rank)
            return (
                "off across nodes: HPCCOMM_SHM_THRESHOLD is not set (the hierarchical "
                "all_reduce is not measured across real nodes: it runs only from a size given)"
            )
        if self.hier is not None and self.node is None and self.failed is None:
            # (it said the hierarchical path runs where the layout refuses it at the first
            # call: one rank per node, 2 + 1: an outside hunt)
            self.failed = self._layout_refused()
        if self.hier is not None and self.failed is not None:
            return f"off across nodes: {self.failed}"
        if self.hier is not None:
            inside = "single copy where the first call's probe allows it, else the copy path"
            if not self.direct:
                inside = f"the copy path (single copy off: {CMA_ENV}=0)"
            start = self.ranges[O.ALL_REDUCE][0]
            return (f"hierarchical all_reduce across nodes from {start:,} bytes "
                    f"(HPCCOMM_SHM_THRESHOLD); inside each node {inside}")  # fmt: skip
        if self._ensure(call) is None:
            return f"off: no shared segment ({self.failed})"
        if self.cma is not None:
            single = "single copy (process_vm_readv/writev) for ordinary arrays"
            unmapped = [f"rank {self.members[j]} ({p})" for j, p in enumerate(self.peers)
                         if isinstance(p, str)]  # fmt: skip
            if not unmapped:
                single += ", in place for those in the peers' arenas (mapped here)"
            else:
                single += f"; peers' arenas not mapped here: {', '.join(unmapped)}"
            if arena.mine() is None:  # (the peers then move this rank's arrays by the kernel)
                single += f"; this rank's arena allocator: {arena.state()}"
        elif self.direct:
            single = f"copy path only: single copy refused ({self.cma_why})"
        else:
            single = f"copy path only: single copy off ({CMA_ENV}=0)"
        return f"on, {self.size} ranks on this node: {single}"

    # -- the segment --------------------------------------------------------------------

    def _barrier(self) -> None:
        """The node's ranks (every rank of the group on one node; across nodes the node's
        communicator: the nodes meet in the cross-node all_reduces, not in every chunk's
        barrier)."""
        self.node.mpi.Barrier()

    def _ensure(self, call: Any) -> _Segment | None:
        """The segment, made on the first call (collective: every rank's first fast-path
        call is the same call, or the same allocate). None when some rank could not map it:
        the group then stays on MPI (every rank learns it from the same allgather). Across
        nodes the first call also checks the layout and makes the node's and the cross-node
        communicators."""
        seg = self.segment
        if seg is not None or self.failed is not None:
            return seg
        if self.closed:
            raise ClosedError(f"{call}: communicator {call.group.name} already freed")
        if self.hier is not None and self.node is None:
            index, local_rank, _ = self.hier
            self.failed = self._layout_refused()
            if self.failed is not None:
                return None
            # (no objects on them: see MPIBackend; this runs on the group's worker thread)
            self.node = self.host.split(index, local_rank, objects=False)
            self.cross = self.host.split(local_rank, index, objects=False)
            self.members = self.node.mpi.allgather(self.host.rank)
        total = _Segment.nbytes(self.size, self.chunk)
        mm, why = _map_shared(self.node.mpi, self.rank, total)
        if self.hier is not None:  # every node must have its segment, or none runs
            whys = self.host.mpi.allgather(why)
            why = "; ".join(f"rank {r}: {w}" for r, w in enumerate(whys) if w)
            if why:
                mm = None
        if mm is None:
            self.failed = why or "no segment"
            return None
        seg = self.segment = _Segment(mm, self.size, self.chunk)
        if self.direct:
            self.cma, self.pids, self.cma_why, theirs = _probe_cma(self.node.mpi, self.rank,
                                                                    self.size)  # fmt: skip
            if self.cma is not None:  # the peers' arenas, mapped where they can be
                self.peers = [None if j == self.rank else arena.map_peer(self.pids[j], t)
                              for j, t in enumerate(theirs)]  # fmt: skip
            if self.hier is not None:  # every node single copy, or none (one slicing)
                whys = self.host.mpi.allgather(self.cma_why)
                if any(whys):  # each node's reasons (its own rank numbers), once
                    first = {w: r for r, w in reversed(list(enumerate(whys))) if w}
                    self.cma = None
                    self.cma_why = "; ".join(f"on the node of rank {r}: {w}"
                                             for w, r in first.items())  # fmt: skip
        return seg

    def ran_on(self, seq: int) -> str:
        """Which backend ran call ``seq`` of the group, for its record: "shm", or "mpi" for a
        call given to the path that handed it to MPI at run time (known while someone
        listens to the records)."""
        return "mpi" if seq in self._on_mpi else self.name

    def _fallback(self, call: Call, x: Any, out: Any, stream: Any) -> Any:
        if record.listeners:
            kept = self._on_mpi
            kept[self.seq] = None
            if len(kept) > _KEPT:
                del kept[next(iter(kept))]
        plan: _Plan = call.how
        plain = plan.plain
        if plain is None:
            plain = plan.plain = call.piece(call.count)
            self.host.prepare(plain)
        return plain.body(plain, x, out, stream)

    # -- the header check -----------------------------------------------------------------

    def _check(self, seg: _Segment, call: Call, mine: np.ndarray, slot: int) -> bool:
        """Every rank's header of this call equals this rank's, else MismatchError, and no
        rank's array to write into is read-only, else InvalidArgumentError (on every rank:
        all read the same headers; nothing was read or written). Returns whether the ranks'
        PREMUL_SUM factors differ."""
        rows = seg.headers[:, slot, : mine.size]
        same = bool((rows == mine).all())
        refused = seg.headers[:, slot, _READONLY].nonzero()[0].tolist() if same else []
        factors = seg.headers[:, slot, _FACTOR]
        differ = bool((factors != factors[0]).any())
        if self.cross is not None:  # hierarchical: the other nodes' ranks must hear of it
            # 3: a mismatch, 2: a read-only array, 1: PREMUL_SUM factors that differ, on
            # some node (then every node runs the call on MPI; factors that differ only
            # between nodes are right as they are: each node scales its own ranks' inputs)
            verdict = self._verdict
            verdict[0] = 3 if not same else 2 if refused else 1 if differ else 0
            here, most = self._max_in_place
            self.cross.mpi.Allreduce(here, verdict, op=most)
            if same and not refused and verdict[0] > 1:
                self.tick += 1  # as below
                kind, what = ((MismatchError, "the ranks' calls differ") if verdict[0] == 3 else
                              (InvalidArgumentError, "a rank's array is read-only"))  # fmt: skip
                raise _Said(kind, f"{what} on another node's shared-memory path; nothing was "
                                  f"reduced")  # fmt: skip
            differ = bool(verdict[0] == 1)
        if same:
            if not refused:
                return differ
            self.tick += 1  # as below
            arg = "out" if call.spec is O.REDUCE_SCATTER else "array"
            if self.rank in refused:
                err = read_only(call, arg)
                err.local = True  # the others raise (below): no notice (see error)
                raise err
            ranks = ", ".join(str(self.members[r]) for r in refused)
            raise _Said(
                InvalidArgumentError,
                f"rank {ranks}'s {arg} is read-only (its writeable flag is False) on the "
                f"shared-memory path, expected a writable array on every rank; nothing was "
                f"reduced",
            )
        self.tick += 1  # alike on every rank: the next call writes the other header slot
        # and buffers, which no rank reads any more

        def show(row: list[int]) -> str:
            spec, dt, op, count, root, blocks, seq, sym, off, tick = row
            name = _SPECS[spec].name if 0 <= spec < len(_SPECS) else f"op {spec}"
            dtype = list(SUPPORTED_DTYPES)[dt].name if 0 <= dt < len(SUPPORTED_DTYPES) else dt
            opname = list(_OP_CODES)[op] if 0 <= op < len(_OP_CODES) else op
            where = f" to {root}" if root >= 0 else ""
            sizes = f", blocks #{blocks:x}" if blocks else ""
            buf = (f"symmetric buffer {sym} at byte {off}" if sym > 0 else
                   "an ordinary array, single copy" if sym == _DIRECT else
                   "an ordinary array")  # fmt: skip
            when = "withdrawn" if tick == _WITHDRAWN else f"chunk tick {tick}"
            return f"{name}{where} #{seq} of {count} {dtype} ({opname}{sizes}, {buf}, {when})"

        seen = rows.tolist()
        # withdraw this header: a rank that was not in a fast-path call when this one ran
        # (its barrier matched another collective, debug "off") must not match it later
        seg.headers[self.rank, slot, mine.size - 1] = _WITHDRAWN
        diff = "; ".join(f"rank {self.members[r]}: {show(row)}" for r, row in enumerate(seen))
        raise _Said(
            MismatchError,
            f"the ranks' calls differ on the shared-memory path: {diff}; nothing was reduced",
        )

    def _start(
        self,
        seg: _Segment,
        call: Call,
        plan: _Plan,
        sym: int = 0,
        off: int = -1,
        target: np.ndarray | None = None,
    ) -> tuple[int, np.ndarray]:
        """Write this call's header (its description, its sequence number, the symmetric
        buffer and offset, and the tick) into this rank's slot, with whether ``target`` (the array the call writes
        into on this rank) is read-only and PREMUL_SUM's factor."""
        tick = self.tick
        mine = plan.words.copy()
        mine[-4:] = (self.seq, sym, off, tick)
        row = seg.headers[self.rank, tick % 2]
        row[: mine.size] = mine
        row[_READONLY] = target is not None and not target.flags.writeable
        row[_FACTOR] = plan.factor_id
        return tick, mine

    # -- symmetric buffers ----------------------------------------------------------------

    def allocate(
        self, call: Any, shape: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray | str | None:
        """A symmetric buffer: collective over the group (one node). Every rank gets an
        array of ``shape`` and ``dtype`` in one new shared file that every rank maps whole,
        so each rank can read and write every rank's array; None on every rank when the
        group spans nodes, and why (a str) when some rank could not map it (the caller then
        hands out an ordinary array, and warns on its own thread: this may run on the
        group's worker). ``call`` names the step in errors. The memory is zero-filled."""
        if self.hier is not None or self._ensure(call) is None:
            return None
        count = int(np.prod(shape, dtype=np.int64))
        region = max(4096, _round_up(count * dtype.itemsize, 4096))
        mm, why = _map_shared(self.node.mpi, self.rank, region * self.size, keep_fd=True)
        if mm is None:  # the same on every rank (the reasons are agreed)
            return why
        self.allocated += 1  # alike on every rank: the allocation's id
        alloc = _Allocation(self.allocated, mm, self.size, region, self.rank)
        # an array of its own (not a view of alloc.raws): the base of every view of it
        mine = np.frombuffer(mm, dtype, count, self.rank * region)
        self.allocs[alloc.id] = alloc
        # the array and its views keep the mapping; when the last is gone, so is the entry
        weakref.finalize(mine, self.allocs.pop, alloc.id, None)
        _live_mapping(mine, alloc.start, region, self.rank * region)
        return mine.reshape(shape)

    def locate(self, x: Any) -> tuple[_Allocation, int] | None:
        """(allocation, byte offset) of a C-contiguous NumPy array lying inside this rank's
        part of one of the group's symmetric buffers; None otherwise."""
        if not self.allocs or not isinstance(x, np.ndarray) or not x.flags.c_contiguous:
            return None  # (a subclass's view of a buffer is one: its body finds it so)
        return self._locate(x)

    def _locate(self, x: np.ndarray) -> tuple[_Allocation, int] | None:
        addr = x.ctypes.data
        # a copy of the entries: a buffer dropped on another thread (finalize) pops one, and
        # so may one whose finalizer a garbage collection runs while tuple() allocates
        # (dict.copy() allocates before it copies: "dictionary changed size during
        # iteration" on Python 3.11 from tuple(values()), a review)
        for alloc in self.allocs.copy().values():
            off = addr - alloc.start
            if 0 <= off and off + x.nbytes <= alloc.region:
                return alloc, off
        return None

    def _symmetric(
        self, call: Call, x: np.ndarray, out: Any, seg: _Segment, alloc: _Allocation, off: int
    ) -> Any:
        """A call on symmetric buffers: no copy in, no segment chunks. Barrier (every rank's
        buffer holds its input); rank r reduces its part straight from every rank's buffer,
        a piece (in cache) at a time, in the order rank 0, 1, ..., p-1, and writes each piece
        of the result into every rank's buffer (all_reduce), the destination's (reduce) or
        its output (reduce_scatter); barrier (every result written; nobody reads a buffer
        any more, so the caller may overwrite it). Only rank r reads or writes part r of any
        buffer between the barriers. Ranks scaling by different PREMUL_SUM factors run the
        call on MPI (all of them, after the header check)."""
        self.sym_calls += 1
        plan: _Plan = call.how
        rank = self.rank
        arrays = alloc.arrays(off, x.dtype, x.size)
        parts = plan.parts
        if parts is None:
            parts = plan.parts = _symmetric_parts(call, self.size, rank, self.piece)
        acc, tmp = self._scratch_for(x.dtype, max((p.stop - p.start for p, _ in parts), default=0))
        scatter = call.spec is O.REDUCE_SCATTER
        target = out if scatter else x if call.spec is O.ALL_REDUCE or call.peer == rank else None
        tick, mine = self._start(seg, call, plan, alloc.id, off, target)
        lost = ""  # reduce_scatter: why this rank could not write its output (only its own)
        own_block: np.ndarray | None = None
        private: np.ndarray | None = None
        with np.errstate(all="ignore"):
            self._barrier()
            if self._check(seg, call, mine, tick % 2):
                self.tick = tick + 1
                return self._fallback(call, x, out, None)
            if scatter:
                dest = _flat(out)
                flat = _flat(x)
                # an output inside the input: exactly its own block (torch's in-place form,
                # read by no peer) is folded in place where the order allows it (rank 0, or
                # rank 1 without PREMUL_SUM's scaling), else from a copy of each piece; any
                # other overlap is written into a private block, copied out at the end
                if np.may_share_memory(flat, dest):
                    if _is_own_block(call, rank, flat, dest):
                        if not _folds_in_place(rank, plan):
                            own_block = acc  # the piece copy (reduce_scatter has no acc)
                    else:
                        private, lost = _private_block(dest)
                for src, dst in parts if not lost else ():
                    m = dst.stop - dst.start
                    into = (dest if private is None else private)[dst]
                    if own_block is None:
                        _fold_from(plan, arrays, src, into, tmp[:m])
                    else:
                        mine_piece = own_block[:m]
                        np.copyto(mine_piece, arrays[rank][src])
                        pieces = [mine_piece if j == rank else a[src] for j, a in enumerate(arrays)]
                        _fold_from(plan, pieces, slice(None), into, tmp[:m])
                    _finish(plan, into)
            else:
                targets = arrays if call.spec is O.ALL_REDUCE else [arrays[call.peer]]
                for src, _ in parts:
                    m = src.stop - src.start
                    a = acc[:m]
                    _fold_from(plan, arrays, src, a, tmp[:m])
                    _finish(plan, a)
                    for t in targets:
                        np.copyto(t[src], a)
            self._barrier()
        self.tick = tick + 1
        return _delivered(out, private, lost) if scatter else x

    def _direct(self, call: Call, x: np.ndarray, out: Any, seg: _Segment, cma: _Cma) -> Any:
        """A call on ordinary arrays, single copy: every rank publishes its array's address
        in its header; barrier; rank r reduces its part (all_reduce, reduce; block r for
        reduce_scatter) a piece (in cache) at a time, reading each peer's piece with
        ``process_vm_readv`` in the order rank 0, 1, ..., p-1, and writes each reduced piece
        into its own array and, with ``process_vm_writev``, every peer's (all_reduce) or the
        destination's (reduce); reduce_scatter folds straight into its output; barrier.
        Only rank r reads or writes part r of any array between the barriers; a peer reads
        part r of this rank's array before it writes the result there. Across nodes
        (all_reduce) each piece's node sum is all_reduced among the ranks with the same
        local rank on every node before it is written."""
        self.direct_calls += 1
        plan: _Plan = call.how
        if self.cross is not None and plan.cross is None:
            plan.cross = self._cross_call(call)
        parts = plan.parts
        if parts is None:
            parts = plan.parts = _symmetric_parts(call, self.size, self.rank, self.piece)
        flat = _flat(x)
        isz = flat.itemsize
        rank = self.rank
        scatter = call.spec is O.REDUCE_SCATTER
        if scatter:
            writes: list[int] = []
            keep = False
        elif call.spec is O.ALL_REDUCE:
            writes = [j for j in range(self.size) if j != rank]
            keep = True
        else:
            writes = [call.peer] if call.peer != rank else []
            keep = call.peer == rank
        # the result may be folded in place where this rank's own input is read before
        # anything is written over it: rank 0, or rank 1 without PREMUL_SUM's scaling
        foldable = _folds_in_place(rank, plan)
        in_place = keep and foldable
        dest = _flat(out) if scatter else flat
        # reduce_scatter into exactly its own block (torch's in-place form): each piece is
        # folded in place where the rules above allow it, else from a copy of the piece
        alias = False
        failed = ""  # why this rank could not do its part (every rank learns it at the end)
        try:  # whatever fails here is told to every rank at the end, not left unsaid
            m = max((p.stop - p.start for p, _ in parts), default=0)
            acc_buf, tmp = self._scratch_for(x.dtype, m)
            if scatter and np.may_share_memory(flat, dest):
                if _is_own_block(call, rank, flat, dest):
                    alias = True
                    in_place = foldable
                else:  # elsewhere in the input: the peers read a copy, and so does this rank
                    flat = flat.copy()
        except Exception as exc:  # noqa: BLE001 - a MemoryError, say
            failed = f"{type(exc).__name__}: {exc}"
        target = out if scatter else x if keep else None
        tick, mine = self._start(seg, call, plan, _DIRECT, -1, target)
        base = flat.ctypes.data  # the pieces' addresses are worked out from these three
        seg.headers[rank, tick % 2, _ADDR] = base
        dest_base = dest.ctypes.data if scatter else base
        buf_a, buf_b = self._scratch_at
        lane = cma.lane()
        pids = self.pids
        try:
            with np.errstate(all="ignore"):
                self._barrier()
                if self._check(seg, call, mine, tick % 2):  # factors differ: all on MPI
                    self.tick = tick + 1
                    return self._fallback(call, x, out, None)
                addrs = seg.headers[:, tick % 2, _ADDR].tolist()
                try:  # peers' arrays in their arenas, read and written in place
                    views = self._mapped(addrs, flat)
                except Exception as exc:  # noqa: BLE001 - every rank must hear of it
                    views, failed = [None] * self.size, failed or self._failure(exc)
                cross = plan.cross  # across nodes: each piece's all_reduce among the nodes
                for src, dst in parts:
                    m = src.stop - src.start
                    if failed and cross is None:
                        break
                    if not failed:
                        try:
                            own = flat[src]
                            at = src.start * isz
                            if scatter:
                                acc, acc_at = dest[dst], dest_base + dst.start * isz
                            elif in_place:
                                acc, acc_at = own, base + at
                            else:
                                acc, acc_at = acc_buf[:m], buf_a
                            if alias:  # acc is this piece of the input itself
                                if in_place:
                                    own = acc
                                else:  # reduce_scatter has no other use for acc_buf
                                    own = acc_buf[:m]
                                    np.copyto(own, acc)
                            _fold_direct(plan, lane, pids, addrs, views, src, at, rank, own,
                                         (acc, acc_at), (tmp[:m], buf_b))  # fmt: skip
                        except Exception as exc:  # noqa: BLE001 - every rank must hear of it
                            failed = self._failure(exc)
                    if failed:  # the other nodes' ranks still wait in each piece's cross-node
                        # all_reduce: this rank joins them (their result is refused anyway)
                        _finish(plan, self._scratch[1].view(x.dtype)[:m])
                        continue
                    _finish(plan, acc)
                    try:
                        if keep and acc is not own:
                            np.copyto(own, acc)
                        for j in writes:
                            view = views[j]
                            if view is not None:
                                np.copyto(view[src], acc)
                            else:
                                lane.write(j, pids[j], addrs[j] + at, acc_at, acc.nbytes)
                    except Exception as exc:  # noqa: BLE001 - every rank must hear of it
                        failed = self._failure(exc)
                # the end: every rank has done its part, or some rank could not (then
                # every rank raises, instead of returning a result with a part missing)
                verdict = self._verdict
                verdict[0] = 1 if failed else 0
                here, most = self._max_in_place
                self.host.mpi.Allreduce(here, verdict, op=most)
        except (_Said, InvalidArgumentError):  # the header check: every rank raises there,
            raise  # nobody read or wrote anything
        except BaseException:  # interrupted (SIGINT), or a peer's failure (ULFM) in a
            # barrier: a peer may still be reading or writing this array: keep its memory
            self._held.append(flat)
            raise
        self.tick = tick + 1
        if verdict[0]:
            reasons = self.host.mpi.allgather(failed)
            said = "; ".join(f"rank {r} {w}" for r, w in enumerate(reasons) if w)
            raise _Said(  # every rank is out of the call: the group goes on
                BackendError,
                f"the single-copy path failed: {said}; the result is incomplete on every rank",
            )
        return out if scatter else x

    def _mapped(self, addrs: list[int], flat: np.ndarray) -> list[np.ndarray | None]:
        """Each peer's array of a single-copy call (``addrs``: every rank's address of it,
        the same dtype and size as ``flat``, this rank's) as a view of the peer's arena
        mapped here, where it lies in one (see hpccomm.arena); None for this rank and for
        peers whose array the kernel moves (process_vm_readv/writev)."""
        views: list[np.ndarray | None] = [None] * self.size
        found = 0
        for j, peer in enumerate(self.peers):
            if isinstance(peer, arena.PeerArena) and peer.holds(addrs[j], flat.nbytes):
                views[j] = np.frombuffer(peer.mm, flat.dtype, flat.size, addrs[j] - peer.base)
                found += 1
        if found == self.size - 1:  # (every peer: a group here has two ranks or more)
            self.mapped_calls += 1
        return views

    def _failure(self, exc: Exception) -> str:
        """What this rank says of its failure in a single-copy call (group rank numbers)."""
        if isinstance(exc, _Unreachable):
            return (f"could not reach rank {self.members[exc.rank]}'s array (process id "
                    f"{self.pids[exc.rank]}): {exc.reason}")  # fmt: skip
        return f"{type(exc).__name__}: {exc}"

    def _scratch_for(self, dtype: np.dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The two private piece buffers as ``n`` elements of ``dtype`` (``n`` is at most
        one piece of ``self.piece`` bytes: see _symmetric_parts)."""
        a, b = self._scratch
        return a.view(dtype)[:n], b.view(dtype)[:n]

    def _cross_call(self, call: Call) -> Call:
        """The cross-node all_reduce of a slice: the same call, prepared on the cross
        communicator, with AVG and PREMUL_SUM summing (scaling happened at copy-in)."""
        cross = call.piece(call.count)
        if call.redop.name in ("AVG", "PREMUL_SUM"):
            cross.redop = ReduceOp.SUM
        self.cross.prepare(cross)
        return cross

    # -- bodies ---------------------------------------------------------------------------

    def _enter(
        self, call: Call, x: np.ndarray, out: Any, stream: Any, plan: _Plan
    ) -> tuple[_Segment | None, Any]:
        """Where a body's call runs: (the segment, None) for the copy path, else (None, the
        result) after running it on MPI (outside the copy path's sizes, or no segment) or on
        symmetric buffers (``x`` inside one of the group's allocations)."""
        found = self._locate(x) if self.allocs else None
        if found is None and not plan.copies and not plan.direct:
            return None, self._fallback(call, x, out, stream)
        seg = self._ensure(call)
        if seg is None:
            return None, self._fallback(call, x, out, stream)
        if found is not None:
            return None, self._symmetric(call, x, out, seg, *found)
        if plan.direct and self.cma is not None:  # the probe agreed on every rank
            return None, self._direct(call, x, out, seg, self.cma)
        if not plan.copies:
            return None, self._fallback(call, x, out, stream)
        self.calls += 1
        return seg, None

    def _all_reduce(self, call: Call, x: np.ndarray, out: Any, stream: Any) -> np.ndarray:
        """all_reduce and reduce (only ``call.peer`` copies the result out)."""
        plan: _Plan = call.how
        seg, done = self._enter(call, x, out, stream, plan)
        if seg is None:
            return done
        if self.cross is not None and plan.cross is None:
            plan.cross = self._cross_call(call)
        flat = _flat(x)
        inputs, results = seg.views(x.dtype)
        mine_in, mine_res = inputs[self.rank], results[self.rank]
        chunks = plan.chunks
        tick, mine = self._start(seg, call, plan, target=x if plan.receives else None)
        with np.errstate(all="ignore"):  # overflow to inf, inf - inf: as MPI, no warnings
            for k in range(-1, chunks):
                if k >= 0:
                    self._barrier()
                    if k == 0:
                        self._check(seg, call, mine, tick % 2)
                    # copy out chunk k-1: every rank's result slice
                    if k >= 1 and plan.receives:
                        _copy_out(plan, k - 1, results, (tick + k - 1) % 2, flat)
                    # reduce chunk k: this rank's slice, ranks in order 0, 1, ..., p-1
                    b = (tick + k) % 2
                    lo_hi = plan.mine[k]
                    acc = mine_res[b][: lo_hi.stop - lo_hi.start]
                    _fold(plan, inputs, b, lo_hi, acc)
                    _finish(plan, acc)
                # copy in chunk k+1
                if k + 1 < chunks:
                    src, m = plan.copy_in[k + 1]
                    _copy_in(plan, mine_in[(tick + k + 1) % 2][:m], flat[src])
            self._barrier()
            if plan.receives:  # the last chunk's copy-out
                _copy_out(plan, chunks - 1, results, (tick + chunks - 1) % 2, flat)
        self.tick = tick + chunks
        return x

    def _reduce_scatter(self, call: Call, x: np.ndarray, out: np.ndarray, stream: Any) -> Any:
        """Rank r reduces block r (``call.counts``: elements and offsets per rank) of every
        rank's input, a piece of every block per chunk, straight into its output. An output
        inside the input other than exactly block r (which each chunk's copy-in has read
        before the fold writes it) is written into a private block and copied out at the
        end: later chunks' copy-ins read what the fold would write over."""
        plan: _Plan = call.how
        seg, done = self._enter(call, x, out, stream, plan)
        if seg is None:
            return done
        flat = _flat(x)
        dest = _flat(out)
        private: np.ndarray | None = None
        lost = ""  # why this rank could not write its output (its own result only)
        if np.may_share_memory(flat, dest) and not _is_own_block(call, self.rank, flat, dest):
            private, lost = _private_block(dest)
        into = dest if private is None else private
        inputs, _ = seg.views(x.dtype)
        mine_in = inputs[self.rank]
        chunks = plan.chunks
        tick, mine = self._start(seg, call, plan, target=out)
        with np.errstate(all="ignore"):
            for k in range(-1, chunks):
                if k >= 0:
                    self._barrier()
                    if k == 0:
                        self._check(seg, call, mine, tick % 2)
                    reduced = plan.mine[k]
                    if reduced is not None and not lost:
                        dst, lo_hi = reduced
                        _fold(plan, inputs, (tick + k) % 2, lo_hi, into[dst])
                        _finish(plan, into[dst])
                if k + 1 < chunks:
                    area = mine_in[(tick + k + 1) % 2]
                    for src, dst in plan.copy_in[k + 1]:
                        _copy_in(plan, area[dst], flat[src])
        self.tick = tick + chunks
        return _delivered(out, private, lost)


# This rank's regions of the symmetric buffers mapped in this process (however their group
# ended), for a fork() child: {key: (address, bytes, offset in the file)}
_LIVE: dict[int, tuple[int, int, int]] = {}
_live_keys = iter(range(1, 2**62))


def _live_mapping(base: np.ndarray, addr: int, length: int, offset: int) -> None:
    """Keep this rank's region of a symmetric buffer (``length`` bytes at ``addr``, at
    ``offset`` in its file) in _LIVE while ``base``, the array its views share, lives (the
    buffer's mapping keeps a descriptor of the file: _mmap's ``keep_fd``)."""
    key = next(_live_keys)
    _LIVE[key] = (addr, length, offset)
    weakref.finalize(base, _LIVE.pop, key, None)


def _fd_of(addr: int) -> int:
    """A descriptor of this process open on the file mapped at ``addr`` (its device and
    inode from /proc/self/maps, matched against /proc/self/fd); OSError where none is."""
    ident = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, _, hi = fields[0].partition("-")
            if int(lo, 16) <= addr < int(hi, 16):
                major, _, minor = fields[3].partition(":")
                ident = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
                break
    if ident is None or ident[1] == 0:
        raise OSError(errno.ENOENT, f"no file is mapped at {addr:#x}")
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.fstat(int(name))
        except (OSError, ValueError):
            continue
        if (st.st_dev, st.st_ino) == ident:
            return int(name)
    raise OSError(errno.ENOENT, f"no descriptor of the file mapped at {addr:#x} is open")


def _private_in_child() -> None:
    """In a fork() child: this rank's region of every symmetric buffer mapped copy-on-write
    (MAP_PRIVATE of the same file at the same address: the views a user holds; the peers'
    regions are hpccomm's alone, and the child cannot communicate), as an ordinary array is
    after fork(): mapped shared, a child's writes (a DataLoader worker's) landed in the
    parent's buffer and the group's next reduction (an outside hunt: 2000 where 2 was
    right). Until the child writes a page, it reads the file's current contents (the
    parent's later calls show there). A child of the child inherits these private pages
    (remapped from the file again, they lost what the child had written, a review): the
    regions done leave the list. One that cannot be made private (no memory to commit, under
    strict overcommit) is mapped shared again, said, and stays listed."""
    if not _LIVE:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.mmap
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_long]  # fmt: skip
    rw = mmap.PROT_READ | mmap.PROT_WRITE
    for key, (addr, length, offset) in list(_LIVE.items()):
        try:
            fd = _fd_of(addr)
        except OSError as exc:
            _said_shared(addr, length, str(exc))
            continue
        if fn(addr, length, rw, mmap.MAP_PRIVATE | _MAP_FIXED, fd, offset) == addr:
            _LIVE.pop(key, None)
            continue
        err = ctypes.get_errno()
        # (a kernel before 6.12 unmaps the old mapping before it finds no memory to commit:
        # map it shared again, or the child's buffer would be gone)
        back = fn(addr, length, rw, mmap.MAP_SHARED | _MAP_FIXED, fd, offset) == addr
        _said_shared(addr, length, os.strerror(err), back)


def _said_shared(addr: int, length: int, why: str, mapped: bool = True) -> None:
    state = (
        "it stays shared with the parent, whose group's reductions see what the child writes there"
        if mapped
        else "and could not map it again: touching it ends this child (SIGSEGV)"
    )
    print(
        f"hpccomm: a fork() child (pid {os.getpid()}) could not make its symmetric buffer "
        f"at {addr:#x} ({length} bytes) copy-on-write ({why}): {state}",
        file=sys.stderr,
        flush=True,
    )


_MAP_FIXED = 0x10  # (Linux, every architecture)
os.register_at_fork(after_in_child=_private_in_child)


def _mmap(fd: int, total: int, keep_fd: bool = False) -> mmap.mmap:
    """A shared mapping of ``total`` bytes of file ``fd``. Python's mmap keeps a duplicate of
    the descriptor for its size() and resize(), which nothing here uses: from Python 3.13
    (``trackfd=False``) it keeps none, unless ``keep_fd`` (symmetric buffers: a fork() child
    reopens the file through it, see _private_in_child); before 3.13 always one."""
    if sys.version_info >= (3, 13) and not keep_fd:
        return mmap.mmap(fd, total, trackfd=False)
    return mmap.mmap(fd, total)


def _map_shared(mpi: Any, rank: int, total: int, keep_fd: bool = False) -> tuple[Any, str]:
    """Collective over ``mpi``: a zero-filled shared memory file of ``total`` bytes mapped by
    every rank. Returns the mapping, or None on every rank with the reasons when some rank
    failed. First a nameless file (:func:`_map_memfd`): nothing is left behind whatever
    happens to the job; where a rank cannot reach it, a named file in /dev/shm
    (:func:`_map_named`)."""
    mm, why = _map_memfd(mpi, rank, total, keep_fd)
    if mm is not None:
        return mm, ""
    mm, named = _map_named(mpi, rank, total, keep_fd)
    return mm, "" if mm is not None else f"{named} (nameless file: {why})"


def _room_for(total: int) -> None:
    """Raise OSError(ENOMEM) where ``total`` bytes are more than the node's available memory
    (MemAvailable): the file's pages are committed when it is sized, and a nameless file is
    not bounded by /dev/shm's size, so a symmetric buffer larger than memory set the
    kernel's out-of-memory killer on some process of the node (measured: comm.empty(10**13)
    killed a rank) instead of failing here."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(
                int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")
            )
    except (OSError, StopIteration, ValueError, IndexError):
        return  # (not Linux's /proc: posix_fallocate decides)
    if total > avail:
        raise OSError(
            errno.ENOMEM,
            f"{total:,} bytes asked, {avail:,} available on this node (MemAvailable)",
        )


def _map_memfd(mpi: Any, rank: int, total: int, keep_fd: bool = False) -> tuple[Any, str]:
    """Rank 0 makes a nameless file (``memfd_create``, sized with ``posix_fallocate``: ENOSPC
    here, not SIGBUS on first touch) and keeps it open until every rank has mapped it; the
    others open it through ``/proc/<pid>/fd/<fd>`` and check that it is the same file (its
    device and inode: in another PID namespace that path names another process). The
    memory goes when the last mapping does: a job killed at any point leaves nothing in
    /dev/shm (a named file, made and unlinked in two steps, was left behind by a job that
    ended between them: a rank that never joined, then an abort)."""
    fd = -1
    why = ""
    where = None
    if rank == 0:
        try:
            _room_for(total)
            fd = os.memfd_create("hpccomm-shm", os.MFD_CLOEXEC)
            os.posix_fallocate(fd, 0, total)
            st = os.fstat(fd)
            where = (os.getpid(), fd, st.st_dev, st.st_ino)
        except (OSError, AttributeError) as exc:  # AttributeError: no memfd_create here
            why = f"memfd_create: {exc}"
            if fd >= 0:
                os.close(fd)
                fd = -1
    mm = None
    try:
        where = mpi.bcast(where, root=0)
        if where is not None:
            pid, theirs, dev, ino = where
            mine, why = (fd, "") if rank == 0 else arena.open_file_of(pid, theirs, dev, ino)
            if mine >= 0:
                try:
                    mm = _mmap(mine, total, keep_fd)
                except OSError as exc:
                    why = f"could not open /proc/{pid}/fd/{theirs}: {exc}"
                finally:
                    if mine != fd:
                        os.close(mine)
        reasons = mpi.allgather(why if mm is None else "")
    except BaseException:  # a peer failed (ULFM) or the call was interrupted: keep nothing
        if mm is not None:
            mm.close()
        raise
    finally:
        if fd >= 0:
            os.close(fd)  # every rank has mapped it or given up; the mappings keep it
    return _agreed(mm, reasons)


def _agreed(mm: Any, reasons: list[str]) -> tuple[Any, str]:
    """The mapping if every rank made it (``reasons``: each rank's, empty where it did);
    otherwise None and the ranks' reasons (this rank's mapping closed: nothing exported)."""
    bad = "; ".join(f"rank {r}: {w}" for r, w in enumerate(reasons) if w)
    if bad or mm is None:
        if mm is not None:
            mm.close()
        return None, bad or "no segment"
    return mm, ""


def _map_named(mpi: Any, rank: int, total: int, keep_fd: bool = False) -> tuple[Any, str]:
    """Rank 0 creates a file of ``total`` bytes in /dev/shm (``posix_fallocate``), every
    rank maps it, rank 0 unlinks it once all have (the mappings stay)."""
    path = None
    why = ""
    if rank == 0:
        path = os.path.join(SHM_DIR, f"hpccomm-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                _room_for(total)
                os.posix_fallocate(fd, 0, total)
            finally:
                os.close(fd)
        except OSError as exc:
            why = f"could not create {path} ({total} bytes): {exc}"
            if os.path.exists(path):
                os.unlink(path)
            path = None
    mm = None
    try:
        path = mpi.bcast(path, root=0)
        if path is not None:
            try:
                fd = os.open(path, os.O_RDWR)
                try:
                    mm = _mmap(fd, total, keep_fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                why = f"could not map {path}: {exc}"
        reasons = mpi.allgather(why if mm is None else "")
    except BaseException:
        if mm is not None:
            mm.close()
        raise
    finally:
        if rank == 0 and path is not None:  # every rank has mapped it, given up, or failed
            try:
                os.unlink(path)
            except OSError:
                pass
    return _agreed(mm, reasons)


def _is_own_block(call: Call, rank: int, flat: np.ndarray, dest: np.ndarray) -> bool:
    """True when a reduce_scatter output is exactly this rank's own block of its input
    (torch's in-place reduce_scatter_tensor; no peer reads that block); any other overlap
    lets the peers read what is written over."""
    counts, displs = call.counts
    block = flat[displs[rank] : displs[rank] + counts[rank]]
    return dest.ctypes.data == block.ctypes.data and dest.nbytes == block.nbytes


def _folds_in_place(rank: int, plan: _Plan) -> bool:
    """Whether this rank may fold the result into its own input: its input is read before
    anything is written over it (rank 0, or rank 1 without PREMUL_SUM's scaling)."""
    return rank == 0 or (rank == 1 and plan.factor is None)


def _private_block(dest: np.ndarray) -> tuple[np.ndarray | None, str]:
    """A private block for a reduce_scatter output that lies inside the input elsewhere
    than its own block (the input must stay as it is until the call ends), or None and why
    there is none (only this rank's own result is then lost)."""
    try:
        return np.empty_like(dest), ""
    except MemoryError as exc:
        return None, f"no memory for a private copy of the output: {exc}"


def _delivered(out: Any, private: np.ndarray | None, lost: str) -> Any:
    """reduce_scatter's end (after its last barrier): the private block copied into the
    output, or this rank's error when it had none."""
    if lost:
        raise _Said(BackendError, f"{lost}; the other ranks' results are complete")
    if private is not None:
        np.copyto(_flat(out), private)
    return out


class _Said(Exception):
    """An error a body found (``kind``, ``text``); :meth:`ShmBackend.error` makes it
    ``kind`` with the call's name and number in front (a body does not know its number)."""

    def __init__(self, kind: type[HpccommError], text: str) -> None:
        super().__init__(text)
        self.kind = kind
        self.text = text


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Unreachable(Exception):
    """A peer's memory could not be read or written (the single-copy path)."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(rank, reason)
        self.rank = rank
        self.reason = reason


class _Cma:
    """Linux cross-memory attach: ``process_vm_readv`` / ``process_vm_writev`` of one
    contiguous range between this process and another of the same user (the kernel
    copies directly between the two address spaces; ctypes releases the GIL for it).
    Allowed where this process may ptrace the other (same user; Yama's ptrace_scope 0, or
    CAP_SYS_PTRACE; a container's seccomp profile may refuse it): :func:`_probe_cma`
    checks before anything runs on it. A call's pieces go through a :class:`_Lane`."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        # no argtypes: every argument is passed as a ready ctypes object (a byref, a
        # c_ulong) or a pid, which ctypes then hands over without converting it (typed
        # arguments cost about 2.5 us more per call)
        self.readv = libc.process_vm_readv
        self.writev = libc.process_vm_writev
        for fn in (self.readv, self.writev):
            fn.restype = ctypes.c_ssize_t

    def lane(self) -> _Lane:
        """A mover for one call (or thread): its own two iovecs, reused piece after piece."""
        return _Lane(self)

    def read(self, rank: int, pid: int, addr: int, into: np.ndarray) -> None:
        """``into.nbytes`` bytes from address ``addr`` of process ``pid`` (rank ``rank``)."""
        self.lane().read(rank, pid, addr, into.ctypes.data, into.nbytes)

    def write(self, rank: int, pid: int, addr: int, data: np.ndarray) -> None:
        """``data`` to address ``addr`` of process ``pid`` (rank ``rank``)."""
        self.lane().write(rank, pid, addr, data.ctypes.data, data.nbytes)


_ONE = ctypes.c_ulong(1)
_NO_FLAGS = ctypes.c_ulong(0)


class _Lane:
    """Moves pieces between this process and peers by address: two iovecs made once and
    pointed at each piece in turn. Per 256 KiB piece the kernel's copy takes about 25 us
    here and its fixed cost about 1.5 us; making the ctypes objects of a call afresh
    (iovecs, ``ndarray.ctypes``, typed arguments) took 8-10 us more, a third of a 4 MiB
    all_reduce's time at 2 ranks. Not shared between threads."""

    __slots__ = ("_readv", "_writev", "_mine", "_theirs", "_pm", "_pt")

    def __init__(self, cma: _Cma) -> None:
        self._readv = cma.readv
        self._writev = cma.writev
        self._mine = _IoVec()
        self._theirs = _IoVec()
        self._pm = ctypes.byref(self._mine)
        self._pt = ctypes.byref(self._theirs)

    def read(self, rank: int, pid: int, addr: int, local: int, n: int) -> None:
        """``n`` bytes from address ``addr`` of process ``pid`` (rank ``rank``) to this
        process's address ``local``."""
        self._move(self._readv, rank, pid, addr, local, n)

    def write(self, rank: int, pid: int, addr: int, local: int, n: int) -> None:
        """``n`` bytes from this process's address ``local`` to address ``addr`` of process
        ``pid`` (rank ``rank``)."""
        self._move(self._writev, rank, pid, addr, local, n)

    def _move(self, fn: Any, rank: int, pid: int, addr: int, local: int, n: int) -> None:
        if n == 0:
            return
        mine, theirs = self._mine, self._theirs
        mine.base = local
        mine.len = n
        theirs.base = addr
        theirs.len = n
        done = fn(pid, self._pm, _ONE, self._pt, _ONE, _NO_FLAGS)
        if done != n:
            err = ctypes.get_errno() if done < 0 else 0
            why = os.strerror(err) if err else f"{done} of {n} bytes moved"
            raise _Unreachable(rank, f"{fn.__name__}: {why}")


def _probe_cma(mpi: Any, rank: int, size: int) -> tuple[_Cma | None, list[int], str, list[Any]]:
    """Collective over ``mpi``: can every rank read and write every other rank's memory
    (:class:`_Cma`)? Each rank publishes its process id, a random token and an inbox; each
    reads every peer's token and writes its own into the peer's inbox; then each checks its
    inbox. Returns (the mover, every rank's process id, "") when all of it worked on every
    rank, else (None, [], the ranks' reasons), alike on every rank; and every rank's arena
    (:func:`hpccomm.arena.mine`: None where it has none). The token also catches ranks in
    different PID namespaces, where a process id names another process."""
    token = np.frombuffer(os.urandom(8), np.int64).copy()
    inbox = np.zeros(size, np.int64)
    why = ""
    cma: _Cma | None = None
    try:
        cma = _Cma()
    except (OSError, AttributeError) as exc:  # AttributeError: no such function in libc
        why = f"no process_vm_readv here: {exc}"
    me = (os.getpid(), token.ctypes.data, inbox.ctypes.data, int(token[0]), arena.mine())
    everyone = mpi.allgather(me)
    if cma is not None:
        got = np.zeros(1, np.int64)
        for j, (pid, at, box, value, _) in enumerate(everyone):
            if j == rank:
                continue
            try:
                cma.read(j, pid, at, got)
                if int(got[0]) != value:
                    why = f"process {pid} is not rank {j} here (another PID namespace?)"
                    break
                cma.write(j, pid, box + 8 * rank, token)
            except _Unreachable as exc:
                why = f"rank {j} (process {pid}): {exc.reason}"
                break
    reasons = mpi.allgather(why)  # also: every write into the inboxes is done
    if not any(reasons):
        wrong = [j for j in range(size) if j != rank and int(inbox[j]) != everyone[j][3]]
        why = f"inbox entries of ranks {wrong} not written" if wrong else ""
        reasons = mpi.allgather(why)
    bad = "; ".join(f"rank {r}: {w}" for r, w in enumerate(reasons) if w)
    if bad:
        return None, [], bad, []
    return cma, [int(e[0]) for e in everyone], "", [e[4] for e in everyone]


class _Allocation:
    """One symmetric buffer: every rank's region of the shared file (``raws``, bytes), this
    rank's region's address range, and typed views of the parts calls have used."""

    __slots__ = ("id", "raws", "start", "region", "views")

    def __init__(self, ident: int, mm: Any, size: int, region: int, rank: int) -> None:
        self.id = ident
        self.region = region
        self.raws = [np.frombuffer(mm, np.uint8, region, r * region) for r in range(size)]
        self.start: int = self.raws[rank].ctypes.data
        self.views: dict[tuple[int, np.dtype, int], list[np.ndarray]] = {}

    def arrays(self, off: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        """Every rank's ``count`` elements of ``dtype`` at byte ``off`` of its region."""
        key = (off, dtype, count)
        got = self.views.get(key)
        if got is None:
            if len(self.views) >= 64:
                self.views.clear()
            end = off + count * dtype.itemsize
            got = self.views[key] = [raw[off:end].view(dtype) for raw in self.raws]
        return got


def _symmetric_parts(call: Call, size: int, rank: int, nbytes: int) -> list[tuple[slice, slice]]:
    """The pieces (of at most ``nbytes``) this rank reduces on symmetric buffers and single
    copy: (elements of the arrays, the same piece's place in the output). all_reduce/reduce:
    part ``rank`` of the array (cut as the copy path cuts a chunk, on cache lines);
    reduce_scatter: block ``rank``."""
    itemsize = call.dtype_info().dtype.itemsize
    piece = max(1, nbytes // itemsize)
    if call.spec is O.REDUCE_SCATTER:
        counts, displs = call.counts
        lo, hi, base = displs[rank], displs[rank] + counts[rank], displs[rank]
    else:
        align = max(1, _ALIGN // itemsize)
        n = call.count
        cuts = [0] + [(r * n // size) // align * align for r in range(1, size)] + [n]
        lo, hi, base = cuts[rank], cuts[rank + 1], 0
    return [
        (slice(t, min(t + piece, hi)), slice(t - base, min(t + piece, hi) - base))
        for t in range(lo, hi, piece)
    ]


def _into(f: Any, a: Any, b: Any, out: np.ndarray) -> None:
    """``f(a, b, out=out)`` (casting as the dtype's rounding wants: unsafe), the same
    whether ``out`` is ``a``, ``b`` or neither. NumPy rounds a 1-element complex multiply
    whose output is one of its inputs differently from one whose output is not (13-42 of
    100 random values, NumPy 2.4; never from 2 to 1,001 elements), and the forms of the path
    alias different steps: single copy was 1 ulp off the copy path and MPI in a piece of one
    element (an outside hunt). So such a step is computed into a fresh element."""
    if out.size == 1 and out.dtype.kind == "c":
        fresh = np.empty_like(out)
        f(a, b, out=fresh, casting="unsafe")
        out[...] = fresh
    else:
        f(a, b, out=out, casting="unsafe")


def _fold(
    plan: _Plan, inputs: list[list[np.ndarray]], b: int, part: slice, acc: np.ndarray
) -> None:
    """Reduce ``part`` of buffer ``b`` over every rank's input into ``acc``, in the fixed
    order rank 0, 1, ..., p-1, with ufuncs writing into ``acc`` (AVG: see _finish)."""
    f = plan.f
    _into(f, inputs[0][b][part], inputs[1][b][part], acc)
    for j in range(2, len(inputs)):
        _into(f, acc, inputs[j][b][part], acc)


def _fold_pieces(plan: _Plan, size: int, piece: Callable[[int, np.ndarray], np.ndarray],
                 acc: np.ndarray, tmp: np.ndarray, first: np.ndarray) -> None:  # fmt: skip
    """Reduce one piece of every rank's input into ``acc``, in the fixed order rank 0, 1,
    ..., p-1, as _copy_in + _fold do (PREMUL_SUM scales each input into ``tmp``, rounded to
    the dtype), so the result is bitwise the copy path's. ``piece(j, into)`` gives rank j's
    piece: a view of it, or ``into`` filled with it (``first`` for rank 0's without
    PREMUL_SUM, ``acc`` with it, ``tmp`` for the others)."""
    f, factor = plan.f, plan.factor
    if factor is None:
        _into(f, piece(0, first), piece(1, tmp), acc)
        for j in range(2, size):
            _into(f, acc, piece(j, tmp), acc)
        return
    _into(np.multiply, piece(0, acc), factor, acc)
    for j in range(1, size):
        _into(np.multiply, piece(j, tmp), factor, tmp)
        _into(f, acc, tmp, acc)


def _fold_from(plan: _Plan, arrays: list[np.ndarray], part: slice, acc: np.ndarray,
               tmp: np.ndarray) -> None:  # fmt: skip
    """Reduce ``part`` of every rank's symmetric buffer into ``acc`` (:func:`_fold_pieces`
    on views of the buffers)."""
    _fold_pieces(plan, len(arrays), lambda j, _: arrays[j][part], acc, tmp, acc)


def _fold_direct(plan: _Plan, lane: _Lane, pids: list[int], addrs: list[int],
                 views: list[np.ndarray | None], src: slice, at: int, rank: int,
                 own: np.ndarray, acc: tuple[np.ndarray, int],
                 tmp: tuple[np.ndarray, int]) -> None:  # fmt: skip
    """Reduce one piece of every rank's array into ``acc`` (:func:`_fold_pieces`): ``own``
    is this rank's piece; a peer's array mapped here (``views``) gives its piece ``src`` in
    place; the others are read from byte ``at`` of each rank's array
    (``addrs``) into ``acc`` (rank 0's, where ``acc`` is not ``own``) or ``tmp``. ``acc``
    and ``tmp`` come with their addresses (the lane moves by address). ``acc`` may be
    ``own`` on rank 0, and on rank 1 without PREMUL_SUM (each step reads this rank's input
    before writing over it)."""
    into_acc, acc_at = acc
    into_tmp, tmp_at = tmp
    n = into_tmp.nbytes

    def piece(j: int, into: np.ndarray) -> np.ndarray:
        if j == rank:
            return own
        view = views[j]
        if view is not None:
            return view[src]
        lane.read(j, pids[j], addrs[j] + at, acc_at if into is into_acc else tmp_at, n)
        return into

    first = into_tmp if into_acc is own else into_acc
    _fold_pieces(plan, len(addrs), piece, into_acc, into_tmp, first)


def _finish(plan: _Plan, acc: np.ndarray) -> None:
    """After the node's fold: the cross-node all_reduce of the slice (hierarchical path)."""
    if plan.cross is not None:
        plan.cross.body(plan.cross, acc, None, None)


def _copy_in(plan: _Plan, dst: np.ndarray, src: np.ndarray) -> None:
    """This rank's input into its area of the segment (PREMUL_SUM, AVG: the scaled input,
    rounded to the dtype as MPI's path rounds it)."""
    if plan.factor is None:
        np.copyto(dst, src)
    else:
        _into(np.multiply, src, plan.factor, dst)


def _copy_out(
    plan: _Plan, k: int, results: list[list[np.ndarray]], b: int, flat: np.ndarray
) -> None:
    """Chunk ``k``'s result slices of every rank (buffer ``b``) into this rank's array."""
    for into, j, m in plan.copy_out[k]:
        np.copyto(flat[into], results[j][b][:m])


class _Plan:
    """What a call's body needs, computed once per call description (kept in ``call.how``):
    the ufunc, PREMUL_SUM's or AVG's factor, the header words, and per chunk the slices to
    copy in, to reduce and to copy out."""

    __slots__ = ("f", "factor", "words", "chunks", "copy_in", "mine", "copy_out",
                 "receives", "copies", "divisor", "plain", "cross", "parts",
                 "direct", "factor_id")  # fmt: skip

    def __init__(self, call: Call, size: int, rank: int, chunk: int, copies: bool,
                 divisor: int, direct: bool = False) -> None:  # fmt: skip
        self.copies = copies  # False: in range only for symmetric buffers (others: MPI)
        self.direct = direct  # in the single-copy path's range (when the probe allows it)
        self.divisor = divisor  # the group's size (AVG: its factor 1/size)
        self.plain: Call | None = None  # the MPI call of the fallback (made on first use)
        self.cross: Call | None = None  # the cross-node all_reduce (hierarchical path)
        self.parts: list[tuple[slice, slice]] | None = None  # symmetric buffers' pieces
        info = call.dtype_info()
        name = call.redop.name
        self.f = _UFUNCS[(info.category, name)]
        self.factor = call.redop.prescale(divisor)  # (AVG's too: 1/size, as on MPI's path)
        # ranks may scale by different factors (the sum of f_r * x_r): those who reduce
        # others' inputs compare them (the same in every process: type and value)
        self.factor_id = zlib.crc32(f"{type(self.factor).__name__}:{self.factor!r}".encode())
        itemsize = info.dtype.itemsize
        align = max(1, _ALIGN // itemsize)
        n = call.count
        root = call.peer if call.spec is O.REDUCE else -1
        # uneven reduce_scatter: the blocks too (hash of ints: the same in every process)
        blocks = hash(tuple(call.counts[0])) & 0x3FFFFFFFFFFFFFFF if call.uneven else 0
        self.receives = call.spec is not O.REDUCE or root == rank
        self.copy_in: list[Any] = []
        self.mine: list[Any] = []
        self.copy_out: list[list[tuple[slice, int, int]]] = []
        if call.spec is O.REDUCE_SCATTER:
            counts, displs = call.counts
            piece = chunk // itemsize // size  # elements per block and chunk
            piece = piece // align * align or piece
            self.chunks = max(1, -(-max(counts) // piece))
            for k in range(self.chunks):
                t = k * piece
                moves = []
                for j in range(size):
                    m = min(piece, counts[j] - t)
                    if m > 0:
                        src = slice(displs[j] + t, displs[j] + t + m)
                        moves.append((src, slice(j * piece, j * piece + m)))
                self.copy_in.append(moves)
                m = min(piece, counts[rank] - t)
                lo = rank * piece
                self.mine.append((slice(t, t + m), slice(lo, lo + m)) if m > 0 else None)
        else:
            per = chunk // itemsize  # elements per chunk
            # at least one chunk: a call of 0 elements still meets its peers' (the header
            # check, the ticks); it folds and copies nothing
            self.chunks = max(1, -(-n // per))
            for k in range(self.chunks):
                start = k * per
                m = min(per, n - start)
                cuts = [0] + [(r * m // size) // align * align for r in range(1, size)] + [m]
                self.copy_in.append((slice(start, start + m), m))
                self.mine.append(slice(cuts[rank], cuts[rank + 1]))
                self.copy_out.append(
                    [
                        (slice(start + cuts[j], start + cuts[j + 1]), j, cuts[j + 1] - cuts[j])
                        for j in range(size)
                    ]
                )
        words = [_SPECS.index(call.spec), _DTYPE_CODES[info.dtype], _OP_CODES[name], n, root,
                 blocks, 0, 0, -1, 0]  # fmt: skip
        # the last four words, set per call: its sequence number in the group, symmetric
        # buffer id (0: none), its byte offset, and the tick
        self.words = np.array(words, np.int64)
