import DredgeDomain
import Foundation
import GRDB

/// Gives a user the anonymous records logged just before they signed in, so a pull by their uid
/// also returns the launch and sign-in that led up to it.
///
/// The writer applies it exactly where it was queued among the entries: every entry enqueued
/// before ``LogStore/attribute(_:)`` is stored before it runs, none after. Going back from the
/// newest record of the scope's contexts, it takes
///
/// - the anonymous records (uid `""`) timestamped within `from...through`,
/// - until a record that carries a uid (another user's records end the stretch; store order,
///   not timestamps, so records of the same microsecond fall on the right side), a record
///   older than `from`, ``maxRecords`` records taken, or ``maxScanned`` records read.
///
/// Each gets `uid` and the metadata key ``LogStore/beforeSignInKey`` set to `true`.
public struct SignInAttribution: Sendable, Equatable {
    public enum Scope: Sendable, Equatable {
        /// Records of this context only: one process run.
        case context(ContextID)
        /// Records of every context with this context's app and host: earlier runs of the same
        /// app on this install as well.
        case app(of: ContextID)
    }

    /// At most this many records are given the uid (the newest).
    public static let maxRecords = 10_000
    /// At most this many records, of any context, are read looking for them: the cost of a
    /// sign-in on the writer thread is bounded whatever the store holds.
    public static let maxScanned = 100_000

    public var uid: String
    public var scope: Scope
    public var from: Timestamp
    public var through: Timestamp

    public init(uid: String, scope: Scope, from: Timestamp, through: Timestamp) {
        self.uid = uid
        self.scope = scope
        self.from = from
        self.through = through
    }

    /// Runs the attribution in `db` (the writer's transaction). Returns the number of records
    /// attributed.
    @discardableResult
    func apply(in db: Database, maxUIDBytes: Int) throws -> Int {
        guard !uid.isEmpty, from <= through else { return 0 }
        let contexts: Set<Int64>
        switch scope {
        case .context(let id):
            contexts = [id.rawValue]
        case .app(of: let id):
            contexts = Set(
                try Int64.fetchAll(
                    db,
                    sql: """
                        SELECT c.id FROM context c, context me
                        WHERE me.id = ?
                          AND json_extract(c.fields, '$.app') = json_extract(me.fields, '$.app')
                          AND json_extract(c.fields, '$.host') = json_extract(me.fields, '$.host')
                        """, arguments: [id.rawValue]))
        }
        // Newest first by rowid: the scan stops early, and is capped.
        var taken: [Int64] = []
        do {
            var scanned = 0
            let rows = try Row.fetchCursor(db, sql: "SELECT id, uid, ts, context_id FROM log ORDER BY id DESC")
            while scanned < Self.maxScanned, taken.count < Self.maxRecords, let row = try rows.next() {
                scanned += 1
                guard contexts.contains(row[3]) else { continue }
                let ts: Int64 = row[2]
                if ts > through.microseconds { continue }
                if ts < from.microseconds { break }
                let owner: String = row[1]
                if !owner.isEmpty { break }
                taken.append(row[0])
            }
        }
        let stored = EntryEncoder.truncate(uid, maxBytes: maxUIDBytes, marked: false)
        let read = try db.makeStatement(sql: "SELECT metadata FROM log WHERE id = ?")
        let update = try db.makeStatement(sql: "UPDATE log SET uid = ?, metadata = ? WHERE id = ?")
        for id in taken {
            let metadata = try String?.fetchOne(read, arguments: [id]) ?? nil
            // Metadata the store did not write canonically keeps its text: the record still gets the uid.
            let marked = CanonicalObject.setting(LogStore.beforeSignInKey, to: "true", in: metadata ?? "{}") ?? metadata
            try update.execute(arguments: [stored, marked, id])
        }
        return taken.count
    }
}

extension LogStore {
    /// The metadata key, set to `true`, that marks a record logged before its user signed in and
    /// given their uid afterwards (see ``SignInAttribution``).
    public static let beforeSignInKey = "dredge.before_sign_in"
}

/// Edits the canonical JSON object the store keeps as a record's metadata (keys sorted, no
/// whitespace; see ``JSONWriter``) without decoding its values, so every other byte stays as
/// the writer wrote it.
enum CanonicalObject {
    /// `object` with the member `key` set to the JSON text `value`, inserted at its sorted place
    /// (or replacing the member already there); nil if `object` is not a JSON object.
    static func setting(_ key: String, to value: String, in object: String) -> String? {
        let bytes = Array(object.utf8)
        var member = JSONWriter()
        member.writeString(key)
        member.writeRaw(":")
        member.writeRaw(value)
        guard bytes.first == UInt8(ascii: "{") else { return nil }
        var i = 1
        var members = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "}") {
                guard i == bytes.count - 1 else { return nil }
                return splice(bytes, at: i, replacing: 0, with: (members > 0 ? [UInt8(ascii: ",")] : []) + member.bytes)
            }
            if members > 0 {
                guard bytes[i] == UInt8(ascii: ",") else { return nil }
                i += 1
            }
            let keyStart = i
            guard let keyEnd = endOfString(bytes, from: i), keyEnd < bytes.count, bytes[keyEnd] == UInt8(ascii: ":") else { return nil }
            guard let existing = decodedKey(bytes[keyStart..<keyEnd]) else { return nil }
            guard let valueEnd = endOfValue(bytes, from: keyEnd + 1) else { return nil }
            if existing == key {
                return splice(bytes, at: keyStart, replacing: valueEnd - keyStart, with: member.bytes)
            }
            if key < existing {
                return splice(bytes, at: keyStart, replacing: 0, with: member.bytes + [UInt8(ascii: ",")])
            }
            i = valueEnd
            members += 1
        }
        return nil
    }

    private static func splice(_ bytes: [UInt8], at index: Int, replacing count: Int, with insert: [UInt8]) -> String {
        var out = bytes
        out.replaceSubrange(index..<(index + count), with: insert)
        return String(decoding: out, as: UTF8.self)
    }

    /// The index just past the JSON string starting at `start`, or nil.
    private static func endOfString(_ bytes: [UInt8], from start: Int) -> Int? {
        guard start < bytes.count, bytes[start] == UInt8(ascii: "\"") else { return nil }
        var i = start + 1
        while i < bytes.count {
            switch bytes[i] {
            case UInt8(ascii: "\\"): i += 2
            case UInt8(ascii: "\""): return i + 1
            default: i += 1
            }
        }
        return nil
    }

    /// The index just past the JSON value starting at `start` (a string, an object, an array
    /// or a scalar), or nil.
    private static func endOfValue(_ bytes: [UInt8], from start: Int) -> Int? {
        guard start < bytes.count else { return nil }
        var depth = 0
        var i = start
        while i < bytes.count {
            switch bytes[i] {
            case UInt8(ascii: "\""):
                guard let end = endOfString(bytes, from: i) else { return nil }
                i = end
                if depth == 0 { return i }
                continue
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                depth += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if depth == 0 { return i > start ? i : nil }
                depth -= 1
                if depth == 0 { return i + 1 }
            case UInt8(ascii: ","):
                if depth == 0 { return i > start ? i : nil }
            default:
                break
            }
            i += 1
        }
        return nil
    }

    /// The text of a JSON string token (quotes included).
    private static func decodedKey(_ token: ArraySlice<UInt8>) -> String? {
        let inner = token.dropFirst().dropLast()
        if !inner.contains(UInt8(ascii: "\\")) { return String(decoding: inner, as: UTF8.self) }
        return try? JSONDecoder().decode(String.self, from: Data(token))
    }
}
