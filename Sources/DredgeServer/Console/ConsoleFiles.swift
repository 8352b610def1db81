import DredgeAdminAPI
import DredgeWire
import Foundation
import Hummingbird
import Mustache

/// The console's downloads: a pull's or a feedback's files listed (per device, with sizes and
/// SHA-256), each downloaded through the session, and a pull's files as one zip — what
/// `dredge fetch` and `dredge feedback fetch` get. Served as the API serves them (ranges,
/// ETag, `Repr-Digest`) and audited the same way (`pull.download`, `feedback.download`) under
/// the session's token.
extension Console {
    static func registerFiles(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        let actions = d.actions
        /// An id of the path: one that cannot be an id names no page (the actions check it again).
        @Sendable func id(_ context: AdminRequestContext, _ name: String = "id") throws -> String {
            let id = try context.parameters.require(name)
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such page.") }
            return id
        }
        /// The `:name` of a download, as its link percent-encoded it (only names the listing holds are served).
        @Sendable func fileName(_ context: AdminRequestContext) throws -> String {
            guard let name = try context.parameters.require("name").removingPercentEncoding else { throw AdminAPIError(.notFound, "not_found", "There is no such file.") }
            return name
        }
        /// The API's download answer, as the session's token, with the console's headers.
        @Sendable func serve(_ download: AdminActions.Download, _ session: ConsoleSessions.Session, _ request: Request, _ context: AdminRequestContext) async throws -> Response {
            var response = try await AdminAPI.serve(download, request: request, context: context, actions: actions, caller: session.caller)
            for field in securityHeaders { response.headers[field.name] = field.value }  // no-store: logs stay off the browser's disk
            return response
        }
        @Sendable func listing(_ session: ConsoleSessions.Session, kind: String, id: String, _ located: [PullFiles.Located]) async throws -> Response {
            let hosts = try await d.actions.hostnames(for: session.caller)
            var page = signedInPage("Files of \(kind) \(id.prefix(8))", session, current: kind == "pull" ? "Pulls" : "Feedback")
            page["kind"] = kind
            page["id"] = id
            page["back"] = kind == "pull" ? "/console/pulls/\(id)" : "/console/feedback"
            page["logs"] = "/console/logs?\(kind)=\(id)"
            if kind == "pull" && located.contains(where: { $0.file.kind != .zip }) { page["zip"] = "/console/pulls/\(id)/zip" }
            page["rows"] = located.map { l -> [String: Any] in
                let f = l.file
                let href = kind == "pull" ? "/console/pulls/\(id)/files/\(f.agentID)/\(percentEncoded(f.name))" : "/console/feedback/\(id)/files/\(percentEncoded(f.name))"
                return ["host": hosts[f.agentID] ?? "?", "name": f.name, "kind": f.kind.rawValue, "size": byteText(f.size), "sha256": f.sha256, "href": href]
            }
            return html(library, "files", page)
        }

        console.get("pulls/:id/files") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            let pull = try id(context)
            return try await listing(session, kind: "pull", id: pull, actions.files(ofPull: pull, for: session.caller))
        }
        console.get("feedback/:id/files") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            let feedback = try id(context)
            return try await listing(session, kind: "feedback", id: feedback, actions.files(ofFeedback: feedback, for: session.caller))
        }
        console.get("pulls/:id/files/:agent/:name") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            return try await serve(actions.file(ofPull: id(context), agent: id(context, "agent"), name: fileName(context), for: session.caller), session, request, context)
        }
        console.get("pulls/:id/zip") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            return try await serve(actions.wholeZip(ofPull: id(context), for: session.caller), session, request, context)
        }
        console.get("feedback/:id/files/:name") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            return try await serve(actions.file(ofFeedback: id(context), name: fileName(context), for: session.caller), session, request, context)
        }
    }

    /// A text with only the unreserved characters (RFC 3986) left as they are: a file name as one
    /// path segment, a query or form value, an OAuth client credential (RFC 6749 § 2.3.1).
    static func percentEncoded(_ name: String) -> String {
        let allowed = CharacterSet(charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
        return name.addingPercentEncoding(withAllowedCharacters: allowed) ?? name
    }
}
