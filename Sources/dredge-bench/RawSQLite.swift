import DredgeDomain
import DredgeStore
import Foundation
import GRDBSQLite

/// Direct SQLite C API access: the baselines the store's figures are measured against.
final class RawSQLite {
    let db: OpaquePointer

    init(path: String) throws {
        var handle: OpaquePointer?
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK, let handle else {
            throw RawError(message: "cannot open \(path)")
        }
        db = handle
        try exec("PRAGMA journal_mode = WAL")
        try exec("PRAGMA synchronous = NORMAL")
        try exec("PRAGMA journal_size_limit = 4194304")
    }

    deinit { sqlite3_close_v2(db) }

    struct RawError: Error { var message: String }

    func exec(_ sql: String) throws {
        var error: UnsafeMutablePointer<CChar>?
        guard sqlite3_exec(db, sql, nil, nil, &error) == SQLITE_OK else {
            let message = error.map { String(cString: $0) } ?? "?"
            sqlite3_free(error)
            throw RawError(message: "\(sql): \(message)")
        }
    }

    func prepare(_ sql: String) throws -> OpaquePointer {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            throw RawError(message: "prepare \(sql): \(String(cString: sqlite3_errmsg(db)))")
        }
        return statement
    }
}
