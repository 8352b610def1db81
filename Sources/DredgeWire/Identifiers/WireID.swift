/// The form every id on the wire has (Protocol/README.md § Identities): 16 bytes as lowercase
/// hex, exactly 32 characters `0-9a-f`. Agent ids, command (= pull) ids, upload ids and
/// feedback ids all have it.
///
/// A receiver checks an id with ``isValid(_:)`` before any use: it is looked up, stored and
/// joined into file paths only after. An id of any other form — `../pulls`, `.`, an absolute
/// path, uppercase, 100,000 bytes — is refused (`ERROR_UPLOAD_INVALID`, `REJECT_INVALID`, or
/// 400 on the admin API), and nothing is stored.
public enum WireID {
    /// Characters in an id.
    public static let length = 32

    public static func isValid(_ id: String) -> Bool {
        var count = 0
        for byte in id.utf8 {
            count += 1
            guard count <= length, (48...57).contains(byte) || (97...102).contains(byte) else { return false }
        }
        return count == length
    }

    /// The id as it may be echoed back in an error frame: itself when short enough to be one,
    /// else empty (a hostile 100 KB id is not sent back).
    public static func echo(_ id: String) -> String {
        id.utf8.count <= WireLimits.maxIDBytes ? id : ""
    }
}
