import DredgeAdminAPI
import Foundation
import Hummingbird
import Logging
import Mustache
import NIOCore

/// The web console on the admin listener (`/console/…`): server-rendered pages for support
/// engineers, signed in with an admin token (docs/console.md).
///
/// - A session is a cookie (`dredge_console`: HttpOnly, SameSite=Strict, `Path=/console`,
///   Secure when the listener speaks TLS, expiring with the session) naming a
///   ``ConsoleSessions`` entry; pages without one send the browser to the sign-in page.
/// - Every form carries a CSRF token, checked in constant time: the session's, or for the
///   sign-in form a random one kept in a cookie of its own (`dredge_console_csrf`). A post
///   without it is refused (403) and changes nothing.
/// - Every answer carries a Content-Security-Policy without `unsafe-inline` (styles and
///   scripts only from `/console/static/`), `X-Content-Type-Options: nosniff`,
///   `Referrer-Policy: same-origin` and `Cache-Control: no-store`; pages cannot be framed.
/// - Sign-in and sign-out are audited under the token's name (`console.sign-in`,
///   `console.sign-out`); a refused token as `auth.failed`, as on the API.
enum Console {
    static let sessionCookie = "dredge_console"
    static let signInCookie = "dredge_console_csrf"
    static let securityHeaders: HTTPFields = [
        HTTPFields.Element.Name("Content-Security-Policy")!:
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        HTTPFields.Element.Name("X-Content-Type-Options")!: "nosniff",
        HTTPFields.Element.Name("Referrer-Policy")!: "same-origin",  // not no-referrer: browsers then post with `Origin: null`
        .cacheControl: "no-store",
    ]
    /// The largest form body read (a sign-in, a filter).
    static let maxFormBytes = 16 * 1024

    /// The cookie that holds the time zone the reader chose to see times in (an IANA name, set
    /// by the page's script from the browser's zone); without it, UTC.
    static let zoneCookie = "dredge_console_tz"

    /// The zone this request's pages show times in and read time fields in (``ConsoleZone``).
    @TaskLocal static var displayZone: TimeZone = TimeZone(identifier: "UTC") ?? .gmt

    /// The zone a `dredge_console_tz` value names, when it is a zone this server knows.
    static func zone(named name: String?) -> TimeZone? {
        guard let name, !name.isEmpty, name.utf8.count <= 64, name.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else { return nil }
        return TimeZone(identifier: name)
    }

    /// The actions pages run (every rule and audit entry is theirs: pages only render) and what
    /// pages read, with the console's own sessions.
    struct Dependencies {
        let actions: AdminActions
        let sessions: ConsoleSessions
        /// Whether the listener speaks TLS: cookies are then `Secure`.
        let secure: Bool
        /// The identity provider people may also sign in with; nil: tokens only.
        var sso: SingleSignOn? = nil
        /// The live tails this node's sessions started: signing out stops them.
        let startedTails = StartedTails()

        /// The index the log viewer searches; nil on a server that does not index.
        var records: (any RecordIndex)? { actions.services.records }
        var tokens: any TokenVault { actions.services.tokens }
        var logger: Logger { actions.services.logger }
    }

