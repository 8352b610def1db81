import DredgeDomain
import DredgeEnvelope
import DredgeWire
import NIOCore
import Synchronization

/// The agent's side of one connection: its ``AgentConnectionStateMachine`` and the channel's
/// writer. Every frame the agent sends goes out through it, decided by the machine: the
/// handshake (Hello, the signed challenge or the enrollment request), heartbeats, the command
/// and upload layers' frames (refused unless the connection is ready), and `Goodbye` when the
/// agent stops. Enrollment (``AgentEnrollment``), the agent (``AgentClient``) and ``AgentLink``
/// all drive their connections with it, and all name the software alike.
final class AgentConnection: Sendable {
    /// What the agent calls itself in `Hello`.
    static let software = "dredge-agent/\(DredgeVersion.current)"

    /// What the connection's owner is told.
    enum Event: Sendable {
        /// Authenticated: start heartbeats, resume uploads.
        case established(WireAuthResult)
        /// Enrolled: the server closes the connection.
        case enrolled(WireEnrollResponse)
        /// A frame for the command and upload layers.
        case deliver(WireFrame)
        /// The server is restarting and said when it expects to be back; the connection ends.
        case plannedReturn(PlannedReturn)
        /// The connection ends: after the server's error (or the one sent to it), or a `Goodbye`.
        case closed(WireProtocolError?)
    }

    private let machine: Mutex<AgentConnectionStateMachine>
    private let writer: NIOAsyncChannelOutboundWriter<WireFrame>
    private let channel: any Channel
    /// Signs the server's challenge (nil when enrolling).
    private let key: RSAPrivateKey?

    /// What the Swift agent can do beyond the base protocol.
    static let capabilities = AgentLink.capabilities

    /// - Parameter keyGeneration: the generation of the server's keys the agent pins (0 when
    ///   enrolling).
    init(
        mode: AgentConnectionStateMachine.Mode, key: RSAPrivateKey?, channel: any Channel, writer: NIOAsyncChannelOutboundWriter<WireFrame>,
        capabilities: [String] = AgentConnection.capabilities, keyGeneration: Int = 0
    ) {
        machine = Mutex(AgentConnectionStateMachine(mode: mode, software: Self.software, capabilities: capabilities, keyGeneration: keyGeneration))
        self.key = key
        self.channel = channel
        self.writer = writer
    }

    /// The agent pins another generation of the server's keys: said from the next heartbeat.
    func pinned(_ generation: Int) { machine.withLock { $0.keyGeneration = generation } }

    /// The capabilities the server agreed to (once the handshake is done).
    var agreed: [String] { machine.withLock { $0.agreed } }

    /// Whether the connection is authenticated and not ending.
    var isReady: Bool { machine.withLock { $0.isReady } }

    /// Says Hello.
    func start() async throws -> [Event] {
        try await perform(machine.withLock { $0.start() })
    }

    /// A frame from the server.
    func receive(_ frame: WireFrame) async throws -> [Event] {
        try await perform(machine.withLock { $0.receive(frame) })
    }

    /// Sends a heartbeat; false when the machine sent none (not ready).
    @discardableResult
    func heartbeat(activeUIDs: [String], stats: WireStoreStats, users: WireUserReport? = nil) async throws -> Bool {
        let actions = machine.withLock { $0.heartbeat(activeUIDs: activeUIDs, stats: stats, users: users) }
        _ = try await perform(actions)
        return !actions.isEmpty
    }

    /// Sends a frame of the command or upload layer; throws when the machine refuses it (the
    /// connection is not ready, or ending), as a write on a closed connection would.
    func send(_ frame: WireFrame) async throws {
        let actions = machine.withLock { $0.send(frame) }
        guard !actions.isEmpty else { throw AgentError("the connection is not ready or is ending; the frame was not sent") }
        _ = try await perform(actions)
    }

    /// Says `Goodbye` with `reason` (the agent is stopping) and closes once it is written, or
    /// after a few seconds if it cannot be; closes at once when the connection already ended.
    /// Safe from any thread, and from code that cannot wait.
    func goodbye(_ reason: String) {
        let frames = machine.withLock { $0.goodbye(reason) }.compactMap { if case .send(let frame) = $0 { frame } else { nil } }
        guard let last = frames.last else { return channel.close(promise: nil) }
        let channel = self.channel
        let fallback = channel.eventLoop.scheduleTask(in: .seconds(2)) { channel.close(promise: nil) }
        channel.writeAndFlush(last).whenComplete { _ in
            fallback.cancel()
            channel.close(promise: nil)
        }
    }

    /// The connection dropped or its owner gave up: nothing is sent from now on.
    func closed(_ reason: String) {
        machine.withLock { $0.closed(reason) }
    }

    /// Carries out the machine's actions: frames written in order, the challenge signed (and
    /// the signature's actions carried out in turn); the rest become events.
    private func perform(_ actions: [AgentConnectionStateMachine.Action]) async throws -> [Event] {
        var events: [Event] = []
        var pending = actions[...]
        while let action = pending.popFirst() {
            switch action {
            case .send(let frame):
                try await writer.write(frame)
            case .signChallenge(let challenge):
                guard let key else { throw AgentError("asked to sign a challenge without a key") }
                guard case .authenticate(let agentID, _) = machine.withLock({ $0.mode }) else { continue }
                let signature = try AgentAuthentication.sign(challenge: challenge, agentID: agentID, with: key)
                pending.append(contentsOf: machine.withLock { $0.signed(signature) })
            case .established(let result):
                events.append(.established(result))
            case .enrolled(let response):
                events.append(.enrolled(response))
            case .deliver(let frame):
                events.append(.deliver(frame))
            case .plannedReturn(let planned):
                events.append(.plannedReturn(planned))
            case .close(let error):
                events.append(.closed(error))
            }
        }
        return events
    }

    /// Runs the handshake over `inbound` until the connection is ready (authenticate mode) or
    /// enrolled (enroll mode); the event that ended it. Throws when the server closes first.
    func handshake(_ inbound: inout NIOAsyncChannelInboundStream<WireFrame>.AsyncIterator) async throws -> Event {
        var events = try await start()
        while true {
            for event in events {
                switch event {
                case .established, .enrolled, .closed: return event
                case .deliver, .plannedReturn: continue
                }
            }
            guard let frame = try await inbound.next() else { throw AgentError("the server closed the connection during the handshake") }
            events = try await receive(frame)
        }
    }
}
