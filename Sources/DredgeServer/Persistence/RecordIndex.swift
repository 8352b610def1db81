import DredgeAdminAPI
import DredgeDomain
import Foundation

/// Where the records that arrived are searched: every landed pull and feedback, record by
/// record, with full text over the message and the metadata. Fed by the ``Indexer``, read by
/// the admin API's search route.
///
/// The index is derived data: the files under `pulls/` and `feedback/` stay the truth, and a
/// source can always be indexed again from them. The rules every implementation keeps
/// (``RecordIndexConformanceTests`` checks each):
/// - ``begin(_:contexts:device:landedAt:)`` starts a source over: records of an earlier,
///   unfinished attempt are removed first, so a source indexed twice holds its records once.
///   With a `device`, records are named by it (host, app, version, OS), whatever their
///   contexts say; a context's host or app that differs is kept as claimed, beside it.
/// - ``add(_:lines:admitting:)`` takes whole lines, each one JSON record (Protocol § Payload); a
///   line that is not a readable record (or, with a day, not one of that day) is counted, never
///   fatal, and never half-stored. With a uid, a record of any other uid is counted as foreign
///   and not stored.
/// - A source is listed by ``indexedSources()`` only once ``finish(_:)`` ran.
/// - ``remove(_:)`` removes a source's records and contexts; searching finds none after.
/// - ``search(_:)`` returns records in (time, id) order, each page after the one its `after`
///   names (or, with `before`, the records just before that cursor), and `next` only when more
///   may follow.
/// - ``record(_:context:)`` finds a record by id, with up to `context` records of the same
///   source on each side in (time, id) order.
public protocol RecordIndex: Sendable {
    /// Starts (or starts over) indexing a source whose records refer to `contexts` by key;
    /// `device` is the uploading agent as the registry knows it (nil: names come from the
    /// contexts alone).
    func begin(_ source: IndexedSource, contexts: [String: LogContext], device: RegisteredDevice?, landedAt: Date) async throws
    /// Indexes records: `lines` holds whole lines, each ending in `\n`, of which it keeps those
    /// `admission` admits (the day of their file, the uid the pull or feedback asked for).
    func add(_ source: IndexedSource, lines: [UInt8], admitting admission: LineAdmission) async throws -> IndexCount
    /// Marks the source complete.
    func finish(_ source: IndexedSource) async throws
    /// Sources whose indexing finished.
    func indexedSources() async throws -> Set<IndexedSource>
    /// Whether this source's indexing finished.
    func isIndexed(_ source: IndexedSource) async throws -> Bool
    /// Removes a source's records; a source not indexed is no error.
    func remove(_ source: IndexedSource) async throws
    func search(_ search: RecordSearch) async throws -> RecordPage
    /// The record with this id and up to `context` (at most ``RecordInContext/maximumContext``)
    /// records of its source on each side; nil when no record has it.
    func record(_ id: Int64, context: Int) async throws -> RecordInContext?
    /// The types, hosts and apps the records have (``RecordVocabulary``): types of every record
    /// ever added, hosts and apps as the search's filters match them.
    func vocabulary() async throws -> RecordVocabulary
    /// How many records `search`'s filters match (its cursor and page size aside), per level,
    /// per host and over time (``RecordStats``), counted in time order up to a bound.
    func stats(_ search: RecordSearch) async throws -> RecordStats
}

extension RecordVocabulary {
    /// From lists read with a limit one over ``maximumListed``: cut, and `more` when any was over.
    static func listed(types: [String], hosts: [String], apps: [String]) -> RecordVocabulary {
        let cap = maximumListed
        return RecordVocabulary(
            types: Array(types.prefix(cap)), hosts: Array(hosts.filter { !$0.isEmpty }.prefix(cap)), apps: Array(apps.filter { !$0.isEmpty }.prefix(cap)),
            more: types.count > cap || hosts.count > cap || apps.count > cap)
    }
}

extension RecordIndex {
    /// Named by the contexts alone.
    public func begin(_ source: IndexedSource, contexts: [String: LogContext], landedAt: Date) async throws {
        try await begin(source, contexts: contexts, device: nil, landedAt: landedAt)
    }

    /// Every readable record.
    public func add(_ source: IndexedSource, lines: [UInt8]) async throws -> IndexCount { try await add(source, lines: lines, admitting: .any) }
}

extension MetadataMatch {
    /// Why the index cannot search for this match, or nil: a value written as a JSON number
    /// that a 64-bit float cannot hold (`1e999999`, or `1e-999999`, which is not 0), or with an
    /// exponent beyond ±1000 (`0e-999999`). No record
    /// can hold such a number as one, and PostgreSQL's `numeric` refuses it. Both back ends
    /// refuse it the same way (a 400 at the admin API), never a server error.
    var searchProblem: String? {
        guard PostgresRecordQuery.isJSONNumber(value), let number = Double(value) else { return nil }
        let digits = value.prefix { $0 != "e" && $0 != "E" }
        // An exponent written beyond ±1000 (even of a zero) is past what `numeric` takes; its
        // digits are counted, never converted (`e-9223372036854775808` must not trap).
        let exponent = value.drop { $0 != "e" && $0 != "E" }.dropFirst().drop { $0 == "+" || $0 == "-" }.drop { $0 == "0" }
        let tooLarge = exponent.count > 4 || (Int(exponent) ?? 0) > 1000
        if !number.isFinite || (number == 0 && digits.contains(where: { ("1"..."9").contains($0) })) || tooLarge {
            return "metadata value \(value) is a number beyond what a 64-bit float holds: no record can hold it"
        }
        return nil
    }
}

