import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import GRDB

/// Feedback uploads as the server received them, in the server's database (``FeedbackInbox``):
/// who, what they said, and where the upload stands. The files go to `feedback/<id>/`. A
/// feedback id is its upload id; a second upload of the same id is answered with the first
/// one's result, never stored again.
public final class SQLiteFeedbackInbox: FeedbackInbox, Sendable {
    let db: DatabasePool

    public init(_ database: ServerDatabase) { db = database.pool }

    /// The SQL list of final statuses: a feedback in one of them never changes again.
    static let finalStatuses = "(" + FeedbackStatus.allCases.filter(\.isFinal).map { "'\($0.rawValue)'" }.sorted().joined(separator: ",") + ")"


    /// The `feedback` table as it was when `feedback.sqlite` was merged into the one database.
    static func legacySchema(_ migrator: inout DatabaseMigrator) {
        migrator.registerMigration("feedback-v1") { db in
            try db.execute(sql: """
                CREATE TABLE feedback (
                    id TEXT PRIMARY KEY NOT NULL,
                    agent_id TEXT NOT NULL,
                    uid TEXT NOT NULL,
                    text TEXT NOT NULL,
                    created_at_us INTEGER NOT NULL,
                    received_at REAL NOT NULL,
                    status TEXT NOT NULL,
                    detail TEXT NOT NULL DEFAULT '',
                    chunks_received INTEGER NOT NULL DEFAULT 0,
                    chunk_count INTEGER NOT NULL DEFAULT 0,
                    bytes INTEGER NOT NULL DEFAULT 0,
                    records INTEGER NOT NULL DEFAULT 0,
                    files TEXT NOT NULL DEFAULT '[]'
                );
                CREATE INDEX feedback_by_time ON feedback(received_at);
                """)
        }
        // Quotas count an agent's recent feedback.
        migrator.registerMigration("feedback-v2") { db in
            try db.execute(sql: "CREATE INDEX feedback_by_agent ON feedback(agent_id, received_at)")
        }
    }

    /// Records a feedback upload the first time its header arrives; later calls change nothing.
    public func begin(id: String, agentID: String, uid: String, text: String, createdAt: Timestamp, chunkCount: Int, bytes: Int64, at now: Date = Date()) async throws {
        let row = FeedbackRow(
            id: id, agentId: agentID, uid: uid, text: text, createdAtUs: createdAt.microseconds, receivedAt: now.timeIntervalSince1970,
            status: FeedbackStatus.uploading.rawValue, chunkCount: chunkCount, bytes: bytes)
        try await db.write { db in try row.insert(db, onConflict: .ignore) }
    }

    /// Moves a feedback's status, unless it is already final (complete or failed).
    @discardableResult
    public func update(
        _ id: String, status: FeedbackStatus, detail: String = "", chunksReceived: Int? = nil, records: Int? = nil, files: [String]? = nil, errorCode: Int? = nil
    ) async throws -> Bool {
        try await db.write { db in
            try db.execute(
                sql: """
                    UPDATE feedback SET status = ?, detail = ?, chunks_received = coalesce(?, chunks_received),
                        records = coalesce(?, records), files = coalesce(?, files), error_code = coalesce(?, error_code)
                    WHERE id = ? AND status NOT IN \(Self.finalStatuses)
                    """,
                arguments: [status.rawValue, detail, chunksReceived, records, files.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self) }, errorCode, id])
            return db.changesCount > 0
        }
    }

    /// How many feedback uploads an agent began since `since`, and their declared bytes: what
    /// its quotas count.
    public func usage(agentID: String, since: Date) async throws -> (count: Int, bytes: Int64) {
        try await db.read { db in
            let row = try Row.fetchOne(
                db, sql: "SELECT count(*), coalesce(sum(bytes), 0) FROM feedback WHERE agent_id = ? AND received_at >= ?",
                arguments: [agentID, since.timeIntervalSince1970])
            return (row?[0] ?? 0, row?[1] ?? 0)
        }
    }

    /// Fails the feedback uploads begun more than `after` ago and still not complete (an agent
    /// that never came back): their upload state can then be removed. Returns how many.
    @discardableResult
    public func failAbandoned(now: Date = Date(), after: Duration = WireLimits.feedbackLifetime) async throws -> Int {
        try await db.write { db in
            try db.execute(
                sql: "UPDATE feedback SET status = 'failed', detail = ? WHERE status NOT IN \(Self.finalStatuses) AND received_at <= ?",
                arguments: ["not completed within \(after) of its first frame; abandoned", now.timeIntervalSince1970 - Double(after.components.seconds)])
            return db.changesCount
        }
    }

    public func markRemoved(_ id: String, by actor: String, reason: String, at now: Date) async throws -> RemovalMark? {
        try await db.write { db -> RemovalMark? in
            guard let row = try FeedbackRow.fetchOne(db, key: id) else { return nil }
            if let earlier = Removal(at: row.removedAt, by: row.removedBy, reason: row.removedReason) { return RemovalMark(removal: earlier, isNew: false) }
            try db.execute(
                sql: "UPDATE feedback SET removed_at = ?, removed_by = ?, removed_reason = ? WHERE id = ?",
                arguments: [now.timeIntervalSince1970, actor, reason, id])
            try db.execute(
                sql: "UPDATE feedback SET status = 'failed', detail = ?, error_code = ? WHERE id = ? AND status NOT IN \(Self.finalStatuses)",
                arguments: ["removed by \(actor) before it finished", WireErrorCode.errorUploadInvalid.rawValue, id])
            return RemovalMark(removal: Removal(at: now, by: actor, reason: reason), isNew: true)
        }
    }

    public func removable(receivedUntil cutoff: Date, limit: Int) async throws -> [String] {
        try await db.read { db in
            try String.fetchAll(
                db,
                sql: """
                    SELECT id FROM feedback INDEXED BY feedback_kept WHERE removed_at IS NULL AND received_at <= ?
                    AND status IN \(Self.finalStatuses) ORDER BY received_at, id LIMIT ?
                    """,
                arguments: [cutoff.timeIntervalSince1970, max(limit, 0)])
        }
    }

    public func feedback(_ id: String) async throws -> FeedbackRecord? {
        try await db.read { db in try FeedbackRow.fetchOne(db, key: id).map(Self.record) }
    }

    /// Newest first.
    public func all(limit: Int = 100) async throws -> [FeedbackRecord] {
        try await db.read { db in try FeedbackRow.order(Column("received_at").desc, Column.rowID.desc).limit(limit).fetchAll(db).map(Self.record) }
    }

    static func record(_ row: FeedbackRow) throws -> FeedbackRecord {
        FeedbackRecord(
            id: row.id, agentID: row.agentId, uid: row.uid, text: row.text, createdAt: Timestamp(microseconds: row.createdAtUs),
            receivedAt: Date(timeIntervalSince1970: row.receivedAt), status: try FeedbackRows.status(row.status, of: row.id), detail: row.detail,
            chunksReceived: row.chunksReceived, chunkCount: row.chunkCount, bytes: row.bytes, records: row.records,
            files: try PullRows.files(row.files, of: row.id), errorCode: row.errorCode,
            removed: Removal(at: row.removedAt, by: row.removedBy, reason: row.removedReason))
    }
}
