import DredgeAdminAPI
import Hummingbird

/// `/v1/pulls`: list, make, read and remove pulls (their files are ``FileRoutes``').
enum PullRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        let s = actions.services
        routes.get { request, _ in
            let limit = request.uri.queryParameters.get("limit", as: Int.self) ?? 100
            let listed = try await s.pulls.pulls(limit: min(max(limit, 1), 1000), now: .now)
            return try AdminAPI.json(try AdminAPI.diskWanted(request) ? await AdminAPI.measured(listed, s.results, s.logger) : listed)
        }
        routes.post { request, context in
            let body = try await AdminAPI.decode(PullRequest.self, from: request)
            return try AdminAPI.json(try await actions.createPull(body, by: context.tokenName ?? "?", via: "api"), status: .created)
        }
        routes.get(":id") { request, context in
            let id = try AdminAPI.validID(context.parameters.require("id"), "pull")
            guard let pull = try await s.pulls.pull(id, now: .now) else { throw ActionError(.notFound, "no pull \(id)") }
            return try AdminAPI.json(try AdminAPI.diskWanted(request) ? await AdminAPI.measured([pull], s.results, s.logger).first ?? pull : pull)
        }
        // The results go, the record stays.
        routes.delete(":id") { request, context in
            let report = try await actions.remove(.pull, try context.parameters.require("id"), by: context.tokenName ?? "?", reason: request.uri.queryParameters.get("reason") ?? "")
            return try AdminAPI.json(report)
        }
        return routes
    }
}
