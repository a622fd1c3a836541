#!/usr/bin/env bash
# A real, throwaway Slurm cluster on this one host (Debian's packages, Slurm
# 22.05 on bookworm) for the Slurm backend's integration tests and for CI.
#
#   scripts/slurm.sh start    install (if needed), start munged, slurmctld and
#                             four slurmd "nodes", wait until every node is
#                             usable, then print `SLURM_CONF=<path>` on stdout
#   scripts/slurm.sh stop [--purge]
#                             cancel every job, stop the daemons this script
#                             started (by their pid files); --purge also deletes
#                             the state directory.  Exit 0 if nothing runs.
#   scripts/slurm.sh status   print `sinfo`; exit 0 if the cluster is up and
#                             every node is usable, 1 otherwise
#   scripts/slurm.sh env      print `export SLURM_CONF=<path>`, start nothing
#
# stdout of `start` is exactly one line, `SLURM_CONF=<path>`; progress and
# errors go to stderr.  Clients need that variable (nothing is written to
# /etc/slurm):  eval "export $(bash scripts/slurm.sh start)"; sbatch ...
#
# The cluster: partition `gpu` (the default, no time limit) with nodes
# sn1 sn2 (Gres=gpu:a100:8) and sn3 sn4 (Gres=gpu:h100:8), each CPUs=16
# RealMemory=32000 whatever the host really has.  All are slurmd processes on
# this host (`slurmd -N snX`, one port each) run as root, so `start`/`stop`
# need root; without it they re-run themselves with `sudo -n`.
#
# Idempotent: `start` on a healthy cluster only prints the line; it starts
# whichever daemon is not running, resumes nodes left DOWN/DRAIN (also ones
# restored from a previous run's saved state) and restarts everything if the
# generated configuration changed.  Controller state (job ids, node states) and
# the job completion log survive stop/start; `stop --purge` wipes them.
#
# Environment:
#   MLOPS_GPU_SLURM_DIR   state directory (default
#                         $HOME/.cache/mlops-gpu/slurm).  Everything lives here:
#                           etc/slurm.conf, etc/gres.conf   configuration
#                           log/                 daemon logs (daemons chdir here)
#                           state/               slurmctld StateSaveLocation
#                           spool/<node>/        slurmd spool directories
#                           run/                 pid files, munge socket (or
#                                                in /tmp, see MUNGE_SOCK below)
#                           dev/<node>/gpu[0-7]  fake GPU devices
#                           munge/               munge key and seed
#                           jobcomp.txt          finished jobs, for `sacct -c`
#                           .lock                serialises start/stop
#   MLOPS_GPU_SLURM_PORT  slurmctld port on 127.0.0.1 (default 17817); node
#                         sn<i> listens on that port + i
#   MLOPS_GPU_SLURM_WAIT  seconds to wait for the nodes (default 60)
#   MLOPS_GPU_SLURM_CLOUD number of cloud nodes sc1..scN (default 0: none), each
#                         Gres=gpu:l4:4, in State=CLOUD under Slurm's power saving:
#                         they start powered down; Slurm runs
#                         scripts/slurm-power.sh resume when a job is allocated
#                         one (it starts that node's slurmd after
#                         MLOPS_GPU_SLURM_BOOT_S seconds, default 3; it exits 1
#                         for a node that has a file $DIR/resume-fail/<node>, and
#                         Slurm marks that node DOWN after ResumeTimeout) and
#                         scripts/slurm-power.sh suspend (stops its slurmd) after
#                         MLOPS_GPU_SLURM_SUSPEND_S idle seconds (default 15).
#                         Use it on a cluster of its own (MLOPS_GPU_SLURM_DIR and
#                         MLOPS_GPU_SLURM_PORT); the static nodes stay as above.
#
# Facts this relies on (found the hard way):
# - gres.conf File= must name character devices or CUDA_VISIBLE_DEVICES comes
#   out empty: the fake GPUs are clones of /dev/null (`mknod PATH c 1 3`).
# - No cgroups: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none;
#   SlurmdParameters=config_overrides lets nodes claim more CPUs/memory than
#   the host has.
# - No slurmdbd: plain `sacct` fails; `sacct -c` reads the jobcomp/filetxt log.
#   QOS and fairshare are not enforced (mlops_gpu's own scheduler owns them).
#   `squeue --json` and `sinfo --json` work but ignore filters such as -j/-n;
#   `scontrol --json` does not exist in 22.05.
# - Finished jobs leave squeue after MinJobAge (30 s).  `scontrol requeue`
#   reruns a job after cred_expire (10 s) plus a scheduler pass.
# - Daemons inherit every open file descriptor: they are started with all fds
#   above 2 closed, stdin from /dev/null and output to a log, under setsid, so
#   a caller capturing our output ($(...), subprocess pipes) is not kept
#   waiting.  They chdir into their log directory: it must stay while they run.
# - Jobs are cancelled before slurmd stops, or their slurmstepd's outlive it.

