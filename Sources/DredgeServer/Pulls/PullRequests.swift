import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Logging

/// Why a pull cannot be queued.
public enum PullRequestError: Error, CustomStringConvertible, Equatable, Sendable {
    case noTarget
    case unknownAgent(String)
    case invalid(String)

    public var description: String {
        switch self {
        case .noTarget: "give a uid, an agent, or both"
        case .unknownAgent(let id): "no enrolled agent \(id)"
        case .invalid(let message): message
        }
    }
}

/// A scoped caller's pull (#55): the caller's scope, and the agents in it now. Its targets are
/// those agents only: an agent outside is no agent, and by uid only the scope's holders are
/// reached; no agent joins it later (whether a device that comes to hold the uid is in the
/// scope would have to be decided where its heartbeat lands).
public struct PullScope: Sendable {
    public let scope: AccessScope
    public let agents: Set<String>

    public init(scope: AccessScope, agents: Set<String>) {
        self.scope = scope
        self.agents = agents
    }
}

/// The longest a pull may wait for an offline agent.
public let maximumPullLifetime: Duration = .seconds(7 * 86_400)

extension PullQueue {
    /// Resolves a request's targets in the registry and queues the pull: by uid, every agent
    /// that holds it (and, until the pull expires, every agent that comes to hold it later,
    /// through ``adopt(agent:uids:now:)``; with none yet the pull waits for one); by agent, that
    /// agent (with a uid too, that agent's records of the uid). Recorded in the audit log under
    /// `requestedBy`. Once the pull is stored it is returned: a late join that fails is logged
    /// (the agent joins on its next connection, whose first heartbeat carries its report).
    ///
    /// `wake` is told the targets as soon as the pull is stored (before the record is read
    /// back), with the pull itself (``FreshPull``) so their delivery need not read it, and each
    /// agent that joins late when it joins (without: its delivery reads what is due). An agent
    /// that `isConnected` says is connected to this process (so it authenticated, so it is
    /// enrolled: no agent is ever unenrolled) is not looked up in the registry; its public key
    /// is read while the pull is stored, for its delivery.
    public func create(
        _ request: PullRequest, registry: any AgentDirectory, issuer: CommandIssuer, requestedBy: String, scope: PullScope? = nil, approvalRequired: Bool = false,
        logger: Logger, now: Timestamp = .now,
        isConnected: (String) -> Bool = { _ in false }, wake: ([String], FreshPull?) -> Void = { _, _ in }
    ) async throws -> PullRecord {
        let uid = request.uid.flatMap { $0.isEmpty ? nil : $0 }
        let agent = request.agent.flatMap { $0.isEmpty ? nil : $0 }
        guard uid != nil || agent != nil else { throw PullRequestError.noTarget }
        if let uid, let problem = UserID.problem(uid) { throw PullRequestError.invalid(problem) }
        if let agent, !WireID.isValid(agent) { throw PullRequestError.invalid("agent must be an agent id: 32 lowercase hex characters") }
        let seconds = request.expiresInSeconds ?? 3600
        guard seconds > 0, Duration.seconds(seconds) <= maximumPullLifetime else {
            throw PullRequestError.invalid("expiresInSeconds must be between 1 and \(7 * 86_400)")
        }
        if let reason = request.reason, let problem = reasonProblem(reason) { throw PullRequestError.invalid(problem) }
        var filter = request.filter
        filter.uid = uid
        if let problem = filter.problem { throw PullRequestError.invalid(problem) }

        let agents: [String]
        var connected: String?
        if let agent, let scope, !scope.agents.contains(agent) { throw PullRequestError.unknownAgent(agent) }
        if let agent {
            // A revoked agent is enrolled still (its key is kept) but is never sent a pull.
            if try await registry.isRevoked(agent) { throw PullRequestError.invalid("agent \(agent) was revoked") }
            if isConnected(agent) {
                connected = agent
            } else {
                guard try await registry.isEnrolled(agent) else { throw PullRequestError.unknownAgent(agent) }
            }
            agents = [agent]
        } else if let scope {
            agents = try await registry.agentIDs(withUID: uid ?? "").filter(scope.agents.contains)
            guard !agents.isEmpty else { throw PullRequestError.invalid("no device of \(requestedBy)'s scope holds uid \(uid ?? "")") }
        } else {
            agents = try await registry.agentIDs(withUID: uid ?? "")
        }
        var pull = try issuer.newPull(
            uid: uid ?? "", agentID: agent ?? "", filter: filter, targets: agents, lifetime: .seconds(seconds), requestedBy: requestedBy, now: now)
        pull.reason = request.reason ?? ""
        pull.scope = try scope?.scope.storedJSON
        pull.approvalRequired = approvalRequired
        pull.urgent = request.urgent ?? false
        // The delivery's one read, made while the pull is written instead of after.
        async let keys = Self.keysForDelivery(of: connected, registry: registry, logger: logger)
        try await create(pull)
        let agentKeys = await keys
        // One that waits for approval is sent to nobody yet (``approve(_:by:now:)`` wakes them).
        if !approvalRequired { wake(agents, FreshPull(StoredPull(pull), agentKeys: agentKeys)) }
        if let uid, agent == nil, scope == nil {
            // An agent whose heartbeat added the uid between the lookup above and the pull's
            // creation found no pull to join: join it now (the heartbeat writes the registry,
            // then adopts; this writes the pull, then reads the registry, so one of them sees
            // the other).
            do {
                for late in try await registry.agentIDs(withUID: uid) where !agents.contains(late) {
                    if try await adopt(agent: late, uids: [uid], now: now).contains(pull.id) { wake([late], nil) }
                }
            } catch {
                logger.warning("pull queued; agents that came to hold its uid meanwhile join it later", metadata: ["pull.id": "\(pull.id)", "error": "\(error)"])
            }
        }
        guard let record = try await self.pull(pull.id, now: now) else { throw PullRequestError.invalid("pull \(pull.id) vanished") }
        return record
    }

    /// The agent's public key for its delivery, by its id; empty without an agent, or when the
    /// key cannot be read now (the delivery then reads it, and says why if it still cannot).
    private static func keysForDelivery(of agent: String?, registry: any AgentDirectory, logger: Logger) async -> [String: RSAPublicKey] {
        guard let agent else { return [:] }
        do {
            return try await registry.publicKey(of: agent).map { [agent: $0] } ?? [:]
        } catch {
            logger.debug("an agent's key was not read with its pull; its delivery reads it", metadata: ["agent.id": "\(agent)", "error": "\(error)"])
            return [:]
        }
    }
}

extension StoredPull {
    /// What a pull's command is made from, as it was queued.
    public init(_ pull: NewPull) {
        self.init(id: pull.id, uid: pull.uid, filter: pull.filter, issuedAt: pull.issuedAt, expiresAt: pull.expiresAt, wrappedKey: pull.wrappedKey, urgent: pull.urgent)
    }
}
