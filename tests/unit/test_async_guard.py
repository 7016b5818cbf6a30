"""Which calls write their data argument on a rank (the debug check's read-only guard of
async calls refuses a second call on a held array only where one of the two writes it)."""

import numpy as np
import pytest

from hpccomm import ops as O
from hpccomm.dispatch import ReadOnlyWhileRunning

writes = ReadOnlyWhileRunning.writes_data


@pytest.mark.parametrize(
    "spec, rank, peer, expect",
    [
        (O.ALL_REDUCE, 0, None, True),
        (O.BROADCAST, 0, 0, False),  # the root only reads (two broadcasts of it were refused)
        (O.BROADCAST, 1, 0, True),
        (O.REDUCE, 0, 0, True),
        (O.REDUCE, 1, 0, False),  # the other ranks only read
        (O.RECV, 0, 1, True),
        (O.SEND, 0, 1, False),
        (O.ALL_GATHER, 0, None, False),
        (O.REDUCE_SCATTER, 0, None, False),
    ],
)
def test_which_calls_write_their_data(spec, rank, peer, expect):
    assert writes(spec, rank, peer, np.ones(4), None) is expect


def test_an_output_inside_the_input_writes_it():
    # reduce_scatter's in-place form (out is a block of the input) writes the input: it was
    # taken for a read, and another call could read the input while it was being written
    x = np.ones(4)
    assert writes(O.REDUCE_SCATTER, 0, None, x, x[:2])
    assert writes(O.REDUCE_SCATTER, 0, None, x, x)
    assert not writes(O.REDUCE_SCATTER, 0, None, x, np.ones(2))
