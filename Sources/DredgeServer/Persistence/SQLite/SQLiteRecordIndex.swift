import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import Foundation
import GRDB
import GRDBSQLite

/// The ``RecordIndex`` of the embedded back end: `index.sqlite` in the data directory, apart
/// from `dredge.sqlite` so that indexing a large pull never holds up the listener's writes.
///
/// Tables: `source` (one per landed pull-and-agent or feedback, with its state), `context`
/// (the manifest's contexts of each source), `record` (ids never reused; time in µs, uid,
/// level number, type, message, metadata as the line wrote it) with indexes on time, uid and time, and source and time, and
/// `record_text`, a contentless FTS5 table over `record`'s message, metadata and uid (as one
/// word): filled after each block, emptied of a record by a trigger when it is deleted;
/// tokenizer `unicode61` without diacritics.
///
/// Lines are read by ``RecordLine``: a line that is not JSON, or lacks a `ts` of the payload's
/// form, a known `level` or a `type`, inserts nothing and is counted. WAL, `synchronous=NORMAL`:
/// the index can always be built again from the files.
public final class SQLiteRecordIndex: RecordIndex, Sendable {
    public static let fileName = "index.sqlite"
    let pool: DatabasePool
    public let path: String
    /// How many records a metadata search reads in time order before it turns to the
    /// full-text index (``SQLRecordQuery/scanFirst``).
    let scanLimit: Int

    public init(directory: String, scanLimit: Int = SQLRecordQuery.defaultScanLimit) throws {
        self.scanLimit = scanLimit
        path = directory + "/" + Self.fileName
        pool = try ServerDatabase.openPool(path)
        try Self.migrator.migrate(pool)
    }

