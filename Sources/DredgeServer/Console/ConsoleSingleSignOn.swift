import DredgeAdminAPI
import Foundation
import Hummingbird
import Mustache

/// The console's sign-in through the company's identity provider (``SingleSignOn``, #55):
/// `/console/sso/start` sends the browser there, `/console/sso/callback` takes it back. A
/// person whose groups give a role in Dredge gets a session with that role and scope (no token
/// behind it), audited as `console.sign-in`; one whose groups give none is refused (403) and
/// recorded as `auth.failed`.
extension Console {
    static func registerSingleSignOn(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        console.get("sso/start") { request, _ in
            guard let sso = d.sso else { throw AdminAPIError(.notFound, "not_found", "This console has no single sign-on.") }
            let (url, pending) = try await sso.start(returnTo: returnPath(query(request)["return"]))
            var response = Response(status: .seeOther, headers: securityHeaders)
            response.headers[.location] = url
            // Lax, not Strict: it must come back with the provider's redirect, a navigation from another site.
            response.setCookie(
                Cookie(
                    name: SingleSignOn.cookie, value: pending, maxAge: Int(SingleSignOn.pendingSeconds), path: "/console/sso", secure: d.secure, httpOnly: true,
                    sameSite: .lax))
            return response
        }
        console.get("sso/callback") { request, context in
            guard let sso = d.sso else { throw AdminAPIError(.notFound, "not_found", "This console has no single sign-on.") }
            let fields = query(request)
            var done = Response(status: .ok)
            func page(_ problem: String, _ status: HTTPResponse.Status) -> Response {
                var response = signInPage(library, d, problem: problem, status: status)
                response.setCookie(Cookie(name: SingleSignOn.cookie, value: "", maxAge: 0, path: "/console/sso", secure: d.secure, httpOnly: true, sameSite: .lax))
                return response
            }
            if let error = fields["error"] {
                // The code alone (anyone can send a browser here with any text): the provider's own words stay off the page.
                let code = error.unicodeScalars.allSatisfy({ ("a"..."z").contains($0) || $0 == "_" }) ? String(error.prefix(64)) : "an error"
                return page("The identity provider did not sign you in (\(code)).", .unauthorized)
            }
            guard let code = fields["code"], let state = fields["state"] else { return page("The identity provider's answer had no code: start again.", .badRequest) }
            let person: SignedInPerson
            let returnTo: String?
            do {
                (person, returnTo) = try await sso.finish(code: code, state: state, cookie: request.cookies[SingleSignOn.cookie]?.value)
            } catch {
                // The provider unreachable or refusing, a forged or stale cookie, a token that does not verify.
                let said = (error as? SingleSignOnError)?.description ?? "the sign-in failed: \(error)"
                d.logger.warning("single sign-on failed", metadata: ["error": "\(said)"])
                await d.actions.refusedToken("a single sign-on that failed (\(said.prefix(300)))", for: "the console's single sign-on", from: context.remoteAddress ?? "?")
                return page(error is SingleSignOnError ? sentence(said) : "The sign-in failed; the server's log says why.", .unauthorized)
            }
            guard let caller = sso.caller(for: person, until: d.sessions.now().addingTimeInterval(d.sessions.lifetime)) else {
                await d.actions.refusedToken(
                    "\(person.name) (\(person.shown); groups \(person.groups.prefix(20).joined(separator: ", ").prefix(300))), whose groups and claims give no role or no scope",
                    for: "the console's single sign-on", from: context.remoteAddress ?? "?")
                return page(
                    "You are signed in at the identity provider as \(person.shown), but none of your groups gives a role in Dredge (or your scope claim is missing).",
                    .forbidden)
            }
            if let old = request.cookies[sessionCookie]?.value { try await d.sessions.close(old) }
            let (id, session) = try await d.sessions.open(signedOn: caller)
            do {
                try await d.actions.signedIn(caller, from: (context.remoteAddress ?? "?") + " through single sign-on (\(person.shown))")
            } catch {
                try await d.sessions.close(id)
                throw error
            }
            // A page that moves on by itself, not a redirect: the browser came here from the
            // provider's site, and a redirect would carry on that cross-site navigation, on which
            // the session's SameSite=Strict cookie is not sent; a move from this page is the console's own.
            // The return path is checked again: the cookie it came back in is the browser's to change.
            done = html(library, "moving-on", ["title": "Signed in", "target": returnPath(returnTo) ?? "/console/agents", "message": "Signed in as \(person.shown)."])
            done.setCookie(
                Cookie(
                    name: sessionCookie, value: id, maxAge: max(1, Int(session.expires.timeIntervalSince(d.sessions.now()).rounded())), path: "/console", secure: d.secure,
                    httpOnly: true, sameSite: .strict))
            done.setCookie(Cookie(name: SingleSignOn.cookie, value: "", maxAge: 0, path: "/console/sso", secure: d.secure, httpOnly: true, sameSite: .lax))
            return done
        }
    }
}
