"""The single-copy path's mover (process_vm_readv / process_vm_writev through ctypes),
without MPI: on this process's own memory, a bad address and a process that is gone."""

import ctypes
import errno
import mmap
import os
import subprocess
import sys

import numpy as np
import pytest

from hpccomm.backends import shm

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux cross-memory attach")


def test_read_and_write_move_the_bytes():
    cma = shm._Cma()
    src = np.arange(100_003, dtype=np.float64)
    into = np.zeros_like(src)
    cma.read(3, os.getpid(), src.ctypes.data, into)
    assert np.array_equal(into, src)
    dst = np.zeros(7, np.int32)
    cma.write(3, os.getpid(), dst.ctypes.data, np.arange(7, dtype=np.int32))
    assert dst.tolist() == list(range(7))
    cma.read(3, os.getpid(), 0, np.zeros(0))  # nothing to move: no call


def test_a_lane_moves_piece_after_piece_by_address():
    # One lane (the iovecs a call reuses) moves pieces of different sizes and places in
    # turn; a bad address in the middle raises and the next piece moves all the same.
    lane = shm._Cma().lane()
    src = np.arange(50_001, dtype=np.int32)
    into = np.full(50_001, -1, np.int32)
    pieces = [(0, 4096), (4096, 1), (4097, 30_000), (34_097, 15_904)]
    for k, (at, n) in enumerate(pieces):
        if k == 2:
            with pytest.raises(shm._Unreachable, match="process_vm_readv: Bad address"):
                lane.read(5, os.getpid(), 8, into.ctypes.data, 4)
        lane.read(5, os.getpid(), src.ctypes.data + 4 * at, into.ctypes.data + 4 * at, 4 * n)
    assert np.array_equal(into, src)
    back = np.zeros(3, np.int32)
    lane.write(5, os.getpid(), back.ctypes.data + 4, src.ctypes.data + 40, 8)
    assert back.tolist() == [0, 10, 11]
    lane.write(5, os.getpid(), 8, 16, 0)  # nothing to move: no call (the addresses unread)


def test_a_bad_address_names_the_rank_and_the_reason():
    cma = shm._Cma()
    with pytest.raises(shm._Unreachable) as got:
        cma.read(2, os.getpid(), 8, np.zeros(4))
    assert got.value.rank == 2
    assert got.value.reason == "process_vm_readv: Bad address"


def test_a_process_that_is_gone():
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(child.stdout)  # ended and reaped: no such process (unless the id is reused)
    cma = shm._Cma()
    with pytest.raises(shm._Unreachable) as got:
        cma.write(1, pid, 4096, np.zeros(4))
    assert got.value.reason in ("process_vm_writev: No such process",
                                "process_vm_writev: Bad address")  # fmt: skip


def _buffer(n):
    """A symmetric buffer's shape without MPI: a nameless file mapped shared, this rank's
    region registered for fork() children as allocate registers it."""
    fd = os.memfd_create("hpccomm-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, n)
    mm = shm._mmap(fd, n, keep_fd=True)
    os.close(fd)  # (the mapping keeps its own descriptor)
    base = np.frombuffer(mm, np.float64)
    shm._live_mapping(base, base.ctypes.data, n, 0)
    return base


def _in_child(check):
    """Run ``check()`` in a fork() child; its exit status (0: every check passed)."""
    pid = os.fork()
    if pid == 0:
        try:
            code = check()
        except BaseException:  # noqa: BLE001 - said through the status
            code = 99
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_fork_child_remaps_its_buffers_copy_on_write(monkeypatch):
    x = _buffer(1 << 16)
    x[...] = 1

    def child():
        if x[0] != 1:
            return 7
        x[...] = 1000
        return 0 if len(shm._LIVE) == 0 else 8  # (done: a grandchild inherits the pages)

    assert _in_child(child) == 0
    assert (x == 1).all()  # the child's writes stayed its own


def test_a_fork_child_that_cannot_make_a_buffer_private_maps_it_shared_again(monkeypatch, capfd):
    # under strict overcommit the private mapping can fail for want of memory to commit,
    # and a kernel before 6.12 has unmapped the old mapping by then: mapped shared again
    # (said), the buffer stays listed (a grandchild tries again)
    x = _buffer(1 << 16)
    x[...] = 1
    real = ctypes.CDLL(None, use_errno=True)

    class Libc:  # the first (private) mapping fails as for ENOMEM
        def __init__(self, *args, **kwargs):
            self.mmap = self
            self.calls = 0

        def __call__(self, addr, length, prot, flags, fd, off):
            self.calls += 1
            if flags & mmap.MAP_PRIVATE:
                ctypes.set_errno(errno.ENOMEM)
                return None
            real.mmap.restype = ctypes.c_void_p
            real.mmap.argtypes = self.argtypes
            return real.mmap(addr, length, prot, flags, fd, off)

    monkeypatch.setattr(shm.ctypes, "CDLL", Libc)

    def child():
        if x[0] != 1:
            return 7
        x[...] = 5
        return 0 if len(shm._LIVE) == 1 else 8

    code = _in_child(child)
    monkeypatch.undo()
    assert code == 0
    assert (x == 5).all()  # shared with the child, as said
    err = capfd.readouterr().err
    assert "could not make its symmetric buffer" in err and "it stays shared" in err, err
