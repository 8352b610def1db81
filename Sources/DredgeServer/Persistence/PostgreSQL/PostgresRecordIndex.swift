import DredgeAdminAPI
import DredgeDomain
import DredgeJSON
import Foundation
import PostgresNIO

/// The ``RecordIndex`` on PostgreSQL, shared by every node: the same tables as the embedded
/// index (``SQLiteRecordIndex``), with full text as a `tsvector` column (`words`, over the
/// message and the metadata, GIN-indexed) and metadata matches as `jsonb` containment
/// (`dredge_json(metadata) @> …`, through a GIN expression index).
///
/// Lines are read by ``RecordLine`` as the embedded index reads them, and a block goes in as
/// one `INSERT … SELECT FROM unnest(…)`: one round trip per block. Blocks are written one at a
/// time across the cluster (a transaction-level advisory lock), so record ids are committed in
/// the order they are handed out, and a follower reading "after id N" never skips a record
/// that commits later with a smaller id.
///
/// A source is claimed by the node that begins it (its ``NodeLease``): while that node's lease
/// lasts, another node's ``begin(_:contexts:landedAt:)`` throws ``IndexedElsewhere`` (two
/// nodes starting together both catch up on what landed; each source is indexed by one), and
/// once it has run out the source is taken over from the start. Blocks go in only under the
/// claim, so a node that lost its claim adds nothing to the new one.
///
/// PostgreSQL's `text` cannot hold NUL: a NUL in a record's values is stored as U+FFFD.
public final class PostgresRecordIndex: RecordIndex, Sendable {
    private let db: PostgresDatabase
    /// The node this index claims sources under.
    public let node: NodeLease

    /// `node`: this process's lease (a new one, taken at the first ``begin(_:contexts:landedAt:)``, when nil).
    public init(_ database: PostgresDatabase, node: NodeLease? = nil) {
        db = database
        self.node = node ?? NodeLease(database)
    }

    /// The lock that orders index writes across nodes.
    static let writeLock: Int64 = 7_466_218_402

    // MARK: Indexing

    public func begin(_ source: IndexedSource, contexts: [String: LogContext], device: RegisteredDevice?, landedAt: Date) async throws {
        var keys: [Int64] = [], hosts: [String] = [], oses: [String] = [], apps: [String] = [], versions: [String] = [], processes: [String] = []
        for (key, context) in contexts {
            // Keys are decimal integers (Protocol § Payload); any other key no record can name.
            guard let number = Int64(key) else { continue }
            keys.append(number)
            hosts.append(context.host.storable)
            oses.append(context.os.storable)
            apps.append(context.app.storable)
            versions.append(context.appVersion.storable)
            processes.append(context.process.storable)
        }
        try await node.joinedOnce()
        let nodeID = node.id
        try await db.write { c in
            try await c.run("SELECT pg_advisory_xact_lock(\(Self.writeLock))")
            if let row = try await c.rows(
                "SELECT id, indexed, claimed_by FROM source WHERE kind = \(source.kind.rawValue) AND ref = \(source.id) AND agent = \(source.agentID)"
            ).first {
                let (id, indexed, claimant) = try row.decode((Int64, Bool, String?).self)
                if !indexed, let claimant, claimant != nodeID,
                    let name = try await c.value("SELECT name FROM node WHERE id = \(claimant) AND id IN (\(unescaped: NodeLease.live))", as: String.self)
                {
                    throw IndexedElsewhere(source: source, node: name)
                }
                try await Self.delete(source: id, on: c)
            }
            guard
                let id = try await c.value(
                    """
                    INSERT INTO source (kind, ref, agent, landed_at, claimed_by, host, app, app_version, os)
                    VALUES (\(source.kind.rawValue), \(source.id), \(source.agentID), \(landedAt.timeIntervalSince1970), \(nodeID),
                        \(device?.hostname.storable), \(device?.app.storable), \(device?.appVersion.storable), \(device?.os.storable))
                    RETURNING id
                    """, as: Int64.self)
            else { throw RecordSearchError("\(source) could not be begun") }
            try await c.run(
                """
                INSERT INTO context (source, key, host, os, app, app_version, process)
                SELECT \(id), k, h, o, a, v, p FROM unnest(\(keys)::bigint[], \(hosts)::text[], \(oses)::text[], \(apps)::text[], \(versions)::text[], \(processes)::text[])
                    AS x(k, h, o, a, v, p)
                ON CONFLICT (source, key) DO NOTHING
                """)
        }
    }

