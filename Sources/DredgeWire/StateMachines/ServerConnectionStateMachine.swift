import SwiftProtobuf

/// The server's side of one agent connection (README § Connection states).
///
/// ```
/// awaitingHello ──Hello──▶ awaitingCredentials ──AuthResponse──▶ verifying ──ok──▶ ready
///                                              └─EnrollRequest──▶ enrolling ──ok──▶ closed
/// any ──protocol violation / failed check──▶ closed (after an Error frame)
/// any ──goodbye (server) / Goodbye (agent) / connection lost──▶ closed
/// ```
/// Every frame the server sends on the connection comes from it: the handshake's answers as
/// actions of ``receive(_:challenge:)``, the session's frames (heartbeat acks, pull commands,
/// upload answers) through ``send(_:)`` (refused unless ready), and the last one through
/// ``goodbye(_:)`` or ``fail(_:)``.
/// The driver supplies the challenge's random bytes, checks signatures and tokens against its
/// registry, and reports back; the machine decides what is sent.
public struct ServerConnectionStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        case awaitingHello
        case awaitingCredentials(challenge: [UInt8])
        case verifying(agentID: String)
        case enrolling
        case ready(agentID: String)
        /// The server said `Goodbye`, or the connection was lost, after authentication: what
        /// the agent sent before it knew is still delivered (a chunk in flight is stored),
        /// nothing more is sent.
        case leaving(agentID: String)
        case closed(String)
    }

    public enum Action: Sendable, Equatable {
        case send(WireFrame)
        /// Check that `agentID` is enrolled and `signature` signs `challenge` under its key;
        /// then call ``authenticated(_:)`` or ``authenticationFailed(_:)``.
        case verify(agentID: String, signature: [UInt8], challenge: [UInt8], host: WireHostInfo)
        /// Check the token and key, register the agent, then call ``enrolled(_:)`` or
        /// ``enrollmentFailed(_:)``.
        case enroll(WireEnrollRequest)
        /// The agent is authenticated: register the connection.
        case registered(agentID: String)
        /// A frame for the agent's session (heartbeats, command answers, uploads).
        case deliver(agentID: String, WireFrame)
        case close(WireProtocolError?)
    }

    public private(set) var state: State = .awaitingHello
    /// The capabilities agreed in the handshake: the agent's that this server knows.
    public private(set) var capabilities: [String] = []
    /// With the capability "key-rotation", the generation of the server's keys the agent said
    /// it pins when it authenticated (nil: it did not say).
    public private(set) var claimedKeyGeneration: Int?
    public let software: String
    public let session: WireAuthResult
    /// The capabilities this server agrees to (``WireCapability/known`` unless a test says).
    public let known: [String]

    /// - Parameter session: what the server tells an authenticated agent (interval, window).
    public init(software: String = "dredge-server", session: WireAuthResult = .with {
        $0.heartbeatIntervalS = WireLimits.defaultHeartbeatSeconds
        $0.window = UInt32(WireLimits.defaultWindow)
        $0.maxChunkBytes = UInt32(WireLimits.maxChunkBytes)
    }, known: [String] = WireCapability.known) {
        self.software = software
        self.session = session
        self.known = known
    }

    public var agentID: String? { if case .ready(let id) = state { return id } else { return nil } }

    /// A frame arrived. `challenge` is 32 fresh random bytes, used when the frame is a Hello.
    public mutating func receive(_ frame: WireFrame, challenge: @autoclosure () -> [UInt8]) -> [Action] {
        if case .closed = state { return [] }
        if case .goodbye? = frame.body {
            state = .closed("goodbye")
            return [.close(nil)]
        }
        if case .leaving(let id) = state {
            switch frame.body {
            case .heartbeat?, .commandAccepted?, .commandRejected?, .uploadBegin?, .uploadChunk?, .uploadStatusQuery?, .uploadComplete?:
                return [.deliver(agentID: id, frame)]
            case .error(let error)? where !error.fatal:
                return [.deliver(agentID: id, frame)]
            default:
                return []  // nothing is answered any more
            }
        }
        switch (state, frame.body) {
        case (.awaitingHello, .hello(let hello)?):
            guard hello.minVersion <= WireLimits.protocolVersion, WireLimits.protocolVersion <= hello.maxVersion else {
                return fail(WireProtocolError(.errorVersionUnsupported, "server speaks version \(WireLimits.protocolVersion); agent \(hello.minVersion)...\(hello.maxVersion)"))
            }
            let bytes = challenge()
            state = .awaitingCredentials(challenge: bytes)
            capabilities = WireCapability.agreed(hello.capabilities, known: known)
            return [
                .send(.with {
                    $0.helloAck = .with { $0.version = WireLimits.protocolVersion; $0.software = software; $0.challenge = .init(bytes); $0.capabilities = capabilities }
                })
            ]
        case (.awaitingCredentials(let challenge), .authResponse(let response)?):
            guard !response.agentID.isEmpty, response.agentID.utf8.count <= WireLimits.maxIDBytes else { return fail(.malformed("bad agent id")) }
            state = .verifying(agentID: response.agentID)
            if capabilities.contains(WireCapability.keyRotation), response.keyGeneration > 0 { claimedKeyGeneration = Int(response.keyGeneration) }
            return [.verify(agentID: response.agentID, signature: Array(response.signature), challenge: challenge, host: response.host)]
        case (.awaitingCredentials, .enrollRequest(let request)?):
            state = .enrolling
            return [.enroll(request)]
        case (.ready(let id), .heartbeat?), (.ready(let id), .commandAccepted?), (.ready(let id), .commandRejected?),
            (.ready(let id), .uploadBegin?), (.ready(let id), .uploadChunk?), (.ready(let id), .uploadStatusQuery?),
            (.ready(let id), .uploadComplete?):
            return [.deliver(agentID: id, frame)]
        case (.ready(let id), .tailAccepted?) where capabilities.contains(WireCapability.liveTail),
            (.ready(let id), .tailBatch?) where capabilities.contains(WireCapability.liveTail),
            (.ready(let id), .triggerSetAck?) where capabilities.contains(WireCapability.triggers):
            return [.deliver(agentID: id, frame)]
        case (.ready(let id), .error(let error)?) where !error.fatal:
            return [.deliver(agentID: id, frame)]
        case (_, .error(let error)?):
            state = .closed("agent error \(error.code)")
            return [.close(WireProtocolError(error.code, error.detail))]
        default:
            return fail(.unexpected(AgentConnectionStateMachine.name(frame), in: state))
        }
    }

    public mutating func authenticated(_ agentID: String) -> [Action] {
        guard case .verifying(let pending) = state, pending == agentID else { return [] }
        state = .ready(agentID: agentID)
        var result = session
        result.agentID = agentID
        return [.send(.with { $0.authResult = result }), .registered(agentID: agentID)]
    }

    /// Refused: `ERROR_AUTH_FAILED`, or `code` (`ERROR_KEYS_RETIRED`, `ERROR_LIMIT_EXCEEDED`).
    public mutating func authenticationFailed(_ why: String, code: WireErrorCode = .errorAuthFailed) -> [Action] {
        guard case .verifying = state else { return [] }
        return fail(WireProtocolError(code, why))
    }

    public mutating func enrolled(_ response: WireEnrollResponse) -> [Action] {
        guard case .enrolling = state else { return [] }
        state = .closed("enrolled \(response.agentID)")
        return [.send(agreedOnly(.with { $0.enrollResponse = response })), .close(nil)]
    }

    /// `frame` without what a capability not agreed on this connection adds (README § 4): an
    /// agent that listed none gets the base protocol's bytes.
    func agreedOnly(_ frame: WireFrame) -> WireFrame {
        guard !capabilities.contains(WireCapability.keyRotation) else { return frame }
        var frame = frame
        switch frame.body {
        case .enrollResponse(var response)?:
            response.keyGeneration = 0
            frame.enrollResponse = response
        case .heartbeatAck(var ack)? where !ack.keyAnnouncements.isEmpty:
            ack.keyAnnouncements = []
            frame.heartbeatAck = ack
        default: break
        }
        return frame
    }

    /// Enrollment refused (`ERROR_ENROLLMENT_REFUSED`: the token or key), or, with
    /// `.errorInternal`, not possible now through the server's own fault (try again later).
    public mutating func enrollmentFailed(_ why: String, code: WireErrorCode = .errorEnrollmentRefused) -> [Action] {
        guard case .enrolling = state else { return [] }
        return fail(WireProtocolError(code, why))
    }

    /// A frame of the server's session to send (pull commands, upload answers); nothing unless
    /// ready.
    public func send(_ frame: WireFrame) -> [Action] {
        guard case .ready = state, permits(frame) else { return [] }
        return [.send(agreedOnly(frame))]
    }

    /// Whether `frame` may go to this agent at all: a message a capability adds only once it is
    /// agreed (README § 4).
    func permits(_ frame: WireFrame) -> Bool {
        switch frame.body {
        case .tailCommand?, .tailAck?, .tailStop?: capabilities.contains(WireCapability.liveTail)
        case .triggerSet?: capabilities.contains(WireCapability.triggers)
        default: true
        }
    }

    /// The server ends the connection politely (a silent agent, a newer connection of the same
    /// agent, the server's shutdown): `Goodbye` with the reason, then close. An authenticated
    /// agent's frames already on their way are still delivered (``State/leaving(agentID:)``);
    /// nothing is sent after it. Nothing once leaving or closed. `returning`: the server is
    /// restarting and expects to be back within its time (README § Connection states, Planned
    /// restarts); said to agents before and after authentication alike.
    public mutating func goodbye(_ reason: String, returning: PlannedReturn? = nil) -> [Action] {
        switch state {
        case .closed, .leaving: return []
        case .ready(let id): state = .leaving(agentID: id)
        default: state = .closed("goodbye sent: \(reason)")
        }
        var goodbye = WireGoodbye()
        goodbye.reason = reason
        returning?.fill(&goodbye)
        return [.send(.with { $0.goodbye = goodbye }), .close(nil)]
    }

    /// The connection is gone (closed by either side): nothing is sent from now on; what an
    /// authenticated agent sent before is still delivered.
    public mutating func closed(_ reason: String) {
        switch state {
        case .closed, .leaving: return
        case .ready(let id): state = .leaving(agentID: id)
        default: state = .closed(reason)
        }
    }

    /// A protocol error detected outside the machine (the frame decoder's).
    public mutating func fail(_ error: WireProtocolError) -> [Action] {
        switch state {
        case .closed: return []
        case .leaving: return [.close(error)]  // nothing is sent any more
        default: break
        }
        state = .closed(error.description)
        return [.send(error.frame), .close(error)]
    }
}
