#!/usr/bin/env bash
# The systemd units in docs/systemd/ (#56): `systemd-analyze verify` clean, and hardened: an
# exposure of at most 2.0 of 10 by `systemd-analyze security` ("OK"; each unit is 1.4 to 1.6
# today). verify checks that each ExecStart runs: the units name /usr/local/bin, so the
# checked copies name the binaries in BIN_DIR instead. UNIT_DIR and SYSUSERS (docs/systemd/
# and its dredge.sysusers.conf by default) are where the units and the users' file are: the
# package test (Tests/package/check.py) checks the ones it installed.
#   Tests/service/check-units.sh BIN_DIR [UNIT_DIR SYSUSERS]
set -euo pipefail
bin=${1:?usage: check-units.sh BIN_DIR [UNIT_DIR SYSUSERS]}
root=$(cd "$(dirname "$0")/../.." && pwd)
units=${2:-$root/docs/systemd}
sysusers=${3:-$root/docs/systemd/dredge.sysusers.conf}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for unit in dredge-server dredge-agent; do
    test -x "$bin/$unit" || { echo "error: $bin/$unit is not built" >&2; exit 1; }
    sed "s#/usr/local/bin/$unit#$bin/$unit#" "$units/$unit.service" > "$work/$unit.service"
    grep -q "^ExecStart=$bin/$unit " "$work/$unit.service" || { echo "error: $unit.service does not start /usr/local/bin/$unit" >&2; exit 1; }
done
(cd "$work" && systemd-analyze verify ./dredge-server.service ./dredge-agent.service)
for unit in dredge-server dredge-agent; do
    (cd "$work" && systemd-analyze security --offline=yes --threshold=20 "./$unit.service" | tail -1)
done
# The users the units run as, in the form systemd-sysusers reads.
# (--dry-run: nothing is written.)
out=$(systemd-sysusers --dry-run "$sysusers" 2>&1) || { echo "$out" >&2; exit 1; }
echo "units: verified, exposure OK"
