#!/usr/bin/env bash
# A one-node SLURM on this machine, for the cluster tests (tests/test_cluster.py) and
# benchmarks/bench_cluster.py. Idempotent: run it again and it only starts what is not running.
#
#   sudo scripts/slurm_up.sh --down # stops slurmctld and slurmd
#   sudo scripts/slurm_up.sh        # needs root and Debian's slurm-wlm + munge (apt-get install slurm-wlm munge)
#
# What it does (Debian slurm-wlm 22.05; see docs/cluster.md):
#   a munge key (/etc/munge/munge.key, owner munge, mode 400) and munged as the munge user;
#   /etc/slurm/slurm.conf for this host (`hostname -s`, `nproc` CPUs, one partition "debug"),
#   no accounting (sacct then fails; submitit falls back to squeue);
#   slurmctld and slurmd; then it waits until `sinfo` shows the node idle.
# On failure it prints why on stderr and exits non-zero; the tests then skip, saying so.
set -uo pipefail

fail() { echo "slurm_up: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (CI runs as root; on a laptop: sudo $0)"
if [ "${1:-}" = "--down" ]; then  # stop what this script started (munged is left: other services may use it)
  pkill -x slurmd 2>/dev/null; pkill -x slurmctld 2>/dev/null; echo "slurm_up: slurmd and slurmctld stopped"; exit 0
fi
for bin in munged slurmctld slurmd sinfo scontrol; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || fail "$bin not found: apt-get install -y slurm-wlm munge"
done
export PATH="$PATH:/usr/sbin"

HOST="$(hostname -s)"
CPUS="$(nproc)"
CONF=/etc/slurm/slurm.conf
WAIT_S="${SLURM_UP_WAIT_S:-60}"

# --- munge -----------------------------------------------------------------------------------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null 2>&1; then mungekey --create --keyfile=/etc/munge/munge.key >/dev/null 2>&1
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || fail "no munge user: apt-get install -y munge"
chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  pgrep -x munged >/dev/null && pkill -x -u munge munged 2>/dev/null; sleep 0.5
  if command -v runuser >/dev/null 2>&1; then runuser -u munge -- munged 2>/tmp/munged.err
  else su -s /bin/sh munge -c munged 2>/tmp/munged.err; fi || fail "munged did not start: $(cat /tmp/munged.err)"
  for _ in $(seq 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.25; done
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || fail "munge does not answer (munge -n | unmunge fails)"
fi

# --- slurm.conf ------------------------------------------------------------------------------
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
WANT="$(cat <<EOF
# written by tuning-workbench scripts/slurm_up.sh: a one-node cluster for tests
ClusterName=workbench
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
KillWait=5
MinJobAge=60
InactiveLimit=0
NodeName=$HOST CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
)"
CHANGED=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$WANT" ]; then
  printf '%s\n' "$WANT" > "$CONF"; CHANGED=1
fi

# --- daemons ---------------------------------------------------------------------------------
start() {  # start (or restart after a config change) one daemon
  local name="$1"
  if pgrep -x "$name" >/dev/null; then
    [ "$CHANGED" = 1 ] || return 0
    pkill -x "$name"; for _ in $(seq 20); do pgrep -x "$name" >/dev/null || break; sleep 0.25; done
  fi
  "$name" 2>"/tmp/$name.err" || fail "$name did not start: $(cat "/tmp/$name.err"); see /var/log/slurm/$name.log"
}
start slurmctld
start slurmd

# --- wait for the node ------------------------------------------------------------------------
state=""
for _ in $(seq $((WAIT_S * 2))); do
  state="$(sinfo -h -n "$HOST" -o %T 2>/dev/null | head -1)"
  case "$state" in
    idle|mixed|allocated|completing) echo "slurm_up: node $HOST $state ($CPUS CPUs, partition debug)"; exit 0 ;;
    down*|drain*|fail*) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 ;;
  esac
  sleep 0.5
done
why="$(scontrol show node "$HOST" 2>/dev/null | grep -o 'Reason=.*' | head -1)"
fail "node $HOST is '${state:-not listed}' after ${WAIT_S}s ${why}; see /var/log/slurm/slurmctld.log and slurmd.log"
