import DredgeDomain
import DredgeEnvelope
import DredgeStore
import DredgeWire
import Foundation
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// `dredge-agent run`: keeps one connection to the server — connect, authenticate, heartbeat —
/// and reconnects with backoff and jitter when it drops. With several server addresses (the
/// nodes of a cluster) it connects to the first that takes the connection, and when its node
/// goes away it moves to the next: the backoff waits only once every address has failed. A swift-service-lifecycle `Service`:
/// graceful shutdown says goodbye and stops.
public final class AgentClient: Service, Sendable {
    public let state: AgentState
    let store: LogStore?
    let logger: Logger
    /// What the agent knows of its host without the store (host name, OS), and what the
    /// operator set (`--app`, `--label`), which wins over the store's context.
    let hostInfo: WireHostInfo
    let hostOverrides: WireHostInfo
    let stop = StopSignal()
    /// When the current connection became ready, if it did.
    let established = Handoff<ContinuousClock.Instant>()
    /// What the server said, in its `Goodbye`, of its planned return.
    let plannedReturn = Handoff<PlannedReturn>()
    let uploads: UploadManager
    /// The live tails the agent runs (#53); nil without a store (nothing to tail).
    let tails: TailManager?
    /// The standing triggers the agent holds and matches (#54); nil without a store.
    public let triggers: TriggerAgent?
    /// When the lists of the last heartbeat that went out were read from the store (what a
    /// capture waits for: its user named to the server).
    let lastHeartbeat = Moment()
    /// The tails' clock: seconds since the agent started, monotonic.
    let started = ContinuousClock.now
    /// The active uids of the last heartbeat that could read them.
    let lastActiveUIDs = Mutex<[String]>([])

    let maxReconnectDelay: Duration
    /// How long a connection may take to be ready (TLS handshake, then authentication) before
    /// it is given up and the next address tried.
    let readyTimeout: Duration
    /// The server's addresses (its nodes), tried in order: the state's, unless the operator gave others.
    let addresses: [ServerAddress]

    /// - Parameters:
    ///   - firstRetryDelay: how long an upload the server cannot take now (its disk is full, a
    ///     quota) waits before it is tried again; doubles up to 5 minutes.
    ///   - maxReconnectDelay: the longest wait between attempts to reconnect (the backoff
    ///     doubles from 1 s up to it).
    ///   - maxExports: exports run at once, on their own threads; a pull command beyond them
    ///     is answered `REJECT_BUSY`.
    ///   - servers: the addresses to connect to, in order, instead of the state's.
    ///   - readyTimeout: how long the TLS handshake, and then authentication, may each take
    ///     before the connection is given up (a node that accepts and then hangs).
    ///   - heldPullKeepAlive: how often a pull whose chunks the upload policy holds is begun
    ///     again so the server hears of it (a third of PULL_QUIET_PERIOD).
    public init(
        state: AgentState, store: LogStore?, hostInfo: WireHostInfo, hostOverrides: WireHostInfo = WireHostInfo(), logger: Logger,
        firstRetryDelay: Duration = .seconds(5), maxReconnectDelay: Duration = .seconds(60), maxExports: Int = 2, servers: [ServerAddress]? = nil,
        readyTimeout: Duration = .seconds(30), heldPullKeepAlive: Duration = WireLimits.pullQuietPeriod / 3
    ) throws {
        self.state = state
        self.readyTimeout = readyTimeout
        self.addresses = servers.flatMap { $0.isEmpty ? nil : $0 } ?? state.addresses
        self.maxReconnectDelay = maxReconnectDelay
        self.store = store
        self.hostInfo = hostInfo
        self.hostOverrides = hostOverrides
        self.logger = logger
        self.uploads = try UploadManager(
            state: state, store: store, logger: logger, firstRetryDelay: firstRetryDelay, maxExports: maxExports, heldPullKeepAlive: heldPullKeepAlive)
        self.tails = store.map { TailManager(store: $0, agentID: state.file.agentID, agentKey: state.key) }
        self.triggers = store.map { TriggerAgent(state: state, store: $0, logger: logger) }
    }