    /// Opens the index; one that is damaged or not a database is moved aside
    /// (`index.sqlite.damaged-<time>`, with its `-wal` and `-shm`) and a new one made, which
    /// the ``Indexer`` fills again from the files. Other failures (permissions, a full disk) throw.
    public static func openOrRebuild(directory: String) throws -> SQLiteRecordIndex {
        do {
            return try SQLiteRecordIndex(directory: directory)
        } catch let error as DatabaseError where [.SQLITE_CORRUPT, .SQLITE_NOTADB].contains(error.resultCode.primaryResultCode) {
            let path = directory + "/" + fileName
            let aside = path + ".damaged-\(Int(Date().timeIntervalSince1970))"
            for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: path + suffix) {
                guard rename(path + suffix, aside + suffix) == 0 else {
                    throw DeploymentError("\(path) is damaged (\(error)) and cannot be moved aside: \(String(cString: strerror(errno)))")
                }
            }
            return try SQLiteRecordIndex(directory: directory)
        }
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("index-v1") { db in
            try db.execute(sql: """
                CREATE TABLE source (
                    id INTEGER PRIMARY KEY,
                    kind TEXT NOT NULL,
                    ref TEXT NOT NULL,
                    agent TEXT NOT NULL,
                    indexed INTEGER NOT NULL DEFAULT 0,
                    records INTEGER NOT NULL DEFAULT 0,
                    unreadable INTEGER NOT NULL DEFAULT 0,
                    landed_at REAL NOT NULL,
                    UNIQUE (kind, ref, agent)
                );
                CREATE TABLE context (
                    id INTEGER PRIMARY KEY,
                    source INTEGER NOT NULL,
                    key INTEGER NOT NULL,
                    host TEXT NOT NULL,
                    os TEXT NOT NULL,
                    app TEXT NOT NULL,
                    app_version TEXT NOT NULL,
                    process TEXT NOT NULL,
                    UNIQUE (source, key)
                );
                CREATE INDEX context_host ON context(host);
                CREATE INDEX context_app ON context(app);
                CREATE TABLE record (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    source INTEGER NOT NULL,
                    context INTEGER,
                    ts INTEGER NOT NULL,
                    uid TEXT NOT NULL,
                    level INTEGER NOT NULL,
                    type TEXT NOT NULL,
                    message TEXT NOT NULL,
                    metadata TEXT NOT NULL
                );
                CREATE INDEX record_ts ON record(ts);
                CREATE INDEX record_uid_ts ON record(uid, ts);
                CREATE INDEX record_source ON record(source);
                CREATE VIRTUAL TABLE record_text USING fts5(
                    message, metadata, content = 'record', content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2'
                );
                CREATE TRIGGER record_text_delete AFTER DELETE ON record BEGIN
                    INSERT INTO record_text(record_text, rowid, message, metadata) VALUES ('delete', old.id, old.message, old.metadata);
                END;
                """)
        }
        // The user's id as one more column of `record_text` (one word, `x` and the hex of its
        // UTF-8 bytes: see ``SQLRecordQuery/uidWord(_:)``), so that a search by uid and text
        // intersects the two inside the full-text index instead of collecting every user's
        // matches first. The table is contentless now (the uid column is not one of `record`'s):
        // nothing reads its columns back, and its delete trigger passes the values it inserted.
        migrator.registerMigration("index-v2-uid-word") { db in
            try db.execute(sql: """
                DROP TRIGGER record_text_delete;
                DROP TABLE record_text;
                CREATE VIRTUAL TABLE record_text USING fts5(
                    message, metadata, uid, content = '', tokenize = 'unicode61 remove_diacritics 2'
                );
                CREATE TRIGGER record_text_delete AFTER DELETE ON record BEGIN
                    INSERT INTO record_text(record_text, rowid, message, metadata, uid) VALUES ('delete', old.id, old.message, old.metadata, 'x' || hex(old.uid));
                END;
                """)
            // Every record indexed before: about 100,000 records/s, once, at the first start.
            try db.execute(sql: Self.fillTextSQL, arguments: [0])
        }
        // A source's records in time order: a record's neighbours (`record(_:context:)`) are
        // read from it directly instead of sorting the whole source; it serves `source = ?`
        // (a removal, a pull's search) as the index it replaces did.
        migrator.registerMigration("index-v3-source-time") { db in
            try db.execute(sql: "CREATE INDEX record_source_ts ON record(source, ts); DROP INDEX record_source;")
        }
        // The device a source came from, as the registry knew its agent (NULL: indexed before,
        // named by its contexts); a context's host or app that differs, kept as claimed.
        migrator.registerMigration("index-v4-registered-device") { db in
            try db.execute(sql: """
                ALTER TABLE source ADD COLUMN host TEXT;
                ALTER TABLE source ADD COLUMN app TEXT;
                ALTER TABLE source ADD COLUMN app_version TEXT;
                ALTER TABLE source ADD COLUMN os TEXT;
                CREATE INDEX source_host ON source(host);
                """)
        }
        // The log types records have had, for telling a filter's typo (RecordVocabulary): kept
        // as records are added, never pruned (a type seen stays known).
        migrator.registerMigration("index-v5-types") { db in
            try db.execute(sql: """
                CREATE TABLE record_type (type TEXT PRIMARY KEY NOT NULL) WITHOUT ROWID;
                INSERT OR IGNORE INTO record_type (type) SELECT DISTINCT type FROM record;
                """)
        }
        return migrator
    }

    /// Puts the words of every record after the id bound to it into `record_text`.
    static let fillTextSQL = "INSERT INTO record_text (rowid, message, metadata, uid) SELECT id, message, metadata, 'x' || hex(uid) FROM record WHERE id > ?"

    // MARK: Indexing

    public func begin(_ source: IndexedSource, contexts: [String: LogContext], device: RegisteredDevice?, landedAt: Date) async throws {
        try await pool.write { db in
            if let id = try Self.sourceID(db, source) {
                try Self.delete(source: id, db)
            }
            try db.execute(
                sql: "INSERT INTO source (kind, ref, agent, landed_at, host, app, app_version, os) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                arguments: [source.kind.rawValue, source.id, source.agentID, landedAt.timeIntervalSince1970, device?.hostname, device?.app, device?.appVersion, device?.os])
            let id = db.lastInsertedRowID
            for (key, context) in contexts {
                // Keys are decimal integers (Protocol § Payload); any other key no record can name,
                // and of two spellings of one number ("1", "01") the first is kept.
                guard let number = Int64(key) else { continue }
                try db.execute(
                    sql: "INSERT OR IGNORE INTO context (source, key, host, os, app, app_version, process) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    arguments: [id, number, context.host, context.os, context.app, context.appVersion, context.process])
            }
        }
    }

    static let insertSQL = "INSERT INTO record (source, context, ts, uid, level, type, message, metadata) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"

    /// Each line read by ``RecordLine`` (one pass, no JSON tree) and bound to one prepared
    /// insert straight from the block; the block's words go into `record_text` with one
    /// `INSERT … SELECT` at its end (far cheaper than a trigger per row). One transaction.
    public func add(_ source: IndexedSource, lines: [UInt8], admitting admission: LineAdmission) async throws -> IndexCount {
        let only = admission.uid.map { Array($0.utf8) }
        return try await pool.write { db in
            guard let id = try Self.sourceID(db, source) else { throw RecordSearchError("\(source) was not begun") }
            var contexts: [Int64: Int64] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT key, id FROM context WHERE source = ?", arguments: [id]) { contexts[row[0]] = row[1] }
            let before = try Int64.fetchOne(db, sql: "SELECT coalesce(max(id), 0) FROM record") ?? 0
            let statement = try db.cachedStatement(sql: Self.insertSQL)
            let handle = statement.sqliteStatement
            guard let connection = db.sqliteConnection else { throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "the index database is closed") }
            let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
            var count = IndexCount()
            // Bindings point into `lines` (SQLITE_STATIC): they are cleared before it can go away,
            // whatever happens.
            defer {
                sqlite3_reset(handle)
                sqlite3_clear_bindings(handle)
            }
            try lines.withUnsafeBufferPointer { buffer in
                guard let base = buffer.baseAddress else { return }
                let characters = UnsafeRawPointer(base).assumingMemoryBound(to: CChar.self)
                /// Bytes of the block, as they lie there; an over-long value is a line that is not a record.
                func bind(_ index: Int32, _ range: Range<Int>) -> Int32 {
                    guard let length = Int32(exactly: range.count) else { return SQLITE_TOOBIG }
                    return sqlite3_bind_text(handle, index, characters + range.lowerBound, length, nil)  // SQLITE_STATIC: the block outlives the step
                }
                func bind(_ index: Int32, _ text: RecordLine.Text?, in line: UnsafeBufferPointer<UInt8>, offset: Int) -> Int32 {
                    guard let text else { return sqlite3_bind_text(handle, index, "", 0, transient) }
                    guard text.escaped else { return bind(index, (text.range.lowerBound + offset)..<(text.range.upperBound + offset)) }
                    let decoded = RecordLine.decode(text, in: line)
                    guard let length = Int32(exactly: decoded.count) else { return SQLITE_TOOBIG }
                    return decoded.withUnsafeBytes { d in
                        guard let start = d.baseAddress else { return sqlite3_bind_text(handle, index, "", 0, transient) }
                        return sqlite3_bind_text(handle, index, start.assumingMemoryBound(to: CChar.self), length, transient)  // copied by SQLite now
                    }
                }
                sqlite3_bind_int64(handle, 1, id)
                try RecordLine.each(in: buffer) { record, line, start in
                    guard let record = admission.admit(record, in: line, uidBytes: only, count: &count) else { return }
                    if let key = record.context, let context = contexts[key] { sqlite3_bind_int64(handle, 2, context) } else { sqlite3_bind_null(handle, 2) }
                    sqlite3_bind_int64(handle, 3, record.ts)
                    sqlite3_bind_int64(handle, 5, Int64(record.level))
                    var bound = bind(4, record.uid, in: line, offset: start)
                    if bound == SQLITE_OK { bound = bind(6, record.type, in: line, offset: start) }
                    if bound == SQLITE_OK { bound = bind(7, record.message, in: line, offset: start) }
                    if bound == SQLITE_OK {
                        if let metadata = record.metadata {
                            bound = bind(8, (metadata.lowerBound + start)..<(metadata.upperBound + start))
                        } else {
                            bound = sqlite3_bind_text(handle, 8, "{}", 2, transient)
                        }
                    }
                    if bound == SQLITE_TOOBIG {
                        count.unreadable += 1
                        return
                    }
                    guard bound == SQLITE_OK else { throw DatabaseError(resultCode: ResultCode(rawValue: bound), message: "binding a record") }
                    let stepped = sqlite3_step(handle)
                    sqlite3_reset(handle)
                    switch stepped {
                    case SQLITE_DONE: count.records += 1
                    case SQLITE_TOOBIG: count.unreadable += 1  // a value over SQLite's length limit: this line only
                    default: throw DatabaseError(resultCode: ResultCode(rawValue: stepped), message: String(cString: sqlite3_errmsg(connection)))
                    }
                }
            }
            try db.execute(sql: Self.fillTextSQL, arguments: [before])
            try db.execute(sql: "INSERT OR IGNORE INTO record_type (type) SELECT DISTINCT type FROM record WHERE id > ?", arguments: [before])
            try db.execute(
                sql: "UPDATE source SET records = records + ?, unreadable = unreadable + ? WHERE id = ?", arguments: [count.records, count.unreadable, id])
            return count
        }
    }

    public func finish(_ source: IndexedSource) async throws {
        try await pool.write { db in
            try db.execute(sql: "UPDATE source SET indexed = 1 WHERE kind = ? AND ref = ? AND agent = ?", arguments: [source.kind.rawValue, source.id, source.agentID])
        }
    }

    public func indexedSources() async throws -> Set<IndexedSource> {
        try await pool.read { db in
            var sources = Set<IndexedSource>()
            let rows = try Row.fetchCursor(db, sql: "SELECT kind, ref, agent FROM source WHERE indexed = 1")
            while let row = try rows.next() {
                guard let kind = IndexedSource.Kind(rawValue: row[0]) else { continue }
                sources.insert(IndexedSource(kind: kind, id: row[1], agentID: row[2]))
            }
            return sources
        }
    }

    public func isIndexed(_ source: IndexedSource) async throws -> Bool {
        try await pool.read { db in
            try Bool.fetchOne(
                db, sql: "SELECT indexed FROM source WHERE kind = ? AND ref = ? AND agent = ?", arguments: [source.kind.rawValue, source.id, source.agentID]) ?? false
        }
    }

    public func vocabulary() async throws -> RecordVocabulary {
        let limit = RecordVocabulary.maximumListed + 1
        return try await pool.read { db in
            let types = try String.fetchAll(db, sql: "SELECT type FROM record_type ORDER BY type LIMIT ?", arguments: [limit])
            // As the search's host filter matches: the registered name, or the contexts' for
            // sources indexed before devices were registered.
            let hosts = try String.fetchAll(
                db,
                sql: """
                    SELECT host FROM source WHERE host IS NOT NULL
                    UNION SELECT c.host FROM context c JOIN source s ON s.id = c.source WHERE s.host IS NULL
                    ORDER BY 1 LIMIT ?
                    """, arguments: [limit])
            let apps = try String.fetchAll(db, sql: "SELECT DISTINCT app FROM context ORDER BY app LIMIT ?", arguments: [limit])
            return RecordVocabulary.listed(types: types, hosts: hosts, apps: apps)
        }
    }

    public func remove(_ source: IndexedSource) async throws {
        try await pool.write { db in
            guard let id = try Self.sourceID(db, source) else { return }
            try Self.delete(source: id, db)
        }
    }

    /// A source's records (and their words, by the delete trigger), contexts and row.
    static func delete(source id: Int64, _ db: Database) throws {
        try db.execute(sql: "DELETE FROM record WHERE source = ?", arguments: [id])
        try db.execute(sql: "DELETE FROM context WHERE source = ?", arguments: [id])
        try db.execute(sql: "DELETE FROM source WHERE id = ?", arguments: [id])
    }

    static func sourceID(_ db: Database, _ source: IndexedSource) throws -> Int64? {
        try Int64.fetchOne(
            db, sql: "SELECT id FROM source WHERE kind = ? AND ref = ? AND agent = ?", arguments: [source.kind.rawValue, source.id, source.agentID])
    }

    // MARK: Searching

    /// A pull's or a feedback's sources by id: with one (a device's pull, a feedback) its
    /// records are read in order straight from the (source, time) index, a page costing a page
    /// whatever the size of the pull or the direction.
    static func sources(of search: RecordSearch, _ db: Database) throws -> [Int64]? {
        var sources: [Int64]?
        for (kind, ref) in [("pull", search.pull), ("feedback", search.feedback), ("capture", search.capture)] {
            guard let ref else { continue }
            let found = Set(try Int64.fetchAll(db, sql: "SELECT id FROM source WHERE kind = ? AND ref = ?", arguments: [kind, ref]))
            sources = (sources.map { Set($0).intersection(found) } ?? found).sorted()
        }
        return sources
    }

    public func stats(_ search: RecordSearch) async throws -> RecordStats {
        let counted = RecordStats.counted(search), bound = RecordStats.maximumCounted
        return try await pool.read { db in
            let sources = try Self.sources(of: counted, db)
            // The search's records in time order, `rows + 1` at most, as (id, ts, level, host):
            // counted and grouped by SQLite, never read out one by one.
            func first(_ rows: Int) throws -> SQLRecordQuery {
                try SQLRecordQuery(counted, scanLimit: scanLimit, sources: sources, select: SQLRecordQuery.statsColumns, rows: rows)
            }
            // One pass for the count and the ends, over one record more than the bound: it tells
            // whether the count stops there; only then the ends of the first `bound` are read again.
            var kept = try first(bound)
            let ends = try Row.fetchOne(db, sql: "SELECT count(*), min(ts), max(ts) FROM (\(kept.sql))", arguments: kept.arguments)
            let over = (ends?[0] as Int? ?? 0) > bound
            var low: Int64? = ends?[1], high: Int64? = ends?[2]
            if over {
                kept = try first(bound - 1)
                let shorter = try Row.fetchOne(db, sql: "SELECT min(ts), max(ts) FROM (\(kept.sql))", arguments: kept.arguments)
                (low, high) = (shorter?[0], shorter?[1])
            }
            guard let low, let high else { return RecordStats.make(counted, over: over, first: nil, last: nil, buckets: [], hosts: [:]) }
            let span = RecordStats.Span(counted, first: low, last: high, over: over)
            // The second pass: per span, level and host at once.
            var buckets: [(bucket: Int64, level: Int, count: Int)] = [], hosts: [String: Int] = [:]
            for row in try Row.fetchAll(
                db, sql: "SELECT (ts - (\(span.from))) / \(span.width), level, host, count(*) FROM (\(kept.sql)) GROUP BY 1, 2, 3",
                arguments: kept.arguments)
            {
                let count: Int = row[3]
                buckets.append((bucket: row[0], level: row[1], count: count))
                hosts[row[2], default: 0] += count
            }
            return RecordStats.make(counted, over: over, first: low, last: high, buckets: buckets, hosts: hosts)
        }
    }

    public func search(_ search: RecordSearch) async throws -> RecordPage {
        try await pool.read { db in
            let sources = try Self.sources(of: search, db)
            let query = try SQLRecordQuery(search, scanLimit: scanLimit, sources: sources)
            var rows = RecordRows()
            func page(sql: String, arguments: StatementArguments) throws -> (records: [FoundRecord], more: Bool) {
                try rows.read(db, sql: sql, arguments: arguments, limit: query.limit)
            }
            /// Whether `search`'s filters find a record after (or before) a cursor.
            func exists(_ search: RecordSearch, after: String? = nil, before: String? = nil) throws -> Bool {
                var probe = search
                (probe.after, probe.before, probe.limit, probe.arrivedAfter) = (after, before, 1, nil)
                let statement = try SQLRecordQuery(probe, scanLimit: scanLimit, sources: sources)
                var rows = RecordRows()
                // A metadata search's bounded scan first, as for a page: a common value is found there.
                if let scan = statement.scanFirst, try !rows.read(db, sql: scan.sql, arguments: SQLRecordQuery.arguments(scan.bindings), limit: 1).records.isEmpty {
                    return true
                }
                return try !rows.read(db, sql: statement.sql, arguments: statement.arguments, limit: 1).records.isEmpty
            }
            var found: (records: [FoundRecord], more: Bool)?
            if let scan = query.scanFirst {
                let scanned = try page(sql: scan.sql, arguments: SQLRecordQuery.arguments(scan.bindings))
                if scanned.more { found = scanned }
            }
            var (records, more) = try found ?? page(sql: query.sql, arguments: query.arguments)
            let plan = try PageCursors(search, records: &records, more: more, followsArrival: query.followsArrival, backwards: query.backwards)
            let next = try plan.next ?? plan.nextIfAnyAfter.flatMap { try exists(search, after: $0) ? $0 : nil }
            let previous = try plan.previous ?? plan.previousIfAnyBefore.flatMap { try exists(search, before: $0) ? $0 : nil }
            let indexing = try Int.fetchOne(db, sql: "SELECT count(*) FROM source WHERE indexed = 0") ?? 0
            // In the same read: what a follower starts after.
            let newest = try Int64.fetchOne(db, sql: "SELECT coalesce(max(id), 0) FROM record") ?? 0
            return RecordPage(records: records, next: next, previous: previous, indexing: indexing, newestID: newest)
        }
    }
}

