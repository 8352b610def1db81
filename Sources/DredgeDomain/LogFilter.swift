/// Which records a query (and later an export) selects. Every field narrows the selection; a
/// field left nil does not filter.
public struct LogFilter: Sendable, Hashable {
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

    /// The same selection with an empty list of types or levels, or an empty text, as none:
    /// equal normalized filters select the same records.
    public var normalized: LogFilter {
        var f = self
        if f.types?.isEmpty == true { f.types = nil }
        if f.levels?.isEmpty == true { f.levels = nil }
        if f.text?.isEmpty == true { f.text = nil }
        return f
    }

    /// The filter as one line for people, in one wording wherever it is shown (each surface's
    /// times as it prints them, with their zone; an error's detail in RFC 3339): "since …, until …, levels
    /// warning,error, types app, containing "timeout"", or "everything". The uid is not said
    /// (the pull names it).
    public func summary(time: (Timestamp) -> String) -> String {
        var parts: [String] = []
        if let since { parts.append("since \(time(since))") }
        if let until { parts.append("until \(time(until))") }
        if let levels, !levels.isEmpty { parts.append("levels \(levels.sorted().map(\.name).joined(separator: ","))") }
        if let types, !types.isEmpty { parts.append("types \(types.map(\.rawValue).sorted().joined(separator: ","))") }
        if let text, !text.isEmpty { parts.append("containing \(text.debugDescription)") }
        return parts.isEmpty ? "everything" : parts.joined(separator: ", ")
    }
}

extension LogFilter {
    /// The records a pull selects (Protocol § Pull commands): this filter with `uid` set to the
    /// target's when the pull names a user (`targetUID` not empty). Agents refuse a command whose
    /// filter names another uid; here the target wins.
    public func bounded(toTarget targetUID: String) -> LogFilter {
        guard !targetUID.isEmpty else { return self }
        var bounded = self
        bounded.uid = targetUID
        return bounded
    }

    /// Why this filter cannot be accepted from outside, or nil: times outside
    /// ``Timestamp/acceptedRange``, `until` not after `since`, an invalid uid, a NUL in the text, a text over ``DomainLimits/filterTextBytes``.
    public var problem: String? {
        if let since, !since.isAccepted { return "since is out of range (\(Timestamp.acceptedRange.lowerBound)...\(Timestamp.acceptedRange.upperBound) µs)" }
        if let until, !until.isAccepted { return "until is out of range (\(Timestamp.acceptedRange.lowerBound)...\(Timestamp.acceptedRange.upperBound) µs)" }
        if let since, let until, until <= since { return "until must be after since" }
        if let uid, let problem = UserID.problem(uid) { return problem }
        if let text, text.utf8.contains(0) { return "text contains a NUL character" }
        if let text, text.utf8.count > DomainLimits.filterTextBytes { return "text is longer than \(DomainLimits.filterTextBytes) bytes" }
        return nil
    }
}

/// The filter as JSON, in one vocabulary wherever a program reads it: the admin API's requests
/// and answers and the server's stored row (``StoredFilter``, which adds a version); people read
/// it as ``summary(time:)`` (the CLI, the console, the audit log).
///
/// ```
/// {"levels":["warning","error"],"since_us":1763700000000000,"text":"timeout","types":["app"],
///  "uid":"u-1","until_us":1763786400000000}
/// ```
///
/// Times are microseconds since 1970 (`since_us` inclusive, `until_us` exclusive), levels are
/// names (sorted by severity), types are names (sorted); a key is present only when that part
/// is set.
///
/// Reading also takes the shape older clients wrote (the synthesized one): `since`/`until` in
/// microseconds, and levels as numbers 0 (trace) to 6 (critical); level aliases (`warn`) are
/// read as their level. A key it does not know is refused, never ignored: a misspelt part
/// would otherwise widen the selection.
extension LogFilter: Codable {
    private typealias Key = NamedKey

    /// The keys read; the first of each pair is the one written.
    private static let keys: Set<String> = ["since_us", "since", "until_us", "until", "uid", "types", "levels", "text"]

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Key.self)
        if let unknown = c.allKeys.first(where: { !Self.keys.contains($0.stringValue) }) {
            throw DecodingError.dataCorruptedError(
                forKey: unknown, in: c, debugDescription: "a filter has no part \(unknown.stringValue.debugDescription) (it has since_us, until_us, uid, types, levels, text)")
        }
        func time(_ name: String, old: String) throws -> Timestamp? {
            if c.contains(Key(name)) && c.contains(Key(old)) {
                throw DecodingError.dataCorruptedError(forKey: Key(old), in: c, debugDescription: "a filter gives \(name) or \(old), not both")
            }
            return try (c.decodeIfPresent(Int64.self, forKey: Key(name)) ?? c.decodeIfPresent(Int64.self, forKey: Key(old))).map(Timestamp.init(microseconds:))
        }
        self.init(since: try time("since_us", old: "since"), until: try time("until_us", old: "until"))
        uid = try c.decodeIfPresent(String.self, forKey: Key("uid"))
        types = try c.decodeIfPresent([LogType].self, forKey: Key("types")).map(Set.init)
        text = try c.decodeIfPresent(String.self, forKey: Key("text"))
        levels = try c.decodeIfPresent([NamedLevel].self, forKey: Key("levels")).map { Set($0.map(\.level)) }
    }

    /// A level as a name (or alias), or as the number older clients sent.
    private struct NamedLevel: Decodable {
        let level: LogLevel

        init(from decoder: any Decoder) throws {
            let c = try decoder.singleValueContainer()
            if let number = try? c.decode(Int.self) {
                guard let level = LogLevel(rawValue: number) else {
                    throw DecodingError.dataCorruptedError(in: c, debugDescription: "level \(number) is not one of 0 (trace) to 6 (critical)")
                }
                self.level = level
                return
            }
            let name = try c.decode(String.self)
            guard let level = LogLevel(name: name) else {
                throw DecodingError.dataCorruptedError(in: c, debugDescription: "\(name.debugDescription) is not a level (trace, debug, info, notice, warning, error, critical)")
            }
            self.level = level
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Key.self)
        try c.encodeIfPresent(since?.microseconds, forKey: Key("since_us"))
        try c.encodeIfPresent(until?.microseconds, forKey: Key("until_us"))
        try c.encodeIfPresent(uid, forKey: Key("uid"))
        try c.encodeIfPresent(types.map { $0.map(\.rawValue).sorted() }, forKey: Key("types"))
        try c.encodeIfPresent(levels.map { $0.sorted().map(\.name) }, forKey: Key("levels"))
        try c.encodeIfPresent(text, forKey: Key("text"))
    }
}

/// A JSON object's key by its name, for the readers that check every key an object holds
/// (``LogFilter``'s and ``StoredFilter``'s).
struct NamedKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(_ string: String) { stringValue = string }
    init?(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}