    /// What the agent offers in `Hello`: live tails and triggers only with a store to read.
    var capabilities: [String] {
        store == nil
            ? [WireCapability.keyRotation, WireCapability.urgent] : [WireCapability.keyRotation, WireCapability.liveTail, WireCapability.triggers, WireCapability.urgent]
    }

    /// The tails' clock now.
    func tailClock() -> Double {
        let elapsed = ContinuousClock.now - started
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }

    /// Records a user's feedback and uploads the uid's recent logs with it (see ``Feedback``):
    /// now if connected, else as soon as the connection returns, also after a restart.
    @discardableResult
    public func submitFeedback(uid: String, text: String, days: Int = Feedback.defaultDays) async throws -> String {
        guard let store else { throw AgentError("this agent has no store to take the logs from") }
        let id = try Feedback.submit(uid: uid, text: text, days: days, state: await uploads.currentState, store: store)
        try await uploads.rescanOutbox()
        return id
    }

    /// Sets the device's upload policy (``UploadPolicy``): saved in the state directory, and
    /// in force at once for the uploads under way. Throws, changing nothing, when it is not valid.
    public func setUploadPolicy(_ policy: UploadPolicy) async throws {
        try policy.save(stateDirectory: state.directory)
        await uploads.policyChanged()
    }

    /// Reports what the device's network costs now (``NetworkCost``): saved, and in force at once.
    public func setNetwork(_ network: NetworkCost) async throws {
        try network.save(stateDirectory: state.directory)
        await uploads.policyChanged()
    }

    /// What the device's upload policy does now: the policy, the network, today's bytes, and
    /// why uploads wait, if they do.
    public func uploadPolicyStatus() async -> UploadPolicyStatus { await uploads.policyStatus() }

