"""Pinned host buffers that device arrays are staged through when MPI is not CUDA-aware.

Buffers are kept by size class (powers of two) and reused between calls; a buffer is lent
for one operation at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["StagingPool"]


def _pinned(nbytes: int) -> np.ndarray:
    import cupyx

    return cupyx.empty_pinned((nbytes,), dtype=np.uint8)


class StagingPool:
    """A pool of host buffers. ``allocate(nbytes) -> uint8 array`` defaults to CuPy's pinned
    memory; tests pass a NumPy allocator to check reuse without a GPU."""

    def __init__(self, allocate: Callable[[int], np.ndarray] = _pinned) -> None:
        self._allocate = allocate
        self._free: dict[int, list[np.ndarray]] = {}
        self.allocations = 0

    @staticmethod
    def size_class(nbytes: int) -> int:
        return 1 << max(nbytes - 1, 0).bit_length() if nbytes > 0 else 1

    def take(self, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        """A host array of ``shape``/``dtype`` backed by a pooled buffer; give it back with
        :meth:`give`."""
        cls = self.size_class(nbytes)
        bucket = self._free.get(cls)
        raw = bucket.pop() if bucket else None
        if raw is None:
            raw = self._allocate(cls)
            self.allocations += 1
        return raw[:nbytes].view(dtype).reshape(shape)

    def give(self, array: np.ndarray) -> None:
        """Return a buffer obtained from :meth:`take`."""
        raw = array.base if array.base is not None else array
        while raw.base is not None and isinstance(raw.base, np.ndarray):
            raw = raw.base
        self._free.setdefault(raw.nbytes, []).append(raw)

    def clear(self) -> None:
        self._free.clear()
