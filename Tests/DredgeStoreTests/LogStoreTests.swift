@testable import DredgeStore
import DredgeDomain
import DredgeSamples
import Foundation
import GRDB
import Testing

@Suite struct LogStoreTests {
    @Test func storesWhatWasLoggedAndReadsItBackInTimeOrder() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        // Enqueued out of time order: queries still return time order.
        store.enqueue(entry(3_000, message: "third", metadata: ["k": "v", "n": 3], context: ctx))
        store.enqueue(entry(1_000, uid: "", level: .debug, type: .network, message: "first", context: ctx))
        store.enqueue(entry(2_000, level: .critical, type: "custom.kind", message: "second", context: ctx))
        try store.flush()

        let records = try store.records(matching: .all)
        #expect(records.map(\.message) == ["first", "second", "third"])
        #expect(records[0].uid == "" && records[0].type == .network && records[0].level == .debug)
        #expect(records[1].type == LogType("custom.kind") && records[1].level == .critical)
        #expect(records[2].metadataJSON == #"{"k":"v","n":3}"#)
        #expect(records[2].metadata == ["k": "v", "n": 3])
        #expect(records[0].metadataJSON == "{}")
        #expect(try store.contexts([ctx])[ctx] == testContext)
        try store.close()
    }

    @Test func contextRowsAreStoredOnce() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let a = try store.register(testContext)
        let b = try store.register(testContext)
        var other = testContext
        other.extra = ["region": "eu"]
        let c = try store.register(other)
        #expect(a == b)
        #expect(a != c)
        #expect(try store.contexts([a, c]) == [a: testContext, c: other])
    }

    @Test func installKeyIsStableAcrossReopen() throws {
        let dir = TempDir()
        let first = try LogStore(path: dir.file("logs.sqlite"))
        let key = first.installKey
        try first.close()
        let second = try LogStore(path: dir.file("logs.sqlite"))
        #expect(second.installKey == key)
        #expect(key.count == 32)
        let elsewhere = try LogStore(path: dir.file("other.sqlite"))
        #expect(elsewhere.installKey != key)
    }

    /// LIKE's wildcards in a text are literal even when a combining mark follows them (one
    /// grapheme, so escaping by `Character` missed the `%`).
    @Test func aWildcardBeforeACombiningMarkIsLiteral() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        for message in ["cafe\u{301} au lait", "100%\u{301} sure", "a_\u{301}b"] { store.enqueue(entry(0, message: message, context: ctx)) }
        try store.flush()
        var got: [String] = []
        try store.forEachRecord(matching: LogFilter(text: "%\u{301}")) { got.append($0.message) }
        #expect(got == ["100%\u{301} sure"])
        got = []
        try store.forEachRecord(matching: LogFilter(text: "_\u{301}")) { got.append($0.message) }
        #expect(got == ["a_\u{301}b"])
    }

    @Test func filtersSelectExactlyWhatABruteForceScanSelects() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        // Within the default three days of retention, so no retention pass can interfere.
        let end = Timestamp.now
        let start = end.subtracting(.seconds(60 * 3_600))
        let samples = Array(SampleLogs(count: 3_000, uids: ["u-1", "u-2", "u-3"], from: start, to: end, context: ctx))
        for e in samples { store.enqueue(e) }
        try store.flush()

        let day = start.adding(.seconds(12 * 3_600))
        let filters: [LogFilter] = [
            .all,
            LogFilter(uid: "u-2"),
            LogFilter(uid: ""),
            LogFilter(since: day, until: day.adding(.seconds(86_400))),
            LogFilter(since: day, until: day.adding(.seconds(86_400)), uid: "u-1"),
            LogFilter(types: [.network]),
            LogFilter(levels: [.error, .critical]),
            LogFilter(uid: "u-3", types: [.business, .player], levels: [.error, .warning, .notice]),
            LogFilter(text: "PAYMENT DECLINED"),
            LogFilter(text: "edge-ams"),  // metadata only
            LogFilter(text: "100%_"),  // LIKE wildcards are literal
            LogFilter(since: end, until: end.adding(.seconds(10))),
        ]
        for filter in filters {
            let expected = samples.filter { e in
                if let s = filter.since, e.timestamp < s { return false }
                if let u = filter.until, e.timestamp >= u { return false }
                if let uid = filter.uid, e.uid != uid { return false }
                if let t = filter.types, !t.contains(e.type) { return false }
                if let l = filter.levels, !l.contains(e.level) { return false }
                if let text = filter.text?.lowercased() {
                    var w = JSONWriter()
                    w.writeObject(e.metadata)
                    if !e.message.lowercased().contains(text) && !w.string.lowercased().contains(text) { return false }
                }
                return true
            }
            var got: [LogRecord] = []
            try store.forEachRecord(matching: filter) { got.append($0) }
            #expect(got.map(\.message) == expected.map(\.message), "\(filter)")
            #expect(got.map(\.timestamp) == got.map(\.timestamp).sorted(), "time order for \(filter)")
            #expect(try store.count(matching: filter) == expected.count)
        }
        #expect(try store.count(matching: LogFilter(text: "payment declined")) > 0)
    }

    @Test func queryPlansUseTheIndexesAndNeverSort() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let t0 = Timestamp(microseconds: 1_000), t1 = Timestamp(microseconds: 2_000)
        let cases: [(LogFilter, String)] = [
            (LogFilter(since: t0, until: t1, uid: "u"), "log_by_uid_ts"),
            (LogFilter(uid: "u"), "log_by_uid_ts"),
            (LogFilter(since: t0, until: t1, uid: "u", types: [.network], levels: [.error], text: "x"), "log_by_uid_ts"),
            (LogFilter(since: t0, until: t1), "log_by_ts"),
            (LogFilter(since: t0, types: [.network, .player]), "log_by_ts"),
            (.all, "log_by_ts"),
        ]
        for (filter, index) in cases {
            let plan = try store.queryPlan(for: filter).joined(separator: " | ")
            #expect(plan.contains(index), "\(filter): \(plan)")
            #expect(!plan.contains("TEMP B-TREE"), "\(filter): \(plan)")
        }
        let ranged = try store.queryPlan(for: LogFilter(since: t0, until: t1, uid: "u")).joined()
        #expect(ranged.contains("uid=? AND ts>? AND ts<?"), "\(ranged)")
    }

    /// A live tail's read (Protocol § 20): the records after a row id that match, in the order
    /// the store took them (not their time: a record may be backdated), exactly what a scan
    /// selects; the primary key's range serves it, so a poll reads only what is new.
    @Test func recordsAfterACursorAreTheNewOnesThatMatchInStoreOrder() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        #expect(try store.lastRowID() == 0)
        for i in 0..<60 {
            // Every third one backdated: the store's order is not the time order.
            store.enqueue(entry(i % 3 == 0 ? 1_000 - Int64(i) : Int64(10_000 + i), uid: i % 2 == 0 ? "u-1" : "u-2", level: i % 5 == 0 ? .error : .info, message: "m\(i)", context: ctx))
        }
        try store.flush()
        let all = try store.records(after: 0, matching: .all, limit: 1_000)
        #expect(all.map(\.message) == (0..<60).map { "m\($0)" } && all.map(\.id) == all.map(\.id).sorted())
        let cursor = all[29].id
        #expect(try store.lastRowID() == all.last?.id)
        for filter in [LogFilter.all, LogFilter(uid: "u-1"), LogFilter(uid: "u-2", levels: [.error]), LogFilter(text: "M4")] {
            let expected = all.filter { $0.id > cursor }.filter { r in
                (filter.uid.map { r.uid == $0 } ?? true) && (filter.levels.map { $0.contains(r.level) } ?? true)
                    && (filter.text.map { r.message.lowercased().contains($0.lowercased()) } ?? true)
            }
            #expect(try store.records(after: cursor, matching: filter, limit: 1_000) == expected, "\(filter)")
            #expect(try store.records(after: cursor, matching: filter, limit: 2) == Array(expected.prefix(2)))
            let plan = try store.queryPlan(after: cursor, for: filter).joined(separator: " | ")
            #expect(plan.contains("INTEGER PRIMARY KEY") && !plan.contains("log_by_uid_ts") && !plan.contains("TEMP B-TREE"), "\(filter): \(plan)")
        }
        #expect(try store.records(after: all.last!.id, matching: .all, limit: 10).isEmpty)
    }

    @Test func streamingStopsWhenTheBodyThrows() throws {
        struct Enough: Error {}
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        for i in 0..<500 { store.enqueue(entry(Int64(i), context: ctx)) }
        try store.flush()
        var seen = 0
        #expect(throws: Enough.self) {
            try store.forEachRecord(matching: .all) { _ in
                seen += 1
                if seen == 10 { throw Enough() }
            }
        }
        #expect(seen == 10)
    }

    @Test func manyThreadsLoggingAtOnceLoseNothing() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            for i in 0..<2_000 {
                store.enqueue(entry(Int64(thread * 1_000_000 + i), uid: "t\(thread)", message: "\(thread)/\(i)", context: ctx))
            }
        }
        try store.flush()
        let stats = try store.statistics()
        #expect(stats.recordCount == 16_000)
        #expect(stats.accepted == 16_000 && stats.written == 16_000 && stats.droppedQueueFull == 0)
        for thread in 0..<8 {
            let messages = try store.records(matching: LogFilter(uid: "t\(thread)")).map(\.message)
            #expect(messages == (0..<2_000).map { "\(thread)/\($0)" })
        }
    }

    @Test func flushedRecordsAreVisibleToAnotherConnection() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        for i in 0..<100 { store.enqueue(entry(Int64(i), context: ctx)) }
        try store.flush()
        var readOnly = StoreConfiguration()
        readOnly.readOnly = true
        let reader = try LogStore(path: dir.file("logs.sqlite"), configuration: readOnly)
        #expect(try reader.count(matching: .all) == 100)
        #expect(!reader.enqueue(entry(1, context: ctx)))
    }

    @Test func asyncFlushWaitsForDurability() async throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        for i in 0..<1_000 { store.enqueue(entry(Int64(i), context: ctx)) }
        try await store.flush()
        #expect(try store.count(matching: .all) == 1_000)
    }

    @Test func logCallsAfterCloseAreDroppedAndCounted() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        store.enqueue(entry(1, context: ctx))
        try store.close()
        #expect(!store.enqueue(entry(2, context: ctx)))
        let reopened = try LogStore(path: dir.file("logs.sqlite"))
        #expect(try reopened.count(matching: .all) == 1)
    }

    @Test func theShippedSchemaNeverChanges() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let schema = try store.pool.read { db in
            try String.fetchAll(db, sql: "SELECT sql FROM sqlite_master WHERE name NOT LIKE 'grdb%' AND name NOT LIKE 'sqlite%' AND sql IS NOT NULL ORDER BY name")
        }
        let normalized = schema.map { $0.split(whereSeparator: \.isWhitespace).joined(separator: " ") }
        #expect(normalized == [
            "CREATE TABLE context ( id INTEGER PRIMARY KEY, fields TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL )",
            "CREATE TABLE log ( id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, level INTEGER NOT NULL, type TEXT NOT NULL, uid TEXT NOT NULL, message TEXT NOT NULL, metadata TEXT, context_id INTEGER NOT NULL )",
            "CREATE INDEX log_by_ts ON log(ts)",
            "CREATE INDEX log_by_uid_ts ON log(uid, ts)",
            "CREATE TABLE loss ( id INTEGER PRIMARY KEY, recorded_at INTEGER NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL, first_ts INTEGER NOT NULL, last_ts INTEGER NOT NULL )",
            "CREATE INDEX loss_by_last_ts ON loss(last_ts)",
            "CREATE TABLE meta ( key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL ) WITHOUT ROWID",
            // v2-runs (#54).
            "CREATE TABLE run ( id TEXT PRIMARY KEY NOT NULL, context_id INTEGER NOT NULL, pid INTEGER NOT NULL, pid_namespace TEXT NOT NULL, boot TEXT NOT NULL, process_start INTEGER NOT NULL, started_at INTEGER NOT NULL, ended_at INTEGER, ending TEXT, rewind TEXT, rewound INTEGER NOT NULL DEFAULT 0 )",
            "CREATE INDEX run_by_started_at ON run(started_at)",
            "CREATE INDEX run_open ON run(ending) WHERE ending IS NULL",
        ])
        let pragmas = try store.pool.read { db in
            (try String.fetchOne(db, sql: "PRAGMA journal_mode"), try Int.fetchOne(db, sql: "PRAGMA auto_vacuum"), try Int.fetchOne(db, sql: "PRAGMA synchronous"))
        }
        #expect(pragmas.0 == "wal")
        #expect(pragmas.1 == 2)  // INCREMENTAL
        #expect(pragmas.2 == 1)  // NORMAL
    }
}

