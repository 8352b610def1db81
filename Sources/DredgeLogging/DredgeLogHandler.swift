import DredgeDomain
import DredgeStore
import Logging

/// A swift-log `LogHandler` backed by the Dredge store, so anything that logs through swift-log
/// (SwiftNIO, Hummingbird, the app's own libraries) lands in the store.
///
/// Mapping:
/// - level: swift-log's seven levels map one to one onto ``LogLevel``;
/// - message: stored as rendered by swift-log;
/// - metadata: the metadata provider's, then the handler's, then the call's (later wins);
///   strings and string-convertibles become strings, arrays and dictionaries keep their shape;
///   a value carrying the ``LogPrivacy`` attribute (`"\(email, privacy: .hashed)"`) is redacted;
/// - `logger.label` and `logger.source` are added to the metadata; `code.file`/`code.line`
///   too when ``includeSourceLocation`` is set;
/// - an attached error is stored as `error`;
/// - the type is the handler's ``type``, unless the call's metadata has a valid `dredge.type`;
/// - the uid is the center's current one, unless the metadata has a valid `dredge.uid`
///   (`logger[metadataKey: "dredge.uid"] = "\(user.id)"` on a request's logger, say).
///
/// Privacy: swift-log renders a message's interpolations into a plain string before a handler
/// sees it, so a handler cannot tell a private value inside the message from the literal text.
/// Keep personal data out of swift-log messages and pass it as metadata with a privacy level
/// (`"email": "\(email, privacy: .hashed)"`), or log it through ``DredgeLogger``, whose
/// messages keep each interpolation's privacy.
public struct DredgeLogHandler: LogHandler {
    public let label: String
    public let center: LogCenter
    public var type: LogType
    /// The level as configured.
    public var configuredLevel: Logger.Level = .info
    /// swift-log's gate: the configured level, or trace while a live tail's verbosity window is
    /// open (``log(event:)`` then keeps below the configured level only what a window covers).
    public var logLevel: Logger.Level {
        get { center.hasVerbosityWindow ? .trace : center.rewindLevel.map { min(Logger.Level($0), configuredLevel) } ?? configuredLevel }
        set { configuredLevel = newValue }
    }
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    public var includeSourceLocation = false

    public init(label: String, center: LogCenter, type: LogType = .app) {
        self.label = label
        self.center = center
        self.type = type
        self.metadataProvider = LoggingSystem.metadataProvider
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        let redactor = center.redactor
        var stored: LogMetadata = [:]
        var recordType = type
        func merge(_ metadata: Logger.Metadata) {
            for (key, value) in metadata { stored[key] = Self.convert(value, redactor: redactor) }
        }
        if let provided = metadataProvider?.get() { merge(provided) }
        merge(metadata)
        if let own = event.metadata { merge(own) }
        if case .string(let name)? = stored.removeValue(forKey: "dredge.type"), let custom = LogType(name) {
            recordType = custom
        }
        // `dredge.uid` names the record's user (else the center's current one); a value that is
        // not a valid uid (or was redacted) stays an ordinary metadata value.
        var uid: String?
        if case .string(let named)? = stored["dredge.uid"], UserID.isValid(named) {
            uid = named
            stored["dredge.uid"] = nil
        }
        let below = event.level < configuredLevel && !center.keepsVerbose(uid: uid ?? center.uid, type: recordType)
        // Below the level: into the rewind buffer when one keeps it (#54), else nowhere.
        if below && !center.rewinds(LogLevel(event.level)) { return }
        stored["logger.label"] = .string(label)
        stored["logger.source"] = .string(event.source)
        if includeSourceLocation {
            stored["code.file"] = .string(event.file)
            stored["code.line"] = .int(Int64(event.line))
        }
        if let error = event.error { stored["error"] = .string(String(describing: error)) }
        if below {
            center.rewind(level: LogLevel(event.level), type: recordType, message: event.message.description, metadata: stored, at: nil, uid: uid)
        } else {
            center.submit(level: LogLevel(event.level), type: recordType, message: event.message.description, metadata: stored, at: nil, uid: uid)
        }
    }

    static func convert(_ value: Logger.MetadataValue, redactor: Redactor) -> LogValue {
        switch value {
        case .string(let s):
            return .string(redactor.apply(value.attributes[LogPrivacy.self] ?? .public, to: s))
        case .stringConvertible(let c):
            return .string(redactor.apply(value.attributes[LogPrivacy.self] ?? .public, to: c.description))
        case .array(let a):
            return .array(a.map { convert($0, redactor: redactor) })
        case .dictionary(let d):
            return .object(d.mapValues { convert($0, redactor: redactor) })
        }
    }
}

extension LogLevel {
    public init(_ level: Logger.Level) {
        switch level {
        case .trace: self = .trace
        case .debug: self = .debug
        case .info: self = .info
        case .notice: self = .notice
        case .warning: self = .warning
        case .error: self = .error
        case .critical: self = .critical
        }
    }
}

extension Logger.Level {
    init(_ level: LogLevel) {
        switch level {
        case .trace: self = .trace
        case .debug: self = .debug
        case .info: self = .info
        case .notice: self = .notice
        case .warning: self = .warning
        case .error: self = .error
        case .critical: self = .critical
        }
    }
}
