/// Limits that hold wherever a value enters Dredge: the logging API, the agent, the wire, the
/// server and the admin API check against these, so a value one accepts the others accept.
public enum DomainLimits {
    /// Bytes of UTF-8 in a uid (``UserID``).
    public static let uidBytes = 256
    /// Bytes of UTF-8 in a feedback's free text (1 at least).
    public static let feedbackTextBytes = 16 * 1024
    /// Bytes of UTF-8 in a filter's text (a substring searched for; longer is no search anyone
    /// types, and SQLite refuses LIKE patterns over 50,000 bytes).
    public static let filterTextBytes = 1_024
    /// Uids an agent reports as active in one heartbeat (the most recent ones).
    public static let activeUIDs = 1_024
    /// Uids an agent's user report lists (every user its store holds, the most recently seen
    /// first): a device serving more users than this is reported truncated.
    public static let reportedUsers = 4_096
}

/// The rule for a feedback's text: 1 to ``DomainLimits/feedbackTextBytes`` bytes of UTF-8.
public enum FeedbackText {
    /// Why `text` cannot be a feedback's text, or nil if it can.
    public static func problem(_ text: String) -> String? {
        if text.isEmpty { return "feedback text is empty" }
        if text.utf8.count > DomainLimits.feedbackTextBytes { return "feedback text is longer than \(DomainLimits.feedbackTextBytes) bytes" }
        return nil
    }

    public static func isValid(_ text: String) -> Bool { problem(text) == nil }
}