set -euo pipefail
umask 022
export PATH="$PATH:/usr/sbin:/sbin"

NODES=(sn1 sn2 sn3 sn4)
GPU_TYPES=(a100 a100 h100 h100)
GPUS_PER_NODE=8
NODE_CPUS=16
NODE_MEM_MB=32000
PARTITION=gpu
CRED_EXPIRE=10
MIN_JOB_AGE=30

log() { printf 'slurm.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
usage() { echo "usage: $0 {start|stop [--purge]|status|env}" >&2; exit 2; }

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
DIR="${MLOPS_GPU_SLURM_DIR:-${HOME:-/tmp}/.cache/mlops-gpu/slurm}"
case "$DIR" in /*) ;; *) DIR="$PWD/$DIR" ;; esac
DIR="${DIR%/}"
case "$DIR" in '' | / | /root | /home | /tmp | /var/tmp | "${HOME:-/}") die "refusing to use '$DIR' as the state directory" ;; esac
CTLD_PORT="${MLOPS_GPU_SLURM_PORT:-17817}"
WAIT="${MLOPS_GPU_SLURM_WAIT:-60}"
case "$CTLD_PORT" in '' | *[!0-9]*) die "MLOPS_GPU_SLURM_PORT must be a number, got '$CTLD_PORT'" ;; esac
case "$WAIT" in '' | *[!0-9]*) die "MLOPS_GPU_SLURM_WAIT must be a number, got '$WAIT'" ;; esac

CLOUD="${MLOPS_GPU_SLURM_CLOUD:-0}"
BOOT_S="${MLOPS_GPU_SLURM_BOOT_S:-3}"
SUSPEND_S="${MLOPS_GPU_SLURM_SUSPEND_S:-15}"
for v in CLOUD BOOT_S SUSPEND_S; do
    case "${!v}" in '' | *[!0-9]*) die "MLOPS_GPU_SLURM_$v must be a number, got '${!v}'" ;; esac
done
CLOUD_NODES=()
for i in $(seq 1 "$CLOUD"); do CLOUD_NODES+=("sc$i"); done
CLOUD_GPU_TYPE=l4
CLOUD_GPUS_PER_NODE=4
# Slurm marks a node DOWN (and requeues its jobs) if it is not up this long after its resume.
RESUME_TIMEOUT=$((BOOT_S + 12))
# every node this script may start a slurmd for (cloud ones only while powered up)
ALL_NODES=("${NODES[@]}" "${CLOUD_NODES[@]}")

CONF="$DIR/etc/slurm.conf"
export SLURM_CONF="$CONF"
# munged refuses a socket unless every directory above it is executable by
# all (not so for /root, mode 700), and Unix socket paths are limited to 108
# bytes: in either case the socket goes to /tmp/mlops-gpu-slurm-<hash of DIR>.
world_traversable() {
    local d=$1
    while [ "$d" != / ]; do
        while [ ! -e "$d" ]; do d="$(dirname "$d")"; done
        [ "$d" = / ] && break
        [ "$(( 0$(stat -c %a "$d") & 01 ))" -ne 0 ] || return 1
        d="$(dirname "$d")"
    done
}
MUNGE_SOCK="$DIR/run/munge.socket"
if [ "${#MUNGE_SOCK}" -gt 95 ] || ! world_traversable "$DIR"; then
    MUNGE_SOCK="/tmp/mlops-gpu-slurm-$(printf '%s' "$DIR" | cksum | cut -d' ' -f1)/munge.socket"
fi

node_port() { echo $((CTLD_PORT + $1 + 1)); }  # node index 0.. -> port

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- privileges ------------------------------------------------------------

# Re-run this script as root (slurmd, mknod and apt-get need it).
need_root() {
    [ "$(id -u)" -eq 0 ] && return 0
    command -v sudo >/dev/null 2>&1 || die "'$1' needs root, and sudo is not installed"
    log "'$1' needs root; re-running with sudo -n"
    exec sudo -n env "MLOPS_GPU_SLURM_DIR=$DIR" "MLOPS_GPU_SLURM_PORT=$CTLD_PORT" \
        "MLOPS_GPU_SLURM_WAIT=$WAIT" "MLOPS_GPU_SLURM_CLOUD=$CLOUD" \
        "MLOPS_GPU_SLURM_BOOT_S=$BOOT_S" "MLOPS_GPU_SLURM_SUSPEND_S=$SUSPEND_S" "PATH=$PATH" \
        bash "$SCRIPT" "$@"
}

take_lock() {
    mkdir -p "$DIR"
    exec 9>>"$DIR/.lock"
    flock -w 180 9 || die "timed out waiting for $DIR/.lock (another start/stop running?)"
}

# --- install ---------------------------------------------------------------

install_slurm() {
    local pkgs=() aptlog rc=0 t0
    command -v slurmctld >/dev/null 2>&1 || pkgs+=(slurmctld)
    command -v slurmd >/dev/null 2>&1 || pkgs+=(slurmd)
    { command -v sbatch && command -v sacct; } >/dev/null 2>&1 || pkgs+=(slurm-client)
    { command -v munged && command -v munge; } >/dev/null 2>&1 || pkgs+=(munge)
    [ ${#pkgs[@]} -gt 0 ] || return 0
    command -v apt-get >/dev/null 2>&1 || die "missing ${pkgs[*]} and no apt-get to install them"
    t0=$(now)
    log "installing Debian's ${pkgs[*]} (apt-get install)"
    # apt's output goes to a file, never to our stdout/stderr: maintainer
    # scripts may start daemons that would hold a caller's pipe open.
    aptlog="$(mktemp -t mlops-gpu-slurm-apt.XXXXXX)"
    apt_get() {
        (exec 9>&- && env DEBIAN_FRONTEND=noninteractive \
            apt-get -o DPkg::Lock::Timeout=300 "$@" </dev/null >>"$aptlog" 2>&1)
    }
    if ! apt-cache show "${pkgs[@]}" >/dev/null 2>&1; then
        log "packages unknown to apt; running apt-get update"
        apt_get update || { tail -n 30 "$aptlog" >&2; rm -f "$aptlog"; die "apt-get update failed"; }
    fi
    apt_get install -y --no-install-recommends "${pkgs[@]}" || rc=$?
    if [ "$rc" -ne 0 ]; then
        # Stale package lists (404 on the pool): refresh once and retry.
        log "apt-get install failed (rc=$rc); running apt-get update and retrying"
        rc=0
        { apt_get update && apt_get install -y --no-install-recommends "${pkgs[@]}"; } || rc=$?
    fi
    if [ "$rc" -ne 0 ]; then
        tail -n 30 "$aptlog" >&2
        rm -f "$aptlog"
        die "apt-get install ${pkgs[*]} failed"
    fi
    rm -f "$aptlog"
    for c in slurmctld slurmd sbatch munged; do
        command -v "$c" >/dev/null 2>&1 || die "$c still missing after apt-get install"
    done
    log "installed in $(since "$t0")s: $(slurmctld -V 2>&1)"
}

# --- processes -------------------------------------------------------------

# daemon_pid PIDFILE COMM MARKER: print the pid from PIDFILE if it is a live
# (non-zombie) process named COMM whose command line contains MARKER, i.e. a
# daemon of this cluster and not a recycled pid.
daemon_pid() {
    local f=$1 comm=$2 marker=$3 pid
    [ -s "$f" ] || return 1
    pid="$(tr -dc '0-9' <"$f" 2>/dev/null || true)"
    [ -n "$pid" ] || return 1
    pid_alive "$pid" "$comm" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$marker" || return 1
    echo "$pid"
}

munged_pid() { daemon_pid "$DIR/run/munged.pid" munged "--socket=$MUNGE_SOCK"; }
ctld_pid() { daemon_pid "$DIR/run/slurmctld.pid" slurmctld "$CONF"; }
slurmd_pid() { daemon_pid "$DIR/run/slurmd.$1.pid" slurmd "-N $1 "; }

# launch LOG CMD...: run a daemon detached from us: new session, cwd = the log
# directory, stdin /dev/null, stdout/stderr appended to LOG, and every other
# inherited file descriptor (our lock, a caller's pipes) closed.
launch() {
    local out=$1; shift
    (
        cd "$DIR/log"
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-" 2>/dev/null || true; fi
        done
        exec setsid "$@" </dev/null >>"$out" 2>&1
    )
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pid_alive PID COMM: PID is a live (not zombie) process named COMM.
pid_alive() {
    local st
    [ "$(cat "/proc/$1/comm" 2>/dev/null || true)" = "$2" ] || return 1
    st="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1 || true)"
    [ -n "$st" ] && [ "$st" != Z ]
}

# stop_daemon NAME PIDFILE PID: SIGTERM, then SIGKILL after 10 s.
stop_daemon() {
    local name=$1 f=$2 pid=$3 i
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
        pid_alive "$pid" "$name" || break
        sleep 0.1
    done
    if pid_alive "$pid" "$name"; then
        log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$f"
    log "stopped $name (pid $pid)"
}

# --- cluster state ---------------------------------------------------------

ctld_up() { timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }

# Print "name state" per node (compact sinfo states: idle, mix, alloc, down*,
# drain, ...; a trailing * means not responding).
node_states() { timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u; }

# True if STATES (node_states output) lists all nodes, each usable.
all_usable() {
    local states=$1 n st
    for n in "${NODES[@]}"; do
        st="$(awk -v n="$n" '$1 == n { print $2 }' <<<"$states" | head -n 1)"
        case "$st" in idle | mix | alloc | comp) ;; *) return 1 ;; esac
    done
}

all_daemons_alive() {
    local n
    munged_pid >/dev/null || return 1
    ctld_pid >/dev/null || return 1
    for n in "${NODES[@]}"; do slurmd_pid "$n" >/dev/null || return 1; done
}

# --- configuration ---------------------------------------------------------

render_slurm_conf() {
    local i n
    cat <<EOF
# Written by scripts/slurm.sh start on every start; edits are overwritten.
ClusterName=mlopsgpu
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$(node_port 0)
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also the delay before a requeued job may run again
AuthInfo=socket=$MUNGE_SOCK,cred_expire=$CRED_EXPIRE
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$DIR/etc/plugstack.conf
# no cgroups: works in containers and VMs without delegated cgroups
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# no slurmdbd: only 'sacct -c' works, reading this file
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
# (AccountingStorageTRES=gres/gpu is fatal without slurmdbd: GPUs never show
# in TRES strings; read them from squeue's gres_detail/tres_per_node instead)
JobCompLoc=$DIR/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
GresTypes=gpu
# trust CPUs=/RealMemory= below rather than the host's real hardware
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
MpiDefault=none
MailProg=/bin/true
KillWait=2
MinJobAge=$MIN_JOB_AGE
InactiveLimit=0
EOF
    if [ "$CLOUD" -gt 0 ]; then
        cat <<EOF
# Power saving for the cloud nodes (sc*): Slurm resumes a powered-down node when a
# job is allocated it and suspends one idle for SuspendTime seconds.
PrivateData=cloud
ResumeProgram=$DIR/etc/resume
SuspendProgram=$DIR/etc/suspend
SuspendTime=$SUSPEND_S
SuspendTimeout=5
ResumeTimeout=$RESUME_TIMEOUT
SuspendExcNodes=$(IFS=,; echo "${NODES[*]}")
ResumeRate=0
SuspendRate=0
TreeWidth=65533
EOF
    fi
    for i in "${!NODES[@]}"; do
        n=${NODES[$i]}
        echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(node_port "$i") CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB Gres=gpu:${GPU_TYPES[$i]}:$GPUS_PER_NODE State=UNKNOWN"
    done
    for i in "${!CLOUD_NODES[@]}"; do
        n=${CLOUD_NODES[$i]}
        echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(node_port $((${#NODES[@]} + i))) CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB Gres=gpu:$CLOUD_GPU_TYPE:$CLOUD_GPUS_PER_NODE State=CLOUD"
    done
    echo "PartitionName=$PARTITION Nodes=$(IFS=,; echo "${ALL_NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
}

# The ResumeProgram/SuspendProgram slurmctld runs: scripts/slurm-power.sh with this
# cluster's settings (slurmctld passes only the node list).
render_power_program() {
    cat <<EOF
#!/bin/sh
# Written by scripts/slurm.sh start.
exec env MLOPS_GPU_SLURM_DIR='$DIR' SLURM_CONF='$CONF' MLOPS_GPU_SLURM_BOOT_S='$BOOT_S' \\
    bash '$(dirname "$SCRIPT")/slurm-power.sh' $1 "\$@"
EOF
}

render_gres_conf() {
    local i n
    echo "# Written by scripts/slurm.sh start; File= are clones of /dev/null."
    echo "AutoDetect=off"
    for i in "${!NODES[@]}"; do
        echo "NodeName=${NODES[$i]} Name=gpu Type=${GPU_TYPES[$i]} File=$DIR/dev/${NODES[$i]}/gpu[0-$((GPUS_PER_NODE - 1))]"
    done
    for n in "${CLOUD_NODES[@]}"; do
        echo "NodeName=$n Name=gpu Type=$CLOUD_GPU_TYPE File=$DIR/dev/$n/gpu[0-$((CLOUD_GPUS_PER_NODE - 1))]"
    done
}

make_fake_gpus() {
    local n g f warned=0
    for n in "${ALL_NODES[@]}"; do
        mkdir -p "$DIR/dev/$n" "$DIR/spool/$n"
        for g in $(seq 0 $((GPUS_PER_NODE - 1))); do
            f="$DIR/dev/$n/gpu$g"
            [ -c "$f" ] && continue
            rm -f "$f"
            if ! mknod -m 666 "$f" c 1 3 2>/dev/null; then
                touch "$f"
                [ "$warned" = 1 ] || log "WARNING: mknod failed (no CAP_MKNOD?): GPUs are scheduled but jobs get an EMPTY CUDA_VISIBLE_DEVICES"
                warned=1
            fi
        done
    done
}

# --- start -----------------------------------------------------------------

start_munged() {
    [ -s "$DIR/munge/munge.key" ] || {
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
        chmod 400 "$DIR/munge/munge.key"
    }
    rm -f "$DIR/run/munged.pid"
    log "starting munged (socket $MUNGE_SOCK)"
    launch "$DIR/log/munged.out" munged --socket="$MUNGE_SOCK" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed" \
        || { tail -n 15 "$DIR/log/munged.log" "$DIR/log/munged.out" >&2 2>/dev/null; die "munged failed to start"; }
    local i
    for i in $(seq 1 50); do munged_pid >/dev/null && break; sleep 0.1; done
    munge -S "$MUNGE_SOCK" -n </dev/null 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1 \
        || { tail -n 15 "$DIR/log/munged.log" "$DIR/log/munged.out" >&2 2>/dev/null; die "munge self-test failed (log: $DIR/log/munged.log)"; }
}

# Before starting anything: the ports of the daemons about to start are free.
check_ports() {
    local i
    if ! ctld_pid >/dev/null && port_busy "$CTLD_PORT"; then
        die "port $CTLD_PORT (slurmctld) is in use by another process (another Slurm? set MLOPS_GPU_SLURM_PORT)"
    fi
    for i in "${!NODES[@]}"; do
        if ! slurmd_pid "${NODES[$i]}" >/dev/null && port_busy "$(node_port "$i")"; then
            die "port $(node_port "$i") (slurmd ${NODES[$i]}) is in use by another process (another Slurm? set MLOPS_GPU_SLURM_PORT)"
        fi
    done
}

start_slurmctld() {
    local i
    rm -f "$DIR/run/slurmctld.pid"
    log "starting slurmctld on port $CTLD_PORT"
    launch "$DIR/log/slurmctld.out" slurmctld -f "$CONF" \
        || { tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmctld.out" >&2 2>/dev/null; die "slurmctld failed to start"; }
    for i in $(seq 1 $((WAIT * 5))); do
        ctld_up && return 0
        if [ "$i" -gt 15 ] && ! ctld_pid >/dev/null; then break; fi
        sleep 0.2
    done
    tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmctld.out" >&2 2>/dev/null || true
    die "slurmctld did not come up (log: $DIR/log/slurmctld.log)"
}

start_slurmd() {
    local n=$1 i=$2 port
    port=$(node_port "$i")
    rm -f "$DIR/run/slurmd.$n.pid"
    log "starting slurmd $n on port $port"
    launch "$DIR/log/slurmd.$n.out" slurmd -f "$CONF" -N "$n" \
        || { tail -n 20 "$DIR/log/slurmd.$n.log" "$DIR/log/slurmd.$n.out" >&2 2>/dev/null; die "slurmd $n failed to start"; }
}

# Wait until every node is usable, resuming DOWN/DRAIN/FAIL ones on the way.
wait_for_nodes() {
    local t0 states n st last_progress=-5 elapsed
    local -A resumed=()
    t0=$SECONDS
    while :; do
        states="$(node_states || true)"
        all_usable "$states" && return 0
        elapsed=$((SECONDS - t0))
        for n in "${NODES[@]}"; do
            st="$(awk -v n="$n" '$1 == n { print $2 }' <<<"$states" | head -n 1)"
            case "$st" in
                down* | drain* | drng* | fail*)
                    # at most once every 5 s per node
                    if [ -z "${resumed[$n]:-}" ] || [ $((SECONDS - resumed[$n])) -ge 5 ]; then
                        log "node $n is $st; resuming it"
                        timeout 10 scontrol update nodename="$n" state=resume >&2 2>/dev/null || true
                        resumed[$n]=$SECONDS
                    fi
                    ;;
            esac
        done
        if [ "$elapsed" -ge "$WAIT" ]; then break; fi
        if [ $((elapsed - last_progress)) -ge 5 ]; then
            log "waiting for nodes (${elapsed}s/${WAIT}s): $(tr '\n' ' ' <<<"$states")"
            last_progress=$elapsed
        fi
        sleep 0.5
    done
    timeout 10 sinfo -N -o '%N %P %t %E' >&2 2>/dev/null || true
    log "--- tail of $DIR/log/slurmctld.log"
    tail -n 15 "$DIR/log/slurmctld.log" >&2 2>/dev/null || true
    for n in "${NODES[@]}"; do
        st="$(awk -v n="$n" '$1 == n { print $2 }' <<<"$states" | head -n 1)"
        case "$st" in idle | mix | alloc | comp) ;; *)
            log "--- tail of $DIR/log/slurmd.$n.log (state '${st:-missing}')"
            tail -n 8 "$DIR/log/slurmd.$n.log" >&2 2>/dev/null || true ;;
        esac
    done
    die "nodes not all up after ${WAIT}s: $(tr '\n' ' ' <<<"$states")"
}

# Cancel every job and wait for them to leave the nodes.
cancel_all_jobs() {
    local ids i
    ctld_pid >/dev/null && [ -f "$CONF" ] || return 0
    ids="$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ' || true)"
    [ -n "${ids// /}" ] || return 0
    log "cancelling jobs: $ids"
    # shellcheck disable=SC2086
    timeout 10 scancel $ids 2>/dev/null || true
    for i in $(seq 1 200); do
        [ -z "$(timeout 5 squeue -h -t PD,R,CG,S,CF -o %A 2>/dev/null || true)" ] && return 0
        sleep 0.1
    done
    log "WARNING: some jobs still active after 20 s: $(timeout 5 squeue -h -o '%A %T' 2>/dev/null | tr '\n' ' ')"
}

stop_daemons() {
    local n pid
    cancel_all_jobs
    for n in "${ALL_NODES[@]}"; do
        if pid="$(slurmd_pid "$n")"; then stop_daemon slurmd "$DIR/run/slurmd.$n.pid" "$pid"; fi
        rm -f "$DIR/run/slurmd.$n.pid"
    done
    if pid="$(ctld_pid)"; then stop_daemon slurmctld "$DIR/run/slurmctld.pid" "$pid"; fi
    rm -f "$DIR/run/slurmctld.pid"
    if pid="$(munged_pid)"; then stop_daemon munged "$DIR/run/munged.pid" "$pid"; fi
    rm -f "$DIR/run/munged.pid"
}

cmd_start() {
    local t0 i n changed=0 any_alive=0
    t0=$(now)
    need_root start
    install_slurm
    take_lock
    mkdir -p "$DIR"/{etc,log,state,spool,run,dev,munge} "$(dirname "$MUNGE_SOCK")"
    [ "$(stat -c %u "$(dirname "$MUNGE_SOCK")")" = "$(id -u)" ] \
        || die "$(dirname "$MUNGE_SOCK") belongs to another user; remove it"
    chmod 755 "$DIR" "$DIR/run" "$DIR/munge" "$(dirname "$MUNGE_SOCK")"

    # Regenerate the configuration; restart running daemons if it changed.
    render_slurm_conf >"$CONF.new"
    render_gres_conf >"$DIR/etc/gres.conf.new"
    if ! cmp -s "$CONF.new" "$CONF" || ! cmp -s "$DIR/etc/gres.conf.new" "$DIR/etc/gres.conf"; then
        changed=1
    fi
    if [ "$changed" = 1 ]; then
        munged_pid >/dev/null && any_alive=1
        ctld_pid >/dev/null && any_alive=1
        for n in "${ALL_NODES[@]}"; do slurmd_pid "$n" >/dev/null && any_alive=1; done
        if [ "$any_alive" = 1 ]; then
            log "configuration changed; restarting the cluster"
            stop_daemons
        fi
        mv -f "$CONF.new" "$CONF"
        mv -f "$DIR/etc/gres.conf.new" "$DIR/etc/gres.conf"
    else
        rm -f "$CONF.new" "$DIR/etc/gres.conf.new"
    fi
    [ -e "$DIR/etc/plugstack.conf" ] || : >"$DIR/etc/plugstack.conf"
    if [ "$CLOUD" -gt 0 ]; then
        mkdir -p "$DIR/resume-fail"
        for p in resume suspend; do
            render_power_program "$p" >"$DIR/etc/$p.new"
            chmod 755 "$DIR/etc/$p.new"
            mv -f "$DIR/etc/$p.new" "$DIR/etc/$p"
        done
    fi
    touch "$DIR/jobcomp.txt"

    # Fast path: everything already up.
    if all_daemons_alive && ctld_up && all_usable "$(node_states || true)"; then
        log "cluster already running ($DIR)"
        echo "SLURM_CONF=$CONF"
        return 0
    fi

    check_ports
    make_fake_gpus
    munged_pid >/dev/null || start_munged
    ctld_pid >/dev/null || start_slurmctld
    ctld_up || die "slurmctld (pid $(ctld_pid || echo '?')) is not answering (log: $DIR/log/slurmctld.log)"
    for i in "${!NODES[@]}"; do
        slurmd_pid "${NODES[$i]}" >/dev/null || start_slurmd "${NODES[$i]}" "$i"
    done
    wait_for_nodes
    timeout 10 sinfo -N -o '%N %P %t %c %m %G' >&2 2>/dev/null || true
    log "cluster up in $(since "$t0")s ($DIR)"
    echo "SLURM_CONF=$CONF"
}

# --- stop ------------------------------------------------------------------

cmd_stop() {
    local purge=0
    case "${1:-}" in '') ;; --purge) purge=1 ;; *) usage ;; esac
    if [ ! -d "$DIR" ]; then
        log "nothing to stop ($DIR does not exist)"
        return 0
    fi
    need_root stop "$@"
    take_lock
    stop_daemons
    if [ "$purge" = 1 ]; then
        [ "$MUNGE_SOCK" = "$DIR/run/munge.socket" ] || rm -rf "$(dirname "$MUNGE_SOCK")"
        rm -rf "${DIR:?}"
        log "removed $DIR"
    fi
    log "stopped"
}

# --- status ----------------------------------------------------------------

cmd_status() {
    local n bad=""
    [ -f "$CONF" ] || { log "no cluster configured in $DIR"; return 1; }
    munged_pid >/dev/null || bad="$bad munged"
    ctld_pid >/dev/null || bad="$bad slurmctld"
    for n in "${NODES[@]}"; do slurmd_pid "$n" >/dev/null || bad="$bad slurmd($n)"; done
    if ! ctld_pid >/dev/null; then
        log "down: not running:$bad"
        return 1
    fi
    timeout 10 sinfo -N -o '%N %P %t %c %m %G %E' || { log "down: sinfo failed"; return 1; }
    [ -z "$bad" ] || { log "down: not running:$bad"; return 1; }
    all_usable "$(node_states || true)" || { log "degraded: not every node is idle/mix/alloc"; return 1; }
}

case "${1:-}" in
    start) [ $# -eq 1 ] || usage; cmd_start ;;
    stop) [ $# -le 2 ] || usage; shift; cmd_stop "$@" ;;
    status) [ $# -eq 1 ] || usage; cmd_status ;;
    env) [ $# -eq 1 ] || usage; echo "export SLURM_CONF=$CONF" ;;
    *) usage ;;
esac
