import DredgeAdminAPI
import Hummingbird

/// `/v1/pulls`: list, make, read and remove pulls (their files are ``FileRoutes``').
enum PullRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, context in
            let parameters = request.uri.queryParameters
            return try AdminAPI.json(
                try await actions.pulls(
                    limit: parameters.get("limit", as: Int.self) ?? 100, reason: parameters.get("reason").map { String($0) }, disk: AdminAPI.diskWanted(request), for: context.signedIn))
        }
        routes.post { request, context in
            let body = try await AdminAPI.decode(PullRequest.self, from: request)
            return try AdminAPI.json(try await actions.createPull(body, by: context.signedIn, via: "api"), status: .created)
        }
        routes.get(":id") { request, context in
            try AdminAPI.json(try await actions.pull(context.parameters.require("id"), disk: AdminAPI.diskWanted(request), for: context.signedIn))
        }
        // A second person lets a pull that waits for approval go out (#55).
        routes.post(":id/approve") { _, context in
            try AdminAPI.json(try await actions.approvePull(context.parameters.require("id"), by: context.signedIn))
        }
        // The results go, the record stays.
        routes.delete(":id") { request, context in
            let report = try await actions.remove(.pull, try context.parameters.require("id"), by: context.signedIn, reason: request.uri.queryParameters.get("reason") ?? "")
            return try AdminAPI.json(report)
        }
        return routes
    }
}
