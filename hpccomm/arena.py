"""Ordinary NumPy arrays the node's other ranks can map: large array data in one nameless
shared file per process (the "arena").

The shared-memory fast path (:mod:`hpccomm.backends.shm`) reads a peer's ordinary array with
``process_vm_readv`` and writes into it with ``process_vm_writev``: one copy, but each call
pins the peer's pages in the kernel and moves them through a private piece, which bounds it
well under what the memory allows (issue 12: 2.0-2.2x Open MPI at 64 MiB, 2 ranks, against
3.8x for symmetric buffers, which peers map). Symmetric buffers need the program to allocate
through hpccomm (``comm.empty``). The arena makes every large array NumPy allocates after
``hpccomm.init`` mappable the same way:

- ``hpccomm._arena`` (C) sets NumPy's data allocator (``PyDataMem_SetHandler``, NEP 49) in
  init's context: requests from ``MIN_BYTES`` go to ranges of a file made with
  ``memfd_create`` and mapped shared, the others (and what does not fit) to NumPy's own
  allocator. Freed ranges keep their pages (the next array of that size reuses them) up to
  2 GiB while ``HPCCOMM_REUSE_MEMORY`` is on, 64 MiB (as much as glibc keeps by default)
  while it is off, and never more than :func:`_kept_at_most`; the rest are given back to
  the system (a hole punched in the file).
- Each peer of the node opens the file once, through ``/proc/<pid>/fd/<fd>`` (allowed
  where ``process_vm_readv`` is: the same ptrace check), and maps it whole; a call then
  reads and writes the peer's array in place, as on symmetric buffers.

What stays outside: arrays allocated before init, on other threads (NumPy keeps the
allocator in a context variable: a thread started later begins with NumPy's default),
smaller than ``MIN_BYTES``, or made by other libraries (torch tensors); those take the
single-copy path as before. ``HPCCOMM_SHM_ARENA=0`` turns it off.

Costs: the file is sized to the node's memory but sparse (pages exist once touched, as
anonymous memory); its pages are shared memory (``Shmem`` in /proc/meminfo) and do not get
transparent huge pages unless the system allows them for shared memory
(``shmem_enabled``: "advise", which the arena asks for). Under strict overcommit
(``vm.overcommit_memory`` = 2) a range's pages are allocated when it is handed out, so a
lack of memory is a MemoryError instead of SIGBUS at first touch.

``fork()``: the child's inherited arrays are mapped copy-on-write (the used part of the file
mapped private at the same address): its writes stay its own, and it allocates from NumPy's
own allocator. Unlike ordinary memory, a page the child has not written itself shows the
file's current contents: the parent's (and its peers') later writes into an array that was
live at the fork reach the child. A range live at the fork and freed by the parent while it
has a child is not handed out again (nor given back) until it has none: otherwise the child
would read the parent's next array, or zeros, in its copy of the old one (a review).
"""

from __future__ import annotations

import importlib
import mmap
import os
import sys
import weakref
from typing import Any

from .switches import switch

__all__ = [
    "ENV",
    "MIN_BYTES",
    "check_env",
    "start",
    "state",
    "mine",
    "PeerArena",
    "map_peer",
    "open_file_of",
]

ENV = "HPCCOMM_SHM_ARENA"
MIN_BYTES = 1 << 20  # NumPy allocations from this size go to the arena
KEEP_MAX = 2 << 30  # bytes of freed ranges a process keeps with their pages, at most
# ... with HPCCOMM_REUSE_MEMORY off: as much as glibc keeps by default (its heap's top is
# trimmed beyond twice its largest mmap threshold, 32 MiB on 64-bit); given back at every
# free, a new 4 MiB array per call was 2.2x slower than on glibc's heap (pages faulted in
# again on both sides of the mapping)
KEEP_OFF = 64 << 20

NONE = "it has no arena"  # map_peer's answer for a peer without one
_state: str | None = None  # what start() did, once per process
_keep = 0  # bytes of freed ranges kept with their pages
_mine: tuple[int, int, int, int, int] | None = None  # (fd, base, reserve, dev, inode)


