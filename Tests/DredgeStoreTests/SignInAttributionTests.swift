@testable import DredgeStore
import DredgeDomain
import Foundation
import GRDB
import Testing

/// ``SignInAttribution``: the anonymous records directly before a sign-in are given the user's
/// uid and marked; nothing else changes.
@Suite struct SignInAttributionTests {
    let signedIn: LogValue = .bool(true)

    func at(_ offset: Int64) -> Timestamp { Timestamp(microseconds: testEpoch + offset) }

    /// (message, uid, marked) of every record, in time order.
    func rows(_ store: LogStore) throws -> [String] {
        try store.records(matching: .all).map { "\($0.message):\($0.uid)\($0.metadata[LogStore.beforeSignInKey] == signedIn ? ":before" : "")" }
    }

    @Test func theAnonymousStretchBeforeASignInGoesToTheUserAndIsMarked() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let run = try store.register(testContext)
        let other = try store.register(LogContext(host: "test-host", os: "Linux", app: "tests", appVersion: "1.0", process: "tests[2]"))
        store.enqueue(entry(0, uid: "", message: "too early", context: run))
        store.enqueue(entry(10, uid: "", message: "launch", metadata: ["step": 1], context: run))
        store.enqueue(entry(20, uid: "", message: "other run", context: other))
        store.enqueue(entry(30, uid: "", message: "login tapped", context: run))
        #expect(store.attribute(SignInAttribution(uid: "u-42", scope: .context(run), from: at(5), through: at(40))))
        store.enqueue(entry(50, uid: "u-42", message: "home", context: run))
        store.enqueue(entry(60, uid: "", message: "anonymous after", context: run))
        try store.flush()

