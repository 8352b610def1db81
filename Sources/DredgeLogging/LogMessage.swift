import DredgeDomain
import DredgeStore

/// A log message whose interpolated values each carry a privacy level:
///
/// ```swift
/// log.info("payment of \(amount) by \(email, privacy: .hashed) with card \(card, privacy: .private)")
/// ```
///
/// Literal text is always public. An interpolation without `privacy:` is public: Dredge logs are
/// the app's own and leave the device only through an encrypted, audited pull, so the default
/// favours usefulness; mark personal data explicitly.
public struct LogMessage: ExpressibleByStringInterpolation, ExpressibleByStringLiteral, Sendable {
    enum Segment: Sendable {
        case literal(String)
        case value(String, LogPrivacy)
    }

    let segments: [Segment]
    /// Set when the message needs no redaction, so rendering costs nothing.
    let plain: String?

    public init(stringLiteral value: String) {
        self.segments = []
        self.plain = value
    }

    public init(stringInterpolation: StringInterpolation) {
        if stringInterpolation.needsRedaction {
            self.segments = stringInterpolation.segments
            self.plain = nil
        } else {
            self.segments = []
            self.plain = stringInterpolation.text
        }
    }

    public struct StringInterpolation: StringInterpolationProtocol, Sendable {
        var segments: [Segment] = []
        var text = ""
        var needsRedaction = false

        public init(literalCapacity: Int, interpolationCount: Int) {
            text.reserveCapacity(literalCapacity + interpolationCount * 8)
        }

        public mutating func appendLiteral(_ literal: String) {
            text += literal
            segments.append(.literal(literal))
        }

        public mutating func appendInterpolation<T>(_ value: T, privacy: LogPrivacy = .public) {
            let string = String(describing: value)
            text += string
            segments.append(.value(string, privacy))
            if privacy != .public { needsRedaction = true }
        }
    }

    /// The message as stored.
    func rendered(with redactor: Redactor) -> String {
        if let plain { return plain }
        var out = ""
        for segment in segments {
            switch segment {
            case .literal(let s): out += s
            case .value(let s, let privacy): out += redactor.apply(privacy, to: s)
            }
        }
        return out
    }
}