    public func run() async throws {
        await uploads.recover()
        // Feedback queued by other processes (`dredge-agent feedback`) is picked up within seconds.
        let outbox = Task { [uploads, stop, logger] in
            while !Task.isCancelled && !stop.isStopped {
                try? await Task.sleep(for: .seconds(2))
                do { try await uploads.rescanOutbox() } catch { logger.debug("outbox rescan", metadata: ["error": "\(error)"]) }
            }
        }
        defer { outbox.cancel() }
        // The live tails' passes, connected or not: a tail ends at its expiry by this clock,
        // whether or not the server is there to say so.
        let tailing = Task { [tails, stop, logger] in
            guard let tails else { return }
            var failures = 0
            while !Task.isCancelled && !stop.isStopped {
                do {
                    try await tails.step(clock: self.tailClock())
                    failures = 0
                } catch {
                    // Said once per run of failures (the connection going away, a store that cannot be read).
                    if failures == 0 { logger.warning("a live tail's pass failed", metadata: ["error": "\(error)"]) }
                    failures += 1
                }
                // Often while a tail runs; seldom otherwise (the pass then only ends what expired).
                let interval = await tails.running.isEmpty ? TailManager.idleInterval : TailManager.pollInterval
                do { try await Task.sleep(for: interval) } catch { break }
            }
        }
        defer { tailing.cancel() }
        // The triggers' matching and captures, connected or not (a capture waits in the outbox).
        if let triggers { await uploads.whenBudgetSpent { triggerID in Task { await triggers.budgetSpent(triggerID) } } }
        // The live tails follow the device's upload policy.
        if let tails { await tails.follow({ [uploads] urgent in await uploads.tailPoliteness(urgent: urgent) }, counting: { [uploads] bytes in await uploads.countSent(bytes) }) }
        let matching = Task { [triggers, store, uploads, stop, logger, lastHeartbeat] in
            guard let triggers, let store else { return }
            var failures = 0
            // Exports of a capture that failed, by capture: given up after a few.
            var attempts: [String: Int] = [:]
            while !Task.isCancelled && !stop.isStopped {
                do {
                    let due = try await triggers.step(heartbeatAt: lastHeartbeat.value)
                    for capture in due {
                        // Sealed to the server's keys as the agent pins them now (they roll over).
                        let state = await uploads.currentState
                        do {
                            try await uploads.exports.export { try CaptureExport.write(capture, state: state, store: store) }
                            attempts[capture.captureID] = nil
                            logger.info("capture ready", metadata: ["capture.id": "\(capture.captureID)", "trigger.id": "\(capture.triggerID)"])
                        } catch {
                            let tried = attempts[capture.captureID, default: 0] + 1
                            attempts[capture.captureID] = tried
                            guard tried >= 3 else {
                                logger.warning("a capture could not be exported; trying again", metadata: ["capture.id": "\(capture.captureID)", "error": "\(error)"])
                                continue
                            }
                            attempts[capture.captureID] = nil
                            logger.error("a capture could not be exported; given up", metadata: ["capture.id": "\(capture.captureID)", "error": "\(error)"])
                        }
                        try await triggers.exported(capture.captureID)
                    }
                    if !due.isEmpty { try await uploads.rescanOutbox() }
                    failures = 0
                } catch {
                    if failures == 0 { logger.warning("matching the triggers failed", metadata: ["error": "\(error)"]) }
                    failures += 1
                }
                let interval: Duration = await triggers.isMatching ? .seconds(1) : .seconds(5)
                do { try await Task.sleep(for: interval) } catch { break }
            }
        }
        defer { matching.cancel() }
        await withTaskCancellationOrGracefulShutdownHandler {
            var reconnection = Reconnection(backoff: Backoff(initial: min(.seconds(1), self.maxReconnectDelay), maximum: self.maxReconnectDelay))
            let addresses = self.addresses
            // The address tried next, and how many in a row failed before a connection was ready.
            var current = 0, failedInARow = 0
            while !Task.isCancelled && !self.stop.isStopped {
                let server = addresses[current]
                do {
                    try await self.connectOnce(to: server)
                } catch {
                    if Task.isCancelled || self.stop.isStopped { break }
                    if let code = (error as? AgentError)?.serverError, Reconnection.needsEnrollment(code) {
                        // Every node would say the same: once each has, wait long, and say what mends it.
                        reconnection.refused(code)
                        self.logger.error(
                            "the server refuses this agent: enroll it again (dredge-agent enroll); trying again in about \(Self.rounded(Reconnection.refusedDelay))",
                            metadata: ["server": "\(server)", "error": "\(error)"])
                    } else {
                        self.logger.warning("connection to the server failed", metadata: ["server": "\(server)", "error": "\(error)"])
                    }
                }
                if Task.isCancelled || self.stop.isStopped { break }
                let ready = self.established.take().map { ContinuousClock.now - $0 }
                // A connection that stayed ready a minute means the server is there: a drop
                // after that is the network's, so start again from the shortest delay. One
                // dropped sooner (a server that accepts, then falls over) keeps backing off.
                reconnection.connectionEnded(readyFor: ready)
                if let planned = self.plannedReturn.take() {
                    // A planned restart: try every few seconds until the server said it would be
                    // back; a cluster's next node at once, since this one is going away.
                    reconnection.serverRestarting(planned, at: .now)
                    self.logger.info("the server is restarting", metadata: ["server": "\(server)", "expected": "\(planned)"])
                    if addresses.count > 1 {
                        current = (current + 1) % addresses.count
                        failedInARow = 1
                        continue
                    }
                }
                if ready == nil && addresses.count > 1 {
                    // This node did not take the connection (down, refusing): the next one is
                    // tried at once, and the backoff waits only once every one has failed.
                    current = (current + 1) % addresses.count
                    failedInARow += 1
                    if failedInARow < addresses.count { continue }
                }
                failedInARow = 0
                // The node that dropped is tried first again, then the others. While a
                // restarting server's return is awaited, every few seconds instead.
                let delay = reconnection.delay()
                self.logger.info("reconnecting", metadata: ["in": "\(Self.rounded(delay))"])
                // Sleep, but wake at once on stop.
                for _ in 0..<Int(delay / .milliseconds(100)) + 1 where !self.stop.isStopped {
                    do { try await Task.sleep(for: .milliseconds(100)) } catch { break }
                }
            }
        } onCancelOrGracefulShutdown: {
            self.stop.signal()
        }
    }

    /// A delay as people read it: `1.5 s`, `12 s` (not `1.4999999 seconds`).
    static func rounded(_ delay: Duration) -> String {
        let seconds = Double(delay.components.seconds) + Double(delay.components.attoseconds) / 1e18
        return seconds < 10 ? String(format: "%.1f s", seconds) : "\(Int(seconds.rounded())) s"
    }

