"""Resolve user arrays into one frozen description the dispatch and backends share.

NumPy arrays take a fast path. CuPy arrays, objects with ``__cuda_array_interface__`` and
objects with ``__dlpack__`` are accepted too; CuPy is imported only when a device array shows
up. A failed conversion re-raises with the original error attached, never swallowed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .errors import DtypeError, InvalidArgumentError

__all__ = ["Buffer", "resolve", "allocate", "on_host"]

_DLPACK_CPU = 1
_DLPACK_CUDA = 2
_DLPACK_CUDA_HOST = 3
_DLPACK_CUDA_MANAGED = 13


class Buffer(NamedTuple):
    """One resolved array: the array itself (NumPy or CuPy), its number of elements, dtype, CUDA
    device id (None for host memory), C-contiguity, its array module, and whether it may be
    written (NumPy's read-only flag; device arrays always may)."""

    array: Any
    elements: int
    dtype: np.dtype
    device: int | None
    contiguous: bool
    xp: Any
    writable: bool


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise DtypeError(f"device arrays need CuPy, which failed to import: {exc}") from exc
    return cupy


def _device_buffer(arr: Any) -> Buffer:
    cp = _cupy()
    return Buffer(arr, arr.size, arr.dtype, arr.device.id, arr.flags.c_contiguous, cp, True)


_ndarray = np.ndarray
_masked = np.ma.MaskedArray
_new = tuple.__new__  # builds a Buffer without NamedTuple's Python-level __new__ (hot path)


def resolve(x: Any, where: object, arg: str = "array") -> Buffer:
    """Describe ``x`` (NumPy, CuPy, CUDA array interface or DLPack); raise DtypeError otherwise.

    ``where`` is the message prefix (or an object whose ``str()`` gives it, formatted only on
    error).
    """
    if type(x) is _ndarray or isinstance(x, np.ndarray) and not isinstance(x, _masked):
        flags = x.flags
        return _new(Buffer, (x, x.size, x.dtype, None, flags.c_contiguous, np, flags.writeable))
    if isinstance(x, _masked):
        raise InvalidArgumentError(
            f"{where}: {arg} is a masked array (numpy.ma), expected a plain array: MPI would "
            f"combine the masked entries too; pass x.filled(value) or x.data explicitly"
        )
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return _device_buffer(x)
    if hasattr(x, "__cuda_array_interface__"):
        cp = _cupy()
        return _device_buffer(cp.asarray(x))
    if hasattr(x, "__dlpack__"):
        try:
            kind, _ = x.__dlpack_device__()
        except Exception as exc:
            raise DtypeError(
                f"{where}: {arg} ({type(x).__name__}) has __dlpack__ but its __dlpack_device__ failed: {exc}"
            ) from exc
        if kind in (_DLPACK_CPU, _DLPACK_CUDA_HOST):
            return resolve(np.from_dlpack(x), where, arg)
        if kind in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED):
            return _device_buffer(_cupy().from_dlpack(x))
        raise DtypeError(
            f"{where}: {arg} ({type(x).__name__}) lives on DLPack device type {kind}, expected CPU (1) or CUDA (2)"
        )
    raise DtypeError(
        f"{where}: {arg} is {type(x).__name__}, expected a NumPy or CuPy array "
        f"(or an object with __cuda_array_interface__ or __dlpack__)"
    )


def flat(a: np.ndarray) -> np.ndarray:
    """A contiguous host array as one flat ndarray view (no copy). A subclass's reshape may
    keep two axes: np.matrix stayed (1, n), and the shared-memory path failed on it
    ("operands could not be broadcast together", an outside hunt) where MPI's path works."""
    return a.view(np.ndarray).reshape(-1)


def on_host(x: Any) -> bool:
    """Whether :func:`resolve` takes ``x`` for host memory (a NumPy array, or DLPack's CPU
    or CUDA-host memory), without resolving it: not a CuPy array, an object with
    ``__cuda_array_interface__`` or DLPack device memory. Never raises (what resolve
    refuses counts as host: it is refused before any device path)."""
    if isinstance(x, np.ndarray):
        return True
    if type(x).__module__.startswith("cupy") or hasattr(x, "__cuda_array_interface__"):
        return False
    if hasattr(x, "__dlpack__"):
        try:
            return x.__dlpack_device__()[0] in (_DLPACK_CPU, _DLPACK_CUDA_HOST)
        except Exception:  # noqa: BLE001 - resolve refuses it
            return True
    return True


def allocate(
    shape: tuple[int, ...], dtype: np.dtype, device: int | None, stream: Any = None
) -> Any:
    """An uninitialized output: a NumPy array, or a CuPy array on GPU ``device``, allocated
    on ``stream`` (the call's stream; None: the current one), the stream that then writes it
    (CuPy's pool hands out memory ordered on the allocating stream only)."""
    if device is None:
        return np.empty(shape, dtype)
    cp = _cupy()
    with cp.cuda.Device(device):
        if stream is None:
            return cp.empty(shape, dtype)
        with stream:
            return cp.empty(shape, dtype)
