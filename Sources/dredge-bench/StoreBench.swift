import ArgumentParser
import DredgeAgentCore
import DredgeDomain
import DredgeLogging
import DredgeSamples
import DredgeStore
import DredgeWire
import Foundation
import GRDBSQLite
import Synchronization

struct StoreBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Store figures: store.ingest, store.enqueue, rewind.log_call, trigger.log_call_overhead, store.query, store.retention.")

    @Option(help: "Records per ingest round.")
    var ingestRecords = 300_000

    @Option(help: "Ingest rounds (the median is reported).")
    var rounds = 3

    @Option(help: "Timed log calls for the enqueue latency.")
    var enqueueCalls = 200_000

    @Option(help: "Minimum records in the query/retention store.")
    var queryRecords = 1_000_000

    @Option(help: "Size in MB the retention store is grown to before retention brings it under 200 MB.")
    var retentionStartMB = 250

    @Option(help: "The size limit in MB retention brings the store under.")
    var retentionLimitMB = 200

    @Option(help: "Scratch directory (a temporary one by default).")
    var scratch: String?

    func run() async throws {
        let dir = scratch ?? FileManager.default.temporaryDirectory.appendingPathComponent("dredge-bench-\(getpid())").path
        try? FileManager.default.removeItem(atPath: dir)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { if scratch == nil { try? FileManager.default.removeItem(atPath: dir) } }

        print(try ingest(dir: dir).line)
        let enqueued = try enqueue(dir: dir)
        print(enqueued.line)
        print(try rewindLogCall(dir: dir, enqueueMedian: enqueued.value).line)
        print(try triggerLogCallOverhead(dir: dir).line)
        let (query, retention) = try queryAndRetention(dir: dir)
        print(query.line)
        print(retention.line)
    }

    // MARK: store.ingest

    /// One input row, prepared both ways: as a log call takes it and as SQLite stores it.
    struct Row {
        var timestamp: Timestamp
        var level: LogLevel
        var type: LogType
        var uid: String
        var message: String
        var fields: LogFields
        var metadataJSON: [UInt8]
    }

    func rows(_ count: Int, context: ContextID) -> [Row] {
        let now = Timestamp.now
        return SampleLogs(count: count, uids: (1...40).map { String(format: "u-%04d", $0) }, from: now.subtracting(.seconds(86_400)), to: now, context: context).map { e in
            var w = JSONWriter()
            if !e.metadata.isEmpty { w.writeObject(e.metadata) }
            return Row(
                timestamp: e.timestamp, level: e.level, type: e.type, uid: e.uid, message: e.message,
                fields: e.metadata.mapValues { LogField($0) }, metadataJSON: w.bytes)
        }
    }

    func ingest(dir: String) throws -> Figure {
        let batch = StoreConfiguration().maxBatchSize
        let input = rows(ingestRecords, context: ContextID(rawValue: 1))
        let megabytes = Double(input.reduce(0) { $0 + $1.message.utf8.count + $1.metadataJSON.count + $1.uid.utf8.count }) / 1e6
        note("ingest: \(input.count) rows, \(String(format: "%.1f", megabytes)) MB of text, transactions of \(batch)")
        var ours: [Double] = []
        var raw: [Double] = []
        for round in 0..<rounds {
            raw.append(Double(input.count) / (try rawInsert(input, path: "\(dir)/raw-\(round).sqlite", batch: batch)))
            ours.append(Double(input.count) / (try apiInsert(input, path: "\(dir)/api-\(round).sqlite")))
            note("ingest round \(round): raw \(Int(raw.last!)) records/s, api \(Int(ours.last!)) records/s")
            try? FileManager.default.removeItem(atPath: "\(dir)/raw-\(round).sqlite")
            try? FileManager.default.removeItem(atPath: "\(dir)/api-\(round).sqlite")
        }
        return Figure(name: "store.ingest", value: median(ours), unit: "records/s", limit: median(raw), higherIsBetter: true)
    }

    /// Through the public logging API, from the first call until `flush()` returns.
    func apiInsert(_ input: [Row], path: String) throws -> Double {
        var configuration = StoreConfiguration()
        configuration.overflowPolicy = .block
        let center = try LogCenter(path: path, configuration: configuration, context: .current(app: "bench"))
        try center.flush()
        var loggers: [LogType: DredgeLogger] = [:]
        for type in Set(input.map(\.type)) { loggers[type] = center.logger(type: type) }
        let elapsed = try seconds {
            for row in input {
                loggers[row.type]!.log(row.level, LogMessage(stringLiteral: row.message), metadata: row.fields, at: row.timestamp, uid: row.uid)
            }
            try center.flush()
        }
        let stats = try center.store.statistics()
        precondition(stats.recordCount == Int64(input.count) && stats.droppedQueueFull == 0, "ingest lost records")
        try center.close()
        return elapsed
    }

    /// The limit: the same rows through one prepared statement, same schema, same pragmas,
    /// same transaction size, metadata already encoded.
    func rawInsert(_ input: [Row], path: String, batch: Int) throws -> Double {
        try LogStore(path: path).close()  // the same schema, made by the store's migrations
        let raw = try RawSQLite(path: path)
        let statement = try raw.prepare("INSERT INTO log (ts, level, type, uid, message, metadata, context_id) VALUES (?, ?, ?, ?, ?, ?, ?)")
        defer { sqlite3_finalize(statement) }
        return try seconds {
            var index = 0
            while index < input.count {
                try raw.exec("BEGIN")
                for row in input[index..<min(index + batch, input.count)] {
                    sqlite3_bind_int64(statement, 1, row.timestamp.microseconds)
                    sqlite3_bind_int64(statement, 2, Int64(row.level.rawValue))
                    SQLiteBind.text(statement, 3, row.type.rawValue)
                    SQLiteBind.text(statement, 4, row.uid)
                    SQLiteBind.text(statement, 5, row.message)
                    if row.metadataJSON.isEmpty {
                        sqlite3_bind_null(statement, 6)
                    } else {
                        row.metadataJSON.withUnsafeBufferPointer { b in
                            _ = sqlite3_bind_text(statement, 6, UnsafeRawPointer(b.baseAddress!).assumingMemoryBound(to: CChar.self), Int32(b.count), SQLiteBind.transient)
                        }
                    }
                    sqlite3_bind_int64(statement, 7, 1)
                    guard sqlite3_step(statement) == SQLITE_DONE else { throw RawSQLite.RawError(message: String(cString: sqlite3_errmsg(raw.db))) }
                    sqlite3_reset(statement)
                }
                try raw.exec("COMMIT")
                index += batch
            }
        }
    }

    // MARK: store.enqueue

    func enqueue(dir: String) throws -> Figure {
        var configuration = StoreConfiguration()
        configuration.queueCapacity = enqueueCalls * 2
        let center = try LogCenter(path: "\(dir)/enqueue.sqlite", configuration: configuration, context: .current(app: "bench"))
        try center.flush()
        center.setUser("u-0001")
        let log = center.logger(type: .network)
        var ours = [Int64](repeating: 0, count: enqueueCalls)
        for i in 0..<enqueueCalls {
            let start = monotonicNanos()
            log.info("GET https://api.example.com/api/v2/catalog -> 200 in 42 ms", metadata: ["http.status": 200, "duration_ms": 42])
            ours[i] = monotonicNanos() - start
        }
        try center.flush()
        let stats = try center.store.statistics()
        try center.close()

        // The limit: the cheapest hand-off to another thread, a locked append of a ready entry.
        let entry = LogEntry(level: .info, type: .network, uid: "u-0001", message: "GET https://api.example.com/api/v2/catalog -> 200 in 42 ms", metadata: ["http.status": 200, "duration_ms": 42], context: ContextID(rawValue: 1))
        let buffer = Mutex<[LogEntry]>([])
        buffer.withLock { $0.reserveCapacity(enqueueCalls) }
        var floor = [Int64](repeating: 0, count: enqueueCalls)
        for i in 0..<enqueueCalls {
            let start = monotonicNanos()
            buffer.withLock { $0.append(entry) }
            floor[i] = monotonicNanos() - start
        }
        ours.sort()
        floor.sort()
        let p50 = Double(ours[ours.count / 2]), p99 = Double(ours[ours.count * 99 / 100])
        note("enqueue: \(enqueueCalls) calls, dropped \(stats.droppedQueueFull); floor p50 \(floor[floor.count / 2]) ns p99 \(floor[floor.count * 99 / 100]) ns")
        return Figure(name: "store.enqueue", value: p50, unit: "ns", limit: Double(floor[floor.count / 2]), higherIsBetter: false, extra: "p99=\(Int(p99)) ns")
    }

    // MARK: rewind.log_call

    /// A debug call below its logger's level into the rewind buffer (#54): rendered, its
    /// metadata encoded and copied into the memory-mapped ring on the caller's thread. Its
    /// median against the same call stored (`store.enqueue`'s median, this run): the goal is
    /// under it (a ratio below 1).
    func rewindLogCall(dir: String, enqueueMedian: Double) throws -> Figure {
        let center = try LogCenter(
            path: "\(dir)/rewind.sqlite", context: .current(app: "bench"), rewind: RewindConfiguration(bytes: 4 << 20))
        center.setUser("u-0001")
        let log = center.logger(type: .network, minimumLevel: .info)
        var ours = [Int64](repeating: 0, count: enqueueCalls)
        for i in 0..<enqueueCalls {
            let start = monotonicNanos()
            log.debug("GET https://api.example.com/api/v2/catalog -> 200 in 42 ms", metadata: ["http.status": 200, "duration_ms": 42])
            ours[i] = monotonicNanos() - start
        }
        let kept = try center.freezeRewind()
        try center.close()
        ours.sort()
        let p50 = Double(ours[ours.count / 2]), p99 = Double(ours[ours.count * 99 / 100])
        note("rewind: \(enqueueCalls) debug calls into a 4 MiB buffer, \(kept) kept at the end (the newest)")
        return Figure(name: "rewind.log_call", value: p50, unit: "ns", limit: enqueueMedian, higherIsBetter: false, extra: "p99=\(Int(p99)) ns")
    }

    // MARK: trigger.log_call_overhead

    /// The app's log call while the agent matches 50 standing triggers against the same store
    /// (#54, Protocol § 21), against the same calls with none: the agent's ``TriggerMatcher``
    /// reads what the store took on a thread of its own every 20 ms, as the agent does, and the
    /// app's calls never wait for it. Rounds alternate (none, 50, none, 50, …); the figure is the
    /// median call with the triggers, the limit the median without (ratio = without ÷ with, the
    /// goal at least 0.8).
    func triggerLogCallOverhead(dir: String, rounds: Int = 3) throws -> Figure {
        let calls = max(1_000, enqueueCalls / 2)
        let triggers: [WireTrigger] = (0..<50).map { i in
            WireTrigger.with {
                $0.triggerID = String(format: "%032x", i + 1)
                $0.name = "trigger \(i)"
                switch i % 3 {
                case 0: $0.match = .with { $0.levels = [.error, .critical]; $0.text = "payment declined \(i)" }
                case 1: $0.match = .with { $0.metadataKey = "http.status"; $0.metadataValue = "\(500 + i)" }
                default: $0.match = .with { $0.types = ["business"]; $0.text = "checkout \(i) failed" }
                }
                $0.beforeS = 300
                $0.afterS = 60
                $0.maxPerDeviceDay = 3
                $0.expiresAtUs = Timestamp.now.microseconds + 86_400_000_000
            }
        }
        let set = WireTriggerSet.with { $0.version = 1; $0.issuedAtUs = Timestamp.now.microseconds; $0.triggers = triggers }
        let rules = try TriggerSetTerms.check(set)
        var without: [Int64] = [], with: [Int64] = []
        /// Shared with the matcher's thread: when to stop, and what it did over every round with
        /// triggers (records read, steps, each step's time).
        final class Shared: Sendable {
            let stop = Atomic<Bool>(false)
            let work = Mutex<(matched: Int, steps: Int, stepNanos: [Int64])>((0, 0, []))
        }
        let shared = Shared()
        for round in 0..<(rounds * 2) {
            let active = round % 2 == 1
            var configuration = StoreConfiguration()
            configuration.queueCapacity = calls * 2
            let path = "\(dir)/triggers-\(round).sqlite"
            let center = try LogCenter(path: path, configuration: configuration, context: .current(app: "bench"))
            try center.flush()
            center.setUser("u-0001")
            let log = center.logger(type: .network)
            shared.stop.store(false, ordering: .relaxed)
            let matcher = active ? Thread { [shared] in
                do {
                    var readOnly = StoreConfiguration()
                    readOnly.readOnly = true
                    let store = try LogStore(path: path, configuration: readOnly)
                    var held = HeldTriggers()
                    held.hold(set, rules: rules, storeEnd: 0)
                    var ids = 0
                    while !shared.stop.load(ordering: .relaxed) {
                        let start = monotonicNanos()
                        let before = held.cursor
                        _ = try TriggerMatcher.step(&held, store: store, now: .now) { ids += 1; return String(format: "%032x", ids) }
                        let took = monotonicNanos() - start
                        let read = Int(held.cursor - before)
                        shared.work.withLock { $0.stepNanos.append(took); $0.matched += read; $0.steps += 1 }
                        usleep(20_000)
                    }
                    try store.close()
                } catch {
                    note("the matcher stopped: \(error)")
                }
            } : nil
            matcher?.start()
            var ours = [Int64](repeating: 0, count: calls)
            for i in 0..<calls {
                let start = monotonicNanos()
                log.info("GET https://api.example.com/api/v2/catalog -> 200 in 42 ms", metadata: ["http.status": 200, "duration_ms": 42])
                ours[i] = monotonicNanos() - start
            }
            try center.flush()
            // The matcher reads the rest, then stops.
            usleep(100_000)
            shared.stop.store(true, ordering: .relaxed)
            while matcher?.isFinished == false { usleep(1_000) }
            try center.close()
            ours.sort()
            if active { with.append(ours[ours.count / 2]) } else { without.append(ours[ours.count / 2]) }
        }
        let (matched, steps, stepNanos) = shared.work.withLock { ($0.matched, $0.steps, $0.stepNanos.sorted()) }
        let withMedian = Double(with.sorted()[with.count / 2]), withoutMedian = Double(without.sorted()[without.count / 2])
        note("triggers: \(calls) calls a round, \(rounds) rounds each way; medians with 50 triggers \(with) ns, without \(without) ns; the matcher read \(matched) records in \(steps) steps (a step's median \(stepNanos.isEmpty ? 0 : stepNanos[stepNanos.count / 2] / 1_000) µs)")
        return Figure(name: "trigger.log_call_overhead", value: withMedian, unit: "ns", limit: withoutMedian, higherIsBetter: false, extra: "rounds=\(rounds)")
    }

    // MARK: store.query and store.retention

    func queryAndRetention(dir: String) throws -> (Figure, Figure) {
        let path = "\(dir)/big.sqlite"
        var configuration = StoreConfiguration()
        configuration.overflowPolicy = .block
        configuration.retention = RetentionPolicy(maxAge: .seconds(365 * 86_400), maxBytes: 10_000_000_000)
        let store = try LogStore(path: path, configuration: configuration)
        let context = try store.register(.current(app: "bench"))
        let now = Timestamp.now
        let start = now.subtracting(.seconds(7 * 86_400))
        let uids = (1...40).map { String(format: "u-%04d", $0) }
        let target = Int64(retentionStartMB) * 1_000_000
        // Records are spread over seven days in chunks, until the store holds enough records
        // and has grown past the retention start size.
        var total = 0, seed: UInt64 = 1
        while try total < queryRecords || store.statistics().bytesOnDisk < target {
            for e in SampleLogs(count: 100_000, uids: uids, from: start, to: now, context: context, seed: seed) { store.enqueue(e) }
            total += 100_000
            seed += 1
            try store.flush()
        }
        try store.close()
        let size = fileSize(path)
        note("query/retention store: \(total) records, \(size / 1_000_000) MB")

        // One uid's day.
        let dayStart = Timestamp(rfc3339: start.adding(.seconds(3 * 86_400)).utcDay)!
        let filter = LogFilter(since: dayStart, until: dayStart.adding(.seconds(86_400)), uid: "u-0007")
        var readOnly = StoreConfiguration()
        readOnly.readOnly = true
        let reader = try LogStore(path: path, configuration: readOnly)
        var ours: [Double] = [], raw: [Double] = []
        var rows = 0
        let rawDB = try RawSQLite(path: path)
        let sql = "SELECT id, ts, level, type, uid, message, metadata, context_id FROM log WHERE uid = ? AND ts >= ? AND ts < ? ORDER BY ts, id"
        for _ in 0..<7 {
            var count = 0, bytes = 0
            ours.append(try seconds {
                try reader.forEachRecord(matching: filter) { r in
                    count += 1
                    bytes += r.message.utf8.count + r.metadataJSON.utf8.count
                }
            })
            rows = count
            var rawCount = 0, rawBytes = 0
            raw.append(try seconds {
                let statement = try rawDB.prepare(sql)
                defer { sqlite3_finalize(statement) }
                SQLiteBind.text(statement, 1, "u-0007")
                sqlite3_bind_int64(statement, 2, filter.since!.microseconds)
                sqlite3_bind_int64(statement, 3, filter.until!.microseconds)
                while sqlite3_step(statement) == SQLITE_ROW {
                    _ = sqlite3_column_int64(statement, 0) &+ sqlite3_column_int64(statement, 1) &+ sqlite3_column_int64(statement, 2)
                    _ = sqlite3_column_text(statement, 3)
                    _ = sqlite3_column_text(statement, 4)
                    _ = sqlite3_column_text(statement, 5)
                    _ = sqlite3_column_text(statement, 6)
                    rawBytes += Int(sqlite3_column_bytes(statement, 5) + sqlite3_column_bytes(statement, 6))
                    _ = sqlite3_column_int64(statement, 7)
                    rawCount += 1
                }
            })
            precondition(rawCount == count, "raw and store disagree")
            _ = (bytes, rawBytes)
        }
        try reader.close()
        let query = Figure(name: "store.query", value: median(ours) * 1_000, unit: "ms", limit: median(raw) * 1_000, higherIsBetter: false, extra: "rows=\(rows) of=\(total)")

        // Retention from the grown store to under 200 MB, on two copies of the same file.
        let ourCopy = "\(dir)/retention-ours.sqlite", rawCopy = "\(dir)/retention-raw.sqlite"
        try FileManager.default.copyItem(atPath: path, toPath: ourCopy)
        try FileManager.default.copyItem(atPath: path, toPath: rawCopy)
        try FileManager.default.removeItem(atPath: path)
        var retained = StoreConfiguration()
        let limit = Int64(retentionLimitMB) * 1_000_000
        retained.retention = RetentionPolicy(maxAge: .seconds(365 * 86_400), maxBytes: limit)
        var deleted: Int64 = 0
        var after: Int64 = 0
        let oursRetention = try seconds {
            let store = try LogStore(path: ourCopy, configuration: retained)
            try store.flush()  // returns once the retention pass at open is done
            let stats = try store.statistics()
            deleted = stats.lastRetention?.deletedBySize ?? 0
            after = stats.bytesOnDisk
            try store.close()
        }
        precondition(after <= limit && deleted > 0, "retention left \(after) bytes")
        let rawRetention = try seconds {
            let raw = try RawSQLite(path: rawCopy)
            try raw.exec("BEGIN")
            try raw.exec("DELETE FROM log WHERE id IN (SELECT id FROM log ORDER BY ts, id LIMIT \(deleted))")
            try raw.exec("COMMIT")
            try raw.exec("PRAGMA incremental_vacuum")
            try raw.exec("PRAGMA wal_checkpoint(TRUNCATE)")
        }
        note("retention: \(size / 1_000_000) MB -> \(after / 1_000_000) MB, \(deleted) records deleted; raw file now \(fileSize(rawCopy) / 1_000_000) MB")
        let retention = Figure(name: "store.retention", value: oursRetention, unit: "s", limit: rawRetention, higherIsBetter: false, extra: "from_mb=\(size / 1_000_000) to_mb=\(after / 1_000_000)")
        return (query, retention)
    }
}
