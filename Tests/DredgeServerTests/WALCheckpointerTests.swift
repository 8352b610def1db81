import DredgeAdminAPI
import DredgeTestSupport
import Foundation
import GRDB
import Logging
import ServiceLifecycle
import Testing

@testable import DredgeServer

/// The server database's write-ahead log, checkpointed from a connection of its own
/// (``WALCheckpointer``) so the writer seldom stops to do it.
@Suite struct WALCheckpointerTests {
    let dir = TempDir()

    /// `n` audit entries, a transaction each (each adds a few pages to the log).
    static func auditWrites(_ pulls: SQLitePullQueue, _ n: Int, tag: String) async throws {
        for i in 0..<n { try await pulls.record(actor: "test", action: "test", detail: "\(tag) \(i)", at: Date()) }
    }

    @Test func aCheckpointCopiesTheWholeLogAndTheNextWriteStartsItAgain() async throws {
        let database = try ServerDatabase(directory: dir.path)
        let pulls = SQLitePullQueue(database)
        let checkpointer = try WALCheckpointer(database, logger: Logger(label: "test"))
        // Fewer pages than the writer's own checkpoint waits for (8,000).
        try await Self.auditWrites(pulls, 100, tag: "before")
        let first = try await checkpointer.checkpoint()
        #expect(first.logPages > 0)
        #expect(first.copied == first.logPages, "\(first)")
        // The log starts again from its beginning: it holds only the pages of the writes since.
        try await Self.auditWrites(pulls, 2, tag: "after")
        let second = try await checkpointer.checkpoint()
        #expect(second.logPages > 0 && second.logPages < first.logPages, "\(first) then \(second)")
        #expect(second.copied == second.logPages)
        // Everything written reads back (through the pool's own connections).
        #expect(try await pulls.audit(AuditQuery(limit: 1_000)).count == 102)
    }

    @Test func asAServiceItCheckpointsUntilTheServerStops() async throws {
        let database = try ServerDatabase(directory: dir.path)
        let pulls = SQLitePullQueue(database)
        let checkpointer = try WALCheckpointer(database, every: .milliseconds(10), logger: Logger(label: "test"))
        // Stopped gracefully at the end; a loop that does not end then fails the test.
        try await withStopping(RunningServices([checkpointer])) { _ in
            let deadline = ContinuousClock.now + .seconds(300)
            // The migrations' pages first, then the writes below: both checkpointed by the loop.
            while checkpointer.done.count < 1, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
            try await Self.auditWrites(pulls, 50, tag: "running")
            let before = checkpointer.done.count
            while !(checkpointer.done.count > before + 1 && checkpointer.done.last.map { $0.copied == $0.logPages } == true), ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(10))
            }
            let done = checkpointer.done
            #expect(done.count > before + 1, "\(done)")
            #expect(done.last.map { $0.copied == $0.logPages } == true, "\(done)")
        }
    }
}
