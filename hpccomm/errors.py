"""The hpccomm error hierarchy.

Every error hpccomm raises is an :class:`HpccommError`; the subclasses are also the builtin
exception a caller would naturally catch (``ValueError``, ``TypeError``, ``TimeoutError``...).
Messages name the operation, the rank, the argument and expected versus actual.
"""

from __future__ import annotations

__all__ = [
    "HpccommError",
    "InvalidArgumentError",
    "DtypeError",
    "CommTimeoutError",
    "LaunchMismatchError",
    "GpuBindingError",
    "ClosedError",
    "BackendError",
    "MismatchError",
    "PeerError",
    "UnwaitedWorkWarning",
    "where",
]


class HpccommError(Exception):
    """Base class of every error raised by hpccomm."""

    refused = False  # a call refused on this rank after it took its sequence number
    # failed on this rank after the operation completed among the ranks (unpickling what it
    # received): nothing for the others to hear, the group goes on
    local = False


class InvalidArgumentError(HpccommError, ValueError):
    """An argument has the wrong value, shape, size or range."""


class DtypeError(HpccommError, TypeError):
    """A dtype is unsupported, or an op is not defined for it."""


class CommTimeoutError(HpccommError, TimeoutError):
    """An operation did not complete within its time bound."""

    stuck = False  # a collective past its group's bound (the explanation asks the peers)
    final = False  # given up for good (an NCCL call whose communicator was aborted)


class LaunchMismatchError(HpccommError, RuntimeError):
    """The launch environment disagrees with what MPI reports."""


class GpuBindingError(HpccommError, ValueError):
    """Ranks cannot be given GPUs as the job is laid out."""


class ClosedError(HpccommError, RuntimeError):
    """A communicator or handle was used after it was freed."""


class BackendError(HpccommError, RuntimeError):
    """The MPI or NCCL library reported a failure."""

    broke = False  # a collective's failure inside MPI that made its group unusable here


class MismatchError(HpccommError, ValueError):
    """Ranks disagree on a call (a receive shorter than its buffer, different shapes, dtypes,
    ops or call orders on different ranks)."""


class PeerError(HpccommError, RuntimeError):
    """Another rank of the group failed (or left) and this rank's call cannot complete."""

    told = False  # raised on the failing rank's notice while this rank waited in the call


class UnwaitedWorkWarning(RuntimeWarning):
    """An ``async_op`` Work was dropped before its operation completed."""


class PlacementWarning(RuntimeWarning):
    """A layout's tensor-parallel group spans nodes where a node could hold it (the
    launcher placed ranks round-robin across nodes, not node by node)."""


def where(
    op: str,
    rank: int | None = None,
    size: int | None = None,
    *,
    group: str | None = None,
    seq: int | None = None,
) -> str:
    """The prefix every message starts with: ``"op (rank r of n)"``, or with the call's
    sequence number and group ``"op #12 on world/tp (rank r of n)"``. The one place it is
    built."""
    head = op if seq is None else f"{op} #{seq}"
    if group is not None:
        head = f"{head} on {group}"
    if rank is None:
        return head
    return f"{head} (rank {rank} of {size})"