    static func register(on router: Router<AdminRequestContext>, _ d: Dependencies) throws {
        let library = try ConsoleTemplates.library()
        let console = router.group("console").add(middleware: ConsoleErrors(library: library, logger: d.logger)).add(middleware: ConsoleZone())

        console.get("") { _, _ in redirect("/console/agents") }
        for (name, type, content) in [
            ("console.css", "text/css; charset=utf-8", ConsoleTemplates.css), ("icon.svg", "image/svg+xml", ConsoleTemplates.icon),
            ("console.js", "text/javascript; charset=utf-8", ConsoleTemplates.script + ConsoleTemplates.liveScript),
        ] {
            console.get(RouterPath("static/" + name)) { _, _ in
                var headers = securityHeaders
                headers[.contentType] = type
                headers[.cacheControl] = "max-age=3600"
                return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: content)))
            }
        }

        console.get("sign-in") { request, _ in
            let back = returnPath(query(request)["return"])
            if try await checked(request, d, .whoami) != nil { return redirect(back ?? "/console/agents") }
            return signInPage(library, d, problem: nil, status: .ok, returnTo: back)
        }
        console.post("sign-in") { request, context in
            let form = try await formFields(request, context)
            guard sameOrigin(request, d) else { return forbidden(library, d) }
            guard let expected = request.cookies[signInCookie]?.value, let sent = form["csrf"], ConsoleSessions.same(expected, sent) else {
                return forbidden(library, d)
            }
            let token = form["token"] ?? "", back = returnPath(form["return"])
            guard !token.isEmpty, let caller = try await d.tokens.admin(for: token, now: d.sessions.now()) else {
                await d.actions.refusedToken("a token that is not an admin token (or has expired)", for: "the console's sign-in", from: context.remoteAddress ?? "?")
                return signInPage(library, d, problem: "That is not an admin token, or it has expired.", status: .unauthorized, returnTo: back)
            }
            // A session this browser held before ends: one at a time.
            if let old = request.cookies[sessionCookie]?.value { try await d.sessions.close(old) }
            // A sign-in the audit log cannot hold does not happen: its session ends at once (and
            // one that cannot be kept is never audited).
            let (id, session) = try await d.sessions.open(caller, token: token)
            do {
                try await d.actions.signedIn(caller, from: context.remoteAddress ?? "?")
            } catch {
                try await d.sessions.close(id)
                throw error
            }
            var response = redirect(back ?? "/console/agents")
            response.setCookie(
                Cookie(
                    name: sessionCookie, value: id, maxAge: max(1, Int(session.expires.timeIntervalSince(d.sessions.now()).rounded())), path: "/console", secure: d.secure,
                    httpOnly: true, sameSite: .strict))
            response.setCookie(expired(signInCookie, d))
            return response
        }
        console.post("sign-out") { request, context in
            let form = try await formFields(request, context)
            guard let id = request.cookies[sessionCookie]?.value, let session = try await d.sessions.session(id) else { return toSignIn(request) }
            guard sameOrigin(request, d), let sent = form["csrf"], ConsoleSessions.same(session.csrf, sent) else { return forbidden(library, d) }
            try await d.sessions.close(id)
            try await d.actions.signedOut(session.tokenName)
            // The engineer's session ended: so do the live tails they started in it.
            for tail in d.startedTails.take(ConsoleSessions.key(id)) {
                do {
                    _ = try await d.actions.stopTail(tail, by: session.caller, reason: "its console session ended")
                } catch let error as ActionError where error.kind == .conflict || error.kind == .notFound {
                    continue  // stopped or gone already
                } catch {
                    // Signing out goes on: the tail ends at its expiry, which is not past the session's.
                    d.logger.warning("a tail of a session signed out could not be stopped", metadata: ["tail.id": "\(tail)", "error": "\(error)"])
                }
            }
            // A person the identity provider signed in is signed out there too, when it can: by a
            // page that moves on (a form's redirect to another site is what `form-action 'self'` forbids).
            let provider = session.signedOn ? await d.sso?.endSessionURL() : nil
            var response =
                provider.map { html(library, "moving-on", ["title": "Signed out", "target": $0, "message": "Signed out of Dredge; now at your identity provider."]) }
                ?? redirect("/console/sign-in")
            response.setCookie(expired(sessionCookie, d))
            return response
        }

        console.get("agents") { request, _ in
            guard let session = try await checked(request, d, .listAgents) else { return toSignIn(request) }
            let query = (Console.query(request)["q"] ?? "").trimmingCharacters(in: .whitespaces)
            let all = try await d.actions.agents(for: session.caller)
            let shown = query.isEmpty ? all : all.filter { matches($0, query) }
            let rows = shown.sorted { ($0.connected ? 0 : 1, $0.hostname) < ($1.connected ? 0 : 1, $1.hostname) }.map(row)
            var page = signedInPage("Agents", session, current: "Agents")
            for (key, value) in [
                "query": query, "filtered": !query.isEmpty, "online": all.filter(\.connected).count, "total": all.count, "shown": shown.count, "rows": rows,
            ] as [String: Any] { page[key] = value }
            return html(library, "agents", page)
        }
        console.get("agents/:id") { request, context in
            guard let session = try await checked(request, d, .listAgents) else { return toSignIn(request) }
            let id = try context.parameters.require("id")
            let all = try await d.actions.agents(for: session.caller)
            guard let agent = all.first(where: { $0.agentID == id }) else {
                throw AdminAPIError(.notFound, "not_found", "There is no such agent.")
            }
            var page = signedInPage(agent.hostname.isEmpty ? "Agent \(id.prefix(8))" : agent.hostname, session, current: "Agents")
            for (key, value) in row(agent) { page[key] = value }
            page["os"] = agent.os.isEmpty ? "?" : agent.os
            page["enrolledAt"] = timeText(agent.enrolledAt)
            // NIO's form (`[IPv4]host/1.2.3.4:5678`) as people write it: `1.2.3.4:5678`.
            if let address = agent.remoteAddress { page["address"] = address.hasPrefix("[IPv") ? String(address.split(separator: "/").last ?? Substring(address)) : address }
            page["logs"] = url("/console/logs", [("host", agent.hostname)])
            if let revokedAt = agent.revokedAt {
                page["revokedAt"] = timeText(revokedAt)
                page["revokedBy"] = agent.revokedBy ?? "?"
            }
            page["users"] = agent.activeUIDs.map { uid in
                [
                    "uid": uid, "pull": url("/console/pulls/new", [("uid", uid)]), "pullHere": url("/console/pulls/new", [("uid", uid), ("agent", agent.agentID)]),
                    "logs": url("/console/logs", [("uid", uid)]), "watch": url("/console/tails/new", [("uid", uid), ("agent", agent.agentID)]),
                ]
            }
            if agent.reportedUsers > agent.activeUIDs.count {
                page["moreUsers"] = "The store holds \(agent.reportedUsers)\(agent.usersTruncated ? " or more" : "") users; those seen lately are listed. A pull by user id reaches every one of them."
            }
            let looked = 200
            let hosts = Dictionary(all.map { ($0.agentID, $0.hostname) }, uniquingKeysWith: { a, _ in a })
            page["looked"] = looked
            page["pulls"] = try await d.actions.pulls(limit: looked, disk: false, for: session.caller)
                .filter { $0.agentID == id || $0.targets.contains { $0.agentID == id } }.prefix(20).map { pullRow($0, hosts) }
            return html(library, "agent", page)
        }
        // Revoking a device asks first, with a reason for the audit log.
        console.get("agents/:id/revoke") { request, context in
            guard let session = try await checked(request, d, .revokeAgent) else { return toSignIn(request) }
            let id = try context.parameters.require("id")
            guard let agent = try await d.actions.agents(for: session.caller).first(where: { $0.agentID == id }) else {
                throw AdminAPIError(.notFound, "not_found", "There is no such agent.")
            }
            return html(library, "confirm", revokePage(agent, session))
        }
        console.post("agents/:id/revoke") { request, context in
            let form = try await formFields(request, context)
            let id = try context.parameters.require("id")
            return try await asPoster(request, form, library, d, .revokeAgent) { session in
                do {
                    _ = try await d.actions.revokeAgent(id, reason: form["reason"], by: session.caller)
                } catch let error as ActionError {
                    guard let agent = try await d.actions.agents(for: session.caller).first(where: { $0.agentID == id }) else { throw error }
                    var page = revokePage(agent, session)
                    page["problem"] = sentence(error)
                    return html(library, "confirm", page, status: AdminAPIError(error).status)
                }
                return redirect("/console/agents/\(id)")
            }
        }
        registerSingleSignOn(on: console, library, d)
        registerPulls(on: console, library, d)
        registerTails(on: console, library, d)
        registerTriggers(on: console, library, d)
        registerFeedback(on: console, library, d)
        registerLogs(on: console, library, d)
        registerRecords(on: console, library, d)
        registerFiles(on: console, library, d)
        registerAdministration(on: console, library, d)
        // Anything else under /console: a page, not the API's JSON.
        console.get("**") { _, _ -> Response in
            throw AdminAPIError(.notFound, "not_found", "There is no such page.")
        }
    }

    /// Whether a post comes from this console's own pages: a browser names the page's origin
    /// (`Origin`, and `Sec-Fetch-Site`). SameSite cookies do not tell ports or sibling hosts
    /// apart; this does. A request naming neither (not a browser) is left to the CSRF token.
    static func sameOrigin(_ request: Request, _ d: Dependencies) -> Bool {
        if let site = request.headers[HTTPFields.Element.Name("Sec-Fetch-Site")!], site != "same-origin" { return false }
        guard let origin = request.headers[.origin] else { return true }
        guard let authority = request.head.authority else { return false }
        return origin == (d.secure ? "https://" : "http://") + authority
    }

    // MARK: Pages

    static func row(_ a: AgentRecord) -> [String: Any] {
        var row = fields(a)
        // A section of an empty string is shown: an absent key is not.
        if !a.labels.isEmpty { row["labels"] = a.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ") }
        return row
    }

    /// The question before revoking a device.
    static func revokePage(_ agent: AgentRecord, _ session: ConsoleSessions.Session) -> [String: Any] {
        let name = agent.hostname.isEmpty ? "the agent \(agent.agentID.prefix(8))" : "\(agent.hostname) (\(agent.agentID.prefix(8)))"
        var page = signedInPage("Revoke a device", session, current: "Agents")
        page["heading"] = "Revoke \(name)?"
        page["question"] =
            "For a lost or stolen device, or a host taken out of service: its connection is closed at once, it may not connect again, and pulls no longer reach it. What it uploaded is kept. This cannot be undone: to use the device again, enroll it anew."
        page["action"] = "/console/agents/\(agent.agentID)/revoke"
        page["askReason"] = true
        page["button"] = "Revoke"
        page["back"] = "/console/agents/\(agent.agentID)"
        return page
    }

    static func fields(_ a: AgentRecord) -> [String: Any] {
        let users = a.activeUIDs.prefix(5).joined(separator: ", ") + (a.activeUIDs.count > 5 ? " +\(a.activeUIDs.count - 5)" : "")
        let reported = a.reportedUsers > a.activeUIDs.count ? " (\(a.reportedUsers)\(a.usersTruncated ? "+" : "") in the store)" : ""
        let lastSeen = a.lastHeartbeatAt ?? a.connectedAt ?? a.enrolledAt
        return [
            "status": a.revokedAt != nil ? "revoked" : a.connected ? "online" : "offline", "host": a.hostname.isEmpty ? "?" : a.hostname,
            "app": [a.app, a.appVersion].filter { !$0.isEmpty }.joined(separator: " "), "users": users + reported, "records": "\(a.storeRecords)",
            "lastSeen": timeText(lastSeen), "agentID": a.agentID, "shortID": String(a.agentID.prefix(8)),
        ]
    }

    /// Case-insensitive, in the host, labels, app, OS, id and the users seen.
    static func matches(_ a: AgentRecord, _ query: String) -> Bool {
        let fields = [a.hostname, a.app, a.appVersion, a.os, a.agentID] + a.activeUIDs + a.labels.map { "\($0.key)=\($0.value)" }
        return fields.contains { $0.range(of: query, options: [.caseInsensitive, .diacriticInsensitive]) != nil }
    }

    static func signInPage(_ library: MustacheLibrary, _ d: Dependencies, problem: String?, status: HTTPResponse.Status, returnTo: String? = nil) -> Response {
        let csrf = ConsoleSessions.randomToken()
        let minutes = Int(d.sessions.lifetime / 60)
        let lasts = minutes % 60 == 0 ? "\(minutes / 60) hour\(minutes == 60 ? "" : "s")" : "\(minutes) minute\(minutes == 1 ? "" : "s")"
        var page: [String: Any] = ["title": "Sign in", "csrf": csrf, "lasts": lasts]
        if d.sso != nil { page["sso"] = url("/console/sso/start", returnTo.map { [("return", $0)] } ?? []) }
        if let problem { page["problem"] = problem }
        if let returnTo { page["return"] = returnTo }
        var response = html(library, "sign-in", page, status: status)
        response.setCookie(Cookie(name: signInCookie, value: csrf, maxAge: 3600, path: "/console", secure: d.secure, httpOnly: true, sameSite: .strict))
        return response
    }

    static func forbidden(_ library: MustacheLibrary, _ d: Dependencies) -> Response {
        signInPage(library, d, problem: "The form had expired or did not come from this console; nothing was done. Try again.", status: .forbidden)
    }

    static func html(_ library: MustacheLibrary, _ template: String, _ page: [String: Any], status: HTTPResponse.Status = .ok) -> Response {
        var headers = securityHeaders
        headers[.contentType] = "text/html; charset=utf-8"
        let body = library.render(page, withTemplate: template) ?? ""
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: body)))
    }

    /// The sign-in page for a request without a session; a page asked for (GET) is named in
    /// `return`, so that signing in leads back to it (a permalink opened from elsewhere: the
    /// SameSite=Strict cookie is not sent with a link followed from another site).
    static func toSignIn(_ request: Request) -> Response {
        guard request.method == .get || request.method == .head, let back = returnPath(request.uri.path + (request.uri.query.map { "?" + $0 } ?? "")) else {
            return redirect("/console/sign-in")
        }
        return redirect("/console/sign-in?return=" + percentEncoded(back))
    }

    /// Where signing in may lead: a console page of this server (a path under `/console/`,
    /// not sign-in itself, at most 2 KB, printable ASCII); nil otherwise.
    static func returnPath(_ path: String?) -> String? {
        guard let path, path.hasPrefix("/console/"), !path.hasPrefix("/console/sign-"), !path.hasPrefix("/console/sso/"), path.utf8.count <= 2048,
            path.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F && $0 != "\\" })
        else { return nil }
        return path
    }

    /// A console path with a query string, every name and value percent-encoded but for the
    /// unreserved characters (a `+` in a value is `%2B`: the console reads `+` as a space).
    static func url(_ path: String, _ items: [(String, String)]) -> String {
        items.isEmpty ? path : path + "?" + items.map { percentEncoded($0.0) + "=" + percentEncoded($0.1) }.joined(separator: "&")
    }

    /// The query string's fields as a form's (`+` is a space), the first of a name given twice.
    static func query(_ request: Request) -> [String: String] {
        fields(request.uri.query ?? "")
    }

    static func redirect(_ location: String) -> Response {
        var headers = securityHeaders
        headers[.location] = location
        return Response(status: .seeOther, headers: headers)
    }

    static func expired(_ name: String, _ d: Dependencies) -> Cookie {
        Cookie(name: name, value: "", maxAge: 0, path: "/console", secure: d.secure, httpOnly: true, sameSite: .strict)
    }

    // MARK: Sessions and forms

    /// The session of the request's cookie, if live: not expired, signed out, or ended with
    /// its token (``ConsoleSessions/session(_:)`` checks the token on every request).
    /// The request's live session, once its role may do `operation` (``AdminOperation``, the
    /// table the API checks too: a refusal is a 403 page, audited); nil when not signed in.
    /// Every signed-in page asks through here, naming what it does.
    static func checked(_ request: Request, _ d: Dependencies, _ operation: AdminOperation) async throws -> ConsoleSessions.Session? {
        guard let id = request.cookies[sessionCookie]?.value, let session = try await d.sessions.session(id) else { return nil }
        // A person the identity provider signed in has no session once single sign-on is off.
        if session.signedOn, d.sso == nil { return nil }
        try await d.actions.authorize(operation, session.caller, on: "\(request.method) \(ConnectionUploads.bounded(request.uri.path))")
        return session
    }

    /// An `application/x-www-form-urlencoded` body's fields (the first of a name given twice).
    static func formFields(_ request: Request, _ context: AdminRequestContext) async throws -> [String: String] {
        let body: ByteBuffer
        do {
            body = try await request.body.collect(upTo: maxFormBytes)
        } catch {
            throw AdminAPIError(.contentTooLarge, "bad_request", "The form was larger than \(maxFormBytes) bytes.")
        }
        return fields(String(buffer: body))
    }

    /// `application/x-www-form-urlencoded` text's fields (the first of a name given twice; a
    /// pair that does not decode is left out).
    static func fields(_ text: String) -> [String: String] {
        var fields: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decoded(_ s: Substring) -> String? { s.replacingOccurrences(of: "+", with: " ").removingPercentEncoding }
            guard let name = parts.first.flatMap(decoded), let value = decoded(parts.count > 1 ? parts[1] : "") else { continue }
            if fields[name] == nil { fields[name] = value }
        }
        return fields
    }

}

