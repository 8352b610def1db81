import DredgeAdminAPI
import Foundation
import Hummingbird
import Mustache

/// The console's audit log and tokens pages: what `dredge audit` and `dredge tokens` do.
extension Console {
    /// What every signed-in page shows in its header.
    static func signedInPage(_ title: String, _ session: ConsoleSessions.Session, current: String) -> [String: Any] {
        ["title": title, "signedIn": true, "on" + current: true, "tokenName": session.tokenName, "csrf": session.csrf]
    }

    enum Posting {
        /// A post from this console's own page, with its session's CSRF token.
        case session(ConsoleSessions.Session)
        /// No live session: sign in first.
        case signIn
        /// Another origin, or no or another CSRF token: refused, nothing done.
        case forbidden
    }

    static func posting(_ request: Request, _ form: [String: String], _ d: Dependencies) async throws -> Posting {
        guard let session = try await checked(request, d) else { return .signIn }
        guard sameOrigin(request, d), let sent = form["csrf"], ConsoleSessions.same(session.csrf, sent) else { return .forbidden }
        return .session(session)
    }

    static func registerAdministration(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        // MARK: Audit

        console.get("audit") { request, _ in
            guard let session = try await checked(request, d) else { return redirect("/console/sign-in") }
            let parameters = request.uri.queryParameters
            func text(_ name: String) -> String { (parameters.get(name) ?? "").trimmingCharacters(in: .whitespaces) }
            var query = AuditQuery(limit: 100)
            query.actor = text("actor").isEmpty ? nil : text("actor")
            query.action = text("action").isEmpty ? nil : text("action")
            var page = signedInPage("Audit log", session, current: "Audit")
            page["actor"] = text("actor")
            page["action"] = text("action")
            page["actions"] = ["pull", "pull.download", "feedback.download", "pull.remove", "feedback.remove", "records.search", "token", "auth.failed", "console"]
                .map { ["name": $0, "selected": $0 == text("action")] }
            if let before = parameters.get("before") {
                guard let id = Int64(before), id > 0 else { throw AdminAPIError(.badRequest, "bad_request", "“before” is an entry's number.") }
                query.before = id
            }
            let entries = try await d.audit.audit(query)
            page["rows"] = entries.map { entry -> [String: Any] in
                ["id": entry.id.map(String.init) ?? "", "at": timeText(entry.at), "actor": entry.actor, "action": entry.action, "detail": entry.detail]
            }
            if entries.count == query.limit, let last = entries.last?.id {
                var older = [URLQueryItem(name: "before", value: "\(last)")]
                if let actor = query.actor { older.append(URLQueryItem(name: "actor", value: actor)) }
                if let action = query.action { older.append(URLQueryItem(name: "action", value: action)) }
                var components = URLComponents()
                components.path = "/console/audit"
                components.queryItems = older
                page["older"] = components.string ?? "/console/audit"
            }
            return html(library, "audit", page)
        }

        // MARK: Tokens

        @Sendable func tokensPage(_ session: ConsoleSessions.Session, created: TokenCreated? = nil, problem: String? = nil, status: HTTPResponse.Status = .ok) async throws
            -> Response
        {
            var page = signedInPage("Tokens", session, current: "Tokens")
            page["rows"] = try await d.tokens.list().sorted { ($0.kind.rawValue, $0.name) < ($1.kind.rawValue, $1.name) }.map { token -> [String: Any] in
                ["name": token.name, "kind": token.kind.rawValue, "createdAt": timeText(token.createdAt), "yours": token.name == session.tokenName && token.kind == .admin]
            }
            if let created {
                page["created"] = ["name": created.info.name, "kind": created.info.kind.rawValue, "token": created.token]
            }
            if let problem { page["problem"] = problem }
            return html(library, "tokens", page, status: status)
        }

        console.get("tokens") { request, _ in
            guard let session = try await checked(request, d) else { return redirect("/console/sign-in") }
            return try await tokensPage(session)
        }
        console.post("tokens") { request, context in
            let form = try await formFields(request, context)
            let session: ConsoleSessions.Session
            switch try await posting(request, form, d) {
            case .session(let s): session = s
            case .signIn: return redirect("/console/sign-in")
            case .forbidden: return forbidden(library, d)
            }
            let name = (form["name"] ?? "").trimmingCharacters(in: .whitespaces)
            guard let kind = TokenKind(rawValue: form["kind"] ?? "") else {
                return try await tokensPage(session, problem: "A token is an admin or an enrollment token.", status: .badRequest)
            }
            let created: TokenCreated
            do {
                created = try await d.tokens.create(name: name, kind: kind, now: Date())
            } catch let error as TokenError {
                return try await tokensPage(session, problem: error.description.prefix(1).uppercased() + error.description.dropFirst() + ".", status: .badRequest)
            }
            try await d.audit.record(actor: session.tokenName, action: "token.create", detail: "\(kind.rawValue) token '\(name)'", at: Date())
            // Shown on this answer only (not a redirect: the token is in no URL and no history).
            return try await tokensPage(session, created: created)
        }
        console.post("tokens/revoke") { request, context in
            let form = try await formFields(request, context)
            let session: ConsoleSessions.Session
            switch try await posting(request, form, d) {
            case .session(let s): session = s
            case .signIn: return redirect("/console/sign-in")
            case .forbidden: return forbidden(library, d)
            }
            let name = form["name"] ?? ""
            guard let kind = TokenKind(rawValue: form["kind"] ?? "") else {
                return try await tokensPage(session, problem: "A token is an admin or an enrollment token.", status: .badRequest)
            }
            do {
                try await d.tokens.revoke(name: name, kind: kind)
            } catch let error as TokenError {
                return try await tokensPage(session, problem: error.description.prefix(1).uppercased() + error.description.dropFirst() + ".", status: .conflict)
            }
            try await d.audit.record(actor: session.tokenName, action: "token.revoke", detail: "\(kind.rawValue) token '\(name)'", at: Date())
            // Revoking one's own token ends this session: the next page asks to sign in.
            return redirect("/console/tokens")
        }
    }

    /// `2026-11-20 10:00:00 UTC` (with `.123` milliseconds when asked).
    static func timeText(_ date: Date, fraction: Bool = false) -> String {
        date.formatted(Date.ISO8601FormatStyle(dateSeparator: .dash, dateTimeSeparator: .space, includingFractionalSeconds: fraction, timeZone: .gmt))
            .replacingOccurrences(of: "Z", with: " UTC")
    }
}
