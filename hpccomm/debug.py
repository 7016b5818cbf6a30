"""Debug levels: ``off``, ``large`` (default), ``check`` and ``detail``.

``large`` checks the collectives that could make MPI write past a buffer when the ranks'
sizes differ, and only those: the embedded Open MPI moves a message above its eager limit
between ranks of a node with a single-copy transport (smsc/cma) that copies a longer
message than the receive buffer whole, past its end (measured: 128 KiB into a 64 KiB
receive wrote 64 KiB beyond it), while a message within the eager limit is cut cleanly
(MPI_ERR_TRUNCATE, nothing written past). So every collective on the host MPI path whose
largest buffer, as this rank sees it, exceeds :func:`large_bytes` gets the ``check``
exchange below. A rank whose buffers are all smaller sends no message larger than the eager
limit; a rank with a larger one sends nothing before the check, which runs on a
communicator of its own, so a mismatch that straddles the threshold waits (or times out)
instead of matching the other rank's data. The smaller calls are compared afterwards: the
dispatch keeps each one's fingerprint CRC and sequence number and folds them into the
group's next comparison (a larger call, an object collective, a group creation, a barrier,
or the call after DEFERRED_LIMIT such calls in a row); a difference raises a MismatchError
there naming the first call that differed (:func:`earlier_difference`), whose result MPI
may already have got wrong on some ranks.

``check`` compares every collective across the ranks of its group before MPI is called: all
ranks exchange a fingerprint (op, sequence number, dtype, shape or counts, root, reduce op,
split sizes) with one 16-byte allreduce comparing its CRC-32; when the CRCs differ, a second
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

import math
import os
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .dtypes import SUPPORTED_DTYPES
from .errors import InvalidArgumentError
from .ops import Call

__all__ = [
    "LEVELS",
    "DEFAULT",
    "CHECKING",
    "level_from",
    "large_bytes",
    "fingerprint",
    "crc",
    "crc_base",
    "with_seq",
    "disagreement",
    "out_of_step",
    "earlier_difference",
    "earlier_left_messages",
    "exit_difference",
    "call_site",
    "HEADER_WORDS",
    "encode_header",
    "decode_header",
]

LEVELS = ("off", "large", "check", "detail")
DEFAULT = "large"
CHECKING = frozenset({"check", "detail"})  # levels that check every collective
ENV = "HPCCOMM_DEBUG"
# Open MPI's eager limit for ranks of one node, as init sets it before MPI starts
# (runtime.tune_open_mpi), and Open MPI's own default where MPI was started by someone else.
EAGER_ENV = ("OMPI_MCA_btl_sm_eager_limit", "OMPI_MCA_btl_vader_eager_limit")
EAGER_DEFAULT = 4096
# Measured: with an eager limit of 4,096 (32,768) bytes a 4,000 (32,600)-byte message was
# cut cleanly and a 4,040 (32,700)-byte one overwrote; the limit counts Open MPI's headers.
_HEADROOM = 1024
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def level_from(value: Any, what: str) -> str:
    """A debug level: the argument, else ``$HPCCOMM_DEBUG``, else "large"."""
    name = "debug"
    if value is None:
        value = os.environ.get(ENV, DEFAULT).strip() or DEFAULT
        name = ENV  # (a bad value is named where it came from)
    if not isinstance(value, str) or value.lower() not in LEVELS:
        raise InvalidArgumentError(
            f"{what}: {name} is {value!r}, expected one of {', '.join(LEVELS)}"
            + ("" if name == ENV else f" (or {ENV})")
        )
    return value.lower()


# the job's threshold, agreed by init (the smallest of its ranks': a rank's own, from an eager
# limit set on one rank only, checked a collective its peers did not: a hang, an outside hunt)
_job_large: list[int] = []


def agree_large(value: int) -> None:
    """init: the job's threshold, which :func:`large_bytes` returns from now on."""
    _job_large[:] = [value]


def large_bytes(environ: Any = None) -> int:
    """The size above which the ``large`` level checks a collective: the node's eager limit
    (from the environment MPI started with) less room for Open MPI's headers; without
    ``environ``, the job's (:func:`agree_large`) once init has agreed it."""
    if environ is None:
        if _job_large:
            return _job_large[0]
        environ = os.environ
    eager = EAGER_DEFAULT
    for name in EAGER_ENV:
        value = str(environ.get(name, "")).strip()
        if value:
            try:
                eager = int(value, 0)
            except ValueError:
                pass  # Open MPI refuses it at start-up
            break
    return max(eager - _HEADROOM, 0)


