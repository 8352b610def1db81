import DredgeEnvelope
import DredgePayload
import DredgeWire
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import ServiceLifecycle

/// The agent listener: TLS over TCP, one ``ServerConnectionStateMachine`` per connection. A
/// failing connection never affects the others; on graceful shutdown it stops accepting and
/// says `Goodbye` to every agent.
///
/// Connections obey ``ConnectionLimits``: the ``ConnectionGate`` caps them (per source address
/// while unauthenticated), ``ConnectionDeadlineHandler`` closes the ones that do not
/// authenticate in time or go silent, and ``AgentConnections`` keeps one per agent.
public final class AgentListener: Service, Sendable {
    public let deployment: LoadedDeployment
    let issuer: CommandIssuer
    public let registry: AgentRegistry
    public let pulls: PullStore
    public let feedback: FeedbackStore
    public let tokens: TokenStore
    public let dispatcher: PullDispatcher
    let logger: Logger
    let host: String
    let port: Int
    let session: WireAuthResult
    let paths: DataDirectory
    let feedbackLimits: FeedbackLimits
    let connectionLimits: ConnectionLimits
    let threads: WorkThreads
    let gate: ConnectionGate
    let agentConnections = AgentConnections()
    private let bound: BoundAddress
    private let connections = ConnectionSet()
    /// Enrollment and authentication refusals are logged with their source, at most a few a
    /// minute (anyone who can reach the port can cause them).
    let refusals = RateLimitedLog(perMinute: 10)

    public init(
        deployment: LoadedDeployment, registry: AgentRegistry, pulls: PullStore, feedback: FeedbackStore, tokens: TokenStore, dispatcher: PullDispatcher, logger: Logger,
        host: String? = nil, port: Int? = nil, heartbeatSeconds: UInt32? = nil, feedbackLimits: FeedbackLimits? = nil,
        connectionLimits: ConnectionLimits? = nil, threads: WorkThreads? = nil, openFiles: Int = ServerRuntime.openFileLimit()
    ) {
        self.deployment = deployment
        self.issuer = CommandIssuer(encryptionKey: deployment.encryptionKey, signingKey: deployment.signingKey)
        self.paths = DataDirectory(deployment.directory)
        self.feedbackLimits = feedbackLimits ?? deployment.config.feedback ?? .default
        self.connectionLimits = connectionLimits ?? deployment.config.connections ?? .default
        self.threads = threads ?? deployment.config.threads ?? .default
        self.gate = ConnectionGate(caps: self.connectionLimits.caps(openFiles: openFiles))
        self.registry = registry
        self.pulls = pulls
        self.feedback = feedback
        self.tokens = tokens
        self.dispatcher = dispatcher
        self.logger = logger
        self.host = host ?? deployment.config.listenHost
        self.port = port ?? deployment.config.agentPort
        var session = WireAuthResult()
        session.heartbeatIntervalS = heartbeatSeconds ?? WireLimits.defaultHeartbeatSeconds
        session.window = UInt32(WireLimits.defaultWindow)
        session.maxChunkBytes = UInt32(WireLimits.maxChunkBytes)
        self.session = session
        self.bound = BoundAddress()
    }

    /// The port actually bound (useful with port 0), once listening.
    public var boundPort: Int? { bound.port }

