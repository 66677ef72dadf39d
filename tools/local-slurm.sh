#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for trying the cluster path (profiles/slurm) for real.
#
#   sudo tools/local-slurm.sh up       install (Debian/Ubuntu packages), configure, start; idempotent
#   tools/local-slurm.sh status        sinfo and scontrol ping
#   sudo tools/local-slurm.sh down     stop the daemons this script started (by their pid files)
#
# What "up" does, each step only when it is needed:
#   1. apt-get install slurm-wlm munge (slurmctld, slurmd, the client commands, munged)
#   2. a munge key (the package makes one) and munged, as user munge
#   3. /etc/slurm/slurm.conf: cluster "headcount", one node (this host, at 127.0.0.1) with the CPUs
#      and RealMemory that `slurmd -C` measures, one partition "local". No cgroups are needed:
#      proctrack/linuxproc and task/none. No accounting daemon (slurmdbd): accounting_storage/none
#      and jobacct_gather/none; MinJobAge=3600 keeps finished jobs visible to squeue for an hour,
#      which is what the Snakemake SLURM executor reads job states from without sacct
#      (status_command: squeue).
#   4. slurmctld and slurmd, then the node is set to "resume" if an earlier run left it down.
# The files it writes: /etc/slurm/slurm.conf; state and logs under /var/lib/slurm, /var/log/slurm;
# pid files under /run/slurm and /run/munge. Set SLURM_CPUS or SLURM_MEM_MB to override the node's
# measured size, SLURM_PARTITION to name the partition differently, SLURM_NICE=10 to start slurmd
# (and so every job, which inherits its priority) at a lower CPU priority on a shared machine.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
PARTITION=${SLURM_PARTITION:-local}
NODE=$(hostname -s)
RUN=/run/slurm

say() { printf '[local-slurm] %s\n' "$*"; }

need_root() {
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null; then
            exec sudo --preserve-env=SLURM_CPUS,SLURM_MEM_MB,SLURM_PARTITION,SLURM_NICE "$0" "$@"
        fi
        echo "local-slurm: '$1' needs root (or sudo)" >&2
        exit 1
    fi
}

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
    local missing=()
    for cmd in slurmctld slurmd sbatch munged; do
        command -v "$cmd" >/dev/null || PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null || missing+=("$cmd")
    done
    if ((${#missing[@]})); then
        say "installing slurm-wlm and munge (missing: ${missing[*]})"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -q --no-install-recommends slurm-wlm munge
    fi
}

start_munge() {
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating a munge key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then mungekey --create --force; else
            dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none; fi
    fi
    chown -R munge:munge /etc/munge && chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge /var/log/munge /var/lib/munge
    if pid_alive /run/munge/munged.pid && munge -n </dev/null | unmunge >/dev/null 2>&1; then
        say "munged is running (pid $(cat /run/munge/munged.pid))"
        return
    fi
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 20); do munge -n </dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.5; done
    echo "local-slurm: munged did not come up; see /var/log/munge/munged.log" >&2
    exit 1
}

write_config() {
    local measured cpus mem
    measured=$(/usr/sbin/slurmd -C | head -1)
    cpus=${SLURM_CPUS:-$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$measured")}
    mem=${SLURM_MEM_MB:-$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$measured")}
    local tmp
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
# Written by headcount's tools/local-slurm.sh: a one-node test cluster. Edits are overwritten.
ClusterName=headcount
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups required (containers often lack a writable cgroup tree).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# CPUs and memory are both consumable: a job's --mem must fit the node.
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# No slurmdbd: sacct has nothing to read. Finished jobs stay in slurmctld (and squeue) for an hour.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    mkdir -p /etc/slurm
    if [[ -f $CONF ]] && cmp -s "$tmp" "$CONF"; then
        rm -f "$tmp"
        say "$CONF is up to date (node $NODE: CPUs=$cpus RealMemory=$mem, partition $PARTITION)"
        return 1
    fi
    install -m 0644 "$tmp" "$CONF"
    rm -f "$tmp"
    say "wrote $CONF (node $NODE: CPUs=$cpus RealMemory=$mem, partition $PARTITION)"
    return 0
}

start_slurm() {
    local changed=$1
    install -d -o slurm -g slurm -m 0755 $RUN /var/log/slurm /var/lib/slurm/slurmctld
    install -d -m 0755 /var/lib/slurm/slurmd
    chown slurm:slurm /var/log/slurm
    touch /var/log/slurm/slurmd.log
    if [[ $changed == yes ]]; then
        for daemon in slurmd slurmctld; do
            if pid_alive $RUN/$daemon.pid; then
                say "configuration changed: stopping $daemon (pid $(cat $RUN/$daemon.pid))"
                kill "$(cat $RUN/$daemon.pid)"
                for _ in $(seq 40); do pid_alive $RUN/$daemon.pid || break; sleep 0.25; done
            fi
        done
    fi
    if pid_alive $RUN/slurmctld.pid; then
        say "slurmctld is running (pid $(cat $RUN/slurmctld.pid))"
    else
        say "starting slurmctld"
        /usr/sbin/slurmctld
    fi
    for _ in $(seq 40); do scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.25; done
    if pid_alive $RUN/slurmd.pid; then
        say "slurmd is running (pid $(cat $RUN/slurmd.pid))"
    else
        say "starting slurmd${SLURM_NICE:+ at nice $SLURM_NICE}"
        nice -n "${SLURM_NICE:-0}" /usr/sbin/slurmd
    fi
    local state=""
    for _ in $(seq 60); do
        state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1)
        [[ $state == idle* || $state == mixed* || $state == allocated* ]] && break
        if [[ $state == down* || $state == drain* ]]; then
            say "node $NODE is $state: resuming it"
            scontrol update nodename="$NODE" state=resume || true
        fi
        sleep 0.5
    done
    if [[ $state != idle* && $state != mixed* && $state != allocated* ]]; then
        echo "local-slurm: node $NODE is '$state'; see /var/log/slurm/slurm{ctld,d}.log" >&2
        exit 1
    fi
}

status() {
    scontrol ping
    sinfo -N -o "%N %P %T %c %m"
}

case ${1:-up} in
up)
    need_root up
    install_packages
    start_munge
    if write_config; then changed=yes; else changed=no; fi
    start_slurm $changed
    status
    ;;
status)
    status
    ;;
down)
    need_root down
    for pidfile in $RUN/slurmd.pid $RUN/slurmctld.pid /run/munge/munged.pid; do
        if pid_alive $pidfile; then
            say "stopping $(basename $pidfile .pid) (pid $(cat $pidfile))"
            kill "$(cat $pidfile)"
        fi
    done
    ;;
*)
    echo "usage: $0 [up|status|down]" >&2
    exit 2
    ;;
esac
