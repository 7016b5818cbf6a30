"""hpccomm: MPI-based HPC communication with torch.distributed's names.

Importing hpccomm initializes nothing: MPI starts in :func:`init`, CuPy is imported only for
device arrays.
"""

from .comm import Communicator, NotMember
from .discovery import LaunchInfo, discover
from .dtypes import ReduceOp
from .errors import (
    BackendError,
    ClosedError,
    CommTimeoutError,
    DtypeError,
    GpuBindingError,
    HpccommError,
    InvalidArgumentError,
    LaunchMismatchError,
    MismatchError,
    PeerError,
    PlacementWarning,
    UnwaitedWorkWarning,
)
from .flight import dump
from .layout import Layout
from .ops import P2POp
from .profiler import Profiler, profile
from .record import CallLog, add_listener, remove_listener
from .runtime import init, is_initialized, world
from .work import Work

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "CallLog",
    "ClosedError",
    "CommTimeoutError",
    "Communicator",
    "DtypeError",
    "GpuBindingError",
    "HpccommError",
    "InvalidArgumentError",
    "LaunchInfo",
    "LaunchMismatchError",
    "MismatchError",
    "NotMember",
    "PeerError",
    "PlacementWarning",
    "UnwaitedWorkWarning",
    "Layout",
    "P2POp",
    "Profiler",
    "ReduceOp",
    "Work",
    "__version__",
    "add_listener",
    "discover",
    "dump",
    "init",
    "is_initialized",
    "profile",
    "remove_listener",
    "world",
]
