import DredgeDomain

/// A record on its way into the store: what a log call enqueues.
///
/// The store enforces its limits (``StoreLimits``) when it writes an entry, not when it is
/// enqueued, so building one on the caller's thread stays cheap.
public struct LogEntry: Sendable {
    public var timestamp: Timestamp
    public var level: LogLevel
    public var type: LogType
    /// The logged-in user the record belongs to; empty when nobody is logged in.
    public var uid: String
    public var message: String
    public var metadata: LogMetadata
    public var context: ContextID

    public init(
        timestamp: Timestamp = .now, level: LogLevel, type: LogType, uid: String = "", message: String,
        metadata: LogMetadata = [:], context: ContextID
    ) {
        self.timestamp = timestamp
        self.level = level
        self.type = type
        self.uid = uid
        self.message = message
        self.metadata = metadata
        self.context = context
    }
}

/// A stored record, as queries return it.
public struct LogRecord: Sendable, Hashable {
    /// The row id: unique in this store and increasing in insertion order.
    public var id: Int64
    public var timestamp: Timestamp
    public var level: LogLevel
    public var type: LogType
    public var uid: String
    public var message: String
    /// The metadata as the store keeps it: canonical JSON text, `{}` when there is none. Exports
    /// copy it verbatim; ``metadata`` decodes it.
    public var metadataJSON: String
    public var context: ContextID

    public init(
        id: Int64, timestamp: Timestamp, level: LogLevel, type: LogType, uid: String, message: String,
        metadataJSON: String, context: ContextID
    ) {
        self.id = id
        self.timestamp = timestamp
        self.level = level
        self.type = type
        self.uid = uid
        self.message = message
        self.metadataJSON = metadataJSON
        self.context = context
    }

    /// The metadata decoded; empty if it is not a JSON object (which the store never writes).
    public var metadata: LogMetadata {
        (try? JSONReading.decode(LogMetadata.self, from: metadataJSON)) ?? [:]
    }
}
