"""Seeded, randomized differential tests: every hpccomm operation against a NumPy reference,
at any world size (and against torch.distributed's gloo backend where torch is installed).

How it works
- One seed (``HPCCOMM_DIFF_SEED``, default below) and the world size give the case list. Every
  rank draws the same list, so all ranks issue the same calls in the same order. Every rank's
  input is made locally from (seed, world size, case index, world rank), so each rank computes
  the expected result of every case without communicating.
- Sampling: first coverage (every op x dtype x variant at each world size; reductions rotate
  their ReduceOps through the variants, with a different rotation at each world size), then
  "hot spots" (integer SUM/PRODUCT near the limits of the type, PREMUL_SUM/AVG on the
  non-blocking paths, NaN/inf), then uniform extra cases, then a few cases of at least 1 MiB
  per rank.
- Variants: ``plain`` (no timeout, blocking), ``async`` (async_op=True, then
  ``work.wait(timeout=60)``), ``timeout`` (``comm.timeout = 60``: blocking calls take the
  bounded internal path), ``repeat`` (the same array objects twice, then fresh arrays, then the
  first ones again: hpccomm reuses the validation of repeated calls), ``split`` and ``group`` (the case
  on ``comm.split(rank % 2, key=-rank)`` or ``comm.new_group`` of every other rank reversed, in
  one of the three call modes).
- One test id per case: ``c0123-<op>-<dtype>[-<redop>]-<variant>-<values>-<gloo|numpy-only(...)>``.
  Every rank runs every case to its end before anything is asserted; the ranks then exchange
  what they found over a separate raw MPI communicator, so a failure fails on every rank, lists
  what each rank saw, and starts with a one-line reproduction.
- References: integers are reduced in their own dtype (NumPy wraps around, as torch does), bool
  reductions are logical (SUM/MAX/BOR = OR, PRODUCT/MIN/BAND = AND, BXOR = XOR), AVG = sum/size,
  PREMUL_SUM(f) = sum of f*x_i. Floats are reduced in extended precision (np.longdouble) from
  the stored values and compared within the bound of ``_float_expect``. Data movement (gather,
  scatter, broadcast, point-to-point, ...) must be bit-exact, NaN payloads included.
- MIN/MAX with a NaN input: NumPy (and torch.minimum) propagate NaN, and so does hpccomm (a
  position where hpccomm loses the NaN fails). gloo returns whichever operand the comparison
  keeps, so its answer depends on which rank holds the NaN: gloo's positions are reported as
  xfail (see ``NAN_MINMAX``); every other position of such a case is still checked.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import math
import os
import socket
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from hpccomm import P2POp, ReduceOp
from hpccomm.dtypes import ALLOWED_CATEGORIES, SUPPORTED_DTYPES

SEED = int(os.environ.get("HPCCOMM_DIFF_SEED", "20261130"))
WORLD = MPI.COMM_WORLD.Get_size()
WAIT = 60.0  # seconds: work.wait(timeout=...) and comm.timeout in the bounded variants

# Budget (cases per world size, on top of coverage): sized so the whole file adds at most
# ~90 s to `make test-mpi` (1 + 2 + 3 + 4 ranks) on the 2-core CI machine.
HOT = 48
EXTRA = 40
LARGE = 5

pytestmark = [
    # NaN/inf/overflow arithmetic is the point here (references, hpccomm's 16-bit ops, torch).
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

NAN_MINMAX = (
    "MIN/MAX with NaN inputs: NumPy, torch.minimum/maximum and hpccomm propagate NaN; gloo "
    "keeps whichever operand the comparison picks, so its result depends on which rank holds "
    "the NaN"
)
DISPUTED = "[nan-minmax] "

# ---- the operations, dtypes and variants -------------------------------------------------

DTYPES = {dt.name: dt for dt in SUPPORTED_DTYPES}
CATEGORY = {dt.name: info.category for dt, info in SUPPORTED_DTYPES.items()}
BF16 = np.dtype(ml_dtypes.bfloat16)
REDOPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM")
REAL_FACTORS = (0.5, 2.0, -1.0, 0.1, 1 / 3, 3, 0.0, 1e-3, np.float64(0.25), np.float32(1.5))
COMPLEX_FACTORS = (1j, 0.5 - 2j, np.complex64(2 + 1j))

REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v")
UNEVEN = ("all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v", "all_to_all_single")
BLOCKS = (
    "all_gather",
    "all_gather_v",
    "gather",
    "gather_v",
    "scatter",
    "scatter_v",
    "reduce_scatter",
    "reduce_scatter_v",
    "all_to_all",
    "all_to_all_single",
)
P2P = ("send_recv", "recv_any", "isend_irecv", "sendrecv", "batch_isend_irecv")
ROOTED = (
    "reduce",
    "broadcast",
    "gather",
    "gather_v",
    "scatter",
    "scatter_v",
    "recv_any",
    "broadcast_object",
    "gather_object",
    "scatter_object",
)
OBJECTS = (
    "broadcast_object",
    "all_gather_object",
    "gather_object",
    "scatter_object",
    "send_recv_object",
)
ARRAY_OPS = ("all_reduce", "reduce", "broadcast", *BLOCKS, *P2P)
ALL_OPS = (*ARRAY_OPS, *OBJECTS, "barrier")
VARIANTS = ("plain", "async", "timeout", "repeat", "split", "group")
MODES = ("plain", "async", "timeout")
LARGE_OPS = (
    "all_reduce",
    "reduce",
    "reduce_scatter",
    "all_gather_v",
    "broadcast",
    "scatter_v",
    "all_to_all_single",
    "sendrecv",
)

# Sizes in elements per rank (odd ones and zero included); weights favour the odd middle.
SIZES = (0, 1, 2, 3, 5, 16, 17, 31, 64, 67, 255, 512, 1023, 4097, 65537, 262147)
SIZE_W = np.array([2, 3, 2, 3, 2, 3, 4, 3, 3, 4, 3, 4, 4, 3, 0.6, 0.15])
SIZE_W = SIZE_W / SIZE_W.sum()
ROW_SHAPES = ((), (3,), (2, 3), (17,))


def _dtypes_for(op: str) -> list[str]:
    return ["none"] if op == "barrier" else list(DTYPES)


def _redops_for(op: str, dtype: str) -> list[str | None]:
    if op not in REDUCING:
        return [None]
    return [r for r in REDOPS if CATEGORY[dtype] in ALLOWED_CATEGORIES[r]]


def _variants_for(op: str) -> tuple[str, ...]:
    return tuple(v for v in VARIANTS if not (v == "async" and op in OBJECTS))


def _modes_for(op: str) -> tuple[str, ...]:
    return ("plain", "timeout") if op in OBJECTS else MODES


# ---- gloo: what torch.distributed's gloo backend has (torch 2.13, probed) ----------------

GLOO_NO_DTYPES = ("int16", "uint16", "uint32", "uint64")  # "Invalid scalar type" (not p2p)
GLOO_WANTED = os.environ.get("HPCCOMM_DIFF_GLOO", "1") != "0"
TORCH = GLOO_WANTED and getattr(importlib.util.find_spec("torch"), "origin", None) is not None


def _gloo_lacks(case: Case) -> str | None:
    """What gloo lacks for this case (None: gloo runs it too)."""
    op, dtype, redop = case.op, case.dtype, case.redop
    if op in ("all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v"):
        return f"{op[:-2]}(sizes=)"  # gloo needs equal shapes
    if op == "sendrecv":
        return "sendrecv"
    if op == "send_recv_object" and case.any_src:
        return "recv_object_list(src=None)"
    if op == "recv_any" and case.any_tag:
        return "recv(tag=None)"
    if op == "recv_any" and math.prod(case.shape) == 0:
        return "recv(src=None) of 0 elements"  # never completes (torch 2.13)
    collective = op not in P2P and op not in OBJECTS and op != "barrier"
    if collective and dtype in GLOO_NO_DTYPES:
        return f"{op}/{dtype}"
    if op.startswith("gather") and CATEGORY.get(dtype) == "complex":
        return f"{op}/{dtype}"
    if redop == "PREMUL_SUM":
        return f"{op}/PREMUL_SUM"
    return None


# ---- cases ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    world: int
    index: int
    op: str
    dtype: str  # "none" for barrier
    redop: str | None
    factor: Any  # PREMUL_SUM's factor
    variant: str
    mode: str  # how calls are made: plain, async (async_op=True) or timeout (comm.timeout)
    values: str  # value class: small/full/edge (ints), ints/normal/extreme/inf/nan (floats)
    shape: tuple  # whole-array ops: the array; block ops: one row
    rows: tuple  # block ops: rows per rank (world-size entries; a subgroup uses the first ones)
    splits: tuple  # all_to_all_single: rows rank i sends to rank j
    root: int  # a subgroup uses root % its size
    use_out: bool
    tag: int
    any_tag: bool  # recv_any receives with tag=None
    any_src: bool  # sendrecv/recv_object with src=None
    zero_d: bool  # all_gather/gather of 0-d arrays
    torch_names: bool  # P2POp(comm.isend, ...) instead of P2POp("send", ...)
    large: bool

    @property
    def gloo(self) -> str:
        """'gloo', or 'numpy-only(...)' saying why gloo does not run this case."""
        if not GLOO_WANTED:
            return "numpy-only(gloo disabled)"
        if not TORCH:
            return "numpy-only(no torch)"
        lacks = _gloo_lacks(self)
        return "gloo" if lacks is None else f"numpy-only(gloo lacks {lacks})"

    @property
    def id(self) -> str:
        parts = [f"c{self.index:04d}", self.op, self.dtype]
        if self.redop:
            parts.append(self.redop)
        variant = self.variant
        if variant in ("split", "group"):
            variant += f"+{self.mode}"
        parts += [variant, self.values + ("-large" if self.large else ""), self.gloo]
        return "-".join(parts)

    def reduce_op(self) -> ReduceOp:
        if self.redop == "PREMUL_SUM":
            return ReduceOp.PREMUL_SUM(self.factor)
        return getattr(ReduceOp, self.redop)

    def repro(self) -> str:
        redop = self.redop or "-"
        if self.redop == "PREMUL_SUM":
            redop = f"PREMUL_SUM({self.factor!r})"
        if self.op in BLOCKS:
            shape = f"rows={list(self.rows)} row={self.shape}"
            if self.op == "all_to_all_single":
                shape = f"splits={[list(s) for s in self.splits]} row={self.shape}"
            if self.zero_d:
                shape = "0-d per rank"
        else:
            shape = f"shape={self.shape}"
        root = "-"
        if self.op in ROOTED:
            root = str(self.root)
            if self.variant in ("split", "group"):
                root += "%groupsize"
        return (
            f"REPRO op={self.op} dtype={self.dtype} {shape} redop={redop} root={root} "
            f"variant={self.variant}/{self.mode} values={self.values} world={self.world} seed={SEED} "
            f"case={self.index}: HPCCOMM_DIFF_SEED={SEED} mpiexec -n {self.world} python -m pytest "
            f"-p no:cacheprovider --with-mpi tests/mpi/test_differential.py -k 'c{self.index:04d}-'"
        )


def _specs(world: int, seed: int) -> list[dict]:
    """What each case must be (op, dtype, redop, variant, ...); the rest is drawn per case."""
    rng = np.random.default_rng([seed, world, 0])
    specs: list[dict] = []
    # Coverage: every op x dtype x variant; reductions pair each ReduceOp with a variant.
    for op in ALL_OPS:
        for dt in _dtypes_for(op):
            reds, vs = _redops_for(op, dt), _variants_for(op)
            for i in range(max(len(reds), len(vs))):
                specs.append(
                    {
                        "op": op,
                        "dtype": dt,
                        "redop": reds[i % len(reds)],
                        "variant": vs[(i + world) % len(vs)],
                    }
                )
    # Hot spots: where wrap-around, temporaries of non-blocking calls and NaN/inf matter.
    small_ints = ("int8", "uint8", "int16", "uint16")
    ints = [d for d in DTYPES if CATEGORY[d] == "int"]
    floats = [d for d in DTYPES if CATEGORY[d] in ("half", "float", "complex")]
    for k in range(HOT):
        op = str(rng.choice(REDUCING))
        if k % 3 == 0:
            dt = str(rng.choice(small_ints if rng.random() < 0.75 else ints))
            spec = {"redop": str(rng.choice(["SUM", "SUM", "PRODUCT"])), "values": "edge"}
            spec["variant"] = str(rng.choice(VARIANTS))
        elif k % 3 == 1:
            dt = str(rng.choice(floats))
            spec = {"redop": str(rng.choice(["PREMUL_SUM", "PREMUL_SUM", "AVG"]))}
            spec["variant"] = str(rng.choice(["async", "timeout", "split", "group"]))
            spec["mode"] = str(rng.choice(["async", "timeout"]))
        else:
            dt = str(rng.choice([d for d in floats if CATEGORY[d] != "complex"]))
            spec = {"redop": str(rng.choice(["SUM", "MIN", "MAX", "PRODUCT", "AVG"]))}
            spec["variant"] = str(rng.choice(VARIANTS))
            spec["values"] = str(rng.choice(["nan", "inf", "extreme"]))
        specs.append({"op": op, "dtype": dt, **spec})
    # Uniform extras, then large cases (at least 1 MiB per rank).
    for k in range(EXTRA + LARGE):
        op = str(rng.choice(ALL_OPS if k < EXTRA else LARGE_OPS))
        dt = str(rng.choice(_dtypes_for(op)))
        reds = _redops_for(op, dt)
        spec = {"op": op, "dtype": dt, "redop": reds[rng.integers(len(reds))]}
        spec["variant"] = str(rng.choice(_variants_for(op)))
        spec["large"] = k >= EXTRA
        specs.append(spec)
    return specs


def _values_class(rng: np.random.Generator, dtype: str, redop: str | None) -> str:
    cat = CATEGORY.get(dtype)
    if cat is None:
        return "none"
    if cat == "bool":
        return "bool"
    if cat == "int":
        if redop in ("SUM", "PRODUCT"):
            return str(rng.choice(["edge", "full", "small"], p=[0.5, 0.25, 0.25]))
        return str(rng.choice(["full", "small", "edge"], p=[0.4, 0.3, 0.3]))
    if cat == "complex":
        if redop in ("AVG", "PREMUL_SUM"):
            return str(rng.choice(["normal", "ints"]))
        return str(rng.choice(["normal", "ints", "nan", "inf"], p=[0.45, 0.25, 0.15, 0.15]))
    if redop is None:
        return str(rng.choice(["normal", "ints", "nan", "extreme"]))
    return str(
        rng.choice(["normal", "ints", "extreme", "inf", "nan"], p=[0.35, 0.2, 0.15, 0.15, 0.15])
    )


def _shape(rng: np.random.Generator, n: int) -> tuple:
    if n == 0:
        return [(0,), (3, 0), (0, 2, 2)][rng.integers(3)]
    if n == 1 and rng.random() < 0.4:
        return ()
    form = rng.integers(5)
    if form < 3 or n < 6:
        return (n,)
    if form == 3:
        k = int(rng.choice([k for k in (3, 5, 17) if k <= n]))
        return (n // k, k)
    return (n // 6, 2, 3)


def _uneven(rng: np.random.Generator, count: int, b: int, large: bool) -> tuple:
    if large:
        return tuple(int(v) for v in rng.integers(b, 2 * b + 1, size=count))
    out = rng.integers(0, 2 * b + 1, size=count)
    out[rng.random(count) < 0.2] = 0  # zero-length shards
    return tuple(int(v) for v in out)


def _draw(index: int, spec: dict, world: int, seed: int) -> Case:
    rng = np.random.default_rng([seed, world, 1, index])
    op, dtype, redop, variant = spec["op"], spec["dtype"], spec["redop"], spec["variant"]
    large = spec.get("large", False)
    if variant in ("split", "group"):
        mode = spec.get("mode") or str(rng.choice(_modes_for(op)))
        if mode not in _modes_for(op):
            mode = "timeout"
    else:
        mode = variant if variant in ("async", "timeout") else "plain"
    values = spec.get("values") or _values_class(rng, dtype, redop)
    if (
        values in ("nan", "inf")
        and CATEGORY.get(dtype) == "complex"
        and redop in ("AVG", "PREMUL_SUM")
    ):
        values = "normal"
    factor = None
    if redop == "PREMUL_SUM":
        pool = REAL_FACTORS + (COMPLEX_FACTORS if CATEGORY[dtype] == "complex" else ())
        factor = pool[rng.integers(len(pool))]
    itemsize = DTYPES[dtype].itemsize if dtype in DTYPES else 1
    if large:
        n = (1 << 20) // itemsize + int(rng.choice([1, 3, 17]))
    elif op == "barrier":
        n = 0
    elif op in OBJECTS:
        n = int(rng.choice(SIZES[:-2]))
    else:
        n = int(rng.choice(SIZES, p=SIZE_W))
    rows: tuple = ()
    splits: tuple = ()
    zero_d = False
    if op in BLOCKS:
        shape = ROW_SHAPES[rng.integers(len(ROW_SHAPES))]
        if n == 0 and rng.random() < 0.3:
            shape, b = (0,), 3  # rows of zero elements
        else:
            b = max(n // max(math.prod(shape), 1), 1) if n else 0
        if op == "all_to_all_single":
            bb = -(-b // world) if b else 0
            splits = tuple(_uneven(rng, world, bb, large) for _ in range(world))
        elif op in UNEVEN:
            rows = _uneven(rng, world, b, large)
        else:
            rows = (b,) * world
            zero_d = (
                op in ("all_gather", "gather") and shape == () and b == 1 and rng.random() < 0.5
            )
    else:
        shape = _shape(rng, n) if op != "barrier" else ()
    return Case(
        world=world,
        index=index,
        op=op,
        dtype=dtype,
        redop=redop,
        factor=factor,
        variant=variant,
        mode=mode,
        values=values,
        shape=shape,
        rows=rows,
        splits=splits,
        root=int(rng.integers(world)),
        use_out=variant == "repeat" or bool(rng.random() < 0.5),
        tag=int(rng.integers(0, 1000)),
        any_tag=op == "recv_any" and bool(rng.random() < 0.3),
        any_src=op in ("sendrecv", "send_recv_object") and bool(rng.random() < 0.3),
        zero_d=zero_d,
        torch_names=bool(rng.random() < 0.5),
        large=large,
    )


def draw_cases(world: int, seed: int) -> list[Case]:
    """The case list of one world size: the same on every rank."""
    return [_draw(i, spec, world, seed) for i, spec in enumerate(_specs(world, seed))]


CASES = draw_cases(WORLD, SEED)

# ---- inputs --------------------------------------------------------------------------------


def _finfo(dt: np.dtype) -> Any:
    if dt == BF16:
        return ml_dtypes.finfo(BF16)
    return np.finfo(dt)


def _real_values(
    rng: np.random.Generator, pos: np.random.Generator, dt: np.dtype, shape: tuple, cls: str
) -> np.ndarray:
    """Floating values of one class, as float64 (cast by the caller)."""
    if cls in ("ints", "inf", "nan"):
        x = rng.integers(-4, 5, size=shape).astype(np.float64)
        if cls == "inf":
            x[rng.random(shape) < 0.1] = np.inf
            x[rng.random(shape) < 0.1] = -np.inf
        elif cls == "nan":
            x[rng.random(shape) < 0.1] = np.nan
            x[rng.random(shape) < 0.05] = np.inf
        return x
    if cls == "normal":
        return rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3)
    # extreme: per position (the same on every rank) huge or subnormal, one sign, so that sums
    # and products overflow or underflow the same way in any order.
    fi = _finfo(dt)
    huge = pos.random(shape) < 0.5
    sign = np.where(pos.random(shape) < 0.5, -1.0, 1.0)
    big = rng.uniform(0.6, 1.0, size=shape) * float(fi.max)
    tiny = rng.integers(1, 9, size=shape) * float(fi.smallest_subnormal)
    return sign * np.where(huge, big, tiny)


def make_values(case: Case, world_rank: int, shape: tuple, salt: int = 0) -> np.ndarray:
    """World rank ``world_rank``'s input of ``case`` (deterministic; any rank can make it)."""
    dt = DTYPES[case.dtype]
    rng = np.random.default_rng([SEED, case.world, case.index, world_rank, salt])
    pos = np.random.default_rng([SEED, case.world, case.index, 1 << 20, salt])
    return np.asarray(_values(rng, pos, dt, shape, case.values), dtype=dt).reshape(shape)


