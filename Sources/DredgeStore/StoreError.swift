import GRDB

/// An error from the log store. `code` says what kind of failure it is and is stable; the
/// message is for people and may change. New codes may be added, so switch with a default.
public struct StoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }

        /// The file at the store path exists but is not a SQLite database, or is damaged.
        /// The store never overwrites it.
        public static let notADatabase = Code("notADatabase")
        /// The file or its directory cannot be created or opened (missing parent that cannot be
        /// made, permissions, a path that is a directory).
        public static let cannotOpen = Code("cannotOpen")
        /// The store or its directory is read-only, so it cannot be written (SQLite also needs to
        /// create the `-wal` and `-shm` files beside it).
        public static let readOnly = Code("readOnly")
        /// The disk (or the configured page limit) is full. Records already stored are intact.
        public static let diskFull = Code("diskFull")
        /// Entries accepted by the queue could not be written; `count` says how many.
        public static let writeFailed = Code("writeFailed")
        /// The store was closed.
        public static let closed = Code("closed")
        /// Any other SQLite or I/O failure.
        public static let io = Code("io")
        /// A ``StoreConfiguration`` value out of its range (a queue of no entries, a negative
        /// limit); the message names it. Nothing was opened.
        public static let invalidConfiguration = Code("invalidConfiguration")
        /// An argument a store call cannot take (a verbosity window for no valid uid, one too
        /// many); nothing was written.
        public static let invalidArgument = Code("invalidArgument")

        public var description: String { name }
    }

    public var code: Code
    public var message: String
    public var path: String?

    public init(code: Code, message: String, path: String? = nil) {
        self.code = code
        self.message = message
        self.path = path
    }

    public var description: String {
        if let path { return "\(code) (\(path)): \(message)" }
        return "\(code): \(message)"
    }

    static func invalidArgument(_ message: String) -> StoreError { StoreError(code: .invalidArgument, message: message) }

    /// Classifies an error thrown by GRDB/SQLite or Foundation into a store error.
    static func wrap(_ error: any Error, path: String?) -> StoreError {
        if let error = error as? StoreError { return error }
        if let db = error as? DatabaseError {
            let code: Code
            switch db.resultCode {
            case .SQLITE_NOTADB, .SQLITE_CORRUPT: code = .notADatabase
            case .SQLITE_CANTOPEN, .SQLITE_PERM, .SQLITE_AUTH: code = .cannotOpen
            case .SQLITE_READONLY: code = .readOnly
            case .SQLITE_FULL: code = .diskFull
            default: code = .io
            }
            return StoreError(code: code, message: db.message ?? "\(db.resultCode)", path: path)
        }
        return StoreError(code: .io, message: "\(error)", path: path)
    }
}