    func connectOnce(to server: ServerAddress) async throws {
        let channel = try await AgentConnector.connect(host: server.host, port: server.port, caPEM: state.caPEM, handshakeTimeout: readyTimeout)
        let opened = ContinuousClock.now
        let host = describeHost()
        let failure: WireProtocolError?
        do {
            failure = try await channel.executeThenClose { inbound, outbound -> WireProtocolError? in
                let connection = AgentConnection(
                    mode: .authenticate(agentID: state.file.agentID, host: host), key: state.key, channel: channel.channel, writer: outbound,
                    capabilities: capabilities, keyGeneration: await uploads.keyGeneration)
                // Stopping says Goodbye to the server, then closes.
                stop.onStop { connection.goodbye("agent stopping") }
                let session = Session(
                    connection: connection, uploads: uploads, tails: tails, triggers: triggers, tailClock: { [self] in tailClock() }, established: established,
                    plannedReturn: plannedReturn, lastHeartbeat: lastHeartbeat, logger: logger, server: "\(server)")
                defer { connection.closed("connection ended") }
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask {
                        guard try await session.perform(await connection.start()) else { return }
                        for try await frame in inbound {
                            guard try await session.perform(await session.receive(frame)) else { break }
                        }
                    }
                    group.addTask {
                        // Heartbeats once authenticated: the first at once (until it arrives the
                        // server routes no pull by uid here), then at the interval the server
                        // asked for; the connection is given up when the server stops answering,
                        // or does not authenticate it in time.
                        var sent = false
                        while !Task.isCancelled {
                            let interval = await session.heartbeatInterval
                            if interval == nil || sent { try await Task.sleep(for: interval.map { .seconds(Int($0)) } ?? .milliseconds(200)) }
                            guard interval != nil else {
                                // Read again: authentication may have ended during the sleep.
                                if ContinuousClock.now - opened >= self.readyTimeout, await session.heartbeatInterval == nil {
                                    throw AgentError("the server did not authenticate the connection within \(self.readyTimeout)")
                                }
                                continue
                            }
                            sent = true
                            if let silence = await session.overdue(at: .now) {
                                throw AgentError("the server sent nothing for \(silence); reconnecting")
                            }
                            // Stamped before the store is read: a capture waits for a heartbeat made after it.
                            let made = Timestamp.now
                            let (uids, stats, users) = self.storeReport()
                            try await session.heartbeat(uids: uids, stats: stats, users: users, madeAt: users == nil && self.store != nil ? nil : made)
                        }
                    }
                    // Either task ending ends the connection.
                    _ = try await group.next()
                    group.cancelAll()
                }
                return await session.failure
            }
        } catch {
            await uploads.disconnected()
            await tails?.disconnected()
            throw AgentError(AgentConnector.explain(error))
        }
        await uploads.disconnected()
        await tails?.disconnected()
        if let failure { throw AgentError("the server closed the connection: \(failure)", serverError: failure.code) }
    }

    /// How the device names itself on this connection: the context of the newest record in its
    /// store (host, app, app version, labels) over the process's own host name and OS, with the
    /// operator's settings on top. A store that cannot be read leaves the process's own.
    func describeHost() -> WireHostInfo {
        var context: LogContext?
        do {
            context = try store?.newestContext()
        } catch {
            logger.warning("cannot read the store's newest context; describing the host without it", metadata: ["error": "\(error)"])
        }
        return WireHostInfo.describing(context, fallback: hostInfo, overrides: hostOverrides)
    }

    /// Users with records in the last day, the store's statistics, and its user report (every
    /// user it holds, with the hour each was last seen). The server replaces its routing by uid
    /// with each list, so a store that cannot be read now repeats the last lists it gave rather
    /// than empty ones (which would make this device unreachable by uid).
    func storeReport() -> ([String], WireStoreStats, WireUserReport?) {
        guard let store else { return ([], WireStoreStats(), nil) }
        let uids: [String]
        let users: WireUserReport?
        do {
            // One scan of the store's users serves both lists. The protocol's rules (§ Heartbeats):
            // valid uids only, at most MAX_ACTIVE_UIDS active ones.
            let all = try store.users()
            uids = Array(LogStore.activeUIDs(in: all, since: Timestamp.now.subtracting(.seconds(86_400))).filter(UserID.isValid).prefix(WireLimits.maxActiveUIDs))
            users = Self.userReport(all)
            lastActiveUIDs.withLock { $0 = uids }
        } catch {
            // Nil report: "the same as my last one" (or, before any, the active uids alone).
            logger.warning("cannot read the store's users; repeating the last lists", metadata: ["error": "\(error)"])
            uids = lastActiveUIDs.withLock { $0 }
            users = nil
        }
        let stats: StoreStatistics
        do {
            stats = try store.statistics()
        } catch {
            logger.warning("cannot read the store's statistics", metadata: ["error": "\(error)"])
            return (uids, WireStoreStats(), users)
        }
        return (uids, .with {
            $0.records = UInt64(max(0, stats.recordCount))
            $0.oldestUs = stats.oldest?.microseconds ?? 0
            $0.newestUs = stats.newest?.microseconds ?? 0
            $0.bytesOnDisk = UInt64(max(0, stats.bytesOnDisk))
            $0.dropped = stats.droppedQueueFull + stats.failedWrites
        }, users)
    }

    /// The protocol's user report (§ Heartbeats) from the store's users, most recently seen
    /// first: valid uids only, each time truncated to the hour, at most MAX_REPORTED_USERS.
    static func userReport(_ users: [(uid: String, lastSeen: Timestamp)]) -> WireUserReport {
        let hour = WireLimits.userReportGranularityMicroseconds
        let valid = users.filter { UserID.isValid($0.uid) && $0.lastSeen.microseconds >= 0 }
        return .with { report in
            report.users = valid.prefix(WireLimits.maxReportedUsers).map { user in
                .with { $0.uid = user.uid; $0.lastSeenUs = user.lastSeen.microseconds / hour * hour }
            }
            report.truncated = valid.count > WireLimits.maxReportedUsers
        }
    }

    /// One connection's session, shared by the reader and the heartbeat timer: what the
    /// connection's events do (heartbeats start, uploads resume, frames reach the upload layer),
    /// and how long the server has been silent. Frames go out through its ``AgentConnection``.
    actor Session {
        let connection: AgentConnection
        var heartbeatInterval: UInt32?
        var watch: HeartbeatWatch?
        var failure: WireProtocolError?
        let uploads: UploadManager
        let tails: TailManager?
        let triggers: TriggerAgent?
        let tailClock: @Sendable () -> Double
        let established: Handoff<ContinuousClock.Instant>
        let plannedReturn: Handoff<PlannedReturn>
        let lastHeartbeat: Moment
        let logger: Logger
        let server: String

        init(
            connection: AgentConnection, uploads: UploadManager, tails: TailManager?, triggers: TriggerAgent?, tailClock: @escaping @Sendable () -> Double,
            established: Handoff<ContinuousClock.Instant>, plannedReturn: Handoff<PlannedReturn>, lastHeartbeat: Moment, logger: Logger, server: String
        ) {
            self.connection = connection
            self.uploads = uploads
            self.tails = tails
            self.triggers = triggers
            self.lastHeartbeat = lastHeartbeat
            self.tailClock = tailClock
            self.established = established
            self.plannedReturn = plannedReturn
            self.logger = logger
            self.server = server
        }

        func receive(_ frame: WireFrame) async throws -> [AgentConnection.Event] {
            watch?.heard(at: .now)
            return try await connection.receive(frame)
        }

        /// How long the server has been silent, when that is past what the watch allows.
        func overdue(at now: ContinuousClock.Instant) -> Duration? {
            guard let watch, watch.isOverdue(at: now) else { return nil }
            return watch.silenceAllowed
        }
        var reports = UserReportDeduplication()
        /// Why the server's last announcement of new keys was not taken.
        var lastKeyRefusal: String?

        /// A heartbeat, with the user report only when it differs from the last one sent on
        /// this connection.
        /// `madeAt`: when its lists were read from the store (nil: they were not; repeated).
        func heartbeat(uids: [String], stats: WireStoreStats, users: WireUserReport?, madeAt: Timestamp?) async throws {
            let report = reports.toSend(users)
            let sent = try await connection.heartbeat(activeUIDs: uids, stats: stats, users: report)
            if let report, sent { reports.sent(report) }
            if sent, let madeAt { lastHeartbeat.set(madeAt) }
        }

        /// Acts on the connection's events; false when the connection must close.
        func perform(_ events: [AgentConnection.Event]) async throws -> Bool {
            for event in events {
                switch event {
                case .established(let result):
                    heartbeatInterval = max(1, result.heartbeatIntervalS)
                    watch = HeartbeatWatch(interval: .seconds(Int(max(1, result.heartbeatIntervalS))), now: .now)
                    established.set(.now)
                    logger.info("connected", metadata: ["server": "\(server)", "heartbeat_s": "\(result.heartbeatIntervalS)"])
                    try await uploads.connected(connection)
                    if let tails, connection.agreed.contains(WireCapability.liveTail) {
                        // Its running tails accepted again on this connection.
                        let connection = self.connection
                        try await tails.connected { frame in try await connection.send(frame) }
                    }
                case .enrolled:
                    break
                case .deliver(let frame):
                    if case .heartbeatAck(let ack)? = frame.body, !ack.keyAnnouncements.isEmpty {
                        do {
                            connection.pinned(try await uploads.adoptKeys(ack.keyAnnouncements))
                        } catch {
                            // Kept what it had: the server announces them again with the next
                            // ack. Said once per connection and reason, not at every heartbeat.
                            let reason = "\(error)"
                            if reason != lastKeyRefusal {
                                lastKeyRefusal = reason
                                logger.error("the server's new keys were not taken", metadata: ["error": "\(reason)"])
                            }
                        }
                    }
                    switch frame.body {
                    case .tailCommand?, .tailAck?, .tailStop?:
                        guard let tails else { break }
                        do {
                            try await tails.receive(
                                frame, serverKeys: try await uploads.pinnedServerKeys(), clock: tailClock(), urgentAgreed: connection.agreed.contains(WireCapability.urgent))
                        } catch {
                            // The store or the connection failed: the tail's pass says so; the
                            // connection goes on for pulls.
                            logger.warning("a live tail's frame was not handled", metadata: ["error": "\(error)"])
                        }
                    case .triggerSet(let set)?:
                        guard let triggers else { break }
                        let answer = await triggers.receive(set, serverKeys: try await uploads.pinnedServerKeys())
                        try await connection.send(answer)
                    default:
                        try await uploads.receive(frame)
                    }
                case .plannedReturn(let planned):
                    plannedReturn.set(planned)
                case .closed(let error):
                    failure = error
                    return false
                }
            }
            return true
        }
    }
}

