# scripts/k8s.sh, part: the state folder: certificates, kubeconfig, kwok stage files (sourced).
# shellcheck shell=bash

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
