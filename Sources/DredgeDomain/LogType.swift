/// What a record is about. The well-known types are predefined; an app may define any other
/// (lowercase letters, digits, `.`, `-`, `_`, at most ``LogType/maxLength`` bytes).
public struct LogType: Hashable, Sendable, Codable, ExpressibleByStringLiteral, CustomStringConvertible {
    public let rawValue: String
    /// The text this type was normalized from (``init(normalizing:)``), when it was not a valid
    /// name; nil for a valid one. Not part of the type's identity.
    public let normalizedFrom: String?

    public static let maxLength = 64

    public static let app: LogType = "app"
    public static let business: LogType = "business"
    public static let network: LogType = "network"
    public static let player: LogType = "player"
    public static let system: LogType = "system"

    /// Creates a type; returns nil if the name is empty, too long or has characters outside
    /// `[a-z0-9._-]`.
    public init?(_ rawValue: String) {
        guard Self.isName(rawValue.utf8) else { return nil }
        self.rawValue = rawValue
        self.normalizedFrom = nil
    }

    /// Whether these UTF-8 bytes are a type name: 1 to ``maxLength`` of `[a-z0-9._-]` (Protocol
    /// § 5). What the server's index checks a record line's type with, without making a string.
    public static func isName(_ bytes: some Collection<UInt8>) -> Bool {
        (1...maxLength).contains(bytes.count) && bytes.allSatisfy { (97...122).contains($0) || (48...57).contains($0) || $0 == 46 || $0 == 45 || $0 == 95 }
    }

    /// A literal that is not a valid name (`"Checkout"`, `"my type"`) is normalized, never a
    /// crash: see ``init(normalizing:)``. A `LogCenter` records the first use of each such
    /// name once, as a warning.
    public init(stringLiteral value: String) {
        self.init(normalizing: value)
    }

    /// A valid type made from any text: ASCII letters lowercased, every other character outside
    /// `[a-z0-9._-]` replaced by `-`, cut to ``maxLength`` bytes; empty text is `app`. A name
    /// that had to change keeps what it was given in ``normalizedFrom``.
    public init(normalizing name: String) {
        if let valid = LogType(name) {
            self = valid
            return
        }
        var bytes: [UInt8] = []
        for scalar in name.lowercased().unicodeScalars {
            guard bytes.count < Self.maxLength else { break }
            let v = scalar.value
            let allowed = (97...122).contains(v) || (48...57).contains(v) || v == 46 || v == 45 || v == 95
            bytes.append(allowed ? UInt8(v) : 45)
        }
        self.rawValue = bytes.isEmpty ? "app" : String(decoding: bytes, as: UTF8.self)
        self.normalizedFrom = name
    }

    public static func == (a: LogType, b: LogType) -> Bool { a.rawValue == b.rawValue }
    public func hash(into hasher: inout Hasher) { hasher.combine(rawValue) }

    /// Used when reading back rows the store itself validated on the way in.
    package init(unchecked rawValue: String) {
        self.rawValue = rawValue
        self.normalizedFrom = nil
    }

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
