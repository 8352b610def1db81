import DredgeDomain
import GRDB

/// Turns a ``LogFilter`` into SQL over the `log` table.
///
/// Index use: with a uid, `log_by_uid_ts (uid, ts)` serves both the range and the order; without
/// one, `log_by_ts (ts)`. Both indexes end in the rowid, so `ORDER BY ts, id` needs no sort and
/// results stream in time order straight off the index. Types, levels and text are checked on
/// the rows the index range yields.
struct LogQuery {
    var sql: String
    var arguments: StatementArguments

    static let columns = "id, ts, level, type, uid, message, metadata, context_id"

    init(filter: LogFilter, select: String = LogQuery.columns, ordered: Bool = true, limit: Int? = nil) {
        self.init(filter: filter, after: nil, select: select, ordered: ordered, limit: limit)
    }

    /// With `after`, the records stored after that row id, in the order the store took them
    /// (a live tail's read, ``LogStore/records(after:matching:limit:)``): the primary key's
    /// range serves it, never the uid's index, whose range holds every record of the user.
    init(filter: LogFilter, after: Int64?, select: String = LogQuery.columns, ordered: Bool = true, limit: Int? = nil) {
        var clauses: [String] = []
        var arguments = StatementArguments()
        if let after {
            clauses.append("id > ?")
            arguments += [after]
        }
        if let uid = filter.uid {
            // SQLite's binding ends a string at its first NUL: "u-1\0x" would select u-1's
            // records. A uid with a NUL matches no stored uid (none can hold one). After a row
            // id, `+uid` keeps the uid's index out of the plan.
            clauses.append(uid.utf8.contains(0) ? "0" : after == nil ? "uid = ?" : "+uid = ?")
            if !uid.utf8.contains(0) { arguments += [uid] }
        }
        if let since = filter.since {
            clauses.append("ts >= ?")
            arguments += [since.microseconds]
        }
        if let until = filter.until {
            clauses.append("ts < ?")
            arguments += [until.microseconds]
        }
        if let types = filter.types {
            let sorted = types.map(\.rawValue).sorted()
            clauses.append("type IN (\(sorted.map { _ in "?" }.joined(separator: ",")))")
            arguments += StatementArguments(sorted)
        }
        if let levels = filter.levels {
            let sorted = levels.map(\.rawValue).sorted()
            clauses.append("level IN (\(sorted.map { _ in "?" }.joined(separator: ",")))")
            arguments += StatementArguments(sorted)
        }
        if let text = filter.text, !text.isEmpty {
            let pattern = "%" + Self.escapeLike(text) + "%"
            clauses.append("(message LIKE ? ESCAPE '\\' OR metadata LIKE ? ESCAPE '\\')")
            arguments += [pattern, pattern]
        }
        var sql = "SELECT \(select) FROM log"
        if !clauses.isEmpty { sql += " WHERE " + clauses.joined(separator: " AND ") }
        if ordered { sql += after == nil ? " ORDER BY ts, id" : " ORDER BY id" }
        if let limit { sql += " LIMIT \(limit)" }
        self.sql = sql
        self.arguments = arguments
    }

    /// Escapes LIKE's wildcards by Unicode scalar: walking `Character`s would miss a `%`
    /// followed by a combining mark (one grapheme), leaving it a wildcard.
    static func escapeLike(_ text: String) -> String {
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            if scalar == "%" || scalar == "_" || scalar == "\\" { out.append("\\") }
            out.append(scalar)
        }
        return String(out)
    }
}
