import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeDomain
import DredgeLogging
import DredgeServer
import Foundation

/// `dredge-bench trigger`: a standing trigger (#54) end to end, with real processes on loopback:
/// a `dredge-server`, a `dredge-agent` on a device store, and this process as both the app
/// (logging into the store through ``LogCenter``) and the engineer (searching through the admin
/// API), so both ends are timed on one clock.
///
/// - `trigger.to_searchable`: from the app's log call that fires the trigger to that record
///   searchable on the server as a capture's (p50, p99 beside it), against the same window
///   pulled by hand in the same run: from making the pull to the same record searchable as the
///   pull's. Goal: p50 ratio ≤ 1.
struct TriggerBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "trigger", abstract: "trigger.to_searchable: a trigger's capture through real processes on loopback, against a pull of the same window.")

    @Option(help: "Firings (and pulls) timed.")
    var rounds = 6

    @Option(help: "Records the app logs before each firing (the window's).")
    var records = 2_000

    static let uid = "u-bench"

    func run() async throws {
        let device = try await LoopbackDevice(name: "trigger", uid: Self.uid)
        defer { device.stop() }
        let (dir, center, logger, admin) = (device.dir, device.center, device.logger, device.admin)
        // A window of 10 s before the match and none after: what a crash-like error needs.
        let trigger = try await admin.createTrigger(
            TriggerRequest(name: "bench", match: TriggerMatch(levels: ["error"], text: "benchfire"), beforeSeconds: 10, afterSeconds: 0, perDevicePerDay: 100, perDay: 1_000))
        var held = false
        for _ in 0..<600 where !held {
            held = try await admin.triggerActivity(trigger.id, limit: 1).holders == 1
            if !held { try await Task.sleep(for: .milliseconds(100)) }
        }
        guard held else { throw ValidationError("the agent never held the trigger; see \(dir)/agent.log") }

        var captured: [Double] = [], pulled: [Double] = []
        for round in 0..<rounds {
            // Past the last window: each firing makes a capture of its own.
            try await Task.sleep(for: .seconds(1))
            for i in 0..<records { logger.info("window \(round) record \(i)") }
            let word = "benchfire\(round)x"
            let fired = Timestamp.now
            let start = monotonicNanos()
            logger.error("payment declined \(word) benchfire")
            try await center.flush()
            captured.append(try await searchable(admin, word: word, source: "capture", since: start))
            // The same window pulled by hand, timed from making the pull.
            let pullStart = monotonicNanos()
            let pull = try await admin.createPull(
                PullRequest(uid: Self.uid, agent: nil, filter: LogFilter(since: fired.subtracting(.seconds(10)), until: fired.adding(.microseconds(1_000_001)))))
            pulled.append(try await searchable(admin, word: word, source: "pull", pull: pull.id, since: pullStart))
            note(String(format: "round %d: searchable as a capture after %.0f ms, as a pull after %.0f ms", round, captured.last ?? .nan, pulled.last ?? .nan))
        }
        let ratio = median(captured) / median(pulled)
        print(Figure(
            name: "trigger.to_searchable", value: median(captured), unit: "ms", limit: median(pulled), higherIsBetter: false,
            extra: String(
                format: "capture_p50=%.0f ms capture_p99=%.0f ms pull_p50=%.0f ms pull_p99=%.0f ms capture/pull=%.2f (goal <= 1) rounds=%d window_records=%d",
                median(captured), percentile(captured, 0.99), median(pulled), percentile(pulled, 0.99), ratio, rounds, records)).line)
    }

    /// Milliseconds from `since` (monotonic ns) until the record with `word` is searchable from
    /// a source of `source` kind (with `pull`: that pull's).
    func searchable(_ admin: AdminClient, word: String, source: String, pull: String? = nil, since: Int64) async throws -> Double {
        while monotonicNanos() - since < 300_000_000_000 {
            let page = try await admin.search(RecordSearch(uid: Self.uid, pull: pull, text: word, limit: 10))
            if page.records.contains(where: { $0.sourceKind == source }) { return Double(monotonicNanos() - since) / 1e6 }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw ValidationError("the record \(word) was not searchable as a \(source)'s within 5 minutes")
    }

    func percentile(_ values: [Double], _ p: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        let sorted = values.sorted()
        return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
    }
}
