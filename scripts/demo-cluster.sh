#!/usr/bin/env bash
# The cluster demo: one PostgreSQL, three dredge-server nodes (A, B, C) sharing it and one data
# directory, three devices spread over B and C. An engineer issues a pull on node A for a user
# the devices on B and C hold; node B is killed (SIGKILL) in the middle of its uploads; its
# devices reconnect to C, where the uploads resume from the chunks B stored and complete. The
# files are downloaded and checked against each device's store. Prints the failover time. Then
# the engineer, still on node A, watches the user live while every device is on node C.
# Exits non-zero if anything differs; stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${DEMO_CONFIG:-release}   # DEMO_CONFIG=debug reuses the test build
for product in dredge-server dredge-agent dredge-demo dredge; do ${SWIFT:-swift} build -c "$config" --product "$product" >&2; done
bin=.build/$config
out=${DEMO_DIR:-demo-cluster-output}
rm -rf "$out" && mkdir -p "$out"
out=$(cd "$out" && pwd)
pg=$(mktemp -d /tmp/dredge-demo-pg.XXXXXX)
pids=()
declare -A node_pid
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    scripts/postgres.sh stop "$pg" || true
    rm -rf "$pg"
}
trap cleanup EXIT

echo "== 1. PostgreSQL on loopback, and a deployment on it"
url=$(scripts/postgres.sh start "$pg")
echo "   ${url%%:*}://…@${url#*@}"
"$bin/dredge-server" init --data "$out/data" --database "$url" > "$out/init.txt"
token=$(awk '/enrollment token/ {print $3}' "$out/init.txt")
fingerprint=$(awk '/CA fingerprint/ {print $3}' "$out/init.txt")
admin_token=$(awk '/Admin token/ {getline; print $1}' "$out/init.txt")

echo "== 2. Three nodes on one database and one shared data directory ($out/data)"
declare -A agent_port admin_url
start_node() {
    local name=$1 log="$out/node-$1.log"
    "$bin/dredge-server" run --data "$out/data" --agent-port 0 --admin-port 0 --heartbeat-seconds 2 2> "$log" &
    node_pid[$name]=$!
    pids+=($!)
    for _ in $(seq 300); do grep -q "admin API ready" "$log" && grep -q "agent listener ready" "$log" && break; sleep 0.1; done
    agent_port[$name]=$(grep 'agent listener ready' "$log" | grep -o 'address=127.0.0.1:[0-9]*' | head -1 | cut -d: -f2 || true)
    admin_url[$name]=$(grep 'admin API ready' "$log" | grep -o 'url=https://[0-9.]*:[0-9]*' | head -1 | cut -d= -f2 || true)
    [ -n "${agent_port[$name]}" ] && [ -n "${admin_url[$name]}" ] || { echo "node $name did not start:"; cat "$log"; exit 1; }
    echo "   node $name: agents on localhost:${agent_port[$name]}, admin API ${admin_url[$name]}"
}
for n in A B C; do start_node $n; done
# The devices that connect to B do so over a slow uplink (256 KB/s), so their uploads last
# long enough for B to be killed in the middle of them.
python3 scripts/slow-link.py "$out/slow-link.port" "${agent_port[B]}" 262144 &
pids+=($!)
for _ in $(seq 50); do [ -s "$out/slow-link.port" ] && break; sleep 0.1; done
slow_b=$(cat "$out/slow-link.port")

export XDG_CONFIG_HOME="$out/engineer/config"
unset DREDGE_SERVER DREDGE_TOKEN DREDGE_CA DREDGE_PROFILE
"$bin/dredge" login --server "${admin_url[A]}" --fingerprint "$fingerprint" --token "$admin_token" >/dev/null
echo "   the engineer uses node A: dredge login --server ${admin_url[A]}"

