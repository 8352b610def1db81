import DredgeAdminAPI
@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// The console's sign-in through a real OpenID Connect provider (#55): django-oauth-toolkit,
/// started on loopback by `Tests/sso/oidc_provider.py` with its people and groups. A person
/// signs in at the provider's own page (`Tests/sso/sign_in_at_provider.py`, as a browser
/// would) and the console, in process, takes the provider's answer: the code exchanged with
/// PKCE, the ID token verified, the role and scope from the groups and claims.
@Suite(.serialized) struct SingleSignOnTests {
    /// The provider, running, and what it said about itself.
    final class Provider: @unchecked Sendable {
        let process: ManagedProcess
        let issuer: String
        let secret: String
        let people: [String: String]
        static let redirect = "http://127.0.0.1:7080/console/sso/callback"

        init(_ dir: TempDir) throws {
            let state = dir.file("provider")
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
            let process = try ManagedProcess(
                "/usr/bin/env", ["python3", SingleSignOnTests.script("oidc_provider.py"), "--state-dir", state, "--console-redirect", Self.redirect],
                outputPath: dir.file("provider.log"))
            self.process = process
            var info: [String: Any]?
            ManagedProcess.waitFor(timeout: .seconds(60)) {
                info = process.output.split(separator: "\n").lazy.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }.first
                return info != nil || !process.process.isRunning
            }
            guard let info, let issuer = info["issuer"] as? String, let console = info["console"] as? [String: Any], let secret = console["secret"] as? String,
                let people = info["people"] as? [String: String]
            else { throw DeploymentError("the OpenID Connect provider did not start (is django-oauth-toolkit installed? scripts/install-deps.sh):\n\(process.output)") }
            (self.issuer, self.secret, self.people) = (issuer, secret, people)
        }

        deinit { process.stop(SIGKILL) }

        /// Where the provider sends `person`'s browser back after `authorize`.
        func signIn(_ person: String, at authorize: String) throws -> String {
            let (status, output, errors) = try ManagedProcess.runSeparately(
                "/usr/bin/env", ["python3", SingleSignOnTests.script("sign_in_at_provider.py"), "--authorize", authorize, "--user", person, "--password=" + (people[person] ?? "")])
            guard status == 0 else { throw DeploymentError("signing \(person) in at the provider failed: \(output)\(errors)") }
            return output.trimmingCharacters(in: .whitespacesAndNewlines)
        }

        /// A real ID token for `person` (nonce `n1`), from the whole code flow.
        func idToken(_ person: String) throws -> String {
            let (status, output, errors) = try ManagedProcess.runSeparately(
                "/usr/bin/env",
                [
                    "python3", SingleSignOnTests.script("sign_in_at_provider.py"), "--issuer", issuer, "--redirect", Self.redirect, "--user", person,
                    "--password=" + (people[person] ?? ""), "--id-token-for=" + secret,
                ])
            guard status == 0 else { throw DeploymentError("the code flow failed: \(output)\(errors)") }
            return output.trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }

    static func script(_ name: String) -> String { MetricsTests.repository.appendingPathComponent("Tests/sso/" + name).path }

    /// The console's settings: investigators and readers by group; with `appsClaim`, a reader's
    /// or investigator's apps from that claim (`dredge_apps`).
    static func settings(_ provider: Provider, appsClaim: String? = nil) -> SingleSignOnSettings {
        SingleSignOnSettings(
            issuer: provider.issuer, clientID: "dredge-console", clientSecretFile: "sso-secret", redirectURL: Provider.redirect, groupsClaim: "groups",
            readers: ["dredge-readers"], investigators: ["dredge-investigators"], admins: ["dredge-admins"], appsClaim: appsClaim)
    }

    static func singleSignOn(
        _ provider: Provider, _ fixture: ConsoleRouteTests.Fixture, appsClaim: String? = nil, now: @escaping @Sendable () -> Date = { Date() }
    ) throws -> SingleSignOn {
        try Data(provider.secret.utf8).write(to: URL(fileURLWithPath: fixture.admin.data + "/sso-secret"))
        return try SingleSignOn(settings: settings(provider, appsClaim: appsClaim), directory: fixture.admin.data, now: now)
    }

    /// The callback's path and query, as the console is asked for it.
    static func callbackPath(_ url: String) -> String {
        let parts = URLComponents(string: url)
        return (parts?.path ?? "") + "?" + (parts?.percentEncodedQuery ?? "")
    }

