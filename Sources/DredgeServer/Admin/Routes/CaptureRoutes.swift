import DredgeAdminAPI
import Hummingbird

/// `/v1/captures`: list, read and remove what standing triggers captured (#54; their files are
/// ``FileRoutes``', a trigger's grouped captures ``TriggerRoutes``').
enum CaptureRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, context in
            try AdminAPI.json(try await actions.captures(limit: request.uri.queryParameters.get("limit", as: Int.self) ?? 100, for: context.signedIn))
        }
        routes.get(":id") { _, context in
            try AdminAPI.json(try await actions.capture(context.parameters.require("id"), for: context.signedIn))
        }
        routes.delete(":id") { request, context in
            let report = try await actions.remove(
                .capture, try context.parameters.require("id"), by: context.signedIn, reason: request.uri.queryParameters.get("reason") ?? "")
            return try AdminAPI.json(report)
        }
        return routes
    }
}