def call_site() -> str:
    """``file:line`` of the first frame outside hpccomm (the user's call)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:  # pragma: no cover - always called from user code
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


_FULL_SHAPE = frozenset({"all_reduce", "reduce", "broadcast", "reduce_scatter"})
# a fingerprint has one of these (the full shape, or the row shape where sizes may differ):
# one given on one rank and the other elsewhere is said by the field that decides it (sizes)
_FORMS = frozenset({"shape", "row shape"})


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
            if call.memory is not None:
                fp["memory"] = call.memory
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
            elif spec.name == "scatter":  # the source's array and the others' blocks
                fp["elements per rank"] = tuple(call.counts[0])
        if spec.root is not None:
            fp[spec.root] = call.peer
        if spec.reducing:  # (PREMUL_SUM's factor is each rank's own, as NCCL's: not compared)
            fp["reduce op"] = f"ReduceOp.{call.redop.name}"
    if site is not None:
        fp["site"] = site
    return fp


def crc(fp: dict[str, Any]) -> int:
    """A stable CRC-32 of a fingerprint (the same on every rank for equal fingerprints):
    ``with_seq(crc_base(fp), fp["seq"])``."""
    return with_seq(crc_base(fp), fp.get("seq", 0))


def crc_base(fp: dict[str, Any]) -> int:
    """The CRC-32 of a fingerprint's fields but its sequence number (and call site): the
    same for every run of one cached call."""
    items = sorted((k, _canonical(v)) for k, v in fp.items() if k not in ("site", "seq"))
    return zlib.crc32(repr(items).encode())


def _canonical(value: Any) -> Any:
    """``value`` in a form whose repr is the same in every process for equal values: sets
    (whose order follows string hashing, randomized per process) and dicts (insertion
    order) become sorted lists, recursively."""
    if isinstance(value, (set, frozenset)):
        return ("set", sorted(repr(_canonical(v)) for v in value))
    if isinstance(value, dict):
        return (
            "dict",
            sorted((repr(_canonical(k)), repr(_canonical(v))) for k, v in value.items()),
        )
    if isinstance(value, (list, tuple)):
        return type(value)(_canonical(v) for v in value)
    return value


def with_seq(base: int, seq: int) -> int:
    """``base`` continued over the sequence number."""
    return zlib.crc32(int(seq).to_bytes(8, "little", signed=True), base)


def ranks_text(ranks: Sequence[int]) -> str:
    """``"rank 1"``, ``"ranks 0,2"``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)


def ranks_by_text(pairs: Iterable[tuple[int, str]]) -> dict[str, list[int]]:
    """``(rank, text)`` pairs as each text with the ranks that hold it, in order of first
    appearance."""
    ranks: dict[str, list[int]] = {}
    for r, text in pairs:
        ranks.setdefault(text, []).append(r)
    return ranks


def by_rank(pairs: Iterable[tuple[int, str]]) -> list[str]:
    """Each text with the ranks that hold it, in order of first appearance: ``(rank,
    text)`` pairs to ``["'check' on rank 0", "'large' on ranks 1,2"]``."""
    return [f"{text} on {ranks_text(rs)}" for text, rs in ranks_by_text(pairs).items()]


def _differs(name: str, pairs: Iterable[tuple[int, str]]) -> str | None:
    """``"<name> is A on rank 0 but B on rank 1"`` where the ranks' values differ."""
    bits = by_rank(pairs)
    if len(bits) < 2:
        return None
    return f"{name} is {', '.join(bits[:-1])} but {bits[-1]}"


# what a field absent from a fingerprint means, where "not given" is not the whole story
_NOT_GIVEN = {"sizes": "equal blocks (sizes= not given, or all equal)"}


