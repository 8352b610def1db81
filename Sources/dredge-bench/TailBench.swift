import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeDomain
import DredgeLogging
import DredgeServer
import Foundation
import Synchronization

/// `dredge-bench tail`: a live tail (#53) end to end, with real processes on loopback: a
/// `dredge-server`, a `dredge-agent` on a device store, and this process as both the app
/// (logging into the store through ``LogCenter``) and the engineer (watching the tail through
/// the admin API), so both ends are timed on one clock.
///
/// - `tail.latency`: from the app's log call to the record in the engineer's stream, p99 (p50
///   beside it), the app logging `--rate` records a second; limit: the same records' time from
///   the log call to durable in the device's store (`flush()` returning), p99, same rounds.
///   Goal: p99 ≤ 3 × the limit's p99 plus one loopback round trip (the admin API's `/health`).
/// - `tail.log_call_overhead`: the log call's median with a tail open ÷ without, rounds
///   alternating. Goal ≤ 1.1.
/// - `tail.capacity`: records a second the server forwards from the device to the watcher with
///   the device paced under the tail's highest rate, against the same records uploaded by a
///   pull through the same server; beside it, the server's CPU time per record on each path
///   (user + system, from `/proc`).
struct TailBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tail", abstract: "tail.latency, tail.log_call_overhead, tail.capacity: a live tail through real processes on loopback.")

    @Option(help: "Records a second the app logs in the latency rounds.")
    var rate = 200

    @Option(help: "Seconds each round logs.")
    var seconds = 8

    @Option(help: "Rounds of each kind (with a tail, without), alternating.")
    var rounds = 2

    @Option(help: "Records of the capacity run.")
    var burst = 40_000

    static let uid = "u-bench"

    func run() async throws {
        let device = try await LoopbackDevice(name: "tail", uid: Self.uid)
        defer { device.stop() }
        let (server, center, logger, admin) = (device.server, device.center, device.logger, device.admin)

        // One loopback round trip: the admin API's /health, median of 50.
        var trips: [Double] = []
        for _ in 0..<50 {
            let start = monotonicNanos()
            try await admin.health()
            trips.append(Double(monotonicNanos() - start) / 1e6)
        }
        let rtt = median(trips)

        var callsWith: [Double] = [], callsWithout: [Double] = [], durable: [Double] = [], seen: [Double] = []
        for round in 0..<rounds {
            let plain = try await pace(logger, center, tag: "plain-\(round)", watcher: nil)
            callsWithout.append(median(plain.calls))
            let watcher = try await Watcher.start(admin, request: TailRequest(uid: Self.uid, durationSeconds: 600, recordsPerSecond: 10_000))
            let tailed = try await pace(logger, center, tag: "tailed-\(round)", watcher: watcher)
            try await watcher.stop(admin)
            callsWith.append(median(tailed.calls))
            durable += tailed.durable
            seen += tailed.seen
            note(String(format: "round %d: log call %.0f ns without a tail, %.0f ns with; durable p50 %.2f ms; in the stream p50 %.1f ms (%d of %d)", round,
                        median(plain.calls), median(tailed.calls), percentile(tailed.durable, 0.5), percentile(tailed.seen, 0.5), tailed.seen.count, tailed.durable.count))
        }
        let limitP99 = percentile(durable, 0.99)
        print(Figure(
            name: "tail.latency", value: percentile(seen, 0.99), unit: "ms", limit: limitP99, higherIsBetter: false,
            extra: String(
                format: "p50=%.1f ms p99=%.1f ms durable_p50=%.2f ms durable_p99=%.2f ms rtt=%.2f ms goal_p99<=%.1f ms records=%d rate=%d/s", percentile(seen, 0.5),
                percentile(seen, 0.99), percentile(durable, 0.5), limitP99, rtt, 3 * limitP99 + rtt, seen.count, rate)).line)
        let overhead = median(callsWith) / median(callsWithout)
        print(Figure(
            name: "tail.log_call_overhead", value: median(callsWith), unit: "ns", limit: median(callsWithout), higherIsBetter: false,
            extra: String(format: "with/without=%.2f (goal <= 1.1) rounds=%d", overhead, rounds)).line)

        // Capacity: the device paced under the tail's highest rate, then the same records pulled.
        let watcher = try await Watcher.start(admin, request: TailRequest(uid: Self.uid, durationSeconds: 600, recordsPerSecond: 10_000, bytesPerSecond: 16 << 20))
        let cpuBefore = try cpuSeconds(server.process.processIdentifier)
        let threadsBefore = threadSeconds(server.process.processIdentifier)
        let since = Timestamp.now
        let start = monotonicNanos()
        let perMillisecond = 9  // 9,000 a second: under the tail's 10,000
        for i in 0..<burst {
            if i % perMillisecond == 0 {
                let due = start + Int64(i / perMillisecond) * 1_000_000
                let wait = due - monotonicNanos()
                if wait > 0 { try await Task.sleep(for: .nanoseconds(wait)) }
            }
            logger.warning("capacity \(i)", metadata: ["order": "o-\(i)"])
        }
        try await center.flush()
        try await watcher.waitFor(prefix: "capacity ", count: burst, timeout: .seconds(120))
        let arrivals = watcher.arrivals(prefix: "capacity ")
        let span = Double((arrivals.max() ?? 0) - (arrivals.min() ?? 0)) / 1e9
        let tailCPU = try cpuSeconds(server.process.processIdentifier) - cpuBefore
        let byThread = threadSeconds(server.process.processIdentifier).map { ($0.key, $0.value - (threadsBefore[$0.key] ?? 0)) }.filter { $0.1 > 0.05 }
        note("tail.capacity: the server's CPU by thread: " + byThread.sorted { $0.1 > $1.1 }.map { String(format: "%@ %.2f s", $0.0, $0.1) }.joined(separator: ", "))
        let dropped = watcher.dropped()
        try await watcher.stop(admin)
        let forwarded = Double(arrivals.count) / max(span, 1e-9)

        let cpuBeforePull = try cpuSeconds(server.process.processIdentifier)
        let pullStart = monotonicNanos()
        // The same records: those logged since the capacity run began, matching its text.
        let pull = try await admin.createPull(PullRequest(uid: Self.uid, agent: nil, filter: LogFilter(since: since, text: "capacity ")))
        var done = false
        while !done {
            let now = try await admin.pull(pull.id, diskUse: false)
            if now.targets.contains(where: { [.failed, .rejected, .expired].contains($0.status) }) { throw ValidationError("the capacity pull failed: \(now.targets)") }
            done = !now.targets.isEmpty && now.targets.allSatisfy { $0.status == .complete }
            if !done { try await Task.sleep(for: .milliseconds(20)) }
            guard monotonicNanos() - pullStart < 300_000_000_000 else { throw ValidationError("the capacity pull did not complete in 5 minutes") }
        }
        let pullSeconds = Double(monotonicNanos() - pullStart) / 1e9
        let pullCPU = try cpuSeconds(server.process.processIdentifier) - cpuBeforePull
        print(Figure(
            name: "tail.capacity", value: forwarded, unit: "records/s", limit: Double(burst) / pullSeconds, higherIsBetter: true,
            extra: String(
                format: "records=%d dropped=%d server_cpu_per_record_tail=%.1f us server_cpu_per_record_pull=%.1f us (a pull of the same records; the device paced at 9000/s)",
                arrivals.count, dropped, tailCPU / Double(max(arrivals.count, 1)) * 1e6, pullCPU / Double(burst) * 1e6)).line)
    }

    /// One round: `rate` records a second for `seconds`, each log call timed, then `flush()`
    /// timed from the call (durable in the store); with a watcher, each record's arrival in the
    /// stream from the call.
    func pace(_ logger: DredgeLogger, _ center: LogCenter, tag: String, watcher: Watcher?) async throws -> (calls: [Double], durable: [Double], seen: [Double]) {
        let count = rate * seconds, interval = 1_000_000_000 / Int64(rate)
        var calls: [Double] = [], durable: [Double] = [], called: [Int64] = []
        calls.reserveCapacity(count)
        let start = monotonicNanos()
        for i in 0..<count {
            let wait = start + Int64(i) * interval - monotonicNanos()
            if wait > 0 { try await Task.sleep(for: .nanoseconds(wait)) }
            let before = monotonicNanos()
            logger.warning("\(tag) \(i)")
            let after = monotonicNanos()
            try await center.flush()
            calls.append(Double(after - before))
            durable.append(Double(monotonicNanos() - before) / 1e6)
            called.append(before)
        }
        guard let watcher else { return (calls, durable, []) }
        try await watcher.waitFor(prefix: "\(tag) ", count: count, timeout: .seconds(60))
        let arrived = watcher.arrivalsByIndex(prefix: "\(tag) ")
        let seen = called.enumerated().compactMap { i, at in arrived[i].map { Double($0 - at) / 1e6 } }
        return (calls, durable, seen)
    }

    func percentile(_ values: [Double], _ p: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        let sorted = values.sorted()
        return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
    }

    /// A process's live threads' CPU time so far by thread name, from `/proc/PID/task` (empty
    /// where it cannot be read: a note only).
    func threadSeconds(_ pid: Int32) -> [String: Double] {
        var byName: [String: Double] = [:]
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []  // a note only: nothing to lose
        for task in tasks {
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/stat", encoding: .utf8),  // a thread that ended meanwhile
                let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")")
            else { continue }
            let name = String(stat[stat.index(after: open)..<close]).trimmingCharacters(in: .decimalDigits)
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { continue }
            byName[name, default: 0] += (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
        }
        return byName
    }

    /// A process's CPU time so far (user + system), from `/proc/PID/stat`.
    func cpuSeconds(_ pid: Int32) throws -> Double {
        let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
        // After the command's closing parenthesis: state is field 3; utime and stime 14 and 15.
        guard let close = stat.lastIndex(of: ")") else { throw ValidationError("unreadable /proc/\(pid)/stat") }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { throw ValidationError("unreadable /proc/\(pid)/stat") }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// The engineer: a tail started through the admin API, watched from its start, each record's
    /// arrival timed (monotonic ns) by its message.
    final class Watcher: Sendable {
        let id: String
        private let seen = Mutex<[String: Int64]>([:])
        private let droppedCount = Mutex<Int64>(0)
        private let task = Mutex<Task<Void, any Error>?>(nil)
        /// The stream's first line came.
        private let started = Mutex(false)

        private func take(_ event: TailEvent) {
            started.withLock { $0 = true }
            switch event.kind {
            case .record:
                let at = monotonicNanos()
                if case .object(let members)? = event.record, case .string(let message)? = members["message"] { seen.withLock { $0[message] = at } }
            case .dropped, .missed: droppedCount.withLock { $0 += event.count ?? 0 }
            default: break
            }
        }

        init(id: String) { self.id = id }

        static func start(_ admin: AdminClient, request: TailRequest) async throws -> Watcher {
            let tail = try await admin.createTail(request)
            let watcher = Watcher(id: tail.id)
            let task = Task {
                try await admin.watchTail(tail.id) { event in watcher.take(event) }
            }
            watcher.task.withLock { $0 = task }
            // Watching, and the device sending, before the round logs.
            for _ in 0..<600 {
                let running = try await admin.tail(tail.id).parts.contains { $0.status == .running }
                if running && watcher.started.withLock({ $0 }) { return watcher }
                try await Task.sleep(for: .milliseconds(50))
            }
            throw ValidationError("the device never started tail \(tail.id)")
        }

        func waitFor(prefix: String, count: Int, timeout: Duration) async throws {
            let end = ContinuousClock.now + timeout
            while arrivals(prefix: prefix).count + Int(dropped()) < count {
                guard ContinuousClock.now < end else {
                    throw ValidationError("\(arrivals(prefix: prefix).count) of \(count) records (\(dropped()) dropped) reached the stream in \(timeout)")
                }
                try await Task.sleep(for: .milliseconds(20))
            }
        }

        func arrivals(prefix: String) -> [Int64] { seen.withLock { $0.filter { $0.key.hasPrefix(prefix) }.map(\.value) } }

        func arrivalsByIndex(prefix: String) -> [Int: Int64] {
            seen.withLock { all in
                var byIndex: [Int: Int64] = [:]
                for (message, at) in all where message.hasPrefix(prefix) { if let i = Int(message.dropFirst(prefix.count)) { byIndex[i] = at } }
                return byIndex
            }
        }

        func dropped() -> Int64 { droppedCount.withLock { $0 } }

        func stop(_ admin: AdminClient) async throws {
            _ = try await admin.stopTail(id)
            try await task.withLock { $0 }?.value
        }
    }
}
