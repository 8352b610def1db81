# The two commands a newcomer runs (see README.md):
#   make demo   the main job
#   make test   the whole test suite
#   make demo-cluster   three nodes on one PostgreSQL; one killed mid-upload
.PHONY: demo demo-local demo-cluster test bench package deps clean

SWIFT ?= swift
# The suites of real server and agent processes (on SQLite and, under scripts/postgres.sh, on
# PostgreSQL; the network logging one on SQLite only: it tests the app's side).
E2E = EndToEndTests|FaultyNetworkTests|NetworkPullTests

deps:
	@scripts/install-deps.sh

demo: deps
	scripts/demo.sh

# Three server nodes on one PostgreSQL and one shared directory; node B killed mid-upload.
demo-cluster: deps
	scripts/demo-cluster.sh

# The client store on its own (no server): realistic logs and a filtered query.
demo-local: deps
	$(SWIFT) build -c release --product dredge-demo
	.build/release/dredge-demo local --dir demo-output

test: deps
	scripts/check-imports.py
	$(SWIFT) build --build-tests
	# Every command and --flag the README and docs/ show exists in the built binaries' --help.
	python3 scripts/check-doc-flags.py "$$($(SWIFT) build --show-bin-path)"
	# Both back ends: SQLite, and PostgreSQL in a private cluster on loopback for the run. The
	# suites of real server and agent processes run after the others, on their own and one
	# test at a time: a test waiting on its child processes holds one of the test process's
	# threads (two on two cores), and tests side by side could starve each other's in-process
	# clients past the server's 10 s handshake deadline (seen: "enrollment failed: I/O on
	# closed channel" on both back ends at once).
	scripts/postgres.sh run sh -c '$(SWIFT) test --skip-build --skip "$(E2E)" && $(SWIFT) test --skip-build --no-parallel --filter "$(E2E)"'
	python3 scripts/fresh-app.py
	python3 Tests/conformance/conformance.py "$$($(SWIFT) build --show-bin-path)/dredge-server"
	# Polite uploads over a device link the kernel shapes (network namespace, tc): metered waits,
	# the rate within 10 % of the cap, resumed whole. Needs root, as make test runs.
	python3 Tests/polite/shaped_link.py "$$($(SWIFT) build --show-bin-path)"
	# make package's tarball installed into a temporary root and run; its systemd units
	# verified and hardened (systemd-analyze security), its man pages rendered.
	python3 Tests/package/check.py "$$($(SWIFT) build --show-bin-path)"
	# The dashboard and alert rules in docs/monitoring/ against a real Prometheus scraping a real server.
	python3 Tests/monitoring/check.py "$$($(SWIFT) build --show-bin-path)"
	python3 Tests/browser/console.py "$$($(SWIFT) build --show-bin-path)" test-output/console
	scripts/fuzz.sh 20
	# The cluster demo on the test build: three nodes on one PostgreSQL, one killed mid-upload.
	SWIFT=$(SWIFT) DEMO_CONFIG=debug DEMO_DIR=test-output/demo-cluster scripts/demo-cluster.sh

# A tarball that installs Dredge on a host without Swift: dist/dredge-VERSION-linux-ARCH.tar.gz
# (release binaries with the Swift runtime linked in, man pages, systemd units, docs), then
# checked as installed.
package: deps
	SWIFT=$(SWIFT) scripts/package.sh
	# The tarball itself, installed into a temporary root and run with the Swift toolchain hidden.
	python3 Tests/package/check.py --tarball "dist/dredge-$$(sed -n 's/.*static let current = "\(.*\)".*/\1/p' Sources/DredgeDomain/Version.swift)-linux-$$(uname -m).tar.gz"

bench: deps
	$(SWIFT) build -c release --product dredge-bench
	$(SWIFT) build -c release --product dredge-server
	$(SWIFT) build -c release --product dredge-agent
	$(SWIFT) build -c release --product dredge
	.build/release/dredge-bench store
	.build/release/dredge-bench export
	.build/release/dredge-bench search
	.build/release/dredge-bench json
	.build/release/dredge-bench server
	.build/release/dredge-bench heartbeat
	.build/release/dredge-bench slowloris
	.build/release/dredge-bench unauthenticated
	.build/release/dredge-bench network
	.build/release/dredge-bench tail
	.build/release/dredge-bench trigger
	.build/release/dredge-bench politeness
	# On PostgreSQL, in a private cluster on loopback: the server's figures, presence writes, a 3-node cluster.
	scripts/postgres.sh run sh -c '.build/release/dredge-bench server --database "$$DREDGE_TEST_POSTGRES" --agents 3000 && .build/release/dredge-bench presence && .build/release/dredge-bench cluster'

clean:
	rm -rf .build .build-fuzz demo-output demo-cluster-output test-output dist
