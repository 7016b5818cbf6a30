"""reuse_memory: large reductions stop faulting their temporaries in on every call (glibc's
heap keeps freed memory), and turning it off brings the faults back; the setting's parsing."""

import json
import subprocess
import sys

import pytest

from hpccomm import memory, runtime
from hpccomm.errors import InvalidArgumentError

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only"
)

# 40 MiB float32 all_reduce (above glibc's largest mmap threshold, 32 MiB): page faults per
# call after two warm-up calls, through hpccomm (plain and with a timeout: the worker thread
# allocates in its own arena) and through raw mpi4py on the same buffers.
SCRIPT = r"""
import json, resource, sys
import numpy as np
import hpccomm
world = hpccomm.init()
bounded = world.dup(); bounded.timeout = 60
x = np.ones(10 * 2**20, np.float32)
out = {"state": hpccomm.memory.state()}
for name, call in (
    ("hpccomm", lambda: world.all_reduce(x.copy())),
    ("bounded", lambda: bounded.all_reduce(x.copy())),
    ("mpi4py", lambda: world.mpi.Allreduce(x, np.empty_like(x))),
):
    call(); call()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        call()
    out[name] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
if world.rank == 0:
    print("RESULT " + json.dumps(out))
"""


def _faults(mpiexec, venv_bin, mpi_env, tmp_path, setting, arena="0"):
    script = tmp_path / "faults.py"
    script.write_text(SCRIPT)
    env = dict(mpi_env, HPCCOMM_REUSE_MEMORY=setting, HPCCOMM_SHM_ARENA=arena)
    out = subprocess.run(
        [mpiexec, "--oversubscribe", "-n", "2", str(venv_bin / "python"), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(s for s in out.stdout.splitlines() if s.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_large_reductions_reuse_their_pages(mpiexec, venv_bin, mpi_env, tmp_path):
    # (the arena off: every array here from glibc, whose behaviour the setting changes)
    on = _faults(mpiexec, venv_bin, mpi_env, tmp_path, "1")
    off = _faults(mpiexec, venv_bin, mpi_env, tmp_path, "0")
    assert on["state"].startswith("on (glibc"), on
    assert off["state"] == "off", off
    # One 40 MiB temporary: measured here 5,120-5,650 minor faults per call when off (the
    # kernel maps 8 KiB per fault here; 64 MiB: 8,193) and 0 when on. With transparent huge
    # pages a fault maps 2 MiB, hence bounds relative to the page count and to each other.
    for k in ("hpccomm", "bounded", "mpi4py"):
        assert on[k] < 40 * 2**20 // 4096 / 100, on  # the warm-up calls' pages are reused
        assert off[k] >= 10 and off[k] >= 10 * on[k], (on, off)  # MPI's temporary faults again


@pytest.mark.parametrize("raw", ["0", "off", "no", "false"])
def test_env_turns_it_off(monkeypatch, raw):
    monkeypatch.setenv(memory.ENV, raw)
    assert runtime._reuse_memory(None) is False
    assert runtime._reuse_memory(True) is True


def test_default_is_on_and_bad_values_are_refused(monkeypatch):
    monkeypatch.delenv(memory.ENV, raising=False)
    assert runtime._reuse_memory(None) is True
    monkeypatch.setenv(memory.ENV, "maybe")
    with pytest.raises(
        InvalidArgumentError,
        match=r"^init: HPCCOMM_REUSE_MEMORY is 'maybe', expected 1/true/yes/on or "
        r"0/false/no/off \(any case\) \(keep freed memory mapped or not\)$",
    ):
        runtime._reuse_memory(None)
    with pytest.raises(InvalidArgumentError, match="reuse_memory is 'yes', expected True"):
        runtime._reuse_memory("yes")  # type: ignore[arg-type]


def test_arrays_in_the_arena_reuse_their_pages_either_way(mpiexec, venv_bin, mpi_env, tmp_path):
    # With the arena (hpccomm.arena) the 40 MiB copies come from it, which keeps a freed
    # range's pages up to 64 MiB even with reuse_memory off: hpccomm's calls fault nothing
    # either way; Open MPI's own temporary (glibc) still faults again when it is off.
    on = _faults(mpiexec, venv_bin, mpi_env, tmp_path, "1", arena="1")
    off = _faults(mpiexec, venv_bin, mpi_env, tmp_path, "0", arena="1")
    for k in ("hpccomm", "bounded"):
        assert on[k] < 40 * 2**20 // 4096 / 100 and off[k] < 40 * 2**20 // 4096 / 100, (on, off)
    assert on["mpi4py"] < 40 * 2**20 // 4096 / 100, on
    assert off["mpi4py"] >= 10 and off["mpi4py"] >= 10 * on["mpi4py"], (on, off)
