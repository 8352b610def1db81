import DredgeDomain
import DredgeLogging
import DredgeStore
import DredgeTestSupport
import Foundation
import Logging
import Testing

/// The rewind buffer as an app uses it (#54): records below the loggers' levels kept in it and
/// not stored, until frozen (then stored, marked `dredge.rewound`, with their privacy applied);
/// swift-log's handler the same; a clean close lets it go; a run killed (SIGKILL) or crashed
/// (SIGSEGV) in a real process is found by the app's next run, which stores what the dead run's
/// buffer held.
@Suite struct RewindTests {
    @Test func recordsBelowTheLevelWaitInTheBufferUntilFrozen() throws {
        let dir = TempDir()
        let center = try LogCenter(
            path: dir.file("logs.sqlite"), context: .current(app: "oven", appVersion: "2.0"), rewind: RewindConfiguration(bytes: 256 * 1024, level: .debug))
        center.setUser("u-1")
        #expect(center.rewindLevel == .debug && center.run?.rewind != nil)
        let log = center.logger(type: .network, minimumLevel: .info)
        log.info("stored")
        log.debug("cache miss for \("alice@example.com", privacy: .private)", metadata: ["card": .private("4111"), "n": 2])
        log.trace("below the buffer's level too")
        try center.flush()
        #expect(try center.store.records(matching: LogFilter()).map(\.message) == ["stored"])

        // swift-log's handler: its level is lowered to the buffer's, what is below its own goes to the buffer.
        var handler = center.logHandler(label: "nio")
        handler.logLevel = .info
        #expect(handler.logLevel == .debug)
        let logger = Logger(label: "nio") { _ in handler }
        logger.debug("a channel opened")

        #expect(try center.freezeRewind() == 2)
        #expect(try center.freezeRewind() == 0, "frozen once")
        let records = try center.store.records(matching: LogFilter())
        #expect(records.map(\.message) == ["stored", "cache miss for <private>", "a channel opened"])
        let rewound = records.filter { $0.metadata["dredge.rewound"] == .bool(true) }
        #expect(rewound.count == 2 && rewound.allSatisfy { $0.level == .debug && $0.uid == "u-1" && $0.context == center.context })
        #expect(rewound[0].type == .network && rewound[0].metadata["card"] == .string("<private>") && rewound[0].metadata["n"] == .int(2))
        #expect(rewound[1].metadata["logger.label"] == .string("nio"))

        // A clean close: the run ends clean, its buffer is let go.
        let ring = center.store.rewindDirectory + "/" + (center.run?.rewind ?? "")
        #expect(FileManager.default.fileExists(atPath: ring))
        log.debug("never frozen")
        try center.close()
        #expect(!FileManager.default.fileExists(atPath: ring))
        try center.close()  // a second close is no error
        let store = try LogStore(path: dir.file("logs.sqlite"))
        #expect(try store.runs().map(\.end) == [.clean])
        #expect(try store.records(matching: LogFilter(text: "never frozen")).isEmpty)
        try store.close()
    }

    @Test func withoutABufferRecordsBelowTheLevelCostNothing() throws {
        let recorder = LogRecorder()
        let center = try LogCenter.recording(recorder)
        #expect(center.rewindLevel == nil && center.run != nil)
        let log = center.logger(minimumLevel: .info)
        var built = false
        log.debug("\(({ built = true; return "x" })())")
        #expect(!built, "the message of a call below the level is never built")
        #expect(try center.freezeRewind() == 0)
        try center.close()
    }

    /// Starts the crash child with `arguments` and returns once it has said "ready" (its first
    /// line). No backtrace is printed for a crash: it is the point.
    static func readyChild(_ arguments: [String]) throws -> Process {
        let (child, line) = try startCrashChild(arguments)
        #expect(line == "ready\n")
        return child
    }

    /// Runs the crash child to its end (`kill`: killed by this test with SIGKILL; `segv`: it
    /// crashes itself; `clean`: it closes), then opens the store as the app's next run does.
    func childRun(_ end: String, records: Int) throws -> (status: Process.TerminationReason, next: LogCenter, dir: TempDir) {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        let child = try Self.readyChild(["rewind", path, "\(records)", end])
        if end == "kill" { kill(child.processIdentifier, SIGKILL) }
        child.waitUntilExit()
        let next = try LogCenter(path: path, context: .current(app: "crash-child", appVersion: "3.1"))
        return (child.terminationReason, next, dir)
    }

