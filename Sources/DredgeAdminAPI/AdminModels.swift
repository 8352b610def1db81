import DredgeDomain
import Foundation

// The admin API's messages: JSON bodies with ISO 8601 dates, the same types on both sides.
// The routes are listed in docs/admin-api.md.

/// An enrolled agent and what the server last heard from it.
public struct AgentRecord: Sendable, Equatable, Codable {
    public var agentID: String
    /// The device's host name, its OS, and the app whose logs it holds with that app's version,
    /// as the agent last described itself (from its newest record's context).
    public var hostname: String
    public var os: String
    public var app: String
    public var appVersion: String
    /// Free labels from the device's context (`region=eu`).
    public var labels: [String: String]
    public var enrolledAt: Date
    public var connected: Bool
    public var connectedAt: Date?
    public var remoteAddress: String?
    public var lastHeartbeatAt: Date?
    /// Uids with records in the last day (the heartbeat's active uids).
    public var activeUIDs: [String]
    /// Uids the store holds records of, whatever their age (the agent's user report).
    public var reportedUsers: Int
    /// The store holds more users than its report could list.
    public var usersTruncated: Bool
    public var storeRecords: UInt64
    /// In a listing by uid (`GET /v1/agents?uid=`): the hour of that uid's newest record on
    /// this agent, as its user report said (nil when only its active uids hold the uid).
    public var uidLastSeen: Date?
    /// When it was revoked (`dredge agents revoke`), and by whom: it may not connect again.
    public var revokedAt: Date?
    public var revokedBy: String?

    public init(
        agentID: String, hostname: String, os: String, app: String, appVersion: String, labels: [String: String] = [:], enrolledAt: Date, connected: Bool,
        connectedAt: Date?, remoteAddress: String?, lastHeartbeatAt: Date?, activeUIDs: [String], reportedUsers: Int = 0, usersTruncated: Bool = false,
        storeRecords: UInt64, uidLastSeen: Date? = nil, revokedAt: Date? = nil, revokedBy: String? = nil
    ) {
        self.revokedAt = revokedAt
        self.revokedBy = revokedBy
        self.agentID = agentID
        self.hostname = hostname
        self.os = os
        self.app = app
        self.appVersion = appVersion
        self.labels = labels
        self.enrolledAt = enrolledAt
        self.connected = connected
        self.connectedAt = connectedAt
        self.remoteAddress = remoteAddress
        self.lastHeartbeatAt = lastHeartbeatAt
        self.activeUIDs = activeUIDs
        self.reportedUsers = reportedUsers
        self.usersTruncated = usersTruncated
        self.storeRecords = storeRecords
        self.uidLastSeen = uidLastSeen
    }

    enum CodingKeys: String, CodingKey {
        case agentID, hostname, os, app, appVersion, labels, enrolledAt, connected, connectedAt, remoteAddress, lastHeartbeatAt, activeUIDs, reportedUsers
        case usersTruncated, storeRecords, uidLastSeen, revokedAt, revokedBy
    }

    /// Fields added after the first release (labels, the user report) read as empty when a
    /// server does not send them.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        agentID = try c.decode(String.self, forKey: .agentID)
        hostname = try c.decode(String.self, forKey: .hostname)
        os = try c.decode(String.self, forKey: .os)
        app = try c.decode(String.self, forKey: .app)
        appVersion = try c.decode(String.self, forKey: .appVersion)
        labels = try c.decodeIfPresent([String: String].self, forKey: .labels) ?? [:]
        enrolledAt = try c.decode(Date.self, forKey: .enrolledAt)
        connected = try c.decode(Bool.self, forKey: .connected)
        connectedAt = try c.decodeIfPresent(Date.self, forKey: .connectedAt)
        remoteAddress = try c.decodeIfPresent(String.self, forKey: .remoteAddress)
        lastHeartbeatAt = try c.decodeIfPresent(Date.self, forKey: .lastHeartbeatAt)
        activeUIDs = try c.decode([String].self, forKey: .activeUIDs)
        reportedUsers = try c.decodeIfPresent(Int.self, forKey: .reportedUsers) ?? 0
        usersTruncated = try c.decodeIfPresent(Bool.self, forKey: .usersTruncated) ?? false
        storeRecords = try c.decode(UInt64.self, forKey: .storeRecords)
        uidLastSeen = try c.decodeIfPresent(Date.self, forKey: .uidLastSeen)
        revokedAt = try c.decodeIfPresent(Date.self, forKey: .revokedAt)
        revokedBy = try c.decodeIfPresent(String.self, forKey: .revokedBy)
    }
}