    @Test func peopleSignInWithTheRoleAndScopeTheirGroupsGive() async throws {
        let dir = TempDir()
        let provider = try Provider(dir)
        let fixture = ConsoleRouteTests.Fixture()
        let fleet = try await AccessControlTests.Fleet(fixture)
        let sso = try Self.singleSignOn(provider, fixture)
        let scoping = try Self.singleSignOn(provider, fixture, appsClaim: "dredge_apps")
        try await fixture.test(sso: sso) { browser in
            // Mallory's groups give no role: refused, and recorded.
            let start = try await browser.get("/console/sso/start")
            let authorize = try #require(start.location)
            let refused = try await browser.get(Self.callbackPath(try provider.signIn("mallory", at: authorize)))
            #expect(refused.status == .forbidden && refused.body.contains("none of your groups gives a role"))
            #expect(browser.cookies[Console.sessionCookie] == nil)
            // A callback this browser did not start (no cookie of its own) is refused too.
            let other = try await browser.get("/console/sso/callback?code=x&state=y")
            #expect(other.status == .unauthorized)
        }
        try await fixture.test(sso: sso) { browser in
            // The sign-in page offers it; starting sends the browser to the provider with PKCE.
            #expect(try await browser.get("/console/sign-in").body.contains(#"href="/console/sso/start""#))
            let start = try await browser.get("/console/sso/start?return=%2Fconsole%2Fpulls%2Fnew")
            #expect(start.status == .seeOther)
            let authorize = try #require(start.location)
            #expect(authorize.hasPrefix(provider.issuer + "/authorize/") && authorize.contains("code_challenge_method=S256") && authorize.contains("nonce="))
            #expect(browser.cookies[SingleSignOn.cookie] != nil)

            // Alice, an investigator by her group, lands where she was going.
            let back = try provider.signIn("alice", at: authorize)
            let landed = try await browser.get(Self.callbackPath(back))
            #expect(landed.status == .ok && landed.body.contains(#"content="0; url=/console/pulls/new""#), "\(landed.body)")
            #expect(browser.cookies[Console.sessionCookie] != nil && browser.cookies[SingleSignOn.cookie] == nil)
            let form = try await browser.get("/console/pulls/new")
            #expect(form.status == .ok && form.body.contains("sso:") && form.body.contains("(investigator)"))
            #expect(try await browser.get("/console/tokens").status == .forbidden)

            // The same answer again (a replay, or another tab) is refused: its sign-in is spent.
            let replayed = try await browser.get(Self.callbackPath(back))
            #expect(replayed.status == .unauthorized)

            // Signing out ends the session here and at the provider.
            let agents = try await browser.get("/console/agents")
            let out = try await browser.post("/console/sign-out", ["csrf": agents.csrf ?? ""])
            #expect(out.status == .ok && out.body.contains(#"content="0; url=\#(provider.issuer)/logout/?client_id=dredge-console"#), "\(out.body)")
            #expect(try await browser.get("/console/agents").location?.hasPrefix("/console/sign-in") == true)
        }
        try await fixture.test(sso: scoping) { browser in
            // Where a claim scopes readers and investigators, alice, who has none, is refused:
            // never unscoped for want of a claim.
            let first = try await browser.get("/console/sso/start")
            let authorize = try #require(first.location)
            let unscoped = try await browser.get(Self.callbackPath(try provider.signIn("alice", at: authorize)))
            #expect(unscoped.status == .forbidden && unscoped.body.contains("scope claim is missing"))

            // A callback whose state is not this browser's sign-in's (a second start replaced
            // the cookie) is refused.
            let older = try #require(try await browser.get("/console/sso/start").location)
            _ = try await browser.get("/console/sso/start")
            let crossed = try await browser.get(Self.callbackPath(try provider.signIn("rita", at: older)))
            #expect(crossed.status == .unauthorized && crossed.body.contains("not for this browser"))
            // A cookie changed by the browser (its signature no longer holds) is refused.
            let tampered = try #require(try await browser.get("/console/sso/start").location)
            browser.cookies[SingleSignOn.cookie] = "x" + (browser.cookies[SingleSignOn.cookie] ?? "")
            #expect(try await browser.get(Self.callbackPath(try provider.signIn("rita", at: tampered))).status == .unauthorized)
        }
        try await fixture.test(sso: scoping) { browser in
            // Rita, a reader scoped by her `dredge_apps` claim to oven-control: the oven only.
            let start = try await browser.get("/console/sso/start")
            let authorize = try #require(start.location)
            _ = try await browser.get(Self.callbackPath(try provider.signIn("rita", at: authorize)))
            let agents = try await browser.get("/console/agents")
            #expect(agents.status == .ok && agents.body.contains("kitchen-oven") && !agents.body.contains("bakery-screen"))
            #expect(try await browser.get("/console/agents/\(fleet.screen)").status == .notFound)
            #expect(try await browser.get("/console/pulls/new").status == .forbidden)
        }
        let signIns = try await fixture.audit("console.sign-in").map { "\($0.actor) \($0.detail)" }
        #expect(signIns.contains { $0.hasPrefix("sso:") && $0.contains("through single sign-on (alice@example.com) as investigator") }, "\(signIns)")
        #expect(signIns.contains { $0.hasPrefix("sso:") && $0.contains("(rita@example.com) as reader of app=oven-control") }, "\(signIns)")
        #expect(try await fixture.audit("auth.failed").contains { $0.detail.contains("mallory@example.com") })
    }

