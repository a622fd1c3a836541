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
# Fake nodes are named kwok-node-0..N-1, carry the annotation
# kwok.x-k8s.io/node=fake (kwok manages only those) and the label
# mlops-gpu.test/fake-node=true, capacity/allocatable nvidia.com/gpu=8,
# cpu=64, memory=512Gi, pods=110, ephemeral-storage=1Ti, InternalIP
# 10.240.<i/250>.<i%250+1>; even-numbered nodes are labelled
# nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB, odd-numbered ones
# NVIDIA-H100-80GB-HBM3.  No taints.
#
# kwok stages (copied from the kwok module's kustomize/stage at build time):
# node-initialize, node-heartbeat, and pod/general's pod-create,
# pod-init-container-running/-completed, pod-ready, pod-complete (Job-owned
# pods only; honours pod-complete.stage.kwok.x-k8s.io/delay, e.g. "30s") and
# pod-delete (a deleted pod disappears at a random moment between 1 s and its
# grace period).  Pods need a container image name (any string) and
# are never pulled or run; pods of other owners stay Running until deleted.
# Nothing checks resources on the nodes: a pod pinned by nodeName runs even
# if its node's GPUs are over-committed (kube-scheduler, if started, does
# check).
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
# Credentials: a self-made CA (openssl) signs the apiserver serving cert and a
# client cert for user "admin" in group system:masters; the kubeconfig
# (context mlops-gpu-test) embeds them.  Controller-manager, scheduler and kwok
# use that kubeconfig too.  A separate RSA key pair signs service-account
# tokens.  etcd runs with --unsafe-no-fsync: for tests only.
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

# --- building --------------------------------------------------------------

