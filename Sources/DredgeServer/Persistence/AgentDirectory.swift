import Crypto
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import SwiftProtobuf

/// The enrolled agents and their presence, as the rest of the server sees them.
///
/// The rules every implementation keeps (``AgentDirectoryConformanceTests`` checks each):
/// - An agent's id is derived from its key; enrolling a key already enrolled throws
///   ``AlreadyEnrolled`` and changes nothing (whoever holds a token cannot rename an agent).
/// - Each ``connected(_:from:host:now:)`` returns a higher generation; only the newest
///   generation's ``disconnected(_:generation:)`` marks the agent offline.
/// - A heartbeat that breaks the protocol's rules (``HeartbeatRules/problem(with:)``) throws
///   and changes nothing; otherwise its active uids replace the agent's, its user report (when
///   it has one) replaces the agent's reported users, and ``holders(of:)`` finds the agent by
///   each uid of either (never by an invalid uid). A heartbeat without a report keeps the
///   reported users. It returns the uids the agent holds now and did not before.
/// - Host info is kept within the protocol's bounds (``WireHostInfo/bounded``).
/// - A revoked agent stays revoked: ``isRevoked(_:)`` says so, ``holders(of:)`` no longer finds
///   it, its record shows when and by whom; its key stays enrolled (it cannot enroll again).
public protocol AgentDirectory: Sendable {
    /// The server (a node of a cluster) starts: marks offline every agent it held, never
    /// another node's (on a shared database a dead node's agents read as offline by its lease).
    func resetPresence() async throws
    /// Registers a key, handed the server keys of generation `keyGeneration`; returns the agent id.
    func enroll(publicKey: RSAPublicKey, host: WireHostInfo, keyGeneration: Int, now: Date) async throws -> String
    func publicKey(of agentID: String) async throws -> RSAPublicKey?
    /// The generation of the server's keys the agent pins, as last known (README § Key
    /// rotation): the one it enrolled with, or the last it said it pins; nil for an agent not
    /// enrolled.
    func keyGeneration(of agentID: String) async throws -> Int?
    /// Records the generation the agent says it pins now.
    func setKeyGeneration(_ agentID: String, _ generation: Int) async throws
    /// How many enrolled agents (revoked left out) pin each generation.
    func keyGenerations() async throws -> [Int: Int]
    /// The agent authenticated on a new connection; returns that connection's generation.
    func connected(_ agentID: String, from address: String?, host: WireHostInfo, now: Date) async throws -> Int64
    func disconnected(_ agentID: String, generation: Int64) async throws
    /// Returns the uids the agent holds after this heartbeat that it did not hold before.
    @discardableResult
    func heartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) async throws -> Set<String>
    /// Takes the heartbeat into memory if that is all it needs (nothing new in it, no write
    /// due), without waiting: true if it did, which is what ``heartbeat(_:_:now:)`` would have
    /// done, returning no uids. False: nothing changed; call ``heartbeat(_:_:now:)``. The
    /// listener answers a heartbeat taken this way on its event loop, without a task.
    /// A directory that holds nothing in memory answers false (the default).
    func holdHeartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) -> Bool
    /// The agents that hold `uid` (in their active uids or their user report), by agent id,
    /// each with when it last saw the uid (nil when only its active uids hold it: within the
    /// last day of its last heartbeat).
    func holders(of uid: String) async throws -> [UIDHolder]
    /// The uids an agent holds (its active uids and its reported users): whose live tails it
    /// runs (#53).
    func uids(of agentID: String) async throws -> Set<String>
    func isEnrolled(_ agentID: String) async throws -> Bool
    /// By host name, then id.
    func agents() async throws -> [AgentRecord]
    /// The device an agent is registered as (its host info, bounded), or nil for an agent not
    /// enrolled. What the index names an upload's records by, whatever its payload claims.
    func device(_ agentID: String) async throws -> RegisteredDevice?
    /// Revokes the agent (a lost or stolen device, a decommissioned host): from now on it may
    /// not authenticate and pulls by uid do not reach it; what it uploaded is kept. On a
    /// shared database every node is told (its connection there is closed).
    func revoke(_ agentID: String, by actor: String, at: Date) async throws -> Revocation
    /// Whether the agent was revoked.
    func isRevoked(_ agentID: String) async throws -> Bool
    /// Of these agents, those revoked.
    func revoked(among agentIDs: [String]) async throws -> [String]
}

