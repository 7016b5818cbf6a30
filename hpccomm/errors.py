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
    "where",
]


class HpccommError(Exception):
    """Base class of every error raised by hpccomm."""


class InvalidArgumentError(HpccommError, ValueError):
    """An argument has the wrong value, shape, size or range."""


class DtypeError(HpccommError, TypeError):
    """A dtype is unsupported, or an op is not defined for it."""


class CommTimeoutError(HpccommError, TimeoutError):
    """An operation did not complete within its time bound."""


class LaunchMismatchError(HpccommError, RuntimeError):
    """The launch environment disagrees with what MPI reports."""


class GpuBindingError(HpccommError, ValueError):
    """Ranks cannot be given GPUs as the job is laid out."""


class ClosedError(HpccommError, RuntimeError):
    """A communicator or handle was used after it was freed."""


class BackendError(HpccommError, RuntimeError):
    """The MPI or NCCL library reported a failure."""


def where(op: str, rank: int | None, size: int | None) -> str:
    """Return the ``"op (rank r of n)"`` prefix every message starts with."""
    if rank is None:
        return op
    return f"{op} (rank {rank} of {size})"
