#!/usr/bin/env bash
# Slurm's ResumeProgram and SuspendProgram for the cloud nodes of the test cluster
# (scripts/slurm.sh with MLOPS_GPU_SLURM_CLOUD=N); slurmctld runs them through the wrappers
# slurm.sh writes to $DIR/etc/{resume,suspend}, with the cluster's settings in the environment.
#
#   slurm-power.sh resume  HOSTLIST   "boot" each node: start its slurmd after
#                                     MLOPS_GPU_SLURM_BOOT_S seconds, in the background (Slurm
#                                     waits up to ResumeTimeout for it to register). A node
#                                     with a file $DIR/resume-fail/<node> is not started, and
#                                     the script exits 1: a resume that fails, as a cloud API
#                                     error would (Slurm marks the node DOWN at ResumeTimeout
#                                     and requeues or fails its jobs).
#   slurm-power.sh suspend HOSTLIST   "power off" each node: stop its slurmd (by pid file).
#
# Every run is logged to $DIR/log/power.log (the tests read it).
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
DIR="${MLOPS_GPU_SLURM_DIR:?MLOPS_GPU_SLURM_DIR is not set}"
CONF="${SLURM_CONF:?SLURM_CONF is not set}"
BOOT_S="${MLOPS_GPU_SLURM_BOOT_S:-3}"
LOG="$DIR/log/power.log"

say() { printf '%s %s\n' "$(date +%s)" "$*" >>"$LOG"; }

[ $# -eq 2 ] || { echo "usage: $0 {resume|suspend} HOSTLIST" >&2; exit 2; }
verb=$1
nodes="$(scontrol show hostnames "$2" 2>>"$LOG")" || { say "$verb $2: cannot expand the host list"; exit 1; }

slurmd_pid() {  # the live slurmd of node $1 from its pid file
    local pid
    pid="$(tr -dc '0-9' <"$DIR/run/slurmd.$1.pid" 2>/dev/null)" || return 1
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmd ] || return 1
    echo "$pid"
}

UNBLOCK_AND_EXEC='import os, signal, sys
signal.pthread_sigmask(signal.SIG_SETMASK, [])
os.execvp(sys.argv[1], sys.argv[1:])'

rc=0
case "$verb" in
    resume)
        for n in $nodes; do
            if [ -e "$DIR/resume-fail/$n" ]; then
                say "resume $n: FAILED (marker $DIR/resume-fail/$n)"
                rc=1
                continue
            fi
            # A slurmd left from before (Slurm powers a node down without the SuspendProgram
            # when its resume times out) would hold the port: a boot starts from scratch.
            if pid="$(slurmd_pid "$n")"; then kill -TERM "$pid" 2>/dev/null || true; fi
            say "resume $n: slurmd starts in ${BOOT_S}s"
            # -b: report a fresh boot (Slurm ignores a node whose boot time is before its resume
            # request, and this "node" runs on a host booted long ago).
            # Detached like slurm.sh's daemons: new session, every inherited fd above 2 closed.
            (
                cd "$DIR/log" || exit 1
                for fd in /proc/$BASHPID/fd/*; do
                    fd=${fd##*/}
                    if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-" 2>/dev/null || true; fi
                done
                # slurmctld runs this with SIGTERM and others blocked, which slurmd would
                # inherit (it then ignores the SuspendProgram's kill and never registers):
                # unblock every signal before the exec.
                exec setsid python3 -c "$UNBLOCK_AND_EXEC" sh -c 'sleep "$1"; exec slurmd -b -f "$2" -N "$3"' \
                    boot "$BOOT_S" "$CONF" "$n" </dev/null >>"$DIR/log/slurmd.$n.out" 2>&1
            ) &
        done
        ;;
    suspend)
        for n in $nodes; do
            if pid="$(slurmd_pid "$n")"; then
                kill -TERM "$pid" 2>/dev/null || true
                say "suspend $n: stopped slurmd (pid $pid)"
            else
                say "suspend $n: no slurmd running"
            fi
        done
        ;;
    *) echo "usage: $0 {resume|suspend} HOSTLIST" >&2; exit 2 ;;
esac
exit "$rc"
