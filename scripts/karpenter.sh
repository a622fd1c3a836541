#!/usr/bin/env bash
# Karpenter with its kwok cloud provider, on the project's test control plane
# (scripts/k8s.sh): the real autoscaler the Kubernetes elastic-pool test runs
# against.  Built from Go modules (sigs.k8s.io/karpenter, its ./kwok command)
# and cached; no images, no Helm.
#
#   scripts/karpenter.sh build    build (if missing) karpenter-kwok into the
#                                 cache, with the CRDs of the same version
#   scripts/karpenter.sh start    build if needed; apply the CRDs (NodePool,
#                                 NodeClaim, NodeOverlay, KWOKNodeClass), a
#                                 KWOKNodeClass and one NodePool (below) to the
#                                 control plane of $MLOPS_GPU_K8S_DIR (which
#                                 must be running: scripts/k8s.sh start), then
#                                 run karpenter-kwok against it until healthy
#   scripts/karpenter.sh stop     stop it (pid file)
#   scripts/karpenter.sh status   exit 0 iff it runs and answers /healthz
#
# Progress goes to stderr; start's last stdout line is KUBECONFIG=<path>.
# start/stop are idempotent; start re-applies the NodePool (its settings may
# change between starts) and restarts nothing that is healthy.
#
# The NodePool ($MLOPS_GPU_KARPENTER_POOL, default "gpu") offers one kwok
# instance type, "gpu-8x" (8 nvidia.com/gpu, 64 cpu, 512Gi, on-demand in
# zone test-zone-a, $MLOPS_GPU_KARPENTER_PRICE USD/h).  Its nodes carry the
# labels mlops-gpu/pool=<pool> (how mlops-gpu's Kubernetes backend knows a
# pool's nodes) and nvidia.com/gpu.product=$MLOPS_GPU_KARPENTER_GPU_PRODUCT,
# and Karpenter's own (karpenter.sh/nodepool, node.kubernetes.io/instance-type,
# ...); the kwok provider creates them with the annotation
# kwok.x-k8s.io/node=fake, so the control plane's kwok (started by k8s.sh)
# makes them Ready and runs their pods.  Disruption: WhenEmpty after
# $MLOPS_GPU_KARPENTER_CONSOLIDATE_AFTER; limits: $MLOPS_GPU_KARPENTER_MAX_NODES
# nodes' worth of GPUs.  The KWOKNodeClass "default" delays each new node's
# registration by $MLOPS_GPU_KARPENTER_BOOT_DELAY (a machine's boot).
# Karpenter provisions only for pods kube-scheduler marked Unschedulable:
# start kube-scheduler too (scripts/k8s.sh scheduler start).
#
# Environment:
#   MLOPS_GPU_K8S_CACHE / MLOPS_GPU_K8S_DIR   as in k8s.sh: the binary goes to
#                         $CACHE/karpenter-<v>/, Karpenter's logs, pid and
#                         instance types to $MLOPS_GPU_K8S_DIR/karpenter/
#   MLOPS_GPU_KARPENTER_VERSION        (v1.13.0)
#   MLOPS_GPU_KARPENTER_POOL           NodePool name and mlops-gpu/pool label (gpu)
#   MLOPS_GPU_KARPENTER_GPU_PRODUCT    (NVIDIA-A100-SXM4-80GB)
#   MLOPS_GPU_KARPENTER_MAX_NODES      (4)
#   MLOPS_GPU_KARPENTER_PRICE          (10.0)
#   MLOPS_GPU_KARPENTER_CONSOLIDATE_AFTER   (15s)
#   MLOPS_GPU_KARPENTER_BOOT_DELAY     (2s)
#   MLOPS_GPU_KARPENTER_METRICS_PORT / _HEALTH_PORT   (26380 / 26381)
#   MLOPS_GPU_KARPENTER_PYTHON         a python3 with PyYAML, to apply the
#                                      manifests (default: python3)
#   MLOPS_GPU_K8S_BUILD_JOBS           go build -p (1)
#   MLOPS_GPU_K8S_READY_TIMEOUT        seconds to wait for health (300)
# Needs: go (build only), curl, python3 with PyYAML, flock, setsid.

set -euo pipefail
umask 022