    public func add(_ source: IndexedSource, lines: [UInt8], admitting admission: LineAdmission) async throws -> IndexCount {
        let only = admission.uid.map { Array($0.utf8) }
        var count = IndexCount()
        var ts: [Int64] = [], uids: [String] = [], levels: [Int32] = [], types: [String] = [], messages: [String] = [], metadata: [String] = []
        var keys: [Int64] = [], hasKey: [Bool] = []
        lines.withUnsafeBufferPointer { buffer in
            RecordLine.each(in: buffer) { record, line, _ in
                guard let record = admission.admit(record, in: line, uidBytes: only, count: &count) else { return }
                func text(_ value: RecordLine.Text?) -> String {
                    guard let value else { return "" }
                    let bytes = value.escaped ? RecordLine.decode(value, in: line) : Array(line[value.range])
                    return String(decoding: bytes, as: UTF8.self).storable
                }
                ts.append(record.ts)
                levels.append(Int32(clamping: record.level))
                uids.append(text(record.uid))
                types.append(text(record.type))
                messages.append(text(record.message))
                metadata.append(record.metadata.map { String(decoding: line[$0], as: UTF8.self) } ?? "{}")
                keys.append(record.context ?? 0)
                hasKey.append(record.context != nil)
                count.records += 1
            }
        }
        let (records, unreadable) = (Int64(count.records), Int64(count.unreadable))
        let nodeID = node.id
        return try await db.write { c in
            try await c.run("SELECT pg_advisory_xact_lock(\(Self.writeLock))")
            guard let row = try await c.rows(
                "SELECT id, claimed_by FROM source WHERE kind = \(source.kind.rawValue) AND ref = \(source.id) AND agent = \(source.agentID)"
            ).first else { throw RecordSearchError("\(source) was not begun") }
            let (id, claimant) = try row.decode((Int64, String?).self)
            guard claimant == nodeID else { throw IndexedElsewhere(source: source, node: claimant ?? "none") }
            try await c.run(
                """
                INSERT INTO record (source, context, ts, uid, level, type, message, metadata)
                SELECT \(id), c.id, u.ts, u.uid, u.level, u.type, u.message, u.metadata
                FROM unnest(\(ts)::bigint[], \(uids)::text[], \(levels)::int[], \(types)::text[], \(messages)::text[], \(metadata)::text[], \(keys)::bigint[],
                    \(hasKey)::boolean[]) WITH ORDINALITY AS u(ts, uid, level, type, message, metadata, key, has, n)
                LEFT JOIN context c ON u.has AND c.source = \(id) AND c.key = u.key
                ORDER BY u.n
                """)
            try await c.run("UPDATE source SET records = records + \(records), unreadable = unreadable + \(unreadable) WHERE id = \(id)")
            try await c.run("INSERT INTO record_type (type) SELECT DISTINCT t FROM unnest(\(Array(Set(types)))::text[]) AS t ON CONFLICT DO NOTHING")
            return count
        }
    }

    public func finish(_ source: IndexedSource) async throws {
        try await db.write { c in
            // Under this node's claim only: a node that took the source over finishes it itself.
            try await c.run(
                """
                UPDATE source SET indexed = true, claimed_by = NULL
                WHERE kind = \(source.kind.rawValue) AND ref = \(source.id) AND agent = \(source.agentID) AND claimed_by = \(self.node.id)
                """)
        }
    }

    public func indexedSources() async throws -> Set<IndexedSource> {
        try await db.read { c in
            var sources = Set<IndexedSource>()
            for row in try await c.rows("SELECT kind, ref, agent FROM source WHERE indexed") {
                let (kind, ref, agent) = try row.decode((String, String, String).self)
                guard let kind = IndexedSource.Kind(rawValue: kind) else { continue }
                sources.insert(IndexedSource(kind: kind, id: ref, agentID: agent))
            }
            return sources
        }
    }

