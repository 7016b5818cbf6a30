#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine, for hpccomm's Slurm tests.
#
#   tests/slurm/cluster.sh up     install (Debian packages, if missing) and start munged,
#                                 slurmctld and two slurmd (node1, node2, each in its own UTS
#                                 namespace so it has its own hostname)
#   tests/slurm/cluster.sh down   stop them, by pid
#   tests/slurm/cluster.sh env    print the environment the Slurm commands need
#
# Everything lives under $SLURM_RIG (default: .slurm in the repository). Needs root.
# Facts behind the configuration: shared/reference/slurm-rig.md (verified on this kind of
# machine): Slurm 22.05, munge, libpmix2 for srun --mpi=pmix, one TmpFS per node.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
RIG="${SLURM_RIG:-$ROOT/.slurm}"
CONF="$RIG/etc/slurm.conf"
BOUND="${SLURM_START_TIMEOUT:-60}"

log() { echo "slurm-rig: $*" >&2; }

install_packages() {
  # srun --mpi=pmix dlopens the unversioned libpmix.so of libpmix-dev (seen on Debian 12).
  if command -v slurmctld >/dev/null && command -v munged >/dev/null && ls /usr/lib/*/pmix2/lib/libpmix.so >/dev/null 2>&1; then
    return
  fi
  log "installing slurm-wlm, munge, libpmix2, libpmix-dev (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge libpmix2 libpmix-dev >/dev/null
}

start_munge() {
  if [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
    return
  fi
  mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
  [ -f /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
  chmod 0700 /etc/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
  mkdir -p "$RIG/run" && touch "$RIG/run/munged.ours"   # down stops only a munged we started
  munge -n | unmunge | grep -q "STATUS: *Success" || { log "munge does not work"; exit 1; }
}

write_conf() {
  mkdir -p "$RIG/etc" "$RIG/state" "$RIG/log" "$RIG/run" "$RIG/spool/node1" "$RIG/spool/node2"
  mkdir -p /tmp/slurm-node1 /tmp/slurm-node2
  cat >"$CONF" <<CONF
ClusterName=hpccomm
SlurmctldHost=$(hostname -s)
SlurmctldPort=16817
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$RIG/state
SlurmdSpoolDir=$RIG/spool/%n
SlurmctldPidFile=$RIG/run/slurmctld.pid
SlurmdPidFile=$RIG/run/slurmd-%n.pid
SlurmctldLogFile=$RIG/log/slurmctld.log
SlurmdLogFile=$RIG/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
TmpFS=/tmp/slurm-%n
NodeName=node[1-2] NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=10000
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
  install_packages
  start_munge
  if alive "$RIG/run/slurmctld.pid"; then
    log "already up ($RIG)"
    return
  fi
  write_conf
  export SLURM_CONF="$CONF"
  slurmctld -c -f "$CONF"
  for node in node1 node2; do
    SLURM_CONF="$CONF" unshare --uts sh -c "hostname $node; exec slurmd -f '$CONF' -N $node"
  done
  local waited=0
  until sinfo -h -o "%T" 2>/dev/null | grep -qx idle && [ "$(sinfo -h -N -o '%T' | grep -c idle)" = 2 ]; do
    sleep 1
    waited=$((waited + 1))
    if [ "$waited" -ge "$BOUND" ]; then
      log "nodes not idle after ${BOUND}s:"; sinfo -N || true; tail -n 20 "$RIG"/log/*.log >&2 || true
      exit 1
    fi
  done
  log "up: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')(SLURM_CONF=$CONF)"
}

down() {
  if [ -f "$CONF" ] && alive "$RIG/run/slurmctld.pid"; then
    SLURM_CONF="$CONF" timeout 20 scontrol shutdown || true
  fi
  for pidfile in "$RIG"/run/slurmctld.pid "$RIG"/run/slurmd-node1.pid "$RIG"/run/slurmd-node2.pid; do
    for _ in $(seq 1 20); do alive "$pidfile" || break; sleep 0.5; done
    if alive "$pidfile"; then kill "$(cat "$pidfile")" 2>/dev/null || true; sleep 2; fi
    if alive "$pidfile"; then log "$(basename "$pidfile" .pid) ignores SIGTERM: SIGKILL"; kill -9 "$(cat "$pidfile")" 2>/dev/null || true; sleep 0.5; fi
    if alive "$pidfile"; then log "could not stop pid $(cat "$pidfile") ($pidfile)"; else rm -f "$pidfile"; fi
  done
  if [ -f "$RIG/run/munged.ours" ] && [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
    kill "$(cat /run/munge/munged.pid)" || true
  fi
  rm -f "$RIG/run/munged.ours"
  log "down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
