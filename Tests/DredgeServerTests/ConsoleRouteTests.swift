import DredgeAdminAPI
import DredgeAdminClient
import DredgeDomain
import DredgeEnvelope
@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import Synchronization
import Testing

/// The web console's sign-in, sessions and pages over HTTP, in process (`HummingbirdTesting`):
/// what a browser is sent and what it must send back. The pages in a real browser are the
/// browser tests' part.
@Suite struct ConsoleRouteTests {
    /// A clock the test moves.
    final class Clock: Sendable {
        private let time = Mutex(Date())
        func now() -> Date { time.withLock { $0 } }
        func advance(_ seconds: TimeInterval) { time.withLock { $0 = $0.addingTimeInterval(seconds) } }
    }

    struct Browser {
        let client: any TestClientProtocol
        /// The cookies it holds, by name.
        var cookies: [String: String] = [:]

        struct Page {
            var status: HTTPResponse.Status
            var headers: HTTPFields
            var body: String
            var location: String? { headers[.location] }
            /// The value of the first hidden `csrf` field.
            var csrf: String? {
                guard let range = body.range(of: #"name="csrf" value=""#) else { return nil }
                return String(body[range.upperBound...].prefix { $0 != "\"" })
            }
        }

        mutating func get(_ uri: String) async throws -> Page { try await send(.get, uri, form: nil) }

        mutating func post(_ uri: String, _ form: [String: String]) async throws -> Page { try await send(.post, uri, form: form) }

        mutating func send(_ method: HTTPRequest.Method, _ uri: String, form: [String: String]?) async throws -> Page {
            var headers: HTTPFields = [:]
            if !cookies.isEmpty { headers[.cookie] = cookies.map { "\($0.key)=\($0.value)" }.joined(separator: "; ") }
            var body: ByteBuffer?
            if let form {
                headers[.contentType] = "application/x-www-form-urlencoded"
                var allowed = CharacterSet.alphanumerics
                allowed.insert(charactersIn: "-._~")
                body = ByteBuffer(
                    string: form.map { "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: allowed) ?? "")" }.joined(separator: "&"))
            }
            let page = try await client.execute(uri: uri, method: method, headers: headers, body: body) { response in
                Page(status: response.status, headers: response.headers, body: String(buffer: response.body))
            }
            for line in page.headers[values: .setCookie] {
                let pair = line.split(separator: ";", maxSplits: 1)[0].split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let name = String(pair[0]), value = pair.count > 1 ? String(pair[1]) : ""
                if line.contains("Max-Age=0") || value.isEmpty { cookies[name] = nil } else { cookies[name] = value }
            }
            return page
        }

        /// Signs in with `token` through the form, as a browser does.
        mutating func signIn(_ token: String) async throws -> Page {
            let form = try await get("/console/sign-in")
            return try await post("/console/sign-in", ["token": token, "csrf": form.csrf ?? ""])
        }
    }

    struct Fixture {
        let admin = try! AdminRouteTests.Fixture()
        let clock = Clock()
        let records: SQLiteRecordIndex

        init() {
            records = try! SQLiteRecordIndex(directory: admin.data)
        }

        /// A pull's records landed and indexed, as the server does when its files arrive.
        func land(_ source: IndexedSource, _ lines: [String]) async throws {
            let paths = DataDirectory(admin.data)
            try RecordSearchTests.land(paths, source, days: ["2027-01-15.jsonl": lines])
            try await Indexer(index: records, registry: nil, paths: paths, logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }).index(source)
        }

        /// Runs `body` against a console over the fixture's stores; `tokens`: another vault
        /// instead of the fixture's (one opened anew on its database: a restarted server).
        /// `cookies`: what the browser holds at first. Returns the cookies it holds at the end.
        @discardableResult
        func test(
            tokens: (any TokenVault)? = nil, cookies: [String: String] = [:], approvals: ApprovalSettings = ApprovalSettings(), sso: SingleSignOn? = nil,
            _ body: @Sendable (inout Browser) async throws -> Void
        ) async throws -> [String: String] {
            let logger = Logger(label: "test.console") { _ in SwiftLogNoOpLogHandler() }
            let clock = clock
            let a = admin
            let services = AdminServices(
                registry: a.registry, pulls: a.pulls, audit: a.pulls, issuer: a.issuer, feedback: a.feedback, tokens: tokens ?? a.tokens,
                dispatcher: PullDispatcher(pulls: a.pulls, logger: logger), records: records,
                files: PullFiles(paths: DataDirectory(a.data), pulls: a.pulls, feedback: a.feedback), results: a.results, approvals: approvals, logger: logger)
            let app = try AdminAPI.application(
                actions: AdminActions(services), consoleSessions: ConsoleSessions(vault: services.tokens, lifetime: 3600, now: { clock.now() }), port: 0,
                singleSignOn: sso)
            return try await app.test(.router) { client in
                var browser = Browser(client: client, cookies: cookies)
                try await body(&browser)
                return browser.cookies
            }
        }

        func audit(_ action: String) async throws -> [AuditEntry] { try await admin.pulls.audit(AuditQuery(action: action)) }
    }

    /// A token `dredge login --sso` made signs in to the console too, as its person, and the
    /// session lives with the token (found by the token, whatever name it signs in as).
    @Test func aTokenSingleSignOnMadeSignsInToTheConsole() async throws {
        let fixture = Fixture()
        let made = try await fixture.admin.tokens.create(
            name: TokenLimits.signedOnName(subject: "auth0|42"), kind: .admin,
            limits: TokenLimits(expiresAt: Date().addingTimeInterval(3600), role: .investigator, signedOn: true), now: Date())
        try await fixture.test { browser in
            let signedIn = try await browser.signIn(made.token)
            #expect(signedIn.status == .seeOther && signedIn.location == "/console/agents", "\(signedIn.body)")
            let agents = try await browser.get("/console/agents")
            #expect(agents.status == .ok && agents.body.contains("sso:auth0|42") && agents.body.contains("(investigator)"), "\(agents.body)")
            #expect(try await browser.get("/console/pulls/new").status == .ok)
        }
        // Revoked, the session ends with it.
        try await fixture.admin.tokens.revoke(name: made.info.name, kind: .admin)
        let signIns = try await fixture.audit("console.sign-in")
        #expect(signIns.map(\.actor) == ["sso:auth0|42"])
    }

    @Test func pagesWithoutASessionSendTheBrowserToSignIn() async throws {
        try await Fixture().test { browser in
            for uri in ["/console/agents", "/console/agents?q=x"] {
                let page = try await browser.get(uri)
                #expect(page.status == .seeOther && page.location?.hasPrefix("/console/sign-in?return=") == true, "\(uri)")
            }
            #expect(try await browser.get("/console").location == "/console/agents")
            // #50: the listener's root leads to the console.
            let root = try await browser.get("/")
            #expect(root.status == .seeOther && root.location == "/console/")
            // A post without a session (a stale tab), and a page too long to come back to: sign in.
            #expect(try await browser.post("/console/sign-out", [:]).location == "/console/sign-in")
            #expect(try await browser.post("/console/tokens", ["name": "x", "csrf": "y"]).location == "/console/sign-in")
            let long = try await browser.get("/console/logs?text=" + String(repeating: "a", count: 3000))
            #expect(long.status == .seeOther && long.location == "/console/sign-in")
            let signIn = try await browser.get("/console/sign-in")
            #expect(signIn.status == .ok && signIn.body.contains(#"<form class="sign-in""#))
            let policy = try #require(signIn.headers[HTTPFields.Element.Name("Content-Security-Policy")!])
            #expect(!policy.contains("unsafe-inline") && policy.contains("default-src 'none'") && policy.contains("frame-ancestors 'none'"))
            let scripts = signIn.body.components(separatedBy: "<script").dropFirst()
            #expect(scripts.allSatisfy { $0.hasPrefix(#" src="/console/static/console.js" defer></script>"#) } && !signIn.body.contains("style="), "no inline script or style")
            let css = try await browser.get("/console/static/console.css")
            #expect(css.status == .ok && css.headers[.contentType]?.hasPrefix("text/css") == true)
        }
    }

