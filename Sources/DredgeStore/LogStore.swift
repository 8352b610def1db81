import DredgeDomain
import Foundation
import GRDB
import Synchronization

/// The client's local, bounded log store.
///
/// One `LogStore` per database file and process. Log calls only enqueue (``enqueue(_:)``); a
/// writer thread batches entries into transactions; ``flush()`` waits until everything enqueued
/// before it is durable. Queries stream in time order off an index. Retention keeps the store
/// within its age and size limits and records what it deleted.
///
/// The store is safe to use from any thread.
public final class LogStore: Sendable {
    public let path: String
    public let configuration: StoreConfiguration
    /// A random 32-byte key made when the store is created; stable for this install. The
    /// logging API keys its hashed-privacy values with it.
    public let installKey: [UInt8]
    /// The retention policy the store recorded once this process opened it (``StoredRetention``):
    /// none, or one that does not read back, means nothing is deleted by age and the store is
    /// held only under this configuration's size (`dredge-agent stats` says so). Retention reads
    /// it again in every transaction that deletes.
    public let retentionAtOpen: StoredRetention.Recorded
    /// The policy this open replaced, when ``StoreConfiguration/retention`` was set to another
    /// one than the store recorded: a change someone should hear of (`LogCenter` logs it).
    public let replacedRetention: RetentionPolicy?

    let pool: DatabasePool
    private let queue: WriteQueue
    private let writer: BatchWriter?
    private let isClosed = Mutex(false)

