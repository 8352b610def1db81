import DredgeAdminAPI
import Foundation
import GRDB

// The rows of the server's database as record types: what the SQLite stores read and insert.
// Columns are snake_case; times are seconds since 1970 (REAL) unless named `_us`
// (microseconds, INTEGER). Decoding a row that does not fit its record throws; it never
// becomes a default.

/// A row read by column names in snake_case (a table's record, or the row of a join).
protocol SnakeCaseRow: Decodable, FetchableRecord {}

extension SnakeCaseRow {
    static var databaseColumnDecodingStrategy: DatabaseColumnDecodingStrategy { .convertFromSnakeCase }
}

protocol ServerRecord: SnakeCaseRow, Encodable, PersistableRecord {}

extension ServerRecord {
    static var databaseColumnEncodingStrategy: DatabaseColumnEncodingStrategy { .convertToSnakeCase }
}

struct AgentRow: ServerRecord {
    static let databaseTableName = "agent"
    var id: String
    var publicKey: Data
    var hostname: String
    var os: String
    var app: String
    var appVersion: String
    var enrolledAt: Double
    var connected: Bool = false
    var connectedAt: Double?
    var remoteAddress: String?
    var lastHeartbeatAt: Double?
    /// The uids of the last heartbeat, as a sorted JSON array: only to detect a change;
    /// `agent_uid` is the index pulls by uid read.
    var activeUids: String = "[]"
    var storeRecords: Int64 = 0
    /// Presence by generation: each authenticated connection gets the next number.
    var generation: Int64 = 0
    /// The device's labels (host info `extra`), as a JSON object.
    var labels: String = "{}"
    /// How many users the agent's last user report listed, and whether the store held more.
    var usersReported: Int64 = 0
    var usersTruncated: Bool = false
    /// SHA-256 of the last user report written, to skip writing the same one again.
    var usersDigest: String = ""
    /// When it was revoked, and by whom; nil while it may connect.
    var revokedAt: Double?
    var revokedBy: String?
}

/// A user an agent's report listed: the uid, and the hour of its newest record (µs).
struct AgentUserRow: ServerRecord {
    static let databaseTableName = "agent_user"
    var uid: String
    var agentId: String
    var lastSeenUs: Int64
}

struct AgentUIDRow: ServerRecord {
    static let databaseTableName = "agent_uid"
    var uid: String
    var agentId: String
}

struct PullRow: ServerRecord {
    static let databaseTableName = "pull"
    var id: String
    var uid: String
    var agentId: String
    /// ``StoredFilter`` text.
    var filter: String
    var issuedAt: Int64
    var expiresAt: Int64
    var wrappedKey: Data
    var requestedBy: String
    /// Why, as the requester said (a ticket); empty when not said.
    var reason: String
    var createdAt: Double
    var removedAt: Double?
    var removedBy: String?
    var removedReason: String?
    /// A scoped caller's pull: its scope as JSON (no agent joins it later); nil otherwise.
    var scope: String?
    /// It waits for a second person's approval (#55) until `approvedAt`.
    var approvalRequired: Bool = false
    var approvedBy: String?
    var approvedAt: Double?
    /// Marked urgent (#54).
    var urgent: Bool = false
}

extension Removal {
    /// From a row's `removed_*` columns: nil when not removed.
    init?(at: Double?, by: String?, reason: String?) {
        guard let at else { return nil }
        self.init(at: Date(timeIntervalSince1970: at), by: by ?? "?", reason: reason ?? "")
    }
}

struct PullTargetRow: ServerRecord {
    static let databaseTableName = "pull_target"
    var pullId: String
    var agentId: String
    var status: String
    var detail: String = ""
    var chunksReceived: Int = 0
    var chunkCount: Int = 0
    var bytes: Int64 = 0
    /// JSON array of paths.
    var files: String = "[]"
    var updatedAt: Double
    /// The wire error code a failed upload was answered with.
    var errorCode: Int?
}

