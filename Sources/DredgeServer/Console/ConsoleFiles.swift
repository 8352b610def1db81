import DredgeAdminAPI
import DredgeWire
import Foundation
import Hummingbird
import Mustache

/// The console's downloads: a pull's, a feedback's, a capture's or a live tail's files listed (per device,
/// with sizes and SHA-256), each downloaded through the session, and a pull's files as one zip
/// — what `dredge fetch` and `dredge feedback fetch` get. Served as the API serves them
/// (ranges, ETag, `Repr-Digest`) and audited the same way (`pull.download`,
/// `feedback.download`, `tail.download`) under the session's token.
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
        /// `logs`: where its records are read (a tail's: its user's, in the viewer).
        @Sendable func listing(_ session: ConsoleSessions.Session, kind: String, id: String, logs: String? = nil, _ located: [PullFiles.Located]) async throws -> Response {
            let hosts = try await d.actions.hostnames(for: session.caller)
            let current = switch kind {
            case "pull": "Pulls"
            case "tail": "Live"
            case "capture": "Triggers"
            default: "Feedback"
            }
            var page = signedInPage("Files of \(kind) \(id.prefix(8))", session, current: current)
            page["kind"] = kind
            page["id"] = id
            page["back"] = kind == "feedback" ? "/console/feedback" : "/console/\(kind)s/\(id)"
            page["logs"] = logs ?? "/console/logs?\(kind)=\(id)"
            page["empty"] =
                kind == "tail"
                ? "No files: the tail's devices have sent no records yet, or what it held was removed."
                : "No files yet: they are listed once a device's upload is complete, and go when the \(kind) is removed."
            if kind == "tail" {
                page["note"] = "Each device's records.jsonl holds its records as the device sent them, one JSON object a line; contexts.jsonl holds the contexts (app, version, process) they name by number. A running tail's files are listed as far as the server holds them: reload for more."
            }
            if kind == "pull" && located.contains(where: { $0.file.kind != .zip }) { page["zip"] = "/console/pulls/\(id)/zip" }
            page["rows"] = located.map { l -> [String: Any] in
                let f = l.file
                let href = switch kind {
                case "feedback": "/console/feedback/\(id)/files/\(percentEncoded(f.name))"
                case "capture": "/console/captures/\(id)/files/\(percentEncoded(f.name))"
                default: "/console/\(kind)s/\(id)/files/\(f.agentID)/\(percentEncoded(f.name))"
                }
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
        console.get("captures/:id/files") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            let capture = try id(context)
            return try await listing(session, kind: "capture", id: capture, actions.files(ofCapture: capture, for: session.caller))
        }
        console.get("captures/:id/files/:name") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            return try await serve(actions.file(ofCapture: id(context), name: fileName(context), for: session.caller), session, request, context)
        }
        console.get("pulls/:id/files/:agent/:name") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            return try await serve(actions.file(ofPull: id(context), agent: id(context, "agent"), name: fileName(context), for: session.caller), session, request, context)
        }
        console.get("pulls/:id/zip") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            return try await serve(actions.wholeZip(ofPull: id(context), for: session.caller), session, request, context)
        }
        console.get("tails/:id/files") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            let tail = try await actions.tail(id(context), for: session.caller)
            let located = try await actions.files(ofTail: tail.id, for: session.caller)
            return try await listing(session, kind: "tail", id: tail.id, logs: url("/console/logs", [("uid", tail.uid), ("since", tail.issuedAt.rfc3339)]), located)
        }
        console.get("tails/:id/files/:agent/:name") { request, context in
            guard let session = try await checked(request, d, .readFiles) else { return toSignIn(request) }
            return try await serve(actions.file(ofTail: id(context), agent: id(context, "agent"), name: fileName(context), for: session.caller), session, request, context)
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