/// Reads records from statements whose columns are ``SQLRecordQuery/columns``, by position: no
/// row is copied and no column looked up by name. A page's records come from a few sources and
/// contexts: their strings are read once each.
struct RecordRows {
    private var sources: [Int64: (kind: String, ref: String, agent: String, device: RegisteredDevice?)] = [:]
    private var contexts: [Int64: (host: String, app: String, appVersion: String, os: String, process: String)] = [:]

    /// At most `limit` records; `more` when the statement had another.
    mutating func read(_ db: Database, sql: String, arguments: StatementArguments, limit: Int) throws -> (records: [FoundRecord], more: Bool) {
        var records: [FoundRecord] = []
        records.reserveCapacity(min(limit, 512))
        let rows = try Row.fetchCursor(db, sql: sql, arguments: arguments)
        while let row = try rows.next() {
            guard records.count < limit else { return (records, true) }
            let metadata = RecordMetadata(indexedText: row[6])  // kept as text: spliced into the page's JSON as written
            let level: Int = row[3]
            let sourceID: Int64 = row[15]
            let source =
                sources[sourceID]
                ?? (row[7], row[8], row[9], (row[17] as String?).map { RegisteredDevice(hostname: $0, os: row[20] ?? "", app: row[18] ?? "", appVersion: row[19] ?? "") })
            sources[sourceID] = source
            let contextID: Int64? = row[16]
            var context = ("", "", "", "", "")
            if let contextID {
                context = contexts[contextID] ?? ((row[10] as String?) ?? "", (row[11] as String?) ?? "", (row[12] as String?) ?? "", (row[13] as String?) ?? "", (row[14] as String?) ?? "")
                contexts[contextID] = context
            }
            let names = RecordNames(device: source.device, context: context)
            records.append(
                FoundRecord(
                    id: row[0], ts: Timestamp(microseconds: row[1]), level: LogLevel(rawValue: level)?.name ?? "\(level)", type: row[4],
                    uid: row[2], message: row[5], metadata: metadata, agentID: source.agent, sourceKind: source.kind, sourceID: source.ref,
                    host: names.host, app: names.app, appVersion: names.appVersion, os: names.os, process: names.process,
                    claimedHost: names.claimedHost))
        }
        return (records, false)
    }
}