def disagreement(fps: Sequence[dict[str, Any]]) -> str:
    """What the fingerprints (one per rank) disagree on, in words: refusals first, then the
    op, the sequence number, then every other field, each naming which ranks hold which
    value."""
    refused = [(r, fp["refused"]) for r, fp in enumerate(fps) if "refused" in fp]
    parts = [f"rank {r} refused it: {why}" for r, why in refused]
    fields = [
        "op",
        "seq",
        "dtype",
        "device",
        "memory",
        "shape",
        "row shape",
        "src",
        "dst",
        "reduce op",
    ]
    fields += ["sizes", "elements per rank", "ranks", "expect"]
    # one op on every rank (none refused): a field given on some ranks only is a difference
    # too (sizes= on one rank, none on another), said as "not given"
    alike = not refused and len({fp.get("op") for fp in fps}) == 1
    for field in fields:
        said = _differs(
            "the call" if field == "op" else field,
            (
                (r, repr(fp[field]) if field in fp else _NOT_GIVEN.get(field, "not given"))
                for r, fp in enumerate(fps)
                if (field in fp or (alike and field not in _FORMS and any(field in f for f in fps)))
                and ("refused" not in fp or field in ("op", "seq"))
            ),
        )
        if said is not None:
            parts.append(said)
    if alike and not parts:  # the full shape on some ranks, the row shape on others:
        # uneven sizes given on some ranks only (all_to_all_single's split sizes)
        given = [r for r, fp in enumerate(fps) if "row shape" in fp]
        if given and len(given) < len(fps):
            others = [r for r in range(len(fps)) if r not in given]
            parts.append(
                f"uneven sizes (sizes=, split sizes) given on {_ranks(given)} but not on "
                f"{_ranks(others)} (pass them on every rank or on none; all_to_all_single's "
                f"split sizes count even where they are all equal)"
            )
    if not parts:  # a field the list above does not name: say which, in the same form
        for key in sorted({k for fp in fps for k in fp} - {"site", "refused", *fields}):
            said = _differs(key, ((r, repr(_canonical(fp.get(key)))) for r, fp in enumerate(fps)))
            if said is not None:
                parts.append(said)
    sites = [(r, fp["site"]) for r, fp in enumerate(fps) if "site" in fp]
    if sites:
        parts.append("called at " + "; ".join(f"rank {r}: {s}" for r, s in sites))
    return "; ".join(parts) or "in a field not named here (debug='detail' adds the call sites)"


def out_of_step(fps: Sequence[dict[str, Any]]) -> str | None:
    """Where the fingerprints' sequence numbers differ, in words: which ranks have made how
    many calls more on the group than the ranks behind (None when they agree). The numbers
    count every call of the group on every rank alike (a refused call too), so a difference
    never goes away: every later call would differ as well."""
    seqs = [fp.get("seq") for fp in fps]
    known = [s for s in seqs if isinstance(s, int)]
    if len(set(known)) < 2:
        return None
    low = min(known)
    behind = [r for r, s in enumerate(seqs) if s == low]
    ahead: dict[int, list[int]] = {}
    for r, s in enumerate(seqs):
        if isinstance(s, int) and s != low:
            ahead.setdefault(s - low, []).append(r)
    more = "; ".join(
        f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'} made {k} call{'s' if k > 1 else ''} "
        f"more on it than {_ranks(behind)}"
        for k, rs in sorted(ahead.items())
    )
    return f"the ranks are out of step on this group: {more}"


def _earlier_differing(fps: Sequence[dict[str, Any]]) -> Iterator[tuple[int, list[Any]]]:
    """The number of each call that differs among the ranks' calls not compared when they
    ran (each fingerprint's "earlier" list), in order, with its fingerprint per rank (None
    on a rank that does not list it)."""
    lists = [{e["seq"]: e for e in fp.get("earlier", ())} for fp in fps]
    if not any(lists):
        return
    for seq in sorted(set().union(*lists)):
        row = [calls.get(seq) for calls in lists]
        present = [e for e in row if e is not None]
        if len(present) == len(row) and len({crc(e) for e in present}) == 1:
            continue
        yield seq, row


# bytes per element by dtype name (a fingerprint names its dtype)
_ITEMSIZE = {info.name: info.dtype.itemsize for info in SUPPORTED_DTYPES.values()}
# fields in which calls may differ and still move the same messages between the same ranks
# (the same bytes, the same root): MPI matched each message with its own call
_SAME_MESSAGES = ("reduce op", "dtype", "shape")


def earlier_left_messages(fps: Sequence[dict[str, Any]]) -> bool:
    """Whether an earlier call that differs (see earlier_difference) may have left messages
    unreceived, which the group's later calls would receive as theirs: another root,
    another call, another number of bytes, a call some ranks did not list. Only a reduce
    op, or a dtype or shape of the same bytes, leaves none (an outside hunt: two ranks
    naming different roots of a 16-byte broadcast each sent the other its data, and every
    later broadcast from rank 1 gave rank 0 the previous one's data, for good)."""
    return any(_left_messages(row) for _, row in _earlier_differing(fps))


def _left_messages(row: list[Any]) -> bool:
    """Whether one call's fingerprints, one per rank (None where not listed), differ in
    what MPI moved (see earlier_left_messages)."""
    if any(e is None for e in row):
        return True
    keys = set().union(*row) - {"site", "seq"}
    for key in keys:
        if key not in _SAME_MESSAGES and len({repr(_canonical(e.get(key))) for e in row}) > 1:
            return True
    sizes = set()
    for e in row:
        item = _ITEMSIZE.get(e.get("dtype")) if "dtype" in e else 0
        if item is None:
            return True
        shape = e.get("shape") or e.get("row shape") or ()
        sizes.add(math.prod(shape) * item)
    return len(sizes) > 1


