import DredgeDomain
import GRDB
import GRDBSQLite

extension LogStore {
    /// Streams the matching records as JSON lines (the format of ``LogRecord/writeJSON(into:)``,
    /// newline included), in time order, straight from SQLite's column buffers into one reused
    /// byte buffer: no `LogRecord` and no Swift strings per record. This is the export's hot
    /// path; `body` must copy the bytes if it keeps them.
    public func forEachJSONLine(
        matching filter: LogFilter, _ body: (_ timestamp: Timestamp, _ context: ContextID, _ line: UnsafeRawBufferPointer) throws -> Void
    ) throws {
        let query = LogQuery(filter: filter, select: "ts, level, type, uid, message, metadata, context_id")
        do {
            try pool.read { db in
                // GRDB binds the arguments; the rows are read through the C API.
                let statement = try db.makeStatement(sql: query.sql)
                try statement.setArguments(query.arguments)
                let handle = statement.sqliteStatement
                var line: [UInt8] = []
                line.reserveCapacity(4096)
                var w = JSONWriter(reservingCapacity: 4096)
                while true {
                    let rc = sqlite3_step(handle)
                    if rc == SQLITE_DONE { break }
                    guard rc == SQLITE_ROW else {
                        throw DatabaseError(resultCode: ResultCode(rawValue: rc), message: String(cString: sqlite3_errmsg(db.sqliteConnection)))
                    }
                    let ts = Timestamp(microseconds: sqlite3_column_int64(handle, 0))
                    let level = LogLevel(rawValue: Int(sqlite3_column_int64(handle, 1))) ?? .info
                    w.reset()
                    w.writeRawBytes(JSONLineParts.ts)
                    ts.writeRFC3339(into: &w)
                    w.writeRawBytes(JSONLineParts.level)
                    w.writeRawBytes(JSONLineParts.levelNames[level.rawValue])
                    w.writeRawBytes(JSONLineParts.type)
                    w.writeString(columnBytes(handle, 2))
                    w.writeRawBytes(JSONLineParts.uid)
                    w.writeString(columnBytes(handle, 3))
                    w.writeRawBytes(JSONLineParts.message)
                    w.writeString(columnBytes(handle, 4))
                    w.writeRawBytes(JSONLineParts.metadata)
                    if sqlite3_column_type(handle, 5) == SQLITE_NULL {
                        w.writeRawBytes(JSONLineParts.emptyObject)
                    } else {
                        w.writeRawBytes(columnBytes(handle, 5))
                    }
                    w.writeRawBytes(JSONLineParts.context)
                    let context = sqlite3_column_int64(handle, 6)
                    w.writeDecimal(context)
                    w.writeRawBytes(JSONLineParts.end)
                    try w.bytes.withUnsafeBytes { try body(ts, ContextID(rawValue: context), $0) }
                }
            }
        } catch let error as DatabaseError {
            throw StoreError.wrap(error, path: path)
        }
    }
}

/// The constant pieces of a JSON line, as bytes.
private enum JSONLineParts {
    static let ts = Array(#"{"ts":""#.utf8)
    static let level = Array(#"","level":""#.utf8)
    static let levelNames = LogLevel.allCases.map { Array($0.name.utf8) }
    static let type = Array(#"","type":"#.utf8)
    static let uid = Array(#","uid":"#.utf8)
    static let message = Array(#","message":"#.utf8)
    static let metadata = Array(#","metadata":"#.utf8)
    static let emptyObject = Array("{}".utf8)
    static let context = Array(#","context":"#.utf8)
    static let end = Array("}\n".utf8)
}

/// The bytes of a text column, valid until the next step.
private func columnBytes(_ statement: OpaquePointer?, _ index: Int32) -> UnsafeBufferPointer<UInt8> {
    guard let text = sqlite3_column_text(statement, index) else { return UnsafeBufferPointer(start: nil, count: 0) }
    return UnsafeBufferPointer(start: text, count: Int(sqlite3_column_bytes(statement, index)))
}
