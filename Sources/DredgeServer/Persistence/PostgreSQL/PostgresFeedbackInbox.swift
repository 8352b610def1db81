import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import PostgresNIO

/// Feedback uploads in the PostgreSQL database (``FeedbackInbox``), the same rules as the
/// embedded ``SQLiteFeedbackInbox``. A feedback's id is its upload id and its primary key: an
/// upload that reaches a second node after a failover finds the first one's row, so feedback
/// stays exactly-once across nodes.
public final class PostgresFeedbackInbox: FeedbackInbox, Sendable {
    private let db: PostgresDatabase

    public init(_ database: PostgresDatabase) { db = database }

    private static let final = FeedbackStatus.allCases.filter(\.isFinal).map(\.rawValue).sorted()

    public func begin(id: String, agentID: String, uid: String, text: String, createdAt: Timestamp, chunkCount: Int, bytes: Int64, at now: Date) async throws {
        try await db.write { c in
            try await c.run(
                """
                INSERT INTO feedback (id, agent_id, uid, text, created_at_us, received_at, status, chunk_count, bytes)
                VALUES (\(id), \(agentID), \(uid.storable), \(text.storable), \(createdAt.microseconds), \(now.timeIntervalSince1970),
                    \(FeedbackStatus.uploading.rawValue), \(Int64(chunkCount)), \(bytes))
                ON CONFLICT (id) DO NOTHING
                """)
        }
    }

    public func update(_ id: String, status: FeedbackStatus, detail: String, chunksReceived: Int?, records: Int?, files: [String]?, errorCode: Int?) async throws -> Bool {
        let filesJSON = try files.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self).storable }
        return try await db.write { c in
            try await c.run(
                """
                UPDATE feedback SET status = \(status.rawValue), detail = \(detail.storable), chunks_received = coalesce(\(chunksReceived.map(Int64.init)), chunks_received),
                    records = coalesce(\(records.map(Int64.init)), records), files = coalesce(\(filesJSON), files),
                    error_code = coalesce(\(errorCode.map(Int64.init)), error_code)
                WHERE id = \(id) AND NOT (status = ANY(\(Self.final)::text[])) RETURNING 1
                """) > 0
        }
    }

    public func usage(agentID: String, since: Date) async throws -> (count: Int, bytes: Int64) {
        try await db.read { c in
            guard
                let row = try await c.rows(
                    "SELECT count(*), coalesce(sum(bytes), 0)::bigint FROM feedback WHERE agent_id = \(agentID) AND received_at >= \(since.timeIntervalSince1970)"
                ).first
            else { return (0, 0) }
            let (count, bytes) = try row.decode((Int64, Int64).self)
            return (Int(count), bytes)
        }
    }

    public func failAbandoned(now: Date, after: Duration) async throws -> Int {
        let detail = "not completed within \(after) of its first frame; abandoned"
        let cutoff = now.timeIntervalSince1970 - Double(after.components.seconds)
        return try await db.write { c in
            try await c.run(
                """
                UPDATE feedback SET status = 'failed', detail = \(detail)
                WHERE NOT (status = ANY(\(Self.final)::text[])) AND received_at <= \(cutoff) RETURNING 1
                """)
        }
    }

    public func markRemoved(_ id: String, by actor: String, reason: String, at now: Date) async throws -> RemovalMark? {
        try await db.write { c -> RemovalMark? in
            guard let row = try await c.rows("SELECT removed_at, removed_by, removed_reason FROM feedback WHERE id = \(id) FOR UPDATE").first else { return nil }
            let (at, by, earlierReason) = try row.decode((Double?, String?, String?).self)
            if let earlier = Removal(at: at, by: by, reason: earlierReason) { return RemovalMark(removal: earlier, isNew: false) }
            try await c.run(
                "UPDATE feedback SET removed_at = \(now.timeIntervalSince1970), removed_by = \(actor), removed_reason = \(reason.storable) WHERE id = \(id)")
            let detail = "removed by \(actor) before it finished"
            try await c.run(
                """
                UPDATE feedback SET status = 'failed', detail = \(detail), error_code = \(Int64(WireErrorCode.errorUploadInvalid.rawValue))
                WHERE id = \(id) AND NOT (status = ANY(\(Self.final)::text[]))
                """)
            return RemovalMark(removal: Removal(at: now, by: actor, reason: reason.storable), isNew: true)
        }
    }

    public func removable(receivedUntil cutoff: Date, limit: Int) async throws -> [String] {
        try await db.read { c in
            try await c.rows(
                """
                SELECT id FROM feedback WHERE removed_at IS NULL AND received_at <= \(cutoff.timeIntervalSince1970)
                AND status = ANY(\(Self.final)::text[]) ORDER BY received_at, id LIMIT \(Int64(max(limit, 0)))
                """
            ).map { try $0.decode(String.self) }
        }
    }

    private static let columns = """
        SELECT id, agent_id, uid, text, created_at_us, received_at, status, detail, chunks_received, chunk_count, bytes, records, files, error_code,
            removed_at, removed_by, removed_reason FROM feedback
        """

    public func feedback(_ id: String) async throws -> FeedbackRecord? {
        try await db.read { c in try await c.rows(PostgresQuery(unsafeSQL: Self.columns + " WHERE id = $1", binds: Self.binding(id))).first.map(Self.record) }
    }

    public func all(limit: Int) async throws -> [FeedbackRecord] {
        try await db.read { c in
            try await c.rows(PostgresQuery(unsafeSQL: Self.columns + " ORDER BY received_at DESC, seq DESC LIMIT \(max(limit, 0))")).map(Self.record)
        }
    }

    private static func binding(_ value: String) -> PostgresBindings {
        var binds = PostgresBindings()
        binds.append(value)
        return binds
    }

    private static func record(_ row: PostgresRow) throws -> FeedbackRecord {
        let (id, agentID, uid, text, createdAtUs, receivedAt, status, detail, chunksReceived, chunkCount, bytes, records, files, errorCode, removedAt, removedBy, removedReason) =
            try row.decode((String, String, String, String, Int64, Double, String, String, Int64, Int64, Int64, Int64, String, Int64?, Double?, String?, String?).self)
        return FeedbackRecord(
            id: id, agentID: agentID, uid: uid, text: text, createdAt: Timestamp(microseconds: createdAtUs),
            receivedAt: Date(timeIntervalSince1970: receivedAt), status: try FeedbackRows.status(status, of: id), detail: detail,
            chunksReceived: Int(chunksReceived), chunkCount: Int(chunkCount), bytes: bytes, records: Int(records),
            files: try PullRows.files(files, of: id), errorCode: errorCode.map { Int($0) },
            removed: Removal(at: removedAt, by: removedBy, reason: removedReason))
    }
}
