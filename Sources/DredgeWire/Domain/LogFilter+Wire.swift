import DredgeDomain

extension LogFilter {
    /// A wire filter that means nothing a store can select.
    public struct InvalidFilter: Error, CustomStringConvertible, Sendable {
        public var description: String
        public init(description: String) { self.description = description }
    }

    /// The store filter a pull's wire filter means; throws for values the store cannot mean
    /// (unknown levels, invalid type names, an empty time range).
    public init(wire f: WireFilter) throws {
        self.init()
        if f.hasSinceUs { since = Timestamp(microseconds: f.sinceUs) }
        if f.hasUntilUs { until = Timestamp(microseconds: f.untilUs) }
        if f.hasUid { uid = f.uid }
        if !f.types.isEmpty {
            types = Set(try f.types.map { name in
                guard let type = LogType(name) else { throw InvalidFilter(description: "invalid log type \(name.debugDescription)") }
                return type
            })
        }
        if !f.levels.isEmpty {
            levels = Set(try f.levels.map { level in
                guard let value = LogLevel(rawValue: level.rawValue) else { throw InvalidFilter(description: "unknown level \(level.rawValue)") }
                return value
            })
        }
        if f.hasText { text = f.text }
        if let problem { throw InvalidFilter(description: problem) }
    }

    /// The wire form of this filter, as the server puts it in a pull command.
    public var wire: WireFilter {
        WireFilter.with { f in
            if let since { f.sinceUs = since.microseconds }
            if let until { f.untilUs = until.microseconds }
            if let uid { f.uid = uid }
            if let types { f.types = types.map(\.rawValue).sorted() }
            if let levels { f.levels = levels.sorted().map { WireLevel(rawValue: $0.rawValue) ?? .info } }
            if let text { f.text = text }
        }
    }
}
