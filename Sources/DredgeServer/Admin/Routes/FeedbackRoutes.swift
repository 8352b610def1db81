import DredgeAdminAPI
import Hummingbird

/// `/v1/feedback`: list, read and remove feedback (its files are ``FileRoutes``').
enum FeedbackRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        let s = actions.services
        routes.get { request, _ in
            let limit = request.uri.queryParameters.get("limit", as: Int.self) ?? 100
            let listed = try await s.feedback.all(limit: min(max(limit, 1), 1000))
            return try AdminAPI.json(try AdminAPI.diskWanted(request) ? await AdminAPI.measured(listed, s.results, s.logger) : listed)
        }
        routes.get(":id") { request, context in
            let id = try AdminAPI.validID(context.parameters.require("id"), "feedback")
            guard let record = try await s.feedback.feedback(id) else { throw ActionError(.notFound, "no feedback \(id)") }
            return try AdminAPI.json(try AdminAPI.diskWanted(request) ? await AdminAPI.measured([record], s.results, s.logger).first ?? record : record)
        }
        routes.delete(":id") { request, context in
            let report = try await actions.remove(
                .feedback, try context.parameters.require("id"), by: context.tokenName ?? "?", reason: request.uri.queryParameters.get("reason") ?? "")
            return try AdminAPI.json(report)
        }
        return routes
    }
}