/// Runs each console request in the time zone its reader chose (the `dredge_console_tz`
/// cookie), UTC otherwise: every time a page shows and every time field it reads.
struct ConsoleZone: RouterMiddleware {
    typealias Context = AdminRequestContext

    func handle(_ request: Request, context: AdminRequestContext, next: (Request, AdminRequestContext) async throws -> Response) async throws -> Response {
        guard let zone = Console.zone(named: request.cookies[Console.zoneCookie]?.value) else { return try await next(request, context) }
        return try await Console.$displayZone.withValue(zone) { try await next(request, context) }
    }
}

/// Every error under /console as a page with the console's headers (not the API's JSON): the
/// status and message of an ``AdminAPIError`` or Hummingbird's own, and for anything else a
/// 500 without details (logged).
struct ConsoleErrors: RouterMiddleware {
    typealias Context = AdminRequestContext
    let library: MustacheLibrary
    let logger: Logger

    func handle(_ request: Request, context: AdminRequestContext, next: (Request, AdminRequestContext) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as AdminAPIError {
            return page(error.status, error.message)
        } catch let error as ActionError {
            let shown = AdminAPIError(error)
            return page(shown.status, Console.sentence(error))
        } catch let error as HTTPError {
            return page(error.status, error.status == .notFound ? "There is no such page." : "The request could not be read.")
        } catch {
            logger.error("console page failed", metadata: ["path": "\(ConnectionUploads.bounded(request.uri.path))", "error": "\(error)"])
            return page(.internalServerError, "The server could not answer; the error is in its log.")
        }
    }

    func page(_ status: HTTPResponse.Status, _ message: String) -> Response {
        Console.html(library, "error", ["title": "\(status.code)", "heading": "\(status.code) \(status.reasonPhrase)", "message": message], status: status)
    }
}
