import DredgeAdminAPI
import DredgeDomain
import Foundation
import Hummingbird
import Mustache

/// The console's audit log and tokens pages: what `dredge audit` and `dredge tokens` do.
extension Console {
    /// What every signed-in page shows in its header.
    static func signedInPage(_ title: String, _ session: ConsoleSessions.Session, current: String) -> [String: Any] {
        [
            "title": title, "signedIn": true, "on" + current: true, "tokenName": session.tokenName, "csrf": session.csrf, "zone": zoneText(),
            "localZone": !["UTC", "GMT"].contains(displayZone.identifier), "role": session.caller.role.rawValue,
            "accessText": "\(session.caller.role.rawValue), scope: \(session.caller.scope)", "isAdmin": session.caller.role == .admin,
            "mayPull": session.caller.role >= AdminOperation.createPull.leastRole,
        ]
    }

    /// `UTC`, or `Europe/Paris (+01:00)`: the zone the page's times are in, said on every page.
    static func zoneText(at now: Date = Date()) -> String {
        let zone = displayZone
        if ["UTC", "GMT"].contains(zone.identifier) { return "UTC" }
        let shown = Timestamp(now).shown(in: zone)
        return "\(zone.identifier) (\(shown.split(separator: " ").last ?? "UTC"))"
    }

    /// Runs `body` with the session of a post from this console's own page carrying its
    /// session's CSRF token; otherwise answers for it: sign in first, or 403 (nothing done).
    static func asPoster(
        _ request: Request, _ form: [String: String], _ library: MustacheLibrary, _ d: Dependencies, _ operation: AdminOperation,
        _ body: (ConsoleSessions.Session) async throws -> Response
    ) async throws -> Response {
        guard let session = try await checked(request, d, operation) else { return toSignIn(request) }
        guard sameOrigin(request, d), let sent = form["csrf"], ConsoleSessions.same(session.csrf, sent) else { return forbidden(library, d) }
        return try await body(session)
    }

    /// An error's description as a sentence for a page: capitalised, with a full stop.
    static func sentence(_ error: some CustomStringConvertible) -> String {
        let text = error.description
        return text.prefix(1).uppercased() + text.dropFirst() + "."
    }