VERSION="${MLOPS_GPU_KARPENTER_VERSION:-v1.13.0}"
CACHE="${MLOPS_GPU_K8S_CACHE:-$HOME/.cache/mlops-gpu/k8s}"
STATE="${MLOPS_GPU_K8S_DIR:-$HOME/.cache/mlops-gpu/k8s/run}"
HERE="$CACHE/karpenter-$VERSION"
BIN="$HERE/karpenter-kwok"
CRDS="$HERE/crds"
RUN="$STATE/karpenter"
KUBECONFIG_PATH="$STATE/kubeconfig"
POOL="${MLOPS_GPU_KARPENTER_POOL:-gpu}"
PRODUCT="${MLOPS_GPU_KARPENTER_GPU_PRODUCT:-NVIDIA-A100-SXM4-80GB}"
MAX_NODES="${MLOPS_GPU_KARPENTER_MAX_NODES:-4}"
PRICE="${MLOPS_GPU_KARPENTER_PRICE:-10.0}"
CONSOLIDATE_AFTER="${MLOPS_GPU_KARPENTER_CONSOLIDATE_AFTER:-15s}"
BOOT_DELAY="${MLOPS_GPU_KARPENTER_BOOT_DELAY:-2s}"
METRICS_PORT="${MLOPS_GPU_KARPENTER_METRICS_PORT:-26380}"
HEALTH_PORT="${MLOPS_GPU_KARPENTER_HEALTH_PORT:-26381}"
PYTHON="${MLOPS_GPU_KARPENTER_PYTHON:-python3}"
BUILD_JOBS="${MLOPS_GPU_K8S_BUILD_JOBS:-1}"
READY_TIMEOUT="${MLOPS_GPU_K8S_READY_TIMEOUT:-300}"

log() { printf 'karpenter.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
usage() { echo "usage: $0 {build|start|stop|status}" >&2; exit 2; }

for v in MAX_NODES METRICS_PORT HEALTH_PORT BUILD_JOBS READY_TIMEOUT; do
    case "${!v}" in '' | *[!0-9]*) die "$v must be a number, got '${!v}'" ;; esac
done
case "$POOL" in '' | *[!a-z0-9-]* | -* | *-) die "MLOPS_GPU_KARPENTER_POOL must be a DNS label (a-z, 0-9, -), got '$POOL'" ;; esac
for v in CONSOLIDATE_AFTER BOOT_DELAY; do
    [[ "${!v}" =~ ^([0-9]+(s|m|h))+$ ]] || die "$v must be a duration like 15s or 1m, got '${!v}'"
done

# --- building --------------------------------------------------------------

# Go's defaults otherwise (cgo as the machine has it, no -trimpath): the dependencies' compiled
# packages are then shared with any other build of this module on the machine (go's build cache).
GOENV=(env GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOFLAGS="-mod=mod -buildvcs=false -p=$BUILD_JOBS" GOWORK=off)

built() { [ -x "$BIN" ] && [ -s "$CRDS/karpenter.sh_nodepools.yaml" ] && [ -s "$CRDS/karpenter.kwok.sh_kwoknodeclasses.yaml" ]; }

