import ArgumentParser
import DredgeEnvelope
import DredgeServer
import DredgeWire
import Foundation
import Synchronization

/// `dredge-bench presence`: `cluster.presence_writes`, what an idle fleet's heartbeats cost
/// PostgreSQL: rows written a second per 10,000 agents heartbeating every 30 seconds. The real
/// ``PostgresAgentDirectory`` and ``NodeLease`` write to a real database; the fleet's time is
/// simulated (an hour of it, on an injected clock), since the write pattern plays out over
/// the 20-minute refresh. The limit is the same fleet and directory writing every held
/// heartbeat at each flush (no refresh: the embedded registry's pattern), measured in the same
/// run: the ratio is how many times fewer rows the cluster writes.
struct PresenceBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "presence", abstract: "PostgreSQL writes a second for an idle fleet's presence.")

    @OptionGroup var postgres: BenchDatabase

    @Option(help: "Idle agents.")
    var agents = 10_000

    @Option(help: "Minutes of the fleet's time simulated.")
    var minutes = 60

    @Option(help: "Where the fleet's keys are cached (made by scripts/bench-fleet-keys.py).")
    var keyCache = ".build/bench-fleet-keys"

    /// A clock the benchmark moves.
    final class VirtualClock: Sendable {
        private let now = Mutex(ContinuousClock.now)
        func advance(_ d: Duration) { now.withLock { $0 += d } }
        var read: @Sendable () -> ContinuousClock.Instant { { self.now.withLock { $0 } } }
    }

    struct Run {
        var rowsPerSecond: Double
        var commitsPerSecond: Double
        var walBytesPerSecond: Double
    }

    func run() async throws {
        let url = try postgres.url()
        let keys = try FleetChild.loadKeys(try ServerBench.fleetKeys(cache: keyCache, count: agents), from: 0, count: agents).map(\.publicKey)
        let leased = try await measure(url: url, keys: keys, refresh: .seconds(1200), minutes: minutes, name: "leased")
        // Without a refresh every held heartbeat is written at each flush: a few minutes show its rate.
        let naive = try await measure(url: url, keys: keys, refresh: .zero, minutes: min(minutes, 5), name: "naive")
        let per = 10_000 / Double(agents)
        print(
            Figure(
                name: "cluster.presence_writes", value: leased.rowsPerSecond * per, unit: "rows/s", limit: naive.rowsPerSecond * per, higherIsBetter: false,
                extra: String(
                    format: "per_10k_agents heartbeat=30s refresh=1200s commits_per_s=%.2f wal_kb_per_s=%.1f naive_commits_per_s=%.2f agents=%d minutes=%d goal<=10",
                    leased.commitsPerSecond, leased.walBytesPerSecond * per / 1024, naive.commitsPerSecond, agents, minutes)
            ).line)
    }

    /// Connects the fleet through one node, then plays ten minutes and then `minutes` of
    /// heartbeats (every agent every 30 s, spread evenly) and the node's lease renewals, and
    /// reads what PostgreSQL counted over the `minutes`.
    func measure(url: String, keys: [RSAPublicKey], refresh: Duration, minutes: Int, name: String) async throws -> Run {
        let schema = "bench_presence_\(name)_\(ProcessInfo.processInfo.processIdentifier)"
        let db = try await PostgresDatabase(try PostgresDatabase.Location(url: url + (url.contains("?") ? "&" : "?") + "schema=" + schema))
        defer { db.close() }
        let clock = VirtualClock()
        let lease = NodeLease(db, name: "bench")
        let directory = PostgresAgentDirectory(db, node: lease, heartbeatFlush: .seconds(1), presenceRefresh: refresh, clock: clock.read)
        try await directory.resetPresence()
        let host = WireHostInfo.with { $0.hostname = "bench"; $0.os = "Linux"; $0.app = "bench"; $0.appVersion = "1" }
        let beat = WireHeartbeat.with { $0.activeUids = ["u-1"]; $0.stats.records = 1000 }
        let start = Date()
        var ids: [String] = []
        // Enrolled and connected, their first heartbeats written in full: the fleet at rest.
        try await withThrowingTaskGroup(of: String.self) { group in
            for (n, key) in keys.enumerated() {
                if n >= 16 { ids.append(try await group.next()!) }
                group.addTask {
                    let id = try await directory.enroll(publicKey: key, host: host, now: start)
                    try await directory.connected(id, from: "10.0.0.1:1", host: host, now: start)
                    try await directory.heartbeat(id, beat, now: start)
                    return id
                }
            }
            for try await id in group { ids.append(id) }
        }
        FileHandle.standardError.write(Data("presence (\(name)): \(ids.count) agents connected; \(minutes) minutes of heartbeats\n".utf8))
        let spacing = Duration.seconds(30) / ids.count
        var elapsed = Duration.zero, sinceRenewal = Duration.zero
        func play(minutes: Int) async throws {
            for _ in 0..<(minutes * 2) {
                for id in ids {
                    clock.advance(spacing)
                    elapsed += spacing
                    sinceRenewal += spacing
                    try await directory.heartbeat(id, beat, now: start + Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
                    if sinceRenewal >= lease.renewEvery {
                        sinceRenewal = .zero
                        try await lease.renew()
                    }
                }
            }
        }
        // Ten minutes first, so that the window does not begin with every row just written.
        try await play(minutes: 10)
        try await settle()
        let before = try await db.writeCounters()
        try await play(minutes: minutes)
        try await settle()
        let after = try await db.writeCounters()
        let seconds = Double(minutes * 60)
        // The counters' own read is one commit.
        return Run(
            rowsPerSecond: Double(after.rows - before.rows) / seconds, commitsPerSecond: Double(after.commits - before.commits - 1) / seconds,
            walBytesPerSecond: Double(after.walBytes - before.walBytes) / seconds)
    }

    /// PostgreSQL publishes a connection's counters once it has been idle a while (at most ten seconds).
    func settle() async throws { try await Task.sleep(for: .seconds(11)) }
}

/// The PostgreSQL database a benchmark runs on: `--database`, else `$DREDGE_TEST_POSTGRES`
/// (what `scripts/postgres.sh run` sets).
struct BenchDatabase: ParsableArguments {
    @Option(help: "The PostgreSQL database (default: $DREDGE_TEST_POSTGRES; `scripts/postgres.sh run` sets it).")
    var database: String?

    func url() throws -> String {
        guard let url = database ?? ProcessInfo.processInfo.environment["DREDGE_TEST_POSTGRES"], !url.isEmpty else {
            throw ValidationError("give --database or set DREDGE_TEST_POSTGRES (make bench starts a private PostgreSQL)")
        }
        return url
    }
}
