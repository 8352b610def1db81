import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Logging
import NIOCore
import NIOPosix

/// An agent's pulls on its live connection: sending the ones due (``DeliveryRunner`` runs one
/// pass per wake) and joining the agent to open pulls by the uids it comes to hold.
extension ConnectionServices {
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
        // A uid it came to hold may have a live tail open: a pass that reads looks.
        if tails != nil && !added.isEmpty { dispatcher.wake([agentID]) }
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
    /// `keyGeneration`: the generation of the server's keys the agent pins on this connection.
    func deliverDue(to agentID: String, _ request: DeliveryRunner.Request, token: Int, outbound: ConnectionOutbound, keyGeneration: Int) async -> DeliveryRunner.Pass {
        let urgentAgreed = outbound.agreement.capabilities.contains(WireCapability.urgent)
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
                let fresh = request.fresh.filter { PullTargetLife.isSent(expiresAt: $0.pull.expiresAt, now: now) }
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
            guard let frame = await deliverable(pull, to: agentID, key: key, keyGeneration: keyGeneration, onlyQueued: onlyQueued, urgentAgreed: urgentAgreed) else { continue }
            do {
                // Through the connection's machine: nothing once the connection is ending.
                guard let written = outbound.send([frame]) else { throw ChannelError.ioOnClosedChannel }
                try await written.get()
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
    private func deliverable(_ pull: DuePull, to agentID: String, key: RSAPublicKey?, keyGeneration: Int, onlyQueued: Bool, urgentAgreed: Bool) async -> WireFrame? {
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
                ? try await self.pulls.move(pull.id, agent: agentID, PullTargetLife.deliverQueued)
                : try await self.pulls.markDelivered(pull.id, agent: agentID)
        }
        let command = await outcome {
            try await work.control.runIfActive { [issuer] in
                try issuer.command(stored, agent: agentID, agentKey: key, keyGeneration: keyGeneration, urgentAgreed: urgentAgreed)
            }
        }
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
                try await pulls.move(pull.id, agent: agentID, PullTargetLife.undeliver)
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
            try await pulls.move(pullID, agent: agentID, PullTargetLife.failCommand, detail: "the server could not make its command: \(error)")
        } catch {
            logger.error("could not mark a pull failed", metadata: ["pull.id": "\(pullID)", "agent.id": "\(agentID)", "error": "\(error)"])
        }
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

/// What an agent's answers to pull commands do to the pull's status for that agent: accepted
/// (exporting), rejected with its reason, or failed on the agent after it accepted. An answer
/// moves only a pull that was not answered yet, so an answer repeated for a redelivered command
/// never takes a pull that is uploading, or has ended, back.
struct PullOutcomes: Sendable {
    let agentID: String
    let pulls: any PullQueue
    let logger: Logger

    func accepted(_ answer: WireCommandAccepted) async throws {
        try await pulls.move(answer.commandID, agent: agentID, PullTargetLife.accept)
    }

    /// A rejection after the agent accepted (and began uploading) changes nothing.
    func rejected(_ answer: WireCommandRejected) async throws {
        let id = answer.commandID
        if try await pulls.move(id, agent: agentID, PullTargetLife.reject, detail: "\(answer.reason): \(ConnectionUploads.bounded(answer.detail))") {
            logger.notice("pull rejected by agent", metadata: ["pull.id": "\(id)", "agent.id": "\(agentID)", "reason": "\(answer.reason)"])
        }
    }

    /// The agent could not carry out an accepted command (its export failed, say).
    func failedOnAgent(_ report: WireError) async throws {
        try await pulls.move(report.uploadID, agent: agentID, PullTargetLife.fail, detail: "the agent could not finish it: \(ConnectionUploads.bounded(report.detail))")
        logger.notice("pull failed on the agent", metadata: ["pull.id": "\(report.uploadID)", "agent.id": "\(agentID)", "code": "\(report.code)"])
    }
}