/// Where a pull stands for one agent: `queued → delivered → exporting → uploading → complete`,
/// or one of the final failures with a reason.
public enum PullStatus: String, Codable, Sendable, CaseIterable {
    case queued, delivered, exporting, uploading, complete, rejected, failed, expired

    /// No further change will come.
    public var isFinal: Bool {
        switch self {
        case .complete, .rejected, .failed, .expired: true
        case .queued, .delivered, .exporting, .uploading: false
        }
    }
}

/// Where a feedback upload stands: being received, or finally complete or failed (it has no
/// command, so none of a pull's other statuses).
public enum FeedbackStatus: String, Codable, Sendable, CaseIterable {
    case uploading, complete, failed

    /// No further change will come.
    public var isFinal: Bool { self != .uploading }
}

/// One pull for one agent.
public struct PullTarget: Sendable, Equatable, Codable {
    public var pullID: String
    public var agentID: String
    public var status: PullStatus
    /// The reason for a rejection or failure, or what is happening now.
    public var detail: String
    public var chunksReceived: Int
    public var chunkCount: Int
    /// Bytes of the encrypted upload received so far.
    public var bytes: Int64
    /// The decrypted per-day files and the manifest, absolute paths on the server, once complete.
    public var files: [String]
    public var updatedAt: Date
    /// When the server failed the upload: the protocol's error code it answered with (Protocol
    /// § Errors, e.g. 10 for `ERROR_CHUNK_AUTH_FAILED`), which it answers again if the agent
    /// begins that upload once more. Nil otherwise.
    public var errorCode: Int?

    public init(
        pullID: String, agentID: String, status: PullStatus, detail: String, chunksReceived: Int, chunkCount: Int, bytes: Int64, files: [String], updatedAt: Date,
        errorCode: Int? = nil
    ) {
        self.pullID = pullID
        self.agentID = agentID
        self.status = status
        self.detail = detail
        self.chunksReceived = chunksReceived
        self.chunkCount = chunkCount
        self.bytes = bytes
        self.files = files
        self.updatedAt = updatedAt
        self.errorCode = errorCode
    }
}

/// A pull: what was asked, by whom, and where it stands per agent.
public struct PullRecord: Sendable, Equatable, Codable {
    public var id: String
    public var uid: String
    public var agentID: String
    /// What was asked for; nil when the stored filter no longer reads back (the pull is then
    /// failed, never delivered as a wider filter).
    public var filter: LogFilter?
    public var issuedAt: Timestamp
    public var expiresAt: Timestamp
    /// The name of the admin token that asked (or `local-operator` for `dredge-server pull`).
    public var requestedBy: String
    /// Why, as the requester said (a ticket); nil when not said (and for pulls made before
    /// the server kept it: theirs is in the audit log alone).
    public var reason: String?
    public var targets: [PullTarget]
    /// Set once the pull's files and index rows are deleted (`dredge rm`, or kept past the
    /// server's retention); the record itself stays.
    public var removed: Removal?
    /// Bytes its files take on the server's disk (the per-day files, manifests and zips), as
    /// the admin API measured when it answered; nil when not measured.
    public var diskBytes: Int64?
    /// On a deployment that requires a second person's approval (#55): who approved and when,
    /// or nothing yet (the pull waits, sent to no device, until approved or expired). Nil when
    /// the pull needed no approval.
    public var approval: PullApproval?
    /// Made by a scoped caller (#55): the scope it was limited to. Such a pull reaches the
    /// devices it was made for only; none joins it later. Nil for an unscoped pull.
    public var scope: AccessScope?
    /// True when its requester marked it urgent (#54): devices whose upload policy allows it
    /// let it by. Nil (absent in JSON) otherwise.
    public var urgent: Bool?

