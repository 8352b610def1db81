import DredgeDomain
import Foundation
import GRDB
import Testing
@testable import DredgeStore

/// Runs over the store (#54): started and ended cleanly; a run whose process is gone (or whose
/// pid now names another process, or from before the machine restarted) found and marked as
/// ended uncleanly once, at its last record, with its rewind buffer frozen into the store in the
/// same transaction and its file removed; a live run left alone.
@Suite struct StoreRunsTests {
    /// A run row as another process would have made it.
    static func insertRun(_ store: LogStore, id: String, context: ContextID, pid: Int32, boot: String, start: Int64, startedAt: Int64, rewind: String?) throws {
        try store.pool.write { db in
            try db.execute(
                sql: "INSERT INTO run (id, context_id, pid, boot, process_start, started_at, rewind) VALUES (?, ?, ?, ?, ?, ?, ?)",
                arguments: [id, context.rawValue, Int64(pid), boot, start, startedAt, rewind])
        }
    }

    /// The pid of a process that has exited.
    static func deadPID() throws -> Int32 {
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/true")
        try child.run()
        child.waitUntilExit()
        return child.processIdentifier
    }

    @Test func aRunIsMarkedStartedAndEndedCleanly() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        let run = try store.beginRun(context: ctx, keepsRewind: true, now: Timestamp(microseconds: testEpoch))
        #expect(run.rewind == run.id && run.pid == getpid() && run.end == nil)
        #expect(try store.runs() == [run])
        // Alive: not an unclean end.
        #expect(try store.markUncleanEnds().isEmpty)
        try store.endRun(run.id, now: Timestamp(microseconds: testEpoch + 5))
        let ended = try #require(try store.runs().first)
        #expect(ended.end == .clean && ended.endedAt?.microseconds == testEpoch + 5 && ended.rewind == nil)
        // Ended once: a second end changes nothing.
        try store.endRun(run.id, now: Timestamp(microseconds: testEpoch + 9))
        #expect(try store.runs().first?.endedAt?.microseconds == testEpoch + 5)
        try store.close()
    }

    @Test func aRunWhoseProcessIsGoneIsMarkedUncleanOnceWithItsRewindBufferFrozen() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        let boot = ProcessIdentity.current.boot
        // A process that logged two records, kept debug ones in its ring, and died.
        try Self.insertRun(store, id: String(repeating: "a", count: 32), context: ctx, pid: try Self.deadPID(), boot: boot, start: 1, startedAt: testEpoch, rewind: "ring-a")
        store.enqueue(entry(10, message: "stored 1", context: ctx))
        store.enqueue(entry(20, message: "stored 2", context: ctx))
        try store.flush()
        let ring = try RewindBuffer.create(at: store.rewindDirectory + "/ring-a", capacity: RewindBuffer.minimumCapacity)
        for i in 0..<3 {
            ring.append(RewindRecord(timestamp: Timestamp(microseconds: testEpoch + 11 + Int64(i)), level: .debug, type: .app, uid: "u1", message: "debug \(i)", metadataJSON: #"{"k":\#(i)}"#))
        }
        try ring.close()
        // Its pid now names a live process that is not it (this one, started at another time).
        try Self.insertRun(store, id: String(repeating: "b", count: 32), context: ctx, pid: getpid(), boot: boot, start: ProcessIdentity.current.start + 1, startedAt: testEpoch, rewind: nil)
        // From before the machine restarted.
        try Self.insertRun(store, id: String(repeating: "c", count: 32), context: ctx, pid: getpid(), boot: "another-boot", start: ProcessIdentity.current.start, startedAt: testEpoch, rewind: nil)
        // This process's own run: alive.
        let mine = try store.beginRun(context: ctx, keepsRewind: false)

        let marked = try store.markUncleanEnds()
        #expect(Set(marked.map(\.id)) == Set(["a", "b", "c"].map { String(repeating: $0, count: 32) }))
        let a = try #require(marked.first { $0.id.hasPrefix("a") })
        #expect(a.end == .unclean && a.rewound == 3 && a.rewind == nil)
        #expect(a.endedAt?.microseconds == testEpoch + 20, "at its last record")
        #expect(!FileManager.default.fileExists(atPath: store.rewindDirectory + "/ring-a"))
        let records = try store.records(matching: LogFilter())
        #expect(records.map(\.message) == ["stored 1", "debug 0", "debug 1", "debug 2", "stored 2"])
        let rewound = records.filter { $0.metadata["dredge.rewound"] == .bool(true) }
        #expect(rewound.map(\.level) == [.debug, .debug, .debug] && rewound.map { $0.metadata["k"] } == [.int(0), .int(1), .int(2)])
        #expect(rewound.allSatisfy { $0.context == ctx })

        // Found once: the next look finds nothing, freezes nothing again.
        #expect(try store.markUncleanEnds().isEmpty)
        #expect(try store.records(matching: LogFilter()).count == 5)
        let runs = try store.runs()
        #expect(runs.first { $0.id == mine.id }?.end == nil)
        #expect(runs.filter { $0.end == .unclean }.count == 3)
        try store.close()
    }

    @Test func aRunWhoseBufferIsGoneOrDamagedIsStillMarked() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        try Self.insertRun(store, id: String(repeating: "d", count: 32), context: ctx, pid: try Self.deadPID(), boot: ProcessIdentity.current.boot, start: 1, startedAt: testEpoch, rewind: "never-made")
        try Self.insertRun(store, id: String(repeating: "e", count: 32), context: ctx, pid: try Self.deadPID(), boot: ProcessIdentity.current.boot, start: 1, startedAt: testEpoch, rewind: "junk")
        try FileManager.default.createDirectory(atPath: store.rewindDirectory, withIntermediateDirectories: true)
        try Data(repeating: 7, count: 100_000).write(to: URL(fileURLWithPath: store.rewindDirectory + "/junk"))
        let marked = try store.markUncleanEnds()
        #expect(marked.map(\.rewound) == [0, 0] && marked.allSatisfy { $0.end == .unclean && $0.endedAt != nil })
        #expect(!FileManager.default.fileExists(atPath: store.rewindDirectory + "/junk"))
        try store.close()
    }
}
