#!/bin/bash
# Plain mpiexec on a machine without Slurm (a workstation, a cloud VM).
#
#   jobs/mpiexec-local.sh [NP] [command...]     default: 4 ranks, hpccomm doctor
#
# Uses the project's .venv (embedded Open MPI) when present, else the mpiexec on PATH; with
# neither, or a command that is not found, it says so in one line and exits 127. Root and
# more ranks than cores work: the Open MPI settings for both are set below.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
usage="usage: $0 [NP] [command...]   (NP: ranks, a positive integer; default 4 ranks, hpccomm doctor)"
case "${1:-}" in
  -h|--help) echo "$usage"; exit 0 ;;
esac
NP="${1:-4}"
# NP left out ("mpiexec-local.sh hpccomm info") ran "mpiexec -n hpccomm info"
if ! [[ "$NP" =~ ^0*[1-9][0-9]{0,6}$ ]]; then
  echo "mpiexec-local.sh: NP is '$NP', expected a positive integer (the number of ranks, below 10000000)" >&2
  echo "$usage" >&2
  exit 2
fi
shift || true
[ $# -gt 0 ] || set -- hpccomm doctor
if [ -x "$here/.venv/bin/mpiexec" ]; then export PATH="$here/.venv/bin:$PATH"; fi
if ! command -v mpiexec >/dev/null; then
  echo "mpiexec-local.sh: no $here/.venv/bin/mpiexec and no mpiexec on PATH: run \`make install\` (the .venv with Open MPI) or put an MPI's bin on PATH" >&2
  exit 127
fi
if [[ "$1" != -* ]] && ! command -v "$1" >/dev/null; then
  echo "mpiexec-local.sh: '$1' is not a command here (not on PATH, not in $here/.venv/bin): run \`make install\`, or give its path" >&2
  exit 127
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # only matters as root
export OMPI_MCA_mpi_yield_when_idle=1                              # oversubscribed ranks yield
exec mpiexec --oversubscribe -n "$((10#$NP))" "$@"