    /// Made under required approvals and not approved yet: no device has been sent it.
    public var isAwaitingApproval: Bool { approval.map { $0.approvedAt == nil } ?? false }

    public init(
        id: String, uid: String, agentID: String, filter: LogFilter?, issuedAt: Timestamp, expiresAt: Timestamp, requestedBy: String, reason: String? = nil,
        targets: [PullTarget], removed: Removal? = nil, diskBytes: Int64? = nil, approval: PullApproval? = nil, scope: AccessScope? = nil, urgent: Bool = false
    ) {
        self.urgent = urgent ? true : nil
        self.scope = scope
        self.approval = approval
        self.id = id
        self.uid = uid
        self.agentID = agentID
        self.filter = filter
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.requestedBy = requestedBy
        self.reason = reason
        self.targets = targets
        self.removed = removed
        self.diskBytes = diskBytes
    }

    /// Every target has reached a final status; a pull with no target yet (by a uid no agent
    /// holds so far) is finished only once it has expired.
    public var isFinished: Bool { isFinished(at: .now) }

    public func isFinished(at now: Timestamp) -> Bool {
        targets.isEmpty ? expiresAt <= now : targets.allSatisfy { $0.status.isFinal }
    }
}

/// A pull's approval by a second person (#55): by whom and when; both nil while it waits.
public struct PullApproval: Sendable, Equatable, Codable {
    public var approvedBy: String?
    public var approvedAt: Date?

    public init(approvedBy: String? = nil, approvedAt: Date? = nil) {
        self.approvedBy = approvedBy
        self.approvedAt = approvedAt
    }
}

/// A pull's or a feedback's files and index rows, deleted: when, and by whom.
public struct Removal: Sendable, Equatable, Codable {
    public var at: Date
    /// The admin token's name, `local-operator`, or ``Removal/retention`` (kept past the
    /// server's retention).
    public var by: String
    /// Why, as the remover said (empty: not said).
    public var reason: String

    /// The actor of removals made by the server's retention.
    public static let retention = "retention"

    public init(at: Date, by: String, reason: String = "") {
        self.at = at
        self.by = by
        self.reason = reason
    }
}

/// `DELETE /v1/pulls/{id}` and `DELETE /v1/feedback/{id}`: what was removed.
public struct RemovalReport: Sendable, Equatable, Codable {
    public enum Kind: String, Sendable, Codable {
        case pull, feedback, tail
        /// What a standing trigger fired on one device (#54).
        case capture
    }

    public var kind: Kind
    public var id: String
    /// The removal in effect: this one, or the earlier one when it was removed before.
    public var removal: Removal
    /// False when it had been removed before (then nothing more was deleted, unless files a
    /// late upload left behind).
    public var newlyRemoved: Bool
    /// Bytes deleted from the server's disk now.
    public var freedBytes: Int64
    /// Sources (a pull's files from one agent, or a feedback) taken out of the search index now.
    public var unindexedSources: Int

    public init(kind: Kind, id: String, removal: Removal, newlyRemoved: Bool, freedBytes: Int64, unindexedSources: Int) {
        self.kind = kind
        self.id = id
        self.removal = removal
        self.newlyRemoved = newlyRemoved
        self.freedBytes = freedBytes
        self.unindexedSources = unindexedSources
    }
}

