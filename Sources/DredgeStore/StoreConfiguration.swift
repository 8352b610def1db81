import DredgeDomain

/// What happens when a log call finds the write queue full.
public enum OverflowPolicy: Sendable, Hashable {
    /// The new record is dropped and counted (``StoreStatistics/droppedQueueFull``), and the
    /// drop is recorded in the store as a loss with its time range. The caller never waits.
    /// The default: a logging call must not stall an app.
    case dropNewest
    /// The caller waits until the writer makes room. For ingestion pipelines where a record
    /// must not be lost and back-pressure is wanted (`dredge-agent ingest`).
    case block
}

/// How hard a commit is pushed to the disk.
public enum Durability: Sendable, Hashable {
    /// `synchronous=NORMAL` in WAL mode: a committed batch survives the process being killed;
    /// a power loss may lose the last commits. The default.
    case normal
    /// `synchronous=FULL`: every commit is fsynced and survives a power loss, at a cost in
    /// ingest speed.
    case full
}

/// How much the store keeps. Retention deletes the oldest records first.
public struct RetentionPolicy: Sendable, Hashable {
    /// Records older than this are deleted. Default 3 days.
    public var maxAge: Duration
    /// The store's size on disk (database plus WAL) is kept under this many bytes. Default
    /// 200 MB (200,000,000 bytes).
    public var maxBytes: Int64
    /// When over ``maxBytes``, retention deletes down to this fraction of it, so it does not
    /// run again after every batch. Default 0.9.
    public var lowWaterFraction: Double

    public init(maxAge: Duration = .seconds(3 * 86_400), maxBytes: Int64 = 200_000_000, lowWaterFraction: Double = 0.9) {
        self.maxAge = maxAge
        self.maxBytes = maxBytes
        self.lowWaterFraction = lowWaterFraction
    }
}

/// Limits on one record, enforced when it is written. What is over a limit is truncated, never
/// rejected, and the truncation is marked (see docs/store.md).
public struct StoreLimits: Sendable, Hashable {
    /// Bytes of UTF-8 in a message. Default 64 KiB.
    public var maxMessageBytes = 64 * 1024
    /// Bytes of UTF-8 in one metadata string value. Default 16 KiB.
    public var maxMetadataValueBytes = 16 * 1024
    /// Bytes of the encoded metadata JSON of one record. Default 64 KiB.
    public var maxMetadataBytes = 64 * 1024
    /// Bytes in a uid. Default 256.
    public var maxUIDBytes = 256

    public init() {}
}

/// Who a process is to a store's retention policy (``StoredRetention``).
public enum RetentionRole: Sendable, Hashable {
    /// The app that logs into the store. A store that records no policy yet gets this
    /// configuration's ``StoreConfiguration/retention`` (the default one too).
    case owner
    /// A process that only reads or adds to a store someone else configured (the agent): it
    /// applies the store's policy; an existing store that records none keeps everything (it is
    /// reported) until its owner records one. A store it creates gets the default.
    case follower
}

public struct StoreConfiguration: Sendable {
    /// The retention policy. Setting it (`configuration.retention.maxAge = …`) records it in the
    /// store, replacing the one recorded there (``StoredRetention``); left alone, the policy the
    /// store records applies, and this default only where it records none (see ``retentionRole``).
    /// Every process applies what the store records at each pass.
    public var retention = RetentionPolicy() {
        didSet { setsRetention = true }
    }
    /// Whether ``retention`` was set, so this configuration records it.
    public private(set) var setsRetention = false
    public var retentionRole = RetentionRole.owner
    public var limits = StoreLimits()
    /// Entries the write queue holds before ``overflowPolicy`` applies. Default 65,536.
    public var queueCapacity = 65_536
    public var overflowPolicy = OverflowPolicy.dropNewest
    /// Most records in one write transaction. Default 1,024.
    public var maxBatchSize = 1_024
    /// When the writer wakes for fewer than `lingerBelow` records, it waits up to this long for
    /// more before writing, so a trickle of records (one per HTTP request, say) is written in a
    /// few transactions instead of one each. `flush()` and `close()` cut the wait short; zero
    /// turns it off. Records are in memory this much longer before a crash would lose them.
    public var writeLinger = Duration.milliseconds(5)
    public var lingerBelow = 64
    /// How often retention runs besides at open. Default one minute. Size is also checked
    /// after every ``sizeCheckEveryBatches`` batches.
    public var retentionInterval = Duration.seconds(60)
    public var sizeCheckEveryBatches = 64
    public var durability = Durability.normal
    /// Open for queries only: no writer, no retention, no migration.
    public var readOnly = false
    /// The clock retention ages records by. Tests pass a fixed one.
    public var now: @Sendable () -> Timestamp = { .now }
    /// SQLite's `max_page_count` on the writer: a hard cap on the database file. Used to
    /// simulate a full disk; nil means SQLite's default.
    public var maxPageCount: Int?

    public init() {}
}

extension StoreConfiguration {
    /// The first value out of its range, described; nil when every value is usable. A store
    /// refuses to open with such a configuration (``StoreError/Code/invalidConfiguration``)
    /// rather than trap or spin later.
    public var problem: String? {
        func positive(_ d: Duration) -> Bool { d > .zero }
        if queueCapacity < 1 { return "queueCapacity must be at least 1 (is \(queueCapacity))" }
        if maxBatchSize < 1 { return "maxBatchSize must be at least 1 (is \(maxBatchSize))" }
        if lingerBelow < 0 { return "lingerBelow must not be negative (is \(lingerBelow))" }
        if writeLinger < .zero { return "writeLinger must not be negative" }
        if sizeCheckEveryBatches < 1 { return "sizeCheckEveryBatches must be at least 1 (is \(sizeCheckEveryBatches))" }
        if !positive(retentionInterval) { return "retentionInterval must be positive" }
        if retention.maxAge.saturatingMicroseconds < 1 { return "retention.maxAge must be at least 1 µs" }
        if retention.maxBytes < 1 { return "retention.maxBytes must be positive (is \(retention.maxBytes))" }
        if !(retention.lowWaterFraction > 0 && retention.lowWaterFraction <= 1) {
            return "retention.lowWaterFraction must be in (0, 1] (is \(retention.lowWaterFraction))"
        }
        if limits.maxMessageBytes < 1 { return "limits.maxMessageBytes must be positive (is \(limits.maxMessageBytes))" }
        if limits.maxMetadataValueBytes < 1 { return "limits.maxMetadataValueBytes must be positive (is \(limits.maxMetadataValueBytes))" }
        if limits.maxMetadataBytes < 128 { return "limits.maxMetadataBytes must be at least 128 (is \(limits.maxMetadataBytes))" }
        if limits.maxUIDBytes < 1 { return "limits.maxUIDBytes must be positive (is \(limits.maxUIDBytes))" }
        if let pages = maxPageCount, pages < 1 { return "maxPageCount must be positive (is \(pages))" }
        return nil
    }
}
