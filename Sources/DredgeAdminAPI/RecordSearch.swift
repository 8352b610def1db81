import DredgeDomain
import DredgeJSON
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
    /// Only records that arrived with this capture (#54).
    public var capture: String?
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
    /// The `previous` of a page: the page of records just before it, read backwards and handed
    /// out in time order. A cursor `<µs>.0` reads the records before that instant (a viewer
    /// opened "at" a moment). Not with `after` or `arrivedAfter`.
    public var before: String?
    /// Records per page: 1 to ``maximumLimit``; default 500.
    public var limit: Int?
    /// Only records that arrived after the record with this id, in arrival order (what
    /// `dredge logs --follow` asks); `after` and the time order do not apply then.
    public var arrivedAfter: Int64?

    /// Why (a ticket number, say): recorded in the audit log with the search.
    public var reason: String?

    public static let maximumLimit = 5000
    public static let defaultLimit = 500

    public init(
        uid: String? = nil, agents: [String]? = nil, hosts: [String]? = nil, apps: [String]? = nil, pull: String? = nil, feedback: String? = nil,
        since: Timestamp? = nil, until: Timestamp? = nil, levels: [String]? = nil, types: [String]? = nil, text: String? = nil,
        metadata: [MetadataMatch]? = nil, after: String? = nil, before: String? = nil, limit: Int? = nil, arrivedAfter: Int64? = nil, reason: String? = nil,
        capture: String? = nil
    ) {
        self.capture = capture
        self.before = before
        self.reason = reason
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
    /// this page is the last (for a page read with `before`: when no record follows it).
    public var next: String?
    /// Pass as `before` for the page before this one; nil on a first page read forwards, and
    /// when nothing is before it. (A page read with `after` from a cursor no record had names
    /// the page before its first record without looking.)
    public var previous: String?
    /// Landed pulls and feedback whose records are not all searchable yet (being indexed, or
    /// whose indexing failed and waits to be tried again).
    public var indexing: Int
    /// The id of the newest record in the index when this page was read: follow arrivals with
    /// `arrivedAfter` set to it.
    public var newestID: Int64

    public init(records: [FoundRecord], next: String?, previous: String? = nil, indexing: Int, newestID: Int64) {
        self.records = records
        self.next = next
        self.previous = previous
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
    /// The record's metadata, a JSON object (``RecordMetadata/value``).
    public var metadata: RecordMetadata
    public var agentID: String
    /// `pull` or `feedback`.
    public var sourceKind: String
    /// The pull's or the feedback's id.
    public var sourceID: String
    /// The device's host, as the server registered the agent that uploaded the record (for
    /// records indexed before hosts came from the registry: as the record's context gave it).
    public var host: String
    /// The app, its version and OS, and the process that wrote the record, as its context says.
    public var app: String
    public var appVersion: String
    public var os: String
    public var process: String
    /// The host the record's context claims, where it differs from the registered one (shown
    /// beside it, never in its place); nil otherwise.
    public var claimedHost: String?

    public init(
        id: Int64, ts: Timestamp, level: String, type: String, uid: String, message: String, metadata: RecordMetadata, agentID: String, sourceKind: String,
        sourceID: String, host: String, app: String, appVersion: String, os: String, process: String, claimedHost: String? = nil
    ) {
        self.claimedHost = claimedHost
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

extension FoundRecord {
    /// The host as a person reads it: the registered name, and what the record claimed beside it
    /// (`h2 (claims h1)`).
    public var hostShown: String { claimedHost.map { "\(host) (claims \($0))" } ?? host }
    /// The app and its version as a person reads them.
    public var appShown: String { appVersion.isEmpty ? app : "\(app) \(appVersion)" }
}

extension JSONValue {
    /// Parses JSON text in one pass of ``JSONScanner`` (no Foundation decoder): what the index
    /// uses to hand out records' metadata. Nil when `text` is not one JSON value, nests deeper
    /// than 64, or holds a number too large for a Double. Of a key given twice, the first counts
    /// (as SQLite's `json_extract`, which `--where` uses).
    public static func parse(_ text: String) -> JSONValue? {
        var text = text
        return text.withUTF8 { bytes in
            var builder = TreeBuilder()
            guard JSONScanner.document(bytes, limit: 64, &builder) else { return nil }
            return builder.result
        }
    }

    /// Builds the value from the walk: the open containers on stacks (each changed in place,
    /// never copied), each value added to the innermost one (under the name just read) or, at
    /// the top, kept as the result.
    private struct TreeBuilder: JSONVisitor {
        /// Per open container, in order: true for an object (its members in `objects`, the name
        /// being read in `names`), false for an array (its items in `arrays`).
        var open: [Bool] = []
        var objects: [[String: JSONValue]] = []
        var names: [String] = []
        var arrays: [[JSONValue]] = []
        var result: JSONValue?

        mutating func add(_ value: JSONValue) -> Bool {
            guard let isObject = open.last else {
                result = value
                return true
            }
            if isObject {
                let name = names[names.count - 1]
                if objects[objects.count - 1][name] == nil { objects[objects.count - 1][name] = value }
            } else {
                arrays[arrays.count - 1].append(value)
            }
            return true
        }

        mutating func beginObject(depth: Int) -> Bool {
            open.append(true)
            objects.append([:])
            names.append("")
            return true
        }

        mutating func name(_ name: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            names[names.count - 1] = Self.text(name, in: bytes)
            return true
        }

        mutating func endObject() -> Bool {
            open.removeLast()
            names.removeLast()
            return add(.object(objects.removeLast()))
        }

        mutating func beginArray(depth: Int) -> Bool {
            open.append(false)
            arrays.append([])
            return true
        }

        mutating func endArray() -> Bool {
            open.removeLast()
            return add(.array(arrays.removeLast()))
        }

        mutating func string(_ text: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool { add(.string(Self.text(text, in: bytes))) }

        mutating func number(_ range: Range<Int>, integral: Bool, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            let text = String(decoding: bytes[range], as: UTF8.self)
            if integral, let value = Int64(text) { return add(.integer(value)) }
            // 1e400 reads as infinity, which JSON cannot carry: not a value this parser hands out.
            guard let value = Double(text), value.isFinite else { return false }
            return add(.number(value))
        }

        mutating func literal(_ value: JSONLiteral) -> Bool {
            switch value {
            case .true: add(.bool(true))
            case .false: add(.bool(false))
            case .null: add(.null)
            }
        }

        static func text(_ text: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> String {
            text.escaped ? String(decoding: JSONString.unescape(bytes, text.range), as: UTF8.self) : String(decoding: bytes[text.range], as: UTF8.self)
        }
    }
}

/// One record and its context: the records just before and after it from the same device's
/// payload (its pull and agent, or its feedback), in time order. What
/// `GET /v1/records/{id}?context=N` answers and the console's record page shows.
public struct RecordInContext: Sendable, Equatable, Codable {
    public var record: FoundRecord
    /// Up to N records before it, oldest first.
    public var before: [FoundRecord]
    /// Up to N records after it, oldest first.
    public var after: [FoundRecord]

    /// The most records asked for on each side.
    public static let maximumContext = 200

    public init(record: FoundRecord, before: [FoundRecord], after: [FoundRecord]) {
        self.record = record
        self.before = before
        self.after = after
    }
}