cmd_build() {
    built && return 0
    command -v go >/dev/null 2>&1 || die "go is not installed"
    mkdir -p "$HERE" "$CACHE/src"
    exec 8>"$HERE/.build.lock"
    flock 8
    built && return 0
    local src="$CACHE/src/karpenter-$VERSION" logf="$HERE/build.log" moddir t0=$SECONDS
    : >"$logf"
    log "building karpenter-kwok $VERSION; log: $logf"
    log "  a cold build downloads its modules and takes ~20 min on 2 cores"
    if ! "${GOENV[@]}" go mod download -json "sigs.k8s.io/karpenter@$VERSION" >>"$logf" 2>&1; then
        tail -n 30 "$logf" >&2
        die "could not download sigs.k8s.io/karpenter@$VERSION (full log: $logf)"
    fi
    moddir="$("${GOENV[@]}" go env GOMODCACHE)/sigs.k8s.io/karpenter@$VERSION"
    [ -d "$moddir/kwok" ] || die "the module has no kwok/ directory: $moddir"
    # The module cache is read-only and `go build -mod=mod` may update go.sum: a writable copy.
    rm -rf "$src"
    cp -r "$moddir" "$src"
    chmod -R u+w "$src"
    log "  go build ./kwok (started $(date +%H:%M:%S))"
    if ! (cd "$src" && nice -n 19 "${GOENV[@]}" go build -ldflags "-s -w" -o "$HERE/karpenter-kwok.tmp" ./kwok) >>"$logf" 2>&1 </dev/null; then
        tail -n 60 "$logf" >&2
        die "go build failed (full log: $logf)"
    fi
    mkdir -p "$CRDS"
    cp -f "$src"/pkg/apis/crds/karpenter.sh_*.yaml "$src"/kwok/apis/crds/*.yaml "$CRDS/"
    chmod 644 "$CRDS"/*.yaml
    mv -f "$HERE/karpenter-kwok.tmp" "$BIN"
    built || die "build finished but $HERE is incomplete"
    log "karpenter-kwok $VERSION built: $BIN ($((SECONDS - t0))s)"
}

# --- the process -------------------------------------------------------------

pid_alive() {
    local f="$RUN/karpenter.pid" pid exe
    [ -s "$f" ] || return 1
    pid="$(cat "$f")"
    case "$pid" in '' | *[!0-9]*) return 1 ;; esac
    kill -0 "$pid" 2>/dev/null || return 1
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    case "$exe" in */karpenter-kwok | */"karpenter-kwok (deleted)") return 0 ;; *) return 1 ;; esac
}

healthy() { [ "$(curl -sS --max-time 3 "http://127.0.0.1:$HEALTH_PORT/healthz" 2>/dev/null)" = ok ]; }

# apply: the CRDs (waiting until they are served), then the KWOKNodeClass and NodePool.
apply() {
    "$PYTHON" - "$KUBECONFIG_PATH" "$CRDS" "$POOL" "$PRODUCT" "$MAX_NODES" "$CONSOLIDATE_AFTER" "$BOOT_DELAY" "$READY_TIMEOUT" <<'PY'
import base64, glob, json, ssl, sys, tempfile, time, http.client, urllib.parse
import yaml

kcfg, crds, pool, product, max_nodes, consolidate, boot, timeout = sys.argv[1:]
cfg = yaml.safe_load(open(kcfg))
cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
u = urllib.parse.urlparse(cluster["server"])
tmp = tempfile.mkdtemp()
def pem(key, name):
    path = f"{tmp}/{name}"
    open(path, "wb").write(base64.b64decode(key))
    return path
ctx = ssl.create_default_context(cafile=pem(cluster["certificate-authority-data"], "ca"))
ctx.load_cert_chain(pem(user["client-certificate-data"], "crt"), pem(user["client-key-data"], "key"))

def req(method, path, body=None, ctype="application/json"):
    conn = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=30)
    conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                 headers={"Content-Type": ctype, "Accept": "application/json"})
    r = conn.getresponse()
    return r.status, json.loads(r.read() or b"{}")

def put(base, obj):
    """Create, or replace keeping the resourceVersion: an idempotent apply."""
    name = obj["metadata"]["name"]
    st, cur = req("GET", f"{base}/{name}")
    if st == 404:
        st, body = req("POST", base, obj)
    elif st == 200:
        obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        st, body = req("PUT", f"{base}/{name}", obj)
    else:
        body = cur
    if st not in (200, 201):
        raise SystemExit(f"applying {obj['kind']} {name} failed: HTTP {st}: {body.get('message', body)}")

crd_base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
names = []
for f in sorted(glob.glob(f"{crds}/*.yaml")):
    for doc in yaml.safe_load_all(open(f)):
        if doc and doc.get("kind") == "CustomResourceDefinition":
            put(crd_base, doc)
            names.append(doc["metadata"]["name"])
deadline = time.monotonic() + float(timeout)
for n in names:
    while True:
        st, body = req("GET", f"{crd_base}/{n}")
        conds = {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}
        if st == 200 and conds.get("Established") == "True":
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"CRD {n} not Established after {timeout}s")
        time.sleep(0.3)

put("/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses", {
    "apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
    "metadata": {"name": "default"}, "spec": {"nodeRegistrationDelay": boot}})