    /// What the provider says of a person is shown in terminals and the audit log: a subject
    /// with a control or formatting character is refused, and such characters are dropped
    /// from the address shown.
    @Test func hiddenCharactersNeitherNameNorShowAPerson() throws {
        let dir = TempDir()
        try Data("secret".utf8).write(to: URL(fileURLWithPath: dir.file("secret")))
        let sso = try SingleSignOn(
            settings: SingleSignOnSettings(issuer: "http://127.0.0.1:1/o", clientID: "c", clientSecretFile: "secret", redirectURL: "http://127.0.0.1:1/cb"), directory: dir.path)
        func claims(_ sub: String, _ email: String) -> [String: IDTokenClaims.JSONValue] { ["sub": .string(sub), "email": .string(email), "groups": .strings(["g"])] }
        #expect(try sso.person(claims("42", "ali\u{202E}moc.evil\u{9B}31m@example.com"), from: "test").shown == "alimoc.evil31m@example.com")
        for sub in ["4\u{9B}2", "4\u{200B}2", "4\u{7}2", ""] {
            #expect(throws: SingleSignOnError.self) { try sso.person(claims(sub, "a@example.com"), from: "test") }
        }
        #expect(try sso.person(claims("auth0|42", "a@example.com"), from: "test").name == "sso:auth0|42")
    }

    /// The ID token's checks, on real tokens from the provider: one whose payload or signature
    /// is changed, one past its expiry, one for another sign-in (its nonce), refused.
    @Test func aTamperedExpiredOrForeignIDTokenIsRefused() async throws {
        let dir = TempDir()
        let provider = try Provider(dir)
        let fixture = ConsoleRouteTests.Fixture()
        let token = try provider.idToken("alice")
        let sso = try Self.singleSignOn(provider, fixture)
        let alice = try await sso.person(idToken: token, nonce: "n1")
        #expect(alice.name.hasPrefix("sso:") && alice.shown == "alice@example.com" && alice.groups == ["dredge-investigators"])

        let parts = token.split(separator: ".").map(String.init)
        #expect(parts.count == 3)
        // The payload with admin's groups, the signature kept.
        let payloadBytes = try #require(SingleSignOn.fromBase64URL(parts[1]))
        var payload = try #require(try JSONSerialization.jsonObject(with: Data(payloadBytes)) as? [String: Any])
        payload["groups"] = ["dredge-admins"]
        let forged = parts[0] + "." + SingleSignOn.base64URL(Array(try JSONSerialization.data(withJSONObject: payload))) + "." + parts[2]
        await #expect(throws: SingleSignOnError.self) { try await sso.person(idToken: forged, nonce: "n1") }
        // The signature changed.
        var signature = try #require(SingleSignOn.fromBase64URL(parts[2]))
        signature[signature.count / 2] ^= 0x01
        await #expect(throws: SingleSignOnError.self) { try await sso.person(idToken: parts[0] + "." + parts[1] + "." + SingleSignOn.base64URL(signature), nonce: "n1") }
        // Unsigned (`alg: none`).
        let none = SingleSignOn.base64URL(Array(#"{"alg":"none","typ":"JWT"}"#.utf8)) + "." + parts[1] + "."
        await #expect(throws: SingleSignOnError.self) { try await sso.person(idToken: none, nonce: "n1") }
        // Another sign-in's token.
        await #expect(throws: SingleSignOnError.self) { try await sso.person(idToken: token, nonce: "n2") }
        // The device grant's check (`dredge login --sso`): no nonce, but the command line's
        // client as the audience: the console's token is not one.
        #expect(try await sso.person(idToken: token, nonce: nil, audience: "dredge-console") == alice)
        await #expect(throws: SingleSignOnError.self) { try await sso.person(idToken: token, nonce: nil, audience: "dredge-cli") }
        // Past its expiry (five minutes at this provider), on a clock an hour on.
        let later = try Self.singleSignOn(provider, fixture, now: { Date().addingTimeInterval(3600) })
        await #expect(throws: SingleSignOnError.self) { try await later.person(idToken: token, nonce: "n1") }
    }
}
