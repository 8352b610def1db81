/// The rule for a user id (uid) wherever one enters: the logging API's pulls by uid, the admin
/// API, the command lines, heartbeats and feedback (Protocol/README.md § Identities): 1 to
/// ``maxBytes`` bytes of UTF-8 with no control character (U+0000–U+001F, U+007F–U+009F).
///
/// Control characters are refused because a NUL ends a C string: SQLite bindings cut a uid at
/// its first NUL, so `"u-1\u{0}x"` would otherwise select `u-1`'s records.
public enum UserID {
    public static let maxBytes = DomainLimits.uidBytes

    /// Why `uid` is not a valid uid, or nil if it is.
    public static func problem(_ uid: String) -> String? {
        if uid.isEmpty { return "uid is empty" }
        if uid.utf8.count > maxBytes { return "uid is longer than \(maxBytes) bytes" }
        if uid.unicodeScalars.contains(where: isControl) { return "uid contains a control character" }
        return nil
    }

    public static func isValid(_ uid: String) -> Bool { problem(uid) == nil }

    static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value)
    }
}

extension Timestamp {
    /// The instants Dredge accepts from outside (filters, commands, the admin API, the command
    /// lines): from the Unix epoch to 9999-12-31T23:59:59.999999Z, so every one has a four-digit
    /// year and no day arithmetic on them can overflow.
    public static let acceptedRange: ClosedRange<Int64> = 0...253_402_300_799_999_999

    public var isAccepted: Bool { Self.acceptedRange.contains(microseconds) }
}