        #expect(try rows(store) == ["too early:", "launch:u-42:before", "other run:", "login tapped:u-42:before", "home:u-42", "anonymous after:"])
        let launch = try #require(try store.records(matching: LogFilter(text: "launch")).first)
        #expect(launch.metadata == ["step": 1, LogStore.beforeSignInKey: true], "the record's own metadata is kept")
        #expect(try store.records(matching: LogFilter(uid: "u-42")).map(\.message) == ["launch", "login tapped", "home"])
        #expect(try store.activeUIDs(since: at(0)) == ["u-42"])
    }

    @Test func theStretchEndsAtTheNewestRecordThatCarriesAUser() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let run = try store.register(testContext)
        store.enqueue(entry(0, uid: "", message: "before a", context: run))
        store.enqueue(entry(10, uid: "u-a", message: "a", context: run))
        store.enqueue(entry(20, uid: "", message: "after a signed out", context: run))
        store.attribute(SignInAttribution(uid: "u-b", scope: .context(run), from: at(0), through: at(30)))
        try store.flush()
        #expect(try rows(store) == ["before a:", "a:u-a", "after a signed out:u-b:before"])
    }

    /// An attribution queued between entries that the writer takes in one batch runs between
    /// them: the user's first record, logged the same instant as the sign-in, does not end the
    /// stretch before it.
    @Test func anAttributionRunsExactlyWhereItWasQueuedAmongEntries() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        let store = try LogStore(path: path)
        let run = try store.register(testContext)
        try store.flush()  // the retention pass at open is done: the writer is idle
        // Hold the write lock from another connection: the writer takes "first" and waits for
        // it, so everything after lands in the writer's next batch.
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        let blocker = try DatabaseQueue(path: path, configuration: configuration)
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let held = Thread {
            do {
                try blocker.writeWithoutTransaction { db in
                    try db.inTransaction(.immediate) {
                        holding.signal()
                        release.wait()
                        return .rollback
                    }
                }
            } catch {
                Issue.record(error)
                holding.signal()
            }
        }
        held.start()
        holding.wait()
        store.enqueue(entry(0, uid: "", message: "first", context: run))
        var waited = 0
        while try store.statistics().queueDepth > 0, waited < 10_000 {
            Thread.sleep(forTimeInterval: 0.001)
            waited += 1
        }
        store.enqueue(entry(10, uid: "", message: "launch", context: run))
        store.attribute(SignInAttribution(uid: "u-1", scope: .context(run), from: at(0), through: at(20)))
        store.enqueue(entry(20, uid: "u-1", message: "home", context: run))
        release.signal()
        try store.flush()
        #expect(try rows(store) == ["first:u-1:before", "launch:u-1:before", "home:u-1"])
        try blocker.close()
        try store.close()
    }

    /// The writer cuts batches into transactions of `maxBatchSize`: attributions at a cut, inside
    /// a slice and after the last entry each run at their place; the async flush waits for them.
    @Test func attributionsFallInPlaceAcrossTransactionsOfABatch() async throws {
        let dir = TempDir()
        var configuration = StoreConfiguration()
        configuration.maxBatchSize = 2
        configuration.writeLinger = .milliseconds(50)  // hold small batches back: one batch, cut in slices
        configuration.lingerBelow = 1_000
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: configuration)
        let run = try store.register(testContext)
        try await store.flush()
        func anonymous(_ offset: Int64) { store.enqueue(entry(offset, uid: "", message: "a\(offset)", context: run)) }
        func signIn(_ uid: String, _ offset: Int64) {
            store.attribute(SignInAttribution(uid: uid, scope: .context(run), from: at(0), through: at(offset)))
        }
        anonymous(1)
        anonymous(2)
        signIn("u-1", 2)  // at a cut (position 2 of slices of 2)
        store.enqueue(entry(3, uid: "u-1", message: "u1", context: run))
        store.enqueue(entry(4, uid: "", message: "a4", context: run))
        anonymous(5)
        signIn("u-2", 5)  // inside a slice (position 5)
        store.enqueue(entry(6, uid: "u-2", message: "u2", context: run))
        anonymous(7)
        signIn("u-3", 7)  // after the last entry
        try await store.flush()
        #expect(try rows(store) == ["a1:u-1:before", "a2:u-1:before", "u1:u-1", "a4:u-2:before", "a5:u-2:before", "u2:u-2", "a7:u-3:before"])
        try store.close()
    }

    @Test func atMostTheNewestMaxRecordsAreTaken() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let run = try store.register(testContext)
        let count = SignInAttribution.maxRecords + 5
        for i in 0..<count { store.enqueue(entry(Int64(i), uid: "", message: "m\(i)", context: run)) }
        store.attribute(SignInAttribution(uid: "u-1", scope: .context(run), from: at(0), through: at(Int64(count))))
        try store.flush()
        #expect(try store.count(matching: LogFilter(uid: "u-1")) == SignInAttribution.maxRecords)
        #expect(try store.records(matching: LogFilter(uid: "")).map(\.message) == (0..<5).map { "m\($0)" })
        try store.close()
    }

    @Test func theAppScopeTakesEarlierRunsOfTheSameAppOnlyOnThisHost() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        func context(app: String, host: String = "test-host", process: String) throws -> ContextID {
            try store.register(LogContext(host: host, os: "Linux", app: app, appVersion: "1.0", process: process))
        }
        let crashed = try context(app: "oven", process: "oven[1]")
        let other = try context(app: "fridge", process: "fridge[2]")
        let elsewhere = try context(app: "oven", host: "another-host", process: "oven[3]")
        let now = try context(app: "oven", process: "oven[4]")
        store.enqueue(entry(0, uid: "", message: "crash at launch", context: crashed))
        store.enqueue(entry(5, uid: "", message: "fridge", context: other))
        store.enqueue(entry(6, uid: "", message: "elsewhere", context: elsewhere))
        store.enqueue(entry(10, uid: "", message: "launch again", context: now))
        store.attribute(SignInAttribution(uid: "u-1", scope: .app(of: now), from: at(0), through: at(20)))
        try store.flush()
        #expect(try rows(store) == ["crash at launch:u-1:before", "fridge:", "elsewhere:", "launch again:u-1:before"])
    }

    @Test func anAttributionThatCannotBeWrittenIsReportedAndLeavesTheRecordsAsTheyWere() throws {
        let dir = TempDir()
        var config = StoreConfiguration()
        config.maxPageCount = 64  // 256 KiB at 4 KiB pages
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
        let run = try store.register(testContext)
        // Fill the store with anonymous records until a write fails.
        let filler = String(repeating: "z", count: 1_500)
        var offset: Int64 = 0
        while true {
            for _ in 0..<5 {
                store.enqueue(entry(offset, uid: "", message: filler, context: run))
                offset += 1
            }
            do { try store.flush() } catch let error as StoreError where error.code == .diskFull { break }
        }
        let before = try store.records(matching: .all)
        #expect(before.count > 20 && before.allSatisfy { $0.uid.isEmpty })
        // Giving every record a uid and a marker needs room the store does not have.
        store.attribute(SignInAttribution(uid: String(repeating: "u", count: 256), scope: .context(run), from: at(0), through: at(offset)))
        let error = #expect(throws: StoreError.self) { try store.flush() }
        #expect(error?.code == .diskFull)
        let after = try store.records(matching: .all)
        #expect(after.map(\.id) == before.map(\.id))
        #expect(after.allSatisfy { $0.uid.isEmpty && $0.metadata.isEmpty }, "the failed attribution changed nothing")
        try store.close()
    }

    @Test func nothingIsTakenForAnEmptyUidOrAfterTheStoreCloses() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let run = try store.register(testContext)
        store.enqueue(entry(0, uid: "", message: "x", context: run))
        store.attribute(SignInAttribution(uid: "", scope: .context(run), from: at(0), through: at(10)))
        try store.flush()
        #expect(try rows(store) == ["x:"])
        try store.close()
        #expect(!store.attribute(SignInAttribution(uid: "u", scope: .context(run), from: at(0), through: at(10))))
    }

    /// The marker goes in at its sorted place and every other byte stays: the result is what the
    /// writer itself would have written for the metadata with the marker in it.
    @Test func theMarkerKeepsTheMetadataCanonical() throws {
        let cases: [LogMetadata] = [
            [:],
            ["a": 1],
            ["z": "x"],
            ["a": 1, "z": .object(["k": .array([1, "}", .object(["{": "]"])]), "\"": "\\"]), "m": 2.5],
            ["": .null, "dredge.before_sign_in": false, "dredge.x": true],
            ["dredge.before_sign_ia": "a\"}b", "dredge.before_sign_io": .array([]), "é": "ü", "\u{1}": "\n"],
            ["zz": .object([:]), "aa": .array([.array([])]), "mm": -0.000001, "nn": .string("nan")],
        ]
        for metadata in cases {
            var before = JSONWriter()
            before.writeObject(metadata)
            var expected = JSONWriter()
            var marked = metadata
            marked[LogStore.beforeSignInKey] = true
            expected.writeObject(marked)
            #expect(CanonicalObject.setting(LogStore.beforeSignInKey, to: "true", in: before.string) == expected.string, "\(before.string)")
        }
        for broken in ["", "[]", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1", "{\"a\":1}x", "{\"a\":1,}", "{\"a\":\"1}"] {
            #expect(CanonicalObject.setting(LogStore.beforeSignInKey, to: "true", in: broken) == nil, "\(broken)")
        }
    }

    @Test func exportedLinesOfAttributedRecordsAreCanonical() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let run = try store.register(testContext)
        store.enqueue(entry(0, uid: "", message: "launch", metadata: ["zeta": "last", "alpha": .object(["b": 2, "a": 1])], context: run))
        store.attribute(SignInAttribution(uid: "u-1", scope: .context(run), from: at(0), through: at(10)))
        try store.flush()
        let record = try #require(try store.records(matching: .all).first)
        #expect(record.metadataJSON == #"{"alpha":{"a":1,"b":2},"dredge.before_sign_in":true,"zeta":"last"}"#)
        #expect(try store.records(matching: LogFilter(text: #""dredge.before_sign_in":true"#)).count == 1)
    }
}