# Builds must not switch toolchains behind our back, must not need cgo and
# must stay gentle on a small machine.
GOENV=(env GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -p=$BUILD_JOBS" GOWORK=off)

# run_logged LOGFILE CMD...: run CMD niced with output to LOGFILE; on failure
# print the tail of the log (the exact error) and fail.
run_logged() {
    local logf="$1"
    shift
    if ! nice -n 19 "$@" >>"$logf" 2>&1 </dev/null; then
        log "command failed: $*"
        log "---- last lines of $logf ----"
        tail -n 60 "$logf" >&2
        die "build step failed (full log: $logf)"
    fi
}

k8s_built() {
    [ -x "$K8S_BIN/kube-apiserver" ] && [ -x "$K8S_BIN/kube-controller-manager" ] && [ -x "$K8S_BIN/kube-scheduler" ]
}
etcd_built() { [ -x "$ETCD_BIN/etcd" ]; }
kwok_built() {
    [ -x "$KWOK_BIN/kwok" ] || return 1
    local s
    for s in $STAGES; do [ -s "$KWOK_BIN/stages/$s.yaml" ] || return 1; done
}

build_k8s() {
    k8s_built && return 0
    command -v go >/dev/null 2>&1 || die "go is not installed"
    local dir="$SRC/kubernetes-$K8S_VERSION" minor major gomod
    local logf="$dir/build.log"
    mkdir -p "$dir" "$K8S_BIN"
    : >"$logf"
    major="${K8S_VERSION#v}"
    major="${major%%.*}"
    minor="${K8S_VERSION#v*.}"
    minor="${minor%%.*}"
    log "building Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler) in $dir; log: $logf"
    log "  a cold build downloads ~0.5 GB of modules and takes tens of minutes on 2 cores"
    (
        cd "$dir"
        # Upstream's go.mod: which staging modules it replaces with local paths.
        run_logged "$logf" "${GOENV[@]}" go mod download -json "k8s.io/kubernetes@$K8S_VERSION"
        gomod="$("${GOENV[@]}" go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
        [ -s "$gomod" ] || die "upstream go.mod not found at $gomod"
        {
            echo "module mlops-gpu.local/k8s-wrapper"
            echo
            echo "go $(awk '$1=="go"{print $2; exit}' "$gomod")"
            echo
            echo "require k8s.io/kubernetes $K8S_VERSION"
            echo
            echo "replace ("
            # every k8s.io/<staging> => ./staging/... becomes its published v0.Y.Z
            awk -v v="v0.$minor.${K8S_VERSION##*.}" \
                '$2=="=>" && $3 ~ /^\.\/staging\// {print "\t" $1 " => " $1 " " v}' "$gomod"
            echo ")"
        } >go.mod
        rm -f go.sum
        # tools.go keeps the commands in the module graph (never compiled).
        cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
EOF
        log "  resolving modules (go get)"
        run_logged "$logf" "${GOENV[@]}" go get \
            "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
            "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
            "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION"
        local ldflags="-s -w"
        local p
        for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
            ldflags="$ldflags -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
            ldflags="$ldflags -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        done
        local tmp="$dir/out"
        rm -rf "$tmp"
        mkdir -p "$tmp"
        local c
        for c in kube-apiserver kube-controller-manager kube-scheduler; do
            if [ -x "$K8S_BIN/$c" ]; then continue; fi
            log "  go build $c (started $(date +%H:%M:%S))"
            run_logged "$logf" "${GOENV[@]}" go build -trimpath -ldflags "$ldflags" -o "$tmp/$c" "k8s.io/kubernetes/cmd/$c"
            mv -f "$tmp/$c" "$K8S_BIN/$c"
        done
    )
    k8s_built || die "Kubernetes build finished but binaries are missing in $K8S_BIN"
    log "Kubernetes $K8S_VERSION built: $K8S_BIN"
}

build_etcd() {
    etcd_built && return 0
    command -v go >/dev/null 2>&1 || die "go is not installed"
    local dir="$SRC/etcd-$ETCD_VERSION"
    local logf="$dir/build.log"
    mkdir -p "$dir" "$ETCD_BIN"
    : >"$logf"
    log "building etcd $ETCD_VERSION in $dir; log: $logf"
    (
        cd "$dir"
        local gomod
        run_logged "$logf" "${GOENV[@]}" go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
        gomod="$("${GOENV[@]}" go env GOMODCACHE)/cache/download/go.etcd.io/etcd/server/v3/@v/$ETCD_VERSION.mod"
        [ -s "$gomod" ] || die "etcd go.mod not found at $gomod"
        printf 'module mlops-gpu.local/etcd-wrapper\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
            "$(awk '$1=="go"{print $2; exit}' "$gomod")" "$ETCD_VERSION" >go.mod
        rm -f go.sum
        cat >main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
        run_logged "$logf" "${GOENV[@]}" go mod tidy
        log "  go build etcd (started $(date +%H:%M:%S))"
        run_logged "$logf" "${GOENV[@]}" go build -trimpath -ldflags "-s -w" -o "$dir/etcd.tmp" .
        mv -f "$dir/etcd.tmp" "$ETCD_BIN/etcd"
    )
    etcd_built || die "etcd build finished but $ETCD_BIN/etcd is missing"
    log "etcd $ETCD_VERSION built: $ETCD_BIN/etcd"
}

build_kwok() {
    kwok_built && return 0
    command -v go >/dev/null 2>&1 || die "go is not installed"
    local dir="$SRC/kwok-$KWOK_VERSION"
    local logf="$dir/build.log"
    mkdir -p "$dir" "$KWOK_BIN/stages"
    : >"$logf"
    log "building kwok $KWOK_VERSION; log: $logf"
    (
        cd "$dir"
        if [ ! -x "$KWOK_BIN/kwok" ]; then
            log "  go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION (started $(date +%H:%M:%S))"
            run_logged "$logf" "${GOENV[@]}" GOBIN="$dir/gobin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
            mv -f "$dir/gobin/kwok" "$KWOK_BIN/kwok"
        fi
        local moddir
        moddir="$("${GOENV[@]}" go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION"
        [ -d "$moddir/kustomize/stage" ] || run_logged "$logf" "${GOENV[@]}" go mod download "sigs.k8s.io/kwok@$KWOK_VERSION"
        [ -d "$moddir/kustomize/stage" ] || die "kwok stages not found in $moddir/kustomize/stage"
        local s src
        for s in $STAGES; do
            case "$s" in
                node-initialize) src="node/fast/node-initialize.yaml" ;;
                node-heartbeat) src="node/heartbeat/node-heartbeat.yaml" ;;
                node-heartbeat-with-lease) src="node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" ;;
                *) src="pod/general/$s.yaml" ;;
            esac
            cp -f "$moddir/kustomize/stage/$src" "$KWOK_BIN/stages/$s.yaml" 2>>"$logf" || {
                log "stage files present in the module:"
                (cd "$moddir/kustomize/stage" && find . -name '*.yaml' ! -path '*/testdata/*' | sort) >&2
                die "could not copy kwok stage $src (see above)"
            }
        done
        chmod 644 "$KWOK_BIN/stages/"*.yaml
    )
    kwok_built || die "kwok build finished but $KWOK_BIN is incomplete"
    log "kwok $KWOK_VERSION built: $KWOK_BIN/kwok"
}

