import Foundation
import GRDB
import Logging
import ServiceLifecycle
import Synchronization

/// Checkpoints the server database's write-ahead log from a connection of its own, every
/// 5 seconds, so the writer seldom has to.
///
/// SQLite checkpoints by itself inside the commit that takes the log past a size: that commit
/// copies the log into the database and syncs both files (3–7 ms an `fdatasync` here) while
/// it holds the one writer, and every write queued behind it waits: a pull being created, its
/// delivery, a chunk's progress. At SQLite's default size (1,000 pages), with pulls made and
/// answered against a fleet of 18,720 agents, that came every 1.5 s, and 11 of the 24 slow
/// command-latency samples of a run fell on one (`docs/benchmarks.md`). The server database
/// now lets the log grow to 8,000 pages (``ServerDatabase``), and this passive checkpoint,
/// which copies and syncs alongside the writer, comes first. Once the log is all copied, the
/// next write starts it again from the beginning. Checkpointing more often was measured too
/// (every 250 ms): the syncs then slowed the writer's own appends often enough to leave more
/// slow samples, not fewer. A checkpoint with nothing to copy writes nothing.
public final class WALCheckpointer: Service, Sendable {
    private let queue: DatabaseQueue
    let every: Duration
    private let logger: Logger
    private let passes = Mutex<(count: Int, last: (logPages: Int, copied: Int)?)>((0, nil))

    /// Checkpoints done, and the last one's figures (see ``checkpoint()``).
    public var done: (count: Int, last: (logPages: Int, copied: Int)?) { passes.withLock { $0 } }

    /// - Parameter every: how often to checkpoint. At the writes of a busy server (about 650
    ///   log pages a second with the fleet above) 5 s keeps the log well under 8,000 pages.
    public init(_ database: ServerDatabase, every: Duration = .seconds(5), logger: Logger) throws {
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        configuration.label = "dredge.checkpoint"
        queue = try DatabaseQueue(path: database.path, configuration: configuration)
        self.every = every
        self.logger = logger
    }

    /// One passive checkpoint: the log's pages and how many of them are in the database now.
    @discardableResult
    public func checkpoint() async throws -> (logPages: Int, copied: Int) {
        let (log, copied) = try await queue.writeWithoutTransaction { try $0.checkpoint(.passive) }
        passes.withLock { $0 = ($0.count + 1, (log, copied)) }
        return (log, copied)
    }

    /// Checkpoints every ``every`` until the server stops. A checkpoint that fails is logged
    /// (once a minute at most) and tried again at the next turn: the writer's own checkpoint
    /// still keeps the log bounded meanwhile.
    public func run() async throws {
        await Periodic.run(every: every, reportEvery: .seconds(60), { try await checkpoint() }) { error in
            logger.warning("cannot checkpoint the database's write-ahead log; the writer checkpoints it instead", metadata: ["error": "\(error)"])
        }
    }
}
