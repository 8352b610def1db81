import DredgeAdminAPI
import DredgeDomain
import Foundation
import GRDB
import GRDBSQLite

/// The ``RecordIndex`` of the embedded back end: `index.sqlite` in the data directory, apart
/// from `dredge.sqlite` so that indexing a large pull never holds up the listener's writes.
///
/// Tables: `source` (one per landed pull-and-agent or feedback, with its state), `context`
/// (the manifest's contexts of each source), `record` (time in µs, uid, level number, type,
/// message, metadata as compact JSON) with indexes on time, uid and time, and source, and
/// `record_text`, an FTS5 table over `record`'s message and metadata (external content, kept
/// by triggers; tokenizer `unicode61` without diacritics).
///
/// Lines are read by SQLite's own JSON functions, one prepared statement bound to each line's
/// bytes as they lie in the block: a line that is not JSON, or lacks a `ts` of the payload's
/// form, a known `level` or a `type`, inserts nothing and is counted. WAL, `synchronous=NORMAL`:
/// the index can always be built again from the files.
public final class RecordIndexStore: RecordIndex, Sendable {
    public static let fileName = "index.sqlite"
    let pool: DatabasePool
    public let path: String

    public init(directory: String) throws {
        path = directory + "/" + Self.fileName
        let isNew = !FileManager.default.fileExists(atPath: path)
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        pool = try DatabasePool(path: path, configuration: configuration)
        if isNew, chmod(path, 0o600) != 0 {
            throw DeploymentError("cannot restrict \(path) to its owner: \(String(cString: strerror(errno)))")
        }
        try Self.migrator.migrate(pool)
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
                    id INTEGER PRIMARY KEY,
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
                CREATE TRIGGER record_text_insert AFTER INSERT ON record BEGIN
                    INSERT INTO record_text(rowid, message, metadata) VALUES (new.id, new.message, new.metadata);
                END;
                CREATE TRIGGER record_text_delete AFTER DELETE ON record BEGIN
                    INSERT INTO record_text(record_text, rowid, message, metadata) VALUES ('delete', old.id, old.message, old.metadata);
                END;
                """)
        }
        return migrator
    }

    // MARK: Indexing

    public func begin(_ source: IndexedSource, contexts: [String: LogContext], landedAt: Date) async throws {
        try await pool.write { db in
            if let id = try Self.sourceID(db, source) {
                try db.execute(sql: "DELETE FROM record WHERE source = ?", arguments: [id])
                try db.execute(sql: "DELETE FROM context WHERE source = ?", arguments: [id])
                try db.execute(sql: "DELETE FROM source WHERE id = ?", arguments: [id])
            }
            try db.execute(
                sql: "INSERT INTO source (kind, ref, agent, landed_at) VALUES (?, ?, ?, ?)",
                arguments: [source.kind.rawValue, source.id, source.agentID, landedAt.timeIntervalSince1970])
            let id = db.lastInsertedRowID
            for (key, context) in contexts {
                // Keys are decimal integers (Protocol § Payload); any other key no record can name.
                guard let number = Int64(key) else { continue }
                try db.execute(
                    sql: "INSERT INTO context (source, key, host, os, app, app_version, process) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    arguments: [id, number, context.host, context.os, context.app, context.appVersion, context.process])
            }
        }
    }

    /// One statement per line, the line's JSON read by SQLite: the checks in `WHERE` keep a
    /// record without a usable `ts`, `level` or `type` out, and JSON that does not parse fails
    /// the statement alone (SQLITE_ERROR), which is counted, not thrown.
    static let insertSQL = """
        INSERT INTO record (source, context, ts, uid, level, type, message, metadata)
        SELECT ?2, (SELECT id FROM context WHERE source = ?2 AND key = json_extract(?1, '$.context')),
            unixepoch(substr(t, 1, 19)) * 1000000 + CAST(substr(t, 21, 6) AS INTEGER),
            coalesce(u, ''), l, ty, coalesce(m, ''), coalesce(md, '{}')
        FROM (
            SELECT json_extract(?1, '$.ts') AS t,
                CASE json_extract(?1, '$.level') WHEN 'trace' THEN 0 WHEN 'debug' THEN 1 WHEN 'info' THEN 2 WHEN 'notice' THEN 3
                    WHEN 'warning' THEN 4 WHEN 'error' THEN 5 WHEN 'critical' THEN 6 END AS l,
                json_extract(?1, '$.type') AS ty,
                CASE json_type(?1, '$.uid') WHEN 'text' THEN json_extract(?1, '$.uid') END AS u,
                CASE json_type(?1, '$.message') WHEN 'text' THEN json_extract(?1, '$.message') END AS m,
                CASE json_type(?1, '$.metadata') WHEN 'object' THEN json_extract(?1, '$.metadata') END AS md,
                json_type(?1, '$.ts') AS tt, json_type(?1, '$.type') AS tyt
        )
        WHERE tt = 'text' AND length(t) = 27 AND substr(t, 20, 1) = '.' AND substr(t, 27, 1) = 'Z'
            AND substr(t, 21, 6) GLOB '[0-9][0-9][0-9][0-9][0-9][0-9]' AND unixepoch(substr(t, 1, 19)) IS NOT NULL
            AND l IS NOT NULL AND tyt = 'text' AND length(ty) BETWEEN 1 AND 64
        """

    public func add(_ source: IndexedSource, lines: [UInt8]) async throws -> IndexCount {
        try await pool.write { db in
            guard let id = try Self.sourceID(db, source) else { throw RecordSearchError("\(source) was not begun") }
            let statement = try db.cachedStatement(sql: Self.insertSQL)
            let handle = statement.sqliteStatement
            guard let connection = db.sqliteConnection else { throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "the index database is closed") }
            var count = IndexCount()
            try lines.withUnsafeBufferPointer { buffer in
                guard let base = buffer.baseAddress else { return }
                sqlite3_bind_int64(handle, 2, id)
                var start = 0
                while start < buffer.count {
                    var end = start
                    while end < buffer.count && buffer[end] != 0x0A { end += 1 }
                    defer { start = end + 1 }
                    guard end > start else { continue }
                    let bound = base.advanced(by: start).withMemoryRebound(to: CChar.self, capacity: end - start) {
                        sqlite3_bind_text(handle, 1, $0, Int32(end - start), nil)  // SQLITE_STATIC: the block outlives the step
                    }
                    guard bound == SQLITE_OK else { throw DatabaseError(resultCode: ResultCode(rawValue: bound), message: "binding a record line") }
                    let stepped = sqlite3_step(handle)
                    sqlite3_reset(handle)
                    switch stepped {
                    case SQLITE_DONE:
                        if sqlite3_changes(connection) > 0 { count.records += 1 } else { count.unreadable += 1 }
                    case SQLITE_ERROR:
                        // Malformed JSON: this line only.
                        count.unreadable += 1
                    default:
                        let message = String(cString: sqlite3_errmsg(connection))
                        throw DatabaseError(resultCode: ResultCode(rawValue: stepped), message: message)
                    }
                }
            }
            sqlite3_clear_bindings(handle)
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

    public func remove(_ source: IndexedSource) async throws {
        try await pool.write { db in
            guard let id = try Self.sourceID(db, source) else { return }
            try db.execute(sql: "DELETE FROM record WHERE source = ?", arguments: [id])
            try db.execute(sql: "DELETE FROM context WHERE source = ?", arguments: [id])
            try db.execute(sql: "DELETE FROM source WHERE id = ?", arguments: [id])
        }
    }

    static func sourceID(_ db: Database, _ source: IndexedSource) throws -> Int64? {
        try Int64.fetchOne(
            db, sql: "SELECT id FROM source WHERE kind = ? AND ref = ? AND agent = ?", arguments: [source.kind.rawValue, source.id, source.agentID])
    }

    // MARK: Searching

    public func search(_ search: RecordSearch) async throws -> RecordPage {
        let query = try SQLRecordQuery(search)
        return try await pool.read { db in
            let rows = try Row.fetchAll(db, sql: query.sql, arguments: query.arguments)
            var records: [FoundRecord] = []
            records.reserveCapacity(min(rows.count, query.limit))
            for row in rows.prefix(query.limit) {
                let metadataText: String = row["metadata"]
                let metadata = (try? JSONDecoder().decode(JSONValue.self, from: Data(metadataText.utf8))) ?? .string(metadataText)  // written by SQLite's json functions; shown as text if ever not an object
                let level: Int = row["level"]
                records.append(
                    FoundRecord(
                        id: row["id"], ts: Timestamp(microseconds: row["ts"]), level: LogLevel(rawValue: level)?.name ?? "\(level)", type: row["type"],
                        uid: row["uid"], message: row["message"], metadata: metadata, agentID: row["agent"], sourceKind: row["kind"], sourceID: row["ref"],
                        host: (row["host"] as String?) ?? "", app: (row["app"] as String?) ?? "", appVersion: (row["app_version"] as String?) ?? "", os: (row["os"] as String?) ?? "", process: (row["process"] as String?) ?? ""))
            }
            let next = rows.count > query.limit ? records.last.map { query.followsArrival ? "\($0.id)" : "\($0.ts.microseconds).\($0.id)" } : nil
            let indexing = try Int.fetchOne(db, sql: "SELECT count(*) FROM source WHERE indexed = 0") ?? 0
            return RecordPage(records: records, next: next, indexing: indexing)
        }
    }
}

/// A ``RecordSearch`` as one SQL statement over the index's tables.
struct SQLRecordQuery {
    var sql: String
    var arguments: StatementArguments
    var limit: Int
    var followsArrival: Bool

    init(_ search: RecordSearch) throws {
        limit = min(max(search.limit ?? RecordSearch.defaultLimit, 1), RecordSearch.maximumLimit)
        followsArrival = search.arrivedAfter != nil
        var clauses: [String] = []
        var values: [(any DatabaseValueConvertible)?] = []
        func list(_ count: Int) -> String { "(" + Array(repeating: "?", count: count).joined(separator: ", ") + ")" }

        if let uid = search.uid {
            clauses.append("r.uid = ?")
            values.append(uid)
        }
        if let since = search.since {
            clauses.append("r.ts >= ?")
            values.append(since.microseconds)
        }
        if let until = search.until {
            clauses.append("r.ts < ?")
            values.append(until.microseconds)
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
            values += numbers.map { $0 }
        }
        if let types = search.types, !types.isEmpty {
            clauses.append("r.type IN \(list(types.count))")
            values += types.map { $0 }
        }
        if let agents = search.agents, !agents.isEmpty {
            clauses.append("r.source IN (SELECT id FROM source WHERE agent IN \(list(agents.count)))")
            values += agents.map { $0 }
        }
        if let pull = search.pull {
            clauses.append("r.source IN (SELECT id FROM source WHERE kind = 'pull' AND ref = ?)")
            values.append(pull)
        }
        if let feedback = search.feedback {
            clauses.append("r.source IN (SELECT id FROM source WHERE kind = 'feedback' AND ref = ?)")
            values.append(feedback)
        }
        if let hosts = search.hosts, !hosts.isEmpty {
            clauses.append("r.context IN (SELECT id FROM context WHERE host IN \(list(hosts.count)))")
            values += hosts.map { $0 }
        }
        if let apps = search.apps, !apps.isEmpty {
            clauses.append("r.context IN (SELECT id FROM context WHERE app IN \(list(apps.count)))")
            values += apps.map { $0 }
        }
        // Full text: the words asked for, and each metadata match's key and value as a phrase
        // in the metadata column (a superset, narrowed exactly below).
        var match: [String] = []
        if let text = search.text, !text.trimmingCharacters(in: .whitespaces).isEmpty {
            guard let terms = SearchText.terms(text) else { throw RecordSearchError("the text '\(text)' has no word to search for") }
            match.append(SearchText.fts5(terms))
        }
        for m in search.metadata ?? [] {
            guard !m.key.isEmpty, !m.key.contains("\"") else { throw RecordSearchError("metadata key '\(m.key)' cannot be searched (empty, or holds a \")") }
            let phrase = m.key + " " + m.value
            if phrase.contains(where: { $0.isLetter || $0.isNumber }) {
                match.append(SearchText.fts5([SearchText.Term(words: phrase, isPrefix: false)], column: "metadata"))
            }
            let path = "$.\"" + m.key + "\""
            clauses.append("""
                (CASE json_type(r.metadata, ?) WHEN 'text' THEN json_extract(r.metadata, ?) = ? \
                WHEN 'integer' THEN CAST(json_extract(r.metadata, ?) AS TEXT) = ? WHEN 'real' THEN CAST(json_extract(r.metadata, ?) AS TEXT) = ? \
                WHEN 'true' THEN ? = 'true' WHEN 'false' THEN ? = 'false' WHEN 'null' THEN ? = 'null' ELSE 0 END)
                """)
            values += [path, path, m.value, path, m.value, path, m.value, m.value, m.value, m.value]
        }
        if !match.isEmpty {
            clauses.append("r.id IN (SELECT rowid FROM record_text WHERE record_text MATCH ?)")
            values.append(match.joined(separator: " AND "))
        }
        let order: String
        if let arrived = search.arrivedAfter {
            clauses.append("r.id > ?")
            values.append(arrived)
            order = "r.id"
        } else {
            if let after = search.after {
                let parts = after.split(separator: ".")
                guard parts.count == 2, let ts = Int64(parts[0]), let id = Int64(parts[1]) else {
                    throw RecordSearchError("'\(after)' is not a page cursor: pass the `next` of the previous page")
                }
                clauses.append("(r.ts > ? OR (r.ts = ? AND r.id > ?))")
                values += [ts, ts, id]
            }
            order = "r.ts, r.id"
        }
        sql = """
            SELECT r.id, r.ts, r.uid, r.level, r.type, r.message, r.metadata, s.kind, s.ref, s.agent,
                c.host, c.app, c.app_version, c.os, c.process
            FROM record r JOIN source s ON s.id = r.source LEFT JOIN context c ON c.id = r.context
            \(clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND "))
            ORDER BY \(order) LIMIT \(limit + 1)
            """
        arguments = StatementArguments(values)
    }
}
