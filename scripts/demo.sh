#!/usr/bin/env bash
# The main job, on one machine: a server, two agents with realistic logs for several users over
# several days, a filtered pull, and the decrypted per-day files on disk — checked against what
# the agents' stores select. Exits non-zero if anything differs; stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${DEMO_CONFIG:-release}   # DEMO_CONFIG=debug reuses the test build
for product in dredge-server dredge-agent dredge-demo dredge; do swift build -c "$config" --product "$product" >&2; done
bin=.build/$config
out=${DEMO_DIR:-demo-output}
rm -rf "$out" && mkdir -p "$out"
out=$(cd "$out" && pwd)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

echo "== 1. A server deployment in $out/server"
"$bin/dredge-server" init --data "$out/server" > "$out/init.txt"
sed -n '1,7p' "$out/init.txt"
token=$(awk '/enrollment token/ {print $3}' "$out/init.txt")
fingerprint=$(awk '/CA fingerprint/ {print $3}' "$out/init.txt")
admin_token=$(awk '/Admin token/ {getline; print $1}' "$out/init.txt")
"$bin/dredge-server" run --data "$out/server" --agent-port 0 --admin-port 0 --heartbeat-seconds 2 2> "$out/server.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "admin API ready" "$out/server.log" && grep -q "agent listener ready" "$out/server.log" && break; sleep 0.1; done
port=$(grep 'agent listener ready' "$out/server.log" | grep -o 'address=127.0.0.1:[0-9]*' | head -1 | cut -d: -f2)
admin=$(grep 'admin API ready' "$out/server.log" | grep -o 'url=https://[0-9.]*:[0-9]*' | head -1 | cut -d= -f2)
[ -n "$port" ] && [ -n "$admin" ] || { echo "server did not start:"; cat "$out/server.log"; exit 1; }
echo "   agents connect to localhost:$port; the admin API is $admin (HTTPS, TLS 1.3)"
# The engineer's side keeps its profile here, not in your ~/.config.
export XDG_CONFIG_HOME="$out/engineer/config"
unset DREDGE_SERVER DREDGE_TOKEN DREDGE_CA DREDGE_PROFILE
echo "   \$ dredge login --server $admin --fingerprint ${fingerprint:0:20}… --token dredge_adm_…   (the line init printed)"
"$bin/dredge" login --server "$admin" --fingerprint "$fingerprint" --token "$admin_token" | sed 's/^/   /'

echo "== 2. Two devices with three days of logs"
"$bin/dredge-demo" generate --store "$out/kitchen/logs.sqlite" --uids u-1001,u-1002,u-1003 --records 60000 --seed 1 --host kitchen-oven-0042
"$bin/dredge-demo" generate --store "$out/bakery/logs.sqlite" --uids u-1002,u-1004 --records 40000 --seed 2 --host bakery-oven-0007
for device in kitchen bakery; do
    "$bin/dredge-agent" enroll --state "$out/$device/agent" --server "localhost:$port" --ca "$out/server/ca.pem" --token "$token" --app "$device-oven"
    "$bin/dredge-agent" run --state "$out/$device/agent" --store "$out/$device/logs.sqlite" --app "$device-oven" 2> "$out/$device/agent.log" &
    pids+=($!)
done
for _ in $(seq 150); do
    [ "$("$bin/dredge" agents | grep -c ' online .*u-1002')" = 2 ] && break
    sleep 0.2
done
"$bin/dredge" agents --uid u-1002   # the devices that hold the user, and when each last saw them

echo "== 3. An engineer pulls user u-1002's warnings and errors of the last two days, and downloads them"
echo "   \$ dredge pull --uid u-1002 --since 2d --level warning+ --wait --out $out/engineer/pulls"
"$bin/dredge" pull --uid u-1002 --since 2d --level warning+ --wait --timeout 300 --out "$out/engineer/pulls" | sed "s|$out/||" \
    || { echo "the pull did not complete"; exit 1; }
pull=$("$bin/dredge" pulls --json | python3 -c "import json,sys;print(json.load(sys.stdin)[0]['id'])")

echo "== 4. The decrypted per-day files, downloaded over HTTPS (each checked against its SHA-256)"
ok=1
for device in kitchen bakery; do
    agent=$(python3 -c "import json;print(json.load(open('$out/$device/agent/agent.json'))['agentID'])")
    dir=$(ls -d "$out/engineer/pulls/$pull/"*"$agent")   # HOST_AGENT
    echo "   $device ($agent):"
    for f in "$dir"/*.jsonl; do echo "     $f  ($(wc -l < "$f") records)"; done
    "$bin/dredge-demo" verify --store "$out/$device/logs.sqlite" --dir "$dir" | sed 's/^/     /' || ok=0
done
[ $ok = 1 ] || { echo "FAILED: what arrived is not what the filter selects"; exit 1; }
cmp -s <(cat "$out/server/pulls/$pull"/*/*.jsonl | sort) <(cat "$out/engineer/pulls/$pull"/*/*.jsonl | sort) || { echo "FAILED: the downloaded files differ from the server's"; exit 1; }
echo "   the pull arrived, decrypted and verified, in $out/engineer/pulls/$pull"
echo "== 5. The engineer reads it: one timeline across both devices, searched on the server"
expected=$(cat "$out/server/pulls/$pull"/*/*.jsonl | wc -l)
indexed=0
for _ in $(seq 300); do
    indexed=$("$bin/dredge" logs --pull "$pull" --limit 0 --format jsonl 2>/dev/null | wc -l)
    [ "$indexed" = "$expected" ] && break
    sleep 0.2
