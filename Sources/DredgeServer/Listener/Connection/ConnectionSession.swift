import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Logging
import NIOCore
import Synchronization

/// One agent connection's state machine steps and what their actions do to the registry and
/// the uploads; returns what to write. The machine itself is in the connection's
/// ``ConnectionOutbound``, through which every frame the server sends passes. The stores are called through their async protocols, and
/// RSA and disk work runs on the ``ServerWork`` pools. One step at a time: its
/// ``ConnectionDriver`` hands it the next frame only after the previous step returned. Its
/// own state is under a ``Mutex`` all the same (never held across a wait): the steps run on
/// whichever thread resumes them, and the listener reads it when the connection ends.
final class ConnectionSession: Sendable {
    struct Outcome {
        var frames: [WireFrame] = []
        /// The agent authenticated: start delivering its pulls.
        var registered: String?
        var close = false
    }

    let services: ConnectionServices
    let remote: String?
    /// The peer's IP address (what enrollment is throttled by).
    let address: String
    /// The connection's machine and channel.
    let outbound: ConnectionOutbound
    /// The connection's place in the ``ConnectionGate``.
    let token: Int
    /// The connection's place in the listener's ``ConnectionSet``.
    let setToken: Int
    private let state = Mutex(State())

    private struct State {
        var agentID: String?
        /// The registry's presence generation of this connection, once registered.
        var generation: Int64?
        var host = WireHostInfo()
        var uploads: ConnectionUploads?
        /// The agent's live tails on this connection, once registered with `live-tail` agreed.
        var tails: ConnectionTails?
        /// The agent's trigger set on this connection, once registered with `triggers` agreed.
        var triggers: ConnectionTriggers?
        /// The agent's pull deliveries once registered, and their place with the dispatcher.
        var delivery: (runner: DeliveryRunner, registration: Int)?
        /// When the last heartbeat arrived (or the agent authenticated), for its lag.
        var lastHeartbeat: ContinuousClock.Instant?
        /// The agent takes key announcements (the capability "key-rotation").
        var rotates = false
        /// A generation the agent said it pins that this server does not have.
        var refusedClaim: Int?
    }

    /// The generation of the server's keys the agent pins (read by its pull deliveries too).
    private let keyPin = KeyPin()

    /// The agent, once registered.
    var agentID: String? { state.withLock { $0.agentID } }
    /// The registry's presence generation of this connection, once registered.
    var generation: Int64? { state.withLock { $0.generation } }

    init(services: ConnectionServices, remote: String?, address: String, outbound: ConnectionOutbound, token: Int, setToken: Int) {
        self.services = services
        self.remote = remote
        self.address = address
        self.outbound = outbound
        self.token = token
        self.setToken = setToken
    }

    /// The heartbeat interval the server gives an authenticated agent.
    var heartbeatSeconds: UInt32 { services.session.heartbeatIntervalS }

    /// A heartbeat arrived: counted, with how late it came after the one before it (or after
    /// the agent authenticated, `first`, which is not a heartbeat).
    private func heartbeatArrived(first: Bool = false) {
        let now = ContinuousClock.now
        let before = state.withLock { state in
            defer { state.lastHeartbeat = now }
            return state.lastHeartbeat
        }
        guard !first else { return }
        services.metrics.heartbeat(gap: before.map { now - $0 }, interval: .seconds(Int64(heartbeatSeconds)))
    }

    /// The agent's uploads and command answers on this connection, made with the first frame
    /// that is not a heartbeat (an agent that only heartbeats costs none of it while idle).
    private func uploads(of id: String) -> ConnectionUploads {
        if let uploads = state.withLock({ $0.uploads }) { return uploads }
        let outbound = self.outbound
        let made = ConnectionUploads(
            agentID: id, services: services, triggers: state.withLock { $0.triggers },
            emit: { frames in
                // Chunks acknowledged once written, after their frame was handled: by one
                // committing thread at a time, and a refusal that ends an upload once it is
                // recorded, so acks of different uploads may pass each other (the agent keeps
                // them as a set).
                outbound.send(frames)
            })
        state.withLock { $0.uploads = made }
        return made
    }