def _values(
    rng: np.random.Generator, pos: np.random.Generator, dt: np.dtype, shape: tuple, cls: str
) -> Any:
    if dt == np.bool_:
        return rng.random(shape) < rng.choice([0.1, 0.5, 0.9])
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if cls == "small":
            return rng.integers(-3 if info.min < 0 else 0, 4, size=shape).astype(dt)
        if cls == "full":
            return rng.integers(info.min, info.max, endpoint=True, size=shape, dtype=dt)
        pool = [info.min, info.min + 1, info.max, info.max - 1, info.max // 2 + 1, 0, 1, 2]
        if info.min < 0:
            pool += [-1, -2]
        return np.array(pool, dtype=dt)[rng.integers(len(pool), size=shape)]
    if dt.kind == "c":
        part = np.dtype(np.float32 if dt == np.complex64 else np.float64)
        re = _real_values(rng, pos, part, shape, cls)
        im = _real_values(rng, pos, part, shape, cls)
        return (re + 1j * im).astype(dt)
    return _real_values(rng, pos, dt, shape, cls).astype(dt)


def _payload(case: Case, world_rank: int, shape: tuple) -> dict:
    """A Python object of one rank (object ops): nested containers around arrays."""
    return {
        "from": world_rank,
        "case": case.index,
        "array": make_values(case, world_rank, shape),
        "scalar": make_values(case, world_rank, (), salt=1),
        "text": "é" * (world_rank + 1),
        "tuple": (world_rank, 2.5, None, b"\x00\xff"),
        "list": [make_values(case, world_rank, (2,), salt=2), {"k": world_rank}],
    }


# ---- references and comparisons -----------------------------------------------------------


class Expect(NamedTuple):
    """An expected reduction: the exact value (in the dtype for integers and bool, in
    extended precision for floats), the tolerance, where overflow to inf is legitimate, and
    where MIN/MAX saw a NaN input (disputed semantics)."""

    value: np.ndarray
    tol: np.ndarray | None = None  # complex dtypes: .real bounds the real part, .imag the imag
    over: np.ndarray | None = None  # 1 where overflow to +-inf is legitimate (complex: per part)
    disputed: np.ndarray | None = None

    def rows(self, start: int, stop: int) -> Expect:
        return Expect(*(None if a is None else a[start:stop] for a in self))


def _wide(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        return x.astype(np.complex128).astype(np.clongdouble)
    return x.astype(np.float64).astype(np.longdouble)


_BOOL_REDUCE = {
    "SUM": np.logical_or,
    "MAX": np.logical_or,
    "BOR": np.logical_or,
    "PRODUCT": np.logical_and,
    "MIN": np.logical_and,
    "BAND": np.logical_and,
    "BXOR": np.logical_xor,
}
_INT_REDUCE = {
    "SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
}


def reduce_expect(case: Case, xs: list[np.ndarray]) -> Expect:
    """The expected reduction of the inputs ``xs`` (one per group rank)."""
    dt = xs[0].dtype
    if dt == np.bool_:
        return Expect(_BOOL_REDUCE[case.redop].reduce(np.stack(xs), axis=0))
    if dt.kind in "iu":  # in the dtype itself: NumPy wraps around, as torch does
        return Expect(_INT_REDUCE[case.redop].reduce(np.stack(xs), axis=0, dtype=dt))
    return _float_expect(case, xs)


def _float_expect(case: Case, xs: list[np.ndarray]) -> Expect:
    """Floats: the exact result in extended precision, and a tolerance from summation order.

    For m terms added in any order (a tree, a ring, or hpccomm's user-defined op for 16-bit
    floats, which rounds to 16 bits at every pairwise step), with u the unit roundoff of the
    dtype (2^-11 float16, 2^-8 bfloat16, 2^-24 float32, 2^-53 float64) the error is at most
    (m - 1) * u * sum|x_i| (+ O(u^2)). We allow 2 (m + 1) u sum|x_i| (PREMUL_SUM: sum|f x_i|,
    with one more u for rounding f * x_i and f itself; AVG adds u |result| for the division),
    2 (m + 1) u |result| for PRODUCT, plus m smallest subnormals for gradual underflow (for
    PRODUCT times the largest partial product). Overflow to +-inf is accepted where the
    largest possible partial result (sum|x_i|, or prod max(|x_i|, 1)) reaches the dtype's
    max. MIN/MAX are exact.
    """
    m = len(xs)
    dt = xs[0].dtype
    fi = _finfo(dt)
    u = np.longdouble(float(fi.eps)) / 2
    tiny = np.longdouble(float(fi.smallest_subnormal))
    big = np.longdouble(float(fi.max))
    w = np.stack([_wide(x) for x in xs])
    name = case.redop
    slack = 2 * (m + 1) * u
    with np.errstate(all="ignore"):
        if name in ("MIN", "MAX"):
            value = (np.minimum if name == "MIN" else np.maximum).reduce(w, axis=0)
            zero = np.zeros(value.shape, np.longdouble)
            return Expect(value, zero, zero, np.isnan(w).any(0))
        if name == "PRODUCT":
            value = w.prod(0)
            partial = np.maximum(np.abs(w), 1).prod(0)
            tol = slack * np.abs(value) + m * tiny * partial
            return Expect(value, tol, (partial >= big * (1 - slack)).astype(np.longdouble))
        if name == "PREMUL_SUM":
            f = case.factor
            f = (
                np.clongdouble(complex(f))
                if isinstance(f, complex | np.complexfloating)
                else np.longdouble(float(f))
            )
            w = w * f
        value = w.sum(0)
        if name == "AVG":
            value = value / m
        if w.dtype.kind != "c":
            mag = np.abs(w).sum(0)
            tol = _sum_tol(mag, value, m, name, slack, u, tiny)
            return Expect(value, tol, (mag >= big * (1 - slack)).astype(np.longdouble))
        # Complex: each part is bounded on its own (a NaN in one part leaves the other
        # checked); PREMUL_SUM's f * x mixes the parts, so both get sum|f x_i|.
        mixed = np.abs(w).sum(0)
        tol = np.empty(value.shape, np.clongdouble)
        over = np.empty(value.shape, np.clongdouble)
        for part in ("real", "imag"):
            mag = mixed if name == "PREMUL_SUM" else np.abs(getattr(w, part)).sum(0)
            setattr(tol, part, _sum_tol(mag, getattr(value, part), m, name, slack, u, tiny))
            setattr(over, part, mag >= big * (1 - slack))
        return Expect(value, tol, over)


def _sum_tol(mag, value, m, name, slack, u, tiny):
    """The bound of a sum of m terms of total magnitude ``mag`` (AVG: then divided by m)."""
    tol = (slack + 2 * u) * mag + (m + 1) * tiny
    if name == "AVG":
        tol = tol / m + u * np.abs(value) + tiny
    return tol


def _float_bad(got: np.ndarray, e: Expect) -> tuple[np.ndarray, np.ndarray]:
    """(mismatches, disputed mismatches) of a floating result."""
    g = _wide(got)
    bad = np.zeros(g.shape, dtype=bool)
    if g.dtype.kind == "c":  # tol and over: the real part's bound in .real, the imag's in .imag
        parts = [
            (g.real, e.value.real, e.tol.real, e.over.real),
            (g.imag, e.value.imag, e.tol.imag, e.over.imag),
        ]
    else:
        parts = [(g, e.value, e.tol, e.over)]
    with np.errstate(all="ignore"):
        for gv, ev, tol, over in parts:
            gnan, enan = np.isnan(gv), np.isnan(ev)
            ginf, einf = np.isinf(gv), np.isinf(ev)
            finite = ~enan & ~einf
            b = gnan != enan
            b |= einf & (gv != ev)
            over_ok = (over > 0) & ((np.sign(gv) == np.sign(ev)) | (ev == 0))
            b |= finite & ginf & ~over_ok
            b |= finite & ~ginf & ~gnan & ~(np.abs(gv - ev) <= tol)
            bad |= b
    disputed = bad & e.disputed if e.disputed is not None else np.zeros(bad.shape, dtype=bool)
    return bad & ~disputed, disputed


def _bytes_bad(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elements whose bytes differ (NaN payloads included)."""
    size = want.dtype.itemsize
    a = np.ascontiguousarray(got).reshape(-1).view(np.uint8).reshape(-1, size)
    b = np.ascontiguousarray(want).reshape(-1).view(np.uint8).reshape(-1, size)
    return ~(a == b).all(axis=1).reshape(want.shape)


def _fmt(v: Any) -> str:
    if isinstance(v, np.generic) and v.dtype.kind in "fc":
        return repr(complex(v) if np.iscomplexobj(v) else float(v))
    return repr(v.item() if isinstance(v, np.generic) else v)


def _describe(what: str, bad: np.ndarray, got: np.ndarray, want: np.ndarray, inputs=None) -> str:
    at = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
    msg = (
        f"{what}: {int(bad.sum())} of {bad.size} elements differ; first at {at}: "
        f"got {_fmt(got[at])}, expected {_fmt(want[at])}"
    )
    if inputs is not None:
        msg += f" (inputs by group rank: {', '.join(_fmt(x[at]) for x in inputs)})"
    return msg


def _obj_diff(got: Any, want: Any, path: str = "object") -> str | None:
    if isinstance(want, np.ndarray):
        if not isinstance(got, np.ndarray):
            return f"{path}: got {type(got).__name__}, expected ndarray"
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            return f"{path}: got {got.dtype}{got.shape} {got!r:.80}, expected {want.dtype}{want.shape} {want!r:.80}"
        return None
    if type(got) is not type(want):
        return f"{path}: got {type(got).__name__}, expected {type(want).__name__}"
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"{path}: keys {list(got)}, expected {list(want)}"
        diffs = (_obj_diff(got[k], want[k], f"{path}[{k!r}]") for k in want)
        return next((d for d in diffs if d), None)
    if isinstance(want, list | tuple):
        if len(got) != len(want):
            return f"{path}: {len(got)} items, expected {len(want)}"
        diffs = (
            _obj_diff(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(got, want, strict=True))
        )
        return next((d for d in diffs if d), None)
    return None if got == want else f"{path}: got {got!r:.80}, expected {want!r:.80}"


# ---- one case on one side (hpccomm, or gloo through the adapter) ---------------------------


class Trial:
    """One case run on one side on this rank: the call helpers and checks the runners use.
    A check records a problem and returns; nothing raises before every call of the case is
    made (a rank that stopped early would leave the others blocked in a collective)."""

    def __init__(self, case: Case, side: str, comm: Any, members: list[int], cache: dict) -> None:
        self.case = case
        self.side = side
        self.comm = comm
        self.members = members  # world ranks, in this side's group-rank order
        self.m = len(members)
        self.g = comm.rank
        self.problems: list[str] = []
        self.rep = 0
        self.slot = "A"
        self._slots: dict = {}
        self._cache = cache  # shared by both sides: inputs and expectations
        self.redop = case.reduce_op() if case.redop else None  # one object for every rep

    # inputs
    def input(self, g: int, shape: tuple, salt: int = 0) -> np.ndarray:
        """Group rank ``g``'s input (read-only: copy before handing it to a call)."""
        key = ("x", self.members[g], shape, salt)
        if key not in self._cache:
            self._cache[key] = make_values(self.case, self.members[g], shape, salt)
        return self._cache[key]

    def inputs(self, shapes: list[tuple], salt: int = 0) -> list[np.ndarray]:
        """Every group rank's input, one shape per group rank."""
        return [self.input(g, shape, salt) for g, shape in enumerate(shapes)]

    def expect(self, xs: list[np.ndarray]) -> Expect:
        key = ("e", frozenset(self.members), xs[0].shape)
        if key not in self._cache:
            self._cache[key] = reduce_expect(self.case, xs)
        return self._cache[key]

    def reuse(self, key: str, arr: np.ndarray) -> np.ndarray:
        """``arr``, or (repeat variant: same slot as an earlier rep) the array object used
        then, refilled with ``arr``'s contents: a repeated call on the same array objects."""
        k = (self.slot, key)
        old = self._slots.get(k)
        if old is not None and old.shape == arr.shape and old.dtype == arr.dtype:
            old[...] = arr
            return old
        self._slots[k] = arr
        return arr

    def empty(self, key: str, shape: tuple) -> np.ndarray:
        return self.reuse(key, np.zeros(shape, DTYPES[self.case.dtype]))

    # calls
    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        if self.case.mode == "async":
            work = fn(*args, async_op=True, **kw)
            return work.wait(timeout=WAIT)
        return fn(*args, **kw)

    # checks
    def fail(self, msg: str) -> None:
        self.problems.append(f"{self.side} rep {self.rep}: {msg}")

    def eq(self, what: str, got: Any, want: Any) -> None:
        if got != want:
            self.fail(f"{what}: got {got!r}, expected {want!r}")

    def is_(self, what: str, got: Any, obj: Any) -> None:
        if got is not obj:
            self.fail(f"{what}: got {type(got).__name__} {id(got):#x}, expected the same object")

    def _array(self, what: str, got: Any, want: np.ndarray) -> bool:
        if not isinstance(got, np.ndarray):
            self.fail(f"{what}: got {type(got).__name__}, expected an ndarray {want.shape}")
            return False
        if got.shape != want.shape or got.dtype != want.dtype:
            self.fail(f"{what}: got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
            return False
        return True

    def same(self, what: str, got: Any, want: np.ndarray) -> None:
        if self._array(what, got, want):
            bad = _bytes_bad(got, want)
            if bad.any():
                self.fail(_describe(what, bad, got, want))

    def reduced(self, what: str, got: Any, e: Expect, inputs: list[np.ndarray]) -> None:
        want_dtype = DTYPES[self.case.dtype]
        if not self._array(what, got, np.empty(e.value.shape, want_dtype)):
            return
        if want_dtype.kind in "biu":
            bad = got != e.value
            if bad.any():
                self.fail(_describe(what, bad, got, e.value, inputs))
            return
        bad, disputed = _float_bad(got, e)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
            self.fail(
                _describe(what, bad, got, e.value, inputs) + f" (tolerance {_fmt(e.tol[at])})"
            )
        if disputed.any():
            if self.side == "hpccomm":  # hpccomm promises NumPy's NaN propagation
                self.fail(_describe(what, disputed, got, e.value, inputs) + " (NaN must propagate)")
                return
            self.problems.append(
                DISPUTED
                + f"{self.side} rep {self.rep}: "
                + _describe(what, disputed, got, e.value, inputs)
            )


# ---- the runners: one per operation, written against hpccomm's API ------------------------


def _root(t: Trial) -> int:
    return t.case.root % t.m


def _rows(t: Trial) -> list[int]:
    return list(t.case.rows[: t.m])


def r_all_reduce(t: Trial) -> None:
    xs = t.inputs([t.case.shape] * t.m)
    x = t.reuse("x", xs[t.g].copy())
    got = t.call(t.comm.all_reduce, x, op=t.redop)
    t.is_("all_reduce's return value", got, x)
    t.reduced("array", x, t.expect(xs), xs)


def r_reduce(t: Trial) -> None:
    root = _root(t)
    xs = t.inputs([t.case.shape] * t.m)
    x = t.reuse("x", xs[t.g].copy())
    got = t.call(t.comm.reduce, x, dst=root, op=t.redop)
    t.is_("reduce's return value", got, x)
    if t.g == root:
        t.reduced("array on dst", x, t.expect(xs), xs)
    elif t.side == "hpccomm":  # torch leaves non-dst tensors undefined (gloo uses them)
        t.same("array on a non-dst rank (unchanged)", x, xs[t.g])


def r_broadcast(t: Trial) -> None:
    root = _root(t)
    xs = t.inputs([t.case.shape] * t.m)
    x = t.reuse("x", xs[t.g].copy())
    got = t.call(t.comm.broadcast, x, src=root)
    t.is_("broadcast's return value", got, x)
    t.same("array", x, xs[root])


def _gather_like(t: Trial, uneven: bool, root: int | None) -> None:
    c = t.case
    rows = _rows(t)
    shapes = [() if c.zero_d else (r, *c.shape) for r in rows]
    xs = t.inputs(shapes)
    x = t.reuse("x", xs[t.g].copy())
    kw: dict = {"sizes": rows} if uneven else {}
    receives = root is None or t.g == root
    out = None
    if c.use_out and receives:
        out = t.empty("out", (sum(rows), *c.shape) if not c.zero_d else (t.m,))
        kw["out"] = out
    if root is None:
        got = t.call(t.comm.all_gather, x, **kw)
    else:
        got = t.call(t.comm.gather, x, dst=root, **kw)
    if receives:
        if out is not None:
            t.is_("result (out=)", got, out)
        t.same("gathered", got, np.stack(xs) if c.zero_d else np.concatenate(xs))
    else:
        t.is_("gather's return value on a non-dst rank", got, None)
    t.same("input (unchanged)", x, xs[t.g])


def r_all_gather(t: Trial) -> None:
    _gather_like(t, False, None)


def r_all_gather_v(t: Trial) -> None:
    _gather_like(t, True, None)


def r_gather(t: Trial) -> None:
    _gather_like(t, False, _root(t))


def r_gather_v(t: Trial) -> None:
    _gather_like(t, True, _root(t))


def _scatter(t: Trial, uneven: bool) -> None:
    c = t.case
    root, rows = _root(t), _rows(t)
    full = t.input(root, (sum(rows), *c.shape), salt=1)
    kw: dict = {"sizes": rows} if uneven else {}
    start = sum(rows[: t.g])
    want = full[start : start + rows[t.g]]
    if t.g == root:
        a = t.reuse("full", full.copy())
        out = t.empty("out", want.shape) if c.use_out else None
        if out is not None:
            kw["out"] = out
        got = t.call(t.comm.scatter, a, src=root, **kw)
        if out is not None:
            t.is_("result (out=)", got, out)
        t.same("source's full array (unchanged)", a, full)
    else:  # non-source ranks pass only out= (their block)
        out = t.empty("out", want.shape)
        got = t.call(t.comm.scatter, out=out, src=root, **kw)
        t.is_("result (out=)", got, out)
    t.same("block", got, want)


def r_scatter(t: Trial) -> None:
    _scatter(t, False)


def r_scatter_v(t: Trial) -> None:
    _scatter(t, True)


def _reduce_scatter(t: Trial, uneven: bool) -> None:
    c = t.case
    rows = _rows(t)
    shape = (sum(rows), *c.shape)
    xs = t.inputs([shape] * t.m)
    x = t.reuse("x", xs[t.g].copy())
    kw: dict = {"sizes": rows} if uneven else {}
    start = sum(rows[: t.g])
    stop = start + rows[t.g]
    out = t.empty("out", (rows[t.g], *c.shape)) if c.use_out else None
    if out is not None:
        kw["out"] = out
    got = t.call(t.comm.reduce_scatter, x, op=t.redop, **kw)
    if out is not None:
        t.is_("result (out=)", got, out)
    t.reduced("block", got, t.expect(xs).rows(start, stop), [xi[start:stop] for xi in xs])
    t.same("input (unchanged)", x, xs[t.g])


def r_reduce_scatter(t: Trial) -> None:
    _reduce_scatter(t, False)


def r_reduce_scatter_v(t: Trial) -> None:
    _reduce_scatter(t, True)


def r_all_to_all(t: Trial) -> None:
    c = t.case
    b = c.rows[0]
    xs = t.inputs([(t.m * b, *c.shape)] * t.m)
    x = t.reuse("x", xs[t.g].copy())
    out = t.empty("out", x.shape) if c.use_out else None
    got = t.call(t.comm.all_to_all, x, **({"out": out} if out is not None else {}))
    if out is not None:
        t.is_("result (out=)", got, out)
    want = np.concatenate([xs[j][t.g * b : (t.g + 1) * b] for j in range(t.m)])
    t.same("received blocks", got, want)
    t.same("input (unchanged)", x, xs[t.g])


def r_all_to_all_single(t: Trial) -> None:
    c = t.case
    s = [list(row[: t.m]) for row in c.splits[: t.m]]  # s[i][j]: rows i sends to j
    xs = t.inputs([(sum(s[i]), *c.shape) for i in range(t.m)])
    x = t.reuse("x", xs[t.g].copy())
    recv = [s[j][t.g] for j in range(t.m)]
    kw: dict = {"input_split_sizes": s[t.g], "output_split_sizes": recv}
    if c.use_out:
        kw["out"] = t.empty("out", (sum(recv), *c.shape))
    got = t.call(t.comm.all_to_all_single, x, **kw)
    if c.use_out:
        t.is_("result (out=)", got, kw["out"])
    blocks = []
    for j in range(t.m):
        start = sum(s[j][: t.g])
        blocks.append(xs[j][start : start + s[j][t.g]])
    t.same("received blocks", got, np.concatenate(blocks))
    t.same("input (unchanged)", x, xs[t.g])


def r_barrier(t: Trial) -> None:
    t.eq("barrier's return value", t.call(t.comm.barrier), None)


def _p2p_skip(t: Trial) -> bool:
    """torch.distributed refuses sends to self: gloo runs p2p cases in groups of 2 or more."""
    return t.side == "gloo" and t.m == 1


def r_send_recv(t: Trial) -> None:
    """A ring: rank 0 sends first, every other rank receives then sends (blocking), or all
    post both at once (async). A group of one sends to itself with isend + recv."""
    if _p2p_skip(t):
        return
    c, comm = t.case, t.comm
    xs = t.inputs([c.shape] * t.m)
    x = t.reuse("x", xs[t.g].copy())
    buf = t.empty("buf", c.shape)
    right, left = (t.g + 1) % t.m, (t.g - 1) % t.m
    if t.m == 1:
        work = comm.isend(x, 0, tag=c.tag)
        src = comm.recv(buf, 0, tag=c.tag)
        t.eq("isend's wait()", work.wait(timeout=WAIT), None)
    elif c.mode == "async":
        rw = comm.recv(buf, left, tag=c.tag, async_op=True)
        sw = comm.send(x, right, tag=c.tag, async_op=True)
        t.eq("send's wait()", sw.wait(timeout=WAIT), None)
        src = rw.wait(timeout=WAIT)
    elif t.g == 0:
        t.eq("send's return value", comm.send(x, right, tag=c.tag), None)
        src = comm.recv(buf, left, tag=c.tag)
    else:
        src = comm.recv(buf, left, tag=c.tag)
        t.eq("send's return value", comm.send(x, right, tag=c.tag), None)
    t.eq("recv's source", src, left)
    t.same("received", buf, xs[left])
    t.same("sent array (unchanged)", x, xs[t.g])


def r_recv_any(t: Trial) -> None:
    """Every rank sends to the root, which receives from any source (and any tag)."""
    if _p2p_skip(t):
        return
    c, comm = t.case, t.comm
    root = _root(t)
    xs = t.inputs([c.shape] * t.m)
    tag = None if c.any_tag else c.tag
    if t.g == root:
        bufs = [t.empty(f"buf{k}", c.shape) for k in range(t.m - 1)]
        if c.mode == "async":
            works = [comm.recv(b, None, tag=tag, async_op=True) for b in bufs]
            srcs = [w.wait(timeout=WAIT) for w in works]
        else:
            srcs = [comm.recv(b, None, tag=tag) for b in bufs]
        others = [j for j in range(t.m) if j != root]
        t.eq("sources (sorted)", sorted(s for s in srcs if isinstance(s, int)), others)
        for b, s in zip(bufs, srcs, strict=True):
            if isinstance(s, int) and 0 <= s < t.m:
                t.same(f"message from {s}", b, xs[s])
    else:
        x = t.reuse("x", xs[t.g].copy())
        t.eq("send", t.call(comm.send, x, root, tag=c.tag), None)
    if c.variant == "repeat":  # a sender must not run into the next rep's any-source receive
        comm.barrier()


def r_isend_irecv(t: Trial) -> None:
    if _p2p_skip(t):
        return
    c, comm = t.case, t.comm
    xs = t.inputs([c.shape] * t.m)
    x = t.reuse("x", xs[t.g].copy())
    buf = t.empty("buf", c.shape)
    right, left = (t.g + 1) % t.m, (t.g - 1) % t.m
    rw = comm.irecv(buf, left, tag=c.tag)
    sw = comm.isend(x, right, tag=c.tag)
    timeout = WAIT if c.mode != "plain" else None
    t.eq("isend's wait()", sw.wait(timeout=timeout), None)
    t.eq("irecv's wait() (the source)", rw.wait(timeout=timeout), left)
    t.eq("irecv's is_completed()", rw.is_completed(), True)
    t.same("received", buf, xs[left])


def r_sendrecv(t: Trial) -> None:
    c, comm = t.case, t.comm
    xs = t.inputs([c.shape] * t.m)
    x = t.reuse("x", xs[t.g].copy())
    right, left = (t.g + 1) % t.m, (t.g - 1) % t.m
    kw: dict = {"dst": right, "src": None if c.any_src else left, "tag": c.tag}
    if c.use_out:
        kw["out"] = t.empty("out", c.shape)
    got = t.call(comm.sendrecv, x, **kw)
    if c.use_out:
        t.is_("result (out=)", got, kw["out"])
    t.same("received", got, xs[left])
    t.same("sent array (unchanged)", x, xs[t.g])


def r_batch_isend_irecv(t: Trial) -> None:
    if _p2p_skip(t):
        return
    c, comm = t.case, t.comm
    xs = t.inputs([c.shape] * t.m)
    ys = t.inputs([c.shape] * t.m, salt=1)
    right, left = (t.g + 1) % t.m, (t.g - 1) % t.m
    x, y = t.reuse("x", xs[t.g].copy()), t.reuse("y", ys[t.g].copy())
    from_left, from_right = t.empty("l", c.shape), t.empty("r", c.shape)
    send, recv = (comm.isend, comm.irecv) if c.torch_names else ("send", "recv")
    ops = [
        P2POp(send, x, right, tag=c.tag),
        P2POp(send, y, left, tag=c.tag + 1),
        P2POp(recv, from_left, left, tag=c.tag),
        P2POp(recv, from_right, right, tag=c.tag + 1),
    ]
    if c.mode == "async":
        comm.batch_isend_irecv(ops).wait(timeout=WAIT)
    else:
        t.eq("batch's return value", comm.batch_isend_irecv(ops, async_op=False), None)
    t.same("received from the left", from_left, xs[left])
    t.same("received from the right", from_right, ys[right])


def _payloads(t: Trial) -> list[dict]:
    key = ("obj", tuple(t.members))
    if key not in t._cache:
        t._cache[key] = [_payload(t.case, wr, t.case.shape) for wr in t.members]
    return t._cache[key]


def _obj(t: Trial, what: str, got: Any, want: Any) -> None:
    diff = _obj_diff(got, want)
    if diff:
        t.fail(f"{what}: {diff}")


def r_broadcast_object(t: Trial) -> None:
    root, ps = _root(t), _payloads(t)
    got = t.comm.broadcast_object(ps[t.g] if t.g == root else None, src=root)
    _obj(t, "broadcast object", got, ps[root])


def r_all_gather_object(t: Trial) -> None:
    ps = _payloads(t)
    _obj(t, "gathered objects", t.comm.all_gather_object(ps[t.g]), ps)


def r_gather_object(t: Trial) -> None:
    root, ps = _root(t), _payloads(t)
    got = t.comm.gather_object(ps[t.g], dst=root)
    _obj(t, "gathered objects", got, ps if t.g == root else None)


def r_scatter_object(t: Trial) -> None:
    root, ps = _root(t), _payloads(t)
    got = t.comm.scatter_object(list(ps) if t.g == root else None, src=root)
    _obj(t, "scattered object", got, ps[t.g])


def r_send_recv_object(t: Trial) -> None:
    if t.m == 1:  # a blocking object send to oneself may wait forever: nothing to check
        return
    c, comm, ps = t.case, t.comm, _payloads(t)
    right, left = (t.g + 1) % t.m, (t.g - 1) % t.m
    src = None if c.any_src else left
    if t.g == 0:
        comm.send_object(ps[t.g], right, tag=c.tag)
        got = comm.recv_object(src, tag=c.tag)
    else:
        got = comm.recv_object(src, tag=c.tag)
        comm.send_object(ps[t.g], right, tag=c.tag)
    _obj(t, "received object", got, ps[left])


RUNNERS = {name[2:]: fn for name, fn in globals().items() if name.startswith("r_")}
assert set(RUNNERS) == set(ALL_OPS), set(ALL_OPS) ^ set(RUNNERS)


def run_side(case: Case, side: str, comm: Any, members: list[int], cache: dict) -> list[str]:
    """Run ``case`` on one side; return this rank's problems (never raises)."""
    if not comm:  # this rank is not in the case's group (None, or a NotMember)
        return []
    t = Trial(case, side, comm, members, cache)
    if case.mode == "timeout":
        comm.timeout = WAIT
    slots = ("A", "A", "B", "A") if case.variant == "repeat" else ("A",)
    try:
        for rep, slot in enumerate(slots):
            t.rep, t.slot = rep, slot
            RUNNERS[case.op](t)
    except Exception as exc:  # recorded; the verdict exchange still happens
        t.fail(f"raised {type(exc).__name__}: {exc}")
    finally:
        if case.mode == "timeout":
            comm.timeout = None
    return t.problems


# ---- gloo: torch.distributed with hpccomm's call signatures, on NumPy memory ---------------


class _GlooWork:
    def __init__(self, works: list, result: Any = None, source: Any = None) -> None:
        self._works, self._result, self._source = works, result, source

    def wait(self, timeout: float | None = None) -> Any:
        for w in self._works:
            if timeout is None:
                w.wait()
            else:
                w.wait(timeout=datetime.timedelta(seconds=timeout))
        return self._source() if self._source is not None else self._result

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)


class GlooComm:
    """The calls the runners make, on torch.distributed (gloo) with tensors that share the
    NumPy arrays' memory. Group ranks follow torch's order (sorted world ranks)."""

    def __init__(self, dist: Any, torch: Any, group: Any, members: list[int], me: int) -> None:
        self.dist, self.torch, self.group = dist, torch, group
        self.members = members
        self.rank = members.index(me)
        self.size = len(members)
        self.timeout = None  # gloo has its own (the process group's): accepted and unused

    def _t(self, a: np.ndarray) -> Any:
        if a.dtype == BF16:
            return self.torch.from_numpy(a.view(np.uint16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(a)

    def _op(self, op: ReduceOp) -> Any:
        return getattr(self.dist.ReduceOp, op.name)

    def _done(self, work: Any, async_op: bool, result: Any) -> Any:
        return _GlooWork([work], result) if async_op else result

    def all_reduce(self, x, *, op, async_op=False):
        w = self.dist.all_reduce(self._t(x), op=self._op(op), group=self.group, async_op=async_op)
        return self._done(w, async_op, x)

    def reduce(self, x, *, dst, op, async_op=False):
        w = self.dist.reduce(
            self._t(x), group_dst=dst, op=self._op(op), group=self.group, async_op=async_op
        )
        return self._done(w, async_op, x)

    def broadcast(self, x, *, src, async_op=False):
        w = self.dist.broadcast(self._t(x), group_src=src, group=self.group, async_op=async_op)
        return self._done(w, async_op, x)

    def _flat(self, x):
        return x.reshape(1) if x.ndim == 0 else x

    def all_gather(self, x, *, out=None, async_op=False):
        x1 = self._flat(x)
        if out is None:
            out = np.empty((self.size * x1.shape[0], *x1.shape[1:]), x.dtype)
        w = self.dist.all_gather_single(
            self._t(out), self._t(x1), group=self.group, async_op=async_op
        )
        return self._done(w, async_op, out)

    def gather(self, x, *, dst, out=None, async_op=False):
        x1 = self._flat(x)
        blocks = None
        if self.rank == dst:
            if out is None:
                out = np.empty((self.size * x1.shape[0], *x1.shape[1:]), x.dtype)
            b = x1.shape[0]
            blocks = [self._t(out[i * b : (i + 1) * b]) for i in range(self.size)]
        w = self.dist.gather(
            self._t(x1), blocks, group_dst=dst, group=self.group, async_op=async_op
        )
        return self._done(w, async_op, out if self.rank == dst else None)

    def scatter(self, array=None, *, src, out=None, async_op=False):
        blocks = None
        if self.rank == src:
            b = array.shape[0] // self.size
            if out is None:
                out = np.empty((b, *array.shape[1:]), array.dtype)
            blocks = [self._t(array[i * b : (i + 1) * b]) for i in range(self.size)]
        w = self.dist.scatter(
            self._t(out), blocks, group_src=src, group=self.group, async_op=async_op
        )
        return self._done(w, async_op, out)

    def reduce_scatter(self, x, *, op, out=None, async_op=False):
        if out is None:
            out = np.empty((x.shape[0] // self.size, *x.shape[1:]), x.dtype)
        w = self.dist.reduce_scatter_single(
            self._t(out), self._t(x), op=self._op(op), group=self.group, async_op=async_op
        )
        return self._done(w, async_op, out)

    def all_to_all(self, x, *, out=None, async_op=False):
        out = np.empty_like(x) if out is None else out
        w = self.dist.all_to_all_single(
            self._t(out), self._t(x), group=self.group, async_op=async_op
        )
        return self._done(w, async_op, out)

    def all_to_all_single(
        self, x, *, input_split_sizes, output_split_sizes, out=None, async_op=False
    ):
        if out is None:
            out = np.empty((sum(output_split_sizes), *x.shape[1:]), x.dtype)
        w = self.dist.all_to_all_single(
            self._t(out),
            self._t(x),
            output_split_sizes=list(output_split_sizes),
            input_split_sizes=list(input_split_sizes),
            group=self.group,
            async_op=async_op,
        )
        return self._done(w, async_op, out)

    def barrier(self, *, async_op=False):
        w = self.dist.barrier(group=self.group, async_op=async_op)
        return self._done(w, async_op, None)

    def send(self, x, dst, *, tag=0, async_op=False):
        if async_op:
            return self.isend(x, dst, tag=tag)
        self.dist.send(self._t(x), group_dst=dst, group=self.group, tag=tag)
        return None

    def recv(self, buf, src=None, *, tag=0, async_op=False):
        if async_op:
            return self.irecv(buf, src, tag=tag)
        got = self.dist.recv(self._t(buf), group_src=src, group=self.group, tag=tag)
        return src if src is not None else self.members.index(got)  # torch: a world rank

    def isend(self, x, dst, *, tag=0):
        return _GlooWork([self.dist.isend(self._t(x), group_dst=dst, group=self.group, tag=tag)])

    def irecv(self, buf, src=None, *, tag=0):
        w = self.dist.irecv(self._t(buf), group_src=src, group=self.group, tag=tag)
        return _GlooWork([w], src, None if src is not None else w._source_rank)

    def batch_isend_irecv(self, ops, *, async_op=True):
        d = self.dist
        tops = [
            d.P2POp(
                d.isend if (getattr(p.op, "__name__", p.op) in ("send", "isend")) else d.irecv,
                self._t(p.array),
                group=self.group,
                tag=p.tag,
                group_peer=p.peer,
            )
            for p in ops
        ]
        work = _GlooWork(d.batch_isend_irecv(tops))
        return work if async_op else work.wait()

    def broadcast_object(self, obj=None, *, src):
        box = [obj]
        self.dist.broadcast_object_list(box, group_src=src, group=self.group)
        return box[0]

    def all_gather_object(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def gather_object(self, obj, *, dst):
        out = [None] * self.size if self.rank == dst else None
        self.dist.gather_object(obj, out, group_dst=dst, group=self.group)
        return out

    def scatter_object(self, objects=None, *, src):
        box = [None]
        self.dist.scatter_object_list(box, objects, group_src=src, group=self.group)
        return box[0]

    def send_object(self, obj, dst, *, tag=0):
        self.dist.send_object_list([obj], group_dst=dst, group=self.group)

    def recv_object(self, src=None, *, tag=0):
        box = [None]
        self.dist.recv_object_list(box, group_src=src, group=self.group)
        return box[0]


class Gloo:
    """A gloo process group over the same ranks (TCP store on rank 0, port sent over MPI)."""

    def __init__(self, world: Any, split_colors: list[list[int]], group_ranks: list[int]) -> None:
        import torch
        import torch.distributed as dist

        n, r = world.size, world.rank
        mpi = MPI.COMM_WORLD
        timeout = datetime.timedelta(seconds=WAIT)
        hosts = mpi.allgather(socket.gethostname())
        host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
        store, why = None, None
        if r == 0:
            try:
                store = dist.TCPStore(host, 0, n, True, timeout=timeout, wait_for_workers=False)
            except Exception as exc:  # every rank must hear of it, not wait in bcast
                why = f"rank 0 could not start the TCP store: {exc}"
        host, port, why = mpi.bcast((host, store.port if store else None, why), root=0)
        if why is not None:
            raise RuntimeError(why)
        if store is None:
            store = dist.TCPStore(host, port, n, False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=r, world_size=n, timeout=timeout)
        self.dist = dist
        self.world = GlooComm(dist, torch, None, list(range(n)), r)
        self.split = self.group = None
        for ranks in split_colors:  # every rank creates every group, in the same order
            g = dist.new_group(sorted(ranks))
            if r in ranks:
                self.split = GlooComm(dist, torch, g, sorted(ranks), r)
        g = dist.new_group(sorted(group_ranks))
        if r in group_ranks:
            self.group = GlooComm(dist, torch, g, sorted(group_ranks), r)

    def close(self) -> None:
        self.dist.destroy_process_group()


# ---- the test --------------------------------------------------------------------------------


class Env(NamedTuple):
    base: Any
    split: Any
    split_members: list[int]
    group: Any
    group_members: list[int]
    verdict: Any
    gloo: Gloo | None
    gloo_error: str | None

    def side(self, case: Case) -> tuple[Any, list[int]]:
        if case.variant == "split":
            return self.split, self.split_members
        if case.variant == "group":
            return self.group, self.group_members
        return self.base, list(range(self.base.size))

    def gloo_side(self, case: Case) -> tuple[Any, list[int]]:
        g = self.gloo
        comm = {"split": g.split, "group": g.group}.get(case.variant, g.world)
        return comm, (comm.members if comm is not None else [])


@pytest.fixture(scope="module")
def env(world):
    """The communicators every case runs on (made once: split and new_group are collective),
    a raw MPI communicator for the verdict exchange, and the gloo process group."""
    base = world.dup()
    base.timeout = None
    n, r = base.size, base.rank
    colors = [[i for i in range(n) if i % 2 == c] for c in (0, 1) if c < n]
    split = base.split(r % 2, key=-r)  # reversed order inside each group
    split_members = sorted(colors[r % 2], key=lambda i: -i)
    group_members = list(range(n - 1, -1, -2))  # every other rank, reversed
    group = base.new_group(group_members)
    verdict = MPI.COMM_WORLD.Dup()
    gloo, gloo_error = None, None
    if TORCH:
        try:
            gloo = Gloo(base, colors, group_members)
        except Exception as exc:  # reported by every gloo case
            gloo_error = f"{type(exc).__name__}: {exc}"
    yield Env(base, split, split_members, group, group_members, verdict, gloo, gloo_error)
    if gloo is not None:
        gloo.close()
    verdict.Free()
    base.free()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(env: Env, case: Case) -> None:
    cache: dict = {}
    comm, members = env.side(case)
    problems = run_side(case, "hpccomm", comm, members, cache)
    if case.gloo == "gloo":
        if env.gloo is None:
            problems.append(f"gloo: not started: {env.gloo_error}")
        else:
            comm, members = env.gloo_side(case)
            problems += run_side(case, "gloo", comm, members, cache)
    everyone = env.verdict.allgather(problems)
    hard = [
        f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps if not p.startswith(DISPUTED)
    ]
    soft = [f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps if p.startswith(DISPUTED)]
    if hard:
        lines = hard[:12] + ([f"... and {len(hard) - 12} more"] if len(hard) > 12 else [])
        pytest.fail("\n".join([case.repro(), *lines, *soft[:4]]), pytrace=False)
    if soft:
        pytest.xfail(f"{NAN_MINMAX}. {case.repro()}; e.g. {soft[0]}")