done
[ "$indexed" = "$expected" ] || { echo "FAILED: $indexed of the pull's $expected records are searchable"; exit 1; }
echo "   \$ dredge logs --uid u-1002 --since 2d --level error --limit 6"
"$bin/dredge" logs --uid u-1002 --since 2d --level error --limit 6 2>/dev/null
echo "   \$ dredge logs --pull $pull --words 'payment declined' --where event=checkout.failed --limit 3"
"$bin/dredge" logs --pull "$pull" --words 'payment declined' --where event=checkout.failed --limit 3 2>/dev/null
found=$("$bin/dredge" logs --pull "$pull" --where http.status=503 --format jsonl --limit 0 | python3 -c "
import json,sys
rows=[json.loads(l) for l in sys.stdin]
assert all(r['metadata'].get('http.status')==503 for r in rows), 'a record without http.status=503'
print(len(rows))")
echo "   \$ dredge logs --pull $pull --where http.status=503: $found records, each with http.status 503"

echo "== 6. The user is on the phone now: the engineer watches their devices live"
echo "   \$ dredge tail --uid u-1002 --level warning+ --for 2m --reason CALL-42"
"$bin/dredge" tail --uid u-1002 --level warning+ --for 2m --reason CALL-42 --color never > "$out/engineer/tail.txt" 2> "$out/engineer/tail.err" &
tail_pid=$!
pids+=($tail_pid)
for _ in $(seq 300); do [ "$(grep -c ': running' "$out/engineer/tail.err")" = 2 ] && break; sleep 0.1; done
[ "$(grep -c ': running' "$out/engineer/tail.err")" = 2 ] || { echo "FAILED: the devices did not start the tail"; cat "$out/engineer/tail.err"; exit 1; }
"$bin/dredge-agent" log --store "$out/kitchen/logs.sqlite" --uid u-1002 --level error --type business --app kitchen-oven "payment declined: card expired (user on the phone)"
"$bin/dredge-agent" log --store "$out/bakery/logs.sqlite" --uid u-1002 --level info --app bakery-oven "screen opened (below the tail's level: not shown)"
"$bin/dredge-agent" log --store "$out/bakery/logs.sqlite" --uid u-1002 --level warning --type network --app bakery-oven "GET /cart -> 503 in 2.1 s"
for _ in $(seq 300); do [ "$(wc -l < "$out/engineer/tail.txt")" -ge 2 ] && break; sleep 0.1; done
kill -INT $tail_pid   # Ctrl-C: the tail is stopped on the server, and the command says so
for _ in $(seq 100); do kill -0 $tail_pid 2>/dev/null || break; sleep 0.1; done
sed 's/^/   /' "$out/engineer/tail.err" "$out/engineer/tail.txt"
grep -q "payment declined: card expired" "$out/engineer/tail.txt" && grep -q "GET /cart -> 503" "$out/engineer/tail.txt" \
    && ! grep -q "below the tail's level" "$out/engineer/tail.txt" && [ "$(wc -l < "$out/engineer/tail.txt")" = 2 ] \
    || { echo "FAILED: the live tail did not show exactly the two records"; exit 1; }
grep -q "ended: the engineer pressed Ctrl-C" "$out/engineer/tail.err" || { echo "FAILED: the tail did not end on Ctrl-C"; exit 1; }
echo "   \$ dredge audit --action tail.stop --limit 1"
"$bin/dredge" audit --action tail.stop --limit 1 | sed 's/^/   /'
tail_id=$(grep -o 'tail [0-9a-f]\{32\}' "$out/engineer/tail.err" | head -1 | cut -d' ' -f2)
echo "   \$ dredge fetch ${tail_id:0:8} --out engineer/tails     # what the tail showed, kept on the server"
"$bin/dredge" fetch "$tail_id" --out "$out/engineer/tails" | sed "s|$out/||; s/^/   /"
[ "$(cat "$out/engineer/tails/$tail_id"/*/records.jsonl | wc -l)" = 2 ] || { echo "FAILED: the tail's download does not hold its two records"; exit 1; }
echo "OK: the pull arrived, decrypted, verified and searchable ($indexed records indexed); the live tail showed the call's records as they were logged"
