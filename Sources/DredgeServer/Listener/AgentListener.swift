import DredgeEnvelope
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
public final class AgentListener: Service, Sendable {
    public let deployment: LoadedDeployment
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
    private let bound: BoundAddress
    private let connections = ConnectionSet()
    /// Enrollment and authentication refusals are logged with their source, at most a few a
    /// minute (anyone who can reach the port can cause them).
    let refusals = RateLimitedLog(perMinute: 10)

    public init(
        deployment: LoadedDeployment, registry: AgentRegistry, pulls: PullStore, feedback: FeedbackStore, tokens: TokenStore, dispatcher: PullDispatcher, logger: Logger,
        host: String? = nil, port: Int? = nil, heartbeatSeconds: UInt32? = nil, feedbackLimits: FeedbackLimits? = nil
    ) {
        self.deployment = deployment
        self.paths = DataDirectory(deployment.directory)
        self.feedbackLimits = feedbackLimits ?? deployment.config.feedback ?? .default
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
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext))
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder()))
                    try channel.pipeline.syncOperations.addHandler(MessageToByteHandler(FrameEncoder()))
                    return try NIOAsyncChannel<WireFrame, WireFrame>(wrappingChannelSynchronously: channel)
                }
            }
        bound.port = server.channel.localAddress?.port
        logger.info("agent listener ready", metadata: ["address": "\(host):\(bound.port ?? port)"])
        try await withGracefulShutdownHandler {
            try await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await connection in inbound {
                        group.addTask { await self.serve(connection) }
                    }
                }
            }
        } onGracefulShutdown: {
            // Stop accepting, then say goodbye to every agent so the connections end.
            server.channel.close(promise: nil)
            self.connections.closeAll(saying: .with { $0.goodbye = .with { $0.reason = "server shutting down" } })
        }
    }

    /// One connection, start to end. Errors end this connection only.
    ///
    /// An idle connection must be cheap: the task keeps, for its whole life, the memory of the
    /// deepest chain of async frames it ever ran. So everything but the writes happens in the
    /// synchronous ``ConnectionSession``, and the async part stays small and flat.
    func serve(_ channel: NIOAsyncChannel<WireFrame, WireFrame>) async {
        let remote = channel.channel.remoteAddress?.description
        let token = connections.insert(channel.channel)
        defer { connections.remove(token) }
        let session = ConnectionSession(listener: self, remote: remote)
        do {
            try await channel.executeThenClose { inbound, outbound in
                try await withThrowingTaskGroup(of: Void.self) { group in
                    func apply(_ outcome: ConnectionSession.Outcome) async throws -> Bool {
                        if !outcome.frames.isEmpty { try await outbound.write(contentsOf: outcome.frames) }
                        if let id = outcome.registered {
                            group.addTask { try await self.deliverPulls(to: id, outbound: outbound) }
                        }
                        return !outcome.close
                    }
                    do {
                        for try await frame in inbound {
                            if try await !apply(session.receive(frame)) { break }
                        }
                    } catch let error as WireProtocolError {
                        // The decoder refused the stream: tell the peer why, then close.
                        _ = try? await apply(session.fail(error))
                    }
                    group.cancelAll()
                }
            }
        } catch {
            logger.debug("agent connection ended", metadata: ["error": "\(error)", "remote": "\(remote ?? "?")"])
        }
        if let agentID = session.agentID {
            try? registry.disconnected(agentID)
            logger.info("agent disconnected", metadata: ["agent.id": "\(agentID)"])
        }
    }

    /// Sends the agent its queued pulls now and whenever the dispatcher says new ones appeared.
    private func deliverPulls(to agentID: String, outbound: NIOAsyncChannelOutboundWriter<WireFrame>) async throws {
        let (wakes, token) = dispatcher.register(agentID)
        defer { dispatcher.unregister(agentID, token: token) }
        for await _ in wakes {
            for (pullID, frame) in try commands(for: agentID) {
                try await outbound.write(frame)
                try delivered(pullID, to: agentID)
            }
        }
    }

    /// The signed commands of the agent's queued pulls.
    private func commands(for agentID: String) throws -> [(String, WireFrame)] {
        let pending = try pulls.pending(for: agentID)
        guard !pending.isEmpty, let key = try registry.publicKey(of: agentID) else { return [] }
        return try pending.map { pull in
            let command = try pulls.command(for: pull, agentKey: key, signer: deployment.signingKey)
            return (pull.id, WireFrame.with { $0.pullCommand = command })
        }
    }

    private func delivered(_ pullID: String, to agentID: String) throws {
        try pulls.markDelivered(pullID, agent: agentID)
        logger.info("pull delivered", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)"])
    }

    fileprivate func enroll(_ request: WireEnrollRequest, remote: String?, machine: inout ServerConnectionStateMachine) -> [ServerConnectionStateMachine.Action] {
        guard tokens.acceptsEnrollment(request.token) else {
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad token", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return machine.enrollmentFailed("enrollment token not accepted")
        }
        do {
            let key = try RSAPublicKey(spki: request.publicKey)
            let id = try registry.enroll(publicKey: key, host: request.host)
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
    private let lock = NSLock()
    private let perMinute: Int
    private var windowStart = ContinuousClock.now
    private var inWindow = 0
    private var suppressed = 0

    init(perMinute: Int) { self.perMinute = perMinute }

    func log(_ emit: (_ suppressed: Int) -> Void) {
        let held: Int? = lock.withLock {
            let now = ContinuousClock.now
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
/// the registry and the uploads. Returns what to write; never suspends.
final class ConnectionSession {
    struct Outcome {
        var frames: [WireFrame] = []
        /// The agent authenticated: start delivering its pulls.
        var registered: String?
        var close = false
    }

    let listener: AgentListener
    let remote: String?
    private var machine: ServerConnectionStateMachine
    private(set) var agentID: String?
    private var host = WireHostInfo()
    private var uploads: ConnectionUploads?

    init(listener: AgentListener, remote: String?) {
        self.listener = listener
        self.remote = remote
        machine = ServerConnectionStateMachine(software: "dredge-server/0.1", session: listener.session)
    }

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
                    pending.append(contentsOf: machine.authenticated(id))
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
                    paths: listener.paths, feedbackLimits: listener.feedbackLimits, logger: listener.logger)
                try listener.registry.connected(id, from: remote, host: host)
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
