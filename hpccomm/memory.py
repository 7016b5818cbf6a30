"""Large temporary buffers that stay mapped: the C library's allocator told not to return
freed memory to the system.

Open MPI's reductions allocate a temporary as large as the message on every call and free it
again. glibc serves any allocation above its mmap threshold (at most 32 MiB on 64-bit Linux)
with a fresh ``mmap`` and unmaps it on ``free``, so each call faults every page in again:
about 8,200 minor page faults per 64 MiB all_reduce, most of its time on this project's
machines. Telling glibc to use its heap for every size (``M_MMAP_MAX`` = 0) and never to trim
it (``M_TRIM_THRESHOLD``) lets the next call reuse the pages already mapped. The cost: memory
freed by the process stays with it (its resident size keeps its high-water mark), which is
what a long-running HPC rank usually wants anyway; ``MALLOC_MMAP_MAX_`` and
``MALLOC_TRIM_THRESHOLD_`` in the environment are glibc's own names for the same settings.
"""

from __future__ import annotations

import ctypes

__all__ = ["ENV", "keep_freed_memory", "state"]

ENV = "HPCCOMM_REUSE_MEMORY"

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_NEVER = 2**31 - 1  # the largest value mallopt's int takes: 2 GiB above the heap's top

_state: str | None = None  # what keep_freed_memory() did, once


def keep_freed_memory() -> str:
    """Tell the C library to keep freed memory mapped (once per process); returns what was
    done, for ``hpccomm info``: "on", or why not ("not glibc: ...")."""
    global _state
    if _state is None:
        _state = _apply()
    return _state


def state() -> str:
    """What :func:`keep_freed_memory` did in this process ("off" when it was not called)."""
    return _state or "off"


def _apply() -> str:
    try:  # the C library already loaded in this process (find_library would run ldconfig)
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return "not available: this process's C library is not glibc"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, _TRIM_NEVER)):
        return "not available: glibc's mallopt refused M_MMAP_MAX=0 / M_TRIM_THRESHOLD"
    version.restype = ctypes.c_char_p
    return f"on (glibc {version().decode()}: M_MMAP_MAX=0, M_TRIM_THRESHOLD={_TRIM_NEVER})"