def earlier_difference(fps: Sequence[dict[str, Any]], large: int, now: int) -> str | None:
    """The first call that differs among the ranks' calls not compared when they ran (each
    fingerprint's "earlier" list, by sequence number), in words, or None where they agree.
    ``large``: the size the "large" level compares from; ``now``: the sequence number of
    the call whose comparison found it."""
    for seq, row in _earlier_differing(fps):
        present = [e for e in row if e is not None]
        op = present[0]["op"]
        missing = [r for r, e in enumerate(row) if e is None]
        if missing:
            said = (
                f"compared when it ran on {_ranks(missing)} (a buffer over {large:,} bytes "
                f"there, or another kind of call) but not on the others"
            )
        else:
            said = disagreement(present)
        after = f"those of the calls after it up to #{now - 1}" if now - 1 > seq else ""
        return (
            f"{op} #{seq}: {said}. It was not compared when it ran ({large:,} bytes or less "
            f"in every buffer: the default level compares such calls with the group's next "
            f"compared call), so MPI ran it: its result{', and ' + after + ',' if after else ''}"
            f" may be wrong on some ranks (debug='check' compares every call before it runs)"
        )
    return None


def exit_difference(
    rows: Sequence[tuple[int, dict[int, dict[str, Any]]]], large: int
) -> str | None:
    """At the end of the program, the first of a group's calls that no comparison took (the
    "large" level's deferred calls: no compared call came after them on the group) that the
    ranks did not make alike, in words, or None. ``rows``: per group rank, the number of its
    last collective call on the group and its uncompared calls' fingerprints by number.

    A call number some rank passed without listing it (compared or refused there: a rank
    that keeps no list at all, as a group it could not use) is not judged: its own
    mechanism said so when it ran. A rank whose last call comes before a number another
    rank lists never made that call: its peers completed it alone (a broadcast's root, whose
    message went out eagerly, and the others' data never came)."""
    lasts = [last for last, _ in rows]
    first = rows[0]
    if all(row == first for row in rows):  # the common case, at C speed (a thousand groups
        return None  # of 64 calls took 3 s at 4 ranks with a CRC of each: an outside review)
    listed = sorted(set().union(*(calls for _, calls in rows)))
    for seq in listed:
        if any(last >= seq and seq not in calls for last, calls in rows):
            continue
        present = [(r, calls[seq]) for r, (_, calls) in enumerate(rows) if seq in calls]
        op = present[0][1]["op"]
        never = [r for r, last in enumerate(lasts) if last < seq]
        if never:
            ends = ", ".join(f"#{lasts[r]} on rank {r}" for r in never)
            said = (
                f"made on {_ranks([r for r, _ in present])} but never on "
                f"{_ranks(never)} (their last calls on the group: {ends})"
            )
        elif len({crc(fp) for _, fp in present}) > 1:
            said = disagreement([fp for _, fp in present])
        else:
            continue
        return (
            f"{op} #{seq}: {said}. No compared call came after it on the group ({large:,} "
            f"bytes or less in every buffer: the default level compares such calls with the "
            f"group's next compared call, and the program ended, or freed the group, first), "
            f"so MPI ran it: its result, and maybe those of the group's calls after it, may "
            f"be wrong on some ranks (debug='check' compares every call before it runs)"
        )
    return None


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {list(ranks)}"


# -- point-to-point headers ----------------------------------------------------------------

# int64: magic, seq, dtype code, element count, ndim, shape (<= 10 dims shown), and last
# the tag of the data message on the data communicator
HEADER_WORDS = 16
_MAGIC = 0x6870636368656B32  # "hpcchek2"


def encode_header(
    seq: int, dtype_code: int, count: int, shape: Sequence[int], data_tag: int = 0
) -> list[int]:
    """The header a checked send puts before its data."""
    dims = list(shape)[: HEADER_WORDS - 6]
    words = [_MAGIC, seq, dtype_code, count, len(shape), *dims]
    return words + [0] * (HEADER_WORDS - 1 - len(words)) + [data_tag]


def decode_header(words: Any) -> tuple[int, int, int, tuple[int, ...], int] | None:
    """(seq, dtype code, count, shape, data tag) of a header, or None when it is not one
    (the sender does not run with debug checks)."""
    if int(words[0]) != _MAGIC:
        return None
    ndim = min(int(words[4]), HEADER_WORDS - 6)
    shape = tuple(int(w) for w in words[5 : 5 + ndim])
    return int(words[1]), int(words[2]), int(words[3]), shape, int(words[-1])