extension SQLiteRecordIndex {
    public func record(_ id: Int64, context: Int) async throws -> RecordInContext? {
        let count = min(max(context, 0), RecordInContext.maximumContext)
        return try await pool.read { db in
            var rows = RecordRows()
            let select = SQLRecordQuery.columns + " " + SQLRecordQuery.joins
            guard let record = try rows.read(db, sql: select + " WHERE r.id = ?", arguments: [id], limit: 1).records.first else { return nil }
            guard count > 0 else { return RecordInContext(record: record, before: [], after: []) }
            // The same source (one device's export), next to it in (time, id) order.
            let source = "r.source = (SELECT source FROM record WHERE id = ?)"
            let ts = record.ts.microseconds
            let before = try rows.read(
                db, sql: select + " WHERE \(source) AND r.ts <= ? AND (r.ts < ? OR r.id < ?) ORDER BY r.ts DESC, r.id DESC LIMIT \(count)",
                arguments: [id, ts, ts, id], limit: count
            ).records
            let after = try rows.read(
                db, sql: select + " WHERE \(source) AND r.ts >= ? AND (r.ts > ? OR r.id > ?) ORDER BY r.ts, r.id LIMIT \(count)",
                arguments: [id, ts, ts, id], limit: count
            ).records
            return RecordInContext(record: record, before: before.reversed(), after: after)
        }
    }
}


