"""The debug check's read-only guard for async calls (dispatch.ReadOnlyWhileRunning) takes
only arrays NumPy lets it make writable again: it said so right for every kind of array
below (each answer compared with NumPy's own, tried on a fresh array of that kind), and
an array over another library's memory without a buffer interface is left writable."""

import mmap

import numpy as np
import pytest

from hpccomm.dispatch import ReadOnlyWhileRunning, _restorable


class Opaque:
    """Another library's memory (as torch's tensor.numpy()): exposes the array interface,
    no buffer interface."""

    def __init__(self):
        self.keep = np.zeros(8)
        self.__array_interface__ = self.keep.__array_interface__


KINDS = {
    "owning": lambda: np.ones(8),
    "view": lambda: np.ones(8)[2:],
    "view of a view": lambda: np.ones(8)[1:][::2],
    "bytearray": lambda: np.frombuffer(bytearray(64), np.float64),
    "mmap": lambda: np.frombuffer(mmap.mmap(-1, 4096), np.uint8),
    "opaque": lambda: np.asarray(Opaque()),
    "view of opaque": lambda: np.asarray(Opaque())[1:],
}


def numpy_says(make):
    a = make()
    a.flags.writeable = False
    try:
        a.flags.writeable = True
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("kind", list(KINDS))
def test_restorable_agrees_with_numpy(kind):
    a = KINDS[kind]()
    assert a.flags.writeable
    assert _restorable(a) == numpy_says(KINDS[kind])


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_guard_gives_back_what_it_takes(kind):
    a = KINDS[kind]()
    guard = ReadOnlyWhileRunning(a, None, lambda: "all_reduce #1 on world (rank 0 of 1)", True)
    taken = guard.data is not a
    assert taken == numpy_says(KINDS[kind])
    assert a.flags.writeable != taken  # read-only while running, where it was taken
    assert guard.release(guard.data) is a
    assert a.flags.writeable
