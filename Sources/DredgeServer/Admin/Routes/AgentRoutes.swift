import DredgeAdminAPI
import DredgeDomain
import Hummingbird

/// `GET /v1/agents` (optionally `?uid=`: the agents that hold the uid, each with when it last saw it).
enum AgentRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, _ in try AdminAPI.json(try await actions.agents(holding: request.uri.queryParameters.get("uid").map { String($0) })) }
        return routes
    }
}
