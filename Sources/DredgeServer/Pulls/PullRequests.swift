import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation

/// Why a pull cannot be queued.
public enum PullRequestError: Error, CustomStringConvertible, Equatable, Sendable {
    case noTarget
    case unknownAgent(String)
    case noAgentForUID(String)
    case invalid(String)

    public var description: String {
        switch self {
        case .noTarget: "give a uid, an agent, or both"
        case .unknownAgent(let id): "no enrolled agent \(id)"
        case .noAgentForUID(let uid): "no agent has reported uid \(uid): it must have logged with that uid in the last day and connected since"
        case .invalid(let message): message
        }
    }
}

/// The longest a pull may wait for an offline agent.
public let maximumPullLifetime: Duration = .seconds(7 * 86_400)

extension PullQueue {
    /// Resolves a request's targets in the registry and queues the pull: by uid, every agent
    /// that has reported it; by agent, that agent (with a uid too, that agent's records of the
    /// uid). Recorded in the audit log under `requestedBy`.
    public func create(_ request: PullRequest, registry: any AgentDirectory, issuer: CommandIssuer, requestedBy: String, now: Timestamp = .now) async throws -> PullRecord {
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
        if let agent {
            agents = try await registry.isEnrolled(agent) ? [agent] : []
        } else if let uid {
            agents = try await registry.agentIDs(withUID: uid)
        } else {
            agents = []
        }
        guard !agents.isEmpty else {
            if let agent { throw PullRequestError.unknownAgent(agent) }
            throw PullRequestError.noAgentForUID(uid ?? "")
        }
        var pull = try issuer.newPull(
            uid: uid ?? "", agentID: agent ?? "", filter: filter, targets: agents, lifetime: .seconds(seconds), requestedBy: requestedBy, now: now)
        pull.reason = request.reason ?? ""
        try await create(pull)
        guard let record = try await self.pull(pull.id, now: now) else { throw PullRequestError.invalid("pull \(pull.id) vanished") }
        return record
    }
}
