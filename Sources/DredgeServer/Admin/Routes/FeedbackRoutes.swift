import DredgeAdminAPI
import Hummingbird

/// `/v1/feedback`: list, read and remove feedback (its files are ``FileRoutes``').
enum FeedbackRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, context in
            try AdminAPI.json(
                try await actions.feedback(limit: request.uri.queryParameters.get("limit", as: Int.self) ?? 100, disk: AdminAPI.diskWanted(request), for: context.signedIn))
        }
        routes.get(":id") { request, context in
            try AdminAPI.json(try await actions.feedback(context.parameters.require("id"), disk: AdminAPI.diskWanted(request), for: context.signedIn))
        }
        routes.delete(":id") { request, context in
            let report = try await actions.remove(
                .feedback, try context.parameters.require("id"), by: context.signedIn, reason: request.uri.queryParameters.get("reason") ?? "")
            return try AdminAPI.json(report)
        }
        return routes
    }
}