struct AuditRow: ServerRecord {
    static let databaseTableName = "audit"
    var id: Int64?
    var at: Double
    var actor: String
    var action: String
    var detail: String
    /// ``AuditChain/link(after:at:actor:action:detail:)`` after the entry before it.
    var hash: Data?

    /// The entry, chained after the log's last one: inside the transaction that inserts it.
    /// Its text as PostgreSQL keeps it (a NUL as U+FFFD): SQLite's binding would cut it there,
    /// and the hash would not be over what is stored.
    static func chained(at: Double, actor: String, action: String, detail: String, in db: Database) throws -> AuditRow {
        let (actor, action, detail) = (actor.storable, action.storable, detail.storable)
        let previous = try Data.fetchOne(db, sql: "SELECT hash FROM audit ORDER BY id DESC LIMIT 1").map(Array.init) ?? AuditChain.genesis
        let hash = AuditChain.link(after: previous, at: at, actor: actor, action: action, detail: detail)
        return AuditRow(at: at, actor: actor, action: action, detail: detail, hash: Data(hash))
    }

    /// Hashes the entries written before the chain, in id order, from the genesis.
    static func chainExisting(_ db: Database) throws {
        var previous = AuditChain.genesis
        // Read as the verifier reads them (SQLitePullQueue.chainEntries).
        let sql = "SELECT id, CAST(at AS REAL) AS at, CAST(actor AS TEXT) AS actor, CAST(action AS TEXT) AS action, CAST(detail AS TEXT) AS detail FROM audit ORDER BY id"
        for row in try Row.fetchAll(db, sql: sql) {
            let hash = AuditChain.link(after: previous, at: row["at"] ?? 0, actor: row["actor"] ?? "", action: row["action"] ?? "", detail: row["detail"] ?? "")
            try db.execute(sql: "UPDATE audit SET hash = ? WHERE id = ?", arguments: [Data(hash), row["id"] as Int64])
            previous = hash
        }
    }
}

struct FeedbackRow: ServerRecord {
    static let databaseTableName = "feedback"
    var id: String
    var agentId: String
    var uid: String
    var text: String
    var createdAtUs: Int64
    var receivedAt: Double
    var status: String
    var detail: String = ""
    var chunksReceived: Int = 0
    var chunkCount: Int = 0
    var bytes: Int64 = 0
    var records: Int = 0
    /// JSON array of paths.
    var files: String = "[]"
    /// The wire error code a failed upload was answered with.
    var errorCode: Int?
    var removedAt: Double?
    var removedBy: String?
    var removedReason: String?
}

struct TokenRow: ServerRecord {
    static let databaseTableName = "token"
    var kind: String
    var name: String
    /// Lowercase hex SHA-256 of the token; the token itself is never stored.
    var sha256: String
    var createdAt: Double
    /// A token's expiry (seconds since 1970) and an enrollment token's uses left; nil: none.
    var expiresAt: Double?
    var usesLeft: Int?
    /// An admin token's role (`admin` for an enrollment token, unread) and scope as JSON (nil: every device).
    var role: String = AdminRole.admin.rawValue
    var scope: String?
}

// MARK: Statements kept prepared

// The paths every pull, heartbeat and connection takes run their statements through GRDB's
// per-connection statement cache (keyed by the SQL text), so SQLite parses each once per
// connection instead of on every call: parsing was 9 % of the server's CPU while pulls were
// timed against a fleet of 18,720 agents (`docs/benchmarks.md`). GRDB's query interface and
// `execute(sql:)` prepare anew each time; only statements built from a fixed text belong here.

extension Database {
    /// Runs one statement kept prepared on this connection.
    func run(_ sql: String, _ arguments: StatementArguments = []) throws {
        try cachedStatement(sql: sql).execute(arguments: arguments)
    }
}

/// A fetch of one statement kept prepared on the connection that runs it.
func prepared<T>(_ sql: String, _ arguments: StatementArguments = [], as _: T.Type = T.self) -> SQLRequest<T> {
    SQLRequest(sql: sql, arguments: arguments, cached: true)
}
