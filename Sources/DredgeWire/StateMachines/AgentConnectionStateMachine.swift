import SwiftProtobuf

/// The agent's side of one connection (README § Connection states), as a value that takes
/// events and returns actions. It does no I/O and no cryptography: the driver sends the frames
/// it is told to, signs the challenge when asked, and feeds back what arrives.
///
/// ```
/// idle ──start──▶ awaitingHelloAck ──HelloAck──▶ authenticating ──AuthResult──▶ ready
///                                    └─(enroll)─▶ enrolling ──EnrollResponse──▶ enrolled (closes)
/// any ──Error(fatal) / Goodbye (with the server's planned return, if it said) / protocol violation──▶ closed
/// ```
public struct AgentConnectionStateMachine: Sendable {
    public enum Mode: Sendable, Equatable {
        /// A known agent: answers the challenge with a signature.
        case authenticate(agentID: String, host: WireHostInfo)
        /// First contact: enrolls with a token and the agent's public key.
        case enroll(token: String, publicKey: [UInt8], host: WireHostInfo)
    }

    public enum State: Sendable, Equatable {
        case idle
        case awaitingHelloAck
        case awaitingSignature(challenge: [UInt8])
        case authenticating
        case enrolling
        case ready(WireAuthResult)
        case closed(String)
    }

    public enum Action: Sendable, Equatable {
        case send(WireFrame)
        /// Sign `challenge` (README § Authentication) and call ``signed(_:)``.
        case signChallenge([UInt8])
        /// Authenticated: start heartbeats every `heartbeatIntervalS`, resume uploads.
        case established(WireAuthResult)
        /// Enrolled: persist the agent id and the server's keys; the server closes this
        /// connection, reconnect in `.authenticate` mode.
        case enrolled(WireEnrollResponse)
        /// A frame for the command and upload layers.
        case deliver(WireFrame)
        /// The server is restarting and said when it expects to be back (its `Goodbye`, README
        /// § Connection states, Planned restarts): reconnect as it says rather than backing off.
        case plannedReturn(PlannedReturn)
        /// Close the connection. The error (if any) was already sent or came from the peer.
        case close(WireProtocolError?)
    }

    public private(set) var state: State = .idle
    public let mode: Mode
    public let software: String
    /// What the agent says it can do in `Hello` (README § 4, Capabilities).
    public let capabilities: [String]
    /// The capabilities the server agreed to in `HelloAck`.
    public private(set) var agreed: [String] = []
    /// The generation of the server's keys the agent pins, said in `AuthResponse` and every
    /// heartbeat when the server agreed to "key-rotation" (0: not said).
    public var keyGeneration: Int = 0
    private var heartbeatSeq: UInt64 = 0

    public init(mode: Mode, software: String = "dredge-agent", capabilities: [String] = [], keyGeneration: Int = 0) {
        self.mode = mode
        self.software = software
        self.capabilities = capabilities
        self.keyGeneration = keyGeneration
    }

    private var saysKeyGeneration: Bool { keyGeneration > 0 && agreed.contains(WireCapability.keyRotation) }

    public var isReady: Bool { if case .ready = state { return true } else { return false } }

    public mutating func start() -> [Action] {
        guard case .idle = state else { return [] }
        state = .awaitingHelloAck
        return [
            .send(.with {
                $0.hello = .with { $0.minVersion = WireLimits.protocolVersion; $0.maxVersion = WireLimits.protocolVersion; $0.software = software; $0.capabilities = capabilities }
            })
        ]
    }

