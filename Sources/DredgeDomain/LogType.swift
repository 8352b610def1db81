/// What a record is about. The well-known types are predefined; an app may define any other
/// (lowercase letters, digits, `.`, `-`, `_`, at most ``LogType/maxLength`` bytes).
public struct LogType: Hashable, Sendable, Codable, ExpressibleByStringLiteral, CustomStringConvertible {
    public let rawValue: String

    public static let maxLength = 64

    public static let app: LogType = "app"
    public static let business: LogType = "business"
    public static let network: LogType = "network"
    public static let player: LogType = "player"
    public static let system: LogType = "system"

    /// Creates a type; returns nil if the name is empty, too long or has characters outside
    /// `[a-z0-9._-]`.
    public init?(_ rawValue: String) {
        guard !rawValue.isEmpty, rawValue.utf8.count <= Self.maxLength,
            rawValue.utf8.allSatisfy({ (97...122).contains($0) || (48...57).contains($0) || $0 == 46 || $0 == 45 || $0 == 95 })
        else { return nil }
        self.rawValue = rawValue
    }

    public init(stringLiteral value: String) {
        guard let type = LogType(value) else { preconditionFailure("invalid log type literal \(value)") }
        self = type
    }

    /// Used when reading back rows the store itself validated on the way in.
    package init(unchecked rawValue: String) { self.rawValue = rawValue }

    public init(from decoder: any Decoder) throws {
        let raw = try decoder.singleValueContainer().decode(String.self)
        guard let type = LogType(raw) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "invalid log type \(raw)"))
        }
        self = type
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(rawValue)
    }

    public var description: String { rawValue }
}