/// `POST /v1/pulls`: by uid (every agent that holds it, and those that come to hold it before it
/// expires), by agent, or both (that agent only).
public struct PullRequest: Sendable, Equatable, Codable {
    public var uid: String?
    public var agent: String?
    public var filter: LogFilter
    /// How long the pull may wait for an offline agent before it expires.
    public var expiresInSeconds: Int?
    /// Why (a ticket number, say): recorded in the audit log. At most 256 bytes, no control characters.
    public var reason: String?
    /// Urgent (#54): a device's upload policy lets it by when it allows urgent pulls
    /// (Protocol § 22). Absent: not urgent.
    public var urgent: Bool?

    public init(uid: String?, agent: String?, filter: LogFilter, expiresInSeconds: Int? = nil, reason: String? = nil, urgent: Bool? = nil) {
        self.urgent = urgent
        self.uid = uid
        self.agent = agent
        self.filter = filter
        self.expiresInSeconds = expiresInSeconds
        self.reason = reason
    }
}

/// How a pull's reason is searched: ASCII letters folded to lower case, every other character
/// as written; a reason matches when its folded text holds the folded search (both back ends
/// and the CLI fold alike).
public enum PullReason {
    public static func folded(_ text: String) -> String {
        String(decoding: text.utf8.map { (65...90).contains($0) ? $0 + 32 : $0 }, as: UTF8.self)
    }
}

/// The rule for a `reason` (on a pull or a search): nil when it is fine.
public func reasonProblem(_ reason: String) -> String? {
    if reason.utf8.count > 256 { return "a reason is at most 256 bytes" }
    if reason.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) { return "a reason holds no control characters" }
    return nil
}

/// Which kind of secret a token is.
public enum TokenKind: String, Codable, Sendable, CaseIterable {
    /// Engineers: the admin API.
    case admin
    /// Agents: `dredge-agent enroll`.
    case enrollment
}

/// A token as listed: never the secret itself, which is shown once when made.
public struct TokenInfo: Sendable, Equatable, Codable {
    public var name: String
    public var kind: TokenKind
    public var createdAt: Date
    /// When it ends: refused from then on (nil: it does not expire).
    public var expiresAt: Date?
    /// An enrollment token's enrollments left (nil: no limit).
    public var usesLeft: Int?
    /// An admin token's role and scope (#55); enrollment tokens have neither. Servers before
    /// roles send neither: every admin token was an admin then.
    public var role: AdminRole?
    public var scope: AccessScope?

    public init(name: String, kind: TokenKind, createdAt: Date, expiresAt: Date? = nil, usesLeft: Int? = nil, role: AdminRole? = nil, scope: AccessScope? = nil) {
        self.name = name
        self.kind = kind
        self.createdAt = createdAt
        self.expiresAt = expiresAt
        self.usesLeft = usesLeft
        self.role = kind == .admin ? role ?? .admin : nil
        self.scope = kind == .admin && scope?.isEverything == false ? scope : nil
    }
}

/// `POST /v1/tokens`.
public struct TokenRequest: Sendable, Equatable, Codable {
    public var name: String
    public var kind: TokenKind
    /// Seconds until it expires (60 to a year; none: it does not).
    public var expiresInSeconds: Int?
    /// Enrollment tokens only: how many agents may enroll with it (1 to 1,000,000; none: any).
    public var uses: Int?
    /// Admin tokens only: the role (none: admin) and the scope (none: every device; an admin
    /// has none).
    public var role: AdminRole?
    public var scope: AccessScope?

    public init(name: String, kind: TokenKind, expiresInSeconds: Int? = nil, uses: Int? = nil, role: AdminRole? = nil, scope: AccessScope? = nil) {
        self.name = name
        self.kind = kind
        self.expiresInSeconds = expiresInSeconds
        self.uses = uses
        self.role = role
        self.scope = scope
    }

    public static let expiryRange = 60...(366 * 86_400)
    public static let usesRange = 1...1_000_000