/// A ``RecordSearch`` as one SQL statement over the index's tables (public for the benchmark,
/// which runs the same statement through SQLite's C API as its limit).
public struct SQLRecordQuery: Sendable {
    public enum Binding: Sendable, Equatable {
        case integer(Int64)
        case text(String)
    }

    public let sql: String
    public let bindings: [Binding]
    /// Run first when set (see the end of `init`): its rows are the page when there are more
    /// than ``limit``; otherwise ``sql`` is run.
    public let scanFirst: (sql: String, bindings: [Binding])?
    /// How many records (the first in time order, and any at the same instant as the last) the scan-first statement reads at most.
    public static let defaultScanLimit = 50_000
    /// Records per page; the statement asks for one more, to know whether a next page exists.
    public let limit: Int
    let followsArrival: Bool
    /// Read with `before`: the statement's rows come newest first.
    let backwards: Bool

    /// The most sources whose pages are read one by one and merged (beyond, collected and sorted).
    static let mergedSources = 64

    /// What each statement selects, read by position by ``RecordRows``.
    static let columns = """
        SELECT r.id, r.ts, r.uid, r.level, r.type, r.message, r.metadata, s.kind, s.ref, s.agent, \
        c.host, c.app, c.app_version, c.os, c.process, r.source, r.context, s.host, s.app, s.app_version, s.os
        """
    static let joins = "FROM record r JOIN source s ON s.id = r.source LEFT JOIN context c ON c.id = r.context"
    /// What ``RecordStats`` counts of each record: its time, level, and host as shown.
    static let statsColumns = "SELECT r.id AS id, r.ts AS ts, r.level AS level, coalesce(s.host, c.host, '') AS host"