/// How a found record names its device: by the source's registered host when the index has
/// one, with the context's host beside it as claimed where it differs (a context that names
/// none claims nothing); else by the context alone (sources indexed before the index kept the
/// device). What both back ends read a record with.
struct RecordNames {
    var host = "", app = "", appVersion = "", os = "", process = ""
    var claimedHost: String?

    init(device: RegisteredDevice?, context: (host: String, app: String, appVersion: String, os: String, process: String)) {
        process = context.process
        guard let device else {
            (host, app, appVersion, os) = (context.host, context.app, context.appVersion, context.os)
            return
        }
        host = device.hostname
        if !context.host.isEmpty && context.host != device.hostname { claimedHost = context.host }
        // The app, version and OS of the process that wrote the record, as its context says:
        // they describe the record, not which device sent it (the registry's app is a label the
        // operator may set, `--app`); the registry's where the context says none.
        app = context.app.isEmpty ? device.app : context.app
        appVersion = context.appVersion.isEmpty ? device.appVersion : context.appVersion
        os = context.os.isEmpty ? device.os : context.os
    }
}

/// Another indexer (a node of the cluster, ``PostgresRecordIndex``) is indexing this source now:
/// it finishes it, or, if it dies, the source is free again once its lease runs out.
public struct IndexedElsewhere: Error, CustomStringConvertible, Sendable {
    public var source: IndexedSource
    /// The node that holds the source.
    public var node: String
    public var description: String { "\(source) is being indexed by node \(node)" }
}

/// A landed payload: a pull's files from one agent, one feedback's, or what a live tail held
/// of one device.
public struct IndexedSource: Sendable, Hashable, CustomStringConvertible {
    public enum Kind: String, Sendable, Hashable, Codable {
        case pull, feedback
        /// What a live tail held of one device (#53), indexed when the device's part ends.
        case tail
        /// What a standing trigger fired on one device (#54).
        case capture
    }

    public var kind: Kind
    /// The pull's or the feedback's id.
    public var id: String
    public var agentID: String

    public init(kind: Kind, id: String, agentID: String) {
        self.kind = kind
        self.id = id
        self.agentID = agentID
    }

    public var description: String { "\(kind.rawValue) \(id) of agent \(agentID)" }
}

/// What one ``RecordIndex/add(_:lines:admitting:)`` took.
public struct IndexCount: Sendable, Equatable {
    public var records: Int
    /// Lines that are not a readable record of their file (not JSON, lacking `ts`, `level` or
    /// `type`, or of another day than the file's).
    public var unreadable: Int
    /// Records of another uid than the one the source was asked for: not stored.
    public var foreign: Int

    public init(records: Int = 0, unreadable: Int = 0, foreign: Int = 0) {
        self.records = records
        self.unreadable = unreadable
        self.foreign = foreign
    }

    public static func += (a: inout IndexCount, b: IndexCount) {
        a.records += b.records
        a.unreadable += b.unreadable
        a.foreign += b.foreign
    }
}

/// A search the index cannot run as asked (a bad cursor, a text with nothing to search for):
/// the caller's mistake, shown as it is.
public struct RecordSearchError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Turns the `text` of a ``RecordSearch`` into an FTS query any implementation with word
/// search can map: terms, each all letters and digits, all required.
public enum SearchText {
    public struct Term: Sendable, Equatable {
        /// The words, in order (a phrase has several).
        public var words: String
        public var isPrefix: Bool
    }

    /// `timeout "connection refused" auth*` → three terms. Nil when nothing in `text` is a word.
    public static func terms(_ text: String) -> [Term]? {
        var terms: [Term] = []
        var rest = Substring(text)
        while let start = rest.firstIndex(where: { !$0.isWhitespace }) {
            rest = rest[start...]
            var body: Substring
            var prefix = false
            if rest.first == "\"" {
                let afterQuote = rest.index(after: rest.startIndex)
                let close = rest[afterQuote...].firstIndex(of: "\"") ?? rest.endIndex
                body = rest[afterQuote..<close]
                rest = close == rest.endIndex ? rest[close...] : rest[rest.index(after: close)...]
            } else {
                let end = rest.firstIndex(where: \.isWhitespace) ?? rest.endIndex
                body = rest[..<end]
                rest = rest[end...]
                if body.hasSuffix("*") {
                    prefix = true
                    body = body.dropLast()
                }
            }
            guard body.contains(where: { $0.isLetter || $0.isNumber }) else { continue }
            terms.append(Term(words: String(body), isPrefix: prefix))
        }
        return terms.isEmpty ? nil : terms
    }

    /// An FTS5 query: each term a quoted string (its quotes doubled), prefix terms with `*`,
    /// optionally limited to a column (`metadata`) or columns (`{message metadata}`).
    public static func fts5(_ terms: [Term], column: String? = nil) -> String {
        terms.map { term in
            let quoted = "\"" + term.words.replacingOccurrences(of: "\"", with: "\"\"") + "\"" + (term.isPrefix ? "*" : "")
            return column.map { "\($0) : \(quoted)" } ?? quoted
        }.joined(separator: " AND ")
    }
}
