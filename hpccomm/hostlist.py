"""Slurm hostlist expressions: expand ``node[001-004,007]`` and compress name lists.

The grammar follows Slurm: names are separated by commas, spaces, tabs or newlines outside
brackets; a name is literal text and bracket groups; a group holds a comma list of numbers and
``lo-hi`` ranges; several groups expand as a cartesian product (left-most slowest); a range pads
to the width of ``lo``. Expansion keeps order and duplicates, as ``scontrol show hostnames`` does.
"""

from __future__ import annotations

import itertools
import math
import re

from .errors import InvalidArgumentError

__all__ = ["expand", "compress", "expand_tasks_per_node", "MAX_RANGE"]

# The most names a range, a name's bracket product or a whole expression may expand to:
# Slurm's hostlist.c refuses ranges of more than MAX_RANGE (64 * 1024) hosts. Without a limit,
# "n[0-3000000]" took 12 s and 490 MB, "a[0-300]b[0-300]c[0-300]" 2.1 GB.
MAX_RANGE = 64 * 1024

_SEPARATORS = ",\t\n "
_ASCII_DIGITS = re.compile(r"[0-9]+")  # str.isdigit also takes other scripts' digits
_TRAILING_DIGITS = re.compile(r"^(.*?)([0-9]+)$", re.DOTALL)
_TASKS_ITEM = re.compile(r"^([0-9]+)(?:\(x([1-9][0-9]*)\))?$")  # ASCII digits; (x0) repeats none


def _error(expr: str, pos: int, what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"hostlist {expr!r}: {what} at position {pos}")


def _parse_group(expr: str, start: int, end: int) -> list[str]:
    """Expand the inside of one bracket group, expr[start:end], into number strings."""
    out: list[str] = []
    pos = start
    for item in expr[start:end].split(","):
        item_pos = pos
        pos += len(item) + 1
        if item == "":
            raise _error(expr, item_pos, "empty range in brackets")
        if item.startswith("-"):
            raise _error(expr, item_pos, f"negative number {item!r}")
        lo, dash, hi = item.partition("-")
        if not _ASCII_DIGITS.fullmatch(lo) or (dash and not _ASCII_DIGITS.fullmatch(hi)):
            raise _error(expr, item_pos, f"bad range {item!r} (want N or LO-HI, digits only)")
        if not dash:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if a > b:
            raise _error(expr, item_pos, f"range {item!r} has lo {a} > hi {b}")
        if b - a + 1 > MAX_RANGE:
            raise _error(
                expr,
                item_pos,
                f"range {item!r} has {b - a + 1} names, more than the limit of {MAX_RANGE} "
                f"(Slurm's MAX_RANGE)",
            )
        if len(out) + b - a + 1 > MAX_RANGE:
            raise _error(
                expr,
                item_pos,
                f"brackets [{expr[start:end]}] hold at least {len(out) + b - a + 1} names, more "
                f"than the limit of {MAX_RANGE}",
            )
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


def _expand_name(expr: str, start: int, end: int, before: int) -> list[str]:
    """Expand one name (no top-level separators) found at expr[start:end]; ``before`` names
    of the expression precede it (the total is bounded by MAX_RANGE)."""
    parts: list[list[str]] = []
    pos = start
    while pos < end:
        open_at = expr.find("[", pos, end)
        close_at = expr.find("]", pos, end)
        if close_at != -1 and (open_at == -1 or close_at < open_at):
            raise _error(expr, close_at, "']' without '['")
        if open_at == -1:
            parts.append([expr[pos:end]])
            break
        if open_at > pos:
            parts.append([expr[pos:open_at]])
        close_at = expr.find("]", open_at + 1, end)
        if close_at == -1:
            raise _error(expr, open_at, "'[' without ']'")
        nested = expr.find("[", open_at + 1, close_at)
        if nested != -1:
            raise _error(expr, nested, "nested '['")
        parts.append(_parse_group(expr, open_at + 1, close_at))
        pos = close_at + 1
    count = math.prod(len(p) for p in parts)
    if count > MAX_RANGE:
        raise _error(
            expr,
            start,
            f"name {expr[start:end]!r} expands to {count} names "
            f"({' x '.join(str(len(p)) for p in parts if len(p) > 1)}), more than the limit "
            f"of {MAX_RANGE}",
        )
    if before + count > MAX_RANGE:
        raise _error(
            expr,
            start,
            f"the expression expands to more than the limit of {MAX_RANGE} names ({before} "
            f"before this name, {count} in {expr[start:end]!r})",
        )
    return ["".join(combo) for combo in itertools.product(*parts)]


