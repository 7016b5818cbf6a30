"""hpccomm doctor's checks (hpccomm.diagnose.run_checks) in the job's own ranks: they pass on
a sound hpccomm, and an operation that computes a wrong result at large sizes only (the
shared-memory fast path, here made to flip one bit per piece) fails the large check while
the small checks, which never reach that path, still pass."""

import numpy as np
import pytest

from hpccomm.backends import shm
from hpccomm.diagnose import CHECKS, format_checks, run_checks

LARGE = [c.name for c in CHECKS if c.large]


def _by_name(results):
    return {r.name: r for r in results}


def test_every_check_passes_and_says_which_path_ran(world):
    results = run_checks(world, timeout=60)
    bad = [(r.name, r.detail) for r in results if not r.ok]
    assert bad == []
    text = format_checks(results, world.size)
    assert f"{len(CHECKS)} of {len(CHECKS)} operations passed" in text
    got = _by_name(results)
    assert len(LARGE) == 5 and "all_reduce, large" in LARGE and "all_reduce" not in LARGE
    for name in LARGE:
        assert f"PASS  {name}  [calls by path: " in text
        assert got[name].paths  # every large check made calls
    fast = world.size > 1 and world._shm() is not None
    assert ("shm" in got["all_reduce, large"].paths) == fast, got["all_reduce, large"]
    assert "shm" not in got["all_reduce"].paths  # small arrays: MPI


def test_a_wrong_fast_path_fails_the_large_checks_only(world, monkeypatch):
    if world.size < 2 or world._shm() is None:
        pytest.skip("the shared-memory fast path is off here (one rank, or HPCCOMM_SHM=0)")
    real = shm._finish

    def wrong(plan, acc):  # one bit of every reduced piece flipped, after the reduction
        real(plan, acc)
        if acc.nbytes:
            acc.view(np.uint8).reshape(-1)[acc.nbytes // 2] ^= 0x10

    monkeypatch.setattr(shm, "_finish", wrong)
    got = _by_name(run_checks(world, timeout=60))
    small = [c.name for c in CHECKS if not c.large]
    assert [n for n in small if not got[n].ok] == []
    r = got["all_reduce, large"]
    assert not r.ok, r
    assert "elements wrong" in r.detail and "ranks [" in r.detail, r.detail
    assert not got["reduce_scatter, large"].ok
    assert not got["comm.empty (symmetric)"].ok
    assert got["broadcast/all_gather, large"].ok  # moved, not reduced: not on the path
