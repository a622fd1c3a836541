#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 with kwok fake GPU nodes, for
# the project's Kubernetes backend tests and benchmarks.  Everything is built
# from Go modules (no Docker, no release downloads) and cached.
#
#   scripts/k8s.sh build                 build (if missing) kube-apiserver,
#                                        kube-controller-manager, kube-scheduler,
#                                        etcd and kwok into the cache
#   scripts/k8s.sh start [--nodes N]     build if needed; start etcd,
#                                        kube-apiserver, kube-controller-manager
#                                        and kwok; create N fake GPU nodes
#                                        (default 100); wait until they are
#                                        Ready; last stdout line: KUBECONFIG=<path>
#   scripts/k8s.sh stop                  stop everything started (pid files)
#   scripts/k8s.sh reset                 stop, then delete the etcd data (certs kept)
#   scripts/k8s.sh status [--nodes N]    exit 0 iff /readyz answers ok and at
#                                        least N nodes (default: as started) are Ready
#   scripts/k8s.sh kubeconfig            print the kubeconfig path, start nothing
#   scripts/k8s.sh scheduler start|stop  start/stop kube-scheduler (not started by
#                                        `start`: the project pins pods by nodeName)
#
# Progress goes to stderr; stdout carries only the KUBECONFIG= line (start)
# or the path (kubeconfig).  start/stop are idempotent.
#
# The parts: scripts/k8s/build.sh (building), state.sh (certificates, kubeconfig,
# kwok stages), daemons.sh (processes), nodes.py (the fake nodes), and the Go wrapper
# modules scripts/k8s/kube and scripts/k8s/etcd (go.mod/go.sum pin what is built).
# scripts/k8s/README.md describes the cache, the fake nodes, the kwok stages and the
# credentials.
#
# Environment:
#   MLOPS_GPU_K8S_DIR        state dir (default $HOME/.cache/mlops-gpu/k8s/run):
#                            certs/ etcd-data/ logs/ pids/ stages/ kubeconfig
#   MLOPS_GPU_K8S_CACHE      build cache (default $HOME/.cache/mlops-gpu/k8s):
#                            bin/<k8s version>/kube-*, bin/etcd-<v>/etcd,
#                            bin/kwok-<v>/{kwok,stages/}, src/ (wrapper modules)
#   MLOPS_GPU_K8S_VERSION    Kubernetes version (default v1.36.3)
#   MLOPS_GPU_ETCD_VERSION   etcd version (default v3.5.35)
#   MLOPS_GPU_KWOK_VERSION   kwok version (default v0.8.0)
#   MLOPS_GPU_K8S_ETCD_PORT / MLOPS_GPU_K8S_ETCD_PEER_PORT   (23790 / 23800)
#   MLOPS_GPU_K8S_API_PORT   kube-apiserver secure port (26443)
#   MLOPS_GPU_K8S_KCM_PORT / MLOPS_GPU_K8S_SCHED_PORT / MLOPS_GPU_K8S_KWOK_PORT
#                            secure/metrics ports (26257 / 26259 / 26080)
#   MLOPS_GPU_K8S_API_QPS / MLOPS_GPU_K8S_API_BURST   client QPS/burst of the
#                            controller-manager and scheduler (500 / 1000;
#                            kwok's client is not rate limited)
#   MLOPS_GPU_K8S_CONCURRENT_JOB_SYNCS   (50)
#   MLOPS_GPU_K8S_CONTROLLERS            (*)
#   MLOPS_GPU_K8S_NODE_MONITOR_GRACE_PERIOD  controller-manager (2m)
#   MLOPS_GPU_K8S_POD_DELAY_MS / MLOPS_GPU_K8S_POD_JITTER_MS   default delay
#                            and jitter upper bound of pod-create, pod-ready and
#                            pod-complete (kwok's 1000 / 5000: each stage takes
#                            1-5 s); applied when kwok (re)starts
#   MLOPS_GPU_K8S_KWOK_POD_PARALLELISM   kwok podPlayStageParallelism (16)
#   MLOPS_GPU_K8S_MAX_REQUESTS_INFLIGHT / _MAX_MUTATING_REQUESTS_INFLIGHT
#                            kube-apiserver (1600 / 800)
#   MLOPS_GPU_K8S_VERBOSITY  -v of the Kubernetes components (1)
#   MLOPS_GPU_K8S_PYTHON     python3 used to create/check nodes (stdlib only)
#   MLOPS_GPU_K8S_BUILD_JOBS  go build -p (default 1: keeps a 2-core box usable)
#   MLOPS_GPU_K8S_READY_TIMEOUT   seconds to wait for components/nodes (300)
#
# Needs: go (build only), openssl, curl, python3, flock, setsid.