    /// Opens (creating if needed) the store at `path`, runs migrations, and starts the writer,
    /// which runs retention before anything else.
    ///
    /// - Throws: ``StoreError`` with code `.notADatabase` if the file is not a SQLite database
    ///   (it is left untouched), `.cannotOpen` or `.readOnly` if it cannot be created or written.
    public init(path: String, configuration: StoreConfiguration = StoreConfiguration()) throws {
        self.path = path
        self.configuration = configuration
        if let problem = configuration.problem { throw StoreError(code: .invalidConfiguration, message: problem, path: path) }
        let directory = (path as NSString).deletingLastPathComponent
        if !configuration.readOnly, !directory.isEmpty, !FileManager.default.fileExists(atPath: directory) {
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            } catch {
                throw StoreError(code: .cannotOpen, message: "cannot create directory: \(error.localizedDescription)", path: path)
            }
        }
        do {
            pool = try DatabasePool(path: path, configuration: Self.grdbConfiguration(configuration))
            if !configuration.readOnly {
                try StoreSchema.migrator.migrate(pool)
            }
            if configuration.readOnly {
                (installKey, retentionAtOpen) = try pool.read { db in
                    guard try db.tableExists("meta") else { return ([], .none) }
                    return (try Self.installKey(db) ?? [], try StoredRetention.look(db))
                }
                replacedRetention = nil
            } else {
                // One transaction: whether this open created the store decides its retention.
                (installKey, retentionAtOpen, replacedRetention) = try pool.write { db in
                    let existing = try Self.installKey(db)
                    let key = try existing ?? Self.makeInstallKey(db)
                    let (recorded, replaced) = try StoredRetention.settle(db, configuration: configuration, created: existing == nil, now: configuration.now())
                    return (key, recorded, replaced)
                }
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        queue = WriteQueue(capacity: configuration.queueCapacity, policy: configuration.overflowPolicy, linger: configuration.writeLinger, lingerBelow: configuration.lingerBelow)
        if configuration.readOnly {
            queue.close()
            writer = nil
        } else {
            let writer = BatchWriter(
                queue: queue, pool: pool, configuration: configuration, path: path, maxBytes: retentionAtOpen.stored?.policy.maxBytes ?? configuration.retention.maxBytes)
            self.writer = writer
            writer.start()
        }
    }

    deinit {
        if !isClosed.withLock({ $0 }) {
            queue.close()
            writer?.join()
        }
    }

    private static func grdbConfiguration(_ store: StoreConfiguration) -> Configuration {
        var config = Configuration()
        config.label = "dredge.store"
        config.readonly = store.readOnly
        config.busyMode = .timeout(10)
        config.foreignKeysEnabled = false
        config.maximumReaderCount = 4
        let durability = store.durability
        let maxPageCount = store.maxPageCount
        config.prepareDatabase { db in
            // Readers of a pool get a read-only copy of this configuration: only the writer
            // connection sets the pragmas that write.
            try db.execute(sql: "PRAGMA synchronous = \(durability == .full ? "FULL" : "NORMAL")")
            if !db.configuration.readonly {
                // Must precede the first table; on an existing store it changes nothing.
                try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL")
                // Keep the WAL small: truncate it back to 4 MiB after checkpoints.
                try db.execute(sql: "PRAGMA journal_size_limit = 4194304")
                if let maxPageCount { try db.execute(sql: "PRAGMA max_page_count = \(maxPageCount)") }
            }
        }
        return config
    }

    private static func installKey(_ db: Database) throws -> [UInt8]? {
        guard try db.tableExists("meta") else { return nil }
        return try Data.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'install_key'").map { Array($0) }
    }

    private static func makeInstallKey(_ db: Database) throws -> [UInt8] {
        if let key = try installKey(db) { return key }
        var rng = SystemRandomNumberGenerator()
        let key = (0..<32).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
        try db.execute(sql: "INSERT INTO meta (key, value) VALUES ('install_key', ?)", arguments: [Data(key)])
        return key
    }

    // MARK: Writing

    /// Hands an entry to the writer. Never blocks unless the overflow policy is `.block` and the
    /// queue is full. Returns false if the entry was dropped (queue full, or store closed); every
    /// drop is counted in ``statistics()``.
    @discardableResult
    public func enqueue(_ entry: LogEntry) -> Bool { queue.enqueue(entry) }

    /// Queues ``SignInAttribution``: once every entry enqueued before this call is stored, the
    /// anonymous records it selects are given its uid. ``flush()`` waits for it and throws if it
    /// failed. Returns false if the store is closed.
    @discardableResult
    public func attribute(_ attribution: SignInAttribution) -> Bool { queue.attribute(attribution) }

    /// Blocks until every entry enqueued before this call is committed (and every attribution
    /// queued before it has run).
    ///
    /// - Throws: ``StoreError`` (`.diskFull` or `.writeFailed`) if entries enqueued since the
    ///   last flush could not be written. Each failure is reported to one flush only.
    public func flush() throws { try queue.flush() }

    /// The async form of ``flush()``; it suspends rather than blocking a thread.
    public func flush() async throws { try await queue.flush() }

    /// Flushes, stops the writer and closes the database. Later enqueues are dropped and counted.
    public func close() throws {
        let already = isClosed.withLock { closed in
            defer { closed = true }
            return closed
        }
        guard !already else { return }
        queue.close()
        writer?.join()
        // Leave a single self-contained file behind: fold the WAL back in.
        if !configuration.readOnly { _ = try? pool.writeWithoutTransaction { try $0.checkpoint(.truncate) } }
        do { try pool.close() } catch { throw StoreError.wrap(error, path: path) }
    }

    /// The id of a context row, inserting it the first time it is seen.
    public func register(_ context: LogContext) throws -> ContextID {
        let fields = context.canonicalJSON
        do {
            return try pool.write { db in
                if let id = try Int64.fetchOne(db, sql: "SELECT id FROM context WHERE fields = ?", arguments: [fields]) {
                    return ContextID(rawValue: id)
                }
                try db.execute(sql: "INSERT INTO context (fields, created_at) VALUES (?, ?)", arguments: [fields, configuration.now().microseconds])
                return ContextID(rawValue: db.lastInsertedRowID)
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Context rows by id.
    public func contexts(_ ids: some Sequence<ContextID>) throws -> [ContextID: LogContext] {
        let list = Array(Set(ids.map(\.rawValue)))
        guard !list.isEmpty else { return [:] }
        return try read { db in
            var result: [ContextID: LogContext] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT id, fields FROM context WHERE id IN (\(list.map { _ in "?" }.joined(separator: ",")))", arguments: StatementArguments(list)) {
                let fields: String = row[1]
                result[ContextID(rawValue: row[0])] = try JSONReading.decode(LogContext.self, from: fields)
            }
            return result
        }
    }

    /// The context of the newest record (by time), or nil for an empty store: how the device
    /// names itself to the server (its host, app, app version and labels).
    public func newestContext() throws -> LogContext? {
        try read { db in
            guard let id = try Int64.fetchOne(db, sql: "SELECT context_id FROM log ORDER BY ts DESC, id DESC LIMIT 1"),
                let fields = try String.fetchOne(db, sql: "SELECT fields FROM context WHERE id = ?", arguments: [id])
            else { return nil }
            return try JSONReading.decode(LogContext.self, from: fields)
        }
    }

    // MARK: Reading

    /// Calls `body` with every record matching `filter`, in time order (timestamp, then id),
    /// from one consistent snapshot. Memory does not grow with the number of records: rows are
    /// read one at a time off an index. Throwing from `body` stops the iteration.
    public func forEachRecord(matching filter: LogFilter, _ body: (LogRecord) throws -> Void) throws {
        let query = LogQuery(filter: filter)
        try read { db in
            let statement = try db.cachedStatement(sql: query.sql)
            let rows = try Row.fetchCursor(statement, arguments: query.arguments)
            while let row = try rows.next() {
                try body(Self.record(row))
            }
        }
    }

    /// The matching records in time order, at most `limit` of them. For small results; use
    /// ``forEachRecord(matching:_:)`` to stream.
    public func records(matching filter: LogFilter, limit: Int? = nil) throws -> [LogRecord] {
        let query = LogQuery(filter: filter, limit: limit)
        return try read { db in
            try Row.fetchAll(db, sql: query.sql, arguments: query.arguments).map(Self.record)
        }
    }

    /// At most `limit` records stored after the row id `cursor` that match `filter`, in the
    /// order the store took them (a live tail reads on from where it was; Protocol § 20). Only
    /// the rows after the cursor are read, whatever the store holds.
    public func records(after cursor: Int64, matching filter: LogFilter, limit: Int) throws -> [LogRecord] {
        let query = LogQuery(filter: filter, after: cursor, limit: limit)
        return try read { db in
            try Row.fetchAll(try db.cachedStatement(sql: query.sql), arguments: query.arguments).map(Self.record)
        }
    }

    /// The newest record's row id (0 for an empty store): where a live tail that starts now
    /// reads on from.
    public func lastRowID() throws -> Int64 {
        try read { db in try Int64.fetchOne(db, sql: "SELECT max(id) FROM log") ?? 0 }
    }

    /// SQLite's query plan for the read of ``records(after:matching:limit:)``.
    public func queryPlan(after cursor: Int64, for filter: LogFilter) throws -> [String] {
        let query = LogQuery(filter: filter, after: cursor, limit: 1)
        return try read { db in
            try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + query.sql, arguments: query.arguments).map { $0["detail"] as String }
        }
    }

    public func count(matching filter: LogFilter) throws -> Int {
        let query = LogQuery(filter: filter, select: "count(*)", ordered: false)
        return try read { db in try Int.fetchOne(db, sql: query.sql, arguments: query.arguments) ?? 0 }
    }

    /// SQLite's query plan for `filter` (the `detail` column of `EXPLAIN QUERY PLAN`).
    public func queryPlan(for filter: LogFilter) throws -> [String] {
        let query = LogQuery(filter: filter)
        return try read { db in
            try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + query.sql, arguments: query.arguments).map { $0["detail"] }
        }
    }

    /// Losses (retention, a full queue, failed writes) whose time range overlaps `since..<until`.
    public func losses(since: Timestamp? = nil, until: Timestamp? = nil) throws -> [LossRecord] {
        try read { db in try LossTable.fetch(db: db, overlapping: since, until) }
    }

    private static func record(_ row: Row) -> LogRecord {
        LogRecord(
            id: row[0],
            timestamp: Timestamp(microseconds: row[1]),
            level: LogLevel(rawValue: row[2]) ?? .info,
            type: LogType(unchecked: row[3]),
            uid: row[4],
            message: row[5],
            metadataJSON: row[6] ?? "{}",
            context: ContextID(rawValue: row[7]))
    }

    private func read<T>(_ body: (Database) throws -> T) throws -> T {
        do { return try pool.read(body) } catch let error as DatabaseError { throw StoreError.wrap(error, path: path) }
    }

    // MARK: Maintenance

    /// Runs a retention pass now (it also runs at open and periodically on the writer thread).
    @discardableResult
    public func runRetention() throws -> RetentionReport {
        guard let writer else { throw StoreError(code: .readOnly, message: "store opened read-only", path: path) }
        do { return try writer.retentionPass() } catch { throw StoreError.wrap(error, path: path) }
    }

    public func statistics() throws -> StoreStatistics {
        let counters = queue.snapshot
        let (count, oldest, newest, retention) = try read { db -> (Int64, Int64?, Int64?, StoredRetention.Recorded) in
            let row = try Row.fetchOne(db, sql: "SELECT count(*), min(ts), max(ts) FROM log")
            return (row?[0] ?? 0, row?[1], row?[2], try StoredRetention.look(db))
        }
        return StoreStatistics(
            recordCount: count,
            oldest: oldest.map(Timestamp.init(microseconds:)),
            newest: newest.map(Timestamp.init(microseconds:)),
            bytesOnDisk: Retention.bytesOnDisk(path),
            queueDepth: counters.depth,
            accepted: counters.accepted,
            written: counters.finished - counters.failedWrites,
            droppedQueueFull: counters.droppedQueueFull,
            droppedClosed: counters.droppedClosed,
            failedWrites: counters.failedWrites,
            retentionFailures: writer?.retentionFailures ?? 0,
            lastRetention: writer?.lastRetention,
            retention: retention,
            sizeWithoutPolicy: configuration.retention.maxBytes)
    }
}

/// A snapshot of the store's state and counters since it was opened.
public struct StoreStatistics: Sendable, Hashable {
    public var recordCount: Int64
    public var oldest: Timestamp?
    public var newest: Timestamp?
    /// Database file plus WAL.
    public var bytesOnDisk: Int64
    public var queueDepth: Int
    public var accepted: UInt64
    public var written: UInt64
    /// Log calls dropped because the queue was full (policy `.dropNewest`).
    public var droppedQueueFull: UInt64
    /// Log calls made after ``LogStore/close()``.
    public var droppedClosed: UInt64
    /// Records accepted but not written (disk full, I/O error).
    public var failedWrites: UInt64
    public var retentionFailures: UInt64
    public var lastRetention: RetentionReport?
    /// The retention policy the store records now: none, or one that does not read back, means
    /// nothing is deleted by age until its app records one, and the store is held under
    /// ``sizeWithoutPolicy``.
    public var retention: StoredRetention.Recorded
    /// The size this process holds a store that records no policy under.
    public var sizeWithoutPolicy: Int64
}

extension LogStore {
    /// The uids (non-empty) with records at or after `since`, in byte order, at most
    /// ``DomainLimits/activeUIDs``: what a heartbeat reports as the users active on this device.
    /// Read from ``users()``; a caller that needs both reads that once and filters it.
    public func activeUIDs(since: Timestamp) throws -> [String] {
        Self.activeUIDs(in: try users(), since: since)
    }