    public func isIndexed(_ source: IndexedSource) async throws -> Bool {
        try await db.read { c in
            try await c.value("SELECT indexed FROM source WHERE kind = \(source.kind.rawValue) AND ref = \(source.id) AND agent = \(source.agentID)", as: Bool.self)
                ?? false
        }
    }

    public func vocabulary() async throws -> RecordVocabulary {
        let limit = Int64(RecordVocabulary.maximumListed + 1)
        return try await db.read { c in
            let types = try await c.rows("SELECT type FROM record_type ORDER BY type LIMIT \(limit)").map { try $0.decode(String.self) }
            // As the search's host filter matches: the registered name, or the contexts' for
            // sources indexed before devices were registered.
            let hosts = try await c.rows(
                """
                SELECT host FROM source WHERE host IS NOT NULL
                UNION SELECT c.host FROM context c JOIN source s ON s.id = c.source WHERE s.host IS NULL
                ORDER BY 1 LIMIT \(limit)
                """
            ).map { try $0.decode(String.self) }
            let apps = try await c.rows("SELECT DISTINCT app FROM context ORDER BY app LIMIT \(limit)").map { try $0.decode(String.self) }
            return RecordVocabulary.listed(types: types, hosts: hosts, apps: apps)
        }
    }

    public func remove(_ source: IndexedSource) async throws {
        try await db.write { c in
            guard let id = try await Self.sourceID(source, on: c) else { return }
            try await Self.delete(source: id, on: c)
        }
    }

    private static func delete(source id: Int64, on c: PostgresConnection) async throws {
        try await c.run("DELETE FROM record WHERE source = \(id)")
        try await c.run("DELETE FROM context WHERE source = \(id)")
        try await c.run("DELETE FROM source WHERE id = \(id)")
    }

    private static func sourceID(_ source: IndexedSource, on c: PostgresConnection) async throws -> Int64? {
        try await c.value("SELECT id FROM source WHERE kind = \(source.kind.rawValue) AND ref = \(source.id) AND agent = \(source.agentID)", as: Int64.self)
    }

    // MARK: Searching