    /// Waits for the chunks still being written (call before ``closed()``).
    func settled() async { await state.withLock { $0.uploads }?.settled() }

    /// The connection ended: uploads being unpacked while they arrived stop.
    func closed() {
        state.withLock { $0.uploads }?.closed()
    }

    /// Starts delivering the agent's pulls on this connection: a pass now, and one whenever
    /// the dispatcher wakes it; and sends its trigger set, when it agreed to `triggers`.
    func startDelivery(_ agentID: String) {
        guard state.withLock({ $0.delivery == nil }) else { return }
        // Written after the AuthResult, which the driver wrote before calling this.
        state.withLock { $0.triggers }?.wake()
        let (services, token, outbound) = (self.services, self.token, self.outbound)
        let keyPin = self.keyPin
        let tails = state.withLock { $0.tails }
        let runner = DeliveryRunner { request in
            let pass = await services.deliverDue(to: agentID, request, token: token, outbound: outbound, keyGeneration: keyPin.value)
            if case .stop = pass { return .stop }
            // Tails on every pass that reads: the connection's first, and the wakes of new tails.
            if request.read, let tails, !(await services.deliverTails(to: agentID, on: tails, token: token, outbound: outbound, keyGeneration: keyPin.value)) {
                return .stop
            }
            return pass
        }
        let registration = services.dispatcher.register(agentID) { runner.wake($0) }
        state.withLock { $0.delivery = (runner, registration) }
    }

    /// Stops delivering (the connection ended); returns when no pass runs. Called after the
    /// session's last step, like ``closed()``.
    func stopDelivery() async {
        await state.withLock { $0.triggers }?.stop()
        let (delivery, agentID) = state.withLock { ($0.delivery, $0.agentID) }
        guard let delivery, let agentID else { return }
        services.dispatcher.unregister(agentID, token: delivery.registration)
        await delivery.runner.stop()
    }

    func receive(_ frame: WireFrame) async throws -> Outcome {
        if case .goodbye(let goodbye)? = frame.body {
            services.logger.info("agent said goodbye", metadata: ["agent.id": "\(self.agentID ?? "?")", "reason": "\(ConnectionUploads.bounded(goodbye.reason))"])
        }
        return try await run(outbound.step { $0.receive(frame, challenge: secureRandomBytes(WireLimits.challengeBytes)) })
    }

    /// The answer to `frame` when it is a heartbeat of the authenticated agent with nothing new
    /// in it and no write due: the registry holds it in memory (``AgentDirectory/holdHeartbeat(_:_:now:)``)
    /// and it is acknowledged at once, what ``receive(_:)`` would do with it, without a task or
    /// a wait. Nil, with nothing changed, for any other frame: it goes to ``receive(_:)``.
    /// Called by the driver on the event loop, in the frame's turn (no task runs meanwhile).
    func answerAtOnce(_ frame: WireFrame) -> WireFrame? {
        // What the machine does with a heartbeat once the agent is authenticated: `.deliver`.
        guard case .heartbeat(let heartbeat)? = frame.body, let id = outbound.agentID, !keysToSettle(heartbeat),
            services.registry.holdHeartbeat(id, heartbeat, now: Date())
        else { return nil }
        heartbeatArrived()
        return outbound.permitted([.with { $0.heartbeatAck = .with { $0.seq = heartbeat.seq } }]).first
    }

    // MARK: Key rotation (README § Key rotation)

