"""hpccomm.torch.init_process_group bounds MPI's own start by its timeout (no MPI here: the
start is replaced by a recorder)."""

import datetime

import pytest

torch_mod = pytest.importorskip("torch")


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("timeout", "bound"),
    [(datetime.timedelta(seconds=3), 60.0), (300, 300.0), (None, 1800.0)],
)
def test_init_process_group_bounds_mpi_init(monkeypatch, timeout, bound):
    # MPI_Init is a fence over every rank of the job: a rank that started late held the
    # others there, whatever timeout= (an outside hunt, 2026-12-05: 20 s with timeout=3 s,
    # for ever with a rank that never came); hpccomm.init's rule now applies, the larger of
    # the timeout and 60 s (torch's default timeout: 30 min)
    import hpccomm.torch as ht
    from hpccomm import runtime

    seen = {}

    def start(**kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(runtime, "_world", None)
    monkeypatch.setattr(ht, "hpccomm_init", start)
    with pytest.raises(_Stop):
        ht.init_process_group(timeout=timeout)
    assert seen == {"init_timeout": bound}
