#!/usr/bin/env bash
# Regenerates Sources/DredgeWire/Generated from Protocol/*.proto. The output is committed; CI
# never runs this. Needs protoc (apt-get install protobuf-compiler) and builds protoc-gen-swift
# from the swift-protobuf version the package resolved.
set -euo pipefail
cd "$(dirname "$0")/.."
swift package resolve
checkout=.build/checkouts/swift-protobuf
swift build -c release --package-path "$checkout" --product protoc-gen-swift
protoc --plugin=protoc-gen-swift="$checkout/.build/release/protoc-gen-swift" \
    --swift_out=Sources/DredgeWire/Generated --swift_opt=Visibility=Public \
    --proto_path=Protocol Protocol/*.proto
