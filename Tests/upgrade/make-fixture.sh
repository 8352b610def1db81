#!/usr/bin/env bash
# Makes an upgrade fixture with an earlier release's own programs (#56): a deployment, an agent
# enrolled in it, records logged on the device, and one pull of them landed, indexed and
# searchable; everything stopped cleanly. UpgradeEndToEndTests then runs today's programs on
# a copy of it.
#
#   Tests/upgrade/make-fixture.sh [--postgres] COMMIT NAME [BIN_DIR]
#
# builds COMMIT's dredge-server, dredge-agent and dredge in a worktree of its own (outside the
# repository; several minutes; or takes them from BIN_DIR, built from COMMIT already), and writes Tests/upgrade/fixtures/NAME.tar.gz (the data
# directory `server/`, the agent's state `agent/` and its store `store.sqlite`) and NAME.json
# (the commit, the release, the admin token, the pull and how many records it holds). The keys
# and tokens in a fixture are a throwaway test deployment's, made on loopback.
#
# With --postgres the deployment keeps its state in PostgreSQL (a private cluster on loopback,
# scripts/postgres.sh, schema `fixture`): the tarball holds the schema as `database.sql`
# (pg_dump's plain SQL, which any later PostgreSQL loads), and server.json names a placeholder
# database that the test replaces with its own.
set -euo pipefail
backend=sqlite
if [ "${1:-}" = "--postgres" ]; then backend=postgres; shift; fi
commit=${1:?usage: make-fixture.sh [--postgres] COMMIT NAME [BIN_DIR]}
name=${2:?usage: make-fixture.sh [--postgres] COMMIT NAME [BIN_DIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
SWIFT=${SWIFT:-swift}
tree=$(mktemp -d /tmp/dredge-fixture-tree-XXXXXX)
work=$(mktemp -d /tmp/dredge-fixture-XXXXXX)
pids=()
pgdir=""
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [ -n "$pgdir" ]; then "$root/scripts/postgres.sh" stop "$pgdir"; rm -rf "$pgdir"; fi
    git -C "$root" worktree remove --force "$tree" 2>/dev/null || true
    rm -rf "$tree" "$work"
}
trap cleanup EXIT

full=$(git -C "$root" rev-parse "$commit")
if [ -n "${3:-}" ]; then
    bin=$(cd "$3" && pwd)
else
    git -C "$root" worktree add --detach --force "$tree" "$commit" >/dev/null
    for product in dredge-server dredge-agent dredge; do
        (cd "$tree" && "$SWIFT" build --product "$product" >/dev/null)
    done
    bin=$(cd "$tree" && "$SWIFT" build --show-bin-path)
fi
# Releases before 0.2.0 had no --version: they are named by their commit.
version=$("$bin/dredge-server" --version 2>/dev/null || echo "before 0.2.0 (${full:0:9})")

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() {  # wait_for WHAT COMMAND...: up to 120 s
    local what=$1; shift
    for _ in $(seq 1 480); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
    echo "error: gave up waiting for $what" >&2; exit 1
}

data="$work/server" state="$work/agent" store="$work/store.sqlite"
database=()
if [ "$backend" = postgres ]; then
    # Its own directory: as root the cluster runs as nobody, who cannot enter $work.
    pgdir=$(mktemp -d /tmp/dredge-fixture-pg-XXXXXX)
    url=$("$root/scripts/postgres.sh" start "$pgdir")
    database=(--database "$url&schema=fixture")
fi
# Releases before the admin API's TLS served plain HTTP on loopback, and had no flag for it.
plain=()
if "$bin/dredge-server" init --help 2>&1 | grep -q -- --admin-plain-http; then plain=(--admin-plain-http); fi
"$bin/dredge-server" init --data "$data" "${plain[@]}" "${database[@]}" > "$work/init.txt"
enrollment=$(sed -n 's/^ *enrollment token: *//p' "$work/init.txt")
admin_token=$(sed -n '/Admin token for engineers/{n;s/^ *//;p}' "$work/init.txt")
agent_port=$(free_port) admin_port=$(free_port)
"$bin/dredge-server" run --data "$data" --agent-port "$agent_port" --admin-port "$admin_port" --heartbeat-seconds 1 > "$work/server.log" 2>&1 &
pids+=($!)
wait_for "the server" grep -q "admin API ready" "$work/server.log"

levels=(info warning error debug notice)
types=(app business network)
for i in $(seq 1 30); do
    "$bin/dredge-agent" log --store "$store" --uid u-1 --level "${levels[$((i % 5))]}" --type "${types[$((i % 3))]}" --meta "n=$i" "fixture record $i" >/dev/null
done
"$bin/dredge-agent" log --store "$store" --uid u-2 --level error "another user's record" >/dev/null
"$bin/dredge-agent" enroll --state "$state" --server "localhost:$agent_port" --ca "$data/ca.pem" --token "$enrollment" >/dev/null
"$bin/dredge-agent" run --state "$state" --store "$store" > "$work/agent.log" 2>&1 &
pids+=($!)
wait_for "the agent online" sh -c "'$bin/dredge-server' agents --data '$data' --json | grep -q '\"u-1\"'"
pull=$("$bin/dredge-server" pull --data "$data" --uid u-1 --since 1d)
wait_for "the pull complete" sh -c "'$bin/dredge-server' pulls --data '$data' --json | grep -q '\"complete\"'"
records=$(sed -n 's/.*"detail" *: *"\([0-9]*\) records".*/\1/p' <("$bin/dredge-server" pulls --data "$data" --json) | head -1)
[ "$records" -gt 0 ] || { echo "error: the pull landed no records" >&2; exit 1; }
export XDG_CONFIG_HOME="$work/config" DREDGE_SERVER="" DREDGE_TOKEN="" DREDGE_CA="" DREDGE_PROFILE=""
if "$bin/dredge" --help 2>&1 | grep -qE '^ +logs '; then
    count() { "$bin/dredge" logs --pull "$pull" --format jsonl --limit 0 --server "http://127.0.0.1:$admin_port" --token "$admin_token" | grep -c '^{'; }
    wait_for "the pull searchable" sh -c "[ \"\$(\"$bin/dredge\" logs --pull $pull --format jsonl --limit 0 --server http://127.0.0.1:$admin_port --token $admin_token | grep -c '^{')\" = $records ]"
    searchable=$(count)
else
    # A release without search: today's server indexes the landed pull at its first start.
    searchable=$records
fi
agent_id=$(sed -n 's/.*"agentID" *: *"\([0-9a-f]*\)".*/\1/p' "$state/agent.json" | head -1)

# Stopped as an operator stops them.
for pid in "${pids[@]}"; do kill -TERM "$pid"; wait "$pid" || true; done
pids=()

files=(server agent store.sqlite)
if [ "$backend" = postgres ]; then
    # The schema as plain SQL (owners and grants left out), and server.json naming a
    # placeholder: the private cluster's password goes with it.
    PGPASSWORD=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.urlsplit(sys.argv[1]).password)' "$url") \
        pg_dump --format=plain --schema=fixture --no-owner --no-privileges \
        --dbname="$(python3 -c 'import sys, urllib.parse; u = urllib.parse.urlsplit(sys.argv[1]); print(f"postgresql://{u.username}@{u.hostname}:{u.port}{u.path}?sslmode=disable")' "$url")" \
        | grep -v -E '^\\(un)?restrict ' > "$work/database.sql"
    python3 - "$data/server.json" <<'PY'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config["database"] = "postgres://dredge@127.0.0.1:5432/placeholder?schema=fixture"
json.dump(config, open(path, "w"), indent=2, sort_keys=True)
PY
    files+=(database.sql)
fi

mkdir -p "$root/Tests/upgrade/fixtures"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work" -czf "$root/Tests/upgrade/fixtures/$name.tar.gz" "${files[@]}"
cat > "$root/Tests/upgrade/fixtures/$name.json" <<EOF
{
  "backend": "$backend",
  "commit": "$full",
  "version": "$version",
  "made": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "adminToken": "$admin_token",
  "agentID": "$agent_id",
  "pull": "$pull",
  "uid": "u-1",
  "records": $searchable
}
EOF
echo "made Tests/upgrade/fixtures/$name.tar.gz ($(du -h "$root/Tests/upgrade/fixtures/$name.tar.gz" | cut -f1)): $version at ${full:0:9}, pull $pull with $searchable records"
