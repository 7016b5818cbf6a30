"""The shared-memory fast path's settings (HPCCOMM_SHM, HPCCOMM_SHM_THRESHOLD,
HPCCOMM_SHM_CHUNK, HPCCOMM_SHM_CMA): parsed without MPI."""

import pytest

from hpccomm import InvalidArgumentError
from hpccomm.backends.shm import DEFAULT_CHUNK, settings


def test_defaults():
    s = settings({})
    assert s.enabled and s.threshold is None and s.chunk == DEFAULT_CHUNK and s.cma


@pytest.mark.parametrize("raw", ["0", "off"])
def test_single_copy_off(raw):
    s = settings({"HPCCOMM_SHM_CMA": raw})
    assert s.enabled and not s.cma
    assert "single-copy off" in repr(s)


@pytest.mark.parametrize("raw", ["0", "off", "false", "no"])
def test_off(raw):
    assert not settings({"HPCCOMM_SHM": raw}).enabled


def test_sizes():
    s = settings({"HPCCOMM_SHM_THRESHOLD": "64K", "HPCCOMM_SHM_CHUNK": "2M"})
    assert s.threshold == 64 << 10 and s.chunk == 2 << 20
    assert settings({"HPCCOMM_SHM_THRESHOLD": "0"}).threshold == 0


@pytest.mark.parametrize(
    ("env", "text"),
    [
        (
            {"HPCCOMM_SHM": "maybe"},
            r"^hpccomm: HPCCOMM_SHM is 'maybe', expected 1/true/yes/on or 0/false/no/off "
            r"\(any case\)$",
        ),
        ({"HPCCOMM_SHM_THRESHOLD": "lots"}, "HPCCOMM_SHM_THRESHOLD is 'lots', expected a size"),
        ({"HPCCOMM_SHM_CHUNK": "1K"}, "HPCCOMM_SHM_CHUNK is 1024, expected at least 4096"),
        (
            {"HPCCOMM_SHM_CMA": "Yes Please"},
            "HPCCOMM_SHM_CMA is 'Yes Please', expected 1/true/yes/on or 0/false/no/off",
        ),
    ],
)
def test_refused(env, text):
    with pytest.raises(InvalidArgumentError, match=text):
        settings(env)
