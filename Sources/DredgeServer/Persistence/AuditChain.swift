import Crypto
import DredgeAdminAPI
import DredgeEnvelope
import Foundation

/// The audit log as a hash chain (#55): each entry carries SHA-256 over its content and the
/// previous entry's hash, so an entry edited, deleted or moved breaks the chain at that point,
/// and ``Verifier`` finds where. Both back ends write through ``link(after:at:actor:action:detail:)``
/// inside the transaction that inserts the entry, after taking the log's turn (SQLite's one
/// writer; on PostgreSQL an advisory lock), so the entries chain in the order of their ids.
///
/// What a chain cannot show alone: entries cut from its end (the newest). An outside copy
/// (`audit.file`, `audit.syslog`: ``AuditShipping``) holds them, and the last hash
/// `dredge audit verify` prints can be kept elsewhere to compare.
///
/// Entries written before the chain existed are chained when the schema step that adds it
/// runs, in id order, from the ``genesis``: nothing is left outside it.
public enum AuditChain {
    /// The previous hash of the first entry.
    public static let genesis = [UInt8](repeating: 0, count: 32)
    /// Entries read at a time when the log is verified.
    static let page = 5_000

    /// The entry's hash: SHA-256 over a domain tag, the previous hash, the time (the stored
    /// double's bits, big-endian) and each text field length-prefixed (UTF-8, as stored).
    public static func link(after previous: [UInt8], at: Double, actor: String, action: String, detail: String) -> [UInt8] {
        var hash = SHA256()
        hash.update(data: Array("dredge.audit.v1\u{0}".utf8))
        hash.update(data: previous)
        withUnsafeBytes(of: at.bitPattern.bigEndian) { hash.update(bufferPointer: $0) }
        for field in [actor, action, detail] {
            let bytes = Array(field.utf8)
            withUnsafeBytes(of: UInt32(bytes.count).bigEndian) { hash.update(bufferPointer: $0) }
            hash.update(data: bytes)
        }
        return Array(hash.finalize())
    }

    /// One stored entry as the verifier reads it.
    public struct Stored: Sendable {
        public var id: Int64
        public var at: Double
        public var actor: String
        public var action: String
        public var detail: String
        /// Nil: the entry has no hash (something cleared it).
        public var hash: [UInt8]?

        public init(id: Int64, at: Double, actor: String, action: String, detail: String, hash: [UInt8]?) {
            (self.id, self.at, self.actor, self.action, self.detail, self.hash) = (id, at, actor, action, detail, hash)
        }
    }

    /// What a verification found.
    public typealias Verdict = AuditVerification

    /// Walks the entries in id order (fed in pages by ``feed(_:)``), recomputing each hash.
    /// After a break it goes on from the broken entry's stored hash, so one break (a hash
    /// cleared early in the log, say) does not hide the ones after it: every break is counted,
    /// and the first is described.
    public struct Verifier: Sendable {
        private var previous = AuditChain.genesis
        private var previousID: Int64?
        public private(set) var verdict = Verdict()

        public init() {}

        /// Checks the next entries (ascending ids, continuing the last page).
        public mutating func feed(_ entries: some Sequence<Stored>) {
            for entry in entries {
                verdict.entries += 1
                verdict.lastID = entry.id
                verdict.lastHash = entry.hash.map(Hex.encode)
                defer {
                    // Go on from what the entry says it is (the start again when it says nothing).
                    previous = entry.hash ?? AuditChain.genesis
                    previousID = entry.id
                }
                if let previousID, entry.id <= previousID {
                    record("the entries are not in id order at \(entry.id) (after \(previousID))", at: entry.id)
                    continue
                }
                guard let stored = entry.hash else {
                    record("entry \(entry.id) has no hash: it was written outside the server (or by a release without the chain), or its hash was cleared", at: entry.id)
                    continue
                }
                guard stored == AuditChain.link(after: previous, at: entry.at, actor: entry.actor, action: entry.action, detail: entry.detail) else {
                    let after = previousID.map { "entry \($0)" } ?? "the start of the log"
                    record("entry \(entry.id) does not follow \(after): it was edited, or an entry before it was removed or moved", at: entry.id)
                    continue
                }
            }
        }

        private mutating func record(_ why: String, at id: Int64) {
            verdict.breaks += 1
            if verdict.broken == nil { (verdict.broken, verdict.brokenAt) = (why, id) }
        }
    }
}
