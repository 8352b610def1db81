import DredgeAdminAPI
import Hummingbird

/// The files of pulls, feedback, captures and live tails (``AdminActions/files(ofPull:for:)`` and the rest): listed, and
/// each served with ranges, ETag and `Repr-Digest`
/// (``AdminAPI/serve(_:request:context:actions:caller:)``), every download audited; a pull's
/// files also as one zip.
enum FileRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        @Sendable func serve(_ download: AdminActions.Download, _ request: Request, _ context: AdminRequestContext) async throws -> Response {
            try await AdminAPI.serve(download, request: request, context: context, actions: actions, caller: context.signedIn)
        }
        routes.get("pulls/:id/files") { _, context in
            try AdminAPI.json(try await actions.files(ofPull: context.parameters.require("id"), for: context.signedIn).map(\.file))
        }
        routes.get("pulls/:id/files/:agent/:name") { request, context in
            let p = context.parameters
            return try await serve(actions.file(ofPull: p.require("id"), agent: p.require("agent"), name: p.require("name"), for: context.signedIn), request, context)
        }
        routes.get("pulls/:id/zip") { request, context in
            try await serve(actions.wholeZip(ofPull: context.parameters.require("id"), for: context.signedIn), request, context)
        }
        routes.get("feedback/:id/files") { _, context in
            try AdminAPI.json(try await actions.files(ofFeedback: context.parameters.require("id"), for: context.signedIn).map(\.file))
        }
        routes.get("feedback/:id/files/:name") { request, context in
            let p = context.parameters
            return try await serve(actions.file(ofFeedback: p.require("id"), name: p.require("name"), for: context.signedIn), request, context)
        }
        routes.get("captures/:id/files") { _, context in
            try AdminAPI.json(try await actions.files(ofCapture: context.parameters.require("id"), for: context.signedIn).map(\.file))
        }
        routes.get("captures/:id/files/:name") { request, context in
            let p = context.parameters
            return try await serve(actions.file(ofCapture: p.require("id"), name: p.require("name"), for: context.signedIn), request, context)
        }
        routes.get("tails/:id/files") { _, context in
            try AdminAPI.json(try await actions.files(ofTail: context.parameters.require("id"), for: context.signedIn).map(\.file))
        }
        routes.get("tails/:id/files/:agent/:name") { request, context in
            let p = context.parameters
            return try await serve(actions.file(ofTail: p.require("id"), agent: p.require("agent"), name: p.require("name"), for: context.signedIn), request, context)
        }
        return routes
    }
}
