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
    /// Told of each pull or feedback whose files are in place (the ``Indexer``).
    let landed: @Sendable (IndexedSource) -> Void
    let agentConnections = AgentConnections()
    private let bound: BoundAddress
    private let connections = ConnectionSet()
    /// Enrollment and authentication refusals are logged with their source, at most a few a
    /// minute (anyone who can reach the port can cause them).
    let refusals = RateLimitedLog(perMinute: 10)

    public init(
        deployment: LoadedDeployment, registry: any AgentDirectory, pulls: any PullQueue, feedback: any FeedbackInbox, tokens: any TokenVault, dispatcher: PullDispatcher,
        logger: Logger,
        host: String? = nil, port: Int? = nil, heartbeatSeconds: UInt32? = nil, feedbackLimits: FeedbackLimits? = nil,
        connectionLimits: ConnectionLimits? = nil, threads: WorkThreads? = nil, openFiles: Int = ServerRuntime.openFileLimit(),
        issuer: CommandIssuer? = nil, landed: @escaping @Sendable (IndexedSource) -> Void = { _ in }
    ) {
        self.landed = landed
        self.deployment = deployment
        // The admin API's issuer, so the keys of the pulls it just made are known here.
        self.issuer = issuer ?? CommandIssuer(encryptionKey: deployment.encryptionKey, signingKey: deployment.signingKey)
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

    /// Returns once the server has ended every connection it accepted: each connection's
    /// chunks are settled and a landed upload's chunks removed (``ended(_:)``). An agent's
    /// close returns before that, so a test that looks at the data directory waits for this.
    /// A cancelled caller returns at once (a test's deadline ends the wait).
    func connectionsEnded() async { await connections.drainedOrCancelled() }

    public func run() async throws {
        let sslContext = try NIOSSLContext(configuration: deployment.tlsConfiguration)
        let work = ServerWork(threads)
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
                    self.admit(channel, tls: sslContext, work: work)
                }
        } catch {
            await work.shutdown()
            throw error
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
                // Stop accepting, then say goodbye to every agent so the connections end.
                server.channel.close(promise: nil)
                self.connections.closeAll(saying: goodbye)
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

    /// A new TCP connection: refused (closed before TLS) over its address's cap, else counted,
    /// given its deadlines and a frame limit small until it authenticates, and served.
    private func admit(_ channel: any Channel, tls: NIOSSLContext, work: ServerWork) -> EventLoopFuture<Void> {
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
                try handlers.addHandler(ConnectionDeadlineHandler(
                    handshake: .nanoseconds(Int64(limits.handshakeSeconds * 1e9)), missedHeartbeats: limits.missedHeartbeats, frameLimit: frameLimit))
                let session = ConnectionSession(listener: self, remote: channel.remoteAddress?.description, channel: channel, token: token, work: work)
                let driver = ConnectionDriver(session: session, channel: channel, logger: self.logger) { session in await self.ended(session) }
                try handlers.addHandler(ConnectionDriverHandler(driver: driver, logger: self.logger))
                channel.closeFuture.whenComplete { _ in driver.channelClosed() }
                let (setToken, shuttingDown) = self.connections.insert(channel)
                session.setToken = setToken
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
            try await session.work.uploads.runIfActive { session.closed() }
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
        if let setToken = session.setToken { connections.remove(setToken) }
    }

    /// Joins the agent to the open pulls by uid alone of the uids it came to hold, and wakes its
    /// delivery if it joined any. With a user report (the first heartbeat of each connection),
    /// every uid it holds is looked at, so a join that failed once (the database was busy) is
    /// made on the next connection at the latest.
    func adoptPulls(for agentID: String, heartbeat: WireHeartbeat, added: Set<String>) async {
        var uids = added
        if heartbeat.hasUsers {
            uids.formUnion(heartbeat.users.users.map(\.uid))
            uids.formUnion(heartbeat.activeUids)
        }
        guard !uids.isEmpty else { return }
        do {
            let adopted = try await pulls.adopt(agent: agentID, uids: uids, now: .now)
            guard !adopted.isEmpty else { return }
            logger.info("agent joined pulls by uid", metadata: ["agent.id": "\(agentID)", "pulls": "\(adopted.joined(separator: ","))"])
            dispatcher.wake([agentID])
        } catch {
            logger.error("cannot join an agent to the pulls of its uids", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
        }
    }

    /// Sends the agent its pulls, one pass per wake (``DeliveryRunner``): on connecting,
    /// the queued ones and the ones delivered before but never answered (the agent answers a
    /// repeated command as it did the first time); then new ones whenever the dispatcher says
    /// they appeared. A pull this process just queued comes with the wake (``FreshPull``) and
    /// is sent without reading the queue, claimed only if still queued.
    ///
    /// Each pull is marked delivered before its command is written (the mark and the command's
    /// RSA wrap and signature, on the control pool, run at once), so one whose write is lost
    /// goes again on the next connection; only the agent's live connection delivers (a
    /// replaced one that is still closing does not). A pull whose command cannot be made (its
    /// stored row is unreadable, its key does not unwrap) is marked failed on its own; the
    /// others are delivered. A passing failure leaves the pull queued for the next wake.
    func deliverDue(to agentID: String, _ request: DeliveryRunner.Request, token: Int, channel: any Channel, work: ServerWork) async -> DeliveryRunner.Pass {
        let due: [(pull: DuePull, key: RSAPublicKey?, onlyQueued: Bool)]
        do {
            if request.read {
                let pulls: [DuePull]
                let agentKey: RSAPublicKey?
                if request.includingUnanswered {
                    // A connection's first pass: most find nothing, so the key is read only if needed.
                    pulls = try await self.pulls.deliverable(for: agentID, includingUnanswered: true)
                    agentKey = pulls.isEmpty ? nil : try await registry.publicKey(of: agentID)
                } else {
                    // Both at once, one wait instead of two.
                    async let key = registry.publicKey(of: agentID)
                    pulls = try await self.pulls.deliverable(for: agentID, includingUnanswered: false)
                    agentKey = try await key
                }
                due = pulls.map { ($0, agentKey, false) }
            } else {
                // Past its expiry a pull is not sent (the next read marks it expired).
                let now = Timestamp.now
                let fresh = request.fresh.filter { $0.pull.expiresAt > now }
                var agentKey = fresh.lazy.compactMap { $0.agentKeys[agentID] }.first
                if agentKey == nil, !fresh.isEmpty { agentKey = try await registry.publicKey(of: agentID) }
                due = fresh.map { (DuePull(id: $0.pull.id, stored: .success($0.pull)), agentKey, true) }
            }
        } catch is CancellationError {
            return .stop
        } catch {
            logger.error("cannot read an agent's pulls; trying again on the next wake", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
            return .unread
        }
        for (pull, key, onlyQueued) in due {
            guard agentConnections.isLive(agentID, token: token) else { return .stop }
            guard let frame = await deliverable(pull, to: agentID, key: key, onlyQueued: onlyQueued, work: work) else { continue }
            do {
                try await channel.writeAndFlush(frame).get()
            } catch {
                // Marked delivered and not sent: it goes again on the agent's next connection.
                logger.debug("a pull's command was not written; the connection is gone", metadata: ["pull.id": "\(pull.id)", "agent.id": "\(agentID)", "error": "\(error)"])
                return .stop
            }
            logger.info("pull delivered", metadata: ["pull.id": "\(pull.id)", "agent.id": "\(agentID)"])
        }
        return .delivered
    }

    /// The signed command of one pull, marked delivered; nil when it must not be sent now. A
    /// pull that can never be sent (``UnreadablePull``) is failed for the agent with the reason;
    /// any other error is logged, and the pull (queued again if it was marked) goes on the
    /// next wake.
    /// With `onlyQueued` the pull is claimed only if still queued (a fresh pull, which a read
    /// may have delivered meanwhile); else also if delivered before (sent again on a new
    /// connection).
    private func deliverable(_ pull: DuePull, to agentID: String, key: RSAPublicKey?, onlyQueued: Bool, work: ServerWork) async -> WireFrame? {
        let stored: StoredPull
        switch pull.stored {
        case .success(let read): stored = read
        case .failure(let unreadable):
            await fail(pull.id, for: agentID, unreadable)
            return nil
        }
        guard let key else {
            await fail(pull.id, for: agentID, UnreadablePull("agent \(agentID) is not enrolled"))
            return nil
        }
        async let marked = outcome {
            onlyQueued
                ? try await self.pulls.update(pull.id, agent: agentID, status: .delivered, from: [.queued])
                : try await self.pulls.markDelivered(pull.id, agent: agentID)
        }
        let command = await outcome { try await work.control.runIfActive { [issuer] in try issuer.command(stored, agent: agentID, agentKey: key) } }
        switch await marked {
        case .success(true): break
        case .success(false): return nil  // answered, removed or expired meanwhile
        case .failure(let error):
            logger.error("cannot mark a pull delivered; not sending it now", metadata: ["pull.id": "\(pull.id)", "agent.id": "\(agentID)", "error": "\(error)"])
            return nil
        }
        switch command {
        case .success(let command): return .with { $0.pullCommand = command }
        case .failure(let unreadable as UnreadablePull):
            await fail(pull.id, for: agentID, unreadable)
        case .failure(let error):
            // Marked and not sent: queued again, for the next wake (the dispatcher's sweep).
            logger.error("cannot make a pull's command now; trying again on the next wake", metadata: ["pull.id": "\(pull.id)", "agent.id": "\(agentID)", "error": "\(error)"])
            do {
                try await pulls.update(pull.id, agent: agentID, status: .queued, detail: "", from: [.delivered])
            } catch {
                logger.error("could not queue a pull again; it goes on the agent's next connection", metadata: ["pull.id": "\(pull.id)", "agent.id": "\(agentID)", "error": "\(error)"])
            }
        }
        return nil
    }

    /// Marks a pull that can never become a command failed for the agent, saying why.
    private func fail(_ pullID: String, for agentID: String, _ error: UnreadablePull) async {
        logger.error("pull cannot be delivered; marking it failed", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)", "error": "\(error)"])
        do {
            // Only before the agent answered (a redelivered pull may be answered meanwhile).
            try await pulls.update(pullID, agent: agentID, status: .failed, detail: "the server could not make its command: \(error)", from: [.queued, .delivered])
        } catch {
            logger.error("could not mark a pull failed", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)", "error": "\(error)"])
        }
    }

    /// What enrolling a key comes to: the agent's id and the server's keys, or why not.
    enum Enrollment {
        case enrolled(WireEnrollResponse)
        case refused(String)
        /// The server's own fault (its database): the agent may try again later.
        case unavailable(String)
    }

    fileprivate func enroll(_ request: WireEnrollRequest, remote: String?) async -> Enrollment {
        let accepted: Bool
        do {
            accepted = try await tokens.acceptsEnrollment(request.token)
        } catch {
            logger.error("cannot read the enrollment tokens; refusing enrollment", metadata: ["remote": "\(remote ?? "?")", "error": "\(error)"])
            return .unavailable("the server cannot check enrollment tokens now; try later")
        }
        guard accepted else {
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad token", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("enrollment token not accepted")
        }
        let key: RSAPublicKey
        do {
            key = try RSAPublicKey(spki: request.publicKey)
        } catch {
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad key", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("public key not accepted: \(error)")
        }
        let id: String
        do {
            id = try await registry.enroll(publicKey: key, host: request.host, now: Date())
        } catch let error as AlreadyEnrolled {
            refusals.log { suppressed in
                logger.notice("enrollment refused: key already enrolled", metadata: ["agent.id": "\(error.agentID)", "remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("\(error)")
        } catch {
            logger.error("cannot record an enrollment", metadata: ["remote": "\(remote ?? "?")", "error": "\(error)"])
            return .unavailable("the server cannot enroll agents now; try later")
        }
        logger.info("agent enrolled", metadata: ["agent.id": "\(id)", "host": "\(request.host.bounded.hostname)"])
        return .enrolled(.with {
            $0.agentID = id
            $0.serverSigningKey = Data(deployment.signingKey.verifyingKey.rawRepresentation)
            $0.serverEncryptionKey = Data(deployment.encryptionKey.publicKey.spki)
        })
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

/// The open agent connections, so a shutdown can end them and wait until they have ended.
final class ConnectionSet: @unchecked Sendable {
    private let lock = NSLock()
    private var channels: [Int: any Channel] = [:]
    private var next = 0
    private var closing = false
    private var drainWaiters: [Int: CheckedContinuation<Void, Never>] = [:]
    private var nextWaiter = 0

    /// Adds `channel`; returns its token, and whether the set is closing (the caller closes
    /// the channel once it has kept the token).
    func insert(_ channel: any Channel) -> (token: Int, closing: Bool) {
        lock.withLock {
            next += 1
            channels[next] = channel
            return (next, closing)
        }
    }

    func remove(_ token: Int) {
        let waiters = lock.withLock { () -> [CheckedContinuation<Void, Never>] in
            channels.removeValue(forKey: token)
            guard channels.isEmpty else { return [] }
            defer { drainWaiters = [:] }
            return Array(drainWaiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once every connection inserted has been removed (each connection removes itself
    /// when its driver has ended it). Cancellation does not end the wait: the listener's own
    /// shutdown stops the thread pools only after this, and a connection's cleanup uses them.
    func drained() async {
        await wait(id: nil)
    }

    /// ``drained()``, or until the waiting task is cancelled (a test's deadline ends the wait).
    func drainedOrCancelled() async {
        let id = lock.withLock {
            nextWaiter += 1
            return nextWaiter
        }
        await withTaskCancellationHandler {
            await wait(id: id)
        } onCancel: {
            let waiter = lock.withLock { drainWaiters.removeValue(forKey: id) }
            waiter?.resume()
        }
    }

    /// Waits until the set is empty; with an `id`, also returns once the task is cancelled.
    private func wait(id: Int?) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = lock.withLock { () -> Bool in
                // Cancelled before this registers: the cancellation handler found nothing to resume.
                if channels.isEmpty || (id != nil && Task.isCancelled) { return true }
                let key: Int
                if let id {
                    key = id
                } else {
                    nextWaiter += 1
                    key = nextWaiter
                }
                drainWaiters[key] = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Says `Goodbye` to every connection and closes it (``AgentConnections/close(_:saying:)``);
    /// connections inserted later are closed at once. Acts once.
    func closeAll(saying reason: String) {
        let all = lock.withLock { () -> [any Channel] in
            if closing { return [] }
            closing = true
            return Array(channels.values)
        }
        for channel in all { AgentConnections.close(channel, saying: reason) }
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

/// One agent connection's state machine and what its actions do to the registry and the
/// uploads; returns what to write. The stores are called through their async protocols, and
/// RSA and disk work runs on the ``ServerWork`` pools. One step at a time: its
/// ``ConnectionDriver`` hands it the next frame only after the previous step returned (hence
/// `@unchecked Sendable`).
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
    let work: ServerWork
    /// The connection's place in the listener's ``ConnectionSet`` (set once, on the event
    /// loop, before any frame).
    var setToken: Int?
    /// The agent's pull deliveries once registered, and their place with the dispatcher.
    private var delivery: (runner: DeliveryRunner, registration: Int)?

    init(listener: AgentListener, remote: String?, channel: any Channel, token: Int, work: ServerWork) {
        self.listener = listener
        self.remote = remote
        self.channel = channel
        self.token = token
        self.work = work
        machine = ServerConnectionStateMachine(software: "dredge-server/0.1", session: listener.session)
    }

    /// The agent's uploads and command answers on this connection, made with the first frame
    /// that is not a heartbeat (an agent that only heartbeats costs none of it while idle).
    private func uploads(of id: String) -> ConnectionUploads {
        if let uploads { return uploads }
        let channel = self.channel
        let made = ConnectionUploads(
            agentID: id, pulls: listener.pulls, feedback: listener.feedback, encryptionKey: listener.deployment.encryptionKey,
            paths: listener.paths, feedbackLimits: listener.feedbackLimits, blocking: work.uploads, unpacking: work.unpacking, logger: listener.logger,
            landed: listener.landed,
            emit: { frames in
                // Chunks acknowledged once written, after their frame was handled: by one
                // committing thread at a time, and a refusal that ends an upload once it is
                // recorded, so acks of different uploads may pass each other (the agent keeps
                // them as a set).
                _ = channel.writeAndFlush(frames: frames)
            })
        uploads = made
        return made
    }

    /// Waits for the chunks still being written (call before ``closed()``).
    func settled() async { await uploads?.settled() }

    /// The connection ended: uploads being unpacked while they arrived stop.
    func closed() {
        uploads?.closed()
    }

    /// Starts delivering the agent's pulls on this connection: a pass now, and one whenever
    /// the dispatcher wakes it.
    func startDelivery(_ agentID: String) {
        guard delivery == nil else { return }
        let listener = self.listener
        let (token, channel, work) = (self.token, self.channel, self.work)
        let runner = DeliveryRunner { request in
            await listener.deliverDue(to: agentID, request, token: token, channel: channel, work: work)
        }
        delivery = (runner, listener.dispatcher.register(agentID) { runner.wake($0) })
    }

    /// Stops delivering (the connection ended); returns when no pass runs. Called after the
    /// session's last step, like ``closed()``.
    func stopDelivery() async {
        guard let delivery, let agentID else { return }
        listener.dispatcher.unregister(agentID, token: delivery.registration)
        await delivery.runner.stop()
    }

    func receive(_ frame: WireFrame) async throws -> Outcome {
        try await run(machine.receive(frame, challenge: secureRandomBytes(WireLimits.challengeBytes)))
    }

    /// The answer to `frame` when it is a heartbeat of the authenticated agent with nothing new
    /// in it and no write due: the registry holds it in memory (``AgentDirectory/holdHeartbeat(_:_:now:)``)
    /// and it is acknowledged at once, what ``receive(_:)`` would do with it, without a task or
    /// a wait. Nil, with nothing changed, for any other frame: it goes to ``receive(_:)``.
    /// Called by the driver on the event loop, in the frame's turn (no task runs meanwhile).
    func answerAtOnce(_ frame: WireFrame) -> WireFrame? {
        // What the machine does with a heartbeat once the agent is authenticated: `.deliver`.
        guard case .heartbeat(let heartbeat)? = frame.body, case .ready(let id) = machine.state,
            listener.registry.holdHeartbeat(id, heartbeat, now: Date())
        else { return nil }
        return .with { $0.heartbeatAck = .with { $0.seq = heartbeat.seq } }
    }

    func fail(_ error: WireProtocolError) async throws -> Outcome { try await run(machine.fail(error)) }

    private func run(_ actions: [ServerConnectionStateMachine.Action]) async throws -> Outcome {
        var outcome = Outcome()
        var pending = actions[...]
        while let action = pending.popFirst() {
            switch action {
            case .send(let frame):
                outcome.frames.append(frame)
            case .verify(let id, let signature, let challenge, let claimedHost):
                host = claimedHost
                let key = WireID.isValid(id) ? try await listener.registry.publicKey(of: id) : nil
                let verified = if let key {
                    try await work.control.runIfActive { AgentAuthentication.verify(signature: signature, challenge: challenge, publicKey: key) }
                } else {
                    false
                }
                if verified {
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
                switch await listener.enroll(request, remote: remote) {
                case .enrolled(let response): pending.append(contentsOf: machine.enrolled(response))
                case .refused(let why): pending.append(contentsOf: machine.enrollmentFailed(why))
                case .unavailable(let why): pending.append(contentsOf: machine.enrollmentFailed(why, code: .errorInternal))
                }
            case .registered(let id):
                agentID = id
                generation = try await listener.registry.connected(id, from: remote, host: host, now: Date())
                host = WireHostInfo()  // recorded; not needed again
                if let replaced = listener.agentConnections.replace(id, token: token, generation: generation ?? 0, channel: channel) {
                    listener.logger.notice("agent reconnected; closing its older connection", metadata: ["agent.id": "\(id)"])
                    AgentConnections.close(replaced, saying: "replaced by a newer connection of the same agent")
                }
                listener.logger.info("agent connected", metadata: ["agent.id": "\(id)", "remote": "\(remote ?? "?")"])
                outcome.registered = id
            case .deliver(let id, let frame):
                if case .heartbeat(let heartbeat)? = frame.body {
                    if let problem = HeartbeatRules.problem(with: heartbeat) {
                        listener.logger.notice("heartbeat refused", metadata: ["agent.id": "\(id)", "problem": "\(problem)"])
                        pending.append(contentsOf: machine.fail(WireProtocolError(.errorMalformedFrame, problem)))
                        continue
                    }
                    let added = try await listener.registry.heartbeat(id, heartbeat, now: Date())
                    outcome.frames.append(.with { $0.heartbeatAck = .with { $0.seq = heartbeat.seq } })
                    // Off the connection's path: the ack does not wait for the pull queue.
                    if !added.isEmpty || heartbeat.hasUsers {
                        Task { [listener] in await listener.adoptPulls(for: id, heartbeat: heartbeat, added: added) }
                    }
                } else {
                    let uploads = uploads(of: id)
                    do {
                        outcome.frames.append(contentsOf: try await uploads.handle(frame))
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

/// What an async throwing call came to, as a value (to run two at once and look at both).
private func outcome<T: Sendable>(_ body: () async throws -> T) async -> Result<T, any Error> {
    do {
        return .success(try await body())
    } catch {
        return .failure(error)
    }
}