/// What revoking an agent came to.
public enum Revocation: Sendable, Equatable {
    case revoked
    /// It was already, since then.
    case alreadyRevoked(Date)
    /// No agent has that id.
    case unknown
}

/// A device as the server's registry knows it: what its agent said of itself at its last
/// connection. The agent id is the identity; these are names, and two agents may give the same.
public struct RegisteredDevice: Sendable, Equatable {
    public var hostname: String
    public var os: String
    public var app: String
    public var appVersion: String

    public init(hostname: String, os: String, app: String, appVersion: String) {
        self.hostname = hostname
        self.os = os
        self.app = app
        self.appVersion = appVersion
    }

    init(_ host: WireHostInfo) {
        let host = host.bounded
        self.init(hostname: host.hostname, os: host.os, app: host.app, appVersion: host.appVersion)
    }
}

/// An agent that holds a uid, and when it last saw it.
public struct UIDHolder: Sendable, Equatable {
    public var agentID: String
    /// The hour of the uid's newest record in the agent's store, as its user report said; nil
    /// when only the agent's active uids hold it.
    public var lastSeen: Date?

    public init(agentID: String, lastSeen: Date?) {
        self.agentID = agentID
        self.lastSeen = lastSeen
    }
}

/// What the protocol allows a heartbeat to say (§ Heartbeats).
public enum HeartbeatRules {
    /// Why a heartbeat breaks the rules, or nil: at most MAX_ACTIVE_UIDS active uids, at most
    /// MAX_REPORTED_USERS reported users, each uid valid, none reported twice (byte for byte), each
    /// time in 1970–9999.
    public static func problem(with heartbeat: WireHeartbeat) -> String? {
        if heartbeat.activeUids.count > WireLimits.maxActiveUIDs {
            return "heartbeat lists \(heartbeat.activeUids.count) uids; at most \(WireLimits.maxActiveUIDs)"
        }
        if let bad = heartbeat.activeUids.lazy.compactMap(UserID.problem).first { return "heartbeat lists an invalid uid: \(bad)" }
        guard heartbeat.hasUsers else { return nil }
        let users = heartbeat.users.users
        if users.count > WireLimits.maxReportedUsers {
            return "user report lists \(users.count) users; at most \(WireLimits.maxReportedUsers)"
        }
        // Byte for byte: Swift's String equality would take two spellings of "é" for one uid,
        // which the store (and SQLite) keep apart.
        var seen = Set<[UInt8]>()
        for user in users {
            if let bad = UserID.problem(user.uid) { return "user report lists an invalid uid: \(bad)" }
            if !Timestamp.acceptedRange.contains(user.lastSeenUs) { return "user report gives a last_seen_us outside 1970–9999" }
            if !seen.insert(Array(user.uid.utf8)).inserted { return "user report lists a uid twice" }
        }
        return nil
    }
}

extension HeartbeatRules {
    /// The report with every `last_seen_us` truncated to the hour, as an agent should have sent
    /// it (§ Heartbeats): the server keeps no finer time of a user than the hour.
    public static func onTheHour(_ report: WireUserReport) -> WireUserReport {
        let hour = WireLimits.userReportGranularityMicroseconds
        guard report.users.contains(where: { $0.lastSeenUs % hour != 0 }) else { return report }
        var truncated = report
        for i in truncated.users.indices { truncated.users[i].lastSeenUs -= truncated.users[i].lastSeenUs % hour }
        return truncated
    }
}

/// Enrollment of a key the directory already holds.
public struct AlreadyEnrolled: Error, CustomStringConvertible, Sendable {
    public var agentID: String
    public var description: String { "this key is already enrolled (agent \(agentID))" }
}

