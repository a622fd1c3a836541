# scripts/k8s.sh, part: starting, checking and stopping the daemons (sourced).
# shellcheck shell=bash

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

