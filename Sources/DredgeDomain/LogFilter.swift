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
