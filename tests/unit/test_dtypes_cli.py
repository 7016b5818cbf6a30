"""Dtype/op tables, in-process CLI calls, and the CLI under mpiexec (bounded)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from hpccomm import DtypeError, InvalidArgumentError, ReduceOp
from hpccomm.cli import main
from hpccomm.dtypes import SUPPORTED_DTYPES, as_reduce_op, check_op, dtype_info


def test_every_documented_dtype_is_supported():
    names = {info.name for info in SUPPORTED_DTYPES.values()}
    assert names == {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    }
    assert dtype_info(np.dtype(ml_dtypes.bfloat16), "x").category == "half"
    assert dtype_info(np.dtype("l"), "x").name == "int64"


def test_dtype_info_refusal_message():
    with pytest.raises(
        DtypeError, match=r"^op \(rank 1 of 2\): out has dtype object, expected one of bool"
    ):
        dtype_info(np.dtype(object), "op (rank 1 of 2)", "out")


@pytest.mark.parametrize("name", ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"])
def test_bool_accepts_logical_ops(name):
    check_op(getattr(ReduceOp, name), dtype_info(np.dtype(bool), "x"), "x")


def test_reduce_op_names_and_equality():
    assert as_reduce_op("SUM", "x") is ReduceOp.SUM
    assert ReduceOp.PREMUL_SUM(2.0) == ReduceOp.PREMUL_SUM(2.0) != ReduceOp.PREMUL_SUM(3.0)
    assert repr(ReduceOp.PREMUL_SUM(0.5)) == "ReduceOp.PREMUL_SUM(0.5)"
    with pytest.raises(DtypeError, match=r"factor is .x. \(str\)"):
        ReduceOp.PREMUL_SUM("x")
    # an int past float64's range was accepted and failed at the call, on every rank
    with pytest.raises(InvalidArgumentError, match=r"factor is an int of 1329 bits, out of"):
        ReduceOp.PREMUL_SUM(10**400)
    with pytest.raises(InvalidArgumentError, match=r"factor is an int of 16610 bits"):
        ReduceOp.PREMUL_SUM(10**5000)  # (past Python's 4,300 digits for int -> str)
    assert ReduceOp.PREMUL_SUM(10**300).factor == 10**300


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("PREMUL_SUM",), r"ReduceOp.PREMUL_SUM: factor is None"),  # was a plain SUM
        (("SUM", 2.0), r"ReduceOp: SUM takes no factor, got 2.0"),  # the factor was ignored
        (("FOO",), r"ReduceOp: name is 'FOO', expected one of SUM, PRODUCT"),  # KeyError later
        (("sum",), r"ReduceOp: name is 'sum'"),
        (("PREMUL_SUM", np.timedelta64(2)), r"factor is .*timedelta64"),  # unhashable later
        (("PREMUL_SUM", True), r"factor is True"),
    ],
)
def test_reduce_ops_made_directly_are_checked(args, text):
    with pytest.raises(DtypeError, match=text):
        ReduceOp(*args)
    import pickle

    op = ReduceOp.PREMUL_SUM(np.float32(0.5))
    assert pickle.loads(pickle.dumps(op)) == op and ReduceOp("MAX") == ReduceOp.MAX


@pytest.mark.parametrize("zero", [False, True])
def test_one_rule_for_every_timeout(zero):
    # init's and a communicator's timeout refused NumPy's float32 (no float subclass) while
    # Work.wait took it: one check now, 0 allowed only where a wait may just poll
    from hpccomm import InvalidArgumentError
    from hpccomm.ops import check_timeout

    for good in (1, 2.5, np.float32(0.5), np.int64(3)):
        assert check_timeout(good, "x", zero) == float(good)
    assert check_timeout(None, "x", zero) is None
    assert (check_timeout(0, "x", True), check_timeout(0.0, "x", True)) == (0.0, 0.0)
    bad = [float("nan"), float("inf"), -1, "1", True, np.bool_(True), [1]] + [0] * (not zero)
    for value in bad:
        with pytest.raises(InvalidArgumentError, match=r"^init: timeout is .*, expected finite"):
            check_timeout(value, "init", zero)
    # past 1e9 s: Python's waits overflow (threading.TIMEOUT_MAX, 9.2e9 s), and every bounded
    # call of a communicator given 1e10 raised a bare OverflowError (an outside hunt)
    assert check_timeout(1e9, "x", zero) == 1e9
    for value in (1e9 + 1, 1e10, 1e300, np.float64(1e12)):
        with pytest.raises(InvalidArgumentError, match=r"^init: timeout is .*, more than 1,000"):
            check_timeout(value, "init", zero)


def test_a_disagreement_of_three_ranks_reads_as_a_list():
    from hpccomm.debug import disagreement

    fps = [{"op": "all_reduce", "seq": 1, "shape": (4 * (r + 1),)} for r in range(3)]
    assert disagreement(fps) == "shape is (4,) on rank 0, (8,) on rank 1 but (12,) on rank 2"


def test_a_field_given_on_some_ranks_only_is_named():
    # sizes= on rank 0 only: the message was "the ranks' calls differ: the ranks' calls
    # differ" (a field was compared only where every rank had it)
    from hpccomm.debug import disagreement

    fps = [
        {"op": "all_gather", "seq": 1, "row shape": (2,), "sizes": (4, 5)},
        {"op": "all_gather", "seq": 1, "shape": (5, 2)},
    ]
    # (an all-equal sizes= is the plain call: "not given" was wrong for the ranks that
    # passed sizes=[5, 5], an outside review found)
    assert disagreement(fps) == (
        "sizes is (4, 5) on rank 0 but equal blocks (sizes= not given, or all equal) on rank 1"
    )
    other = [{"op": "all_gather", "seq": 1}, {"op": "broadcast", "seq": 1, "src": 0}]
    assert disagreement(other) == "the call is 'all_gather' on rank 0 but 'broadcast' on rank 1"


def test_info_no_mpi_in_process(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS", raising=False)
    for var in (
        "OMPI_COMM_WORLD_RANK",
        "PMIX_RANK",
        "PMI_RANK",
        "TORCHELASTIC_RUN_ID",
        "MPI_LOCALRANKID",
    ):
        monkeypatch.delenv(var, raising=False)
    assert main(["info", "--no-mpi", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["launcher"] == "slurm-batch" and doc["size"] == 1
    assert "launch the ranks with srun" in doc["warnings"][0]


def test_cli_reports_bad_environment(monkeypatch, capsys):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "zero")
    assert main(["info", "--no-mpi"]) == 2
    assert "OMPI_COMM_WORLD_RANK='zero' is not an integer" in capsys.readouterr().err


def test_info_table_under_mpiexec_4_ranks(mpiexec, venv_bin, mpi_env):
    for name in ("HPCCOMM_DEBUG", "OMPI_MCA_btl_sm_eager_limit", "OMPI_MCA_btl_vader_eager_limit"):
        mpi_env.pop(name, None)

    def info(ranks, **env):
        done = subprocess.run(
            [mpiexec, "--oversubscribe", "-n", str(ranks), str(venv_bin / "hpccomm"), "info"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**mpi_env, **env},
        )
        assert done.returncode == 0, done.stderr
        return done

    out = info(4)
    lines = out.stdout.strip().splitlines()
    assert lines[0].split() == ["rank", "local", "node", "hostname", "launcher", "gpu", "job"]
    rows = [line.split() for line in lines[1:5]]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert sorted(r[1] for r in rows) == ["0/4", "1/4", "2/4", "3/4"]
    assert {r[2] for r in rows} == {"0/1"} and {r[4] for r in rows} == {"openmpi"}
    assert (
        "debug level: large (collectives above 31,744 bytes compared across ranks; node "
        "eager limit: 32768)" in lines
    )
    # the fast path, probed by the command itself (this machine allows single copy: no Yama)
    shm = [line for line in lines if line.startswith("shared-memory fast path: ")]
    assert shm == ["shared-memory fast path: on, 4 ranks on this node: single copy "
                   "(process_vm_readv/writev) for ordinary arrays, in place for those in the "
                   "peers' arenas (mapped here)"] or (
        os.path.exists("/proc/sys/kernel/yama/ptrace_scope") and "refused" in shm[0]
    ), shm  # fmt: skip
    off = info(2, HPCCOMM_SHM_CMA="0")
    assert ("shared-memory fast path: on, 2 ranks on this node: copy path only: single copy "
            "off (HPCCOMM_SHM_CMA=0)") in off.stdout.splitlines()  # fmt: skip
    assert "arena allocator (HPCCOMM_SHM_ARENA): off (HPCCOMM_SHM_CMA=0)" in off.stdout
    # the arena: on by default (the line above the fast path's), off on request
    assert any(
        line.startswith(
            "arena allocator (HPCCOMM_SHM_ARENA): on: NumPy arrays from "
            "1,048,576 bytes allocated after init"
        )
        for line in lines
    ), lines
    no_arena = info(2, HPCCOMM_SHM_ARENA="0")
    said = no_arena.stdout.splitlines()
    assert "arena allocator (HPCCOMM_SHM_ARENA): off (HPCCOMM_SHM_ARENA=0)" in said
    line = (
        "shared-memory fast path: on, 2 ranks on this node: single copy "
        "(process_vm_readv/writev) for ordinary arrays; peers' arenas not mapped here: "
        "rank 1 (it has no arena); this rank's arena allocator: off (HPCCOMM_SHM_ARENA=0)"
    )
    assert line in said or "refused" in no_arena.stdout, said  # fmt: skip


@pytest.mark.usefixtures("mpiexec")  # skips without one
def test_info_json_standalone_singleton(venv_bin, mpi_env):
    out = subprocess.run(
        [str(venv_bin / "hpccomm"), "info", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=mpi_env,
    )
    assert out.returncode == 0, out.stderr
    (doc,) = json.loads(out.stdout)
    assert (doc["rank"], doc["size"], doc["launcher"], doc["sources"]["size"]) == (
        0,
        1,
        "none",
        "MPI COMM_WORLD",
    )


def test_doctor_under_mpiexec_3_ranks(mpiexec, venv_bin, mpi_env):
    out = subprocess.run(
        [mpiexec, "--oversubscribe", "-n", "3", str(venv_bin / "hpccomm"), "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        env=mpi_env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert len(doc["ranks"]) == 3
    assert [c["name"] for c in doc["checks"] if not c["ok"]] == []


@pytest.mark.usefixtures("mpiexec")  # skips without one
def test_broken_launch_is_named(tmp_path, mpi_env):
    # A stale OMPI_COMM_WORLD_SIZE claims 8 ranks in a 1-rank (singleton) run.
    env = mpi_env
    env.update(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="8")
    out = subprocess.run(
        [sys.executable, "-c", "import hpccomm; hpccomm.init()"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode != 0
    assert "size is 8 from OMPI_COMM_WORLD_SIZE but 1 from MPI COMM_WORLD" in out.stderr
    assert "its own 1-rank MPI world" in out.stderr


@pytest.mark.usefixtures("mpiexec")  # skips without one
def test_jobs_mpiexec_local_script(venv_bin, mpi_env):
    script = Path(__file__).resolve().parents[2] / "jobs" / "mpiexec-local.sh"
    env = mpi_env
    env["PATH"] = f"{venv_bin}:{env['PATH']}"
    out = subprocess.run(
        [str(script), "2", "hpccomm", "info"], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()[1:3]] == ["0", "1"]


@pytest.mark.parametrize("np_arg", ["hpccomm", "0", "-2", "2x", "99999999999999999999"])
def test_jobs_mpiexec_local_script_refuses_a_bad_np(tmp_path, np_arg):
    # NP left out ("mpiexec-local.sh hpccomm info") ran "mpiexec -n hpccomm info"
    script = Path(__file__).resolve().parents[2] / "jobs" / "mpiexec-local.sh"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [str(script), np_arg, "hpccomm", "info"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == (
        f"mpiexec-local.sh: NP is '{np_arg}', expected a positive integer (the number of "
        f"ranks, below 10000000)"
    ), out.stderr
    assert lines[1].startswith("usage: ") and "[NP] [command...]" in lines[1]
    assert out.stdout == ""


@pytest.mark.usefixtures("mpiexec")  # skips without one
@pytest.mark.parametrize(
    ("visible", "gpu_arg", "expect"),
    [
        ("0", "None", "gpu=None ok"),  # a GPU is visible but CuPy is not installed here: CPU-only
        ("0", "True", "CuPy is not installed"),
        ("", "True", "gpu=True but no GPU is visible"),
    ],
)
def test_gpu_binding_without_cupy(mpi_env, visible, gpu_arg, expect):
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: this checks the machine without it")
    env = mpi_env
    env["CUDA_VISIBLE_DEVICES"] = visible
    code = f"import hpccomm; c = hpccomm.init(gpu={gpu_arg}); print('gpu=None ok' if c.device.gpu is None else c.device.gpu)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert expect in out.stdout + out.stderr, out.stdout + out.stderr
    if gpu_arg == "None":  # a GPU was expected (CUDA_VISIBLE_DEVICES names one): said so
        assert "staying CPU-only: CuPy is not installed" in out.stderr, out.stderr


def init_with_gpu(mpiexec, env, ranks, gpu):
    """``hpccomm.init(gpu=gpu)`` on ``ranks`` ranks under mpiexec; each prints its GPU or
    "cpu-only"."""
    code = (
        f"import hpccomm; c = hpccomm.init(gpu={gpu}); "
        f"print('cpu-only' if c.device.gpu is None else c.device.gpu)"
    )
    return subprocess.run([mpiexec, "--oversubscribe", "-n", str(ranks), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip


def test_too_few_gpus_for_the_ranks_under_mpiexec(mpiexec, mpi_env):
    env = mpi_env
    env["CUDA_VISIBLE_DEVICES"] = "0,1"
    auto = init_with_gpu(mpiexec, env, 3, None)
    assert auto.returncode == 0 and auto.stdout.split() == ["cpu-only"] * 3, auto.stderr
    assert "staying CPU-only" in auto.stderr and "would share GPU" in auto.stderr
    strict = init_with_gpu(mpiexec, env, 3, True)
    assert strict.returncode != 0
    assert "local ranks [0, 2] would share GPU 0" in strict.stderr


def test_one_gpu_per_task_without_cupy_names_the_missing_cupy(mpiexec, mpi_env):
    # srun --gpus-per-task=1 under cgroups: every task sees its own GPU as "0". Without
    # CuPy the equal lists were taken for one shared GPU: gpu=True said "local ranks [0, 1]
    # would share GPU 0; give each task its own GPU (srun --gpus-per-task=1 ...)", the option
    # the job had passed, and never that CuPy was missing (an outside hunt)
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: this checks the machine without it")
    env = mpi_env
    env["CUDA_VISIBLE_DEVICES"] = "0"
    auto = init_with_gpu(mpiexec, env, 2, None)
    assert auto.returncode == 0 and auto.stdout.split() == ["cpu-only"] * 2, auto.stderr
    assert auto.stderr.count("staying CPU-only: CuPy is not installed; and where") == 2, auto.stderr
    strict = init_with_gpu(mpiexec, env, 2, True)
    assert strict.returncode != 0
    for r in (0, 1):
        assert f"init (rank {r} of 2): gpu=True but CuPy is not installed (pip install" in (
            strict.stderr
        ), strict.stderr
    assert "GpuBindingError" not in strict.stderr, strict.stderr


def test_tasks_with_their_own_gpus_are_not_warned_that_they_share(mpiexec, mpi_env):
    # srun --gpus-per-task=2 without cgroups: rank r sees GPUs 2r and 2r+1. The prediction
    # from one rank's environment (2 GPUs for 3 ranks) was warned on every rank at init and
    # printed by hpccomm info ("local ranks [0, 2] would share GPU 0"), beside a binding
    # that shares none (an outside hunt)
    env = mpi_env
    wrap = 'r=$OMPI_COMM_WORLD_RANK; CUDA_VISIBLE_DEVICES=$((2*r)),$((2*r+1)) exec "$@"'
    code = (
        "import hpccomm; c = hpccomm.init(); print(c.launch.visible_gpus, list(c.launch.warnings))"
    )
    out = subprocess.run([mpiexec, "--oversubscribe", "-n", "3", "sh", "-c", wrap, "sh", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [
        f"('{2 * r}', '{2 * r + 1}') []" for r in range(3)
    ], out.stdout
    assert "would share" not in out.stderr and "GPU choice" not in out.stderr, out.stderr


def test_a_debug_level_that_differs_across_ranks_is_refused_at_init(mpiexec, venv_bin, mpi_env):
    # With headers on one rank only, a receive took the sender's header for data and the
    # next receive silently got the previous payload; a checking rank's collective waited
    # for a peer that was not checking. init compares the level (one allgather)
    mpi_env.pop("HPCCOMM_DEBUG", None)
    script = (
        "import hpccomm\n"
        "try:\n"
        "    hpccomm.init(timeout=30)\n"
        "    print('initialized')\n"
        "except hpccomm.InvalidArgumentError as exc:\n"
        "    print(exc)\n"
    )
    py = str(venv_bin / "python")
    out = subprocess.run(
        [
            mpiexec,
            "--oversubscribe",
            "-n",
            "1",
            "env",
            "HPCCOMM_DEBUG=check",
            py,
            "-c",
            script,
            ":",
            "-n",
            "2",
            py,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=mpi_env,
    )
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.strip().splitlines())
    assert lines == [
        f"init (rank {r} of 3): the debug level differs across ranks ('check' on rank 0, "
        f"'large' on ranks 1,2); set the same init(debug=...) or HPCCOMM_DEBUG on every rank"
        for r in range(3)
    ], out.stdout


@pytest.mark.parametrize("world", [65536, 8])  # 1.5 MB, and what stdout's buffer holds
def test_output_into_a_pipe_closed_early_ends_without_a_traceback(world):
    # `hpccomm layout ... | head -1`: the reader leaves after one line (a small output is
    # written by the exit's flush: block-buffered, as on a pipe without PYTHONUNBUFFERED,
    # the reader gone before it: status 120 and "Exception ignored ... BrokenPipeError")
    cmd = [sys.executable, "-m", "hpccomm.cli", "layout", "--world", str(world), "--tp", "2"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    if world == 8:
        proc.stdout.close()  # before anything is written
        first = b"world 8: tp=2"
    else:
        first = proc.stdout.readline()
        proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1
    assert first.startswith(f"world {world}: tp=2".encode())
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