    /// Why these limits cannot be, or nil.
    public var limitsProblem: String? {
        if kind == .admin, uses != nil { return "only enrollment tokens have a number of uses" }
        if kind == .enrollment, role != nil || scope != nil { return "only admin tokens have a role or a scope" }
        if role == .admin, scope?.isEverything == false { return "an admin has no scope: give the token the role investigator or reader to scope it" }
        if let problem = scope?.problem { return problem }
        if let expiresInSeconds, !Self.expiryRange.contains(expiresInSeconds) { return "expiresInSeconds must be 60 (a minute) to \(Self.expiryRange.upperBound) (a year)" }
        if let uses, !Self.usesRange.contains(uses) { return "uses must be 1 to 1,000,000" }
        return nil
    }
}

/// The answer to `POST /v1/tokens`: the only time the secret is shown.
public struct TokenCreated: Sendable, Equatable, Codable {
    public var info: TokenInfo
    public var token: String

    public init(info: TokenInfo, token: String) {
        self.info = info
        self.token = token
    }
}

/// `GET /v1/audit/verify`: the audit log's hash chain checked from its first entry (#55).
/// Each entry's hash covers its content and the previous entry's hash, so an entry edited,
/// removed or moved breaks the chain there. Entries cut from the end leave it whole: compare
/// `lastID` and `lastHash` with a copy kept elsewhere (the server's `audit.file`).
public struct AuditVerification: Sendable, Equatable, Codable {
    /// Entries checked: all of them (the check goes on past a break).
    public var entries: Int
    /// The last entry: its id and hash (hex).
    public var lastID: Int64?
    public var lastHash: String?
    /// Where and why the chain first breaks, said plainly; nil when it holds.
    public var broken: String?
    public var brokenAt: Int64?
    /// How many places it breaks at (each break is checked past, from the entry's own hash).
    public var breaks: Int

    public var intact: Bool { broken == nil }

    public init(entries: Int = 0, lastID: Int64? = nil, lastHash: String? = nil, broken: String? = nil, brokenAt: Int64? = nil, breaks: Int? = nil) {
        (self.entries, self.lastID, self.lastHash, self.broken, self.brokenAt) = (entries, lastID, lastHash, broken, brokenAt)
        self.breaks = breaks ?? (broken == nil ? 0 : 1)
    }
}

/// One line of the audit log.
public struct AuditEntry: Sendable, Equatable, Codable {
    /// Its place in the log (newer entries have larger ids): page with `before`.
    public var id: Int64?
    public var at: Date
    /// The admin token's name (`local-operator` for the server's own command line; `-` for a
    /// request no token authenticated).
    public var actor: String
    public var action: String
    public var detail: String

    public init(id: Int64? = nil, at: Date, actor: String, action: String, detail: String) {
        self.id = id
        self.at = at
        self.actor = actor
        self.action = action
        self.detail = detail
    }
}

/// Which audit entries to read, newest first (`GET /v1/audit`).
public struct AuditQuery: Sendable, Equatable {
    /// Whether `action` names one action of the log (matched exactly) rather than a group.
    public static func isExact(_ action: String) -> Bool { AuditAction(rawValue: action) != nil }

    /// Entries at or after this time.
    public var since: Date?
    /// Only this actor's (exact).
    public var actor: String?
    /// Only this action: one of the log's actions (``AuditAction``) exactly (`pull` is the pulls
    /// made, not their downloads or removals); any other name is a group, the actions starting
    /// with it and a `.` (`token` finds `token.create` and `token.revoke`).
    public var action: String?
    /// Entries older than the one with this id: the next page.
    public var before: Int64?
    public var limit: Int

    public init(since: Date? = nil, actor: String? = nil, action: String? = nil, before: Int64? = nil, limit: Int = 1000) {
        self.since = since
        self.actor = actor
        self.action = action
        self.before = before
        self.limit = limit
    }
}

/// Every error the API returns: a status code and this body.
public struct APIErrorBody: Sendable, Equatable, Codable {
    /// Stable, for programs: `unauthorized`, `not_found`, `no_agent`, `bad_request`, `conflict`, `internal`.
    public var code: String
    /// For people.
    public var error: String

