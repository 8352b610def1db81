import Foundation
import Logging
import NIOSSL
import PostgresNIO

/// The server's PostgreSQL database, shared by every node of a cluster: the second back end of
/// the persistence protocols (``PostgresAgentDirectory``, ``PostgresPullQueue``,
/// ``PostgresFeedbackInbox``, ``PostgresTokenVault``, ``PostgresRecordIndex``).
///
/// Opened from a `postgres://user:password@host:port/database` URL (``Location``). A pool of
/// connections (postgres-nio's `PostgresClient`) runs from the open until ``close()``. The
/// open migrates the schema (``PostgresSchema``) under a transaction-level advisory lock, so
/// several nodes starting at once migrate it once, in order.
///
/// Times are kept as the embedded back end keeps them (seconds since 1970 as `double
/// precision`, `_us` columns as microseconds in `bigint`), and text that is ordered or compared
/// by range is `COLLATE "C"`: byte order, whatever the database's locale.
public final class PostgresDatabase: Sendable {
    /// Where the database is: parsed from a URL, shown without its password.
    public struct Location: Sendable, CustomStringConvertible, Equatable {
        public enum TLSMode: String, Sendable {
            /// No TLS (a database on loopback or a private network).
            case disable
            /// TLS when the server offers it.
            case prefer
            /// TLS or no connection; the server's certificate verified against the system's roots or `sslrootcert`.
            case require
        }

        public var host: String
        public var port: Int
        public var user: String
        public var password: String?
        /// Why the password file was not used (libpq ignores such a file; the server logs this).
        public var passwordFileProblem: String?
        public var database: String
        /// The schema the tables live in (`search_path`); `public` unless the URL's `schema` says.
        public var schema: String
        public var tls: TLSMode
        /// A CA file (PEM) to verify the server with, instead of the system's roots.
        public var rootCertificate: String?

