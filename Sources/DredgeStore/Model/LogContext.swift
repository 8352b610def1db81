import DredgeDomain

/// Identifies a row of the context table. Records refer to their context by id, so what is the
/// same for every record of a process (host, OS, app, version) is stored once.
public struct ContextID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public static func < (a: ContextID, b: ContextID) -> Bool { a.rawValue < b.rawValue }
    public var description: String { String(rawValue) }
}

extension LogContext {
    /// The canonical JSON the context table stores and deduplicates on.
    public var canonicalJSON: String {
        var object: LogMetadata = [
            "host": .string(host), "os": .string(os), "app": .string(app),
            "appVersion": .string(appVersion), "process": .string(process),
        ]
        if !extra.isEmpty { object["extra"] = .object(extra.mapValues { .string($0) }) }
        var w = JSONWriter()
        w.writeObject(object)
        return w.string
    }
}