echo "== 3. Three devices: kitchen and pantry on node B (then C, A), bakery on node C (then A, B)"
declare -A servers=(
    [kitchen]="localhost:$slow_b,localhost:${agent_port[C]},localhost:${agent_port[A]}"
    [pantry]="localhost:$slow_b,localhost:${agent_port[C]},localhost:${agent_port[A]}"
    [bakery]="localhost:${agent_port[C]},localhost:${agent_port[A]},localhost:${agent_port[B]}"
)
seed=1
for device in kitchen pantry bakery; do
    "$bin/dredge-demo" generate --store "$out/$device/logs.sqlite" --uids u-1001,u-1002,u-1003 --records 120000 --seed $seed --host "$device-oven" >/dev/null
    seed=$((seed + 1))
    "$bin/dredge-agent" enroll --state "$out/$device/agent" --server "${servers[$device]}" --ca "$out/data/ca.pem" --token "$token" --app "$device-oven" >/dev/null
    "$bin/dredge-agent" run --state "$out/$device/agent" --store "$out/$device/logs.sqlite" --app "$device-oven" --reconnect-max-seconds 2 2> "$out/$device/agent.log" &
    pids+=($!)
done
online() { "$bin/dredge" agents --online --uid u-1002 --json | python3 -c "import json,sys; print(len(json.load(sys.stdin)))"; }
for _ in $(seq 300); do [ "$(online)" = 3 ] && break; sleep 0.2; done
[ "$(online)" = 3 ] || { echo "FAILED: the devices did not all connect"; exit 1; }
"$bin/dredge" agents --uid u-1002 | sed 's/^/   /'

echo "== 4. On node A, a pull of user u-1002's logs of the last three days"
pull=$("$bin/dredge" pull --uid u-1002 --since 3d --reason "cluster demo" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['id'])")
echo "   pull $pull"
kitchen=$(python3 -c "import json; print(json.load(open('$out/kitchen/agent/agent.json'))['agentID'])")
# What node B has stored of the kitchen's upload: its chunk files in the shared directory.
stored() { { find "$out/data/uploads/$pull-$kitchen/chunks" -maxdepth 1 -regex '.*/[0-9]+' 2>/dev/null || true; } | wc -l; }
received=0
for _ in $(seq 3000); do
    received=$(stored)
    [ "$received" -ge 2 ] && break
    sleep 0.02
