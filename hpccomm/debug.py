"""Debug levels: ``off`` (default), ``check`` and ``detail``.

``check`` compares every collective across the ranks of its group before MPI is called: all
ranks exchange a fingerprint (op, sequence number, dtype, shape or counts, root, reduce op,
split sizes) with one 8-byte allgather of its CRC-32; when the CRCs differ, a second
exchange of the full fingerprints names the field and the ranks that differ, e.g.
``all_reduce #12 on world/tp: shape (1024,) on ranks 0,1 but (512,) on rank 2``, and every
rank raises the same MismatchError. A rank whose validation refused the call takes part too,
with its reason, so the others raise instead of waiting for it. Point-to-point calls send a
small header before the data, which the receiver compares with its buffer. ``detail`` adds
each rank's call site (file:line) to the fingerprints and messages.

This module holds the pure parts (levels, fingerprints, comparison, call sites); the
exchanges run in the dispatch through the host backend.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Sequence
from typing import Any

from .errors import InvalidArgumentError
from .ops import Call

__all__ = [
    "LEVELS",
    "level_from",
    "fingerprint",
    "crc",
    "disagreement",
    "call_site",
    "HEADER_WORDS",
    "encode_header",
    "decode_header",
]

LEVELS = ("off", "check", "detail")
ENV = "HPCCOMM_DEBUG"
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def level_from(value: Any, what: str) -> str:
    """A debug level: the argument, else ``$HPCCOMM_DEBUG``, else "off"."""
    if value is None:
        value = os.environ.get(ENV, "off").strip() or "off"
    if not isinstance(value, str) or value.lower() not in LEVELS:
        raise InvalidArgumentError(
            f"{what}: debug is {value!r}, expected one of {', '.join(LEVELS)} (or {ENV})"
        )
    return value.lower()


def call_site() -> str:
    """``file:line`` of the first frame outside hpccomm (the user's call)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:  # pragma: no cover - always called from user code
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


_FULL_SHAPE = frozenset({"all_reduce", "reduce", "broadcast", "reduce_scatter"})


def fingerprint(call: Call | None, op: str, seq: int, site: str | None = None) -> dict[str, Any]:
    """What every rank of a collective must agree on: the op and sequence number; the dtype
    and kind of memory; the full shape where every rank passes the same shape, else the row
    shape (all but axis 0, for gathers, scatters and uneven all-to-alls); the root; the
    reduce op; the uneven sizes (the same list on every rank)."""
    fp: dict[str, Any] = {"op": op, "seq": seq}
    if call is not None:
        spec = call.spec
        if call.info is not None:
            fp["dtype"] = call.info.name
            fp["device"] = "host" if call.device is None else "GPU"
            shape = call.shape if call.shape is not None else call.out_shape
            full = spec.name in _FULL_SHAPE or (
                not call.uneven and spec.name in ("all_gather", "gather", "all_to_all")
            )
            if full:
                fp["shape"] = shape
            elif shape is not None:
                fp["row shape"] = tuple(shape[1:])
            if call.sizes is not None:
                fp["sizes"] = tuple(call.sizes)
        if spec.root is not None:
            fp[spec.root] = call.peer
        if spec.reducing:
            fp["reduce op"] = repr(call.redop)
    if site is not None:
        fp["site"] = site
    return fp


def crc(fp: dict[str, Any]) -> int:
    """A stable CRC-32 of a fingerprint (the same on every rank for equal fingerprints)."""
    return zlib.crc32(repr(sorted((k, v) for k, v in fp.items() if k != "site")).encode())


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)


def disagreement(fps: Sequence[dict[str, Any]]) -> str:
    """What the fingerprints (one per rank) disagree on, in words: refusals first, then the
    op, the sequence number, then every other field, each naming which ranks hold which
    value."""
    refused = [(r, fp["refused"]) for r, fp in enumerate(fps) if "refused" in fp]
    parts = [f"rank {r} refused it: {why}" for r, why in refused]
    fields = ["op", "seq", "dtype", "device", "shape", "row shape", "src", "dst", "reduce op"]
    fields += ["sizes", "ranks", "expect"]
    for field in fields:
        values: dict[Any, list[int]] = {}
        for r, fp in enumerate(fps):
            if "refused" in fp and field not in ("op", "seq"):
                continue
            if field in fp:
                values.setdefault(repr(fp[field]), []).append(r)
        if len(values) > 1:
            bits = [f"{v} on {_ranks(rs)}" for v, rs in values.items()]
            name = "the call" if field == "op" else field
            parts.append(f"{name} is " + " but ".join(bits))
    sites = [(r, fp["site"]) for r, fp in enumerate(fps) if "site" in fp]
    if sites:
        parts.append("called at " + "; ".join(f"rank {r}: {s}" for r, s in sites))
    return "; ".join(parts) or "the ranks' calls differ"


# -- point-to-point headers ----------------------------------------------------------------

HEADER_WORDS = 16  # int64: magic, seq, dtype code, element count, ndim, shape (<= 11 dims)
_MAGIC = 0x6870636368656B31  # "hpcchek1"


def encode_header(seq: int, dtype_code: int, count: int, shape: Sequence[int]) -> list[int]:
    """The header a checked send puts before its data."""
    dims = list(shape)[: HEADER_WORDS - 5]
    words = [_MAGIC, seq, dtype_code, count, len(shape), *dims]
    return words + [0] * (HEADER_WORDS - len(words))


def decode_header(words: Any) -> tuple[int, int, int, tuple[int, ...]] | None:
    """(seq, dtype code, count, shape) of a header, or None when it is not one (the sender
    does not run with debug checks)."""
    if int(words[0]) != _MAGIC:
        return None
    ndim = int(words[4])
    return int(words[1]), int(words[2]), int(words[3]), tuple(int(w) for w in words[5 : 5 + ndim])