/// One connection's user reports (Protocol § Heartbeats): the first heartbeat carries the
/// report, later ones only when it changed; nil (the store could not be read) sends none.
struct UserReportDeduplication {
    private var last: WireUserReport?

    /// The report to put in the next heartbeat, or nil for "the same as the last".
    func toSend(_ report: WireUserReport?) -> WireUserReport? {
        guard let report, report != last else { return nil }
        return report
    }

    mutating func sent(_ report: WireUserReport) { last = report }
}

/// Closes the open connection when the service is asked to stop.
final class StopSignal: Sendable {
    private struct State {
        var stopped = false
        var action: (@Sendable () -> Void)?
    }

    private let state = Mutex(State())

    var isStopped: Bool { state.withLock { $0.stopped } }

    func onStop(_ body: @escaping @Sendable () -> Void) {
        let run = state.withLock { s -> Bool in
            s.action = body
            return s.stopped
        }
        if run { body() }
    }

    func signal() {
        let body = state.withLock { s -> (@Sendable () -> Void)? in
            s.stopped = true
            return s.action
        }
        body?()
    }
}

/// A time one side sets and others read (when the last heartbeat went out).
final class Moment: Sendable {
    private let stored = Mutex<Timestamp?>(nil)
    var value: Timestamp? { stored.withLock { $0 } }
    func set(_ new: Timestamp) { stored.withLock { $0 = new } }
}

/// A value one side of the connection leaves for the reconnect loop, which takes it once: when
/// the connection became ready, what the server said of its planned return.
final class Handoff<Value: Sendable>: Sendable {
    private let value = Mutex<Value?>(nil)
    func set(_ new: Value) { value.withLock { $0 = new } }
    func take() -> Value? { value.withLock { $0.take() } }
}