    @Test(arguments: ["kill", "segv"])
    func theNextRunStoresWhatAKilledOrCrashedRunsBufferHeld(_ end: String) throws {
        let (status, next, dir) = try childRun(end, records: 500)
        defer { withExtendedLifetime(dir) {} }
        #expect(status == .uncaughtSignal)
        // The next run found it ended uncleanly and froze its buffer into the store.
        let unclean = try #require(next.uncleanEnds.first)
        #expect(next.uncleanEnds.count == 1 && unclean.end == .unclean && unclean.rewound == 500)
        try next.flush()
        let rewound = try next.store.records(matching: LogFilter(text: "rewound "))
        #expect(rewound.count == 500 && rewound.allSatisfy { $0.level == .debug && $0.uid == "crash-user" && $0.metadata["dredge.rewound"] == .bool(true) })
        #expect(Set(rewound.map(\.message)) == Set((0..<500).map { "rewound \($0)" }))
        let stored = try next.store.records(matching: LogFilter(text: "stored "))
        #expect(stored.count == 500)
        // It ended at its last record, stored or rewound.
        #expect(unclean.endedAt == (stored + rewound).map(\.timestamp).max())
        #expect(!FileManager.default.fileExists(atPath: next.store.rewindDirectory + "/" + unclean.id))
        // Marked once: another look finds nothing more.
        #expect(try next.store.markUncleanEnds().marked.isEmpty)
        try next.close()
    }

    /// Killed in the middle of appending (it logs as fast as it can): what the next run stores
    /// is a whole, gap-free run of the newest records, each as it was logged.
    @Test func aRunKilledMidAppendLeavesWholeRecords() throws {
        for round in 0..<3 {
            let dir = TempDir()
            let path = dir.file("logs.sqlite")
            let child = try Self.readyChild(["rewind-loop", path])
            // A different moment each round, while it appends.
            usleep(useconds_t(20_000 + round * 37_000))
            kill(child.processIdentifier, SIGKILL)
            child.waitUntilExit()
            let next = try LogCenter(path: path, context: .current(app: "crash-child"))
            let frozen = try next.store.records(matching: LogFilter(text: "loop "))
            let numbers = frozen.compactMap { Int($0.message.dropFirst("loop ".count)) }
            #expect(numbers.count == frozen.count && numbers.count > 100, "round \(round): \(numbers.count)")
            #expect(numbers == Array((numbers.first ?? 0)..<((numbers.first ?? 0) + numbers.count)), "round \(round): whole and in order")
            #expect(frozen.allSatisfy { $0.metadata["pad"] == .string(String(repeating: "p", count: (Int($0.message.dropFirst(5)) ?? 0) % 97)) })
            try next.close()
        }
    }

    /// A buffer that cannot be made (a file where its directory goes, another user's
    /// directory) does not stop the center: it logs on without one, and says why in the store.
    @Test func aBufferThatCannotBeMadeIsAWarningNotAFailure() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        try Data("in the way".utf8).write(to: URL(fileURLWithPath: path + "-rewind"))
        let center = try LogCenter(path: path, rewind: RewindConfiguration())
        #expect(center.rewindLevel == nil && center.run != nil)
        center.logger(minimumLevel: .info).debug("nowhere")
        try center.flush()
        let warnings = try center.store.records(matching: LogFilter(levels: [.warning]))
        #expect(warnings.contains { $0.message.hasPrefix("cannot keep a rewind buffer") }, "\(warnings.map(\.message))")
        try center.close()
    }

    /// Threads freezing at once while others log: every record is stored once.
    @Test func freezesAtOnceStoreEachRecordOnce() async throws {
        let recorder = LogRecorder()
        let center = try LogCenter.recording(recorder, rewind: RewindConfiguration(bytes: 4 << 20))
        let log = center.logger(minimumLevel: .info)
        try await withThrowingTaskGroup(of: Int.self) { group in
            for worker in 0..<4 {
                group.addTask {
                    var frozen = 0
                    for i in 0..<500 {
                        log.debug("w\(worker) \(i)")
                        if i % 50 == 0 { frozen += try center.freezeRewind() }
                    }
                    return frozen
                }
            }
            var total = 0
            for try await frozen in group { total += frozen }
            total += try center.freezeRewind()
            #expect(total == 2_000)
        }
        let stored = try center.store.records(matching: LogFilter())
        #expect(stored.count == 2_000 && Set(stored.map(\.message)).count == 2_000)
        try center.close()
    }

    @Test func aCleanRunLeavesNothingToFreeze() throws {
        let (status, next, dir) = try childRun("clean", records: 50)
        defer { withExtendedLifetime(dir) {} }
        #expect(status == .exit)
        #expect(next.uncleanEnds.isEmpty)
        #expect(try next.store.records(matching: LogFilter(text: "rewound ")).isEmpty)
        #expect(try next.store.runs().compactMap(\.end) == [.clean])
        #expect(try FileManager.default.contentsOfDirectory(atPath: next.store.rewindDirectory).isEmpty)
        try next.close()
    }
}
