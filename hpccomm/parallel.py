"""A rank's Communicators for every dimension of a :class:`~hpccomm.layout.Layout`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Protocol

from .errors import ClosedError, InvalidArgumentError, MismatchError, PlacementWarning
from .layout import Layout

__all__ = ["ParallelGroups", "Splittable"]


class Splittable(Protocol):
    """What ParallelGroups needs of a communicator (a :class:`~hpccomm.comm.Communicator`;
    named by its methods so that this module does not import the communicator's)."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def nccl(self) -> Any: ...

    @property
    def local_size(self) -> int: ...

    def split(
        self,
        color: int | None,
        *,
        key: int | None = None,
        expect: Any = None,
        name: str | None = None,
    ) -> Any: ...

    def enable_nccl(self) -> None: ...


Communicator = Any  # a Splittable's split() result: the group's Communicator


class ParallelGroups:
    """This rank's groups of a layout over ``comm``, created on first use and cached.

    Creating a group is collective over ``comm``: every rank must ask for the same
    dimensions in the same order (``comm.layout(...).tp`` on every rank, say). ``free()``
    frees the groups made so far.

    Example (4 ranks, ``groups = comm.layout(tp=2, dp=2)``): rank 3 has ``groups.tp``
    holding world ranks [2, 3] and ``groups.dp`` holding [1, 3].
    """

    def __init__(self, comm: Splittable, layout: Layout) -> None:
        if layout.world_size != comm.size:
            raise InvalidArgumentError(
                f"layout (rank {comm.rank} of {comm.size}): the layout is for {layout.world_size} "
                f"ranks, expected {comm.size} (this communicator's size)"
            )
        self.comm = comm
        self.layout = layout
        self._groups: dict[tuple[str, ...], Communicator] = {}

    @property
    def coords(self) -> dict[str, int]:
        """This rank's coordinates (tp, cp, ep, dp, pp)."""
        return self.layout.coords(self.comm.rank)

    def members(self, dims: str | Sequence[str]) -> list[int]:
        """Ranks (of ``comm``) in this rank's group along ``dims``."""
        return self.layout.group_of(self.comm.rank, dims)

    def name(self, dims: str | Sequence[str]) -> str:
        """The name of the group along ``dims`` below the communicator's: "tp", "dp-cp";
        "expert-tp", "expert-dp", "expert-ep" for an expert layout (:meth:`Layout.expert`),
        so that its groups are told apart from the dense layout's in errors and traces."""
        joined = "-".join(self.layout.normalize(dims))
        return joined if self.layout.kind == "dense" else f"{self.layout.kind}-{joined}"

    def group(self, dims: str | Sequence[str]) -> Communicator:
        """This rank's Communicator along ``dims`` ("tp", "dp-cp", "tp-pp", ...), members in
        rank order. Collective over ``comm`` on first use."""
        key = self.layout.normalize(dims)
        group = self._groups.get(key)
        if group is None:
            if getattr(self.comm, "freed", False):  # (the split's own error named only
                # "split"; a Splittable of the program's own may not say)
                raise ClosedError(
                    f"layout group {self.name(key)} on {self.comm.name} (rank {self.comm.rank} "
                    f"of {self.comm.size}): communicator {self.comm.name} already freed, and "
                    f"a layout makes its groups from it on first use"
                )
            members = self.members(key)
            group = self.comm.split(
                members[0],
                key=self.comm.rank,
                expect=f"layout group {'-'.join(key)} of {self.layout.groups_json()}",
                # (named by the split, numbered there where another live layout's group has
                # the name: two layouts' "world/tp" could not be told apart)
                name=f"{self.comm.name}/{self.name(key)}",
            )
            got = group.translate(range(group.size), self.comm)  # local: no messages
            if got != members:
                # debug "off" (else the split compared the layouts): the other ranks asked
                # for other groups, or built another layout (a group of the right size and
                # position but other members passed a check of size and rank alone)
                group.free()
                raise MismatchError(
                    f"layout group {self.name(key)} on {self.comm.name} (rank {self.comm.rank} "
                    f"of {self.comm.size}): the split gave ranks {got}, expected {members} by "
                    f"the layout; the ranks asked for different groups or built different "
                    f"layouts (HPCCOMM_DEBUG=check names them)"
                )
            if self.comm.nccl is not None:  # subgroups of an NCCL communicator get theirs too
                group.enable_nccl()
            self._groups[key] = group
            if key == ("tp",) and self.comm.rank == 0:  # (once per layout, not per group)
                note = placement_note(
                    self.comm.name, members, group.num_nodes, self.comm.local_size,
                    self.name(key),
                )  # fmt: skip
                if note:
                    warnings.warn(note, PlacementWarning, stacklevel=3)
        return group

    @property
    def tp(self) -> Communicator:
        return self.group("tp")

    @property
    def pp(self) -> Communicator:
        return self.group("pp")

    @property
    def dp(self) -> Communicator:
        return self.group("dp")

    @property
    def cp(self) -> Communicator:
        return self.group("cp")

    @property
    def ep(self) -> Communicator:
        return self.group("ep")

    def free(self) -> None:
        """Free every group made so far (idempotent).

        Raises:
            InvalidArgumentError: a call of one of them is still running (wait() for it
                first); none is freed then (some were freed, the rest not, and the layout
                kept handles of freed groups: an outside hunt).
            CommTimeoutError, BackendError: as :meth:`Communicator.free`, raised once every
                group is freed.
        """
        groups = [g for g in self._groups.values() if not g.freed]
        # every group closed to new calls first, then looked at once (as Communicator.free
        # does for one): a call another thread started on a later group between the look
        # and its free() made that free() raise after the earlier groups were freed (a
        # review); each group's free() looked again, and a thread refused by the closed
        # group meanwhile still counted as inside it
        here = (
            f"free of the layout over {self.comm.name} (rank {self.comm.rank} of {self.comm.size})"
        )
        if groups:
            type(groups[0])._look(groups, here)
        problems = []
        try:  # (a free() that raises leaves the groups not freed yet closed: ClosedError)
            for group in groups:
                problems += group._free_after()
        finally:
            self._groups = {k: g for k, g in self._groups.items() if not g.freed}
        if problems:  # (a device call unfinished on the GPU: see Communicator.free)
            type(groups[0])._raise_late(problems)


def placement_note(
    comm: str, members: Sequence[int], nodes: int, per_node: int, name: str = "tp"
) -> str:
    """Why rank 0's tensor-parallel group (``members``, ranks of ``comm``, on ``nodes``
    nodes; the layout's group ``name``) is placed badly, or "": it holds consecutive ranks
    (tp numbered fastest, the default order) yet spans nodes, though rank 0's node holds
    ``per_node`` ranks of ``comm``, enough for it. Consecutive ranks share a node only where
    the launcher numbers ranks node by node (Megatron's assumption too); round-robin
    placement sends every layer's tp all_reduce across the network. (A tp group strided by
    an ``order`` that does not put tp first is the user's choice: not judged.)"""
    ranks = list(members)  # (rank 0's group: never empty)
    if nodes < 2 or len(ranks) > per_node or ranks != list(range(ranks[0], ranks[0] + len(ranks))):
        return ""
    return (
        f"hpccomm: layout group {name} on {comm} (rank 0's: ranks {ranks}) spans {nodes} "
        f"nodes, though rank 0's node holds {per_node} ranks of {comm}: its collectives, "
        f"every layer's, cross the network. The layout keeps tp groups inside nodes where "
        f"the launcher numbers ranks node by node (srun's default --distribution=block, "
        f"mpirun --map-by slot), not round-robin across nodes (srun --distribution=cyclic, "
        f"mpirun --map-by node)"
    )