set -euo pipefail
umask 022

K8S_VERSION="${MLOPS_GPU_K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${MLOPS_GPU_ETCD_VERSION:-v3.5.35}"
KWOK_VERSION="${MLOPS_GPU_KWOK_VERSION:-v0.8.0}"
CACHE="${MLOPS_GPU_K8S_CACHE:-$HOME/.cache/mlops-gpu/k8s}"
STATE="${MLOPS_GPU_K8S_DIR:-$HOME/.cache/mlops-gpu/k8s/run}"
K8S_BIN="$CACHE/bin/$K8S_VERSION"
ETCD_BIN="$CACHE/bin/etcd-$ETCD_VERSION"
KWOK_BIN="$CACHE/bin/kwok-$KWOK_VERSION"
SRC="$CACHE/src"

ETCD_PORT="${MLOPS_GPU_K8S_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${MLOPS_GPU_K8S_ETCD_PEER_PORT:-23800}"
API_PORT="${MLOPS_GPU_K8S_API_PORT:-26443}"
KCM_PORT="${MLOPS_GPU_K8S_KCM_PORT:-26257}"
SCHED_PORT="${MLOPS_GPU_K8S_SCHED_PORT:-26259}"
KWOK_PORT="${MLOPS_GPU_K8S_KWOK_PORT:-26080}"
API_QPS="${MLOPS_GPU_K8S_API_QPS:-500}"
API_BURST="${MLOPS_GPU_K8S_API_BURST:-1000}"
JOB_SYNCS="${MLOPS_GPU_K8S_CONCURRENT_JOB_SYNCS:-50}"
CONTROLLERS="${MLOPS_GPU_K8S_CONTROLLERS:-*}"
BUILD_JOBS="${MLOPS_GPU_K8S_BUILD_JOBS:-1}"
READY_TIMEOUT="${MLOPS_GPU_K8S_READY_TIMEOUT:-300}"
CONTEXT="mlops-gpu-test"
API_URL="https://127.0.0.1:$API_PORT"
KUBECONFIG_PATH="$STATE/kubeconfig"
# kwok stages: node/fast/node-initialize, node/heartbeat (status heartbeat
# every 20-45 s; the controller-manager's node-monitor-grace-period is raised
# to 2m to match) and the whole pod/general set (pod-ready there needs
# pod-create's Initialized condition).  kwok runs without node Leases: in
# Lease mode a restarted kwok waits for the old Leases to expire and, in that
# window, pods bound to its nodes were seen to never start.
STAGES="node-initialize node-heartbeat pod-create pod-init-container-running pod-init-container-completed pod-ready pod-complete pod-delete"

log() { printf 'k8s.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    echo "usage: $0 {build|start [--nodes N]|stop|reset|status [--nodes N]|kubeconfig|scheduler start|stop}" >&2
    exit 2
}

for v in ETCD_PORT ETCD_PEER_PORT API_PORT KCM_PORT SCHED_PORT KWOK_PORT API_QPS API_BURST JOB_SYNCS BUILD_JOBS READY_TIMEOUT; do
    case "${!v}" in '' | *[!0-9]*) die "$v must be a number, got '${!v}'" ;; esac
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODS="$HERE/k8s" # the parts and the Go wrapper modules
# shellcheck source=k8s/build.sh
. "$MODS/build.sh"
# shellcheck source=k8s/state.sh
. "$MODS/state.sh"
# shellcheck source=k8s/daemons.sh
. "$MODS/daemons.sh"

# --- nodes ------------------------------------------------------------------

PYTHON="${MLOPS_GPU_K8S_PYTHON:-$(command -v python3 || true)}"