cmd_build() {
    local t0=$SECONDS
    mkdir -p "$CACHE"
    # One build at a time (a concurrent start would otherwise race).
    exec 8>"$CACHE/.build.lock"
    flock 8
    build_etcd
    build_kwok
    build_k8s
    exec 8>&-
    log "all binaries present ($((SECONDS - t0))s)"
}

# --- state: certificates, kubeconfig, stage files ----------------------------

CERTS="$STATE/certs"
LOGS="$STATE/logs"
PIDS="$STATE/pids"

# Pod stage timing: kwok's defaults are a 1000 ms delay plus up to 5000 ms of
# jitter for each of pod-create, pod-ready and pod-complete (a Job pod is
# Running 2-10 s after it was bound).  Per pod, annotations override them:
# <stage>.stage.kwok.x-k8s.io/delay and .../jitter-delay.
POD_DELAY_MS="${MLOPS_GPU_K8S_POD_DELAY_MS:-1000}"
POD_JITTER_MS="${MLOPS_GPU_K8S_POD_JITTER_MS:-5000}"
NODE_GRACE="${MLOPS_GPU_K8S_NODE_MONITOR_GRACE_PERIOD:-2m}"
KWOK_POD_PARALLELISM="${MLOPS_GPU_K8S_KWOK_POD_PARALLELISM:-16}"
for v in POD_DELAY_MS POD_JITTER_MS KWOK_POD_PARALLELISM; do
    case "${!v}" in '' | *[!0-9]*) die "$v must be a number, got '${!v}'" ;; esac
done

openssl_q() {
    local out
    out="$(openssl "$@" 2>&1)" || { printf '%s\n' "$out" >&2; die "openssl $1 failed"; }
}

