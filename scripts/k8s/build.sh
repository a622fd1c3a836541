# scripts/k8s.sh, part: building the binaries into the cache (sourced, not run).
# shellcheck shell=bash

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

# The wrapper modules' committed files (go.mod, go.sum, *.go) plus the version they are built
# at: a cached binary made from other inputs is stale. bin/<version>/.inputs records this sum
# at build time; a cache from before these stamps (same version, same module: the files here
# are what that build resolved) is adopted by stamping it.
inputs_sum() { (cd "$1" && cat go.mod go.sum ./*.go && echo "$2") | sha256sum | cut -d' ' -f1; }
fresh() { # BIN MODULE_DIR VERSION
    local want
    want="$(inputs_sum "$2" "$3")"
    if [ ! -f "$1/.inputs" ]; then echo "$want" >"$1/.inputs.$$" && mv -f "$1/.inputs.$$" "$1/.inputs"; fi
    [ "$(cat "$1/.inputs")" = "$want" ]
}
stamp() { inputs_sum "$2" "$3" >"$1/.inputs"; }

k8s_built() {
    [ -x "$K8S_BIN/kube-apiserver" ] && [ -x "$K8S_BIN/kube-controller-manager" ] \
        && [ -x "$K8S_BIN/kube-scheduler" ] && fresh "$K8S_BIN" "$MODS/kube" "$K8S_VERSION"
}
etcd_built() { [ -x "$ETCD_BIN/etcd" ] && fresh "$ETCD_BIN" "$MODS/etcd" "$ETCD_VERSION"; }
kwok_built() {
    [ -x "$KWOK_BIN/kwok" ] || return 1
    local s
    for s in $STAGES; do [ -s "$KWOK_BIN/stages/$s.yaml" ] || return 1; done
}

# pinned GO_MOD MODULE: the version GO_MOD requires MODULE at.
pinned() { awk -v m="$2" '($1 == "require" && $2 == m) {print $3; exit} ($1 == m && $2 ~ /^v/) {print $2; exit}' "$1"; }

# prepare_module NAME DIR UPSTREAM VERSION: copy the committed module NAME into DIR (the build
# happens there, in the cache, never in the checkout). When VERSION is not the one go.mod pins
# (MLOPS_GPU_*_VERSION set to another), re-pin UPSTREAM at VERSION and let Go resolve the rest:
# that build is not reproducible from committed sums, and its log says so.
prepare_module() {
    local name="$1" dir="$2" upstream="$3" version="$4" logf="$2/build.log"
    rm -f "$dir/go.mod" "$dir/go.sum" "$dir"/*.go
    cp "$MODS/$name/go.mod" "$MODS/$name/go.sum" "$MODS/$name"/*.go "$dir/"
    [ "$(pinned "$dir/go.mod" "$upstream")" = "$version" ] && return 0
    log "  $upstream $version is not the pinned $(pinned "$dir/go.mod" "$upstream"): resolving modules afresh"
    local gomod module
    module="$(awk '$1 == "module" {print $2; exit}' "$dir/go.mod")"
    (cd "$dir" && run_logged "$logf" "${GOENV[@]}" go mod download -json "$upstream@$version")
    gomod="$("${GOENV[@]}" go env GOMODCACHE)/cache/download/$upstream/@v/$version.mod"
    [ -s "$gomod" ] || die "upstream go.mod not found at $gomod"
    {
        echo "module $module"
        echo
        echo "go $(awk '$1=="go"{print $2; exit}' "$gomod")"
        echo
        echo "require $upstream $version"
        if [ "$upstream" = k8s.io/kubernetes ]; then
            # Upstream's go.mod replaces its staging modules with local paths: each
            # k8s.io/<staging> => ./staging/... becomes its published v0.Y.Z.
            local minor="${version#v*.}"
            echo
            echo "replace ("
            awk -v v="v0.${minor%%.*}.${version##*.}" \
                '$2=="=>" && $3 ~ /^\.\/staging\// {print "\t" $1 " => " $1 " " v}' "$gomod"
            echo ")"
        fi
    } >"$dir/go.mod"
    rm -f "$dir/go.sum"
    (cd "$dir" && run_logged "$logf" "${GOENV[@]}" go mod tidy)
}

build_k8s() {
    k8s_built && return 0
    command -v go >/dev/null 2>&1 || die "go is not installed"
    local dir="$SRC/kubernetes-$K8S_VERSION" minor major
    local logf="$dir/build.log"
    mkdir -p "$dir" "$K8S_BIN"
    : >"$logf"
    major="${K8S_VERSION#v}"
    major="${major%%.*}"
    minor="${K8S_VERSION#v*.}"
    minor="${minor%%.*}"
    log "building Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler) in $dir; log: $logf"
    log "  a cold build downloads ~0.5 GB of modules and takes tens of minutes on 2 cores"
    if [ -f "$K8S_BIN/.inputs" ]; then
        # Built from other inputs: none of those binaries may be kept (a running control plane
        # keeps its deleted executables).
        log "  $K8S_BIN was built from other inputs than scripts/k8s/kube at $K8S_VERSION: rebuilding"
        rm -f "$K8S_BIN/.inputs" "$K8S_BIN"/kube-*
    fi
    prepare_module kube "$dir" k8s.io/kubernetes "$K8S_VERSION"
    (
        cd "$dir"
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
            [ ! -x "$K8S_BIN/$c" ] || continue # an interrupted build resumes
            log "  go build $c (started $(date +%H:%M:%S))"
            run_logged "$logf" "${GOENV[@]}" go build -trimpath -ldflags "$ldflags" -o "$tmp/$c" "k8s.io/kubernetes/cmd/$c"
            mv -f "$tmp/$c" "$K8S_BIN/$c"
        done
    )
    stamp "$K8S_BIN" "$MODS/kube" "$K8S_VERSION"
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
    prepare_module etcd "$dir" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
    log "  go build etcd (started $(date +%H:%M:%S))"
    (cd "$dir" && run_logged "$logf" "${GOENV[@]}" go build -trimpath -ldflags "-s -w" -o "$dir/etcd.tmp" .)
    mv -f "$dir/etcd.tmp" "$ETCD_BIN/etcd"
    stamp "$ETCD_BIN" "$MODS/etcd" "$ETCD_VERSION"
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