    /// One snapshot for a page and its probes, as the embedded index reads in one transaction.
    private func snapshot<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        try await db.write { c in
            try await c.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return try await body(c)
        }
    }

    /// A pull's or a feedback's sources by id (matched by equality, which the (source, time)
    /// index orders).
    private static func sources(of search: RecordSearch, on c: PostgresConnection) async throws -> [Int64]? {
        var sources: [Int64]?
        for (kind, ref) in [("pull", search.pull), ("feedback", search.feedback), ("capture", search.capture)] {
            guard let ref else { continue }
            let found = Set(try await c.rows("SELECT id FROM source WHERE kind = \(kind) AND ref = \(ref)").map { try $0.decode(Int64.self) })
            sources = (sources.map { Set($0).intersection(found) } ?? found).sorted()
        }
        return sources
    }

    public func stats(_ search: RecordSearch) async throws -> RecordStats {
        let counted = RecordStats.counted(search), bound = RecordStats.maximumCounted
        return try await snapshot { c in
            let sources = try await Self.sources(of: counted, on: c)
            // The search's records in time order, `rows + 1` at most, as (ts, level, host):
            // counted and grouped by PostgreSQL, never read out one by one.
            func first(_ rows: Int) throws -> PostgresQuery {
                try PostgresRecordQuery(counted, sources: sources, select: PostgresRecordQuery.statsColumns, rows: rows).query
            }
            func around(_ query: PostgresQuery, _ outer: (String) -> String) -> PostgresQuery { PostgresQuery(unsafeSQL: outer("(\(query.sql)) AS q"), binds: query.binds) }
            // One pass for the count and the ends, over one record more than the bound: it tells
            // whether the count stops there; only then the ends of the first `bound` are read again.
            func ends(_ query: PostgresQuery) async throws -> (count: Int64, low: Int64?, high: Int64?) {
                guard let row = try await c.rows(around(query) { "SELECT count(*), min(ts), max(ts) FROM \($0)" }).first else { return (0, nil, nil) }
                let (count, low, high) = try row.decode((Int64, Int64?, Int64?).self)
                return (count, low, high)
            }
            var kept = try first(bound)
            var (count, low, high) = try await ends(kept)
            let over = count > Int64(bound)
            if over {
                kept = try first(bound - 1)
                (count, low, high) = try await ends(kept)
            }
            guard let low, let high else { return RecordStats.make(counted, over: over, first: nil, last: nil, buckets: [], hosts: [:]) }
            let span = RecordStats.Span(counted, first: low, last: high, over: over)
            // The second pass: per span, level and host at once.
            var buckets: [(bucket: Int64, level: Int, count: Int)] = [], hosts: [String: Int] = [:]
            for row in try await c.rows(around(kept) { "SELECT (ts - (\(span.from))) / \(span.width), level, host, count(*) FROM \($0) GROUP BY 1, 2, 3" }) {
                let (bucket, level, host, count) = try row.decode((Int64, Int32, String, Int64).self)
                buckets.append((bucket: bucket, level: Int(level), count: Int(count)))
                hosts[host, default: 0] += Int(count)
            }
            return RecordStats.make(counted, over: over, first: low, last: high, buckets: buckets, hosts: hosts)
        }
    }

    public func search(_ search: RecordSearch) async throws -> RecordPage {
        try await snapshot { c in
            let sources = try await Self.sources(of: search, on: c)
            let query = try PostgresRecordQuery(search, sources: sources)
            func exists(_ search: RecordSearch, after: String? = nil, before: String? = nil) async throws -> Bool {
                var probe = search
                (probe.after, probe.before, probe.limit, probe.arrivedAfter) = (after, before, 1, nil)
                let statement = try PostgresRecordQuery(probe, sources: sources)
                return try await !Self.read(statement.query, limit: 1, on: c).records.isEmpty
            }
            var (records, more) = try await Self.read(query.query, limit: query.limit, on: c)
            let plan = try PageCursors(search, records: &records, more: more, followsArrival: search.arrivedAfter != nil, backwards: query.backwards)
            var next = plan.next, previous = plan.previous
            if let after = plan.nextIfAnyAfter, try await exists(search, after: after) { next = after }
            if let before = plan.previousIfAnyBefore, try await exists(search, before: before) { previous = before }
            let indexing = try await c.value("SELECT count(*) FROM source WHERE NOT indexed", as: Int64.self) ?? 0
            let newest = try await c.value("SELECT coalesce(max(id), 0)::bigint FROM record", as: Int64.self) ?? 0
            return RecordPage(records: records, next: next, previous: previous, indexing: Int(indexing), newestID: newest)
        }
    }

    public func record(_ id: Int64, context: Int) async throws -> RecordInContext? {
        let count = Int64(min(max(context, 0), RecordInContext.maximumContext))
        return try await snapshot { c in
            let select = PostgresRecordQuery.columns + " " + PostgresRecordQuery.joins
            func rows(_ sql: String, _ values: [Int64]) async throws -> [FoundRecord] {
                var binds = PostgresBindings()
                for value in values { binds.append(value) }
                return try await Self.read(PostgresQuery(unsafeSQL: sql, binds: binds), limit: Int(count) + 1, on: c).records
            }
            guard let record = try await rows(select + " WHERE r.id = $1", [id]).first else { return nil }
            guard count > 0 else { return RecordInContext(record: record, before: [], after: []) }
            let source = "r.source = (SELECT source FROM record WHERE id = $1)"
            let ts = record.ts.microseconds
            let before = try await rows(select + " WHERE \(source) AND r.ts <= $2 AND (r.ts < $2 OR r.id < $1) ORDER BY r.ts DESC, r.id DESC LIMIT \(count)", [id, ts])
            let after = try await rows(select + " WHERE \(source) AND r.ts >= $2 AND (r.ts > $2 OR r.id > $1) ORDER BY r.ts, r.id LIMIT \(count)", [id, ts])
            return RecordInContext(record: record, before: before.reversed(), after: after)
        }
    }

    /// At most `limit` records of a statement selecting ``PostgresRecordQuery/columns``; `more`
    /// when it had another.
    private static func read(_ query: PostgresQuery, limit: Int, on c: PostgresConnection) async throws -> (records: [FoundRecord], more: Bool) {
        var records: [FoundRecord] = []
        for row in try await c.rows(query) {
            guard records.count < limit else { return (records, true) }
            let (id, ts, uid, level, type, message, metadata, kind, ref, agent, host, app, appVersion, os, process, device, deviceApp, deviceVersion, deviceOS) =
                try row.decode(
                    (Int64, Int64, String, Int32, String, String, String, String, String, String, String?, String?, String?, String?, String?,
                    String?, String?, String?, String?).self)
            let names = RecordNames(
                device: device.map { RegisteredDevice(hostname: $0, os: deviceOS ?? "", app: deviceApp ?? "", appVersion: deviceVersion ?? "") },
                context: (host ?? "", app ?? "", appVersion ?? "", os ?? "", process ?? ""))
            records.append(
                FoundRecord(
                    id: id, ts: Timestamp(microseconds: ts), level: LogLevel(rawValue: Int(level))?.name ?? "\(level)", type: type,
                    uid: uid, message: message, metadata: RecordMetadata(indexedText: metadata), agentID: agent, sourceKind: kind, sourceID: ref,
                    host: names.host, app: names.app, appVersion: names.appVersion, os: names.os, process: names.process,
                    claimedHost: names.claimedHost))
        }
        return (records, false)
    }
}