    /// A page cursor, `<µs>.<id>`.
    static func cursor(_ text: String, _ member: String) throws -> (Int64, Int64) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, let ts = Int64(parts[0]), let id = Int64(parts[1]), id >= -1 else {
            throw RecordSearchError("'\(text)' is not a page cursor: pass the `\(member)` of a page")
        }
        return (ts, id)
    }

    var arguments: StatementArguments { Self.arguments(bindings) }

    static func arguments(_ bindings: [Binding]) -> StatementArguments {
        StatementArguments(bindings.map { binding -> (any DatabaseValueConvertible)? in
            switch binding {
            case .integer(let i): i
            case .text(let t): t
            }
        })
    }

    /// A uid as `record_text` holds it: `x` and the hex of its UTF-8 bytes, one word whatever
    /// the uid holds (`'x' || hex(uid)` in SQL; the tokenizer folds the case).
    static func uidWord(_ uid: String) -> String { "x" + Hex.encode(uid.utf8) }

    /// `sources`: the ids of the sources the search's pull and feedback name, when the caller
    /// looked them up (in the same read): they are then matched by equality, which the
    /// (source, time) index orders; otherwise through a subquery.
    /// `select` and `rows`: other columns than a page's (``statsColumns``), and how many rows at
    /// most (instead of the search's page size).
    public init(_ search: RecordSearch, scanLimit: Int = SQLRecordQuery.defaultScanLimit, sources: [Int64]? = nil, select: String? = nil, rows: Int? = nil) throws {
        limit = rows ?? min(max(search.limit ?? RecordSearch.defaultLimit, 1), RecordSearch.maximumLimit)
        followsArrival = search.arrivedAfter != nil
        var clauses: [String] = []
        var values: [Binding] = []
        func list(_ count: Int) -> String { "(" + Array(repeating: "?", count: count).joined(separator: ", ") + ")" }

        // Following arrivals reads by id from where it left off: `+` keeps the uid's and the
        // source's indexes (ordered by time) from being chosen over that rowid range.
        let following = search.arrivedAfter != nil ? "+" : ""
        if let uid = search.uid {
            clauses.append("\(following)r.uid = ?")
            values.append(.text(uid))
        }
        if let since = search.since {
            clauses.append("r.ts >= ?")
            values.append(.integer(since.microseconds))
        }
        if let until = search.until {
            clauses.append("r.ts < ?")
            values.append(.integer(until.microseconds))
        }
        if let levels = search.levels, !levels.isEmpty {
            var numbers: [Int] = []
            for name in levels {
                guard let level = LogLevel(name: name) else {
                    throw RecordSearchError("unknown level '\(name)': levels are \(LogLevel.allCases.map(\.name).joined(separator: ", "))")
                }
                numbers.append(level.rawValue)
            }
            clauses.append("r.level IN \(list(numbers.count))")
            values += numbers.map { .integer(Int64($0)) }
        }
        if let types = search.types, !types.isEmpty {
            clauses.append("r.type IN \(list(types.count))")
            values += types.map { .text($0) }
        }
        if let agents = search.agents, !agents.isEmpty {
            clauses.append("r.source IN (SELECT id FROM source WHERE agent IN \(list(agents.count)))")
            values += agents.map { .text($0) }
        }
        // Where the sources' clause and values are, for the per-source statement below.
        let sourceClause = clauses.count, sourceValues = values.count
        if let sources {
            switch sources.count {
            case 0: clauses.append("0")
            case 1: clauses.append("\(following)r.source = ?")
            default: clauses.append("\(following)r.source IN \(list(sources.count))")
            }
            values += sources.map { .integer($0) }
        } else {
            if let pull = search.pull {
                clauses.append("r.source IN (SELECT id FROM source WHERE kind = 'pull' AND ref = ?)")
                values.append(.text(pull))
            }
            if let feedback = search.feedback {
                clauses.append("r.source IN (SELECT id FROM source WHERE kind = 'feedback' AND ref = ?)")
                values.append(.text(feedback))
            }
            if let capture = search.capture {
                clauses.append("r.source IN (SELECT id FROM source WHERE kind = 'capture' AND ref = ?)")
                values.append(.text(capture))
            }
        }
        // By the registered host; by the context only for sources indexed without one.
        if let hosts = search.hosts, !hosts.isEmpty {
            clauses.append("""
                (r.source IN (SELECT id FROM source WHERE host IN \(list(hosts.count))) \
                OR r.context IN (SELECT c.id FROM context c JOIN source s ON s.id = c.source WHERE s.host IS NULL AND c.host IN \(list(hosts.count))))
                """)
            values += hosts.map { .text($0) } + hosts.map { .text($0) }
        }
        // The app the record's context names (the process that wrote it).
        if let apps = search.apps, !apps.isEmpty {
            clauses.append("r.context IN (SELECT id FROM context WHERE app IN \(list(apps.count)))")
            values += apps.map { .text($0) }
        }
        // Metadata matches, checked exactly (kept apart: the scan-first statement applies them
        // after its bounded scan).
        var exact: [String] = []
        var exactValues: [Binding] = []
        // Full text: the words asked for, and each metadata match's value (else its key) as a
        // phrase in the metadata column, narrowed exactly below. The key's words are left out of
        // the phrase: every record with that key holds them, which makes the phrase slow and
        // narrows little. A superset of the exact matches as long as the metadata is written
        // with the protocol's escaping (only `"`, `\` and control characters escaped).
        var match: [String] = []
        if let text = search.text, !text.trimmingCharacters(in: .whitespaces).isEmpty {
            guard let terms = SearchText.terms(text) else { throw RecordSearchError("the text '\(text)' has no word to search for") }
            match.append(SearchText.fts5(terms, column: "{message metadata}"))
        }
        for m in search.metadata ?? [] {
            guard !m.key.isEmpty, !m.key.contains("\"") else { throw RecordSearchError("metadata key '\(m.key)' cannot be searched (empty, or holds a \")") }
            if let problem = m.searchProblem { throw RecordSearchError(problem) }
            let escapedInJSON = { (text: String) in text.unicodeScalars.contains { $0.value < 0x20 || $0 == "\"" || $0 == "\\" } }
            if let words = [m.value, m.key].first(where: { $0.contains { $0.isLetter || $0.isNumber } }), !escapedInJSON(words) {
                match.append(SearchText.fts5([SearchText.Term(words: words, isPrefix: false)], column: "metadata"))
            }
            let path = "$.\"" + m.key + "\""
            exact.append("""
                (CASE json_type(r.metadata, ?) WHEN 'text' THEN json_extract(r.metadata, ?) = ? \
                WHEN 'integer' THEN CAST(json_extract(r.metadata, ?) AS TEXT) = ? WHEN 'real' THEN CAST(json_extract(r.metadata, ?) AS TEXT) = ? \
                WHEN 'true' THEN ? = 'true' WHEN 'false' THEN ? = 'false' WHEN 'null' THEN ? = 'null' ELSE 0 END)
                """)
            exactValues += [path, path, m.value, path, m.value, path, m.value, m.value, m.value, m.value].map { .text($0) }
        }
        let order: String
        if let arrived = search.arrivedAfter {
            guard search.before == nil else { throw RecordSearchError("before cannot be given with arrivedAfter: following arrivals reads forwards") }
            clauses.append("r.id > ?")
            values.append(.integer(arrived))
            order = "r.id"
        } else if let before = search.before {
            guard search.after == nil else { throw RecordSearchError("give after or before, not both") }
            let (ts, id) = try Self.cursor(before, "previous")
            // Read backwards from the cursor; the store hands the page out in time order.
            clauses.append("r.ts <= ? AND (r.ts < ? OR r.id < ?)")
            values += [.integer(ts), .integer(ts), .integer(id)]
            order = "r.ts DESC, r.id DESC"
        } else {
            if let after = search.after {
                let (ts, id) = try Self.cursor(after, "next")
                // `r.ts >= ?` on its own lets the time index start at the cursor.
                clauses.append("r.ts >= ? AND (r.ts > ? OR r.id > ?)")
                values += [.integer(ts), .integer(ts), .integer(id)]
            }
            order = "r.ts, r.id"
        }
        backwards = search.before != nil && search.arrivedAfter == nil
        var all = clauses + exact
        var allValues = values + exactValues
        if !match.isEmpty {
            // The uid's word too: the full-text index then hands over only this user's matches.
            if let uid = search.uid { match.insert("uid : " + Self.uidWord(uid), at: 0) }
            all.append("r.id IN (SELECT rowid FROM record_text WHERE record_text MATCH ?)")
            allValues.append(.text(match.joined(separator: " AND ")))
        }
        let columns = select ?? Self.columns
        if let sources, (2...Self.mergedSources).contains(sources.count), match.isEmpty, search.arrivedAfter == nil {
            // Several sources (a pull from several devices): each source's page in order from
            // the (source, time) index, then merged, instead of collecting and sorting all of
            // their records. Not with full text, whose match each part would collect again.
            var parts: [String] = [], partValues: [Binding] = []
            for source in sources {
                var partClauses = clauses
                partClauses[sourceClause] = "r.source = ?"
                parts.append("SELECT * FROM (\(columns) \(Self.joins) WHERE \((partClauses + exact).joined(separator: " AND ")) ORDER BY \(order) LIMIT \(limit + 1))")
                partValues += values[..<sourceValues] + [.integer(source)] + values[(sourceValues + sources.count)...] + exactValues
            }
            let outer = backwards ? "ts DESC, id DESC" : "ts, id"
            sql = "SELECT * FROM (\(parts.joined(separator: " UNION ALL "))) ORDER BY \(outer) LIMIT \(limit + 1)"
            bindings = partValues
        } else {
            sql = """
                \(columns)
                \(Self.joins)
                \(all.isEmpty ? "" : "WHERE " + all.joined(separator: " AND "))
                ORDER BY \(order) LIMIT \(limit + 1)
                """
            bindings = allValues
        }
        // A common metadata value matches so many records that collecting them through the
        // full-text index costs a second; reading records in time order and checking each
        // finds the first page of a common value in milliseconds. So when metadata is the
        // search's word filter: first the records in order, the first `scanLimit` of them,
        // checked exactly. If that fills a page it is the page (the first matches among the first
        // records in order are the first matches); else the statement above decides.
        if !exact.isEmpty && (search.text ?? "").trimmingCharacters(in: .whitespaces).isEmpty && search.arrivedAfter == nil && !backwards {
            // Bounded by the time of the `scanLimit`-th record (found through the same filters),
            // not by copying the first records out: the scan stops as soon as the page is full.
            // Records at that same instant are read too, so the scanned ones are still the first
            // in order, and fewer records than the bound are all read.
            let filter = clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ")
            let bound = "(SELECT r.ts FROM record r \(filter) ORDER BY r.ts, r.id LIMIT 1 OFFSET \(max(scanLimit, 1) - 1))"
            scanFirst = (
                sql: """
                    \(columns)
                    \(Self.joins)
                    WHERE \((clauses + ["r.ts <= coalesce(\(bound), \(Int64.max))"] + exact).joined(separator: " AND "))
                    ORDER BY r.ts, r.id LIMIT \(limit + 1)
                    """,
                bindings: values + values + exactValues)
        } else {
            scanFirst = nil
        }
    }
}

