"""The single-copy path's mover (process_vm_readv / process_vm_writev through ctypes),
without MPI: on this process's own memory, a bad address and a process that is gone."""

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