    public func run() async throws {
        let sslContext = try NIOSSLContext(configuration: deployment.tlsConfiguration)
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.so_keepalive), value: 1)
            .bind(host: host, port: port) { channel in
                self.admit(channel, tls: sslContext)
            }
        bound.port = server.channel.localAddress?.port
        logger.info("agent listener ready", metadata: [
            "address": "\(host):\(bound.port ?? port)", "max_agents": "\(gate.caps.authenticated)", "max_unauthenticated": "\(gate.caps.unauthenticated)",
            "threads": "control \(threads.control), uploads \(threads.uploads), unpack \(threads.unpack)",
        ])
        let work = ServerWork(threads)
        do {
            try await withGracefulShutdownHandler {
                try await withThrowingDiscardingTaskGroup { group in
                    try await server.executeThenClose { inbound in
                        for try await (connection, token) in inbound {
                            group.addTask { await self.serve(connection, token: token, work: work) }
                        }
                    }
                }
            } onGracefulShutdown: {
                // Stop accepting, then say goodbye to every agent so the connections end.
                server.channel.close(promise: nil)
                self.connections.closeAll(saying: .with { $0.goodbye = .with { $0.reason = "server shutting down" } })
            }
        } catch {
            await work.shutdown()
            throw error
        }
        await work.shutdown()
    }

    /// A new TCP connection: refused (closed before TLS) over its address's cap, else counted,
    /// given its deadlines and a frame limit small until it authenticates, and served.
    private func admit(_ channel: any Channel, tls: NIOSSLContext) -> EventLoopFuture<(NIOAsyncChannel<WireFrame, WireFrame>, Int)> {
        let address = channel.remoteAddress?.ipAddress ?? "unknown"
        switch gate.admit(address: address, channel: channel) {
        case .refused(let why):
            refusals.log { suppressed in
                logger.notice("connection refused", metadata: ["remote": "\(address)", "reason": "\(why)", "suppressed": "\(suppressed)"])
            }
            channel.close(promise: nil)
            return channel.eventLoop.makeFailedFuture(ChannelError.inputClosed)
        case .admitted(let token, let evicted):
            if let evicted {
                refusals.log { suppressed in
                    logger.notice("closing the oldest unauthenticated connection to make room", metadata: ["suppressed": "\(suppressed)"])
                }
                evicted.close(promise: nil)
            }
            let gate = self.gate
            channel.closeFuture.whenComplete { _ in gate.release(token) }
            let frameLimit = FrameSizeLimit(WireLimits.maxPreAuthFrameBytes)
            let limits = connectionLimits
            return channel.eventLoop.makeCompletedFuture { () throws -> (NIOAsyncChannel<WireFrame, WireFrame>, Int) in
                let handlers = channel.pipeline.syncOperations
                try handlers.addHandler(NIOSSLServerHandler(context: tls))
                try handlers.addHandler(ByteToMessageHandler(FrameDecoder(limit: frameLimit)))
                try handlers.addHandler(MessageToByteHandler(FrameEncoder()))
                try handlers.addHandler(ConnectionDeadlineHandler(
                    handshake: .nanoseconds(Int64(limits.handshakeSeconds * 1e9)), missedHeartbeats: limits.missedHeartbeats, frameLimit: frameLimit))
                return (try NIOAsyncChannel<WireFrame, WireFrame>(wrappingChannelSynchronously: channel), token)
            }.flatMapError { error in
                // NIO drops a channel whose initializer failed without closing it.
                channel.close(promise: nil)
                return channel.eventLoop.makeFailedFuture(error)
            }
        }
    }

    /// One connection, start to end. Errors end this connection only.
    ///
    /// An idle connection must be cheap: the task keeps, for its whole life, the memory of the
    /// deepest chain of async frames it ever ran. So everything but the writes happens in the
    /// synchronous ``ConnectionSession``, one frame at a time on a ``ServerWork`` pool (upload
    /// frames on `uploads`, the rest on `control`), and the async part stays small and flat.
    func serve(_ channel: NIOAsyncChannel<WireFrame, WireFrame>, token: Int, work: ServerWork) async {
        let remote = channel.channel.remoteAddress?.description
        let setToken = connections.insert(channel.channel)
        defer { connections.remove(setToken) }
        let session = ConnectionSession(listener: self, remote: remote, channel: channel.channel, token: token, unpacking: work.unpacking)
        do {
            try await channel.executeThenClose { inbound, outbound in
                try await withThrowingTaskGroup(of: Void.self) { group in
                    func apply(_ outcome: ConnectionSession.Outcome) async throws -> Bool {
                        if !outcome.frames.isEmpty { try await outbound.write(contentsOf: outcome.frames) }
                        if let id = outcome.registered {
                            group.addTask { try await self.deliverPulls(to: id, token: token, outbound: outbound, work: work) }
                        }
                        return !outcome.close
                    }
                    do {
                        for try await frame in inbound {
                            let pool = ConnectionUploads.uploadID(of: frame) == nil ? work.control : work.uploads
                            if try await !apply(pool.runIfActive { try session.receive(frame) }) { break }
                        }
                    } catch let error as WireProtocolError {
                        // The decoder refused the stream: tell the peer why, then close.
                        _ = try? await apply(work.control.runIfActive { try session.fail(error) })
                    }
                    group.cancelAll()
                }
            }
        } catch {
            logger.debug("agent connection ended", metadata: ["error": "\(error)", "remote": "\(remote ?? "?")"])
        }
        // Uploads being unpacked stop (what they staged is removed); the upload stays on disk.
        // Cleanup runs even when this task was cancelled (the pool skips work for a cancelled
        // task): then here, directly.
        do {
            try await work.uploads.runIfActive { session.closed() }
        } catch {
            session.closed()
        }
        if let agentID = session.agentID, let generation = session.generation {
            agentConnections.remove(agentID, token: token)
            do {
                do {
                    try await work.control.runIfActive { [registry] in try registry.disconnected(agentID, generation: generation) }
                } catch is CancellationError {
                    try registry.disconnected(agentID, generation: generation)
                }
            } catch {
                logger.error("could not record an agent's disconnection", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
            }
            logger.info("agent disconnected", metadata: ["agent.id": "\(agentID)"])
        }
    }

    /// Sends the agent its pulls: on connecting, the queued ones and the ones delivered before
    /// but never answered (the agent answers a repeated command as it did the first time); then
    /// new ones whenever the dispatcher says they appeared.
    ///
    /// Each pull is marked delivered before its command is written, so one whose write is lost
    /// goes again on the next connection; only the agent's live connection delivers (a replaced
    /// one that is still closing does not). A pull whose command cannot be made (its stored
    /// row is unreadable, its key is gone) is marked failed on its own; the others are
    /// delivered. A passing failure (the database) leaves it for the next wake.
    private func deliverPulls(to agentID: String, token: Int, outbound: NIOAsyncChannelOutboundWriter<WireFrame>, work: ServerWork) async throws {
        let (wakes, registration) = dispatcher.register(agentID)
        defer { dispatcher.unregister(agentID, token: registration) }
        var reconnecting = true
        for await _ in wakes {
            let due: [String]
            do {
                let unanswered = reconnecting
                due = try await work.control.runIfActive { [pulls] in try pulls.deliverable(for: agentID, includingUnanswered: unanswered) }
                reconnecting = false
            } catch is CancellationError {
                return
            } catch {
                logger.error("cannot read an agent's pulls; trying again on the next wake", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
                continue
            }
            for pullID in due {
                guard agentConnections.isLive(agentID, token: token) else { return }
                // Made (RSA wrap, signature) and marked delivered on the control pool.
                guard let frame = try await work.control.runIfActive({ self.deliverable(pullID, to: agentID) }) else { continue }
                try await outbound.write(frame)
                logger.info("pull delivered", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)"])
            }
        }
    }

    /// The command of one pull, marked delivered; nil when it cannot be made or marked now.
    private func deliverable(_ pullID: String, to agentID: String) -> WireFrame? {
        guard let frame = command(pullID, for: agentID) else { return nil }
        do {
            guard try pulls.markDelivered(pullID, agent: agentID) else { return nil }
        } catch {
            logger.error("cannot mark a pull delivered; not sending it now", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)", "error": "\(error)"])
            return nil
        }
        return frame
    }

    /// The signed command of one pull for one agent; nil when it cannot be made now. A pull
    /// that can never be sent (``UnreadablePull``) is failed for that agent with the
    /// reason; any other error is logged and the pull waits for the next wake.
    private func command(_ pullID: String, for agentID: String) -> WireFrame? {
        do {
            guard let key = try registry.publicKey(of: agentID) else { throw UnreadablePull("agent \(agentID) is not enrolled") }
            let command = try issuer.command(try pulls.storedPull(pullID), agent: agentID, agentKey: key)
            return .with { $0.pullCommand = command }
        } catch let error as UnreadablePull {
            logger.error("pull cannot be delivered; marking it failed", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)", "error": "\(error)"])
            do {
                try pulls.update(pullID, agent: agentID, status: .failed, detail: "the server could not make its command: \(error)")
            } catch {
                logger.error("could not mark a pull failed", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)", "error": "\(error)"])
            }
            return nil
        } catch {
            logger.error("cannot make a pull's command now; trying again on the next wake", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)", "error": "\(error)"])
            return nil
        }
    }

    fileprivate func enroll(_ request: WireEnrollRequest, remote: String?, machine: inout ServerConnectionStateMachine) -> [ServerConnectionStateMachine.Action] {
        let accepted: Bool
        do {
            accepted = try tokens.acceptsEnrollment(request.token)
        } catch {
            logger.error("cannot read the enrollment tokens; refusing enrollment", metadata: ["remote": "\(remote ?? "?")", "error": "\(error)"])
            return machine.enrollmentFailed("the server cannot check enrollment tokens now; try later")
        }
        guard accepted else {
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad token", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return machine.enrollmentFailed("enrollment token not accepted")
        }
        do {
            let key = try RSAPublicKey(spki: request.publicKey)
            let id: String
            do {
                id = try registry.enroll(publicKey: key, host: request.host)
            } catch let error as AgentRegistry.AlreadyEnrolled {
                refusals.log { suppressed in
                    logger.notice("enrollment refused: key already enrolled", metadata: ["agent.id": "\(error.agentID)", "remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
                }
                return machine.enrollmentFailed("\(error)")
            }
            logger.info("agent enrolled", metadata: ["agent.id": "\(id)", "host": "\(request.host.hostname)"])
            return machine.enrolled(.with {
                $0.agentID = id
                $0.serverSigningKey = Data(deployment.signingKey.verifyingKey.rawRepresentation)
                $0.serverEncryptionKey = Data(deployment.encryptionKey.publicKey.spki)
            })
        } catch {
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad key", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return machine.enrollmentFailed("public key not accepted: \(error)")
        }
    }
}

/// Lets through at most `perMinute` log records a minute; the next one let through says how
/// many were held back. For events an outsider can cause at will (enrollment refusals).
final class RateLimitedLog: @unchecked Sendable {
    typealias Clock = @Sendable () -> ContinuousClock.Instant
    private let lock = NSLock()
    private let perMinute: Int
    private var now: Clock
    private var windowStart: ContinuousClock.Instant
    private var inWindow = 0
    private var suppressed = 0

    init(perMinute: Int, now: @escaping Clock = { ContinuousClock.now }) {
        self.perMinute = perMinute
        self.now = now
        self.windowStart = now()
    }

    /// Replaces the clock (tests hold time still, so a slow machine does not open a new window).
    func useClock(_ clock: @escaping Clock) {
        lock.withLock {
            now = clock
            windowStart = clock()
        }
    }

    func log(_ emit: (_ suppressed: Int) -> Void) {
        let held: Int? = lock.withLock {
            let now = self.now()
            if now - windowStart >= .seconds(60) {
                windowStart = now
                inWindow = 0
            }
            guard inWindow < perMinute else {
                suppressed += 1
                return nil
            }
            inWindow += 1
            defer { suppressed = 0 }
            return suppressed
        }
        if let held { emit(held) }
    }
}

/// The open agent connections, so a shutdown can end them.
final class ConnectionSet: @unchecked Sendable {
    private let lock = NSLock()
    private var channels: [Int: any Channel] = [:]
    private var next = 0
    private var closing = false

    func insert(_ channel: any Channel) -> Int {
        let (token, close) = lock.withLock { () -> (Int, Bool) in
            next += 1
            channels[next] = channel
            return (next, closing)
        }
        if close { channel.close(promise: nil) }
        return token
    }

    func remove(_ token: Int) { _ = lock.withLock { channels.removeValue(forKey: token) } }

    func closeAll(saying frame: WireFrame) {
        let all = lock.withLock { () -> [any Channel] in
            closing = true
            return Array(channels.values)
        }
        for channel in all {
            channel.writeAndFlush(frame).whenComplete { _ in channel.close(promise: nil) }
        }
    }
}

/// The listening port, set once bound.
final class BoundAddress: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Int?
    var port: Int? {
        get { lock.withLock { value } }
        set { lock.withLock { value = newValue } }
    }
}

/// The synchronous side of one agent connection: the state machine and what its actions do to
/// the registry and the uploads. Returns what to write; never suspends. It runs on the
/// ``ServerWork`` pools, one step at a time: the connection's loop hands it the next frame only
/// after the previous step returned (hence `@unchecked Sendable`).
final class ConnectionSession: @unchecked Sendable {
    struct Outcome {
        var frames: [WireFrame] = []
        /// The agent authenticated: start delivering its pulls.
        var registered: String?
        var close = false
    }

    let listener: AgentListener
    let remote: String?
    let channel: any Channel
    /// The connection's place in the ``ConnectionGate``.
    let token: Int
    private var machine: ServerConnectionStateMachine
    private(set) var agentID: String?
    /// The registry's presence generation of this connection, once registered.
    private(set) var generation: Int64?
    private var host = WireHostInfo()
    private var uploads: ConnectionUploads?
    private let unpacking: PayloadStream.Schedule?

    init(listener: AgentListener, remote: String?, channel: any Channel, token: Int, unpacking: PayloadStream.Schedule?) {
        self.listener = listener
        self.remote = remote
        self.channel = channel
        self.token = token
        self.unpacking = unpacking
        machine = ServerConnectionStateMachine(software: "dredge-server/0.1", session: listener.session)
    }

    /// The connection ended: uploads being unpacked while they arrived stop.
    func closed() { uploads?.closed() }

    func receive(_ frame: WireFrame) throws -> Outcome {
        try run(machine.receive(frame, challenge: secureRandomBytes(WireLimits.challengeBytes)))
    }

    func fail(_ error: WireProtocolError) throws -> Outcome { try run(machine.fail(error)) }

    private func run(_ actions: [ServerConnectionStateMachine.Action]) throws -> Outcome {
        var outcome = Outcome()
        var pending = actions[...]
        while let action = pending.popFirst() {
            switch action {
            case .send(let frame):
                outcome.frames.append(frame)
            case .verify(let id, let signature, let challenge, let claimedHost):
                host = claimedHost
                let key = WireID.isValid(id) ? try listener.registry.publicKey(of: id) : nil
                if let key, AgentAuthentication.verify(signature: signature, challenge: challenge, publicKey: key) {
                    if listener.gate.authenticate(token) {
                        pending.append(contentsOf: machine.authenticated(id))
                    } else {
                        listener.refusals.log { suppressed in
                            listener.logger.warning("agent refused: no room for another agent connection", metadata: [
                                "agent.id": "\(id)", "max_agents": "\(listener.gate.caps.authenticated)", "suppressed": "\(suppressed)",
                            ])
                        }
                        pending.append(contentsOf: machine.fail(WireProtocolError(.errorLimitExceeded, "the server has no room for another agent connection; try later")))
                    }
                } else {
                    listener.refusals.log { suppressed in
                        listener.logger.notice("agent authentication failed", metadata: [
                            "agent.id": "\(WireID.isValid(id) ? id : "(malformed)")", "remote": "\(remote ?? "?")", "suppressed": "\(suppressed)",
                        ])
                    }
                    pending.append(contentsOf: machine.authenticationFailed("unknown agent or bad signature"))
                }
            case .enroll(let request):
                pending.append(contentsOf: listener.enroll(request, remote: remote, machine: &machine))
            case .registered(let id):
                agentID = id
                uploads = ConnectionUploads(
                    agentID: id, pulls: listener.pulls, feedback: listener.feedback, encryptionKey: listener.deployment.encryptionKey,
                    paths: listener.paths, feedbackLimits: listener.feedbackLimits, unpacking: unpacking, logger: listener.logger)
                generation = try listener.registry.connected(id, from: remote, host: host)
                if let replaced = listener.agentConnections.replace(id, token: token, generation: generation ?? 0, channel: channel) {
                    listener.logger.notice("agent reconnected; closing its older connection", metadata: ["agent.id": "\(id)"])
                    AgentConnections.close(replaced, saying: "replaced by a newer connection of the same agent")
                }
                listener.logger.info("agent connected", metadata: ["agent.id": "\(id)", "remote": "\(remote ?? "?")"])
                outcome.registered = id
            case .deliver(let id, let frame):
                if case .heartbeat(let heartbeat)? = frame.body {
                    if let problem = AgentRegistry.problem(with: heartbeat) {
                        listener.logger.notice("heartbeat refused", metadata: ["agent.id": "\(id)", "problem": "\(problem)"])
                        pending.append(contentsOf: machine.fail(WireProtocolError(.errorMalformedFrame, problem)))
                        continue
                    }
                    try listener.registry.heartbeat(id, heartbeat)
                    outcome.frames.append(.with { $0.heartbeatAck = .with { $0.seq = heartbeat.seq } })
                } else if let uploads {
                    do {
                        outcome.frames.append(contentsOf: try uploads.handle(frame))
                    } catch {
                        // The server's own trouble (a database on a full disk): "not now" for
                        // this upload, and the connection goes on.
                        let uploadID = ConnectionUploads.uploadID(of: frame) ?? ""
                        listener.logger.error("upload frame not handled", metadata: ["agent.id": "\(id)", "upload.id": "\(WireID.echo(uploadID))", "error": "\(error)"])
                        if !uploadID.isEmpty {
                            outcome.frames.append(.with {
                                $0.error = .with { $0.code = .errorInternal; $0.detail = "the server cannot handle this upload now; try later"; $0.uploadID = WireID.echo(uploadID) }
                            })
                        }
                    }
                }
            case .close(let error):
                if let error { listener.logger.notice("closing agent connection", metadata: ["error": "\(error)", "remote": "\(remote ?? "?")"]) }
                outcome.close = true
                return outcome
            }
        }
        return outcome
    }
}
