/// A protocol violation detected by this side: a frame that cannot be read, a message in the
/// wrong state, a value outside the limits. `code` is what goes on the wire in an `Error`
/// frame; `message` is for logs and people.
public struct WireProtocolError: Error, Hashable, Sendable, CustomStringConvertible {
    public var code: WireErrorCode
    public var message: String
    /// Whether the connection must close after reporting it (README § Errors).
    public var fatal: Bool

    public init(_ code: WireErrorCode, _ message: String, fatal: Bool = true) {
        self.code = code
        self.message = message
        self.fatal = fatal
    }

    public static func frameTooLarge(_ length: Int, limit: Int = WireLimits.maxFrameBytes) -> WireProtocolError {
        WireProtocolError(.errorFrameTooLarge, "frame of \(length) bytes exceeds the maximum of \(limit)")
    }

    public static func malformed(_ why: String) -> WireProtocolError {
        WireProtocolError(.errorMalformedFrame, why)
    }

    /// `state` is described by its name only: a state's payload (a challenge, say) never goes
    /// into a detail the peer reads.
    public static func unexpected(_ what: String, in state: Any) -> WireProtocolError {
        let description = String(describing: state)
        let name = description.prefix { $0 != "(" }
        return WireProtocolError(.errorUnexpectedMessage, "\(what) not allowed in state \(name)")
    }

    public var description: String { "\(code): \(message)" }

    /// The `Error` frame that reports this error to the peer.
    public var frame: WireFrame {
        var error = WireError()
        error.code = code
        error.detail = message
        error.fatal = fatal
        return WireFrame.with { $0.error = error }
    }
}
