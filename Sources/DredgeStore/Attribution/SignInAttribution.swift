import DredgeDomain
import Foundation
import GRDB

/// Gives a user the anonymous records logged just before they signed in, so a pull by their uid
/// also returns the launch and sign-in that led up to it.
///
/// The writer applies it in order with the entries around it: every entry enqueued before
/// ``LogStore/attribute(_:)`` is stored before the attribution runs. The records it takes are
///
/// - anonymous (uid `""`),
/// - of the scope's contexts,
/// - timestamped within `from...through`,
/// - and stored after the last record in that range, of those contexts, that already carries a
///   uid: the anonymous stretch directly before the sign-in, never one that another user's
///   records end. (Store order, not timestamps: records logged within the same microsecond
///   still fall on the right side.)
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
        let contexts: String
        let contextID: Int64
        switch scope {
        case .context(let id):
            contexts = "context_id = :context"
            contextID = id.rawValue
        case .app(of: let id):
            contexts = """
                context_id IN (
                    SELECT c.id FROM context c, context me
                    WHERE me.id = :context
                      AND json_extract(c.fields, '$.app') = json_extract(me.fields, '$.app')
                      AND json_extract(c.fields, '$.host') = json_extract(me.fields, '$.host'))
                """
            contextID = id.rawValue
        }
        let selection = """
            uid = '' AND ts BETWEEN :from AND :through AND \(contexts)
              AND id > coalesce(
                  (SELECT max(id) FROM log WHERE uid != '' AND ts BETWEEN :from AND :through AND \(contexts)),
                  0)
            """
        let arguments: StatementArguments = ["context": contextID, "from": from.microseconds, "through": through.microseconds]
        let rows = try Row.fetchAll(db, sql: "SELECT id, metadata FROM log WHERE \(selection)", arguments: arguments)
        let stored = EntryEncoder.truncate(uid, maxBytes: maxUIDBytes, marked: false)
        let update = try db.makeStatement(sql: "UPDATE log SET uid = ?, metadata = ? WHERE id = ?")
        for row in rows {
            let id: Int64 = row[0]
            let metadata: String? = row[1]
            // Metadata the store did not write canonically keeps its text: the record still gets the uid.
            let marked = CanonicalObject.setting(LogStore.beforeSignInKey, to: "true", in: metadata ?? "{}") ?? metadata
            try update.execute(arguments: [stored, marked, id])
        }
        return rows.count
    }
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


extension LogStore {
    /// The metadata key, set to `true`, that marks a record logged before its user signed in and
    /// given their uid afterwards (see ``SignInAttribution``).
    public static let beforeSignInKey = "dredge.before_sign_in"
}
