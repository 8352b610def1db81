@testable import DredgeStore
import DredgeDomain
import Foundation
import GRDB
import Testing

@Suite struct FaultTests {
    @Test func aFileThatIsNotSQLiteIsRefusedAndLeftUntouched() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        let garbage = Data((0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        try garbage.write(to: URL(fileURLWithPath: path))
        let error = #expect(throws: StoreError.self) { try LogStore(path: path) }
        #expect(error?.code == .notADatabase)
        #expect(error?.path == path)
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == garbage)
    }

    @Test func aDamagedStoreGivesATypedErrorNotACrash() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        do {
            let store = try LogStore(path: path)
            let ctx = try store.register(testContext)
            for i in 0..<5_000 { store.enqueue(entry(Int64(i), message: String(repeating: "x", count: 100), context: ctx)) }
            try store.close()
        }
        // Keep the header page, scribble over every page after it.
        try? FileManager.default.removeItem(atPath: path + "-wal")
        try? FileManager.default.removeItem(atPath: path + "-shm")
        let size = try #require(FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try handle.seek(toOffset: 4096)
        try handle.write(contentsOf: Data(repeating: 0xA5, count: size - 4096))
        try handle.close()
        do {
            let store = try LogStore(path: path)
            let error = #expect(throws: StoreError.self) { _ = try store.count(matching: .all) }
            #expect(error?.code == .notADatabase)
        } catch let error as StoreError {
            #expect(error.code == .notADatabase)
        }
    }

    @Test func aDirectoryThatCannotBeWrittenGivesCannotOpen() throws {
        // /proc refuses new files even to root, so this holds whoever runs the tests.
        let error = #expect(throws: StoreError.self) { try LogStore(path: "/proc/dredge-test/logs.sqlite") }
        #expect(error?.code == .cannotOpen)
        let direct = #expect(throws: StoreError.self) { try LogStore(path: "/proc/dredge-test.sqlite") }
        #expect(direct?.code == .cannotOpen)
    }

    @Test func aPathThatIsADirectoryGivesCannotOpen() throws {
        let dir = TempDir()
        let error = #expect(throws: StoreError.self) { try LogStore(path: dir.path) }
        #expect(error?.code == .cannotOpen)
    }

    /// A store on a file system that became read-only (remounted after a disk error, say).
    /// Needs permission to mount a tmpfs, which the test machine's root has.
    @Test(.enabled(if: TmpfsMount.isSupported)) func aReadOnlyStoreIsRefusedAndKeepsItsRecords() throws {
        let mount = try TmpfsMount()
        defer { mount.remove() }
        let path = mount.path + "/logs.sqlite"
        do {
            let store = try LogStore(path: path)
            let ctx = try store.register(testContext)
            for i in 0..<100 { store.enqueue(entry(Int64(i), context: ctx)) }
            try store.close()
        }
        try mount.remount(readOnly: true)
        let error = #expect(throws: StoreError.self) { try LogStore(path: path) }
        #expect(error?.code == .readOnly || error?.code == .cannotOpen)
        try mount.remount(readOnly: false)
        #expect(try LogStore(path: path).count(matching: .all) == 100)
    }

    @Test func aFullDiskFailsTheBatchButKeepsEverythingStoredBefore() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        var config = StoreConfiguration()
        config.maxPageCount = 64  // 256 KiB at 4 KiB pages
        let store = try LogStore(path: path, configuration: config)
        let ctx = try store.register(testContext)
        for i in 0..<200 { store.enqueue(entry(Int64(i), message: "kept \(i)", context: ctx)) }
        try store.flush()

        let big = String(repeating: "y", count: 2_000)
        for i in 0..<2_000 { store.enqueue(entry(Int64(1_000 + i), message: big, context: ctx)) }
        let error = #expect(throws: StoreError.self) { try store.flush() }
        #expect(error?.code == .diskFull)
        let stats = try store.statistics()
        #expect(stats.failedWrites > 0)
        #expect(stats.failedWrites + stats.written == stats.accepted)
        // The failure was reported once.
        try store.flush()

        // The store still works once there is room, and records what it could not keep. Room is
        // made explicitly: how full the failed run left the pages depends on how the writer
        // happened to batch it, so a record may or may not still fit without it.
        try store.pool.write { try $0.execute(sql: "PRAGMA max_page_count = 1000000") }
        store.enqueue(entry(10_000, message: "after", context: ctx))
        try store.flush()
        let losses = try store.losses().filter { $0.reason == .writeFailed }
        #expect(losses.reduce(0) { $0 + $1.count } == Int64(stats.failedWrites))
        try store.close()

        let reopened = try LogStore(path: path)
        let messages = try reopened.records(matching: LogFilter(until: Timestamp(microseconds: testEpoch + 200))).map(\.message)
        #expect(messages == (0..<200).map { "kept \($0)" })
        #expect(try reopened.records(matching: LogFilter(text: "after")).count == 1)
    }

    @Test func overLongValuesAreTruncatedAndMarked() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        let limits = StoreLimits()
        let accented = String(repeating: "é", count: 40_000)  // 80,000 bytes, two per character
        var manyKeys: LogMetadata = [:]
        for i in 0..<100 { manyKeys[String(format: "k%03d", i)] = .string(String(repeating: "v", count: 1_000)) }
        store.enqueue(entry(1, uid: String(repeating: "u", count: 1_000), message: accented, metadata: ["big": .string(String(repeating: "z", count: 20_000))], context: ctx))
        store.enqueue(entry(2, message: "many", metadata: manyKeys, context: ctx))
        try store.flush()
        let records = try store.records(matching: .all)

        let message = records[0].message
        #expect(message.utf8.count <= limits.maxMessageBytes)
        #expect(message.hasSuffix("bytes]"))
        #expect(message.contains("…[truncated "))
        #expect(!message.contains("\u{FFFD}"), "no character split")
        #expect(records[0].uid.utf8.count == limits.maxUIDBytes)
        guard case .string(let big)? = records[0].metadata["big"] else { Issue.record("no big"); return }
        #expect(big.utf8.count <= limits.maxMetadataValueBytes)
        #expect(big.hasSuffix("bytes]"))

        #expect(records[1].metadataJSON.utf8.count <= limits.maxMetadataBytes)
        let kept = records[1].metadata
        guard case .int(let omitted)? = kept["dredge.truncated"] else { Issue.record("no marker"); return }
        #expect(omitted > 0)
        #expect(Int(omitted) + kept.count - 1 == 100)
        #expect(kept["k000"] != nil, "keys kept in sorted order")
    }

    @Test func aFullQueueDropsNewestCountsAndRecordsTheLoss() throws {
        let dir = TempDir()
        var config = StoreConfiguration()
        config.queueCapacity = 100
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
        let ctx = try store.register(testContext)
        try store.flush()
        let gate = WriterGate(store)
        for i in 0..<300 { store.enqueue(entry(Int64(i), context: ctx)) }
        gate.open()
        try store.flush()
        let stats = try store.statistics()
        #expect(stats.droppedQueueFull >= 100)
        #expect(stats.accepted + stats.droppedQueueFull == 300)
        #expect(stats.recordCount == Int64(stats.accepted))
        let losses = try store.losses().filter { $0.reason == .queueFull }
        #expect(losses.reduce(0) { $0 + $1.count } == Int64(stats.droppedQueueFull))
        // The losses span exactly the records that are missing. (Which ones those are depends
        // on when the writer took its first batch off the queue, before the gate held it: on a
        // busy machine it may take one mid-way and let later records in.)
        let kept = Set(try store.records(matching: .all).map(\.timestamp.microseconds))
        let missing = (0..<Int64(300)).map { testEpoch + $0 }.filter { !kept.contains($0) }
        #expect(losses.map(\.first).min() == missing.first.map(Timestamp.init(microseconds:)))
        #expect(losses.map(\.last).max() == missing.last.map(Timestamp.init(microseconds:)))
    }

    @Test func theBlockingPolicyWaitsForRoomAndLosesNothing() throws {
        let dir = TempDir()
        var config = StoreConfiguration()
        config.queueCapacity = 100
        config.overflowPolicy = .block
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
        let ctx = try store.register(testContext)
        try store.flush()
        let gate = WriterGate(store)
        let producerDone = DispatchSemaphore(value: 0)
        Thread {
            for i in 0..<1_000 { store.enqueue(entry(Int64(i), context: ctx)) }
            producerDone.signal()
        }.start()
        // Wait until the queue is full: the producer must then be waiting, not dropping.
        while (try? store.statistics().queueDepth) != 100 { usleep(1_000) }
        #expect(producerDone.wait(timeout: .now()) == .timedOut)
        gate.open()
        producerDone.wait()
        try store.flush()
        let stats = try store.statistics()
        #expect(stats.recordCount == 1_000)
        #expect(stats.droppedQueueFull == 0)
    }
}

/// Holds the store's write lock from another thread, so the writer thread stalls and the queue
/// fills up, until `open()`.
final class WriterGate: @unchecked Sendable {
    private let release = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)

    init(_ store: LogStore) {
        let entered = DispatchSemaphore(value: 0)
        Thread { [release, finished] in
            try? store.pool.writeWithoutTransaction { _ in
                entered.signal()
                release.wait()
            }
            finished.signal()
        }.start()
        entered.wait()
    }

    func open() {
        release.signal()
        finished.wait()
    }
}
