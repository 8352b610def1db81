import DredgeAdminAPI
import DredgeWire
import Hummingbird

/// The files of pulls and feedback: listed, and each served with ranges, ETag and
/// `Repr-Digest` (``AdminAPI/serve(_:request:context:actions:actor:action:detail:)``), every
/// download audited; a pull's files also as one zip.
enum FileRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        @Sendable func files() throws -> PullFiles {
            guard let files = actions.services.files else { throw ActionError(.unavailable, "this server does not serve files") }
            return files
        }
        routes.get("pulls/:id/files") { _, context in
            let id = try AdminAPI.validID(context.parameters.require("id"), "pull")
            guard let list = try await files().list(id) else { throw ActionError(.notFound, "no pull \(id)") }
            return try AdminAPI.json(list.map(\.file))
        }
        routes.get("pulls/:id/files/:agent/:name") { request, context in
            let id = try AdminAPI.validID(context.parameters.require("id"), "pull")
            let agent = try AdminAPI.validID(context.parameters.require("agent"), "agent")
            let name = try context.parameters.require("name")
            guard let located = try await files().locate(id, agent: agent, name: name) else {
                throw ActionError(.notFound, "pull \(id) has no file \(WireID.echo(name).debugDescription) from agent \(agent)")
            }
            return try await AdminAPI.serve(
                located, request: request, context: context, actions: actions, actor: context.tokenName ?? "?", detail: "pull \(id) agent \(agent) file \(located.file.name)")
        }
        routes.get("pulls/:id/zip") { request, context in
            let id = try AdminAPI.validID(context.parameters.require("id"), "pull")
            let located: PullFiles.Located
            do {
                guard let zip = try await files().wholeZip(id) else { throw ActionError(.notFound, "no pull \(id)") }
                located = zip
            } catch PullFiles.WholeZipError.nothingYet {
                throw ActionError(.notFound, "pull \(id) has no files yet (none of its agents is complete, or it was removed)")
            } catch PullFiles.WholeZipError.changing {
                throw ActionError(.unavailable, "pull \(id)'s files are changing; ask again")
            }
            return try await AdminAPI.serve(located, request: request, context: context, actions: actions, actor: context.tokenName ?? "?", detail: "pull \(id) whole zip")
        }
        routes.get("feedback/:id/files") { _, context in
            let id = try AdminAPI.validID(context.parameters.require("id"), "feedback")
            guard let list = try await files().list(feedback: id) else { throw ActionError(.notFound, "no feedback \(id)") }
            return try AdminAPI.json(list.map(\.file))
        }
        routes.get("feedback/:id/files/:name") { request, context in
            let id = try AdminAPI.validID(context.parameters.require("id"), "feedback")
            let name = try context.parameters.require("name")
            guard let located = try await files().locate(feedback: id, name: name) else {
                throw ActionError(.notFound, "feedback \(id) has no file \(WireID.echo(name).debugDescription)")
            }
            return try await AdminAPI.serve(
                located, request: request, context: context, actions: actions, actor: context.tokenName ?? "?", action: .feedbackDownload,
                detail: "feedback \(id) file \(located.file.name)")
        }
        return routes
    }
}
