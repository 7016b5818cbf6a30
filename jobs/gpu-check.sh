#!/bin/bash
# The whole GPU check on a machine with a CUDA GPU: tests/gpu at 1 and 2 ranks (2 NCCL ranks
# on one GPU only where NCCL allows it: NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >= 2.30), then a
# short bandwidth sweep. Writes everything to the log given as argument.
#
#   jobs/gpu-check.sh /path/to/gpu-check.log
#
# Change: PYTHON and MPIEXEC if not the project's .venv; GPU_CHECK_MAX_BYTES for the sweep.
set -uo pipefail
LOG="${1:?usage: jobs/gpu-check.sh LOGFILE}"
here="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$here/.venv/bin/python}"
MPIEXEC="${MPIEXEC:-$here/.venv/bin/mpiexec}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export NCCL_MULTI_RANK_GPU_ENABLE="${NCCL_MULTI_RANK_GPU_ENABLE:-1}" HPCCOMM_ALLOW_GPU_SHARING=1
export PYTHONUNBUFFERED=1
status=0
{
  echo "== $(date -u) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  for n in 1 2; do
    echo "== tests/gpu on $n rank(s)"
    timeout -k 10 600 "$MPIEXEC" --oversubscribe -n "$n" "$PYTHON" -m pytest -q -rs -p no:cacheprovider \
      --color=no --with-mpi "$here/tests/gpu" || status=1
  done
  echo "== bandwidth sweep (2 ranks)"
  timeout -k 10 600 "$MPIEXEC" --oversubscribe -n 2 "$PYTHON" "$here/benchmarks/bench_gpu.py" \
    --max-bytes "${GPU_CHECK_MAX_BYTES:-268435456}" || status=1
  echo "== exit status $status"
} 2>&1 | tee "$LOG"
exit $status
