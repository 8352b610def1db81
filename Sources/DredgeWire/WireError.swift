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

    public static func frameTooLarge(_ length: Int) -> WireProtocolError {
        WireProtocolError(.errorFrameTooLarge, "frame of \(length) bytes exceeds the maximum of \(WireLimits.maxFrameBytes)")
    }

    public static func malformed(_ why: String) -> WireProtocolError {
        WireProtocolError(.errorMalformedFrame, why)
    }

    public static func unexpected(_ what: String, in state: String) -> WireProtocolError {
        WireProtocolError(.errorUnexpectedMessage, "\(what) not allowed in state \(state)")
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