# nodes_py ACTION N: scripts/k8s/nodes.py (ensure: create the missing nodes and wait until N
# are Ready; check: exit 0 iff N are Ready; unready).  Standard library only.
nodes_py() {
    [ -n "$PYTHON" ] || die "python3 is not installed"
    "$PYTHON" "$MODS/nodes.py" "$1" "$2" "$API_URL" "$CERTS" "$READY_TIMEOUT"
}

# --- commands ---------------------------------------------------------------

lock_state() {
    mkdir -p "$STATE"
    exec 9>"$STATE/.lock"
    flock 9
}

parse_nodes() {
    NODES=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) [ $# -ge 2 ] || usage; NODES="$2"; shift 2 ;;
            --nodes=*) NODES="${1#--nodes=}"; shift ;;
            *) usage ;;
        esac
    done
    case "$NODES" in
        '') ;;
        *[!0-9]*) die "--nodes must be a number, got '$NODES'" ;;
    esac
}

cmd_start() {
    parse_nodes "$@"
    local t0=$SECONDS
    [ -n "$NODES" ] || NODES=100
    if ! { k8s_built && etcd_built && kwok_built; }; then cmd_build; fi
    command -v curl >/dev/null 2>&1 || die "curl is not installed"
    lock_state
    mkdir -p "$LOGS" "$PIDS"
    make_certs
    write_kubeconfig
    local kwok_was_up=1
    pid_alive kwok || kwok_was_up=0
    [ "$kwok_was_up" = 1 ] || write_stages
    ensure etcd "$ETCD_PORT" etcd_healthy start_etcd
    ensure kube-apiserver "$API_PORT" api_ready start_apiserver
    ensure kube-controller-manager "$KCM_PORT" kcm_healthy start_kcm
    if [ "$kwok_was_up" = 0 ]; then
        nodes_py unready 0 || die "could not reset the fake nodes' Ready condition"
    fi
    ensure kwok "$KWOK_PORT" kwok_healthy start_kwok
    nodes_py ensure "$NODES" || die "fake nodes are not Ready"
    echo "$NODES" >"$STATE/nodes"
    log "control plane up at $API_URL ($((SECONDS - t0))s)"
    echo "KUBECONFIG=$KUBECONFIG_PATH"
}

cmd_stop() {
    lock_state
    local n
    for n in kube-scheduler kwok kube-controller-manager kube-apiserver etcd; do
        stop_one "$n"
    done
    log "stopped"
}

cmd_reset() {
    cmd_stop
    log "removing etcd data (the next start begins with an empty cluster)"
    rm -rf "$STATE/etcd-data" "$STATE/nodes"
}

cmd_status() {
    parse_nodes "$@"
    if [ -z "$NODES" ]; then NODES="$(cat "$STATE/nodes" 2>/dev/null || echo 100)"; fi
    local rc=0 n
    for n in etcd kube-apiserver kube-controller-manager kwok kube-scheduler; do
        if pid_alive "$n"; then log "$n: running (pid $(cat "$PIDS/$n.pid"))"; else log "$n: not running"; fi
    done
    if api_ready; then log "kube-apiserver /readyz: ok"; else log "kube-apiserver /readyz: not ok"; return 1; fi
    if nodes_py check "$NODES"; then log "$NODES fake nodes Ready"; else log "fewer than $NODES fake nodes Ready"; rc=1; fi
    return "$rc"
}

cmd_scheduler() {
    case "${1:-}" in
        start)
            lock_state
            api_ready || die "the control plane is not running; run: $0 start"
            ensure kube-scheduler "$SCHED_PORT" sched_healthy start_scheduler
            log "kube-scheduler running"
            ;;
        stop)
            lock_state
            stop_one kube-scheduler
            ;;
        *) usage ;;
    esac
}

case "${1:-}" in
    build) shift; [ $# -eq 0 ] || usage; cmd_build ;;
    start) shift; cmd_start "$@" ;;
    stop) shift; [ $# -eq 0 ] || usage; cmd_stop ;;
    reset) shift; [ $# -eq 0 ] || usage; cmd_reset ;;
    status) shift; cmd_status "$@" ;;
    kubeconfig) echo "$KUBECONFIG_PATH" ;;
    scheduler) shift; cmd_scheduler "$@" ;;
    *) usage ;;
esac
