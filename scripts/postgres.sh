#!/usr/bin/env bash
# Run a throwaway PostgreSQL server (Debian's packages) on loopback for the
# test suite's PostgreSQL store tests and for CI.
#
#   scripts/postgres.sh start   install (if needed), initdb (if needed), start
#                               (if not already answering), create the test
#                               database, then print the SQLAlchemy URL
#   scripts/postgres.sh stop    stop the server; exit 0 if it is not running
#   scripts/postgres.sh url     print the SQLAlchemy URL, start nothing
#
# stdout carries exactly one line (the URL) for `start` and `url`; everything
# else goes to stderr.  Idempotent: a second `start` only checks and prints.
#
# Environment:
#   MLOPS_GPU_PG_DIR   base directory (default: $HOME/.cache/mlops-gpu/postgres,
#                      see below for the root case).  Layout:
#                        $DIR/data          the cluster (PGDATA)
#                        $DIR/postgres.log  server log
#                        $DIR/.s.PGSQL.*    unix socket (or /tmp if the path
#                                           would be too long for a socket)
#                        $DIR/.lock         serialises concurrent invocations
#   MLOPS_GPU_PG_PORT  TCP port on 127.0.0.1 (default: 55432)
#
# The server trusts every connection from the local socket and from
# 127.0.0.1/::1 and listens only on 127.0.0.1.  It runs with fsync=off and
# synchronous_commit=off: fast, and unsafe for anything but tests.

set -euo pipefail
umask 022

PORT="${MLOPS_GPU_PG_PORT:-55432}"
DB_NAME="mlops_gpu_test"
DB_USER="postgres"

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    echo "usage: $0 {start|stop|url}" >&2
    exit 2
}

url() { printf 'postgresql+psycopg://%s@127.0.0.1:%s/%s\n' "$DB_USER" "$PORT" "$DB_NAME"; }

case "$PORT" in
    '' | *[!0-9]*) die "MLOPS_GPU_PG_PORT must be a number, got '$PORT'" ;;
esac

# --- locating the binaries -------------------------------------------------

find_bindir() {
    # Newest installed major version wins.
    local f
    f="$(ls -1d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)"
    [ -n "$f" ] && dirname "$f"
}

install_postgres() {
    local sudo=() aptlog rc=0
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "postgresql is not installed and we are not root (no sudo either)"
        sudo=(sudo -n)
    fi
    # apt output goes to a file, not to our stdout/stderr: the package's
    # maintainer scripts may start a daemon, which would inherit our pipes and
    # make a caller that captures our output wait for EOF forever.
    aptlog="$(mktemp -t mlops-gpu-pg-apt.XXXXXX)"
    # shellcheck disable=SC2317
    apt_get() {
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get -o DPkg::Lock::Timeout=300 "$@" </dev/null >>"$aptlog" 2>&1
    }
    if ! apt-cache show postgresql >/dev/null 2>&1; then
        log "package 'postgresql' unknown to apt; running apt-get update"
        apt_get update || { cat "$aptlog" >&2; rm -f "$aptlog"; die "apt-get update failed"; }
    fi
    log "installing Debian's postgresql (apt-get install)"
    apt_get install -y --no-install-recommends postgresql || rc=$?
    if [ "$rc" -ne 0 ]; then
        # Package lists may be stale (404 on the pool); refresh once and retry.
        log "apt-get install failed (rc=$rc); running apt-get update and retrying"
        rc=0
        apt_get update && apt_get install -y --no-install-recommends postgresql || rc=$?
    fi
    cat "$aptlog" >&2
    rm -f "$aptlog"
    [ "$rc" -eq 0 ] || die "apt-get install postgresql failed"
}

# --- choosing the directory and the OS user that owns the cluster ----------

# True if OS user $1 can traverse to directory $2 (checked on the nearest
# existing ancestor; directories we create later get mode 755 thanks to umask).
user_can_reach() {
    local user="$1" dir="$2"
    while [ ! -e "$dir" ]; do dir="$(dirname "$dir")"; done
    runuser -u "$user" -- test -x "$dir" 2>/dev/null
}

