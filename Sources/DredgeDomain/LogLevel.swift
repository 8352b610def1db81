/// Severity of a record. The seven levels and their order are swift-log's, so a swift-log level
/// maps one to one. Stored as the raw value; never renumber.
public enum LogLevel: Int, Sendable, CaseIterable, Comparable, Codable, CustomStringConvertible {
    case trace = 0
    case debug = 1
    case info = 2
    case notice = 3
    case warning = 4
    case error = 5
    case critical = 6

    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }

    public var name: String {
        switch self {
        case .trace: "trace"
        case .debug: "debug"
        case .info: "info"
        case .notice: "notice"
        case .warning: "warning"
        case .error: "error"
        case .critical: "critical"
        }
    }

    public var description: String { name }

    /// Accepts the level names above and the common aliases `warn`, `err` and `fatal`.
    public init?(name: String) {
        switch name.lowercased() {
        case "trace": self = .trace
        case "debug": self = .debug
        case "info": self = .info
        case "notice": self = .notice
        case "warning", "warn": self = .warning
        case "error", "err": self = .error
        case "critical", "fatal", "crit": self = .critical
        default: return nil
        }
    }
}
