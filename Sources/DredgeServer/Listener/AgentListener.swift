import DredgeDomain
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
    public let registry: any AgentDirectory
    public let pulls: any PullQueue
    public let feedback: any FeedbackInbox
    public let tokens: any TokenVault
    /// The live tails (#53): nil, and the listener agrees to no `live-tail`.
    public let tails: (any TailRegistry)?
    /// Where what the tails hold goes to their watchers, and their stops come from.
    public let tailHub: TailHub
    /// The standing triggers and their captures (#54): nil, and the listener agrees to no `triggers`.
    public let triggers: (any TriggerRegistry)?
    /// The triggers in force as the connections read them, told of each change.
    let triggerSets = TriggerSetSource()
    public let dispatcher: PullDispatcher
    let logger: Logger
    let host: String
    let port: Int
    let session: WireAuthResult
    let paths: DataDirectory
    let feedbackLimits: FeedbackLimits
    let connectionLimits: ConnectionLimits
    /// The node's cap on upload chunk bytes a second (`connections.maxIngressBytesPerSecond`), if any.
    let ingress: IngressGovernor?
    let threads: WorkThreads
    let gate: ConnectionGate
    /// Told of each pull or feedback whose files are in place (the ``Indexer``).
    let landed: @Sendable (IndexedSource, _ records: Int) -> Void
    /// Where connections, uploads and their errors are counted (`GET /metrics`).
    public let metrics: ServerMetrics
    let agentConnections = AgentConnections()
    let counters = ConnectionCounters()
    private let bound: BoundAddress
    private let connections = ConnectionSet()
    /// Enrollment and authentication refusals are logged with their source, at most a few a
    /// minute (anyone who can reach the port can cause them).
    let refusals = RateLimitedLog(perMinute: 10)
    /// Refused enrollments per address: ten a minute, then refused unseen until the minute ends.
    let enrollmentThrottle = EnrollmentThrottle()

    /// The TLS each new connection gets; the deployment's, fixed, when nil (``CertificateRenewal``
    /// replaces it in a running server).
    let tls: ReloadableTLS?

    /// - Parameter tls: the TLS each new connection gets, replaced when the certificate is
    ///   renewed; the deployment's, fixed, when nil.
    public init(
        deployment: LoadedDeployment, registry: any AgentDirectory, pulls: any PullQueue, feedback: any FeedbackInbox, tokens: any TokenVault,
        tails: (any TailRegistry)? = nil, tailHub: TailHub? = nil, triggers: (any TriggerRegistry)? = nil, dispatcher: PullDispatcher, logger: Logger,
        host: String? = nil, port: Int? = nil, heartbeatSeconds: UInt32? = nil, feedbackLimits: FeedbackLimits? = nil,
        connectionLimits: ConnectionLimits? = nil, threads: WorkThreads? = nil, openFiles: Int = ServerRuntime.openFileLimit(),
        issuer: CommandIssuer? = nil, landed: @escaping @Sendable (IndexedSource, _ records: Int) -> Void = { _, _ in }, metrics: ServerMetrics = ServerMetrics(),
        tls: ReloadableTLS? = nil
    ) {
        self.tls = tls
        self.landed = landed
        self.metrics = metrics
        self.deployment = deployment
        // The admin API's issuer, so the keys of the pulls it just made are known here.
        self.issuer = issuer ?? CommandIssuer(keys: deployment.keys)
        self.paths = DataDirectory(deployment.directory)
        self.feedbackLimits = feedbackLimits ?? deployment.config.feedback ?? .default
        self.connectionLimits = connectionLimits ?? deployment.config.connections ?? .default
        self.ingress = self.connectionLimits.maxIngressBytesPerSecond.map { IngressGovernor(bytesPerSecond: $0) }
        self.threads = threads ?? deployment.config.threads ?? .default
        self.gate = ConnectionGate(
            caps: self.connectionLimits.caps(openFiles: openFiles, adminConnections: (deployment.config.adminConnections ?? .default).maxConnections))
        self.registry = registry
        self.pulls = pulls
        self.feedback = feedback
        self.tokens = tokens
        self.tails = tails
        self.tailHub = tailHub ?? TailHub()
        self.triggers = triggers
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
        // A revoked agent's connection here ends at once (revoked on any node of a cluster).
        dispatcher.whenRevoked { [agentConnections, logger] agentID in
            guard let connection = agentConnections.connection(of: agentID) else { return }
            logger.notice("closing a revoked agent's connection", metadata: ["agent.id": "\(agentID)"])
            connection.goodbye(Self.revokedDetail)
        }
        // The triggers changed (here or on another node): every connection looks at its set again.
        dispatcher.whenTriggersChanged { [triggerSets] in triggerSets.changed() }
        // A tail stopped through the admin API: the devices connected here stop sending it.
        self.tailHub.whenStopped { [agentConnections] tailID, reason, agents in
            for agent in agents { agentConnections.connection(of: agent)?.send([TailStream.stopFrame(tailID, reason)]) }
        }
    }

    /// What a revoked agent is told.
    static let revokedDetail = "this agent was revoked; enroll the device again (with a new state directory) to use it"

    /// The port actually bound (useful with port 0), once listening.
    public var boundPort: Int? { bound.port }

    /// Reads the connections open on this node into `metrics` at each scrape.
    public var connectionSampler: ServerMetrics.Sampler {
        ServerMetrics.Sampler("agent connections") { [gate, metrics] in
            let counts = gate.counts
            metrics.connectionsAuthenticated.set(Double(counts.authenticated))
            metrics.connectionsAuthenticating.set(Double(counts.unauthenticated))
        }
    }

    /// Returns once the server has ended every connection it accepted: each connection's
    /// chunks are settled and a landed upload's chunks removed (``ended(_:)``). An agent's
    /// close returns before that, so a test that looks at the data directory waits for this.
    /// A cancelled caller returns at once (a test's deadline ends the wait).
    func connectionsEnded() async { await connections.drainedOrCancelled() }

    public func run() async throws {
        let tls = try self.tls ?? ReloadableTLS(deployment.tlsConfiguration)
        let work = ServerWork(threads)
        let services = ConnectionServices(
            registry: registry, pulls: pulls, feedback: feedback, tokens: tokens, tails: tails, tailHub: tailHub, triggers: triggers, triggerSets: triggerSets,
            dispatcher: dispatcher, issuer: issuer, deployment: deployment, paths: paths,
            session: session, feedbackLimits: feedbackLimits, gate: gate, agentConnections: agentConnections, refusals: refusals, enrollmentThrottle: enrollmentThrottle, counters: counters, work: work,
            landed: landed, metrics: metrics, logger: logger, ingress: ingress)
        if let refused = work.idlePolicyRefused {
            logger.warning("upload threads not moved to SCHED_IDLE; they run niced", metadata: ["error": "\(refused)", "nice": "\(threads.bulkNice)"])
        }
        let server: NIOAsyncChannel<Void, Never>
        do {
            server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.socketOption(.so_keepalive), value: 1)
                // NIOSSL's buffers in slots of their own: an idle agent's unwritten pages stay out of memory.
                .childChannelOption(.allocator, value: ConnectionBuffers.allocator)
                .bind(host: host, port: port) { channel in
                    self.admit(channel, tls: tls.context, services: services)
                }
        } catch {
            await work.shutdown()
            throw ListenFailure.error(error, listener: "agents", host: host, port: port)
        }
        bound.port = server.channel.localAddress?.port
        logger.info("agent listener ready", metadata: [
            "address": "\(host):\(bound.port ?? port)", "max_agents": "\(gate.caps.authenticated)", "max_unauthenticated": "\(gate.caps.unauthenticated)",
            "threads": "control \(threads.control), uploads \(threads.uploads), unpack \(threads.unpack)",
        ])
        let goodbye = "server shutting down"
        var failure: (any Error)?
        do {
            try await withGracefulShutdownHandler {
                try await withTaskCancellationHandler {
                    // Each connection is driven by its channel (``ConnectionDriver``); accepting
                    // only needs the server channel's stream consumed.
                    try await server.executeThenClose { inbound in
                        for try await _ in inbound {}
                    }
                } onCancel: {
                    server.channel.close(promise: nil)
                    self.connections.closeAll(saying: goodbye)
                }
            } onGracefulShutdown: {
                // Stop accepting, then say goodbye to every agent so the connections end,
                // telling them how soon to come back (a planned restart).
                server.channel.close(promise: nil)
                self.connections.closeAll(saying: goodbye, returning: self.plannedReturn)
            }
        } catch {
            failure = error
        }
        // Every connection ends (its cleanup uses the pools) before the pools stop.
        connections.closeAll(saying: goodbye)
        await connections.drained()
        await work.shutdown()
        if let failure { throw failure }
    }

    /// What a graceful shutdown tells the `agents` connected (``ConnectionLimits/restartWithinSeconds``):
    /// back within that time, each agent retrying at an interval that grows with their number
    /// so that they do not all return in the same second. Nil when the operator set 0.
    private func plannedReturn(agents: Int) -> PlannedReturn? {
        guard connectionLimits.restartWithinSeconds > 0 else { return nil }
        let planned = PlannedReturn(
            backWithin: .seconds(connectionLimits.restartWithinSeconds), retryEvery: PlannedReturn.retryInterval(agents: agents))
        logger.info("telling the agents when to come back", metadata: ["agents": "\(agents)", "said": "\(planned)"])
        return planned
    }

    /// A new TCP connection: refused (closed before TLS) over its address's cap, else counted,
    /// given its deadlines and a frame limit small until it authenticates, and served.
    private func admit(_ channel: any Channel, tls: NIOSSLContext, services: ConnectionServices) -> EventLoopFuture<Void> {
        let address = channel.remoteAddress?.ipAddress ?? "unknown"
        switch gate.admit(address: address, channel: channel) {
        case .refused(let why):
            metrics.refused(.addressCap)
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
            return channel.eventLoop.makeCompletedFuture { () throws -> Void in
                let handlers = channel.pipeline.syncOperations
                // Before authentication, TLS records one at a time and whole frames only: a
                // partial frame costs its own size, not a grown buffer kept for life.
                try handlers.addHandler(PreAuthenticationRecordPacer(limit: frameLimit))
                try handlers.addHandler(NIOSSLServerHandler(context: tls))
                try handlers.addHandler(PreAuthenticationGatherer(limit: frameLimit))
                try handlers.addHandler(ByteToMessageHandler(FrameDecoder(limit: frameLimit)))
                // Its buffer shrinks back after each flush: a connection that once sent a large
                // frame does not keep that much while idle.
                try handlers.addHandler(MessageToByteHandler(FrameEncoder(), desiredBufferCapacity: 256))
                let outbound = ConnectionOutbound(channel: channel, session: services.session, known: services.capabilities)
                try handlers.addHandler(ConnectionDeadlineHandler(
                    handshake: .nanoseconds(Int64(limits.handshakeSeconds * 1e9)), missedHeartbeats: limits.missedHeartbeats, frameLimit: frameLimit,
                    goodbye: { outbound.goodbye($0) }))
                let (setToken, shuttingDown) = self.connections.insert(outbound)
                let session = ConnectionSession(
                    services: services, remote: channel.remoteAddress?.description, address: address, outbound: outbound, token: token, setToken: setToken)
                let driver = ConnectionDriver(session: session, channel: channel, logger: self.logger, counters: self.counters) { session in await self.ended(session) }
                do {
                    try handlers.addHandler(ConnectionDriverHandler(driver: driver, logger: self.logger))
                } catch {
                    self.connections.remove(setToken)  // no driver: `ended` will not run
                    throw error
                }
                channel.closeFuture.whenComplete { _ in driver.channelClosed() }
                if shuttingDown { channel.close(promise: nil) }
            }.flatMapError { error in
                // NIO drops a channel whose initializer failed without closing it.
                channel.close(promise: nil)
                return channel.eventLoop.makeFailedFuture(error)
            }
        }
    }

    /// A connection closed and its driver handled the frames it had read: its chunks still
    /// being written are settled, uploads being unpacked stop (what they staged is removed;
    /// the upload stays on disk), its deliveries stop, and the agent is recorded offline
    /// unless a newer connection of it took over.
    func ended(_ session: ConnectionSession) async {
        await session.stopDelivery()
        await session.settled()
        do {
            try await session.services.work.uploads.runIfActive { session.closed() }
        } catch {
            session.closed()
        }
        if let agentID = session.agentID, let generation = session.generation {
            agentConnections.remove(agentID, token: session.token)
            do {
                try await registry.disconnected(agentID, generation: generation)
            } catch {
                logger.error("could not record an agent's disconnection", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
            }
            logger.info("agent disconnected", metadata: ["agent.id": "\(agentID)"])
        }
        connections.remove(session.setToken)
    }
}
