import DredgeAdminAPI
import DredgeDomain
import Hummingbird

/// `GET /v1/agents` (optionally `?uid=`: the agents that hold the uid, each with when it last
/// saw it); `POST /v1/agents/{id}/revoke` (audited).
enum AgentRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, context in
            try AdminAPI.json(try await actions.agents(holding: request.uri.queryParameters.get("uid").map { String($0) }, for: context.signedIn))
        }
        routes.post(":id/revoke") { request, context in
            let body = try await AdminAPI.decode(AgentRevocationRequest.self, from: request)
            return try AdminAPI.json(try await actions.revokeAgent(try context.parameters.require("id"), reason: body.reason, by: context.signedIn))
        }
        return routes
    }
}