    /// Which generation of the server's keys the authenticating agent pins: the one it says
    /// (with the capability), else the one recorded. Its commands on this connection are
    /// signed with it; recorded when it changed. A refusal when that generation is retired
    /// (the agent must enroll again), or one this server does not have (its own fault: a
    /// damaged key ring, say; the agent tries again later).
    private func settleKeys(of id: String) async throws -> WireProtocolError? {
        let keys = services.issuer.keys
        let agreement = outbound.agreement
        let recorded = try await services.registry.keyGeneration(of: id) ?? 1
        let pinned = agreement.keyGeneration ?? recorded
        if keys.generation(pinned) == nil {
            // Another node, or the command, may have rotated since this one read the ring.
            do { try keys.reloadIfChanged() } catch { services.logger.error("cannot read the key ring again", metadata: ["error": "\(error)"]) }
        }
        guard keys.generation(pinned) != nil else {
            let oldest = keys.live.last?.number ?? keys.current.number
            return pinned < oldest
                ? Self.retired(pinned, current: keys.current.number)
                : WireProtocolError(.errorInternal, "this server does not have generation \(pinned) of its keys now; try later")
        }
        state.withLock { $0.rotates = agreement.capabilities.contains(WireCapability.keyRotation) }
        keyPin.set(pinned)
        if pinned != recorded { try await services.registry.setKeyGeneration(id, pinned) }
        return nil
    }

    static func retired(_ generation: Int, current: Int) -> WireProtocolError {
        WireProtocolError(
            .errorKeysRetired, "this agent pins generation \(generation) of the server's keys, retired since; enroll it again (dredge-agent enroll) to get generation \(current)")
    }

    /// Whether `heartbeat` has anything about keys to settle: the agent says another generation
    /// than it pins (and not one refused before), it is behind the current one and takes
    /// announcements, or the generation it pins retired meanwhile.
    private func keysToSettle(_ heartbeat: WireHeartbeat) -> Bool {
        let (rotates, refused) = state.withLock { ($0.rotates, $0.refusedClaim) }
        let pinned = keyPin.value
        let keys = services.issuer.keys
        if !keys.isLive(pinned) { return true }
        guard rotates else { return false }
        let said = Int(heartbeat.keyGeneration)
        return (said > 0 && said != pinned && said != refused) || pinned < keys.currentNumber
    }

    /// Settles what `heartbeat` says about keys: the announcements its ack carries (those that
    /// take an agent that takes them to the current generation), or a refusal when the
    /// generation the agent pins retired while it was connected.
    private func settleKeys(of id: String, _ heartbeat: WireHeartbeat) async throws -> (announcements: [WireKeyAnnouncement], refusal: WireProtocolError?) {
        let (rotates, refused) = state.withLock { ($0.rotates, $0.refusedClaim) }
        let pinned = keyPin.value
        let keys = services.issuer.keys
        var now = pinned
        let said = Int(heartbeat.keyGeneration)
        if rotates, said > 0, said != pinned, said != refused {
            if keys.generation(said) == nil {
                do { try keys.reloadIfChanged() } catch { services.logger.error("cannot read the key ring again", metadata: ["error": "\(error)"]) }
            }
            if keys.generation(said) != nil {
                keyPin.set(said)
                try await services.registry.setKeyGeneration(id, said)
                services.logger.info("agent pins new server keys", metadata: ["agent.id": "\(id)", "generation": "\(said)"])
                now = said
            } else {
                // Not looked at again on this connection unless it says something else.
                state.withLock { $0.refusedClaim = said }
                services.refusals.log { suppressed in
                    services.logger.warning("agent says it pins a generation of the server's keys this server does not have; kept what it had", metadata: [
                        "agent.id": "\(id)", "said": "\(said)", "pinned": "\(pinned)", "suppressed": "\(suppressed)",
                    ])
                }
            }
        }
        guard keys.generation(now) != nil else { return ([], Self.retired(now, current: keys.current.number)) }
        return (rotates && now < keys.current.number ? keys.announcements(after: now) : [], nil)
    }

    func fail(_ error: WireProtocolError) async throws -> Outcome { try await run(outbound.step { $0.fail(error) }) }