        /// `postgres://user[:password]@host[:port]/database[?sslmode=disable|prefer|require][&sslrootcert=FILE][&schema=NAME]`
        /// (also `postgresql://`). The password may be left out of the URL (and so out of
        /// `server.json` and command lines) and given in `PGPASSWORD`, or in a password file as
        /// libpq reads one: `PGPASSFILE`, else `~/.pgpass` (see ``passwordFile(_:host:port:database:user:)``).
        public init(url: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws {
            guard let parts = URLComponents(string: url), let scheme = parts.scheme, ["postgres", "postgresql"].contains(scheme.lowercased()) else {
                throw DeploymentError("the database address '\(Self.redacted(url))' is not a postgres:// URL")
            }
            guard let host = parts.host, !host.isEmpty else { throw DeploymentError("the database URL names no host") }
            guard let user = parts.user, !user.isEmpty else { throw DeploymentError("the database URL names no user (postgres://USER@host/database)") }
            let database = String(parts.path.drop(while: { $0 == "/" }))
            guard !database.isEmpty, !database.contains("/") else { throw DeploymentError("the database URL names no database (postgres://user@host/DATABASE)") }
            self.host = host
            self.port = parts.port ?? 5432
            guard (1...65_535).contains(port) else { throw DeploymentError("the database port \(port) is out of range") }
            self.user = user
            if let password = parts.password ?? environment["PGPASSWORD"] {
                self.password = password
            } else if let file = environment["PGPASSFILE"] ?? environment["HOME"].map({ $0 + "/.pgpass" }), FileManager.default.fileExists(atPath: file) {
                // As libpq: a file others may read is not used (said in `passwordFileProblem`).
                do {
                    self.password = try Self.passwordFile(file, host: host, port: parts.port ?? 5432, database: database, user: user)
                } catch let error as DeploymentError {
                    self.password = nil
                    self.passwordFileProblem = error.description
                }
            } else {
                self.password = nil
            }
            self.database = database
            var schema = "public", tls = TLSMode.prefer, root: String?
            for item in parts.queryItems ?? [] {
                let value = item.value ?? ""
                switch item.name {
                case "sslmode":
                    guard let mode = TLSMode(rawValue: value) else { throw DeploymentError("sslmode '\(value)' is not one of disable, prefer, require") }
                    tls = mode
                case "sslrootcert": root = value
                case "schema":
                    guard Self.isPlainName(value) else { throw DeploymentError("schema '\(value)' is not a plain name (letters, digits and _, 1 to 63)") }
                    schema = value
                default: throw DeploymentError("the database URL's parameter '\(item.name)' is not known: sslmode, sslrootcert and schema are")
                }
            }
            self.schema = schema
            self.tls = tls
            self.rootCertificate = root
        }

        /// The password for this host, port, database and user in a password file of libpq's
        /// form: lines `host:port:database:user:password`, `*` matching anything in the first
        /// four, `\:` and `\\` escapes, `#` comments; the first line that matches counts. Nil
        /// when none matches. Like libpq, a file that its group or others may read is not used
        /// (an error here, which the caller keeps as ``passwordFileProblem``).
        static func passwordFile(_ path: String, host: String, port: Int, database: String, user: String) throws -> String? {
            var info = stat()
            guard stat(path, &info) == 0 else { throw DeploymentError("the password file \(path) cannot be read: \(String(cString: strerror(errno)))") }
            guard info.st_mode & S_IFMT == S_IFREG else { throw DeploymentError("the password file \(path) is not a regular file") }
            guard info.st_mode & 0o077 == 0 else {
                throw DeploymentError("the password file \(path) may be read by others (mode \(String(info.st_mode & 0o777, radix: 8))): chmod 600 it")
            }
            guard let data = FileManager.default.contents(atPath: path) else { throw DeploymentError("the password file \(path) cannot be read") }
            for line in String(decoding: data, as: UTF8.self).split(whereSeparator: { $0 == "\n" || $0 == "\r\n" }) where !line.hasPrefix("#") {
                var fields: [String] = [], field = "", escaped = false
                for c in line {
                    if escaped {
                        field.append(c)
                        escaped = false
                    } else if c == "\\" {
                        escaped = true
                    } else if c == ":" && fields.count < 4 {
                        fields.append(field)
                        field = ""
                    } else {
                        field.append(c)
                    }
                }
                fields.append(field)
                guard fields.count == 5 else { continue }
                let wanted = [host, String(port), database, user]
                if zip(fields.prefix(4), wanted).allSatisfy({ $0 == "*" || $0 == $1 }) { return fields[4] }
            }
            return nil
        }

        /// A name used unquoted in SQL: lower-case letters, digits and `_`, not starting with a digit.
        static func isPlainName(_ name: String) -> Bool {
            guard let first = name.unicodeScalars.first, (1...63).contains(name.utf8.count), !("0"..."9").contains(first) else { return false }
            return name.unicodeScalars.allSatisfy { ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "_" }
        }

        /// The URL with its password replaced.
        static func redacted(_ url: String) -> String {
            guard var parts = URLComponents(string: url), parts.password != nil else { return url }
            parts.password = "***"
            return parts.string ?? "(unreadable URL)"
        }

        public var description: String { "postgres://\(user)@\(host):\(port)/\(database)" + (schema == "public" ? "" : "?schema=\(schema)") }

        func configuration() throws -> PostgresClient.Configuration {
            let tls: PostgresClient.Configuration.TLS
            switch self.tls {
            case .disable: tls = .disable
            case .prefer, .require:
                var config = TLSConfiguration.makeClientConfiguration()
                if let rootCertificate {
                    config.trustRoots = .file(rootCertificate)
                }
                tls = self.tls == .require ? .require(config) : .prefer(config)
            }
            var configuration = PostgresClient.Configuration(host: host, port: port, username: user, password: password, database: database, tls: tls)
            configuration.options.additionalStartupParameters = [("search_path", schema == "public" ? "public" : "\(schema), public"), ("application_name", "dredge-server")]
            configuration.options.connectTimeout = .seconds(10)
            return configuration
        }
    }

    let client: PostgresClient
    private let runner: Task<Void, Never>
    let logger: Logger
    public let location: Location
    /// How long its transactions take, once the running server attaches its metrics.
    public let meter = DatabaseMeter()

    /// Connects (waiting up to `connectTimeout` for the database to answer) and migrates.
    public init(_ location: Location, connectTimeout: Duration = .seconds(30), logger: Logger = Logger(label: "dredge.postgres")) async throws {
        self.location = location
        self.logger = logger
        let client = PostgresClient(configuration: try location.configuration(), backgroundLogger: logger)
        self.client = client
        runner = Task { await client.run() }
        do {
            try await Self.waitUntilReachable(client, location: location, timeout: connectTimeout, logger: logger)
            try await PostgresSchema.migrate(self)
        } catch {
            runner.cancel()
            throw error
        }
    }

    deinit { runner.cancel() }

    /// Stops the connection pool; the stores over this database fail afterwards.
    public func close() { runner.cancel() }

    static func waitUntilReachable(_ client: PostgresClient, location: Location, timeout: Duration, logger: Logger) async throws {
        let deadline = ContinuousClock.now + timeout
        var lastError: (any Error)?
        while ContinuousClock.now < deadline {
            do {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { _ = try await client.query("SELECT 1", logger: logger).collect() }
                    let wait = min(deadline - ContinuousClock.now, .seconds(30))
                    group.addTask {
                        try await Task.sleep(for: wait)
                        throw DeploymentError("no answer within \(wait)")
                    }
                    defer { group.cancelAll() }
                    try await group.next()
                }
                return
            } catch {
                lastError = error
                try await Task.sleep(for: .milliseconds(250))
            }
        }
        throw DeploymentError("cannot reach the database at \(location): \(lastError.map { String(reflecting: $0) } ?? "timed out")")
    }

