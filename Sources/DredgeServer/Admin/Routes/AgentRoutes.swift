import DredgeAdminAPI
import DredgeDomain
import Hummingbird

/// `GET /v1/agents` (optionally `?uid=`: the agents that hold the uid, each with when it last saw it).
enum AgentRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        let registry = actions.services.registry
        routes.get { request, _ in
            guard let uid = request.uri.queryParameters.get("uid") else { return try AdminAPI.json(await registry.agents()) }
            if let problem = UserID.problem(uid) { throw ActionError(.invalid, "uid: \(problem)") }
            let holders = Dictionary(try await registry.holders(of: uid).map { ($0.agentID, $0.lastSeen) }, uniquingKeysWith: { a, _ in a })
            return try AdminAPI.json(try await registry.agents().compactMap { agent -> AgentRecord? in
                guard let seen = holders[agent.agentID] else { return nil }
                var agent = agent
                agent.uidLastSeen = seen
                return agent
            })
        }
        return routes
    }
}
