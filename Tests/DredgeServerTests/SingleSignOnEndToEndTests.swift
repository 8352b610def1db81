import DredgeAdminAPI
@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// `dredge login --sso` (#55) as people use it: a real `dredge-server` with single sign-on, a
/// real OpenID Connect provider (django-oauth-toolkit, `Tests/sso/oidc_provider.py`), the
/// `dredge` command printing an address and a code, and the person's side at the provider
/// (`Tests/sso/sign_in_at_provider.py`: signed in, the code entered, accepted or denied).
@Suite(.serialized) struct SingleSignOnEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    /// A deployment whose server signs people in through `provider`, the command line too.
    static func deployment(_ provider: SingleSignOnTests.Provider, _ d: Deployment) throws {
        try Data(provider.secret.utf8).write(to: URL(fileURLWithPath: d.data + "/sso-secret"))
        let path = d.data + "/server.json"
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        config["sso"] = [
            "issuer": provider.issuer, "clientID": "dredge-console", "clientSecretFile": "sso-secret", "redirectURL": SingleSignOnTests.Provider.redirect,
            "readers": ["dredge-readers"], "investigators": ["dredge-investigators"], "cliClientID": "dredge-cli",
            // django-oauth-toolkit's discovery document does not name its device endpoint.
            "deviceAuthorizationURL": provider.issuer + "/device-authorization/", "cliTokenHours": 2,
        ]
        try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: path))
    }

    /// `dredge login --sso` for `person`, who accepts (or denies) at the provider what the
    /// command printed; the command's exit status and output.
    static func login(_ d: Deployment, _ admin: String, _ provider: SingleSignOnTests.Provider, _ person: String, deny: Bool = false) throws -> (status: Int32, output: String) {
        let command = try ManagedProcess(
            "dredge", ["login", "--server", admin, "--ca", d.data + "/ca.pem", "--sso", "--profile", person], outputPath: d.dir.file("login-\(person).log"),
            environment: d.dredgeEnvironment)
        var asked: (url: String, code: String)?
        ManagedProcess.waitFor(timeout: .seconds(60)) {
            if let match = command.output.firstMatch(of: /open (\S+) in a browser and enter the code (\S+)/) { asked = (String(match.1), String(match.2)) }
            return asked != nil || !command.process.isRunning
        }
        guard let asked else { throw DeploymentError("dredge login --sso printed no code: \(command.output)") }
        let (status, output, errors) = try ManagedProcess.runSeparately(
            "/usr/bin/env",
            ["python3", SingleSignOnTests.script("sign_in_at_provider.py"), "--verification", asked.url, "--user-code", asked.code, "--user", person,
             "--password=" + (provider.people[person] ?? "")] + (deny ? ["--deny"] : []))
        guard status == 0 else { throw DeploymentError("\(person) could not answer at the provider: \(output)\(errors)") }
        ManagedProcess.waitFor(timeout: .seconds(60)) { !command.process.isRunning }
        return (command.stop(), command.output)
    }

    /// `dredge ARGS` with no token or server given: the saved profile's.
    static func asProfile(_ d: Deployment, _ arguments: [String]) throws -> (status: Int32, output: String) {
        try ManagedProcess.run("dredge", arguments, environment: d.dredgeEnvironment)
    }

    @Test func dredgeLoginWithSingleSignOnGetsAShortLivedTokenWithTheRoleTheGroupsGive() throws {
        let d = try Deployment()
        let provider = try SingleSignOnTests.Provider(d.dir)
        try Self.deployment(provider, d)
        let (server, _) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)

        // Alice, an investigator by her group: signed in, her profile saved with a token that
        // ends in two hours (sso.cliTokenHours).
        let started = Date()
        let alice = try Self.login(d, admin, provider, "alice")
        #expect(alice.status == 0 && alice.output.contains("(alice@example.com), investigator, until "), "\(alice.output)")
        let whoami = try Self.asProfile(d, ["whoami", "--profile", "alice", "--json"])
        let me = try JSONDecoder.adminAPI.decode(CallerInfo.self, from: Data(whoami.output.utf8))
        #expect(me.name.hasPrefix("sso:") && me.role == .investigator && me.scope.isEverything, "\(whoami.output)")
        let lasts = try #require(me.expiresAt).timeIntervalSince(started)
        #expect(lasts > 7000 && lasts <= 7200 + 60, "\(lasts)")
        // An investigator: not an admin.
        let tokens = try Self.asProfile(d, ["tokens", "--profile", "alice"])
        #expect(tokens.status == 77, "\(tokens.output)")

        // Mallory, whose groups give no role here: refused (77), recorded, nothing saved.
        let mallory = try Self.login(d, admin, provider, "mallory")
        #expect(mallory.status == 77 && mallory.output.contains("none of their groups gives a role"), "\(mallory.output)")
        #expect(try Self.asProfile(d, ["whoami", "--profile", "mallory"]).output.contains("no profile 'mallory'"))
        // Rita denies the request at the provider: refused, saying so.
        let rita = try Self.login(d, admin, provider, "rita", deny: true)
        #expect(rita.status == 77 && rita.output.contains("denied at the identity provider"), "\(rita.output)")

        // The admin sees alice's token, named for her, and revokes it: her profile no longer signs in.
        let listed = try d.dredge(["tokens", "--json"], server: admin)
        let infos = try JSONDecoder.adminAPI.decode([TokenInfo].self, from: Data(listed.output.utf8))
        let token = try #require(infos.first { $0.name.hasPrefix(me.name + "~") }, "\(listed.output)")
        #expect(token.role == .investigator && token.expiresAt == me.expiresAt)
        let revoked = try d.dredge(["tokens", "revoke", "--name", token.name], server: admin)
        #expect(revoked.status == 0, "\(revoked.output)")
        let after = try Self.asProfile(d, ["whoami", "--profile", "alice"])
        #expect(after.status == 1 && after.output.contains("refused the admin token"), "\(after.output)")

        // The audit log: the token made for alice, by her; mallory's refusal.
        let created = try d.dredge(["audit", "--action", "token.create", "--json"], server: admin)
        let entries = try JSONDecoder.adminAPI.decode([AuditEntry].self, from: Data(created.output.utf8))
        #expect(entries.contains { $0.actor == me.name && $0.detail.contains("dredge login --sso") && $0.detail.contains("(alice@example.com), role investigator") }, "\(created.output)")
        let refused = try d.dredge(["audit", "--action", "auth.failed", "--json"], server: admin)
        #expect(refused.output.contains("mallory@example.com") && refused.output.contains("dredge login --sso"), "\(refused.output)")
    }
}
