import Logging

/// How a value is kept in the store.
///
/// - `public`: stored as given.
/// - `private`: replaced by `<private>` before it is enqueued; the value never reaches the store.
/// - `hashed`: replaced by `<hash:…>`, a keyed hash (HMAC-SHA256 under the store's install key,
///   first 8 bytes in hex). The same value hashes the same on one install, so one user's events
///   can be correlated; without the key the value cannot be recovered or confirmed by guessing.
///
/// The same idea as os.Logger's `privacy: .private(mask: .hash)`. Also usable as a swift-log
/// metadata attribute: `"\(email, privacy: .hashed)"` in swift-log metadata is honoured by
/// ``DredgeLogHandler``.
public enum LogPrivacy: Int64, Sendable, Hashable, Logger.MetadataValueAttributes.Attribute {
    case `public` = 1
    case `private` = 2
    case hashed = 3
}

extension Logger.MetadataValue.StringInterpolation {
    /// Interpolates a value into swift-log metadata with a Dredge privacy level.
    public mutating func appendInterpolation<T: CustomStringConvertible & Sendable>(_ value: T, privacy: LogPrivacy) {
        self.appendInterpolation(value, attributes: { $0[LogPrivacy.self] = privacy })
    }
}