    static func registerAdministration(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        // MARK: Audit

        console.get("audit") { request, _ in
            guard let session = try await checked(request, d, .readAudit) else { return toSignIn(request) }
            let parameters = Console.query(request)
            let (query, entries) = try await d.actions.audit(parameters, defaultLimit: 100)
            var page = signedInPage("Audit log", session, current: "Audit")
            page["actor"] = query.actor ?? ""
            page["action"] = query.action ?? ""
            page["actions"] = AuditAction.filters
                .map { ["name": $0, "selected": $0 == query.action] }
            page["rows"] = entries.map { entry -> [String: Any] in
                ["id": entry.id.map(String.init) ?? "", "at": timeText(entry.at), "actor": entry.actor, "action": entry.action, "detail": entry.detail]
            }
            if entries.count == query.limit, let last = entries.last?.id {
                var older = [("before", "\(last)")]
                if let actor = query.actor { older.append(("actor", actor)) }
                if let action = query.action { older.append(("action", action)) }
                for name in ["since", "limit"] { if let value = parameters[name], !value.isEmpty { older.append((name, value)) } }
                page["older"] = url("/console/audit", older)
            }
            return html(library, "audit", page)
        }

        // MARK: Tokens

        @Sendable func tokensPage(_ session: ConsoleSessions.Session, created: TokenCreated? = nil, problem: String? = nil, status: HTTPResponse.Status = .ok) async throws
            -> Response
        {
            var page = signedInPage("Tokens", session, current: "Tokens")
            page["rows"] = try await d.actions.tokens().map { token -> [String: Any] in
                [
                    "name": token.name, "kind": token.kind.rawValue, "createdAt": timeText(token.createdAt), "yours": token.name == session.tokenName && token.kind == .admin,
                    "limits": limitsText(token),
                    "access": token.role.map { $0.rawValue + (token.scope.map { " of \($0)" } ?? "") } ?? "",
                    "revoke": url("/console/tokens/revoke", [("kind", token.kind.rawValue), ("name", token.name)]),
                ]
            }
            if let created {
                page["created"] = ["name": created.info.name, "kind": created.info.kind.rawValue, "token": created.token]
            }
            if let problem { page["problem"] = problem }
            return html(library, "tokens", page, status: status)
        }

        console.get("tokens") { request, _ in
            guard let session = try await checked(request, d, .manageTokens) else { return toSignIn(request) }
            return try await tokensPage(session)
        }
        console.post("tokens") { request, context in
            let form = try await formFields(request, context)
            return try await asPoster(request, form, library, d, .manageTokens) { session in
                let name = (form["name"] ?? "").trimmingCharacters(in: .whitespaces)
                guard let kind = TokenKind(rawValue: form["kind"] ?? "") else {
                    return try await tokensPage(session, problem: "A token is an admin or an enrollment token.", status: .badRequest)
                }
                let expires = (form["expires"] ?? "").isEmpty ? nil : Int(form["expires"] ?? "")
                let usesText = (form["uses"] ?? "").trimmingCharacters(in: .whitespaces)
                guard usesText.isEmpty || Int(usesText) != nil, (form["expires"] ?? "").isEmpty || expires != nil else {
                    return try await tokensPage(session, problem: "Uses is a whole number, and the expiry one of the choices.", status: .badRequest)
                }
                var request = TokenRequest(name: name, kind: kind, expiresInSeconds: expires, uses: Int(usesText))
                if kind == .admin {
                    guard let role = AdminRole(rawValue: form["role"] ?? "") else {
                        return try await tokensPage(session, problem: "A role is reader, investigator or admin.", status: .badRequest)
                    }
                    request.role = role
                    // Apps and labels separated by spaces.
                    func words(_ field: String) -> [String] { (form[field] ?? "").split(whereSeparator: \.isWhitespace).map(String.init) }
                    do {
                        let scope = try AccessScope(apps: words("apps"), labels: words("labels"))
                        request.scope = scope.isEverything ? nil : scope
                    } catch let error as AccessScopeError {
                        return try await tokensPage(session, problem: sentence(error), status: .badRequest)
                    }
                }
                let created: TokenCreated
                do {
                    created = try await d.actions.createToken(request, by: session.caller)
                } catch let error as ActionError {
                    return try await tokensPage(session, problem: sentence(error), status: AdminAPIError(error).status)
                }
                // Shown on this answer only (not a redirect: the token is in no URL and no history).
                return try await tokensPage(session, created: created)
            }
        }
        // Revoking asks first, on a page of its own: acting never depends on the page's script.
        console.get("tokens/revoke") { request, _ in
            guard let session = try await checked(request, d, .manageTokens) else { return toSignIn(request) }
            let fields = query(request)
            let name = fields["name"] ?? ""
            guard let kind = TokenKind(rawValue: fields["kind"] ?? "") else {
                return try await tokensPage(session, problem: "A token is an admin or an enrollment token.", status: .badRequest)
            }
            guard try await d.actions.tokens().contains(where: { $0.name == name && $0.kind == kind }) else {
                return try await tokensPage(session, problem: "There is no \(kind.rawValue) token “\(name)”.", status: .notFound)
            }
            var page = signedInPage("Revoke a token", session, current: "Tokens")
            page["heading"] = "Revoke the \(kind.rawValue) token “\(name)”?"
            page["question"] =
                kind == .admin
                ? (name == session.tokenName
                    ? "It is the token this session signed in with: this session ends at once, as do every other session and command using it."
                    : "Every console session and command using it stops working at once.")
                    + " This cannot be undone: make a new token instead."
                : "Agents can no longer enroll with it; agents already enrolled keep working. This cannot be undone."
            page["action"] = "/console/tokens/revoke"
            page["hidden"] = [["name": "name", "value": name], ["name": "kind", "value": kind.rawValue]]
            page["button"] = "Revoke"
            page["back"] = "/console/tokens"
            return html(library, "confirm", page)
        }
        console.post("tokens/revoke") { request, context in
            let form = try await formFields(request, context)
            return try await asPoster(request, form, library, d, .manageTokens) { session in
                let name = form["name"] ?? ""
                guard let kind = TokenKind(rawValue: form["kind"] ?? "") else {
                    return try await tokensPage(session, problem: "A token is an admin or an enrollment token.", status: .badRequest)
                }
                do {
                    try await d.actions.revokeToken(name: name, kind: kind, by: session.caller)
                } catch let error as ActionError {
                    return try await tokensPage(session, problem: sentence(error), status: AdminAPIError(error).status)
                }
                // Revoking one's own token ends this session: the next page asks to sign in.
                return redirect("/console/tokens")
            }
        }
    }

    /// An enrollment token's limits in words: "expires …; 3 uses left", or "none".
    static func limitsText(_ token: TokenInfo, now: Date = Date()) -> String {
        var parts: [String] = []
        if let expiresAt = token.expiresAt { parts.append("\(expiresAt <= now ? "expired" : "expires") \(timeText(expiresAt))") }
        if let uses = token.usesLeft { parts.append("\(uses) use\(uses == 1 ? "" : "s") left") }
        return parts.isEmpty ? "none" : parts.joined(separator: "; ")
    }

    /// `2026-11-20 10:00:00 UTC`, or in the zone the reader chose `2026-11-20 11:00:00 +01:00`
    /// (with `.123` milliseconds when asked): as every surface prints times, so a time copied
    /// from a page means the same in `dredge logs --since` and in the console's own fields.
    static func timeText(_ date: Date, fraction: Bool = false) -> String {
        Timestamp(date).shown(in: displayZone, milliseconds: fraction)
    }
}