    public init(code: String, error: String) {
        self.code = code
        self.error = error
    }
}

extension JSONEncoder {
    /// The admin API's encoder: ISO 8601 dates, sorted keys.
    public static var adminAPI: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }
}

extension JSONDecoder {
    public static var adminAPI: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

/// A user's feedback, uploaded by their agent with their recent logs.
public struct FeedbackRecord: Sendable, Equatable, Codable {
    public var id: String
    public var agentID: String
    public var uid: String
    public var text: String
    /// When the user gave it (the device's clock).
    public var createdAt: Timestamp
    public var receivedAt: Date
    public var status: FeedbackStatus
    public var detail: String
    public var chunksReceived: Int
    public var chunkCount: Int
    public var bytes: Int64
    public var records: Int
    /// The decrypted per-day files and the manifest, absolute paths on the server.
    public var files: [String]
    /// When the server failed the upload: the protocol's error code it answered with (as in
    /// ``PullTarget/errorCode``). Nil otherwise.
    public var errorCode: Int?
    /// Set once its files and index rows are deleted; the record stays.
    public var removed: Removal?
    /// Bytes its files take on the server's disk, as the admin API measured; nil when not measured.
    public var diskBytes: Int64?

    public init(
        id: String, agentID: String, uid: String, text: String, createdAt: Timestamp, receivedAt: Date, status: FeedbackStatus, detail: String,
        chunksReceived: Int, chunkCount: Int, bytes: Int64, records: Int, files: [String], errorCode: Int? = nil, removed: Removal? = nil, diskBytes: Int64? = nil
    ) {
        self.removed = removed
        self.diskBytes = diskBytes
        self.id = id
        self.agentID = agentID
        self.uid = uid
        self.text = text
        self.createdAt = createdAt
        self.receivedAt = receivedAt
        self.status = status
        self.detail = detail
        self.chunksReceived = chunksReceived
        self.chunkCount = chunkCount
        self.bytes = bytes
        self.records = records
        self.files = files
        self.errorCode = errorCode
    }
}

/// A byte count as people read it: `512 B`, `12.5 KiB`, `3.2 MiB`.
public func byteText(_ n: Int64) -> String {
    if n < 1024 { return "\(n) B" }
    if n < 1024 * 1024 { return String(format: "%.1f KiB", Double(n) / 1024) }
    return String(format: "%.1f MiB", Double(n) / 1024 / 1024)
}

/// One downloadable file of a pull (`GET /v1/pulls/{id}/files`): an agent's per-day JSON-lines
/// files, its manifest, and the agent's whole decrypted zip; of a feedback the same; of a live
/// tail (`GET /v1/tails/{id}/files`), each device's records and contexts as far as they are held.
public struct PullFile: Sendable, Equatable, Codable {
    public enum Kind: String, Sendable, Codable {
        /// A per-day JSON-lines file.
        case day
        /// The upload's `manifest.json`.
        case manifest
        /// Everything the agent sent, as one zip.
        case zip
        /// A live tail's records from one device, as it sent them (Protocol § 13's lines).
        case records
        /// The contexts a live tail's records name, one `{"N":{…}}` object a line.
        case contexts
    }

    public var agentID: String
    public var name: String
    public var kind: Kind
    public var size: Int64
    /// Lowercase hex of the file's SHA-256.
    public var sha256: String

    public init(agentID: String, name: String, kind: Kind, size: Int64, sha256: String) {
        self.agentID = agentID
        self.name = name
        self.kind = kind
        self.size = size
        self.sha256 = sha256
    }
}

/// `POST /v1/agents/{id}/revoke`: why (a ticket, "laptop stolen"), recorded in the audit log.
public struct AgentRevocationRequest: Sendable, Equatable, Codable {
    public var reason: String?
    public init(reason: String? = nil) { self.reason = reason }
}
