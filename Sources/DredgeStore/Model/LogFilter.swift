/// Which records a query (and later an export) selects. Every field narrows the selection; a
/// field left nil does not filter.
public struct LogFilter: Sendable, Hashable, Codable {
    /// Inclusive lower bound.
    public var since: Timestamp?
    /// Exclusive upper bound.
    public var until: Timestamp?
    public var uid: String?
    public var types: Set<LogType>?
    public var levels: Set<LogLevel>?
    /// Case-insensitive (ASCII) substring of the message or of the metadata JSON.
    public var text: String?

    public init(
        since: Timestamp? = nil, until: Timestamp? = nil, uid: String? = nil, types: Set<LogType>? = nil,
        levels: Set<LogLevel>? = nil, text: String? = nil
    ) {
        self.since = since
        self.until = until
        self.uid = uid
        self.types = types
        self.levels = levels
        self.text = text
    }

    public static let all = LogFilter()
}

extension Timestamp: Codable {
    public init(from decoder: any Decoder) throws {
        self.init(microseconds: try decoder.singleValueContainer().decode(Int64.self))
    }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(microseconds)
    }
}
