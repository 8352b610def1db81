import DredgeDomain
import DredgeStore

/// An app's own events as a type, logged with one call, as the os.Logger guidance recommends:
/// the app names what can happen once, with its level, type and fields (and their privacy),
/// and every call site logs the same shape.
///
/// ```swift
/// enum CheckoutEvent: DredgeEvent {
///     case paymentFailed(amount: Double, card: String)
///     case userLoggedIn(method: String)
///
///     var level: LogLevel {
///         switch self {
///         case .paymentFailed: .error
///         case .userLoggedIn: .info
///         }
///     }
///     var type: LogType? { .business }
///     var fields: LogFields {
///         switch self {
///         case .paymentFailed(let amount, let card): ["amount": amount, "card": .private(card)]
///         case .userLoggedIn(let method): ["method": method]
///         }
///     }
/// }
///
/// log.event(CheckoutEvent.paymentFailed(amount: 12.5, card: card))
/// ```
///
/// The record's message is ``message`` (by default the name), and the name is stored as the
/// metadata key `event` (``eventKey``), so records of one event can be selected by it.
///
/// Named `DredgeEvent`, not `LogEvent`: swift-log already has a `LogEvent`, and an app that
/// imports both would have to spell the module out.
public protocol DredgeEvent: Sendable {
    /// The event's name, stored under ``eventKey``. Default: the enum case's name
    /// (`paymentFailed` for `.paymentFailed(amount: 12.5)`), or the type's name otherwise.
    var name: String { get }
    /// Default `.info`.
    var level: LogLevel { get }
    /// The record's type; nil (the default) keeps the logger's.
    var type: LogType? { get }
    /// Default: the name.
    var message: LogMessage { get }
    /// The event's values, with their privacy. Default: none.
    var fields: LogFields { get }
}

/// The metadata key that holds a ``DredgeEvent``'s name.
public let eventKey = "event"

extension DredgeEvent {
    public var name: String {
        let described = String(describing: self)
        // An enum case prints as `name` or `name(label: value, …)`; other types print otherwise.
        let head = described.prefix { $0 != "(" }
        if !head.isEmpty, head.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) { return String(head) }
        return String(describing: Self.self)
    }
    public var level: LogLevel { .info }
    public var type: LogType? { nil }
    public var message: LogMessage { LogMessage(stringLiteral: name) }
    public var fields: LogFields { [:] }
}

extension DredgeLogger {
    /// Logs `event` as one record: its level, message and fields, the name under ``eventKey``
    /// (which wins over a field of that name), of the event's type or else this logger's.
    @discardableResult
    public func event(_ event: some DredgeEvent, at timestamp: Timestamp? = nil, uid: String? = nil) -> Bool {
        guard event.level >= minimumLevel else { return true }
        var logger = self
        if let type = event.type { logger.type = type }
        var fields = event.fields
        fields[eventKey] = event.name
        return logger.log(event.level, event.message, metadata: fields, at: timestamp, uid: uid)
    }
}