@Suite struct StreamingMemoryTests {
    /// Streaming a result far larger than the memory allowed for it: resident memory grows by
    /// a small, fixed amount (SQLite's page cache, one row), not with the result. Measured in a
    /// child process: this one's memory moves with every test running beside this one.
    @Test func streamingAResultDoesNotGrowMemoryWithItsSize() throws {
        let dir = TempDir()
        var config = StoreConfiguration()
        config.overflowPolicy = .block
        let path = dir.file("logs.sqlite")
        let store = try LogStore(path: path, configuration: config)
        let ctx = try store.register(testContext)
        let payload = String(repeating: "p", count: 1_000)
        for i in 0..<150_000 { store.enqueue(entry(Int64(i), message: "\(i) \(payload)", context: ctx)) }
        try store.close()

        let child = Process()
        child.executableURL = URL(fileURLWithPath: builtProduct("store-crash-child"))
        child.arguments = ["stream", path]
        let output = Pipe()
        child.standardOutput = output
        try child.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        child.waitUntilExit()
        let numbers = text.split(whereSeparator: { $0 == " " || $0 == "\n" }).compactMap { Int($0) }
        try #require(child.terminationStatus == 0 && numbers.count == 3, "\(text)")
        let (count, bytes, grew) = (numbers[0], numbers[1], numbers[2])
        #expect(count == 150_000)
        #expect(bytes > 150_000_000)
        #expect(grew < 32 * 1024 * 1024, "grew \(grew / 1024) KiB while streaming \(bytes / 1_000_000) MB")
    }
}

/// SQLite's string binding stops at a NUL: a query for "u1\0x" must not return u1's records.
@Suite struct NulUIDTests {
    @Test func aUidWithANulNeverMatchesAnotherUid() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        for i in 0..<10 { store.enqueue(entry(Int64(i), uid: "u1", context: ctx)) }
        try store.flush()
        #expect(try store.records(matching: LogFilter(uid: "u1")).count == 10)
        #expect(try store.records(matching: LogFilter(uid: "u1\u{0}x")).isEmpty)
        #expect(try store.records(matching: LogFilter(uid: "u1\u{0}")).isEmpty)
        try store.close()
    }
}
