import GRDB
import Synchronization

/// Where a database reports how long its calls take and which fail: silent until the running
/// server attaches its ``ServerMetrics`` (`dredge-server` tools that open the database measure
/// nothing). PostgreSQL reports each transaction (``PostgresDatabase``); SQLite each statement,
/// as SQLite's profiler times it, on the writer's connection as a write and on the readers' as
/// a read, and its errors through SQLite's error log (``installSQLiteErrorLog()``: the whole
/// process's, the search index's database included).
public final class DatabaseMeter: Sendable {
    private let metrics = Mutex<ServerMetrics?>(nil)

    public init() {}

    public func attach(_ metrics: ServerMetrics) {
        self.metrics.withLock { $0 = metrics }
        if SQLiteErrors.installed.load(ordering: .relaxed) {
            metrics.addSampler(.init("sqlite errors") { [weak metrics] in
                guard let metrics else { return }
                let count = SQLiteErrors.count.load(ordering: .relaxed)
                metrics.sqliteErrorsSeen(count)
            })
        }
    }

    func record(_ operation: ServerMetrics.DatabaseOperation, took duration: Duration, failed: Bool = false) {
        metrics.withLock { $0 }?.databaseCall(operation, took: duration, failed: failed)
    }

    /// Times each statement of a SQLite connection (installed when the connection opens).
    func profile(_ db: Database) {
        let operation: ServerMetrics.DatabaseOperation = db.configuration.readonly ? .read : .write
        db.trace(options: .profile) { [weak self] event in
            guard let self, case .profile(_, let seconds) = event else { return }
            self.record(operation, took: .nanoseconds(Int64(seconds * 1e9)))
        }
    }

    /// Counts SQLite's errors (process-wide: SQLite has one error log). Must run before the
    /// process opens any SQLite database, else it does nothing; the server's `run` calls it
    /// first. Notices and warnings (a log recovered at open) are not errors.
    public static func installSQLiteErrorLog() {
        guard !SQLiteErrors.installed.exchange(true, ordering: .relaxed) else { return }
        Database.logError = { code, _ in
            let primary = code.primaryResultCode
            // Not failures: notices and warnings, a read cancelled on purpose, a statement
            // prepared again after a schema change.
            guard ![.SQLITE_NOTICE, .SQLITE_WARNING, .SQLITE_INTERRUPT, .SQLITE_SCHEMA].contains(primary) else { return }
            SQLiteErrors.count.add(1, ordering: .relaxed)
        }
    }
}

/// SQLite's error log, counted for the whole process.
enum SQLiteErrors {
    static let installed = Atomic<Bool>(false)
    static let count = Atomic<Int>(0)
}