def _module() -> Any:
    """The C half, hpccomm._arena: an optional extension (ImportError where it was not
    built: see start)."""
    return importlib.import_module("hpccomm._arena")


def _memory() -> int:
    """The node's memory (MemTotal); 64 GiB where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 64 << 30


def _kept_at_most(local_size: int) -> int:
    """The most bytes of freed ranges a process keeps with their pages, whatever the
    setting (KEEP_MAX, KEEP_OFF): a quarter of the node's memory over its ranks. (Kept
    without a bound, the arrays of a 4-rank benchmark, 4 to 256 MiB, filled the node's
    24 GiB: each size's ranges stayed when the next size needed new ones; glibc, told to
    keep freed memory, still gives back its heap's top beyond 2 GiB.)"""
    return _memory() // (4 * max(1, local_size))


def _reserve(local_size: int) -> int:
    """The arena's size: the node's memory, but no more than 64 TiB of address space for
    the node's arenas together (every rank maps every peer's whole: x86-64 gives a process
    128 TiB)."""
    return min(_memory(), (1 << 46) // max(1, local_size))


def _strict_overcommit() -> bool:
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() == "2"
    except OSError:
        return False


def check_env(env: Any = None) -> bool:
    """``HPCCOMM_SHM_ARENA`` (an on/off switch, default on); InvalidArgumentError for
    anything else."""
    e = os.environ if env is None else env
    return switch(e, ENV, default=True, where="init", meaning=" (the arena allocator)")


def start(local_size: int, keep: bool, shm: bool, single_copy: bool, env: Any = None) -> str:
    """Set the arena's allocator in the calling context where the path can use it: on
    (``HPCCOMM_SHM_ARENA``, default on), with the shared-memory path and its single copy on
    (``shm``, ``single_copy``: the fast path's settings, HPCCOMM_SHM and HPCCOMM_SHM_CMA)
    and another rank on this node (``local_size``). ``keep``: freed ranges keep their pages
    (HPCCOMM_REUSE_MEMORY). Returns what was done, for ``hpccomm info`` (once per process;
    later calls set the allocator in their context again and return the first answer)."""
    global _state, _mine, _keep
    e = os.environ if env is None else env
    if not switch(e, ENV, default=True, where="init", lenient=True):
        why = f"off ({ENV}=0)"
    elif not shm:
        why = "off (HPCCOMM_SHM=0)"
    elif not single_copy:
        why = "off (HPCCOMM_SHM_CMA=0)"
    elif local_size < 2:
        why = "off (no other rank on this node)"
    else:
        why = ""
    if why:
        if _state is None:
            _state = why
        return _state
    try:
        mod = _module()
    except ImportError as exc:
        _state = f"not available: hpccomm._arena was not built ({exc})"
        return _state
    _keep = min(_kept_at_most(local_size), KEEP_MAX if keep else KEEP_OFF)
    try:
        fd, base = mod.enable(_reserve(local_size), MIN_BYTES, _keep, _strict_overcommit())
    except (OSError, RuntimeError) as exc:
        _state = f"not available: {exc}"
        return _state
    if _mine is None:
        st = os.fstat(fd)
        _mine = (fd, base, mod.state()["reserve"], st.st_dev, st.st_ino)
        os.register_at_fork(after_in_child=_said_in_child)
    if _state is None or not _state.startswith("on"):
        _state = (f"on: NumPy arrays from {MIN_BYTES:,} bytes allocated after init on its "
                  f"thread live in a {_mine[2]:,}-byte sparse shared file the node's ranks "
                  f"map (freed pages kept up to {_keep:,} bytes)")  # fmt: skip
    return _state


def retune(min_bytes: int) -> int:
    """Send NumPy allocations from ``min_bytes`` to the arena, in the calling context too
    (tests: small arrays on the mapped path); returns the previous smallest size. The arena
    must exist (:func:`start`)."""
    if _mine is None:
        raise RuntimeError(f"hpccomm.arena.retune: no arena in this process ({state()})")
    mod = _module()
    before = int(mod.state()["min_bytes"])
    mod.enable(0, min_bytes, _keep, False)  # (sizes only: the arena exists)
    return before


def state() -> str:
    """What :func:`start` did in this process ("off" where it did not run)."""
    return _state or "off (not started)"


def mine() -> tuple[int, int, int, int, int] | None:
    """This process's arena, for its peers: (descriptor, address, bytes, device, inode);
    None where it has none (off, not built, or a fork() child's copy)."""
    if _mine is None:
        return None
    if _module().state()["in_child"]:
        return None
    return _mine


def owns(address: int, nbytes: int) -> bool:
    """Whether ``nbytes`` bytes at ``address`` lie in one live range of this process's
    arena."""
    return _mine is not None and bool(_module().owns(address, nbytes))


def figures() -> dict[str, int]:
    """The arena's counters (bytes in use, peak, kept, allocations, ...); {} without one."""
    return {} if _mine is None else dict(_module().state())


class PeerArena:
    """A peer's arena mapped whole in this process: its address there (``base``), its
    size, and the mapping (NumPy views of peers' arrays are made on it)."""

    __slots__ = ("base", "size", "mm", "__weakref__")

    def __init__(self, base: int, size: int, mm: mmap.mmap) -> None:
        self.base = base
        self.size = size
        self.mm = mm

    def holds(self, address: int, nbytes: int) -> bool:
        return self.base <= address and address + nbytes <= self.base + self.size


# peers' arenas mapped in this process, shared by every group that reaches them: a mapping
# lasts while some group's path holds it (and while a call's views of it live)
_peers: weakref.WeakValueDictionary[tuple[int, int, int], PeerArena] = weakref.WeakValueDictionary()


def open_file_of(pid: int, fd: int, dev: int, ino: int) -> tuple[int, str]:
    """Descriptor ``fd`` of process ``pid`` opened here, read and write, through
    /proc/<pid>/fd/<fd>, and checked to be the file it named (``dev``, ``ino``: in another
    PID namespace that path names another process's file): (the new descriptor, "") or
    (-1, why). The shared-memory segment's ranks and the arena's peers open files so."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        f = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return -1, f"could not open {path}: {exc}"
    try:
        st = os.fstat(f)
    except OSError as exc:
        os.close(f)
        return -1, f"could not open {path}: {exc}"
    if (st.st_dev, st.st_ino) != (dev, ino):
        os.close(f)
        return -1, f"{path} is another file here (another PID namespace?)"
    return f, ""


def map_peer(pid: int, theirs: tuple[int, int, int, int, int] | None) -> PeerArena | str:
    """Process ``pid``'s arena (``theirs``: what its :func:`mine` said) mapped here, or why
    not (a str): opened through /proc/<pid>/fd/<fd> and checked to be the same file (its
    device and inode: in another PID namespace the path names another process's file)."""
    if theirs is None:
        return NONE
    fd, base, size, dev, ino = theirs
    key = (dev, ino, pid)
    got = _peers.get(key)
    if got is not None:
        return got
    f, why = open_file_of(pid, fd, dev, ino)
    if f < 0:
        return why
    try:
        if sys.version_info >= (3, 13):
            mm = mmap.mmap(f, size, trackfd=False)
        else:
            mm = mmap.mmap(f, size)
    except (OSError, ValueError) as exc:
        return f"could not map /proc/{pid}/fd/{fd}: {exc}"
    finally:
        os.close(f)
    peer = _peers[key] = PeerArena(base, size, mm)
    return peer


def _said_in_child() -> None:
    """In a fork() child: say where its arrays could not be made copy-on-write."""
    try:
        s = _module().state()
    except ImportError:
        return
    if not s["in_child"] or s["child_shared"] == 0 or s["top"] == 0:
        return
    how = (
        "they stay shared with the parent, whose reductions see what the child writes there"
        if s["child_shared"] == 1
        else "and could not map them again: touching them ends this child (SIGSEGV)"
    )
    print(
        f"hpccomm: a fork() child (pid {os.getpid()}) could not make the arrays it inherited "
        f"in the arena ({s['top']} bytes at {s['base']:#x}) copy-on-write "
        f"({os.strerror(s['child_errno'])}): {how}",
        file=sys.stderr,
        flush=True,
    )
