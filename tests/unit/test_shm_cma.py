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
