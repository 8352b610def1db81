import DredgeDomain
import DredgeStore
import Foundation

/// Anything a log call accepts as a metadata value: a plain value (``LogValueConvertible``) or
/// one wrapped with its privacy level (``LogField``).
///
/// ```swift
/// log.error("checkout failed", metadata: [
///     "amount": amount,                // an Int variable: public
///     "retry": true,
///     "email": .hashed(user.email),    // correlatable, not readable
///     "card": .private(card),          // never stored
/// ])
/// ```
public protocol LogFieldConvertible: Sendable {
    /// The value and its privacy.
    var logField: LogField { get }
}

/// A value that can be stored as metadata. `String`, `Substring`, `Character`, the integer and
/// floating-point types, `Bool`, `Date` (RFC 3339, UTC), `UUID`, `URL`, optionals (nil is
/// JSON `null`), arrays of them and dictionaries keyed by `String` conform; so may an app's own
/// types, by saying how they are stored:
///
/// ```swift
/// struct OrderID: LogValueConvertible {
///     let raw: Int
///     var logValue: LogValue { .string("order-\(raw)") }
/// }
/// ```
public protocol LogValueConvertible: LogFieldConvertible {
    var logValue: LogValue { get }
}

extension LogValueConvertible {
    public var logField: LogField { LogField(logValue) }
}

/// A metadata value with its privacy level.
public struct LogField: LogFieldConvertible, Sendable {
    public var value: LogValue
    public var privacy: LogPrivacy

    public init(_ value: LogValue, privacy: LogPrivacy = .public) {
        self.value = value
        self.privacy = privacy
    }

    public init(_ value: some LogValueConvertible, privacy: LogPrivacy = .public) {
        self.init(value.logValue, privacy: privacy)
    }

    public var logField: LogField { self }

    /// The value as stored: private values become `<private>`, hashed ones `<hash:…>` (a
    /// non-string value is hashed over its JSON text).
    func stored(with redactor: Redactor) -> LogValue {
        switch privacy {
        case .public: return value
        case .private: return .string(Redactor.privateMask)
        case .hashed:
            if case .string(let s) = value { return .string(redactor.hash(s)) }
            return .string(redactor.hash(value.description))
        }
    }
}

extension LogFieldConvertible where Self == LogField {
    /// Stored as given.
    public static func `public`(_ value: some LogValueConvertible) -> LogField { LogField(value) }
    /// Replaced by `<private>` before it leaves the call: the value never reaches the store.
    public static func `private`(_ value: some LogValueConvertible) -> LogField { LogField(value, privacy: .private) }
    /// Replaced by a keyed hash (`<hash:…>`): the same value hashes the same on one install.
    public static func hashed(_ value: some LogValueConvertible) -> LogField { LogField(value, privacy: .hashed) }

    // The same for a `LogValue` written out (`.hashed(.string(email))`, `.private(["a", 1])`).
    public static func `public`(_ value: LogValue) -> LogField { LogField(value) }
    public static func `private`(_ value: LogValue) -> LogField { LogField(value, privacy: .private) }
    public static func hashed(_ value: LogValue) -> LogField { LogField(value, privacy: .hashed) }
}

/// Metadata of a log call: values of any ``LogFieldConvertible`` type.
public typealias LogFields = [String: any LogFieldConvertible]

extension LogValue: LogValueConvertible {
    public var logValue: LogValue { self }
}

extension String: LogValueConvertible { public var logValue: LogValue { .string(self) } }
extension Substring: LogValueConvertible { public var logValue: LogValue { .string(String(self)) } }
extension Character: LogValueConvertible { public var logValue: LogValue { .string(String(self)) } }
extension Bool: LogValueConvertible { public var logValue: LogValue { .bool(self) } }
extension Int: LogValueConvertible { public var logValue: LogValue { .int(Int64(self)) } }
extension Int8: LogValueConvertible { public var logValue: LogValue { .int(Int64(self)) } }
extension Int16: LogValueConvertible { public var logValue: LogValue { .int(Int64(self)) } }
extension Int32: LogValueConvertible { public var logValue: LogValue { .int(Int64(self)) } }
extension Int64: LogValueConvertible { public var logValue: LogValue { .int(self) } }
extension UInt8: LogValueConvertible { public var logValue: LogValue { .int(Int64(self)) } }
extension UInt16: LogValueConvertible { public var logValue: LogValue { .int(Int64(self)) } }
extension UInt32: LogValueConvertible { public var logValue: LogValue { .int(Int64(self)) } }
/// Past `Int64.max`, stored as its decimal text (JSON numbers beyond 2⁶³ do not read back).
extension UInt64: LogValueConvertible { public var logValue: LogValue { self <= UInt64(Int64.max) ? .int(Int64(self)) : .string(String(self)) } }
extension UInt: LogValueConvertible { public var logValue: LogValue { UInt64(self).logValue } }
/// Not-a-number and the infinities are not JSON numbers: stored as the text `nan`, `inf`, `-inf`.
extension Double: LogValueConvertible { public var logValue: LogValue { isFinite ? .double(self) : .string(isNaN ? "nan" : (self < 0 ? "-inf" : "inf")) } }
extension Float: LogValueConvertible { public var logValue: LogValue { Double(self).logValue } }
/// RFC 3339 in UTC with microseconds, as record times are written.
extension Date: LogValueConvertible {
    public var logValue: LogValue { .string(Timestamp(self).rfc3339) }
}
extension UUID: LogValueConvertible { public var logValue: LogValue { .string(uuidString) } }
extension URL: LogValueConvertible { public var logValue: LogValue { .string(absoluteString) } }
extension Optional: LogFieldConvertible where Wrapped: LogValueConvertible {}
extension Optional: LogValueConvertible where Wrapped: LogValueConvertible {
    public var logValue: LogValue { self?.logValue ?? .null }
}
extension Array: LogFieldConvertible where Element: LogValueConvertible {}
extension Array: LogValueConvertible where Element: LogValueConvertible {
    public var logValue: LogValue { .array(map(\.logValue)) }
}
extension Dictionary: LogFieldConvertible where Key == String, Value: LogValueConvertible {}
extension Dictionary: LogValueConvertible where Key == String, Value: LogValueConvertible {
    public var logValue: LogValue { .object(mapValues(\.logValue)) }
}
extension Timestamp: LogValueConvertible { public var logValue: LogValue { .string(rfc3339) } }
