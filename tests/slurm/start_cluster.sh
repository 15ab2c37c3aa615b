#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for tests/test_slurm.py: Debian's slurm-wlm and
# munge, every address 127.0.0.1, one partition "debug" holding this node (its CPUs and memory
# as slurmd -C finds them). Needs root and a Debian or Ubuntu system; no systemd needed.
#
#   sudo bash tests/slurm/start_cluster.sh          # install (once), configure, start; waits
#                                                   # until the node takes jobs
#   sudo bash tests/slurm/start_cluster.sh stop     # stop the three daemons
#
# It writes /etc/slurm/slurm.conf (an existing one not written by this script is refused, so a
# real cluster's is never touched) and logs to /var/log/slurm/. No accounting database
# (slurmdbd): sacct answers nothing here, so submitit warns that it cannot read job states and
# relies on the result files its jobs write.
set -euo pipefail

conf=/etc/slurm/slurm.conf
mark="# written by probe's tests/slurm/start_cluster.sh"

pid_files=(/run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid)

running() {  # whether the daemon of this pid file runs
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

stop() {
    for pid_file in "${pid_files[@]}"; do
        if running "$pid_file"; then
            kill "$(cat "$pid_file")" && echo "stopped $(basename "$pid_file" .pid)"
        fi
    done
}

if [ "${1:-start}" = stop ]; then
    stop
    exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "start_cluster.sh: run it as root (sudo)" >&2; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge
fi
# the HDF5 C tools (h5dump, h5ls), which tests/test_slurm.py reads the jobs' files with too
if ! command -v h5dump >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends hdf5-tools ||
        echo "start_cluster.sh: hdf5-tools did not install; the tests that use them skip" >&2
fi

if [ -f "$conf" ] && ! grep -qF "$mark" "$conf"; then
    echo "start_cluster.sh: $conf exists and is not this script's; not touching it" >&2
    exit 1
fi
node=$(hostname -s)
# the node as slurmd sees it: NodeName=... CPUs=... RealMemory=...
hardware=$(slurmd -C | head -n 1 | sed -e "s/^NodeName=[^ ]*//")
mkdir -p /etc/slurm /var/log/slurm /var/spool/slurmctld /var/spool/slurmd /run/munge
chown slurm:slurm /var/spool/slurmctld /var/log/slurm
cat > "$conf" <<EOF
$mark
ClusterName=probe-test
SlurmctldHost=$node(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
# cred_expire is also how long a requeued job waits before it can start again (120 s unless set)
AuthInfo=cred_expire=20
CryptoType=crypto/munge
MpiDefault=none
# no cgroups in a container: processes are tracked through /proc
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# look at pending jobs every 5 s (60 s unless set): a requeued job starts soon after it may
SchedulerParameters=sched_interval=5,bf_interval=5
ReturnToService=2
# batch jobs can be requeued (scontrol requeue; submitit does it at a time limit)
JobRequeue=1
MailProg=/bin/true
# listen on 127.0.0.1 only, not on every interface (the daemons' default)
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node $hardware State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key /run/munge
chmod 400 /etc/munge/munge.key
running /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null  # munge works

running /run/slurmctld.pid || /usr/sbin/slurmctld
running /run/slurmd.pid || /usr/sbin/slurmd
for _ in $(seq 60); do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
    case "$state" in
        idle|mix|alloc) break ;;
        down*|drain*) scontrol update nodename="$node" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
done
sinfo
case "$state" in
    idle|mix|alloc) echo "start_cluster.sh: SLURM is up on $node" ;;
    *) echo "start_cluster.sh: the node is $state; see /var/log/slurm/" >&2; exit 1 ;;
esac
