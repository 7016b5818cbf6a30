"""Is the MPI library CUDA-aware? Decided before the first device buffer reaches MPI (an MPI
without CUDA support segfaults on a device pointer).

Order: an explicit setting (``init(cuda_aware_mpi=...)``, then ``HPCCOMM_CUDA_AWARE_MPI``)
wins; else the library is asked: MPI 4.1's ``mpi_memory_alloc_kinds`` info key (``cuda:device``
listed), Open MPI's / MPICH's ``MPIX_Query_cuda_support()`` through ctypes where the loaded
libmpi exports it, Open MPI's ``OMPI_MCA_opal_cuda_support`` setting; when nothing answers,
hpccomm is unsure and stages device arrays through pinned host memory.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

from .errors import InvalidArgumentError
from .switches import FALSE, SPELLINGS, TRUE

__all__ = [
    "DevicePath",
    "DeviceConfig",
    "decide",
    "ENV",
    "query_alloc_kinds",
    "query_mpix",
    "loaded_libmpi",
]

ENV = "HPCCOMM_CUDA_AWARE_MPI"


class DevicePath(NamedTuple):
    """How device arrays reach MPI: directly (``cuda_aware``) or staged, and why."""

    cuda_aware: bool
    reason: str

    def describe(self) -> str:
        how = (
            "passed to CUDA-aware MPI directly"
            if self.cuda_aware
            else "staged through pinned host buffers"
        )
        return f"device arrays on the MPI path: {how} ({self.reason})"


class DeviceConfig(NamedTuple):
    """How a communicator handles device arrays: this rank's GPU (None: CPU-only), the
    backend for device collectives ("nccl" or "mpi"), the MPI device path, whether "nccl"
    was chosen by ``device_backend="auto"`` (then a group whose ranks share a GPU that NCCL
    refuses falls back to the MPI device path instead of raising), and why a rank is CPU-only."""

    gpu: int | None
    mode: str
    path: DevicePath
    auto: bool = False
    note: str = ""

    def describe(self) -> str:
        if self.gpu is None:
            why = f" ({self.note})" if self.note else ""
            return f"device arrays: no GPU bound on this rank{why}; {self.path.describe()}"
        if self.mode == "nccl":
            backend = "NCCL (created on the first device collective or enable_nccl())"
            if self.auto:
                backend += "; the MPI device path where NCCL refuses ranks sharing a GPU"
        else:
            backend = "MPI"
        return f"device arrays: GPU {self.gpu}, collectives via {backend}; {self.path.describe()}"


CPU_ONLY = DeviceConfig(None, "mpi", DevicePath(False, "no GPU"))


def loaded_libmpi() -> str | None:
    """Path of the libmpi this process has loaded (after mpi4py.MPI is imported)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libmpi.so" in path or "/libmpi_" in path:
                    return path
    except OSError:
        return None
    return None


def query_alloc_kinds() -> str | None:
    """MPI 4.1 ``mpi_memory_alloc_kinds`` of COMM_WORLD's info, if the library sets it."""
    from mpi4py import MPI

    try:
        info = MPI.COMM_WORLD.Get_info()
        try:
            return info.Get("mpi_memory_alloc_kinds")
        finally:
            info.Free()
    except MPI.Exception:
        return None


def query_mpix() -> int | None:
    """``MPIX_Query_cuda_support()`` of the loaded libmpi, or None if it has no such symbol."""
    path = loaded_libmpi()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        func = lib.MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_int
    func.argtypes = []
    return int(func())


def decide(
    setting: bool | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    alloc_kinds: Callable[[], str | None] = query_alloc_kinds,
    mpix: Callable[[], int | None] = query_mpix,
) -> DevicePath:
    """Decide the device path. ``alloc_kinds``/``mpix`` are the library queries (tests pass
    recorded answers). Raises InvalidArgumentError (a ValueError) for an unreadable ``HPCCOMM_CUDA_AWARE_MPI``."""
    env = os.environ if environ is None else environ
    if setting is not None:
        return DevicePath(bool(setting), f"init(cuda_aware_mpi={bool(setting)})")
    raw = env.get(ENV)
    if raw is not None and raw.strip():
        value = raw.strip().lower()
        if value in TRUE | FALSE:
            return DevicePath(value in TRUE, f"{ENV}={raw}")
        raise InvalidArgumentError(f"init: {ENV}={raw!r}, expected {SPELLINGS}")
    kinds = alloc_kinds()
    if kinds is not None:
        aware = any(k.strip().startswith("cuda") for k in kinds.split(","))
        return DevicePath(aware, f"mpi_memory_alloc_kinds={kinds!r}")
    answer = mpix()
    if answer is not None:
        return DevicePath(answer == 1, f"MPIX_Query_cuda_support() = {answer}")
    ompi = env.get("OMPI_MCA_opal_cuda_support")
    if ompi is not None:
        return DevicePath(ompi.lower() in TRUE, f"OMPI_MCA_opal_cuda_support={ompi}")
    return DevicePath(False, "the MPI library gives no answer, so hpccomm is unsure")