done
[ "$received" -ge 2 ] || { echo "FAILED: the kitchen's upload never began"; exit 1; }
t0=$(date +%s.%N)
kill -KILL "${node_pid[B]}"
status=missing count=0
read -r status count < <("$bin/dredge" show "$pull" --json | python3 -c "
import json, sys
t = next((t for t in json.load(sys.stdin)['targets'] if t['agentID'] == '$kitchen'), {'status': 'missing'})
print(t['status'], t.get('chunkCount', 0))") || true
[ "$status" = uploading ] || { echo "FAILED: node B was killed too late: the kitchen's upload is $status"; exit 1; }
echo "== 5. Node B is killed mid-upload (the kitchen's: $(stored) of $count chunks stored)"
back=""
# B's two devices connected again since the kill (to C: B's lease still lasts a few seconds,
# so "online" alone would count them before they moved).
reconnected() {
    "$bin/dredge" agents --online --json | python3 -c "
import datetime, json, sys
since = datetime.datetime.fromtimestamp($t0, datetime.timezone.utc)
def at(s): return datetime.datetime.fromisoformat(s.replace('Z', '+00:00'))
print(sum(1 for a in json.load(sys.stdin) if a['hostname'] in ('kitchen-oven', 'pantry-oven') and a.get('connectedAt') and at(a['connectedAt']) >= since.replace(microsecond=0)))"
}
for _ in $(seq 1200); do
    [ -z "$back" ] && [ "$(reconnected)" = 2 ] && back=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    state=$("$bin/dredge" show "$pull" --json | python3 -c "
import json, sys
p = json.load(sys.stdin)
s = [t['status'] for t in p['targets']]
print('done' if all(x == 'complete' for x in s) else 'failed' if any(x in ('failed', 'rejected', 'expired') for x in s) else 'open')")
    [ "$state" != open ] && break
    sleep 0.1
done
[ "$state" = done ] || { echo "FAILED: the pull did not complete after the kill ($state)"; "$bin/dredge" show "$pull"; exit 1; }
done_after=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
for _ in $(seq 100); do [ -n "$back" ] && break; [ "$(reconnected)" = 2 ] && back=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')"); sleep 0.1; done
[ -n "$back" ] || { echo "FAILED: node B's devices did not reconnect elsewhere"; exit 1; }
"$bin/dredge" show "$pull" | grep -v '^ *\(/\|http\)' | sed 's/^/   /'
echo "   B's devices reconnected elsewhere within $back s; every upload complete ${done_after} s after the kill"
echo "figure: cluster.failover seconds=$done_after agents_back_seconds=$back heartbeat_seconds=2 lease_seconds=6"

echo "== 6. The files, downloaded from node C, checked against each device's store"
"$bin/dredge" fetch "$pull" --server "${admin_url[C]}" --ca "$out/data/ca.pem" --token "$admin_token" --out "$out/engineer/pulls" >/dev/null
ok=1
for device in kitchen pantry bakery; do
    agent=$(python3 -c "import json; print(json.load(open('$out/$device/agent/agent.json'))['agentID'])")
    dir=$(ls -d "$out/engineer/pulls/$pull/"*"$agent")   # HOST_AGENT
    echo "   $device ($agent): $(cat "$dir"/*.jsonl | wc -l) records in $(ls "$dir"/*.jsonl | wc -l) day files"
    "$bin/dredge-demo" verify --store "$out/$device/logs.sqlite" --dir "$dir" | sed 's/^/     /' || ok=0
done
[ $ok = 1 ] || { echo "FAILED: what arrived is not what the filter selects"; exit 1; }
cmp -s <(cat "$out/data/pulls/$pull"/*/*.jsonl | sort) <(cat "$out/engineer/pulls/$pull"/*/*.jsonl | sort) || { echo "FAILED: the downloaded files differ from the server's"; exit 1; }

echo "== 7. On node A, a live tail of u-1001, whose devices are all connected to node C"
# No device is connected to A: what the engineer sees there, C held (the nodes share the
# database, whose notices carry the tail to C's devices, and the data directory A reads).
! grep -q "agent connected" "$out/node-A.log" || { echo "FAILED: a device connected to node A, which this step means to avoid"; exit 1; }
echo "   \$ dredge tail --uid u-1001 --level error+ --for 2m --reason CLUSTER-LIVE   (against node A)"
"$bin/dredge" tail --uid u-1001 --level error+ --for 2m --reason CLUSTER-LIVE --color never > "$out/engineer/tail.txt" 2> "$out/engineer/tail.err" &
tail_pid=$!
pids+=($tail_pid)
for _ in $(seq 300); do [ "$(grep -c ': running' "$out/engineer/tail.err")" -ge 3 ] && break; sleep 0.1; done
[ "$(grep -c ': running' "$out/engineer/tail.err")" -ge 3 ] || { echo "FAILED: the devices on node C did not start node A's tail"; cat "$out/engineer/tail.err"; exit 1; }
for device in kitchen pantry bakery; do
    "$bin/dredge-agent" log --store "$out/$device/logs.sqlite" --uid u-1001 --level error --app "$device-oven" "$device: thermostat failed (seen live on node A)"
done
for _ in $(seq 300); do [ "$(wc -l < "$out/engineer/tail.txt")" -ge 3 ] && break; sleep 0.1; done
kill -INT $tail_pid
for _ in $(seq 100); do kill -0 $tail_pid 2>/dev/null || break; sleep 0.1; done
sed 's/^/   /' "$out/engineer/tail.err" "$out/engineer/tail.txt"
for device in kitchen pantry bakery; do
    grep -q "$device: thermostat failed" "$out/engineer/tail.txt" || { echo "FAILED: node A's tail did not show $device's record from node C"; exit 1; }
done
[ "$(wc -l < "$out/engineer/tail.txt")" = 3 ] || { echo "FAILED: the tail showed more than the three records"; exit 1; }
grep -q "ended: the engineer pressed Ctrl-C" "$out/engineer/tail.err" || { echo "FAILED: the tail did not end on Ctrl-C"; exit 1; }
grep -q "agent connected" "$out/node-A.log" && { echo "FAILED: a device moved to node A during the tail"; exit 1; }
echo "OK: a pull issued on node A reached devices on B and C, survived B's death mid-upload, and arrived verified; a tail on node A showed live what the devices on node C logged"
