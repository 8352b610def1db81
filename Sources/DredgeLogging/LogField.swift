import DredgeDomain
import DredgeStore

/// A metadata value with its privacy level, as a log call passes it:
///
/// ```swift
/// log.error("checkout failed", metadata: [
///     "amount": 12.5,                  // public
///     "email": .hashed(user.email),    // correlatable, not readable
///     "card": .private(card.number),   // never stored
/// ])
/// ```
public struct LogField: Sendable {
    public var value: LogValue
    public var privacy: LogPrivacy

    public init(_ value: LogValue, privacy: LogPrivacy = .public) {
        self.value = value
        self.privacy = privacy
    }

    public static func `public`(_ value: LogValue) -> LogField { LogField(value) }
    public static func `private`(_ value: LogValue) -> LogField { LogField(value, privacy: .private) }
    public static func hashed(_ value: LogValue) -> LogField { LogField(value, privacy: .hashed) }

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

extension LogField: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByStringInterpolation
{
    public init(stringLiteral value: String) { self.init(.string(value)) }
    public init(integerLiteral value: Int64) { self.init(.int(value)) }
    public init(floatLiteral value: Double) { self.init(.double(value)) }
    public init(booleanLiteral value: Bool) { self.init(.bool(value)) }
}

public typealias LogFields = [String: LogField]
