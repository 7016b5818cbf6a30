"""The MPI backend's probed receive (a blocking recv matches its message before any data
moves), checked without a peer."""

from __future__ import annotations

import numpy as np


def test_probed_receive_sizes_messages_beyond_2_gib():
    """The probed receive's size check reads the message's size in bytes with a large count:
    MPI_Get_count is MPI_UNDEFINED from 2 GiB, which once passed as 'fits'."""
    from mpi4py import MPI

    from hpccomm.backends.mpi import _ProbedRecv

    class Message:
        took = -1

        def Recv(self, buf):  # noqa: N802 - mpi4py's name
            self.took = buf[0].nbytes

    r = _ProbedRecv(None, None, np.empty(2), MPI.DOUBLE, 0, 0)  # type: ignore[arg-type]
    r.status.Set_elements(MPI.BYTE, 2**31 + 8)
    msg = Message()
    assert r._fits(msg) is False  # type: ignore[arg-type]
    assert r.longer == msg.took == 2**31 + 8  # dropped into scratch (not touched: np.empty)
    r = _ProbedRecv(None, None, np.empty(2), MPI.DOUBLE, 0, 0)  # type: ignore[arg-type]
    r.status.Set_elements(MPI.BYTE, 16)
    assert r._fits(Message()) is True  # type: ignore[arg-type]


def test_probed_receive_without_memory_for_the_scratch_says_so():
    """A longer message whose scratch cannot be allocated: a MismatchError naming both sizes
    and what is left (the message stays matched), not a bare MemoryError."""
    import pytest
    from mpi4py import MPI

    from hpccomm.backends.mpi import _ProbedRecv
    from hpccomm.errors import MismatchError
    from hpccomm.ops import Group

    class Call:
        group = Group("world", 1, 2)  # names the peer (Group.peer)

        def where(self, seq):
            return f"recv #{seq} on world (rank 1 of 2)"

    class Message:
        def Recv(self, buf):  # noqa: N802 - mpi4py's name
            raise AssertionError("nothing to receive into")

    r = _ProbedRecv(Call(), None, np.empty(2), MPI.DOUBLE, 0, 0)  # type: ignore[arg-type]
    r.seq = 7
    r.status.Set_elements(MPI.BYTE, 2**62)  # more than any machine has
    with pytest.raises(MismatchError, match=r"recv #7 on world \(rank 1 of 2\): .* of "
                       r"4,611,686,018,427,387,904 bytes .* buffer's 16 bytes.*not enough "
                       r"memory.*stays matched"):  # fmt: skip
        r._fits(Message())  # type: ignore[arg-type]
