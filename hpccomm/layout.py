"""Parallel layouts: tensor/pipeline/data/context/expert parallel groups from one call.

Pure arithmetic, no MPI. Two conventions, one object:

- Megatron order string (default ``"tp-cp-ep-dp-pp"``): the FIRST token varies fastest,
  ``rank = sum_i idx_i * prod_{j<i} size_j``. As in Megatron-LM's ``RankGenerator``, the order
  is case-insensitive and may leave out dimensions of size 1 (they are appended, in the order
  tp, pp, dp, ep, cp); leaving out a dimension of size > 1 is an error.
- DeviceMesh shape with dimension names: ``arange(world).reshape(shape)``, the LAST dimension
  varies fastest. So Megatron order ``"tp-dp-pp"`` is the mesh ``("pp", "dp", "tp")``.

The group of a set of tokens M holds the ranks that differ only in the coordinates of M.

Example (world 64, tp 4, pp 2, dp 8, default order): rank 37 has tp 1, dp 1, pp 1; TP groups
are [0..3], [4..7], ...; DP groups [0, 4, ..., 28], ...; PP groups [0, 32], ...
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

from .errors import InvalidArgumentError
from .ops import as_int, index_in

__all__ = ["Layout", "TOKENS", "DEFAULT_ORDER"]

TOKENS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"

# The order in which an order string's missing size-1 dimensions are appended: the key order
# of RankGenerator.name_to_size in Megatron-LM megatron/core/parallel_state.py
# (RankGenerator.__init__ loops over it and appends "-" + name for each name not in the order).
_APPEND_ORDER = ("tp", "pp", "dp", "ep", "cp")


def _parse_tokens(
    spec: str | Sequence[str], known: Sequence[str], what: str, *, fold_case: bool = False
) -> tuple[str, ...]:
    """Split ``spec`` ("tp-dp" or a sequence of tokens) and check each token is known and
    appears once. ``fold_case`` lower-cases a string or each token of a sequence first
    (Megatron's RankGenerator does ``order.lower()``; its get_ranks does not lower-case the
    group tokens)."""
    if not isinstance(spec, str) and not (
        isinstance(spec, Sequence)
        and not isinstance(spec, bytes | bytearray)
        and all(isinstance(t, str) for t in spec)
    ):
        raise InvalidArgumentError(
            f"layout: {what}={spec!r} ({type(spec).__name__}), expected a string of tokens "
            f"of {'-'.join(known)} such as 'tp-dp', or a sequence of them"
        )
    tokens = tuple(spec.split("-")) if isinstance(spec, str) else tuple(spec)
    if fold_case:
        tokens = tuple(t.lower() for t in tokens)
    if not tokens or tokens == ("",):
        raise InvalidArgumentError(f"layout: {what} is empty, expected tokens of {'-'.join(known)}")
    # Megatron rejects an unknown token too (RankGenerator.__init__ looks each one up in
    # name_to_size: KeyError); it has no check for a repeated token, which hpccomm rejects
    # because a repeated dimension of size > 1 makes the grid disagree with the world size.
    unknown = [t for t in tokens if t not in known]
    if unknown:
        raise InvalidArgumentError(
            f"layout: {what} {spec!r} has unknown token(s) {unknown}; known: {'-'.join(known)}"
        )
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if repeated:
        raise InvalidArgumentError(
            f"layout: {what} {spec!r} repeats {repeated}; each token may appear once"
        )
    return tokens


def _size(name: str, value: Any) -> int:
    """A layout size: an integer >= 1 (NumPy integers too, as an int; bools not)."""
    size = as_int(value)
    if size is None or size < 1:
        raise InvalidArgumentError(f"layout: {name} is {value!r}, expected an integer >= 1")
    return size


class Layout:
    """A world of ``world_size`` ranks laid out as a grid of named dimensions.

    Args:
        world_size: number of ranks.
        tp, pp, cp, ep: sizes (default 1).
        dp: data-parallel size; None derives it as world / (tp*pp*cp*ep).
        order: Megatron order string, first token fastest (default "tp-cp-ep-dp-pp"), in
            any case. Dimensions of size 1 may be left out: they are appended in the order
            tp, pp, dp, ep, cp, as Megatron-LM's RankGenerator does. ``Layout(16, tp=4, pp=2,
            dp=2, order="tp-pp-dp")`` has the order "tp-pp-dp-ep-cp".

    Raises:
        InvalidArgumentError: (a ValueError) sizes that are not integers >= 1 or whose
            product is not the world size (saying what would fit); an order with unknown or
            repeated tokens, or leaving out a dimension of size > 1; or ep > 1 together with
            cp > 1 (Megatron's dense layout does not combine them: use :meth:`expert` for
            expert parallelism).
    """

    def __init__(
        self,
        world_size: int,
        *,
        tp: int = 1,
        pp: int = 1,
        dp: int | None = None,
        cp: int = 1,
        ep: int = 1,
        order: str = DEFAULT_ORDER,
    ) -> None:
        # Megatron-LM megatron/core/parallel_state.py, RankGenerator.__init__: order.lower().
        tokens = _parse_tokens(order, TOKENS, "order", fold_case=True)
        # NumPy integers are taken as Python ints (the communicator takes them too), bools not
        tp, pp, cp, ep = (_size(n, v) for n, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)))
        world_size = _size("world", world_size)
        dp = None if dp is None else _size("dp", dp)
        sizes = {"tp": tp, "pp": pp, "cp": cp, "ep": ep}
        others = tp * pp * cp * ep
        if dp is None:
            if world_size % others:
                raise InvalidArgumentError(
                    f"layout: world {world_size} is not divisible by tp*pp*cp*ep = "
                    f"{tp}*{pp}*{cp}*{ep} = {others}; world sizes that fit are multiples of "
                    f"{others}"
                )
            dp = world_size // others
        sizes["dp"] = dp
        product = others * dp
        if product != world_size:
            fit = (
                f"dp={world_size // others}"
                if world_size % others == 0
                else f"a world size of {product}"
            )
            raise InvalidArgumentError(
                f"layout: tp*pp*dp*cp*ep = {tp}*{pp}*{dp}*{cp}*{ep} = {product}, expected the "
                f"world size {world_size}; {fit} would fit"
            )
        # Megatron-LM megatron/core/parallel_state.py, RankGenerator.__init__ asserts
        # "ep == 1 or cp == 1" whatever the order says.
        if ep > 1 and cp > 1:
            raise InvalidArgumentError(
                f"layout: ep={ep} and cp={cp} are both above 1, which the dense layout does not "
                f"support; lay out attention with cp and experts with layout.expert(ep={ep})"
            )
        # Megatron-LM megatron/core/parallel_state.py, RankGenerator.__init__: a dimension the
        # order leaves out is an error when its size is not 1, else appended at the end (in
        # the order of _APPEND_ORDER). All five sizes are checked, also those outside _tokens,
        # so that no size > 1 is silently dropped.
        lacking = [t for t in _APPEND_ORDER if t not in tokens and sizes[t] != 1]
        if lacking:
            named = ", ".join(f"{t} (size {sizes[t]})" for t in lacking)
            them = "it" if len(lacking) == 1 else "them"
            raise InvalidArgumentError(
                f"layout: order {order!r} lacks {named}; only dimensions of size 1 may be "
                f"left out (they are appended), so name {them}, e.g. "
                f"order={'-'.join((*tokens, *lacking))!r}"
            )
        # The order as given (lower-cased, before size-1 dims were appended): expert() passes
        # it on as Megatron passes the user's order to its expert RankGenerator, and to_json
        # keeps it ("order_given"); == compares the groups (the full order), not this.
        self.given_order = "-".join(tokens)
        tokens += tuple(t for t in _APPEND_ORDER if t not in tokens)
        self.world_size = world_size
        self.order = tokens
        self.sizes = {t: sizes[t] for t in tokens}
        # "expert" for expert() layouts (Megatron's expert_decoder_rank_generator): its groups
        # are named world/expert-tp etc., apart from the dense layout's world/tp. Not part of
        # ==: it names groups, it does not change them.
        self.kind = "dense"

    # -- the DeviceMesh convention -------------------------------------------------------

    @classmethod
    def from_mesh(cls, shape: Sequence[int], names: Sequence[str]) -> Layout:
        """Build from a DeviceMesh-style shape (last dimension fastest), e.g.
        ``Layout.from_mesh((2, 8, 4), ("pp", "dp", "tp"))`` == ``Layout(64, tp=4, dp=8, pp=2,
        order="tp-dp-pp")``. Dimensions not named get size 1 and are appended to the order as
        for a Megatron order that leaves them out. ``names`` may be one string ("pp-dp-tp")."""
        if isinstance(names, str):  # not its characters
            names = names.split("-")
        if len(shape) != len(names):
            raise InvalidArgumentError(
                f"layout: mesh shape {tuple(shape)} has {len(shape)} dims but {len(names)} names"
            )
        values = [as_int(s) for s in shape]
        bad = [s for s, v in zip(shape, values, strict=True) if v is None or v < 1]
        if bad:
            raise InvalidArgumentError(
                f"layout: mesh shape {tuple(shape)} has {bad}, expected integers >= 1"
            )
        shape = values  # type: ignore[assignment]  # (NumPy integers as ints)
        names = _parse_tokens(list(names), TOKENS, "mesh names")
        sizes = dict(zip(names, shape, strict=True))
        # The dimensions not named have size 1: __init__ appends them as Megatron does.
        order = list(reversed(names))
        return cls(
            math.prod(shape),
            tp=sizes.get("tp", 1),
            pp=sizes.get("pp", 1),
            dp=sizes.get("dp", 1),
            cp=sizes.get("cp", 1),
            ep=sizes.get("ep", 1),
            order="-".join(order),
        )

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The DeviceMesh shape (slowest first) equivalent to the order."""
        return tuple(self.sizes[t] for t in reversed(self.order))

    @property
    def mesh_names(self) -> tuple[str, ...]:
        return tuple(reversed(self.order))

    # -- coordinates ---------------------------------------------------------------------

    def _check_rank(self, rank: int) -> int:
        """``rank`` as an int in 0..world_size-1 (NumPy integers too, bools not)."""
        return index_in(rank, self.world_size, "layout", "rank")

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along every dimension."""
        rank = self._check_rank(rank)
        out = {}
        for t in self.order:
            rank, out[t] = divmod(rank, self.sizes[t])
        return out

    def rank_of(self, **coords: int) -> int:
        """The rank at the given coordinates (unnamed dimensions: 0)."""
        rank, stride = 0, 1
        for t in self.order:
            given = coords.pop(t, 0)
            i = as_int(given)  # NumPy integers too, bools not
            if i is None:
                raise InvalidArgumentError(
                    f"layout: {t} is {given!r}, expected an integer in 0..{self.sizes[t] - 1}"
                )
            if not 0 <= i < self.sizes[t]:
                raise InvalidArgumentError(
                    f"layout: {t}={given!r} is not in 0..{self.sizes[t] - 1}"
                )
            rank += i * stride
            stride *= self.sizes[t]
        if coords:
            raise InvalidArgumentError(
                f"layout: unknown dimension(s) {sorted(coords)}; known: {'-'.join(self.order)}"
            )
        return rank

    def normalize(self, dims: str | Sequence[str]) -> tuple[str, ...]:
        """``dims`` as a tuple of tokens in this layout's order ("pp-tp" -> ("tp", "pp"))."""
        return tuple(sorted(_parse_tokens(dims, self.order, "dims"), key=self.order.index))

    def groups(self, dims: str | Sequence[str]) -> list[list[int]]:
        """Every group of the dimension(s) ``dims`` ("tp", "dp-cp", "tp-pp"...), each sorted
        by rank, ordered by their lowest rank."""
        chosen = _parse_tokens(dims, self.order, "dims")
        rest = [t for t in self.order if t not in chosen]
        out = []
        for fixed in itertools.product(*(range(self.sizes[t]) for t in rest)):
            base = dict(zip(rest, fixed, strict=True))
            members = [
                self.rank_of(**base, **dict(zip(chosen, idx, strict=True)))
                for idx in itertools.product(*(range(self.sizes[t]) for t in chosen))
            ]
            out.append(sorted(members))
        return sorted(out)

    def group_of(self, rank: int, dims: str | Sequence[str]) -> list[int]:
        """The members of ``rank``'s group along ``dims``."""
        chosen = _parse_tokens(dims, self.order, "dims")
        mine = self.coords(rank)
        fixed = {t: mine[t] for t in self.order if t not in chosen}
        return sorted(
            self.rank_of(**fixed, **dict(zip(chosen, idx, strict=True)))
            for idx in itertools.product(*(range(self.sizes[t]) for t in chosen))
        )

    def embedding_groups(self) -> list[list[int]]:
        """First and last pipeline stage of every pipeline (one rank when pp == 1)."""
        return sorted(sorted({g[0], g[-1]}) for g in self.groups("pp"))

    def expert(self, *, ep: int, tp: int | None = None) -> Layout:
        """Megatron's expert layout on the same world: its own tp (expert tensor parallel,
        default this layout's tp), ep, and dp (derived); the same pp and the same order, with
        cp = 1. Mirrors Megatron-LM megatron/core/parallel_state.py, initialize_model_parallel
        (``expert_decoder_rank_generator``: RankGenerator(tp=expert_tensor_parallel_size,
        ep=expert_model_parallel_size, dp=world // (etp*ep*pp), pp, cp=1, order=order))."""
        tp = self.sizes["tp"] if tp is None else tp
        pp = self.sizes["pp"]
        try:
            ex = Layout(self.world_size, tp=tp, ep=ep, pp=pp, dp=None, cp=1, order=self.given_order)
        except InvalidArgumentError as exc:  # "layout: world 8 is not divisible by tp*...":
            # say that it is the expert layout, whose tp is the expert tensor parallel size
            raise InvalidArgumentError(
                f"layout.expert(ep={ep}, tp={tp}) (the expert layout: tp is the expert tensor "
                f"parallel size, cp 1, pp {pp} as the dense layout's): "
                f"{str(exc).removeprefix('layout: ')}"
            ) from None
        # Megatron's two refusals: every rank must be in the same pipeline stage in both
        # layouts (else a rank's dense and expert parts sit in different stages), and the
        # dp sizes must agree unless pp is last in the order or 1
        given = self.given_order.split("-")
        if not (given[-1] == "pp" or pp == 1 or ex.sizes["dp"] == self.sizes["dp"]):
            raise InvalidArgumentError(
                f"layout.expert: the expert layout's dp is {ex.sizes['dp']} but the dense "
                f"layout's {self.sizes['dp']}, with order {self.given_order!r}, which does not "
                f"end in pp (pp = {pp}); expected equal dp sizes, or pp last in the order "
                f"(Megatron-LM refuses it too)"
            )
        dense_pp, expert_pp = self.groups("pp"), ex.groups("pp")
        if dense_pp != expert_pp:
            raise InvalidArgumentError(
                f"layout.expert: the pipeline groups differ: {dense_pp} (dense) but "
                f"{expert_pp} (expert, tp={tp}, ep={ep}); a rank would be in different pipeline "
                f"stages for its dense and expert parts (Megatron-LM refuses it too)"
            )
        ex.kind = "expert"
        return ex

    # -- serialization and comparison -----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "world_size": self.world_size,
            "order": "-".join(self.order),
            "sizes": dict(self.sizes),
        }
        if self.given_order != doc["order"]:  # what expert() needs (see __init__)
            doc["order_given"] = self.given_order
        if self.kind != "dense":
            doc["kind"] = self.kind
        return doc

    def groups_json(self) -> str:
        """What decides the groups (world size, sizes, full order) as JSON: what ranks
        building groups compare (the order as given only matters to expert())."""
        doc = self.to_dict()
        doc.pop("order_given", None)
        doc.pop("kind", None)
        doc["order"] = "-".join(self._grouping())
        return json.dumps(doc, sort_keys=True)

    def to_json(self) -> str:
        """A small JSON document (for checkpoint metadata)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> Layout:
        try:
            doc = json.loads(text) if isinstance(text, (str, bytes, bytearray)) else text
        except ValueError as exc:
            raise InvalidArgumentError(f"layout: JSON does not parse: {exc}") from None
        if not isinstance(doc, dict):
            raise InvalidArgumentError(
                f"layout: JSON is {type(doc).__name__} {doc!r:.60}, expected an object with "
                f"world_size, order, sizes"
            )
        try:
            sizes, order, world = doc["sizes"], doc["order"], doc["world_size"]
        except KeyError as exc:
            raise InvalidArgumentError(
                f"layout: JSON lacks {exc}; expected world_size, order, sizes"
            ) from None
        if not isinstance(order, str) or not isinstance(sizes, dict):
            raise InvalidArgumentError(
                f"layout: JSON has order {order!r} and sizes {sizes!r}, expected a string "
                "and an object"
            )
        unknown = sorted(k for k in sizes if k not in TOKENS)
        if unknown:
            raise InvalidArgumentError(
                f"layout: JSON sizes have unknown dimension(s) {unknown}; known: {'-'.join(TOKENS)}"
            )
        # the order as the layout was given it (before size-1 dimensions were appended),
        # where it differs: the full order must be what it gives
        given = doc.get("order_given", order)
        if not isinstance(given, str):
            raise InvalidArgumentError(
                f"layout: JSON has order_given {given!r}, expected a string such as 'tp-dp-pp'"
            )
        kind = doc.get("kind", "dense")
        if kind not in ("dense", "expert"):
            raise InvalidArgumentError(
                f"layout: JSON has kind {kind!r}, expected 'dense' or 'expert' (or none)"
            )
        layout = cls(world, order=given, **sizes)
        full = cls(world, order=order, **sizes).order
        if layout.order != full:
            raise InvalidArgumentError(
                f"layout: JSON has order {order!r} but order_given {given!r}, which gives "
                f"{'-'.join(layout.order)!r}; expected orders that agree"
            )
        layout.kind = kind
        return layout

    def differences(self, other: Layout) -> list[str]:
        """What differs between two layouts, in words (empty when equal)."""
        if not isinstance(other, Layout):
            raise InvalidArgumentError(
                f"layout: differences() compares two Layouts; got {type(other).__name__} {other!r}"
            )
        out = []
        if self.world_size != other.world_size:
            out.append(f"world size {self.world_size} != {other.world_size}")
        for t in sorted(set(self.sizes) | set(other.sizes)):
            a, b = self.sizes.get(t, 1), other.sizes.get(t, 1)
            if a != b:
                out.append(f"{t} {a} != {b}")
        if self._grouping() != other._grouping():
            out.append(f"order {'-'.join(self.order)} != {'-'.join(other.order)}")
        return out

    def _grouping(self) -> tuple[str, ...]:
        """The order of the dimensions above size 1: all the groups depend on (where a
        dimension of size 1 sits changes no rank's coordinates)."""
        return tuple(t for t in self.order if self.sizes[t] > 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and not self.differences(other)

    def __hash__(self) -> int:
        return hash((self.world_size, self._grouping(), tuple(sorted(self.sizes.items()))))

    def __repr__(self) -> str:
        sizes = ", ".join(f"{t}={s}" for t, s in self.sizes.items())
        kind = "" if self.kind == "dense" else f", kind={self.kind!r}"
        return f"Layout({self.world_size}, {sizes}, order={'-'.join(self.order)!r}{kind})"
