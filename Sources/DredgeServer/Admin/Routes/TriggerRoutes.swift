import DredgeAdminAPI
import Foundation
import Hummingbird

/// `/v1/triggers`: define, list, read, disable and remove standing triggers (#54), and see
/// what each brought in (its captures, grouped under it).
enum TriggerRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, context in
            try AdminAPI.json(try await actions.triggers(limit: request.uri.queryParameters.get("limit", as: Int.self) ?? 100, for: context.signedIn))
        }
        routes.post { request, context in
            let body = try await AdminAPI.decode(TriggerRequest.self, from: request)
            return try AdminAPI.json(try await actions.createTrigger(body, by: context.signedIn, via: "api"), status: .created)
        }
        routes.get(":id") { _, context in
            try AdminAPI.json(try await actions.trigger(context.parameters.require("id"), for: context.signedIn))
        }
        routes.get(":id/captures") { request, context in
            try AdminAPI.json(
                try await actions.activity(
                    ofTrigger: context.parameters.require("id"), limit: request.uri.queryParameters.get("limit", as: Int.self) ?? 100, for: context.signedIn))
        }
        routes.post(":id/disable") { request, context in
            try AdminAPI.json(
                try await actions.disableTrigger(context.parameters.require("id"), by: context.signedIn, reason: request.uri.queryParameters.get("reason") ?? ""))
        }
        routes.delete(":id") { request, context in
            try AdminAPI.json(
                try await actions.removeTrigger(context.parameters.require("id"), by: context.signedIn, reason: request.uri.queryParameters.get("reason") ?? ""))
        }
        return routes
    }
}
