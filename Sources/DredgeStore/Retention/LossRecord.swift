import DredgeDomain

/// Why records that were logged are not in the store.
public struct LossReason: Hashable, Sendable, Codable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// Retention deleted records older than the maximum age.
    public static let retentionAge = LossReason(rawValue: "retention.age")
    /// Retention deleted the oldest records to keep the store under its size limit.
    public static let retentionSize = LossReason(rawValue: "retention.size")
    /// The write queue was full and the overflow policy dropped the records.
    public static let queueFull = LossReason(rawValue: "queue.full")
    /// The records were accepted but could not be written (a full disk, an I/O error).
    public static let writeFailed = LossReason(rawValue: "write.failed")

    public var description: String { rawValue }
}

/// One row of the loss table: `count` records with timestamps in `first...last` were lost for
/// `reason`, noticed at `recordedAt`. Exports use these to say "logs before X were removed by
/// retention" instead of silently looking complete.
public struct LossRecord: Hashable, Sendable, Codable {
    public var recordedAt: Timestamp
    public var reason: LossReason
    public var count: Int64
    public var first: Timestamp
    public var last: Timestamp

    public init(recordedAt: Timestamp, reason: LossReason, count: Int64, first: Timestamp, last: Timestamp) {
        self.recordedAt = recordedAt
        self.reason = reason
        self.count = count
        self.first = first
        self.last = last
    }
}
