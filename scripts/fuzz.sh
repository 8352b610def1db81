#!/usr/bin/env bash
# Builds the frame-decoder fuzz target with libFuzzer (and AddressSanitizer) in its own build
# folder and runs it from the seed corpus for SECONDS (default 20). New inputs libFuzzer finds
# go to a scratch corpus, not into the repository; a crash leaves its input in .build-fuzz/
# and fails the run. Usage: scripts/fuzz.sh [SECONDS] [extra libFuzzer flags…]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
swift build -c release --scratch-path .build-fuzz --product dredge-fuzz-frames \
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING -Xswiftc -parse-as-library >&2
work=.build-fuzz/corpus
mkdir -p "$work" .build-fuzz/artifacts
.build-fuzz/release/dredge-fuzz-frames "$work" Tests/Fuzz/corpus/frames \
    -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix=.build-fuzz/artifacts/ -print_final_stats=1 "$@"