/// A page's cursors, from the records read (both back ends page alike): `next` and `previous`
/// when the page alone tells them, else a cursor to probe (the back end asks whether its
/// filters find a record after, or before, it).
struct PageCursors {
    var next: String?
    var previous: String?
    /// `next` is this cursor when a record follows it.
    var nextIfAnyAfter: String?
    /// `previous` is this cursor when a record comes before it.
    var previousIfAnyBefore: String?

    /// `records`: the page as read (newest first when `backwards`; put in time order here);
    /// `more`: whether the statement had another record beyond the page.
    init(_ search: RecordSearch, records: inout [FoundRecord], more: Bool, followsArrival: Bool, backwards: Bool) throws {
        func cursor(_ r: FoundRecord) -> String { "\(r.ts.microseconds).\(r.id)" }
        if followsArrival {
            next = more ? records.last.map { "\($0.id)" } : nil
        } else if backwards, let before = search.before {
            records.reverse()
            previous = more ? records.first.map(cursor) : nil
            // Forwards from the page's end (from the cursor's own record when the page is
            // empty), if anything is there: the cursor may be an instant past the last record.
            let (ts, id) = try SQLRecordQuery.cursor(before, "previous")
            // Read back from the end of time (the latest page): nothing can follow it.
            if ts != Int64.max { nextIfAnyAfter = records.last.map(cursor) ?? "\(ts).\(max(id - 1, -1))" }
        } else {
            next = more ? records.last.map(cursor) : nil
            if let after = search.after {
                // A page after a record the reader saw has that record before it; an empty
                // one (a made-up cursor) has a page before only if something is there.
                let (ts, id) = try SQLRecordQuery.cursor(after, "next")
                if let first = records.first {
                    previous = cursor(first)
                } else {
                    previousIfAnyBefore = "\(ts).\(id == Int64.max ? id : id + 1)"
                }
            }
        }
    }
}
