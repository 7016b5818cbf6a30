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
    assert settings({"HPCCOMM_SHM_THRESHOLD": " 1 MB "}).threshold == 1 << 20


def test_blank_sizes_are_unset():
    # (a blank threshold was refused, where every other setting takes blank for unset)
    s = settings({"HPCCOMM_SHM_THRESHOLD": " ", "HPCCOMM_SHM_CHUNK": ""})
    assert s.threshold is None and s.chunk == DEFAULT_CHUNK


@pytest.mark.parametrize(
    ("env", "text"),
    [
        # int() took these: 1000 and 3 bytes
        ({"HPCCOMM_SHM_THRESHOLD": "1_000"}, "HPCCOMM_SHM_THRESHOLD is '1_000', expected a size"),
        ({"HPCCOMM_SHM_THRESHOLD": "\u0663"}, "HPCCOMM_SHM_THRESHOLD is '\u0663', expected a"),
        ({"HPCCOMM_SHM_CHUNK": "+8M"}, "HPCCOMM_SHM_CHUNK is '\\+8M', expected a size"),
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


def test_a_file_larger_than_the_available_memory_is_refused_before_it_is_sized():
    # a nameless file is not bounded by /dev/shm: posix_fallocate committed memory until
    # the kernel's out-of-memory killer ended some process (comm.empty(10**13))
    import errno

    from hpccomm.backends.shm import _room_for

    with pytest.raises(OSError, match=r"bytes asked, [\d,]+ available on this node") as err:
        _room_for(1 << 62)
    assert err.value.errno == errno.ENOMEM
    _room_for(4096)  # (a page fits)
