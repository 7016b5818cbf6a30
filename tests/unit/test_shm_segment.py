"""Making the shared-memory segment when the group's exchange fails midway (a peer's
failure under ULFM, an interrupted call): nothing stays behind, neither rank 0's open
nameless file nor a named file in /dev/shm. One process, a stand-in communicator."""

import os

import pytest

from hpccomm.backends import shm


class _Failing:
    """rank 0's view of a group whose allgather fails (bcast returns rank 0's own value)."""

    def bcast(self, obj, root=0):
        return obj

    def allgather(self, obj):
        raise RuntimeError("MPI_ERR_PROC_FAILED: a peer died")


def test_nameless_file_is_closed_when_the_exchange_fails():
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(RuntimeError, match="PROC_FAILED"):
        shm._map_memfd(_Failing(), 0, 1 << 20)
    assert set(os.listdir("/proc/self/fd")) - before == set()


def test_named_file_is_unlinked_when_the_exchange_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="PROC_FAILED"):
        shm._map_named(_Failing(), 0, 1 << 20)
    assert list(tmp_path.iterdir()) == []
