import DredgeDomain
import Foundation

/// Where one device's part of a live tail stands (#53, Protocol § 20).
public enum TailPartStatus: String, Codable, Sendable, CaseIterable {
    /// Sent to the device, not answered yet (sent again when it connects again).
    case delivered
    /// Accepted: the device sends what it logs.
    case running
    /// Refused by the device, with its reason (final).
    case rejected
    /// Over: the tail stopped or expired, the device could not go on, or the server ended the
    /// device's part because a batch broke the rules (final).
    case ended

    /// No further change will come.
    public var isFinal: Bool { self == .rejected || self == .ended }
}

/// One device's part of a live tail: what it holds so far.
public struct TailPart: Sendable, Equatable, Codable {
    public var agentID: String
    public var status: TailPartStatus
    /// Why it was refused or ended, or what the device said; empty when nothing was said.
    public var detail: String
    /// Where in the device's store the tail began (from its first `TailAccepted`); nil before.
    public var startCursor: UInt64?
    /// The last batch held, and where in the device's store it ended (0 and the start cursor:
    /// none held).
    public var heldSeq: UInt64
    public var heldCursor: UInt64
    /// Records held, and records the device said it left out (over a rate, too long, unreadable).
    public var records: Int64
    public var dropped: Int64
    /// Bytes of record lines held on the server's disk.
    public var bytes: Int64
    public var updatedAt: Date

    public init(
        agentID: String, status: TailPartStatus, detail: String = "", startCursor: UInt64? = nil, heldSeq: UInt64 = 0, heldCursor: UInt64 = 0, records: Int64 = 0,
        dropped: Int64 = 0, bytes: Int64 = 0, updatedAt: Date
    ) {
        self.agentID = agentID
        self.status = status
        self.detail = detail
        self.startCursor = startCursor
        self.heldSeq = heldSeq
        self.heldCursor = heldCursor
        self.records = records
        self.dropped = dropped
        self.bytes = bytes
        self.updatedAt = updatedAt
    }
}

/// Why and by whom a tail stopped before its expiry, or that it expired.
public struct TailStopping: Sendable, Equatable, Codable {
    public var at: Date
    /// Who stopped it: a token's name, a person, or `server` (it expired; a token revoked).
    public var by: String
    public var reason: String

    public init(at: Date, by: String, reason: String) {
        self.at = at
        self.by = by
        self.reason = reason
    }
}

/// A live tail (#53): whose records, which, how fast, until when, asked by whom, and each
/// device's part.
public struct TailRecord: Sendable, Equatable, Codable {
    public var id: String
    public var uid: String
    /// Only these devices (nil: every device that holds the uid, those that come to hold it
    /// during the tail included).
    public var agents: [String]?
    /// The records it shows: the filter's times are not used (a tail shows what is logged from
    /// its start).
    public var filter: LogFilter
    public var issuedAt: Timestamp
    public var expiresAt: Timestamp
    public var recordsPerSecond: UInt32
    public var bytesPerSecond: UInt64
    /// The devices also keep the user's debug and trace records while it runs (of
    /// `verboseTypes` only, when not empty).
    public var verbose: Bool
    public var verboseTypes: [String]
    public var requestedBy: String
    /// Why, as the requester said; nil when not said.
    public var reason: String?
    /// True when its requester marked it urgent (#54); nil (absent in JSON) otherwise.
    public var urgent: Bool?
    public var createdAt: Date
    /// Set once it stopped (by a person, or by the server at its expiry).
    public var stopped: TailStopping?
    public var parts: [TailPart]
    /// Set once what it held is deleted (by a person, or by the retention); the record stays.
    public var removed: Removal?

    public init(
        id: String, uid: String, agents: [String]?, filter: LogFilter, issuedAt: Timestamp, expiresAt: Timestamp, recordsPerSecond: UInt32, bytesPerSecond: UInt64,
        verbose: Bool, verboseTypes: [String], requestedBy: String, reason: String?, createdAt: Date, stopped: TailStopping?, parts: [TailPart],
        removed: Removal? = nil, urgent: Bool = false
    ) {
        self.urgent = urgent ? true : nil
        self.removed = removed
        self.id = id
        self.uid = uid
        self.agents = agents
        self.filter = filter
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.recordsPerSecond = recordsPerSecond
        self.bytesPerSecond = bytesPerSecond
        self.verbose = verbose
        self.verboseTypes = verboseTypes
        self.requestedBy = requestedBy
        self.reason = reason
        self.createdAt = createdAt
        self.stopped = stopped
        self.parts = parts
    }

    /// Neither stopped nor expired at `now`.
    public func isOpen(at now: Timestamp) -> Bool { stopped == nil && now < expiresAt }
}