/// Feedback uploads as the server received them.
///
/// The rules every implementation keeps (``FeedbackInboxConformanceTests`` checks each):
/// - ``begin(id:agentID:uid:text:createdAt:chunkCount:bytes:at:)`` records a feedback the
///   first time; later calls for the same id change nothing.
/// - A final status (complete, failed) never changes; nil progress keeps what is stored.
/// - ``usage(agentID:since:)`` counts what one agent began in the window, and their bytes.
/// - ``failAbandoned(now:after:)`` fails only feedback still open `after` its beginning.
/// - ``markRemoved(_:by:reason:at:)`` records a removal once and fails an open upload;
///   ``removable(receivedUntil:limit:)`` lists only final feedback not removed, received at or
///   before the cutoff.
public protocol FeedbackInbox: Sendable {
    func begin(id: String, agentID: String, uid: String, text: String, createdAt: Timestamp, chunkCount: Int, bytes: Int64, at: Date) async throws
    /// `errorCode`: the wire code a failed upload was answered with; nil keeps what is stored.
    func update(_ id: String, status: FeedbackStatus, detail: String, chunksReceived: Int?, records: Int?, files: [String]?, errorCode: Int?) async throws -> Bool
    func usage(agentID: String, since: Date) async throws -> (count: Int, bytes: Int64)
    func failAbandoned(now: Date, after: Duration) async throws -> Int
    func feedback(_ id: String) async throws -> FeedbackRecord?
    /// Newest first.
    func all(limit: Int) async throws -> [FeedbackRecord]
    /// Records that the feedback's files and index rows are deleted (the caller deletes them,
    /// after this); an upload still open becomes `failed`. A feedback removed before keeps its
    /// first removal. Nil for an unknown feedback.
    func markRemoved(_ id: String, by actor: String, reason: String, at: Date) async throws -> RemovalMark?
    /// Feedback kept long enough: not removed, final, and received at or before `cutoff`.
    /// Oldest first.
    func removable(receivedUntil cutoff: Date, limit: Int) async throws -> [String]
}

/// The usual defaults: now.
extension AgentDirectory {
    public func enroll(publicKey: RSAPublicKey, host: WireHostInfo) async throws -> String { try await enroll(publicKey: publicKey, host: host, now: Date()) }
    /// Handed the first generation's keys.
    public func enroll(publicKey: RSAPublicKey, host: WireHostInfo, now: Date) async throws -> String {
        try await enroll(publicKey: publicKey, host: host, keyGeneration: 1, now: now)
    }
    @discardableResult
    public func connected(_ agentID: String, from address: String?, host: WireHostInfo) async throws -> Int64 {
        try await connected(agentID, from: address, host: host, now: Date())
    }
    @discardableResult
    public func heartbeat(_ agentID: String, _ heartbeat: WireHeartbeat) async throws -> Set<String> { try await self.heartbeat(agentID, heartbeat, now: Date()) }
    public func holdHeartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) -> Bool { false }
    /// From the whole listing; the back ends read the one row.
    public func device(_ agentID: String) async throws -> RegisteredDevice? {
        try await agents().first { $0.agentID == agentID }.map { RegisteredDevice(hostname: $0.hostname, os: $0.os, app: $0.app, appVersion: $0.appVersion) }
    }
    /// The ids of the agents that hold `uid`, in order.
    public func agentIDs(withUID uid: String) async throws -> [String] { try await holders(of: uid).map(\.agentID) }

    /// One at a time; the stores ask the database once.
    public func revoked(among agentIDs: [String]) async throws -> [String] {
        var revoked: [String] = []
        for id in agentIDs where try await isRevoked(id) { revoked.append(id) }
        return revoked
    }
}

/// The usual defaults: now, and nothing but the status and its detail.
extension FeedbackInbox {
    public func begin(id: String, agentID: String, uid: String, text: String, createdAt: Timestamp, chunkCount: Int, bytes: Int64) async throws {
        try await begin(id: id, agentID: agentID, uid: uid, text: text, createdAt: createdAt, chunkCount: chunkCount, bytes: bytes, at: Date())
    }
}

/// Writing and reading an agent's stored columns, the same for every implementation.
enum AgentRows {
    static func json(_ value: some Encodable) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    /// A user report's SHA-256 (hex) over its deterministic serialization; nil if it cannot be
    /// serialized (then it is always written).
    static func digest(_ report: WireUserReport) -> String? {
        var options = BinaryEncodingOptions()
        options.useDeterministicOrdering = true
        guard let bytes = try? report.serializedBytes(options: options) as [UInt8] else { return nil }
        return Hex.encode(SHA256.hash(data: bytes))
    }

    /// A stored labels column; one that does not read as an object of strings shows as none
    /// (labels are descriptive: the agent sends them again on its next connection).
    static func labels(_ json: String) -> [String: String] {
        (try? JSONDecoder().decode([String: String].self, from: Data(json.utf8))) ?? [:]
    }
}
