import DredgeDomain
import Foundation

/// A search over every record the server has received (pulls and feedback), as
/// `POST /v1/records/search` takes it and `dredge logs` sends it. Every member narrows the
/// result; nil or empty means "any". Records come back in one timeline, ordered by time (then
/// by arrival), one page at a time.
public struct RecordSearch: Sendable, Equatable, Codable {
    /// Only this user's records (exact).
    public var uid: String?
    /// Only records from these agents (ids).
    public var agents: [String]?
    /// Only records whose context names one of these hosts (exact).
    public var hosts: [String]?
    /// Only records whose context names one of these apps (exact).
    public var apps: [String]?
    /// Only records that arrived with this pull.
    public var pull: String?
    /// Only records that arrived with this feedback.
    public var feedback: String?
    /// Records at or after this time.
    public var since: Timestamp?
    /// Records before this time.
    public var until: Timestamp?
    /// Level names (`warning`, `error`, …).
    public var levels: [String]?
    /// Log type names.
    public var types: [String]?
    /// Full text over the message and the metadata: words (any case, accents ignored), all of
    /// them; `"a phrase"` in double quotes; `word*` for a prefix.
    public var text: String?
    /// Metadata members that must equal a value (top-level keys, compared as text).
    public var metadata: [MetadataMatch]?
    /// The `next` of the previous page.
    public var after: String?
    /// Records per page: 1 to ``maximumLimit``; default 500.
    public var limit: Int?
    /// Only records that arrived after the record with this id, in arrival order (what
    /// `dredge logs --follow` asks); `after` and the time order do not apply then.
    public var arrivedAfter: Int64?

    public static let maximumLimit = 5000
    public static let defaultLimit = 500

    public init(
        uid: String? = nil, agents: [String]? = nil, hosts: [String]? = nil, apps: [String]? = nil, pull: String? = nil, feedback: String? = nil,
        since: Timestamp? = nil, until: Timestamp? = nil, levels: [String]? = nil, types: [String]? = nil, text: String? = nil,
        metadata: [MetadataMatch]? = nil, after: String? = nil, limit: Int? = nil, arrivedAfter: Int64? = nil
    ) {
        self.uid = uid
        self.agents = agents
        self.hosts = hosts
        self.apps = apps
        self.pull = pull
        self.feedback = feedback
        self.since = since
        self.until = until
        self.levels = levels
        self.types = types
        self.text = text
        self.metadata = metadata
        self.after = after
        self.limit = limit
        self.arrivedAfter = arrivedAfter
    }
}

/// `key=value` on a record's metadata: the top-level member `key` equals `value` when written
/// as text (`503` matches the number 503 and the string "503"; `true`, `false` and `null`
/// match those JSON values and those strings).
public struct MetadataMatch: Sendable, Equatable, Codable {
    public var key: String
    public var value: String

    public init(key: String, value: String) {
        self.key = key
        self.value = value
    }

    /// `key=value`; the first `=` splits (a value may hold more). Nil without a `=` or a key.
    public init?(parsing text: String) {
        guard let equals = text.firstIndex(of: "="), equals != text.startIndex else { return nil }
        key = String(text[..<equals])
        value = String(text[text.index(after: equals)...])
    }
}

/// One page of a ``RecordSearch``.
public struct RecordPage: Sendable, Equatable, Codable {
    public var records: [FoundRecord]
    /// Pass as `after` for the next page (as `arrivedAfter` when following arrivals); nil when
    /// this page is the last.
    public var next: String?
    /// Landed pulls and feedback whose records are not all searchable yet (being indexed, or
    /// whose indexing failed and waits to be tried again).
    public var indexing: Int
    /// The id of the newest record in the index when this page was read: follow arrivals with
    /// `arrivedAfter` set to it.
    public var newestID: Int64

    public init(records: [FoundRecord], next: String?, indexing: Int, newestID: Int64) {
        self.records = records
        self.next = next
        self.indexing = indexing
        self.newestID = newestID
    }
}

/// A record found by a search, with where it came from.
public struct FoundRecord: Sendable, Equatable, Codable {
    /// The server's id of the record (arrival order).
    public var id: Int64
    /// The record's time, µs since the epoch.
    public var ts: Timestamp
    public var level: String
    public var type: String
    public var uid: String
    public var message: String
    /// The record's metadata, a JSON object.
    public var metadata: JSONValue
    public var agentID: String
    /// `pull` or `feedback`.
    public var sourceKind: String
    /// The pull's or the feedback's id.
    public var sourceID: String
    public var host: String
    public var app: String
    public var appVersion: String
    public var os: String
    public var process: String

    public init(
        id: Int64, ts: Timestamp, level: String, type: String, uid: String, message: String, metadata: JSONValue, agentID: String, sourceKind: String,
        sourceID: String, host: String, app: String, appVersion: String, os: String, process: String
    ) {
        self.id = id
        self.ts = ts
        self.level = level
        self.type = type
        self.uid = uid
        self.message = message
        self.metadata = metadata
        self.agentID = agentID
        self.sourceKind = sourceKind
        self.sourceID = sourceID
        self.host = host
        self.app = app
        self.appVersion = appVersion
        self.os = os
        self.process = process
    }
}

/// Any JSON value, as records' metadata holds them.
public enum JSONValue: Sendable, Hashable, Codable {
    case null
    case bool(Bool)
    case integer(Int64)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() {
            self = .null
        } else if let b = try? c.decode(Bool.self) {
            self = .bool(b)
        } else if let i = try? c.decode(Int64.self) {
            self = .integer(i)
        } else if let d = try? c.decode(Double.self) {
            self = .number(d)
        } else if let s = try? c.decode(String.self) {
            self = .string(s)
        } else if let a = try? c.decode([JSONValue].self) {
            self = .array(a)
        } else {
            self = .object(try c.decode([String: JSONValue].self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .integer(let i): try c.encode(i)
        case .number(let d): try c.encode(d)
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }

    /// Compact JSON with sorted keys.
    public var jsonText: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(self)).map { String(decoding: $0, as: UTF8.self) } ?? "null"  // encoding a JSONValue cannot fail but for non-finite numbers, which JSON lacks
    }
}