gpus = 8
put("/apis/karpenter.sh/v1/nodepools", {
    "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": pool},
    "spec": {
        "template": {
            "metadata": {"labels": {"mlops-gpu/pool": pool, "nvidia.com/gpu.product": product,
                                    "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.present": "true"}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-8x"]},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                ],
                "expireAfter": "Never",
            },
        },
        "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": consolidate},
        "limits": {"nvidia.com/gpu": str(gpus * int(max_nodes))},
    }})
print(f"karpenter.sh: applied CRDs {', '.join(names)}; NodePool {pool}", file=sys.stderr)
PY
}

instance_types() {
    cat >"$RUN/instance-types.json" <<JSON
[
  {
    "name": "gpu-8x",
    "offerings": [
      {"Price": $PRICE, "Available": true, "Requirements": [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]}]}
    ],
    "architecture": "amd64",
    "operatingSystems": ["linux"],
    "resources": {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti", "nvidia.com/gpu": "8"}
  }
]
JSON
}

cmd_start() {
    built || cmd_build
    command -v curl >/dev/null 2>&1 || die "curl is not installed"
    [ -s "$KUBECONFIG_PATH" ] || die "no control plane at $STATE (run: scripts/k8s.sh start)"
    mkdir -p "$RUN"
    exec 9>"$RUN/.lock"
    flock 9
    apply || die "could not apply Karpenter's CRDs and NodePool"
    if pid_alive && healthy; then
        log "karpenter-kwok already running (pid $(cat "$RUN/karpenter.pid"))"
        echo "KUBECONFIG=$KUBECONFIG_PATH"
        return 0
    fi
    if ! pid_alive; then
        instance_types
        log "starting karpenter-kwok (log: $RUN/karpenter.log)"
        printf '==== %s starting\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$RUN/karpenter.log"
        (
            for fd in /proc/self/fd/*; do
                fd="${fd##*/}"
                [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
            done
            # No leader election (one replica), no webhooks in this version; batches cut short
            # so that a burst is provisioned within seconds.
            exec env KUBECONFIG="$KUBECONFIG_PATH" DISABLE_LEADER_ELECTION=true \
                METRICS_PORT="$METRICS_PORT" HEALTH_PROBE_PORT="$HEALTH_PORT" \
                INSTANCE_TYPES_FILE_PATH="$RUN/instance-types.json" \
                BATCH_IDLE_DURATION=1s BATCH_MAX_DURATION=3s LOG_LEVEL=info \
                KUBE_CLIENT_QPS=200 KUBE_CLIENT_BURST=300 \
                setsid "$BIN" </dev/null >>"$RUN/karpenter.log" 2>&1
        ) &
        echo $! >"$RUN/karpenter.pid"
    fi
    local deadline=$((SECONDS + READY_TIMEOUT))
    until healthy; do
        if ! kill -0 "$(cat "$RUN/karpenter.pid")" 2>/dev/null; then
            tail -n 40 "$RUN/karpenter.log" >&2
            die "karpenter-kwok exited (log: $RUN/karpenter.log)"
        fi
        [ "$SECONDS" -lt "$deadline" ] || { tail -n 40 "$RUN/karpenter.log" >&2; die "karpenter-kwok not healthy after ${READY_TIMEOUT}s"; }
        sleep 0.5
    done
    log "karpenter-kwok running (pid $(cat "$RUN/karpenter.pid")); NodePool $POOL"
    echo "KUBECONFIG=$KUBECONFIG_PATH"
}

cmd_stop() {
    mkdir -p "$RUN"
    local pid
    if pid_alive; then
        pid="$(cat "$RUN/karpenter.pid")"
        log "stopping karpenter-kwok (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$RUN/karpenter.pid"
}

cmd_status() {
    if pid_alive && healthy; then log "karpenter-kwok running (pid $(cat "$RUN/karpenter.pid"))"; return 0; fi
    log "karpenter-kwok not running"
    return 1
}

case "${1:-}" in
    build) shift; [ $# -eq 0 ] || usage; cmd_build ;;
    start) shift; [ $# -eq 0 ] || usage; cmd_start ;;
    stop) shift; [ $# -eq 0 ] || usage; cmd_stop ;;
    status) shift; [ $# -eq 0 ] || usage; cmd_status ;;
    *) usage ;;
esac