    /// ``activeUIDs(since:)`` from a ``users()`` already read.
    public static func activeUIDs(in users: [(uid: String, lastSeen: Timestamp)], since: Timestamp) -> [String] {
        Array(users.filter { $0.lastSeen >= since }.map(\.uid).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }.prefix(DomainLimits.activeUIDs))
    }

    /// Every non-empty uid the store holds records of, whatever their age, with the time of its
    /// newest record: the most recently seen first (ties by uid). What the agent's user report
    /// is made from.
    public func users() throws -> [(uid: String, lastSeen: Timestamp)] {
        do {
            return try pool.read { db in
                // A loose index scan over log_by_uid_ts: one seek per distinct uid, then one for
                // its newest record, instead of reading every record.
                try Row.fetchAll(
                    db,
                    sql: """
                        WITH RECURSIVE u(uid) AS (
                            SELECT min(uid) FROM log
                            UNION ALL
                            SELECT (SELECT min(uid) FROM log WHERE uid > u.uid) FROM u WHERE u.uid IS NOT NULL
                        )
                        SELECT uid, (SELECT max(ts) FROM log WHERE log.uid = u.uid) AS last FROM u
                        WHERE uid IS NOT NULL AND uid != ''
                        ORDER BY last DESC, uid
                        """
                ).compactMap { row in
                    // Read as optionals: GRDB traps on a NULL read as a non-optional.
                    guard let uid = row["uid"] as String?, let last = row["last"] as Int64? else { return nil }
                    return (uid: uid, lastSeen: Timestamp(microseconds: last))
                }
            }
        } catch let error as DatabaseError {
            throw StoreError.wrap(error, path: path)
        }
    }
}
