#!/usr/bin/env bash
# A private PostgreSQL cluster on loopback for the tests and the demos: made in a directory of
# its own (initdb), listening on 127.0.0.1 on a free port and on a socket in that directory,
# with a random password. PostgreSQL refuses to run as root: as root, the cluster runs as
# `nobody`.
#
#   scripts/postgres.sh start DIR    make and start a cluster in DIR; prints its URL (also DIR/url)
#   scripts/postgres.sh stop DIR     stop it (the directory is left for the caller to remove)
#   scripts/postgres.sh run CMD...   start one in a temporary directory, run CMD with
#                                    DREDGE_TEST_POSTGRES set to its URL, stop and remove it
set -euo pipefail

bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    [ -x "$dir/initdb" ] || { echo "error: PostgreSQL is not installed (run scripts/install-deps.sh)" >&2; exit 1; }
    echo "$dir"
}

as_owner() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi
}

start() {
    local dir=$1 bin port password
    bin=$(bindir)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ "$(id -u)" -eq 0 ] && chown nobody "$dir"
    password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    printf '%s\n' "$password" > "$dir/pwfile"
    [ "$(id -u)" -eq 0 ] && chown nobody "$dir/pwfile"
    as_owner "$bin/initdb" -D "$dir/data" -U dredge --pwfile="$dir/pwfile" --auth=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    rm -f "$dir/pwfile"
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=400 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        start >/dev/null || { cat "$dir/postgres.log" >&2; exit 1; }
    PGPASSWORD=$password "$bin/psql" -h 127.0.0.1 -p "$port" -U dredge -d postgres -q -c "CREATE DATABASE dredge" >/dev/null
    echo "postgres://dredge:$password@127.0.0.1:$port/dredge?sslmode=disable" | tee "$dir/url"
}

stop() {
    local dir=$1
    [ -d "$dir/data" ] || return 0
    as_owner "$(bindir)/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}

case "${1:-}" in
start) start "$2" ;;
stop) stop "$2" ;;
run)
    shift
    dir=$(mktemp -d /tmp/dredge-postgres.XXXXXX)
    trap 'stop "$dir"; rm -rf "$dir"' EXIT
    url=$(start "$dir")
    DREDGE_TEST_POSTGRES=$url "$@"
    ;;
*)
    echo "usage: $0 start DIR | stop DIR | run CMD..." >&2
    exit 2
    ;;
esac
