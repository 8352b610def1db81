import DredgeAdminAPI
import DredgeDomain

/// What an engineer reads, for both surfaces: the agents (all, or those holding a uid), the
/// pulls and feedback (listed or one, with their disk use when asked), the tokens. Reads are
/// not audited (what is read out of them, files and records, is); they pass through here so
/// that a rule on who may read what has one place to live: a scoped caller sees only the
/// devices of its scope, the pulls that reached them (with those targets only) and their feedback.
extension AdminActions {
    /// Listings are 1 to this long.
    public static let maximumListing = 1000

    /// Every agent; with `holding`, only the agents that hold that uid, each with when it last
    /// saw it.
    public func agents(holding uid: String? = nil, for caller: Caller) async throws -> [AgentRecord] {
        let registry = services.registry
        guard let uid else { return try await registry.agents().filter(caller.admits) }
        if let problem = UserID.problem(uid) { throw ActionError(.invalid, "uid: \(problem)") }
        let holders = Dictionary(try await registry.holders(of: uid).map { ($0.agentID, $0.lastSeen) }, uniquingKeysWith: { a, _ in a })
        return try await registry.agents().compactMap { agent -> AgentRecord? in
            guard let seen = holders[agent.agentID], caller.admits(agent) else { return nil }
            var agent = agent
            agent.uidLastSeen = seen
            return agent
        }
    }

    /// Agents' host names by id, for pages that name devices (those of the caller's scope).
    public func hostnames(for caller: Caller) async throws -> [String: String] {
        Dictionary(try await services.registry.agents().filter(caller.admits).map { ($0.agentID, $0.hostname) }, uniquingKeysWith: { a, _ in a })
    }

    /// The newest pulls first, `limit` clamped to 1…``maximumListing``; with `reason`, only
    /// those whose reason holds it (ASCII letters in any case: `sup-12` finds "SUP-1234"); with
    /// `disk`, each with what its files take (a listing never fails for want of a size:
    /// unmeasured, it has none).
    /// A scoped caller is shown, among the newest ``maximumListing`` pulls, those that reached a
    /// device of its scope, with those targets only.
    public func pulls(limit: Int, reason: String? = nil, disk: Bool, for caller: Caller) async throws -> [PullRecord] {
        let reason = reason?.trimmingCharacters(in: .whitespaces)
        if let reason, let problem = reasonProblem(reason) { throw ActionError(.invalid, "the reason searched for: \(problem)") }
        let limit = min(max(limit, 1), Self.maximumListing)
        let agents = try await scopedAgents(caller)
        var listed = try await services.pulls.pulls(limit: agents == nil ? limit : Self.maximumListing, reason: reason?.isEmpty == false ? reason : nil, now: .now)
        if let agents { listed = Array(listed.compactMap { Self.pull($0, within: agents) }.prefix(limit)) }
        // A pull's disk use counts every device's files: told to unscoped callers only.
        return disk && agents == nil ? await measured(listed) { try await self.services.results?.measured($0) } : listed
    }

    /// A pull the caller's scope reaches; one that reached none of its devices is no pull.
    public func pull(_ id: String, disk: Bool, for caller: Caller) async throws -> PullRecord {
        let id = try Self.checkedID(id, "pull")
        let agents = try await scopedAgents(caller)
        guard let stored = try await services.pulls.pull(id, now: .now), let pull = agents.map({ Self.pull(stored, within: $0) }) ?? stored else {
            throw ActionError(.notFound, "no pull \(id)")
        }
        return disk && agents == nil ? await measured([pull]) { try await self.services.results?.measured($0) }.first ?? pull : pull
    }

    /// `pull` with only its targets among `agents`; nil when none is.
    static func pull(_ pull: PullRecord, within agents: Set<String>) -> PullRecord? {
        var pull = pull
        pull.targets = pull.targets.filter { agents.contains($0.agentID) }
        return pull.targets.isEmpty ? nil : pull
    }

    public func feedback(limit: Int, disk: Bool, for caller: Caller) async throws -> [FeedbackRecord] {
        let limit = min(max(limit, 1), Self.maximumListing)
        let agents = try await scopedAgents(caller)
        var listed = try await services.feedback.all(limit: agents == nil ? limit : Self.maximumListing)
        if let agents { listed = Array(listed.filter { agents.contains($0.agentID) }.prefix(limit)) }
        return disk ? await measured(listed) { try await self.services.results?.measured($0) } : listed
    }

    public func feedback(_ id: String, disk: Bool, for caller: Caller) async throws -> FeedbackRecord {
        let id = try Self.checkedID(id, "feedback")
        guard let record = try await services.feedback.feedback(id), try await scopedAgents(caller)?.contains(record.agentID) ?? true else {
            throw ActionError(.notFound, "no feedback \(id)")
        }
        return disk ? await measured([record]) { try await self.services.results?.measured($0) }.first ?? record : record
    }

    /// By kind, then name (never a secret).
    public func tokens() async throws -> [TokenInfo] {
        try await services.tokens.list().sorted { ($0.kind.rawValue, $0.name) < ($1.kind.rawValue, $1.name) }
    }

    /// Records with their disk use; as they are when measuring fails (logged).
    private func measured<Record>(_ records: [Record], _ measure: ([Record]) async throws -> [Record]?) async -> [Record] {
        do {
            return try await measure(records) ?? records
        } catch {
            logger.warning("cannot measure the disk use of results", metadata: ["error": "\(error)"])
            return records
        }
    }
}
