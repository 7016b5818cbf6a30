"""Integer reductions wrap around on every MPI hpccomm runs on: init() keeps Open MPI's
saturating op/avx component out, and the MPI backend's probe replaces any integer op the
library gets wrong (here: when mpi4py started MPI before hpccomm could). Each case runs in
its own process, since MPI starts once per process."""

import os
import subprocess
import sys

import pytest

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
ENV.pop("OMPI_MCA_op", None)

CHECK = """
import numpy as np
from hpccomm.backends import mpi as m
from hpccomm.dtypes import SUPPORTED_DTYPES
bad = []
for dt, info in SUPPORTED_DTYPES.items():
    if info.category != "int":
        continue
    for name, ufunc in (("SUM", np.add), ("PRODUCT", np.multiply)):
        a = np.full(67, np.iinfo(dt).max, dt)
        b = np.full(67, 3, dt)
        with np.errstate(over="ignore"):
            expect = ufunc(a, b)
        m._OPS[(name, dt)].Reduce_local(a, b)
        if not np.array_equal(b, expect):
            bad.append(f"{name} {dt.name}")
print("WRONG", bad)
"""


def run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_init_excludes_the_saturating_component():
    out = run(
        "import os, hpccomm\n"
        "hpccomm.init()\n"
        "from hpccomm.backends import mpi as m\n"
        "print('OMPI_MCA_op', os.environ['OMPI_MCA_op'])\n"
        "print('REPLACED', m.probe_integer_ops.__name__,"
        " sorted(k for k in m._numpy_ops if k[0].kind in 'iu'))\n" + CHECK
    )
    assert "OMPI_MCA_op ^avx" in out
    assert "REPLACED probe_integer_ops []" in out  # nothing left for the probe to fix
    assert "WRONG []" in out


def test_probe_fixes_an_mpi_started_before_hpccomm():
    # mpi4py first: MPI starts with op/avx (on CPUs that have AVX), so the probe must act.
    out = run(
        "from mpi4py import MPI\n"
        "from hpccomm.backends import mpi as m\n"
        "replaced = m.probe_integer_ops()\n"
        "print('REPLACED', replaced)\n" + CHECK
    )
    assert "WRONG []" in out
    replaced = out.split("REPLACED ", 1)[1].splitlines()[0]
    if "SUM" not in replaced:
        pytest.skip(f"this MPI/CPU does not saturate (probe replaced {replaced}); nothing to fix")
    assert "SUM uint8" in replaced and "SUM int16" in replaced


def test_user_choice_of_op_components_is_kept():
    env = dict(ENV, OMPI_MCA_op="^avx,sve")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, hpccomm; hpccomm.init(); print(os.environ['OMPI_MCA_op'])",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "^avx,sve"
