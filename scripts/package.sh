#!/usr/bin/env bash
# `make package`: one tarball that installs Dredge on a Linux host with nothing else (#56).
#
#   dredge-VERSION-linux-ARCH/
#     bin/dredge, bin/dredge-server, bin/dredge-agent
#     share/man/man1/*.1            one page per command and subcommand, from their --help
#                                   (`man dredge-server.backup`), made by
#                                   swift-argument-parser's generate-manual
#     share/doc/dredge/             README.md, docs/*.md, the dashboard and alert rules
#     lib/systemd/system/           dredge-server.service, dredge-agent.service
#     lib/sysusers.d/dredge.conf    the dredge user the units run as
#
# Unpacked into /usr/local (`tar -xzf … -C /usr/local --strip-components=1`), everything is
# where the units and `man` look: docs/deployment.md § Install from the package.
#
#   scripts/package.sh [--bin-path DIR] [--out DIR]
#
# By default the binaries are built in release with the Swift runtime linked in
# (--static-swift-stdlib), and checked to need no Swift library. --bin-path packages binaries
# built already (the tests package the debug build: same layout, not for another host).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
SWIFT=${SWIFT:-swift}
bin=""
out="$root/dist"
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-path) bin=$(cd "$2" && pwd); shift 2 ;;
        --out) mkdir -p "$2"; out=$(cd "$2" && pwd); shift 2 ;;
        *) echo "usage: scripts/package.sh [--bin-path DIR] [--out DIR]" >&2; exit 2 ;;
    esac
done
programs=(dredge dredge-server dredge-agent)
version=$(sed -n 's/.*static let current = "\(.*\)".*/\1/p' Sources/DredgeDomain/Version.swift)
[ -n "$version" ] || { echo "error: no version in Sources/DredgeDomain/Version.swift" >&2; exit 1; }
arch=$(uname -m)
name="dredge-$version-linux-$arch"

if [ -z "$bin" ]; then
    for p in "${programs[@]}"; do
        "$SWIFT" build -c release --static-swift-stdlib --product "$p"
    done
    bin=$("$SWIFT" build -c release --static-swift-stdlib --show-bin-path)
    static=1
else
    static=0
fi
for p in "${programs[@]}"; do
    test -x "$bin/$p" || { echo "error: $bin/$p is not built" >&2; exit 1; }
done
if [ "$static" = 1 ]; then
    # A host without Swift runs them: no Swift runtime or Foundation library may be needed.
    for p in "${programs[@]}"; do
        libraries=$(ldd "$bin/$p") || { echo "error: ldd cannot read $bin/$p" >&2; exit 1; }
        if grep -E 'libswift|libFoundation|libdispatch|libBlocksRuntime' <<< "$libraries"; then
            echo "error: $p needs the Swift runtime (above); it must be linked in" >&2
            exit 1
        fi
    done
fi

# swift-argument-parser's manual generator, built once from the checkout SwiftPM resolved.
"$SWIFT" package resolve >/dev/null
parser="$root/.build/checkouts/swift-argument-parser"
test -d "$parser/Tools/generate-manual" || { echo "error: no swift-argument-parser checkout with generate-manual in $parser" >&2; exit 1; }
"$SWIFT" build --package-path "$parser" --scratch-path "$root/.build/tools/argument-parser" --product generate-manual >/dev/null
generate="$("$SWIFT" build --package-path "$parser" --scratch-path "$root/.build/tools/argument-parser" --show-bin-path)/generate-manual"

# The same bytes for the same inputs: names sorted, owners and times fixed (the last commit's).
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage="$work/$name"
mkdir -p "$stage/bin" "$stage/share/man/man1" "$stage/share/doc/dredge/monitoring" "$stage/lib/systemd/system" "$stage/lib/sysusers.d"
for p in "${programs[@]}"; do
    install -m 0755 "$bin/$p" "$stage/bin/$p"
    "$generate" "$bin/$p" --multi-page --date "$(date -u -d "@$epoch" +%F)" --output-directory "$stage/share/man/man1" >/dev/null
done
chmod 0644 "$stage"/share/man/man1/*
install -m 0644 README.md "$stage/share/doc/dredge/README.md"
install -m 0644 docs/*.md "$stage/share/doc/dredge/"
install -m 0644 docs/monitoring/* "$stage/share/doc/dredge/monitoring/"
install -m 0644 docs/systemd/dredge-server.service docs/systemd/dredge-agent.service "$stage/lib/systemd/system/"
install -m 0644 docs/systemd/dredge.sysusers.conf "$stage/lib/sysusers.d/dredge.conf"

# Directories 0755 whatever the packager's umask: unpacked over /usr/local, tar gives existing
# directories the modes in the archive.
find "$stage" -type d -exec chmod 0755 {} +
mkdir -p "$out"
tarball="$out/$name.tar.gz"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$work" -cf - "$name" | gzip -n > "$tarball.part"
mv "$tarball.part" "$tarball"
(cd "$out" && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")
echo "packaged $tarball ($(du -h "$tarball" | cut -f1), $(tar -tzf "$tarball" | grep -c '\.1$') man pages)"