make_certs() {
    command -v openssl >/dev/null 2>&1 || die "openssl is not installed"
    mkdir -p "$CERTS"
    chmod 700 "$CERTS"
    local c="$CERTS"
    if [ ! -s "$c/ca.crt" ] || [ ! -s "$c/ca.key" ]; then
        log "generating CA, serving/client certificates and service-account keys in $c"
        rm -f "$c"/*.crt "$c"/*.key "$c"/*.pub "$c"/*.csr "$c"/*.srl
        openssl_q req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=mlops-gpu-test-ca" \
            -keyout "$c/ca.key" -out "$c/ca.crt"
    fi
    if [ ! -s "$c/apiserver.crt" ]; then
        printf '%s\n' \
            "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
            "extendedKeyUsage=serverAuth" "keyUsage=critical,digitalSignature,keyEncipherment" >"$c/apiserver.ext"
        openssl_q req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$c/apiserver.key" -out "$c/apiserver.csr"
        openssl_q x509 -req -in "$c/apiserver.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial \
            -days 3650 -extfile "$c/apiserver.ext" -out "$c/apiserver.crt"
    fi
    if [ ! -s "$c/admin.crt" ]; then
        printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature,keyEncipherment" >"$c/client.ext"
        openssl_q req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=admin" -keyout "$c/admin.key" -out "$c/admin.csr"
        openssl_q x509 -req -in "$c/admin.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial \
            -days 3650 -extfile "$c/client.ext" -out "$c/admin.crt"
    fi
    if [ ! -s "$c/front-proxy-client.crt" ]; then
        # For the aggregation layer's request-header authentication (the
        # controller-manager and scheduler read its CA from the cluster).
        printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature,keyEncipherment" >"$c/client.ext"
        openssl_q req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" -keyout "$c/front-proxy-client.key" -out "$c/front-proxy-client.csr"
        openssl_q x509 -req -in "$c/front-proxy-client.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial \
            -days 3650 -extfile "$c/client.ext" -out "$c/front-proxy-client.crt"
    fi
    if [ ! -s "$c/sa.key" ] || [ ! -s "$c/sa.pub" ]; then
        openssl_q genrsa -out "$c/sa.key" 2048
        openssl_q rsa -in "$c/sa.key" -pubout -out "$c/sa.pub"
    fi
    chmod 600 "$c"/*.key
}

b64() { base64 -w0 <"$1"; }

write_kubeconfig() {
    local tmp="$KUBECONFIG_PATH.tmp.$$"
    cat >"$tmp" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: $CONTEXT
  cluster:
    server: $API_URL
    certificate-authority-data: $(b64 "$CERTS/ca.crt")
users:
- name: $CONTEXT-admin
  user:
    client-certificate-data: $(b64 "$CERTS/admin.crt")
    client-key-data: $(b64 "$CERTS/admin.key")
contexts:
- name: $CONTEXT
  context:
    cluster: $CONTEXT
    user: $CONTEXT-admin
current-context: $CONTEXT
KCFG
    chmod 600 "$tmp"
    mv -f "$tmp" "$KUBECONFIG_PATH"
}

write_stages() {
    # Upstream's stage files, with the pod stages' default delay/jitter
    # substituted when MLOPS_GPU_K8S_POD_DELAY_MS / _JITTER_MS are set.
    # In pod-complete, a jitter-delay annotation falls back to the delay
    # annotation: kwok uses min(delay, jitter) when jitter <= delay, so
    # without this `pod-complete.stage.kwok.x-k8s.io/delay: 30s` alone would
    # complete the pod after 5 s.
    mkdir -p "$STATE/stages"
    local s f
    rm -f "$STATE/stages/"*.yaml
    for s in $STAGES; do
        f="$STATE/stages/$s.yaml"
        case "$s" in
            pod-create | pod-ready | pod-complete)
                sed -e "s/^\(    durationMilliseconds:\) 1000\$/\1 $POD_DELAY_MS/" \
                    -e "s/^\(    jitterDurationMilliseconds:\) 5000\$/\1 $POD_JITTER_MS/" \
                    "$KWOK_BIN/stages/$s.yaml" >"$f"
                if [ "$s" = pod-complete ]; then
                    sed -i 's|expressionFrom: '"'"'.metadata.annotations\["pod-complete.stage.kwok.x-k8s.io/jitter-delay"\]'"'"'|expressionFrom: '"'"'.metadata.annotations["pod-complete.stage.kwok.x-k8s.io/jitter-delay"] // .metadata.annotations["pod-complete.stage.kwok.x-k8s.io/delay"]'"'"'|' "$f"
                fi
                ;;
            *) cp -f "$KWOK_BIN/stages/$s.yaml" "$f" ;;
        esac
    done
    cat >"$STATE/stages/kwok.yaml" <<KWOKCFG
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: $KWOK_POD_PARALLELISM
  nodePlayStageParallelism: 4
KWOKCFG
}

# --- processes --------------------------------------------------------------

# pid_alive NAME: the pid in $PIDS/NAME.pid is alive and still runs our binary.
pid_alive() {
    local f="$PIDS/$1.pid" pid exe
    [ -s "$f" ] || return 1
    pid="$(cat "$f")"
    case "$pid" in '' | *[!0-9]*) return 1 ;; esac
    kill -0 "$pid" 2>/dev/null || return 1
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    case "$exe" in
        */"$1" | */"$1 (deleted)") return 0 ;;
        *) return 1 ;;
    esac
}