/// A ``RecordSearch`` as one PostgreSQL statement: the embedded index's query
/// (``SQLRecordQuery``) with `$n` parameters, full text as `tsquery` against `words` and
/// metadata matches as `jsonb` containment against `meta`.
struct PostgresRecordQuery {
    let query: PostgresQuery
    let limit: Int
    /// Read with `before`: the statement's rows come newest first.
    let backwards: Bool

    static let columns = """
        SELECT r.id, r.ts, r.uid, r.level, r.type, r.message, r.metadata, s.kind, s.ref, s.agent, c.host, c.app, c.app_version, c.os, c.process, \
        s.host, s.app, s.app_version, s.os
        """
    static let joins = "FROM record r JOIN source s ON s.id = r.source LEFT JOIN context c ON c.id = r.context"
    /// What ``RecordStats`` counts of each record: its time, level, and host as shown.
    static let statsColumns = "SELECT r.ts AS ts, r.level AS level, coalesce(s.host, c.host, '') AS host"

    /// `select` and `rows`: other columns than a page's (``statsColumns``), and how many rows at
    /// most (instead of the search's page size).
    init(_ search: RecordSearch, sources: [Int64]?, select: String? = nil, rows: Int? = nil) throws {
        limit = rows ?? min(max(search.limit ?? RecordSearch.defaultLimit, 1), RecordSearch.maximumLimit)
        var binds = PostgresBindings()
        func bind(_ value: some PostgresDynamicTypeEncodable) -> String {
            binds.append(value)
            return "$\(binds.count)"
        }
        var clauses: [String] = []
        if let uid = search.uid { clauses.append("r.uid = \(bind(uid.storable))") }
        if let since = search.since { clauses.append("r.ts >= \(bind(since.microseconds))") }
        if let until = search.until { clauses.append("r.ts < \(bind(until.microseconds))") }
        if let levels = search.levels, !levels.isEmpty {
            let numbers = try levels.map { name -> Int32 in
                guard let level = LogLevel(name: name) else {
                    throw RecordSearchError("unknown level '\(name)': levels are \(LogLevel.allCases.map(\.name).joined(separator: ", "))")
                }
                return Int32(level.rawValue)
            }
            clauses.append("r.level = ANY(\(bind(numbers))::int[])")
        }
        if let types = search.types, !types.isEmpty { clauses.append("r.type = ANY(\(bind(types.map(\.storable)))::text[])") }
        if let agents = search.agents, !agents.isEmpty {
            clauses.append("r.source IN (SELECT id FROM source WHERE agent = ANY(\(bind(agents.map(\.storable)))::text[]))")
        }
        if let sources {
            clauses.append(sources.count == 1 ? "r.source = \(bind(sources[0]))" : "r.source = ANY(\(bind(sources))::bigint[])")
        } else {
            if let pull = search.pull { clauses.append("r.source IN (SELECT id FROM source WHERE kind = 'pull' AND ref = \(bind(pull.storable)))") }
            if let feedback = search.feedback { clauses.append("r.source IN (SELECT id FROM source WHERE kind = 'feedback' AND ref = \(bind(feedback.storable)))") }
            if let capture = search.capture { clauses.append("r.source IN (SELECT id FROM source WHERE kind = 'capture' AND ref = \(bind(capture.storable)))") }
        }
        // By the registered host; by the context only for sources indexed without one.
        if let hosts = search.hosts, !hosts.isEmpty {
            let list = bind(hosts.map(\.storable))
            clauses.append("""
                (r.source IN (SELECT id FROM source WHERE host = ANY(\(list)::text[])) \
                OR r.context IN (SELECT c.id FROM context c JOIN source s ON s.id = c.source WHERE s.host IS NULL AND c.host = ANY(\(list)::text[])))
                """)
        }
        if let apps = search.apps, !apps.isEmpty {
            // The app the record's context names (the process that wrote it).
            clauses.append("r.context IN (SELECT id FROM context WHERE app = ANY(\(bind(apps.map(\.storable)))::text[]))")
        }
        if let text = search.text, !text.trimmingCharacters(in: .whitespaces).isEmpty {
            guard let terms = SearchText.terms(text) else { throw RecordSearchError("the text '\(text)' has no word to search for") }
            // Each term through the same parser as the records' words: a phrase's words in
            // order; a prefix as a quoted lexeme with `:*`.
            let queries = terms.map { term in
                term.isPrefix
                    ? "to_tsquery('dredge_text', \(bind(Self.prefixQuery(term.words))))"
                    : "phraseto_tsquery('dredge_text', \(bind(term.words.storable)))"
            }
            clauses.append("r.words @@ (\(queries.joined(separator: " && ")))")
        }
        for m in search.metadata ?? [] {
            guard !m.key.isEmpty, !m.key.contains("\"") else { throw RecordSearchError("metadata key '\(m.key)' cannot be searched (empty, or holds a \")") }
            if let problem = m.searchProblem { throw RecordSearchError(problem) }
            let forms = Self.containment(m).map { "dredge_json(r.metadata) @> \(bind($0))::jsonb" }
            clauses.append("(" + forms.joined(separator: " OR ") + ")")
        }
        let order: String
        if let arrived = search.arrivedAfter {
            guard search.before == nil else { throw RecordSearchError("before cannot be given with arrivedAfter: following arrivals reads forwards") }
            clauses.append("r.id > \(bind(arrived))")
            order = "r.id"
        } else if let before = search.before {
            guard search.after == nil else { throw RecordSearchError("give after or before, not both") }
            let (ts, id) = try SQLRecordQuery.cursor(before, "previous")
            let t = bind(ts)
            clauses.append("r.ts <= \(t) AND (r.ts < \(t) OR r.id < \(bind(id)))")
            order = "r.ts DESC, r.id DESC"
        } else {
            if let after = search.after {
                let (ts, id) = try SQLRecordQuery.cursor(after, "next")
                let t = bind(ts)
                clauses.append("r.ts >= \(t) AND (r.ts > \(t) OR r.id > \(bind(id)))")
            }
            order = "r.ts, r.id"
        }
        backwards = search.before != nil && search.arrivedAfter == nil
        let filter = clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ")
        query = PostgresQuery(unsafeSQL: "\(select ?? Self.columns) \(Self.joins) \(filter) ORDER BY \(order) LIMIT \(limit + 1)", binds: binds)
    }

    /// A prefix term for `to_tsquery`: the words quoted (quotes and backslashes doubled), `:*`.
    static func prefixQuery(_ words: String) -> String {
        "'" + words.storable.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "''") + "':*"
    }

    /// The JSON objects a record's metadata contains when its member equals the match's value
    /// written as text: the value as a string, and when it is a JSON number, `true`, `false` or
    /// `null` written exactly so, as that value.
    static func containment(_ match: MetadataMatch) -> [String] {
        let key = quoted(match.key.storable), value = match.value.storable
        var forms = ["{" + key + ":" + quoted(value) + "}"]
        if ["true", "false", "null"].contains(value) || Self.isJSONNumber(value) { forms.append("{" + key + ":" + value + "}") }
        return forms
    }

    /// Whether the text is one JSON number, as RFC 8259 writes it.
    static func isJSONNumber(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBufferPointer { JSONToken.number($0, from: 0)?.end == bytes.count }
    }

    /// A JSON string literal: quotes, backslashes and control characters escaped.
    static func quoted(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