    public mutating func receive(_ frame: WireFrame) -> [Action] {
        if case .closed = state { return [] }
        switch frame.body {
        case .error(let error)?:
            if error.fatal || !isReady {
                state = .closed("server error \(error.code): \(error.detail)")
                return [.close(WireProtocolError(error.code, error.detail))]
            }
            return [.deliver(frame)]
        case .goodbye(let goodbye)?:
            state = .closed("goodbye: \(goodbye.reason)")
            return (PlannedReturn(goodbye).map { [.plannedReturn($0)] } ?? []) + [.close(nil)]
        default:
            break
        }
        switch (state, frame.body) {
        case (.awaitingHelloAck, .helloAck(let ack)?):
            guard ack.version == WireLimits.protocolVersion else {
                return fail(WireProtocolError(.errorVersionUnsupported, "server chose version \(ack.version)"))
            }
            // Only what was offered counts as agreed.
            agreed = ack.capabilities.filter { capabilities.contains($0) }
            switch mode {
            case .authenticate:
                guard ack.challenge.count == WireLimits.challengeBytes else { return fail(.malformed("challenge of \(ack.challenge.count) bytes")) }
                state = .awaitingSignature(challenge: Array(ack.challenge))
                return [.signChallenge(Array(ack.challenge))]
            case .enroll(let token, let publicKey, let host):
                state = .enrolling
                return [.send(.with { $0.enrollRequest = .with { $0.token = token; $0.publicKey = .init(publicKey); $0.host = host } })]
            }
        case (.authenticating, .authResult(let result)?):
            guard case .authenticate(let agentID, _) = mode, result.agentID == agentID else {
                return fail(.malformed("authenticated as another agent"))
            }
            state = .ready(result)
            return [.established(result)]
        case (.enrolling, .enrollResponse(let response)?):
            state = .closed("enrolled")
            return [.enrolled(response), .close(nil)]
        case (.ready, .heartbeatAck?), (.ready, .pullCommand?), (.ready, .uploadReady?), (.ready, .chunkAck?),
            (.ready, .uploadStatus?), (.ready, .uploadResult?):
            return [.deliver(frame)]
        case (.ready, .tailCommand?) where agreed.contains(WireCapability.liveTail), (.ready, .tailAck?) where agreed.contains(WireCapability.liveTail),
            (.ready, .tailStop?) where agreed.contains(WireCapability.liveTail), (.ready, .triggerSet?) where agreed.contains(WireCapability.triggers):
            return [.deliver(frame)]
        default:
            return fail(.unexpected(Self.name(frame), in: state))
        }
    }

    /// The driver's signature over the challenge.
    public mutating func signed(_ signature: [UInt8]) -> [Action] {
        guard case .awaitingSignature = state, case .authenticate(let agentID, let host) = mode else { return [] }
        state = .authenticating
        let generation = saysKeyGeneration ? UInt32(keyGeneration) : 0
        return [.send(.with { $0.authResponse = .with { $0.agentID = agentID; $0.signature = .init(signature); $0.host = host; $0.keyGeneration = generation } })]
    }

    /// A heartbeat, when the interval elapses. Nothing unless ready. `users`: the store's user
    /// report, or nil when it is the same as the last one sent on this connection.
    public mutating func heartbeat(activeUIDs: [String], stats: WireStoreStats, users: WireUserReport? = nil) -> [Action] {
        guard isReady else { return [] }
        heartbeatSeq += 1
        let seq = heartbeatSeq
        let generation = saysKeyGeneration ? UInt32(keyGeneration) : 0
        return [
            .send(.with {
                $0.heartbeat = .with {
                    $0.seq = seq
                    $0.keyGeneration = generation
                    $0.activeUids = Array(activeUIDs.prefix(WireLimits.maxActiveUIDs))
                    $0.stats = stats
                    if var users {
                        if users.users.count > WireLimits.maxReportedUsers {
                            users.users = Array(users.users.prefix(WireLimits.maxReportedUsers))
                            users.truncated = true
                        }
                        $0.users = users
                    }
                }
            })
        ]
    }

    /// A frame of the command and upload layers to send; refused (nothing) unless ready.
    public func send(_ frame: WireFrame) -> [Action] {
        guard isReady, permits(frame) else { return [] }
        return [.send(frame)]
    }

    /// Whether `frame` may go to the server at all: a message a capability adds only once it is
    /// agreed (README § 4).
    func permits(_ frame: WireFrame) -> Bool {
        switch frame.body {
        case .tailAccepted?, .tailBatch?: agreed.contains(WireCapability.liveTail)
        case .triggerSetAck?: agreed.contains(WireCapability.triggers)
        default: true
        }
    }

    /// The agent ends the connection politely (it is stopping): `Goodbye` with the reason,
    /// then close. Nothing once closed.
    public mutating func goodbye(_ reason: String) -> [Action] {
        if case .closed = state { return [] }
        state = .closed("goodbye sent: \(reason)")
        return [.send(.with { $0.goodbye = .with { $0.reason = reason } }), .close(nil)]
    }

    /// The connection dropped or the driver gave up.
    public mutating func closed(_ reason: String) {
        state = .closed(reason)
    }

    private mutating func fail(_ error: WireProtocolError) -> [Action] {
        state = .closed(error.description)
        return [.send(error.frame), .close(error)]
    }

    static func name(_ frame: WireFrame) -> String {
        frame.body.map { String(String(describing: $0).prefix(while: { $0 != "(" })) } ?? "empty frame"
    }
}