/// What `POST /v1/tails` asks for (#53): a user's devices to watch, which of their records,
/// for how long, how fast at most, and why.
public struct TailRequest: Sendable, Equatable, Codable {
    public var uid: String
    /// Only this device (an agent id); nil: every device that holds the uid.
    public var agent: String?
    /// Only the devices of this host name; nil: any.
    public var host: String?
    /// Types, levels and text; its times and uid are not used (the tail's uid is `uid`).
    public var filter: LogFilter
    /// How long it runs: 1 s to 1 h; default 15 min.
    public var durationSeconds: Int?
    /// At most this many records a second per device (1–10,000; default 200), and bytes
    /// (1 KiB–16 MiB; default 1 MiB).
    public var recordsPerSecond: UInt32?
    public var bytesPerSecond: UInt64?
    /// The devices also keep the user's debug and trace records while it runs (of
    /// `verboseTypes` only, when given).
    public var verbose: Bool?
    public var verboseTypes: [String]?
    /// Why (a ticket): in the audit log. At most 256 bytes, no control characters.
    public var reason: String?
    /// Urgent (#54): devices whose upload policy allows urgent tails run it on a metered
    /// network too (Protocol § 22). Absent: not urgent.
    public var urgent: Bool?

    public init(
        uid: String, agent: String? = nil, host: String? = nil, filter: LogFilter = LogFilter(), durationSeconds: Int? = nil, recordsPerSecond: UInt32? = nil,
        bytesPerSecond: UInt64? = nil, verbose: Bool? = nil, verboseTypes: [String]? = nil, reason: String? = nil, urgent: Bool? = nil
    ) {
        self.urgent = urgent
        self.uid = uid
        self.agent = agent
        self.host = host
        self.filter = filter
        self.durationSeconds = durationSeconds
        self.recordsPerSecond = recordsPerSecond
        self.bytesPerSecond = bytesPerSecond
        self.verbose = verbose
        self.verboseTypes = verboseTypes
        self.reason = reason
    }

    public static let defaultDuration = 15 * 60
    public static let defaultRecordsPerSecond: UInt32 = 200
    public static let defaultBytesPerSecond: UInt64 = 1 << 20
}

/// One line of `GET /v1/tails/{id}/stream` (JSON lines): what the watcher is told, in the order
/// it happened.
public struct TailEvent: Sendable, Equatable, Codable {
    public enum Kind: String, Sendable, Codable {
        /// The devices: `devices` (each with its part's status), sent first and when one joins or ends.
        case devices
        /// A record a device logged: `agent`, `host`, `app`, `record` (the record's JSON object, Protocol § 13).
        case record
        /// A device left out `count` matching records (over the tail's rates, too long, unreadable).
        case dropped
        /// This watcher was too slow: `count` records were not sent to it (they are kept all the same).
        case missed
        /// The tail is over: `reason`. The last line.
        case end
    }

    public var kind: Kind
    public var agent: String?
    public var host: String?
    public var app: String?
    /// The record, as the device sent it (a JSON object).
    public var record: JSONValue?
    public var count: Int64?
    public var devices: [TailPart]?
    public var reason: String?
    /// The record's JSON text as the server stored it, in place of `record` on the server's
    /// side (written into the stream as it is, never decoded there); not part of the event's JSON.
    public var line: [UInt8]?

    enum CodingKeys: String, CodingKey {
        case kind, agent, host, app, record, count, devices, reason
    }

    public init(
        kind: Kind, agent: String? = nil, host: String? = nil, app: String? = nil, record: JSONValue? = nil, count: Int64? = nil, devices: [TailPart]? = nil,
        reason: String? = nil, line: [UInt8]? = nil
    ) {
        self.line = line
        self.kind = kind
        self.agent = agent
        self.host = host
        self.app = app
        self.record = record
        self.count = count
        self.devices = devices
        self.reason = reason
    }
}

extension TailEvent {
    /// The record: `record`, or `line` read (nil when neither holds a JSON value).
    public var recordValue: JSONValue? {
        record ?? line.flatMap { try? JSONDecoder().decode(JSONValue.self, from: Data($0)) }  // not JSON: no record to show
    }

    /// A `record` event's record as a search finds one (id 0: it has no index id yet), to be
    /// printed or shown as `dredge logs` and the console show records; nil for other events or
    /// a record without a readable time.
    public func foundRecord(tailID: String) -> FoundRecord? {
        guard kind == .record, case .object(let members)? = recordValue else { return nil }
        func string(_ key: String) -> String { if case .string(let s)? = members[key] { s } else { "" } }
        guard let ts = Timestamp(rfc3339: string("ts")) else { return nil }
        return FoundRecord(
            id: 0, ts: ts, level: string("level"), type: string("type"), uid: string("uid"), message: string("message"),
            metadata: RecordMetadata(members["metadata"] ?? .object([:])), agentID: agent ?? "", sourceKind: "tail", sourceID: tailID, host: host ?? "",
            app: app ?? "", appVersion: "", os: "", process: "")
    }
}