# daemon NAME BINARY ARGS...: start detached (own session, no inherited fds),
# record the pid.
daemon() {
    local name="$1" bin="$2"
    shift 2
    mkdir -p "$LOGS" "$PIDS"
    [ -x "$bin" ] || die "$bin is missing; run: $0 build"
    log "starting $name (log: $LOGS/$name.log)"
    {
        printf '==== %s starting %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"
    } >>"$LOGS/$name.log"
    (
        # Close every inherited descriptor above stderr (lock files, a
        # caller's pipes): a daemon holding a caller's pipe would make it
        # wait for EOF forever.
        for fd in /proc/self/fd/*; do
            fd="${fd##*/}"
            [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
        done
        exec setsid "$bin" "$@" </dev/null >>"$LOGS/$name.log" 2>&1
    ) &
    local pid=$!
    echo "$pid" >"$PIDS/$name.pid"
    # The subshell becomes the binary only at its exec: until then /proc/PID/exe is bash or
    # setsid and pid_alive calls the daemon dead (a loaded machine made wait_for give up on a
    # kube-controller-manager that went on to run). Wait for the exec, or for it to die.
    for _ in $(seq 100); do
        if pid_alive "$name" || ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
}

stop_one() {
    local name="$1" f="$PIDS/$1.pid" pid
    if ! pid_alive "$name"; then
        rm -f "$f"
        return 0
    fi
    pid="$(cat "$f")"
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name did not stop in 10s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$f"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

curl_api() {
    curl -sS --max-time 5 --cacert "$CERTS/ca.crt" --cert "$CERTS/admin.crt" --key "$CERTS/admin.key" "$@"
}

etcd_healthy() { curl -fsS --max-time 3 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }
api_ready() { [ -s "$CERTS/admin.crt" ] && [ "$(curl_api "$API_URL/readyz" 2>/dev/null)" = ok ]; }
kcm_healthy() { [ "$(curl -ksS --max-time 3 "https://127.0.0.1:$KCM_PORT/healthz" 2>/dev/null)" = ok ]; }
sched_healthy() { [ "$(curl -ksS --max-time 3 "https://127.0.0.1:$SCHED_PORT/healthz" 2>/dev/null)" = ok ]; }
kwok_healthy() { [ "$(curl -sS --max-time 3 "http://127.0.0.1:$KWOK_PORT/healthz" 2>/dev/null)" = ok ]; }

# wait_for NAME CHECK: poll CHECK until it succeeds; fail with the log tail
# if the process dies or READY_TIMEOUT passes.
wait_for() {
    local name="$1" check="$2" deadline=$((SECONDS + READY_TIMEOUT))
    until "$check"; do
        if ! pid_alive "$name"; then
            log "$name exited; last lines of $LOGS/$name.log:"
            tail -n 40 "$LOGS/$name.log" >&2
            die "$name failed to start"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "$name not healthy after ${READY_TIMEOUT}s; last lines of $LOGS/$name.log:"
            tail -n 40 "$LOGS/$name.log" >&2
            die "$name did not become healthy"
        fi
        sleep 0.3
    done
}

# ensure NAME PORT CHECK STARTFN: start NAME unless it is healthy.
ensure() {
    local name="$1" port="$2" check="$3" startfn="$4"
    if pid_alive "$name" && "$check"; then
        return 0
    fi
    if pid_alive "$name"; then
        # Running but not (yet) healthy: give it its chance first.
        wait_for "$name" "$check"
        return 0
    fi
    if port_busy "$port"; then
        die "127.0.0.1:$port is in use by a process we did not start (pid file $PIDS/$name.pid); stop it or set the port env var"
    fi
    "$startfn"
    wait_for "$name" "$check"
}

start_etcd() {
    mkdir -p "$STATE/etcd-data"
    chmod 700 "$STATE/etcd-data"
    daemon etcd "$ETCD_BIN/etcd" \
        --name=mlops-gpu-test \
        --data-dir="$STATE/etcd-data" \
        --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
        --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster="mlops-gpu-test=http://127.0.0.1:$ETCD_PEER_PORT" \
        --quota-backend-bytes=8589934592 \
        --unsafe-no-fsync=true \
        --log-level=warn
}

start_apiserver() {
    daemon kube-apiserver "$K8S_BIN/kube-apiserver" \
        --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --bind-address=127.0.0.1 \
        --advertise-address=127.0.0.1 \
        --secure-port="$API_PORT" \
        --cert-dir="$CERTS/apiserver-generated" \
        --tls-cert-file="$CERTS/apiserver.crt" \
        --tls-private-key-file="$CERTS/apiserver.key" \
        --client-ca-file="$CERTS/ca.crt" \
        --requestheader-client-ca-file="$CERTS/ca.crt" \
        --requestheader-allowed-names=front-proxy-client \
        --requestheader-username-headers=X-Remote-User \
        --requestheader-group-headers=X-Remote-Group \
        --requestheader-extra-headers-prefix=X-Remote-Extra- \
        --proxy-client-cert-file="$CERTS/front-proxy-client.crt" \
        --proxy-client-key-file="$CERTS/front-proxy-client.key" \
        --endpoint-reconciler-type=none \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$CERTS/sa.pub" \
        --service-account-signing-key-file="$CERTS/sa.key" \
        --service-cluster-ip-range=10.96.0.0/16 \
        --authorization-mode=RBAC \
        --allow-privileged=true \
        --max-requests-inflight="${MLOPS_GPU_K8S_MAX_REQUESTS_INFLIGHT:-1600}" \
        --max-mutating-requests-inflight="${MLOPS_GPU_K8S_MAX_MUTATING_REQUESTS_INFLIGHT:-800}" \
        --profiling=false \
        --v="${MLOPS_GPU_K8S_VERBOSITY:-1}"
}

start_kcm() {
    daemon kube-controller-manager "$K8S_BIN/kube-controller-manager" \
        --kubeconfig="$KUBECONFIG_PATH" \
        --authentication-kubeconfig="$KUBECONFIG_PATH" \
        --authorization-kubeconfig="$KUBECONFIG_PATH" \
        --bind-address=127.0.0.1 \
        --secure-port="$KCM_PORT" \
        --cert-dir="$CERTS/kcm-generated" \
        --leader-elect=false \
        --controllers="$CONTROLLERS" \
        --service-account-private-key-file="$CERTS/sa.key" \
        --root-ca-file="$CERTS/ca.crt" \
        --cluster-signing-cert-file="$CERTS/ca.crt" \
        --cluster-signing-key-file="$CERTS/ca.key" \
        --use-service-account-credentials=false \
        --kube-api-qps="$API_QPS" \
        --kube-api-burst="$API_BURST" \
        --concurrent-job-syncs="$JOB_SYNCS" \
        --node-monitor-grace-period="$NODE_GRACE" \
        --profiling=false \
        --v="${MLOPS_GPU_K8S_VERBOSITY:-1}"
}

start_kwok() {
    local cfg=(--config="$STATE/stages/kwok.yaml") s
    for s in $STAGES; do cfg+=(--config="$STATE/stages/$s.yaml"); done
    daemon kwok "$KWOK_BIN/kwok" \
        --kubeconfig="$KUBECONFIG_PATH" \
        --manage-all-nodes=false \
        --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
        --server-address="127.0.0.1:$KWOK_PORT" \
        --cidr=10.244.0.0/16 \
        "${cfg[@]}"
}

start_scheduler() {
    cat >"$STATE/kube-scheduler.yaml" <<SCHED
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $KUBECONFIG_PATH
  qps: $API_QPS
  burst: $API_BURST
leaderElection:
  leaderElect: false
SCHED
    daemon kube-scheduler "$K8S_BIN/kube-scheduler" \
        --config="$STATE/kube-scheduler.yaml" \
        --authentication-kubeconfig="$KUBECONFIG_PATH" \
        --authorization-kubeconfig="$KUBECONFIG_PATH" \
        --bind-address=127.0.0.1 \
        --secure-port="$SCHED_PORT" \
        --cert-dir="$CERTS/scheduler-generated" \
        --profiling=false \
        --v="${MLOPS_GPU_K8S_VERBOSITY:-1}"
}

# --- nodes ------------------------------------------------------------------

PYTHON="${MLOPS_GPU_K8S_PYTHON:-$(command -v python3 || true)}"

# nodes_py ACTION N: "ensure" creates missing kwok-node-<i> (i < N) and waits
# until N are Ready; "check" exits 0 iff N are Ready.  Standard library only.
nodes_py() {
    [ -n "$PYTHON" ] || die "python3 is not installed"
    "$PYTHON" - "$1" "$2" "$API_URL" "$CERTS" "$READY_TIMEOUT" <<'PY'
import json, ssl, sys, time, http.client, urllib.parse

action, n, url, certs, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
u = urllib.parse.urlparse(url)
ctx = ssl.create_default_context(cafile=f"{certs}/ca.crt")
ctx.load_cert_chain(f"{certs}/admin.crt", f"{certs}/admin.key")
conn = None

def req(method, path, body=None, ctype="application/json"):
    global conn
    for attempt in range(3):
        try:
            if conn is None:
                conn = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=30)
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": ctype, "Accept": "application/json"})
            r = conn.getresponse()
            return r.status, json.loads(r.read() or b"{}")
        except (OSError, http.client.HTTPException):
            conn = None
            if attempt == 2:
                raise
            time.sleep(0.5)

GPU_PRODUCTS = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]

def node(i):
    name = f"kwok-node-{i}"
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                "type": "kwok", "mlops-gpu.test/fake-node": "true",
                "nvidia.com/gpu.product": GPU_PRODUCTS[i % 2], "nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true",
            },
        },
        "spec": {},
        "status": {"capacity": res, "allocatable": dict(res),
                   "addresses": [{"type": "InternalIP", "address": f"10.240.{i // 250}.{i % 250 + 1}"},
                                 {"type": "Hostname", "address": name}],
                   "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"}},
    }

def ready_names():
    st, body = req("GET", "/api/v1/nodes?labelSelector=" + urllib.parse.quote("mlops-gpu.test/fake-node=true"))
    if st != 200:
        raise SystemExit(f"listing nodes failed: HTTP {st}: {body.get('message', body)}")
    have, ready = set(), set()
    for it in body.get("items", []):
        nm = it["metadata"]["name"]
        have.add(nm)
        for c in (it.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                ready.add(nm)
    return have, ready

want = {f"kwok-node-{i}" for i in range(n)}
have, ready = ready_names()
if action == "check":
    sys.exit(0 if want <= ready else 1)
if action == "unready":
    # Before (re)starting kwok: mark every fake node's Ready condition
    # Unknown, so that kwok's node-initialize stage setting it back to True
    # shows that kwok really manages the node (and syncs its pods).
    patch = {"status": {"conditions": [{"type": "Ready", "status": "Unknown",
                                        "reason": "KwokRestarting", "message": "kwok is (re)starting"}]}}
    for nm in sorted(have):
        st, body = req("PATCH", f"/api/v1/nodes/{nm}/status", patch, "application/strategic-merge-patch+json")
        if st not in (200, 404):
            raise SystemExit(f"marking node {nm} Ready=Unknown failed: HTTP {st}: {body.get('message', body)}")
    sys.exit(0)

missing = sorted(want - have, key=lambda s: int(s.rsplit("-", 1)[1]))
if missing:
    print(f"k8s.sh: creating {len(missing)} fake GPU nodes", file=sys.stderr)
for nm in missing:
    st, body = req("POST", "/api/v1/nodes", node(int(nm.rsplit("-", 1)[1])))
    if st not in (201, 409):
        raise SystemExit(f"creating node {nm} failed: HTTP {st}: {body.get('message', body)}")
deadline = time.monotonic() + timeout
while True:
    have, ready = ready_names()
    if want <= ready:
        break
    if time.monotonic() > deadline:
        raise SystemExit(f"only {len(want & ready)}/{n} nodes Ready after {timeout:.0f}s (is kwok running? see logs/kwok.log)")
    time.sleep(0.5)
print(f"k8s.sh: {n} nodes Ready", file=sys.stderr)
PY
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