def expand(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names, keeping order and duplicates.

    Args:
        expr: e.g. ``"node[001-003,007],gpu[1-2]-ib rack[0-1]_blade[0-1]"``.

    Returns:
        The names, e.g. ``["node001", "node002", "node003", "node007", ...]``.

    Raises:
        InvalidArgumentError: (a ValueError) naming the expression and the position of the first problem (lo > hi,
            unbalanced or nested brackets, empty range, negative number, more than
            :data:`MAX_RANGE` names in a range, a bracket group, a name or the expression).
    """
    names: list[str] = []
    depth_start = None
    token_start = 0
    for pos, ch in enumerate(expr + ","):
        if ch == "[":
            if depth_start is not None:
                raise _error(expr, pos, "nested '['")
            depth_start = pos
        elif ch == "]":
            if depth_start is None:
                raise _error(expr, pos, "']' without '['")
            depth_start = None
        elif ch in _SEPARATORS and depth_start is None:
            if pos > token_start:
                names.extend(_expand_name(expr, token_start, pos, len(names)))
            token_start = pos + 1
    if depth_start is not None:
        raise _error(expr, depth_start, "'[' without ']'")
    return names


def _split_name(name: str) -> tuple[str, str]:
    match = _TRAILING_DIGITS.match(name)
    if match is None:
        return name, ""
    return match.group(1), match.group(2)


def _group_items(numbers: list[str]) -> list[str]:
    """Turn number strings into bracket items, joining runs a range would expand back to."""
    items: list[str] = []
    i = 0
    while i < len(numbers):
        lo = numbers[i]
        width = len(lo)
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == str(int(numbers[j]) + 1).zfill(width):
            j += 1
        items.append(lo if j == i else f"{lo}-{numbers[j]}")
        i = j + 1
    return items


def compress(names: list[str] | tuple[str, ...]) -> str:
    """Compress host names into a Slurm hostlist expression; ``expand`` gives the list back.

    Only trailing digits are bracketed, and only neighbours that share a prefix are merged, so
    order and duplicates survive: ``compress(["n1", "n2", "n4"]) == "n[1-2,4]"``.

    Raises:
        InvalidArgumentError: (a ValueError) if a name is empty or holds a character of the hostlist syntax.
    """
    out: list[str] = []
    i = 0
    for name in names:
        if not name or any(c in name for c in "[]" + _SEPARATORS):
            raise InvalidArgumentError(
                f"hostlist compress: name {name!r} cannot be written in a hostlist"
            )
    while i < len(names):
        prefix, digits = _split_name(names[i])
        if not digits:
            out.append(prefix)
            i += 1
            continue
        numbers = [digits]
        j = i + 1
        while j < len(names):
            p, d = _split_name(names[j])
            if p != prefix or not d:
                break
            numbers.append(d)
            j += 1
        if len(numbers) == 1:
            out.append(names[i])
        else:
            out.append(f"{prefix}[{','.join(_group_items(numbers))}]")
        i = j
    return ",".join(out)


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's ``SLURM_TASKS_PER_NODE`` form, e.g. ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises:
        InvalidArgumentError: (a ValueError) naming the spec and the bad item, or a list of
            more than :data:`MAX_RANGE` nodes (``1(x100000000)`` took 1.6 GB and 10 s to
            expand, an outside hunt).
    """
    counts: list[int] = []
    for item in spec.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise InvalidArgumentError(
                f"tasks-per-node {spec!r}: bad item {item!r} (want N or N(xM))"
            )
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > MAX_RANGE:
            raise InvalidArgumentError(
                f"tasks-per-node {spec!r}: item {item!r} makes the list longer than the limit "
                f"of {MAX_RANGE} nodes"
            )
        counts.extend([int(match.group(1))] * repeat)
    return counts