    private func run(_ actions: [ServerConnectionStateMachine.Action]) async throws -> Outcome {
        var outcome = Outcome()
        var pending = actions[...]
        // A refusal counted by its cause is not counted again as a protocol error when it closes.
        var refusalCounted = false
        while let action = pending.popFirst() {
            switch action {
            case .send(let frame):
                outcome.frames.append(frame)
            case .verify(let id, let signature, let challenge, let claimedHost):
                state.withLock { $0.host = claimedHost }
                let key = WireID.isValid(id) ? try await services.registry.publicKey(of: id) : nil
                let verified = if let key {
                    try await services.work.control.runIfActive { AgentAuthentication.verify(signature: signature, challenge: challenge, publicKey: key) }
                } else {
                    false
                }
                let revoked = verified ? try await services.registry.isRevoked(id) : false
                let refusal = verified && !revoked ? try await settleKeys(of: id) : nil
                if verified, revoked {
                    services.metrics.refused(.revoked)
                    refusalCounted = true
                    services.refusals.log { suppressed in
                        services.logger.notice("agent refused: revoked", metadata: ["agent.id": "\(id)", "remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
                    }
                    pending.append(contentsOf: outbound.step { $0.authenticationFailed(AgentListener.revokedDetail) })
                } else if verified, let refusal {
                    // (A generation this node lacks is its own fault: not counted against the agent.)
                    if refusal.code == .errorKeysRetired { services.metrics.refused(.keysRetired) }
                    refusalCounted = true
                    services.refusals.log { suppressed in
                        services.logger.notice("agent refused: its keys", metadata: ["agent.id": "\(id)", "why": "\(refusal.message)", "suppressed": "\(suppressed)"])
                    }
                    pending.append(contentsOf: outbound.step { $0.authenticationFailed(refusal.message, code: refusal.code) })
                } else if verified {
                    if services.gate.authenticate(token) {
                        pending.append(contentsOf: outbound.step { $0.authenticated(id) })
                    } else {
                        services.metrics.refused(.capacity)
                        refusalCounted = true
                        services.refusals.log { suppressed in
                            services.logger.warning("agent refused: no room for another agent connection", metadata: [
                                "agent.id": "\(id)", "max_agents": "\(services.gate.caps.authenticated)", "suppressed": "\(suppressed)",
                            ])
                        }
                        pending.append(contentsOf: outbound.step { $0.fail(WireProtocolError(.errorLimitExceeded, "the server has no room for another agent connection; try later")) })
                    }
                } else {
                    services.metrics.refused(.authentication)
                    refusalCounted = true
                    services.refusals.log { suppressed in
                        services.logger.notice("agent authentication failed", metadata: [
                            "agent.id": "\(WireID.isValid(id) ? id : "(malformed)")", "remote": "\(remote ?? "?")", "suppressed": "\(suppressed)",
                        ])
                    }
                    pending.append(contentsOf: outbound.step { $0.authenticationFailed("unknown agent or bad signature") })
                }
            case .enroll(let request):
                let enrollment = await services.enroll(request, remote: remote, address: address)
                if case .enrolled = enrollment {} else { refusalCounted = true }
                switch enrollment {
                case .enrolled(let response): pending.append(contentsOf: outbound.step { $0.enrolled(response) })
                case .refused(let why): pending.append(contentsOf: outbound.step { $0.enrollmentFailed(why) })
                case .throttled(let why): pending.append(contentsOf: outbound.step { $0.enrollmentFailed(why, code: .errorLimitExceeded) })
                case .unavailable(let why): pending.append(contentsOf: outbound.step { $0.enrollmentFailed(why, code: .errorInternal) })
                }
            case .registered(let id):
                let host = state.withLock {
                    $0.agentID = id
                    return $0.host
                }
                let generation = try await services.registry.connected(id, from: remote, host: host, now: Date())
                state.withLock {
                    $0.generation = generation
                    $0.host = WireHostInfo()  // recorded; not needed again
                }
                if let replaced = services.agentConnections.replace(id, token: token, generation: generation, outbound: outbound) {
                    services.logger.notice("agent reconnected; closing its older connection", metadata: ["agent.id": "\(id)"])
                    replaced.goodbye("replaced by a newer connection of the same agent")
                }
                // Revoked while it authenticated: the revocation may have looked for its
                // connection before it was here.
                if try await services.registry.isRevoked(id) {
                    outbound.goodbye(AgentListener.revokedDetail)
                    outcome.close = true
                    return outcome
                }
                if let registry = services.tails, outbound.agreement.capabilities.contains(WireCapability.liveTail) {
                    let tails = ConnectionTails(agentID: id, services: services, registry: registry)
                    state.withLock { $0.tails = tails }
                }
                if let registry = services.triggers, outbound.agreement.capabilities.contains(WireCapability.triggers) {
                    // Its first set goes with the first delivery pass (``startDelivery(_:)``), after the AuthResult.
                    let triggers = ConnectionTriggers(agentID: id, host: host, services: services, registry: registry, token: token, outbound: outbound, keyPin: keyPin)
                    state.withLock { $0.triggers = triggers }
                }
                services.logger.info("agent connected", metadata: ["agent.id": "\(id)", "remote": "\(remote ?? "?")"])
                services.metrics.authentications.increment()
                heartbeatArrived(first: true)
                outcome.registered = id
            case .deliver(let id, let frame):
                if case .heartbeat(let heartbeat)? = frame.body {
                    heartbeatArrived()
                    if let problem = HeartbeatRules.problem(with: heartbeat) {
                        services.logger.notice("heartbeat refused", metadata: ["agent.id": "\(id)", "problem": "\(problem)"])
                        pending.append(contentsOf: outbound.step { $0.fail(WireProtocolError(.errorMalformedFrame, problem)) })
                        continue
                    }
                    let added = try await services.registry.heartbeat(id, heartbeat, now: Date())
                    let keys = try await settleKeys(of: id, heartbeat)
                    if let refusal = keys.refusal {
                        // Its keys retired while it was connected: it must enroll again.
                        services.metrics.refused(.keysRetired)
                        refusalCounted = true
                        pending.append(contentsOf: outbound.step { $0.fail(refusal) })
                        continue
                    }
                    outcome.frames += outbound.permitted([.with { $0.heartbeatAck = .with { $0.seq = heartbeat.seq; $0.keyAnnouncements = keys.announcements } }])
                    // A user it came to hold may be one a trigger watches.
                    if !added.isEmpty || heartbeat.hasUsers, let triggers = state.withLock({ $0.triggers }) { triggers.wake() }
                    // Off the connection's path: the ack does not wait for the pull queue.
                    if !added.isEmpty || heartbeat.hasUsers {
                        Task { [services] in await services.adoptPulls(for: id, heartbeat: heartbeat, added: added) }
                    }
                } else if case .triggerSetAck(let ack)? = frame.body {
                    await state.withLock { $0.triggers }?.answered(ack)
                } else if let tails = state.withLock({ $0.tails }), tails.handles(frame) {
                    outcome.frames += outbound.permitted(await tails.handle(frame))
                } else {
                    let uploads = uploads(of: id)
                    do {
                        outcome.frames += outbound.permitted(try await uploads.handle(frame))
                    } catch {
                        // The server's own trouble (a database on a full disk): "not now" for
                        // this upload, and the connection goes on.
                        let uploadID = ConnectionUploads.uploadID(of: frame) ?? ""
                        services.logger.error("upload frame not handled", metadata: ["agent.id": "\(id)", "upload.id": "\(WireID.echo(uploadID))", "error": "\(error)"])
                        if !uploadID.isEmpty {
                            outcome.frames += outbound.permitted([
                                .with {
                                    $0.error = .with { $0.code = .errorInternal; $0.detail = "the server cannot handle this upload now; try later"; $0.uploadID = WireID.echo(uploadID) }
                                }
                            ])
                        }
                    }
                }
            case .close(let error):
                // Rate-limited with the refusals: anyone who can reach the port can cause these.
                if let error {
                    if !refusalCounted { services.metrics.refused(.protocolError) }
                    services.refusals.log { suppressed in
                        services.logger.notice("closing agent connection", metadata: ["error": "\(error)", "remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
                    }
                }
                outcome.close = true
                return outcome
            }
        }
        return outcome
    }
}

/// The generation of the server's keys an agent pins on one connection, read by its deliveries.
final class KeyPin: Sendable {
    private let generation = Mutex(1)
    var value: Int { generation.withLock { $0 } }
    func set(_ new: Int) { generation.withLock { $0 = new } }
}
