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
    static func insertRun(
        _ store: LogStore, id: String, context: ContextID, pid: Int32, boot: String, start: Int64, startedAt: Int64, rewind: String?,
        namespace: String = ProcessIdentity.current.namespace
    ) throws {
        try store.pool.write { db in
            try db.execute(
                sql: "INSERT INTO run (id, context_id, pid, pid_namespace, boot, process_start, started_at, rewind) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                arguments: [id, context.rawValue, Int64(pid), namespace, boot, start, startedAt, rewind])
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
        #expect(try store.markUncleanEnds().marked.isEmpty)
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
        // This process's own run: alive. A run of another pid namespace: not judged from here.
        let mine = try store.beginRun(context: ctx, keepsRewind: false)
        try Self.insertRun(store, id: String(repeating: "f", count: 32), context: ctx, pid: try Self.deadPID(), boot: boot, start: 1, startedAt: testEpoch, rewind: nil, namespace: "pid:[1]")

        let marked = try store.markUncleanEnds().marked
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
        #expect(try store.markUncleanEnds().marked.isEmpty)
        #expect(try store.records(matching: LogFilter()).count == 5)
        let runs = try store.runs()
        #expect(runs.first { $0.id == mine.id }?.end == nil)
        #expect(runs.first { $0.id.hasPrefix("f") }?.end == nil)
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
        let marked = try store.markUncleanEnds().marked
        #expect(marked.map(\.rewound) == [0, 0] && marked.allSatisfy { $0.end == .unclean && $0.endedAt != nil })
        #expect(!FileManager.default.fileExists(atPath: store.rewindDirectory + "/junk"))
        try store.close()
    }

    /// Another user's ring is never read nor removed; a ring no open run names (left by a kill
    /// between a run's end and its file's removal) is removed.
    @Test func anotherUsersRingIsLeftAloneAndAnOrphanIsRemoved() throws {
        try #require(geteuid() == 0, "needs root to give a file to another user")
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(testContext)
        let ring = try RewindBuffer.create(at: store.rewindDirectory + "/theirs", capacity: RewindBuffer.minimumCapacity)
        ring.append(RewindRecord(timestamp: Timestamp(microseconds: testEpoch), level: .debug, type: .app, uid: "u1", message: "forged"))
        try ring.close()
        #expect(chown(store.rewindDirectory + "/theirs", 12_345, 12_345) == 0)
        try Self.insertRun(store, id: String(repeating: "1", count: 32), context: ctx, pid: try Self.deadPID(), boot: ProcessIdentity.current.boot, start: 1, startedAt: testEpoch, rewind: "theirs")
        try Data(repeating: 0, count: 10).write(to: URL(fileURLWithPath: store.rewindDirectory + "/orphan"))
        let found = try store.markUncleanEnds()
        #expect(found.marked.map(\.rewound) == [0] && found.problems.isEmpty, "\(found.problems)")
        #expect(try store.records(matching: LogFilter()).isEmpty, "nothing of another user's file is stored")
        #expect(FileManager.default.fileExists(atPath: store.rewindDirectory + "/theirs"))
        #expect(!FileManager.default.fileExists(atPath: store.rewindDirectory + "/orphan"))
        try store.close()
    }

    /// Two processes looking at once: one marks the run and stores its buffer, the other finds it marked.
    @Test func twoSweepersStoreADeadRunsBufferOnce() async throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        let first = try LogStore(path: path), second = try LogStore(path: path)
        let ctx = try first.register(testContext)
        let ring = try RewindBuffer.create(at: first.rewindDirectory + "/dead", capacity: 1 << 20)
        for i in 0..<2_500 {
            ring.append(RewindRecord(timestamp: Timestamp(microseconds: testEpoch + Int64(i)), level: .debug, type: .app, uid: "u1", message: "d \(i)"))
        }
        try ring.close()
        try Self.insertRun(first, id: String(repeating: "2", count: 32), context: ctx, pid: try Self.deadPID(), boot: ProcessIdentity.current.boot, start: 1, startedAt: testEpoch, rewind: "dead")
        async let a = Task.detached { try first.markUncleanEnds().marked.count }.value
        async let b = Task.detached { try second.markUncleanEnds().marked.count }.value
        #expect(try await a + b == 1)
        #expect(try first.records(matching: LogFilter()).count == 2_500)
        try first.close()
        try second.close()
    }
}