    /// What PostgreSQL has counted of the work done on this database: rows written to the
    /// tables of this schema (inserted, updated, deleted), transactions committed in the
    /// database, and WAL written by the whole cluster. PostgreSQL publishes its counters with a
    /// delay (up to about ten seconds after a connection goes idle).
    public struct WriteCounters: Sendable {
        public var rows: Int64
        public var commits: Int64
        public var walBytes: Int64
    }

    public func writeCounters() async throws -> WriteCounters {
        try await read { c in
            let row = try await c.rows(
                """
                SELECT (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables WHERE schemaname = current_schema())::bigint,
                    (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())::bigint,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
                """)
            guard let first = row.first else { throw DeploymentError("PostgreSQL returned no counters") }
            let (rows, commits, wal) = try first.decode((Int64, Int64, Int64).self)
            return WriteCounters(rows: rows, commits: commits, walBytes: wal)
        }
    }

    /// Runs `body` on one connection, outside a transaction (each statement its own).
    @discardableResult
    func read<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        let start = ContinuousClock.now
        do {
            let value = try await client.withConnection { try await body($0) }
            meter.record(.read, took: ContinuousClock.now - start)
            return value
        } catch {
            let wrapped = DatabaseFailure.wrapping(error)
            meter.record(.read, took: ContinuousClock.now - start, failed: wrapped is DatabaseFailure)
            throw wrapped
        }
    }

    /// Runs one statement as written, in a transaction of its own: for tests and tools, never
    /// with text from outside.
    func execute(unsafeSQL sql: String) async throws {
        try await write { try await $0.run(PostgresQuery(unsafeSQL: sql)) }
    }

    /// Runs `body` in one transaction: committed when it returns, rolled back when it throws.
    @discardableResult
    func write<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        let start = ContinuousClock.now
        do {
            let value = try await client.withTransaction(logger: logger) { try await body($0) }
            meter.record(.write, took: ContinuousClock.now - start)
            return value
        } catch {
            let wrapped: any Error
            if let error = error as? PostgresTransactionError {
                // The closure's own error when it threw (a store's own error as it is), not the wrapper's.
                wrapped = DatabaseFailure.wrapping(error.closureError ?? error.beginError ?? error.commitError ?? error)
            } else {
                wrapped = DatabaseFailure.wrapping(error)
            }
            // Only the database's own failures count, not a store's refusal.
            meter.record(.write, took: ContinuousClock.now - start, failed: wrapped is DatabaseFailure)
            throw wrapped
        }
    }
}

/// What went wrong in the database, said plainly: postgres-nio's errors describe themselves
/// opaquely (so that a query's values never reach a log by accident); this keeps the server's
/// message and SQLSTATE (never the statement's values) or the connection failure. Errors that
/// are not the database's (a store's own) pass through unchanged.
public struct DatabaseFailure: Error, CustomStringConvertible {
    public let description: String
    /// The SQLSTATE code, when the server answered with an error.
    public let sqlState: String?

    /// `error` itself when it is not the database's.
    static func wrapping(_ error: any Error) -> any Error {
        guard let failure = DatabaseFailure(databaseError: error) else { return error }
        return failure
    }

    init?(databaseError error: any Error) {
        if let failure = error as? DatabaseFailure {
            self = failure
            return
        }
        guard let error = error as? PSQLError else { return nil }
        if let info = error.serverInfo {
            sqlState = info[.sqlState]
            description = "PostgreSQL: \(info[.message] ?? "error") (SQLSTATE \(info[.sqlState] ?? "?"))"
        } else {
            sqlState = nil
            description = "PostgreSQL: \(error.code)" + (error.underlying.map { ": \($0)" } ?? "")
        }
    }
}

extension PostgresConnection {
    /// Every row of a statement.
    func rows(_ query: PostgresQuery) async throws -> [PostgresRow] {
        try await self.query(query, logger: PostgresSchema.queryLogger).collect()
    }

    /// Runs a statement; its rows (a `RETURNING` list) are counted.
    @discardableResult
    func run(_ query: PostgresQuery) async throws -> Int {
        try await self.query(query, logger: PostgresSchema.queryLogger).collect().count
    }

    /// The first column of the first row, if any.
    func value<T: PostgresDecodable>(_ query: PostgresQuery, as type: T.Type = T.self) async throws -> T? {
        guard let row = try await rows(query).first else { return nil }
        return try row.decode(T.self)
    }
}

extension String {
    /// The string as PostgreSQL can store it: `text` cannot hold NUL, which becomes U+FFFD.
    /// (The embedded back end keeps NUL; payload files keep the original either way.)
    var storable: String { contains("\u{0}") ? replacingOccurrences(of: "\u{0}", with: "\u{FFFD}") : self }
}
