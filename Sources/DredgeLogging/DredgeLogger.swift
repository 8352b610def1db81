import DredgeDomain
import DredgeStore

/// The logging API for app code: a level, a log type, structured metadata and privacy per value.
///
/// A log call renders the message and metadata (applying privacy, so private values never leave
/// the call) and enqueues; it never waits for the disk. A value type: copy it and change
/// ``type``, ``minimumLevel`` or ``metadata`` freely.
public struct DredgeLogger: Sendable {
    public let center: LogCenter
    public var type: LogType
    /// Calls below this level are ignored before their message is built.
    public var minimumLevel: LogLevel
    /// Attached to every record from this logger; a call's own metadata wins on equal keys.
    public var metadata: LogFields

    public init(center: LogCenter, type: LogType = .app, minimumLevel: LogLevel = .trace, metadata: LogFields = [:]) {
        self.center = center
        self.type = type
        self.minimumLevel = minimumLevel
        self.metadata = metadata
    }

    /// Logs one record.
    ///
    /// - Parameters:
    ///   - timestamp: when it happened; now if nil. For importers replaying older events.
    ///   - uid: the user it belongs to; the center's current uid if nil.
    /// - Returns: false if the store dropped the record (queue full under `.dropNewest`, or
    ///   closed). Drops are also counted in the store's statistics and loss table.
    @discardableResult
    public func log(
        _ level: LogLevel, _ message: @autoclosure () -> LogMessage, metadata: @autoclosure () -> LogFields = [:],
        at timestamp: Timestamp? = nil, uid: String? = nil
    ) -> Bool {
        // Below the level only when a live tail's verbosity window covers the user (§ 20);
        // otherwise into the rewind buffer, when one keeps that level (#54).
        guard level >= minimumLevel || center.keepsVerbose(uid: uid ?? center.uid, type: type) else {
            if center.rewinds(level) {
                center.rewind(level: level, type: type, message: message().rendered(with: center.redactor), metadata: stored(metadata()), at: timestamp, uid: uid)
            }
            return true
        }
        return center.submit(level: level, type: type, message: message().rendered(with: center.redactor), metadata: stored(metadata()), at: timestamp, uid: uid)
    }

    /// The logger's and the call's metadata with privacy applied (the call's wins on equal keys).
    private func stored(_ fields: LogFields) -> LogMetadata {
        var stored: LogMetadata = [:]
        guard !(metadata.isEmpty && fields.isEmpty) else { return stored }
        let redactor = center.redactor
        stored.reserveCapacity(metadata.count + fields.count)
        for (key, field) in metadata { stored[key] = field.logField.stored(with: redactor) }
        for (key, field) in fields { stored[key] = field.logField.stored(with: redactor) }
        return stored
    }

    @discardableResult
    public func trace(_ message: @autoclosure () -> LogMessage, metadata: @autoclosure () -> LogFields = [:]) -> Bool {
        log(.trace, message(), metadata: metadata())
    }
    @discardableResult
    public func debug(_ message: @autoclosure () -> LogMessage, metadata: @autoclosure () -> LogFields = [:]) -> Bool {
        log(.debug, message(), metadata: metadata())
    }
    @discardableResult
    public func info(_ message: @autoclosure () -> LogMessage, metadata: @autoclosure () -> LogFields = [:]) -> Bool {
        log(.info, message(), metadata: metadata())
    }
    @discardableResult
    public func notice(_ message: @autoclosure () -> LogMessage, metadata: @autoclosure () -> LogFields = [:]) -> Bool {
        log(.notice, message(), metadata: metadata())
    }
    @discardableResult
    public func warning(_ message: @autoclosure () -> LogMessage, metadata: @autoclosure () -> LogFields = [:]) -> Bool {
        log(.warning, message(), metadata: metadata())
    }
    @discardableResult
    public func error(_ message: @autoclosure () -> LogMessage, metadata: @autoclosure () -> LogFields = [:]) -> Bool {
        log(.error, message(), metadata: metadata())
    }
    @discardableResult
    public func critical(_ message: @autoclosure () -> LogMessage, metadata: @autoclosure () -> LogFields = [:]) -> Bool {
        log(.critical, message(), metadata: metadata())
    }
}
