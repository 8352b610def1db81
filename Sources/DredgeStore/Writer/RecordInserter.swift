import GRDB
import GRDBSQLite

/// Inserts a slice of entries inside the current write transaction with one prepared statement.
///
/// This is the store's hot path, so it talks to SQLite directly through GRDB's connection
/// handle: one prepare per batch, bind, step, reset.
struct RecordInserter {
    var encoder: EntryEncoder

    init(limits: StoreLimits) { self.encoder = EntryEncoder(limits: limits) }

    mutating func insert(_ entries: ArraySlice<LogEntry>, in db: Database) throws {
        guard let connection = db.sqliteConnection else { throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "closed") }
        var statement: OpaquePointer?
        try check(sqlite3_prepare_v2(connection, StoreSchema.insertLogSQL, -1, &statement, nil), connection)
        defer { sqlite3_finalize(statement) }
        for entry in entries {
            sqlite3_bind_int64(statement, 1, entry.timestamp.microseconds)
            sqlite3_bind_int64(statement, 2, Int64(entry.level.rawValue))
            SQLiteBind.text(statement, 3, entry.type.rawValue)
            SQLiteBind.text(statement, 4, encoder.uid(entry))
            SQLiteBind.text(statement, 5, encoder.message(entry))
            encoder.withMetadata(entry.metadata) { bytes -> Void in
                if let bytes {
                    _ = sqlite3_bind_text(statement, 6, UnsafeRawPointer(bytes.baseAddress!).assumingMemoryBound(to: CChar.self), Int32(bytes.count), SQLiteBind.transient)
                } else {
                    _ = sqlite3_bind_null(statement, 6)
                }
            }
            sqlite3_bind_int64(statement, 7, entry.context.rawValue)
            let rc = sqlite3_step(statement)
            guard rc == SQLITE_DONE else { try check(rc, connection); return }
            sqlite3_reset(statement)
        }
    }

    private func check(_ rc: Int32, _ connection: OpaquePointer) throws {
        guard rc != SQLITE_OK && rc != SQLITE_DONE else { return }
        throw DatabaseError(resultCode: ResultCode(rawValue: rc), message: String(cString: sqlite3_errmsg(connection)))
    }
}

/// Binding helpers shared by the inserter and the benchmarks' raw-SQLite baseline.
public enum SQLiteBind {
    public static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    public static func text(_ statement: OpaquePointer?, _ index: Int32, _ value: String) {
        var value = value
        value.withUTF8 { buffer in
            guard buffer.count > 0 else {
                _ = sqlite3_bind_text(statement, index, "", 0, transient)
                return
            }
            _ = sqlite3_bind_text(statement, index, UnsafeRawPointer(buffer.baseAddress!).assumingMemoryBound(to: CChar.self), Int32(buffer.count), transient)
        }
    }
}