    /// A page opened without a session (a permalink followed from elsewhere: the strict cookie
    /// is not sent) leads back to itself after signing in; anything but a console page is not
    /// a place sign-in leads to.
    @Test func signingInLeadsBackToThePageAskedFor() async throws {
        let fixture = Fixture()
        try await fixture.test { browser in
            let asked = try await browser.get("/console/records/42?x=a%20b")
            #expect(asked.location == "/console/sign-in?return=%2Fconsole%2Frecords%2F42%3Fx%3Da%2520b")
            let form = try await browser.get(try #require(asked.location))
            #expect(form.body.contains(#"<input type="hidden" name="return" value="/console/records/42?x=a%20b">"#))
            let signedIn = try await browser.post("/console/sign-in", ["token": fixture.admin.created.adminToken, "csrf": form.csrf ?? "", "return": "/console/records/42?x=a%20b"])
            #expect(signedIn.location == "/console/records/42?x=a%20b")
            #expect(try await browser.get("/console/sign-in?return=/console/pulls").location == "/console/pulls", "already signed in: straight there")
            for hostile in ["//evil.example/console/", "https://evil.example/", "/console\\@evil.example", "/v1/tokens", "/console/sign-out", "/console/x\u{0}y"] {
                var other = Browser(client: browser.client)
                let page = try await other.get("/console/sign-in")
                let answer = try await other.post("/console/sign-in", ["token": fixture.admin.created.adminToken, "csrf": page.csrf ?? "", "return": hostile])
                #expect(answer.location == "/console/agents", "\(hostile.debugDescription)")
            }
        }
    }

    /// #50: sessions are kept in the database with hashes only, so a restarted server (a vault
    /// opened anew on the same database) keeps everyone signed in, with the same CSRF token;
    /// signing out there ends the session for good.
    @Test func aSessionOutlivesARestartOfTheServer() async throws {
        let fixture = Fixture()
        let cookies = try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            #expect(try await browser.get("/console/agents").status == .ok)
        }
        let id = try #require(cookies[Console.sessionCookie])
        // Nothing in the database signs anyone in: neither the id nor the token is kept.
        let kept = try await ServerDatabase(directory: fixture.admin.data).pool.read { db in
            try String.fetchAll(db, sql: "SELECT key || ' ' || token_sha256 || ' ' || token_name FROM console_session")
        }
        #expect(kept == ["\(ConsoleSessions.key(id)) \(TokenFile.hash(fixture.admin.created.adminToken)) admin"])
        let row = try #require(kept.first)
        #expect(!row.contains(id) && !row.contains(fixture.admin.created.adminToken))

        let restarted = SQLiteTokenVault(try ServerDatabase(directory: fixture.admin.data))
        let after = try await fixture.test(tokens: restarted, cookies: cookies) { browser in
            let agents = try await browser.get("/console/agents")
            #expect(agents.status == .ok && agents.body.contains("<h1>Agents</h1>"), "still signed in after the restart")
            let id = try #require(browser.cookies[Console.sessionCookie])
            #expect(agents.csrf == ConsoleSessions.csrf(id))
            let out = try await browser.post("/console/sign-out", ["csrf": agents.csrf ?? ""])
            #expect(out.location == "/console/sign-in")
        }
        #expect(after[Console.sessionCookie] == nil)
        try await fixture.test(cookies: cookies) { browser in
            let page = try await browser.get("/console/agents")
            #expect(page.status == .seeOther, "signed out on one server instance: out on every one")
        }
    }

    @Test func signingInSetsAStrictSessionCookieAndSigningOutEndsIt() async throws {
        let fixture = Fixture()
        let token = fixture.admin.created.adminToken
        try await fixture.test { browser in
            let signedIn = try await browser.signIn(token)
            #expect(signedIn.status == .seeOther && signedIn.location == "/console/agents")
            let cookie = try #require(signedIn.headers[values: .setCookie].first { $0.hasPrefix("dredge_console=") })
            for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age=3600"] { #expect(cookie.contains(attribute), "\(cookie)") }
            #expect(!cookie.contains("Secure"), "plain HTTP on loopback: a Secure cookie would never come back")
            let agents = try await browser.get("/console/agents")
            #expect(agents.status == .ok && agents.body.contains("<h1>Agents</h1>") && agents.body.contains("admin"))
            let csrf = try #require(agents.csrf)

            // Signing out needs the session's CSRF token.
            let forged = try await browser.post("/console/sign-out", ["csrf": String(repeating: "0", count: 64)])
            #expect(forged.status == .forbidden)
            #expect(try await browser.get("/console/agents").status == .ok, "still signed in")
            let out = try await browser.post("/console/sign-out", ["csrf": csrf])
            #expect(out.status == .seeOther && out.location == "/console/sign-in")
            #expect(browser.cookies["dredge_console"] == nil, "the cookie is cleared")
        }
        // The old cookie, replayed after signing out, is refused.
        try await fixture.test { browser in
            _ = try await browser.signIn(token)
            let stolen = try #require(browser.cookies["dredge_console"])
            let csrf = try #require(try await browser.get("/console/agents").csrf)
            _ = try await browser.post("/console/sign-out", ["csrf": csrf])
            browser.cookies["dredge_console"] = stolen
            #expect(try await browser.get("/console/agents").location?.hasPrefix("/console/sign-in?return=") == true)
        }
        #expect(try await fixture.audit("console.sign-in").count == 2)
        #expect(try await fixture.audit("console.sign-out").map(\.actor) == ["admin", "admin"])
    }

    @Test func aSignInFormWithoutItsCSRFTokenOrWithAWrongTokenIsRefused() async throws {
        let fixture = Fixture()
        let token = fixture.admin.created.adminToken
        try await fixture.test { browser in
            // A post from elsewhere: no sign-in cookie, or a token that is not the cookie's.
            let noCookie = try await browser.post("/console/sign-in", ["token": token, "csrf": "x"])
            #expect(noCookie.status == .forbidden && browser.cookies["dredge_console"] == nil)
            _ = try await browser.get("/console/sign-in")
            let wrongCSRF = try await browser.post("/console/sign-in", ["token": token, "csrf": String(repeating: "a", count: 64)])
            #expect(wrongCSRF.status == .forbidden && browser.cookies["dredge_console"] == nil)
            // Not an admin token.
            let wrong = try await browser.signIn("dredge_adm_not-a-token")
            #expect(wrong.status == .unauthorized && wrong.body.contains(#"class="problem""#))
            #expect(browser.cookies["dredge_console"] == nil)
            #expect(try await browser.get("/console/agents").location?.hasPrefix("/console/sign-in?return=") == true)
        }
        #expect(try await fixture.audit("auth.failed").count == 1)
        #expect(try await fixture.audit("console.sign-in").isEmpty)
    }

    /// A post naming another origin (another port of the same host, a sibling site: SameSite
    /// does not tell them apart) is refused, even with the right CSRF token.
    @Test func postsFromAnotherOriginAreRefused() async throws {
        let fixture = Fixture()
        try await fixture.test { browser in
            let form = try await browser.get("/console/sign-in")
            let csrf = try #require(form.csrf)
            let cookie = try #require(browser.cookies["dredge_console_csrf"])
            for (name, value) in [("Origin", "http://127.0.0.1:9999"), ("Sec-Fetch-Site", "same-site")] {
                var headers: HTTPFields = [.cookie: "dredge_console_csrf=\(cookie)", .contentType: "application/x-www-form-urlencoded"]
                headers[HTTPFields.Element.Name(name)!] = value
                let body = ByteBuffer(string: "token=\(fixture.admin.created.adminToken)&csrf=\(csrf)")
                let status = try await browser.client.execute(uri: "/console/sign-in", method: .post, headers: headers, body: body) { $0.status }
                #expect(status == .forbidden, "\(name): \(value)")
            }
        }
        #expect(try await fixture.audit("console.sign-in").isEmpty)
    }