resolve_dirs() {
    if [ -n "${MLOPS_GPU_PG_DIR:-}" ]; then
        BASE="$MLOPS_GPU_PG_DIR"
    else
        BASE="${HOME:-/tmp}/.cache/mlops-gpu/postgres"
        # initdb/postgres refuse to run as root, so as root the cluster is
        # owned by the `postgres` system user, which must be able to traverse
        # to it.  $HOME is typically /root with mode 700, which it cannot.
        # Rather than loosen permissions on someone's home directory we then
        # fall back to /var/tmp/mlops-gpu-postgres (persistent across reboots
        # unlike /tmp, reachable by everyone, and not cleaned per-process).
        if [ "$(id -u)" -eq 0 ] && id postgres >/dev/null 2>&1 \
            && ! user_can_reach postgres "$BASE"; then
            BASE="/var/tmp/mlops-gpu-postgres"
        fi
    fi
    case "$BASE" in /*) ;; *) BASE="$PWD/$BASE" ;; esac
    PGDATA_DIR="$BASE/data"
    LOGFILE="$BASE/postgres.log"
    LOCKFILE="$BASE/.lock"
    # Unix socket paths are limited to 107 bytes; fall back to /tmp.
    SOCKDIR="$BASE"
    if [ $(( ${#SOCKDIR} + ${#PORT} + 12 )) -gt 100 ]; then SOCKDIR=/tmp; fi
}

resolve_owner() {
    if [ -d "$PGDATA_DIR" ]; then
        OWNER="$(stat -c %U "$PGDATA_DIR")"
    elif [ "$(id -u)" -eq 0 ]; then
        OWNER=postgres
    else
        OWNER="$(id -un)"
    fi
}

# Run a command as the cluster owner, from a directory it can read, with no
# inherited file descriptors beyond 0-2 (callers redirect those).
as_owner() {
    if [ "$OWNER" = "$(id -un)" ]; then
        (cd / && exec 9>&- && exec "$@")
    elif [ "$(id -u)" -eq 0 ]; then
        (cd / && exec 9>&- && exec runuser -u "$OWNER" -- "$@")
    else
        die "cluster $PGDATA_DIR is owned by '$OWNER'; run this script as that user or as root"
    fi
}

take_lock() {
    exec 9>>"$LOCKFILE"
    flock -w 300 9 || die "timed out waiting for $LOCKFILE"
}

# --- server state helpers --------------------------------------------------

pg_ready() {  # 0 accepting, 1 rejecting (starting up), 2 no answer
    local rc=0
    PGCONNECT_TIMEOUT=3 "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 3 </dev/null >/dev/null 2>&1 || rc=$?
    return "$rc"
}

is_postgres_pid() {
    local pid="$1" comm
    case "$pid" in '' | *[!0-9]*) return 1 ;; esac
    kill -0 "$pid" 2>/dev/null || return 1
    comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
    [ "$comm" = postgres ] || [ "$comm" = postmaster ]
}

# Remove a lock file whose PID is not a live postgres process.  postgres does
# this itself when the PID is dead, but after a container restart the PID is
# often reused by an unrelated process and it then refuses to start.
clear_stale_lockfile() {
    local f="$1" pid
    [ -f "$f" ] || return 0
    pid="$(head -n 1 "$f" 2>/dev/null | tr -dc '0-9')"
    if ! is_postgres_pid "$pid"; then
        log "removing stale $f (pid ${pid:-?} is not a running postgres)"
        rm -f "$f"
    fi
}

# PID of our postmaster if it is alive, else empty.
running_pid() {
    local pid
    [ -f "$PGDATA_DIR/postmaster.pid" ] || return 0
    pid="$(head -n 1 "$PGDATA_DIR/postmaster.pid" 2>/dev/null | tr -dc '0-9')"
    if is_postgres_pid "$pid"; then echo "$pid"; fi
}

running_port() { sed -n 4p "$PGDATA_DIR/postmaster.pid" 2>/dev/null | tr -dc '0-9'; }

pg_ctl_stop() {
    as_owner "$BIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w -t 120 stop </dev/null >>"$LOGFILE" 2>&1
}

# --- start -----------------------------------------------------------------

write_config() {
    local conf="$PGDATA_DIR/mlops_gpu.conf"
    cat >"$conf" <<EOF
# Written by scripts/postgres.sh on every start; edits are overwritten.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$(printf '%s' "$SOCKDIR" | sed "s/'/''/g")'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
log_line_prefix = '%m [%p] %q%u@%d '
EOF
    chown "$OWNER": "$conf"
    if ! grep -q "^include_if_exists = 'mlops_gpu.conf'" "$PGDATA_DIR/postgresql.conf"; then
        printf "\ninclude_if_exists = 'mlops_gpu.conf'\n" >>"$PGDATA_DIR/postgresql.conf"
    fi
}

ensure_cluster() {
    if [ -f "$PGDATA_DIR/PG_VERSION" ]; then return 0; fi
    if [ -d "$PGDATA_DIR" ]; then
        log "removing incomplete data directory $PGDATA_DIR"
        rm -rf "$PGDATA_DIR"
    fi
    log "initdb $PGDATA_DIR (owner $OWNER)"
    mkdir -p "$PGDATA_DIR"
    chmod 700 "$PGDATA_DIR"
    chown "$OWNER": "$PGDATA_DIR"
    if ! as_owner "$BIN/initdb" -D "$PGDATA_DIR" -U "$DB_USER" --auth=trust \
        -E UTF8 --locale=C.UTF-8 --no-sync </dev/null >>"$LOGFILE" 2>&1; then
        tail -n 30 "$LOGFILE" >&2 || true
        rm -rf "$PGDATA_DIR"
        die "initdb failed (log: $LOGFILE)"
    fi
}

start_server() {
    local pid port rc i
    pid="$(running_pid)"
    if [ -n "$pid" ]; then
        port="$(running_port)"
        if [ "$port" != "$PORT" ]; then
            log "server (pid $pid) runs on port $port, want $PORT; restarting it"
            pg_ctl_stop || die "could not stop server (log: $LOGFILE)"
        else
            # Ours, on the right port, but not answering yet: still starting
            # or in crash recovery.  Give it a while.
            for i in $(seq 1 120); do
                rc=0; pg_ready || rc=$?
                [ "$rc" -eq 0 ] && return 0
                is_postgres_pid "$pid" || break
                sleep 1
            done
            is_postgres_pid "$pid" && die "server pid $pid does not accept connections on port $PORT (log: $LOGFILE)"
        fi
    fi
    clear_stale_lockfile "$PGDATA_DIR/postmaster.pid"
    clear_stale_lockfile "$SOCKDIR/.s.PGSQL.$PORT.lock"

    write_config
    log "starting server on 127.0.0.1:$PORT (data $PGDATA_DIR, log $LOGFILE)"
    # stdin from /dev/null, stdout/stderr into the log, fd 9 (our lock)
    # closed: the daemon must not keep any of the caller's pipes open.
    if ! as_owner "$BIN/pg_ctl" -D "$PGDATA_DIR" -l "$LOGFILE" -w -t 120 start \
        </dev/null >>"$LOGFILE" 2>&1; then
        tail -n 30 "$LOGFILE" >&2 || true
        die "pg_ctl start failed (log: $LOGFILE)"
    fi
}

ensure_database() {
    local exists
    local psql=("$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$DB_USER")
    exists="$(PGCONNECT_TIMEOUT=10 "${psql[@]}" -d postgres -tA \
        -c "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'" </dev/null)" \
        || die "cannot query server on 127.0.0.1:$PORT"
    if [ "$exists" != 1 ]; then
        log "creating database $DB_NAME"
        PGCONNECT_TIMEOUT=10 "${psql[@]}" -d postgres -c "CREATE DATABASE \"$DB_NAME\"" \
            </dev/null >&2 || die "CREATE DATABASE $DB_NAME failed"
    fi
}

cmd_start() {
    BIN="$(find_bindir || true)"
    if [ -z "$BIN" ]; then
        install_postgres
        BIN="$(find_bindir || true)"
        [ -n "$BIN" ] || die "initdb still not found under /usr/lib/postgresql/*/bin after install"
    fi
    resolve_dirs
    resolve_owner

    # Fast path: already up.
    if pg_ready; then
        ensure_database
        url
        return 0
    fi

    if [ "$(id -u)" -eq 0 ] && [ "$OWNER" != root ]; then
        user_can_reach "$OWNER" "$BASE" \
            || die "user '$OWNER' cannot reach $BASE; choose another MLOPS_GPU_PG_DIR"
        mkdir -p "$BASE"
        chown "$OWNER": "$BASE"
    else
        mkdir -p "$BASE"
    fi
    take_lock
    touch "$LOGFILE"
    [ "$(id -u)" -ne 0 ] || chown "$OWNER": "$LOGFILE"

    # Someone else may have started it while we waited for the lock.
    if ! pg_ready; then
        ensure_cluster
        resolve_owner
        start_server
    fi
    ensure_database
    url
}

# --- stop ------------------------------------------------------------------

cmd_stop() {
    BIN="$(find_bindir || true)"
    [ -n "$BIN" ] || { log "postgresql not installed; nothing to stop"; return 0; }
    resolve_dirs
    if [ ! -d "$PGDATA_DIR" ]; then
        log "no cluster at $PGDATA_DIR; nothing to stop"
        return 0
    fi
    resolve_owner
    take_lock
    if [ -z "$(running_pid)" ]; then
        log "server not running"
        return 0
    fi
    log "stopping server ($PGDATA_DIR)"
    pg_ctl_stop || { tail -n 30 "$LOGFILE" >&2 || true; die "pg_ctl stop failed"; }
}

case "${1:-}" in
    start) [ $# -eq 1 ] || usage; cmd_start ;;
    stop) [ $# -eq 1 ] || usage; cmd_stop ;;
    url) [ $# -eq 1 ] || usage; url ;;
    *) usage ;;
esac