    /// Errors under /console are pages with the console's headers, not the API's JSON.
    @Test func errorsArePagesWithTheSameHeaders() async throws {
        try await Fixture().test { browser in
            let missing = try await browser.get("/console/no-such-page")
            let large = try await browser.post("/console/sign-in", ["token": String(repeating: "x", count: 20_000), "csrf": "x"])
            for (page, status) in [(missing, HTTPResponse.Status.notFound), (large, .contentTooLarge)] {
                #expect(page.status == status)
                #expect(page.headers[.contentType]?.hasPrefix("text/html") == true)
                #expect(page.headers[HTTPFields.Element.Name("Content-Security-Policy")!]?.contains("default-src 'none'") == true)
            }
        }
    }

    @Test func aSessionEndsAtItsExpiryAndWhenItsTokenIsRevoked() async throws {
        let fixture = Fixture()
        let second = try await fixture.admin.tokens.create(name: "bob", kind: .admin, now: Date())
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            fixture.clock.advance(3599)
            #expect(try await browser.get("/console/agents").status == .ok)
            fixture.clock.advance(2)
            #expect(try await browser.get("/console/agents").location?.hasPrefix("/console/sign-in?return=") == true, "expired")

            _ = try await browser.signIn(second.token)
            #expect(try await browser.get("/console/agents").status == .ok)
            try await fixture.admin.tokens.revoke(name: "bob", kind: .admin)
            #expect(try await browser.get("/console/agents").location?.hasPrefix("/console/sign-in?return=") == true, "its token was revoked")
        }
    }

    /// Whatever an agent says of itself (its host name, labels, app, users) is shown as text.
    @Test func hostileTextFromAgentsRendersInert() async throws {
        let fixture = Fixture()
        let key = try RSAPrivateKey.generate()
        let hostile = #"<script>alert(1)</script>"#, attribute = #""><img src=x onerror=alert(1)>"#
        // Characters that join the next or the previous one into a grapheme cluster: an escaper
        // working by Character lets the `<` and the `"` through.
        let joined = "\u{600}<b>bold</b>", accent = "\"\u{301} autofocus onfocus=alert(1) x=\u{301}\""
        let id = try await fixture.admin.registry.enroll(publicKey: key.publicKey, host: .with { $0.hostname = hostile })
        try await fixture.admin.registry.heartbeat(id, .with { $0.activeUids = [attribute, "javascript:alert(1)", joined, accent] })
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let page = try await browser.get("/console/agents")
            #expect(page.status == .ok)
            #expect(!page.body.contains(hostile) && page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"))
            #expect(!page.body.contains("<img") && page.body.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"))
            #expect(!page.body.contains("href=\"javascript:"))
            // Compared as bytes: as Swift strings, "<b>" is not "in" "\u{600}<b>" (another grapheme cluster).
            func holds(_ text: String) -> Bool { Data(page.body.utf8).range(of: Data(text.utf8)) != nil }
            #expect(!holds("<b>") && holds("\u{600}&lt;b&gt;bold&lt;/b&gt;"))
            #expect(!holds("\"\u{301} autofocus") && holds("&quot;\u{301} autofocus"))
            // The filter's own text comes back escaped too.
            let filtered = try await browser.get("/console/agents?q=%22%3E%3Cscript%3E")
            #expect(!filtered.body.contains("\"><script>") && filtered.body.contains("value=\"&quot;&gt;&lt;script&gt;\""))
        }
    }

    /// A token made in the console is shown once, works, and is audited under the session's
    /// token; a form without the CSRF token makes nothing; revoking works as on the API (not
    /// the last admin token) and one's own ends the session.
    @Test func tokensAreMadeShownOnceAndRevoked() async throws {
        let fixture = Fixture()
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let page = try await browser.get("/console/tokens")
            let csrf = try #require(page.csrf)
            #expect(page.status == .ok && page.body.contains("<td data-label=\"Name\">admin <small>(this session's)</small></td>"))

            let forged = try await browser.post("/console/tokens", ["name": "mallory", "kind": "admin"])
            #expect(forged.status == .forbidden)
            let bad = try await browser.post("/console/tokens", ["name": "no spaces", "kind": "admin", "csrf": csrf])
            #expect(bad.status == .badRequest && bad.body.contains(#"class="problem""#))
            #expect(try await fixture.admin.tokens.list().allSatisfy { $0.name != "mallory" && $0.name != "no spaces" }, "nothing was made")

            let noRole = try await browser.post("/console/tokens", ["name": "carol", "kind": "admin", "csrf": csrf])
            #expect(noRole.status == .badRequest, "a token without a role is not made an admin")
            let made = try await browser.post("/console/tokens", ["name": "carol", "kind": "admin", "role": "admin", "csrf": csrf])
            #expect(made.status == .ok)
            let shown = try #require(made.body.range(of: #"<code class="token">"#).map { String(made.body[$0.upperBound...].prefix { $0 != "<" }) })
            #expect(try await fixture.admin.tokens.admin(for: shown, now: Date())?.name == "carol", "the token shown is the one made")
            #expect(try await browser.get("/console/tokens").body.contains(shown) == false, "shown once")

            // Revoking asks first: the list links to a question, which changes nothing.
            let list = try await browser.get("/console/tokens")
            #expect(list.body.contains(#"href="/console/tokens/revoke?kind=admin&amp;name=carol""#))
            let ask = "/console/tokens/revoke?kind=admin&name=carol"
            let question = try await browser.get(ask)
            #expect(question.status == .ok && question.body.contains("Revoke the admin token “carol”?"))
            #expect(question.body.contains(#"<form class="confirm" method="post" action="/console/tokens/revoke">"#))
            #expect(question.body.contains(#"name="name" value="carol""#) && question.body.contains(#"href="/console/tokens">Cancel</a>"#))
            #expect(try await fixture.admin.tokens.list().contains { $0.name == "carol" }, "asking revokes nothing")
            #expect(try await browser.get("/console/tokens/revoke?kind=admin&name=nobody").status == .notFound)
            #expect(try await browser.get("/console/tokens/revoke?kind=root&name=carol").status == .badRequest)
            let ownQuestion = try await browser.get("/console/tokens/revoke?kind=admin&name=admin")
            #expect(ownQuestion.body.contains("this session ends at once"))

            // The last admin token cannot go; bob's can; then one's own ends the session.
            let other = try await browser.post("/console/tokens/revoke", ["name": "carol", "kind": "admin", "csrf": csrf])
            #expect(other.status == .seeOther && other.location == "/console/tokens")
            let last = try await browser.post("/console/tokens/revoke", ["name": "admin", "kind": "admin", "csrf": csrf])
            #expect(last.status == .conflict && last.body.contains(#"class="problem""#))
            _ = try await fixture.admin.tokens.create(name: "dave", kind: .admin, now: Date())
            let own = try await browser.post("/console/tokens/revoke", ["name": "admin", "kind": "admin", "csrf": csrf])
            #expect(own.status == .seeOther)
            #expect(try await browser.get("/console/tokens").location?.hasPrefix("/console/sign-in?return=") == true)
        }
        #expect(try await fixture.audit("token.create").map(\.detail) == ["admin token 'carol', role admin"])
        #expect(try await fixture.audit("token.revoke").map(\.actor) == ["admin", "admin"])
        #expect(try await fixture.admin.tokens.list().filter { $0.kind == .admin }.map(\.name) == ["dave"])
    }

    /// Revoking a device asks first (with a reason for the audit log), needs the page's CSRF
    /// token, and then shows the device as revoked, with no way left to pull it.
    @Test func aDeviceIsRevokedFromItsPage() async throws {
        let fixture = Fixture()
        let registry = fixture.admin.registry
        let id = try await registry.enroll(publicKey: AgentDirectoryConformanceTests.keys[0].publicKey, host: AgentDirectoryConformanceTests.host, now: Date())
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let before = try await browser.get("/console/agents/\(id)")
            let csrf = try #require(before.csrf)
            #expect(before.body.contains(#"href="/console/agents/\#(id)/revoke">Revoke this device…</a>"#) && before.body.contains("Pull this device"))
            let question = try await browser.get("/console/agents/\(id)/revoke")
            #expect(question.status == .ok && question.body.contains("Revoke kitchen (\(id.prefix(8)))?") && question.body.contains(#"name="reason""#))
            #expect(try await !registry.isRevoked(id), "asking revokes nothing")
            #expect(try await browser.get("/console/agents/\(String(repeating: "0", count: 32))/revoke").status == .notFound)

            let forged = try await browser.post("/console/agents/\(id)/revoke", ["reason": "x"])
            #expect(forged.status == .forbidden)
            #expect(try await !registry.isRevoked(id))
            let done = try await browser.post("/console/agents/\(id)/revoke", ["reason": "SUP-9 stolen", "csrf": csrf])
            #expect(done.status == .seeOther && done.location == "/console/agents/\(id)")
            let after = try await browser.get("/console/agents/\(id)")
            #expect(after.body.contains(#"<span class="status revoked">revoked</span>"#) && after.body.contains("by admin: it may not connect again"))
            #expect(!after.body.contains("Pull this device") && !after.body.contains("Revoke this device"))
            let again = try await browser.post("/console/agents/\(id)/revoke", ["csrf": csrf])
            #expect(again.status == .conflict && again.body.contains("was revoked already"))
        }
        #expect(try await fixture.audit("agent.revoke").map(\.detail) == ["agent \(id): SUP-9 stolen"])
    }

    /// The audit log page: newest first, filtered by action or actor, paged back, its details
    /// shown as text.
    @Test func theAuditLogIsFilteredAndPaged() async throws {
        let fixture = Fixture()
        for n in 0..<120 {
            try await fixture.admin.pulls.record(actor: n % 2 == 0 ? "alice" : "bob", action: "pull", detail: "pull \(n) <script>x</script>", at: Date())
        }
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let first = try await browser.get("/console/audit")
            #expect(first.status == .ok && first.body.contains("console.sign-in"))
            #expect(!first.body.contains("<script>x") && first.body.contains("&lt;script&gt;x&lt;/script&gt;"))
            let older = try #require(first.body.range(of: #"<p><a href=""#).map { String(first.body[$0.upperBound...].prefix { $0 != "\"" }) }.flatMap {
                $0.hasPrefix("/console/audit?") ? $0.replacingOccurrences(of: "&amp;", with: "&") : nil
            })
            let second = try await browser.get(older)
            #expect(second.status == .ok && second.body.contains("pull 0 ") && !second.body.contains("pull 119 "))
            let bob = try await browser.get("/console/audit?actor=bob&action=pull")
            #expect(bob.body.contains("pull 119 ") && !bob.body.contains("pull 118 ") && !bob.body.contains("console.sign-in"))
            #expect(try await browser.get("/console/audit?before=x").status == .badRequest)
        }
    }

    /// A pull asked for through the form is the CLI's pull: the same rules, audited under the
    /// session's token, and shown with its targets; a forged or a wrong form makes none.
    @Test func aPullIsAskedForShownAndListed() async throws {
        let fixture = Fixture()
        let agent = try await fixture.admin.agent(uids: ["u-1"])
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let form = try await browser.get("/console/pulls/new?uid=u-1")
            #expect(form.status == .ok && form.body.contains(#"id="uid" name="uid" value="u-1""#))
            let csrf = try #require(form.csrf)

            #expect(try await browser.post("/console/pulls", ["uid": "u-1"]).status == .forbidden)
            let none = try await browser.post("/console/pulls", ["csrf": csrf, "range": "2d"])
            #expect(none.status == .badRequest && none.body.contains("Give a uid, an agent, or both."))
            let badType = try await browser.post("/console/pulls", ["csrf": csrf, "uid": "u-1", "types": "Not A Type", "text": "<b>kept</b>"])
            #expect(badType.status == .badRequest && badType.body.contains("is not a log type"))
            #expect(badType.body.contains(#"value="&lt;b&gt;kept&lt;/b&gt;""#), "what was typed is kept, as text")
            let badTime = try await browser.post("/console/pulls", ["csrf": csrf, "uid": "u-1", "range": "custom", "since": "monday"])
            #expect(badTime.status == .badRequest && badTime.body.contains("Since must be a time"))
            #expect(try await fixture.admin.pulls.pulls(limit: 10, now: .now).isEmpty, "no pull was made")

            let made = try await browser.post(
                "/console/pulls",
                ["csrf": csrf, "uid": "u-1", "range": "custom", "since": "2026-11-20T10:00", "until": "2026-11-21T10:00", "level-warning": "on", "level-error": "on",
                 "types": "app, network", "text": "timeout", "reason": "TICKET-9"])
            #expect(made.status == .seeOther)
            let pull = try #require(try await fixture.admin.pulls.pulls(limit: 10, now: .now).first)
            #expect(made.location == "/console/pulls/\(pull.id)")
            #expect(pull.uid == "u-1" && pull.requestedBy == "admin" && pull.targets.map(\.agentID) == [agent])
            let filter = try #require(pull.filter)
            #expect(filter.levels == [.warning, .error] && filter.types == ["app", "network"] && filter.text == "timeout")
            #expect(filter.since == Timestamp(microseconds: 1_795_168_800_000_000) && filter.until == Timestamp(microseconds: 1_795_255_200_000_000))

            let shown = try await browser.get("/console/pulls/\(pull.id)")
            #expect(shown.status == .ok && shown.body.contains("uid u-1") && shown.body.contains("host-u-1") && shown.body.contains(#"<span class="status queued">"#))
            #expect(shown.body.contains("levels warning,error") && shown.body.contains("2026-11-20 10:00:00 UTC"))
            #expect(shown.body.contains("<dt>Reason</dt><dd>TICKET-9</dd>"))
            #expect(pull.reason == "TICKET-9")
            let listed = try await browser.get("/console/pulls")
            #expect(listed.body.contains("/console/pulls/\(pull.id)") && listed.body.contains(#"<td data-label="Reason" class="wrap">TICKET-9</td>"#))
            #expect(try await browser.get("/console/pulls?reason=ticket-9").body.contains("/console/pulls/\(pull.id)"), "found by its reason, in any case")
            let unmatched = try await browser.get("/console/pulls?reason=SUP-1")
            #expect(unmatched.status == .ok && !unmatched.body.contains("/console/pulls/\(pull.id)") && unmatched.body.contains("No pull's reason holds “SUP-1”."))
            #expect(try await browser.get("/console/pulls?reason=%01").status == .badRequest)
            #expect(try await browser.get("/console/pulls/\(String(repeating: "f", count: 32))").status == .notFound)

            // Its events: the targets' progress, then `done` once it is finished.
            #expect(try await fixture.admin.pulls.update(pull.id, agent: agent, status: .complete, detail: "7 records", at: Date()))
            let events = try await browser.get("/console/pulls/\(pull.id)/events")
            #expect(events.status == .ok && events.headers[.contentType] == "text/event-stream")
            let data = try #require(events.body.split(separator: "\n").first { $0.hasPrefix("data: [") }.map { $0.dropFirst(6) })
            let targets = try #require(try JSONSerialization.jsonObject(with: Data(data.utf8)) as? [[String: String]])
            #expect(targets == [["agentID": agent, "status": "complete", "progress": "", "files": "0 files", "detail": "7 records"]])
            #expect(events.body.hasSuffix("event: done\ndata: {}\n\n"))
            var stranger = Browser(client: browser.client)
            #expect(try await stranger.get("/console/pulls/\(pull.id)/events").status == .unauthorized)
        }
        #expect(try await fixture.audit("pull").first?.actor == "admin")
    }

    /// The feedback inbox shows what the user said (as text), who, from which device, and
    /// where its logs stand.
    @Test func theFeedbackInboxShowsWhatUsersSaid() async throws {
        let fixture = Fixture()
        let agent = try await fixture.admin.agent(uids: ["u-7"])
        let id = "0123456789abcdef0123456789abcdef"
        try await fixture.admin.feedback.begin(
            id: id, agentID: agent, uid: "u-7", text: "the oven <b>beeps</b>\nall night", createdAt: Timestamp(microseconds: 1_795_168_800_000_000), chunkCount: 1,
            bytes: 10, at: Date())
        #expect(try await fixture.admin.feedback.update(id, status: .complete, detail: "", chunksReceived: 1, records: 42, files: [], errorCode: nil))
        try await fixture.test { browser in
            #expect(try await browser.get("/console/feedback").location?.hasPrefix("/console/sign-in?return=") == true)
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let page = try await browser.get("/console/feedback")
            #expect(page.status == .ok)
            #expect(page.body.contains("the oven &lt;b&gt;beeps&lt;/b&gt;\nall night") && !page.body.contains("<b>beeps"))
            #expect(page.body.contains("<td data-label=\"User\">u-7</td>") && page.body.contains("host-u-7") && page.body.contains("complete, 42 records"))
            #expect(page.body.contains("2026-11-20 10:00:00 UTC"))
            // Into the user's timeline at that moment: what came before it (a second after, read backwards).
            #expect(Self.link(page.body, text: "At that moment") == "/console/logs?uid=u-7&before=1795168801000000.0")
            #expect(page.body.contains(#"<a href="/console/feedback/\#(id)/files">Files</a>"#))
        }
    }

    /// #50: the new-pull form's times are the CLI's vocabulary (`2d`, `yesterday`, a day, a day
    /// and time, any time with its zone as Dredge prints them), read in the zone the console
    /// shows (UTC, or the reader's); anything else is refused with the accepted forms; dates
    /// typed in make the range custom.
    @Test func theNewPullFormReadsTimesAsTheCLIDoes() throws {
        let now = Timestamp(microseconds: 1_795_300_000_000_000)  // 2026-11-21 21:06:40 UTC
        func filter(_ form: [String: String]) -> LogFilter? { try? Console.pullRequest(form.merging(["uid": "u-1"]) { a, _ in a }, now: now).get().filter }
        #expect(filter(["range": "2d", "since": "2026-11-20"])?.since == Timestamp(microseconds: 1_795_132_800_000_000), "typed dates win over the button")
        #expect(filter(["since": "2026-11-20T10:00"])?.since == Timestamp(microseconds: 1_795_168_800_000_000))
        #expect(filter(["since": "2026-11-20 10:00:30"])?.since == Timestamp(microseconds: 1_795_168_830_000_000))
        #expect(filter(["since": "2026-11-20 10:00:30.5"])?.since == Timestamp(microseconds: 1_795_168_830_500_000))
        #expect(filter(["since": "2026-11-20 11:00:00 +01:00"])?.since == Timestamp(microseconds: 1_795_168_800_000_000), "as the CLI prints it")
        #expect(filter(["since": "2026-11-20 10:00:00 UTC"])?.since == Timestamp(microseconds: 1_795_168_800_000_000), "as the console prints it")
        #expect(filter(["since": "2d"])?.since == now.adding(.seconds(-2 * 86_400)))
        #expect(filter(["since": "yesterday"])?.since == Timestamp(microseconds: (now.epochDay - 1) * 86_400_000_000))
        #expect(filter(["range": "1h"])?.since == now.adding(.seconds(-3600)))
        #expect(filter(["range": "today"])?.since == Timestamp(microseconds: now.epochDay * 86_400_000_000))
        #expect(filter(["range": "custom"]) == nil, "a custom range needs an end")
        // In the reader's zone: Kolkata is UTC+05:30, where it is already the 22nd.
        let kolkata = try #require(TimeZone(identifier: "Asia/Kolkata"))
        Console.$displayZone.withValue(kolkata) {
            #expect(filter(["since": "2026-11-20 10:00"])?.since == Timestamp(microseconds: 1_795_168_800_000_000 - 19_800_000_000))
            #expect(filter(["range": "today"])?.since == Timestamp(microseconds: (now.epochDay + 1) * 86_400_000_000 - 19_800_000_000))
            #expect(filter(["since": "2026-11-20 10:00:00 UTC"])?.since == Timestamp(microseconds: 1_795_168_800_000_000), "a zone given is kept")
            #expect(Console.timeText(Date(timeIntervalSince1970: 1_795_168_800)) == "2026-11-20 15:30:00 +05:30")
        }
        #expect(Console.timeText(Date(timeIntervalSince1970: 1_795_168_800)) == "2026-11-20 10:00:00 UTC")
        for bad in ["monday", "2026-11-20T10:00+25:00", "2026-11-20T10:00:00.", "2026-02-30", "2026-11-20T24:00", "1969-12-31", "2026-11-20 CET"] {
            guard case .failure(let error) = Console.pullRequest(["uid": "u-1", "since": bad], now: now) else {
                Issue.record("\(bad) was taken")
                continue
            }
            #expect(error.description.contains("since must be a time") && error.description.contains("yesterday"), "\(bad): \(error)")
        }
    }

    /// #50: the reader's zone (the cookie the page's script sets) is said on every page, shown
    /// in every time, and read in time fields; a zone the server does not know is UTC.
    @Test func pagesShowAndReadTimesInTheReadersZone() async throws {
        let fixture = Fixture()
        _ = try await fixture.admin.agent(uids: ["u-1"])
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let utc = try await browser.get("/console/agents")
            #expect(utc.body.contains("Times in UTC") && utc.body.contains(#"data-zone="local" hidden>Show local time"#))
            #expect(utc.body.range(of: #"<td data-label="Last seen" class="nowrap">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>"#, options: .regularExpression) != nil)

            browser.cookies[Console.zoneCookie] = "Asia/Kolkata"
            let local = try await browser.get("/console/agents")
            #expect(local.body.contains("Times in Asia/Kolkata (+05:30)") && local.body.contains(#"data-zone="utc">Show UTC"#))
            #expect(local.body.range(of: #"<td data-label="Last seen" class="nowrap">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+05:30</td>"#, options: .regularExpression) != nil)
            let form = try await browser.get("/console/pulls/new")
            let made = try await browser.post("/console/pulls", ["csrf": try #require(form.csrf), "uid": "u-1", "since": "2026-11-20 10:00"])
            let pull = try #require(try await fixture.admin.pulls.pulls(limit: 1, now: .now).first)
            #expect(made.status == .seeOther && pull.filter?.since == Timestamp(microseconds: 1_795_168_800_000_000 - 19_800_000_000))
            #expect(try await browser.get("/console/pulls/\(pull.id)").body.contains("since 2026-11-20 10:00:00 +05:30"))

            for unknown in ["Mars/Olympus", "", "../x", String(repeating: "A", count: 100)] {
                browser.cookies[Console.zoneCookie] = unknown
                #expect(try await browser.get("/console/agents").body.contains("Times in UTC"), "\(unknown)")
            }
        }
    }

    /// Pull pages' event streams are bounded per session and in all; places come back when a
    /// stream ends, or after 11 minutes whatever happened to it.
    @Test func eventStreamsAreBounded() {
        let clock = Clock()
        let streams = Console.EventStreams(now: { clock.now() })
        for _ in 0..<Console.EventStreams.perSession { #expect(streams.open("a")) }
        #expect(!streams.open("a"))
        #expect(streams.open("b"), "another session has its own")
        streams.close("a")
        #expect(streams.open("a"))
        #expect(!streams.open("a"))
        clock.advance(Console.EventStreams.longest + 1)
        #expect(streams.open("a"), "places of streams that never ended come back")
    }

    /// The log viewer: a pull's records in time order, filtered, paged, shown as text, each
    /// search audited; wrong fields are told.
    @Test func theLogViewerSearchesWhatArrived() async throws {
        let fixture = Fixture()
        let source = RecordIndexConformanceTests.pull1
        var lines = (0..<250).map { RecordIndexConformanceTests.line($0, "record \($0)") }
        lines.append(RecordIndexConformanceTests.line(300, "<script>alert(1)</script> declined", level: "error", type: "network", metadata: #"{"http.status":503}"#))
        try await fixture.land(source, lines)
        try await fixture.test { browser in
            #expect(try await browser.get("/console/logs?pull=\(source.id)").location?.hasPrefix("/console/sign-in?return=") == true)
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let empty = try await browser.get("/console/logs")
            #expect(empty.status == .ok && empty.body.contains("Choose a user, a device, a pull, a feedback or a capture"))

            let first = try await browser.get("/console/logs?pull=\(source.id)")
            #expect(first.status == .ok && first.body.contains("200 records on this page.") && first.body.contains(">record 0<"))
            // The counts and the histogram of the whole search, above its pages (#50).
            #expect(first.body.contains("<strong>251 records match.</strong>"))
            #expect(first.body.contains(#"<a class="count level-error" href="/console/logs?level=error&amp;pull=\#(source.id)">error 1</a>"#))
            #expect(first.body.contains(">info 250</a>") && first.body.contains(">kitchen-oven 251</a>"))
            let bars = first.body.components(separatedBy: "<rect class=\"h-").count - 1
            #expect(bars >= 2 && bars <= RecordStats.bucketCount + 1, "\(bars) bars")
            let zoom = try #require(first.body.range(of: #"<a href="(/console/logs\?pull=[^"]+)"><title>"#, options: .regularExpression).map {
                String(first.body[$0]).dropFirst(9).prefix { $0 != "\"" }.replacingOccurrences(of: "&amp;", with: "&")
            })
            #expect(zoom.contains("since=") && zoom.contains("until="))
            let zoomed = try await browser.get(zoom)
            #expect(zoomed.status == .ok && zoomed.body.contains("records match.</strong>") && !zoomed.body.contains("<strong>251 records match.</strong>"), "a bar narrows the time")
            #expect(first.body.contains(#"data-zoom="/console/logs?pull=\#(source.id)""#))
            // A type no record has is told, with the known ones (#50); a known one that matches nothing is not.
            let typo = try await browser.get("/console/logs?pull=\(source.id)&type=netwrok")
            #expect(typo.body.contains("No record matches. <span class=\"problem\">No record has type &quot;netwrok&quot;; known: &quot;network&quot;, &quot;app&quot;.</span>"))
            #expect(!(try await browser.get("/console/logs?pull=\(source.id)&type=network&level=debug").body.contains("No record has")))
            #expect(!first.body.contains(">record 200<"))
            let second = try await browser.get(try #require(Self.link(first.body, rel: "next")))
            #expect(second.body.contains(">record 200<") && second.body.contains("51 records on this page.") && !second.body.contains("Next page"))
            #expect(second.body.contains("&lt;script&gt;alert(1)&lt;/script&gt; declined") && !second.body.contains("<script>alert"))

            let errors = try await browser.get("/console/logs?pull=\(source.id)&level=error&where=http.status%3D503&text=declined")
            #expect(errors.body.contains("1 records on this page.") && errors.body.contains("http.status=503") && errors.body.contains(#"<tr class="level-error" data-id="#))
            let none = try await browser.get("/console/logs?pull=\(source.id)&type=player")
            #expect(none.body.contains("No record matches.") && none.body.contains("data-follow="), "an empty page can follow what arrives")
            #expect(try await browser.get("/console/logs?pull=\(source.id)&host=kitchen-oven&app=oven-control").body.contains("200 records on this page."))
            #expect(try await browser.get("/console/logs?pull=\(source.id)&host=bakery-oven").body.contains("No record matches."))
            // A device alone is something to read (an agent's page links there).
            #expect(try await browser.get("/console/logs?host=kitchen-oven").body.contains("200 records on this page."))
            for (query, problem) in [("level=loud", "level is one of"), ("pull=xyz", "pull must be an id"), ("uid=u-1&since=monday", "since must be a time"),
                                     ("uid=u-1&where=nokey", "a metadata match is key=value")] {
                let page = try await browser.get("/console/logs?" + query)
                #expect(page.status == .badRequest && page.body.contains(problem), "\(query)")
            }
        }
        let searches = try await fixture.audit("records.search")
        #expect(searches.allSatisfy { $0.actor == "admin" } && searches.contains { $0.detail.contains("pull=\(source.id)") })
    }

    /// #50: repeats grouped: a run of the same message, level and device on a page is one row,
    /// counted; the link shows every record again.
    @Test func theViewerGroupsRepeatedMessages() async throws {
        let fixture = Fixture()
        let source = RecordIndexConformanceTests.pull1
        let messages = ["retrying", "retrying", "retrying", "connected", "retrying", "retrying", "retrying"]
        // The last one is another user's: not the same record, not folded in.
        try await fixture.land(source, messages.enumerated().map { RecordIndexConformanceTests.line($0.offset, $0.element, uid: $0.offset == 6 ? "u-2" : "u-1") })
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let all = try await browser.get("/console/logs?pull=\(source.id)")
            #expect(all.body.components(separatedBy: "<tr class=\"level-").count - 1 == 7 && !all.body.contains("class=\"repeated\""))
            let groupLink = try #require(Self.link(all.body, text: "Group repeats"))
            let grouped = try await browser.get(groupLink)
            #expect(grouped.body.components(separatedBy: "<tr class=\"level-").count - 1 == 4)
            #expect(grouped.body.contains(">×3</span> retrying") && grouped.body.contains(">×2</span> retrying") && grouped.body.contains("connected"))
            #expect(grouped.body.contains("<strong>7 records match.</strong>"), "the counts are the records'")
            #expect(Self.link(grouped.body, text: "Show every record") == "/console/logs?pull=\(source.id)")
        }
    }

    /// A pull's files are removed from its page after a question that changes nothing; the
    /// removal is the CLI's (audited, with its reason), and a forged form removes nothing.
    @Test func aPullIsRemovedFromItsPageAfterAQuestion() async throws {
        let fixture = Fixture()
        _ = try await fixture.admin.agent(uids: ["u-1"])
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let form = try await browser.get("/console/pulls/new?uid=u-1")
            let made = try await browser.post("/console/pulls", ["csrf": try #require(form.csrf), "uid": "u-1", "range": "2d"])
            let page = try await browser.get(try #require(made.location))
            let id = String(try #require(made.location).dropFirst("/console/pulls/".count))
            let ask = try #require(Self.link(page.body, text: "Remove its files…"))
            #expect(ask == "/console/pulls/\(id)/remove")
            let question = try await browser.get(ask)
            #expect(question.status == .ok && question.body.contains("Remove the files of pull \(id.prefix(8))?") && question.body.contains("host-u-1"))
            #expect(question.body.contains(#"href="/console/pulls/\#(id)">Cancel</a>"#))
            #expect(try await fixture.admin.pulls.pull(id)?.removed == nil, "asking removes nothing")

            #expect(try await browser.post(ask, ["reason": "x"]).status == .forbidden)
            let tooLong = try await browser.post(ask, ["csrf": try #require(question.csrf), "reason": String(repeating: "r", count: 300)])
            #expect(tooLong.status == .badRequest && tooLong.body.contains("A reason is at most 256 bytes."))
            #expect(try await fixture.admin.pulls.pull(id)?.removed == nil)

            let removed = try await browser.post(ask, ["csrf": try #require(question.csrf), "reason": "GDPR-7"])
            #expect(removed.status == .seeOther && removed.location == "/console/pulls/\(id)")
            let after = try await browser.get("/console/pulls/\(id)")
            #expect(after.body.contains("<dt>Removed</dt>") && after.body.contains("(GDPR-7)") && !after.body.contains("Remove its files…"))
            #expect(try await browser.get(ask).location == "/console/pulls/\(id)", "nothing left to ask about")
            #expect(try await browser.post("/console/pulls/\(String(repeating: "e", count: 32))/remove", ["csrf": try #require(question.csrf)]).status == .notFound)
        }
        let removal = try #require(try await fixture.audit("pull.remove").first)
        #expect(removal.actor == "admin" && removal.detail.contains("GDPR-7"))
    }

    /// An agent's row leads to its page: what it is, its users with a pull for each, a pull of
    /// the device, and the pulls that reached it.
    @Test func anAgentsPageOffersToPullItsUsersAndItself() async throws {
        let fixture = Fixture()
        let agent = try await fixture.admin.agent(uids: ["u-1", "anna lee"])
        let other = try await fixture.admin.agent(uids: ["u-2"])
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let all = try await browser.get("/console/agents")
            #expect(all.body.contains(#"<a href="/console/agents/\#(agent)">host-u-1</a>"#))
            let form = try await browser.get("/console/pulls/new")
            _ = try await browser.post("/console/pulls", ["csrf": try #require(form.csrf), "agent": agent, "range": "2d", "reason": "SUP-3"])
            _ = try await browser.post("/console/pulls", ["csrf": try #require(form.csrf), "agent": other, "range": "2d", "reason": "SUP-4"])

            let page = try await browser.get("/console/agents/\(agent)")
            #expect(page.status == .ok && page.body.contains("<h1>host-u-1 "))
            #expect(Self.link(page.body, text: "Pull this device") == "/console/pulls/new?agent=\(agent)")
            #expect(page.body.contains(#"href="/console/pulls/new?uid=anna%20lee">Pull this user</a>"#))
            #expect(page.body.contains(#"href="/console/pulls/new?uid=u-1&amp;agent=\#(agent)">on this device only</a>"#))
            #expect(page.body.contains(">SUP-3</td>") && !page.body.contains("SUP-4"), "its pulls, not another device's")
            let prefilled = try await browser.get("/console/pulls/new?agent=\(agent)")
            #expect(prefilled.body.contains(#"<option value="\#(agent)" selected>"#))
            #expect(try await browser.get("/console/agents/\(String(repeating: "0", count: 32))").status == .notFound)
        }
    }

    @Test func theAgentsPageFiltersByText() async throws {
        let fixture = Fixture()
        _ = try await fixture.admin.agent(uids: ["u-1"])
        _ = try await fixture.admin.agent(uids: ["anna lee"])
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let all = try await browser.get("/console/agents")
            #expect(all.body.contains("host-u-1") && all.body.contains("host-anna"))
            let one = try await browser.get("/console/agents?q=ANNA+LEE")  // as a form sends it: `+` is a space
            #expect(one.body.contains("host-anna") && !one.body.contains("host-u-1"))
            #expect(one.body.contains("1 match"))
        }
    }
    /// The `href` of the page's link with this `rel` (`next`, `prev`), unescaped.
    static func link(_ body: String, rel: String) -> String? {
        guard let relRange = body.range(of: "\" rel=\"\(rel)\""), let start = body[..<relRange.lowerBound].range(of: "href=\"", options: .backwards) else { return nil }
        return String(body[start.upperBound..<relRange.lowerBound]).replacingOccurrences(of: "&amp;", with: "&")
    }

    /// The `href` of the link whose text is `text`, unescaped.
    static func link(_ body: String, text: String) -> String? {
        guard let textRange = body.range(of: "\">\(text)</a>"), let start = body[..<textRange.lowerBound].range(of: "href=\"", options: .backwards) else { return nil }
        return String(body[start.upperBound..<textRange.lowerBound]).replacingOccurrences(of: "&amp;", with: "&")
    }

    @Test func aRecordOpensInFullWithItsNeighboursAndItsHTTPExchange() async throws {
        let fixture = Fixture()
        let source = RecordIndexConformanceTests.pull1
        var lines = (0..<30).map { RecordIndexConformanceTests.line($0, "record \($0)") }
        lines[15] = RecordIndexConformanceTests.line(
            15, "GET /cart 503", level: "error", type: "network",
            metadata: #"{"method":"GET","url":"javascript:alert(1)//\"><img src=x onerror=alert(1)>","status":503,"duration_ms":42.5,"correlation_id":"c-77","request_headers":{"Accept":"application/json","Authorization":"<redacted>"},"response_headers":{"Retry-After":"30"},"response_body":"<script>alert(2)</script>"}"#)
        try await fixture.land(source, lines)
        let id = try #require(try await fixture.records.search(RecordSearch(text: "cart")).records.first?.id)
        let plain = try #require(try await fixture.records.search(RecordSearch(text: "record")).records.first?.id)
        try await fixture.test { browser in
            #expect(try await browser.get("/console/records/\(id)").location?.hasPrefix("/console/sign-in?return=") == true)
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let page = try await browser.get("/console/records/\(id)")
            #expect(page.status == .ok && page.headers[HTTPFields.Element.Name("Content-Security-Policy")!] != nil)
            // The exchange, request and response, every value as text.
            #expect(page.body.contains("<strong>GET</strong>") && page.body.contains("<dt>Correlation id</dt><dd>c-77</dd>"))
            #expect(page.body.contains("<dt>Status</dt><dd>503</dd>") && page.body.contains("<dt>Duration</dt><dd>42.5 ms</dd>"))
            #expect(page.body.contains(#"<th scope="row">Retry-After</th><td>30</td>"#) && page.body.contains(#"<th scope="row">Authorization</th><td>&lt;redacted&gt;</td>"#))
            #expect(page.body.contains(#"<span class="url">javascript:alert(1)//&quot;&gt;&lt;img src=x onerror=alert(1)&gt;</span>"#))
            #expect(page.body.contains("<pre class=\"body\">&lt;script&gt;alert(2)&lt;/script&gt;</pre>"))
            #expect(!page.body.contains("<script>alert") && !page.body.contains("<img") && !page.body.contains("href=\"javascript:"))
            // Its metadata member by member, and ten records on each side from the same device.
            #expect(page.body.contains(#"<th scope="row">status</th><td>503</td>"#))
            for n in [5, 14, 16, 25] { #expect(page.body.contains(">record \(n)<"), "record \(n) is in its context") }
            #expect(!page.body.contains(">record 4<") && !page.body.contains(">record 26<"))
            #expect(page.body.contains(#"<tr class="level-error current" aria-current="true">"#))
            // A plain record has no exchange.
            #expect(try await !browser.get("/console/records/\(plain)").body.contains("Request"))
            #expect(try await browser.get("/console/records/\(id)").status == .ok, "read again: not audited again")
            // "In the timeline": the viewer from this record on, the record marked, the page before one link away.
            let viewer = try await browser.get(try #require(Self.link(page.body, text: "In the timeline")))
            #expect(viewer.status == .ok && viewer.body.contains(#"data-id="\#(id)" aria-current="true""#))
            #expect(viewer.body.contains(">GET /cart 503<") && !viewer.body.contains(">record 14<") && Self.link(viewer.body, rel: "prev") != nil)
            #expect(try await browser.get(try #require(Self.link(viewer.body, rel: "prev"))).body.contains(">record 14<"))
            // Unknown and malformed ids are pages that say so.
            for bad in ["999999", "abc", "-1", "0"] {
                #expect(try await browser.get("/console/records/\(bad)").status == .notFound, "\(bad)")
            }
        }
        let reads = try await fixture.audit("records.read")
        #expect(
            Set(reads.map(\.detail)) == ["record \(id) context 10", "record \(plain) context 10"] && reads.count == 2 && reads.allSatisfy { $0.actor == "admin" },
            "each record's reads audited once")
    }

    @Test func theViewerPagesBothWaysAndOpensAtAMoment() async throws {
        let fixture = Fixture()
        let source = RecordIndexConformanceTests.pull1
        try await fixture.land(source, (0..<450).map { RecordIndexConformanceTests.line($0, "record \($0)") })
        try await fixture.test { browser in
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let latest = try await browser.get("/console/logs?pull=\(source.id)&before=\(Int64.max).0")
            #expect(latest.body.contains(">record 449<") && latest.body.contains(">record 250<") && !latest.body.contains(">record 249<"))
            #expect(latest.body.contains("200 records on this page.") && Self.link(latest.body, text: "First") != nil)
            let earlier = try await browser.get(try #require(Self.link(latest.body, rel: "prev")))
            #expect(earlier.body.contains(">record 50<") && earlier.body.contains(">record 249<") && !earlier.body.contains(">record 49<"))
            let earliest = try await browser.get(try #require(Self.link(earlier.body, rel: "prev")))
            #expect(earliest.body.contains("50 records on this page.") && earliest.body.contains(">record 0<") && Self.link(earliest.body, rel: "prev") == nil)
            let forwards = try await browser.get(try #require(Self.link(earliest.body, rel: "next")))
            #expect(forwards.body.contains(">record 50<") && forwards.body.contains(">record 249<") && forwards.body.contains("200 records on this page."))
            // At a moment: what came just before it, then on from it.
            let moment = try await browser.get("/console/logs?pull=\(source.id)&before=\(RecordIndexConformanceTests.at(100).microseconds).0")
            #expect(moment.body.contains("100 records on this page.") && moment.body.contains(">record 99<") && !moment.body.contains(">record 100<"))
            // The last record before the moment is the one marked: the reader starts there.
            let marked = try #require(moment.body.range(of: #"aria-current="true""#))
            #expect(moment.body[marked.upperBound...].contains(">record 99<") && !moment.body[marked.upperBound...].contains(">record 98<"))
            let after = try await browser.get(try #require(Self.link(moment.body, rel: "next")))
            #expect(after.body.contains(">record 100<") && after.body.contains(">record 299<") && !after.body.contains(">record 99<"))
            // A level with `+` (warning and above) stays one in the page links: `+` alone is a space.
            let above = try await browser.get("/console/logs?pull=\(source.id)&level=info%2B&before=\(Int64.max).0")
            #expect(try #require(Self.link(above.body, rel: "prev")).contains("level=info%2B"))
            // Only the last page follows arrivals, from the newest record it saw.
            #expect(above.body.contains(#"data-follow="/console/logs/follow?level=info%2B&amp;pull=\#(source.id)&amp;from="#) && !earliest.body.contains("data-follow"))
            let follow = try await browser.get("/console/logs/follow?pull=\(source.id)&from=x")
            #expect(follow.status == .badRequest)
            var stranger = Browser(client: browser.client)
            #expect(try await stranger.get("/console/logs/follow?pull=\(source.id)&from=1").status == .unauthorized)
            let cookie = browser.cookies.map { "\($0.key)=\($0.value)" }.joined(separator: "; ")
            let resumedBadly = try await browser.client.execute(
                uri: "/console/logs/follow?pull=\(source.id)&from=1", method: .get, headers: [.cookie: cookie, HTTPFields.Element.Name("Last-Event-ID")!: "-5"]
            ) { $0.status }
            #expect(resumedBadly == .badRequest)
            for query in ["before=abc", "before=1.2.3", "after=1.1&before=2.2", "after=%2B1.1"] {
                let page = try await browser.get("/console/logs?pull=\(source.id)&" + query)
                #expect(page.status == .badRequest && page.body.contains("class=\"problem\""), "\(query)")
            }
        }
    }

    @Test func filesAreListedAndDownloadedThroughTheSession() async throws {
        let fixture = Fixture()
        let a = fixture.admin
        let agent = try await a.agent(uids: ["u-1"])
        let new = try a.issuer.newPull(uid: "u-1", agentID: "", filter: LogFilter(uid: "u-1"), targets: [agent], lifetime: .seconds(600), requestedBy: "alice", now: .now)
        try await a.pulls.create(new)
        let paths = DataDirectory(a.data)
        let zip = try paths.pullZip(new.id, agent: agent)
        // Where a landed upload's files are: the record's paths are looked up there by name.
        let dir = try paths.pullFiles(new.id, agent: agent)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let day = Data("{\"ts\":\"2027-01-15T10:00:00.000000Z\",\"level\":\"info\",\"type\":\"app\",\"message\":\"m\"}\n".utf8)
        try day.write(to: URL(fileURLWithPath: dir + "/2027-01-15.jsonl"))
        try Data(repeating: 7, count: 300).write(to: URL(fileURLWithPath: zip))
        #expect(try await a.pulls.update(new.id, agent: agent, status: .complete, detail: "", files: [dir + "/2027-01-15.jsonl"]))
        let file = "/console/pulls/\(new.id)/files/\(agent)/2027-01-15.jsonl"
        try await fixture.test { browser in
            let refused = try await browser.get(file)
            #expect(refused.location?.hasPrefix("/console/sign-in?return=") == true && !refused.body.contains("\"m\""), "no file without a session")
            _ = try await browser.signIn(fixture.admin.created.adminToken)
            let listing = try await browser.get("/console/pulls/\(new.id)/files")
            #expect(listing.status == .ok && listing.body.contains(#"<a href="\#(file)" download>2027-01-15.jsonl</a>"#))
            #expect(listing.body.contains(FileDigest.sha256(day)) && listing.body.contains("/console/pulls/\(new.id)/zip"))
            let got = try await browser.get(file)
            #expect(got.status == .ok && Data(got.body.utf8) == day && got.headers[.contentDisposition] == "attachment; filename=\"2027-01-15.jsonl\"")
            #expect(got.headers[HTTPFields.Element.Name("Content-Security-Policy")!] != nil && got.headers[.eTag] == "\"\(FileDigest.sha256(day))\"")
            let whole = try await browser.get("/console/pulls/\(new.id)/zip")
            #expect(whole.status == .ok && whole.headers[.contentType] == "application/zip" && whole.body.utf8.starts(with: [0x50, 0x4B]))
            for bad in ["/console/pulls/\(new.id)/files/\(agent)/..%2Fsecret", "/console/pulls/\(new.id)/files/\(agent)/nothing.jsonl",
                        "/console/pulls/\(new.id)/files/../2027-01-15.jsonl", "/console/feedback/\(new.id)/files"] {
                #expect(try await browser.get(bad).status == .notFound, "\(bad)")
            }
        }
        let downloads = try await fixture.audit("pull.download")
        // One entry for the device's files (the first one named) and one for the whole zip.
        #expect(downloads.map(\.detail).sorted() == ["pull \(new.id) agent \(agent) file 2027-01-15.jsonl", "pull \(new.id) whole zip"] && downloads.allSatisfy { $0.actor == "admin" })
    }
}

