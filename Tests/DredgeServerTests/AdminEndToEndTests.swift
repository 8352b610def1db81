import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import FoundationNetworking
import NIOSSL
import Testing
@testable import DredgeServer

#if canImport(FoundationNetworking)
#endif

/// The engineers' side through real processes: the admin API behind its tokens, `dredge`, and
/// pulls that go wrong on purpose (forged, replayed, tampered), each visible on the pull.
@Suite struct AdminEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    /// An agent made of `AgentLink` (to misbehave on purpose), enrolled with a fresh key.
    static func enrollLinkAgent(_ d: Deployment, port: Int, hostname: String) async throws -> (tls: NIOSSLContext, key: RSAPrivateKey, agentID: String) {
        let tls = try AgentLink.tlsContext(caPEM: contents(d.data + "/ca.pem"))
        let key = try RSAPrivateKey.generate()
        let id = try await AgentEnrollment.register(host: "127.0.0.1", port: port, tls: tls, token: d.created.enrollmentToken, key: key, hostInfo: .with { $0.hostname = hostname })
        return (tls, key, id)
    }

    /// A raw HTTP call, to see exactly what the API answers.
    static func http(_ method: String, _ url: String, authorization: String? = nil, body: String? = nil) async throws -> (Int, [String: Any], String?) {
        var request = URLRequest(url: URL(string: url)!)
        request.httpMethod = method
        if let authorization { request.setValue(authorization, forHTTPHeaderField: "Authorization") }
        if let body { request.httpBody = Data(body.utf8) }
        let (data, response) = try await URLSession.shared.data(for: request)
        let http = response as! HTTPURLResponse
        let json = (try? JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:]
        return (http.statusCode, json, http.value(forHTTPHeaderField: "WWW-Authenticate"))
    }

    @Test(arguments: ServerBackend.all) func callsWithoutAValidTokenAreRefusedWithClearErrorsAndNothingHappens(_ backend: ServerBackend) async throws {
        let d = try Deployment(adminTLS: false, backend: backend)
        let (server, _) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)

        for authorization in [nil, "Bearer dredge_adm_guess", "Basic YWRtaW46YWRtaW4=", "Bearer " + d.created.enrollmentToken] {
            let (status, body, challenge) = try await Self.http("GET", admin + "/v1/agents", authorization: authorization)
            #expect(status == 401, "\(authorization ?? "none")")
            #expect(body["code"] as? String == "unauthorized")
            #expect(challenge?.hasPrefix("Bearer") == true)
        }
        let (status, _, _) = try await Self.http("POST", admin + "/v1/pulls", body: #"{"agent":"x","filter":{}}"#)
        #expect(status == 401)
        let (health, _, _) = try await Self.http("GET", admin + "/health")
        #expect(health == 200)

        // `dredge` says what is wrong in each case.
        let wrong = try d.dredge(["agents"], server: admin, token: "dredge_adm_guess")
        #expect(wrong.status == 1 && wrong.output.contains("refused the admin token"), "\(wrong.output)")
        let none = try ManagedProcess.run("dredge", ["agents", "--server", admin], environment: d.dredgeEnvironment)
        #expect(none.status == 1 && none.output.contains("no admin token"), "\(none.output)")
        let down = try d.dredge(["agents"], server: "http://127.0.0.1:9")
        #expect(down.status == 1 && down.output.contains("cannot reach the Dredge server"), "\(down.output)")
        let unknown = try d.dredge(["pull", "--agent", String(repeating: "0", count: 32)], server: admin)
        #expect(unknown.status == 1 && unknown.output.contains("no enrolled agent \(String(repeating: "0", count: 32))"), "\(unknown.output)")
        let noPull = try d.dredge(["show", "0123456789abcdef0123456789abcdef"], server: admin)
        #expect(noPull.status == 1 && noPull.output.contains("no pull 0123456789abcdef0123456789abcdef"), "\(noPull.output)")
        let notAnID = try d.dredge(["show", "01-x"], server: admin)
        #expect(notAnID.status == 1 && notAnID.output.contains("32 lowercase hex characters"), "\(notAnID.output)")
        let noSuchPrefix = try d.dredge(["show", "0123abcd"], server: admin)
        #expect(noSuchPrefix.status == 1 && noSuchPrefix.output.contains("no pull id starts with 0123abcd"), "\(noSuchPrefix.output)")
        let badFlag = try d.dredge(["pull", "--uid", "u", "--level", "loud"], server: admin)
        #expect(badFlag.status == 64, "\(badFlag.output)")

        // Nothing was queued, and the server still serves.
        let pulls = try d.dredge(["pulls", "--json"], server: admin)
        #expect(pulls.status == 0)
        #expect((try JSONSerialization.jsonObject(with: Data(pulls.output.utf8)) as? [Any])?.isEmpty == true, "\(pulls.output)")

        // The refusals (six above) are in the audit log with where they came from, at most once a
        // minute per host (the window itself is tested with an injected clock in AdminRouteTests).
        let refused = try d.dredge(["audit", "--action", "auth.failed", "--json"], server: admin)
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(refused.output.utf8)) as? [[String: Any]], "\(refused.output)")
        #expect(!entries.isEmpty && entries.count < 6, "\(refused.output)")
        #expect(entries.allSatisfy { ($0["detail"] as? String)?.contains("from 127.0.0.1:") == true && $0["actor"] as? String == "-" }, "\(refused.output)")
    }

    /// The data of the deployment's PostgreSQL schema (`server.json`'s `database`), as
    /// `pg_dump --data-only` prints it.
    static func pgDump(dataDirectory: String) throws -> String {
        let config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dataDirectory + "/server.json"))) as? [String: Any])
        let url = try #require(config["database"] as? String)
        let query = url.split(separator: "?", maxSplits: 1).last.map(String.init) ?? ""
        let schema = try #require(query.split(separator: "&").first { $0.hasPrefix("schema=") }?.dropFirst("schema=".count))
        let bin = try #require(try FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql").sorted { $0.compare($1, options: .numeric) == .orderedAscending }.last)
        let (status, output) = try ManagedProcess.run(
            "/usr/lib/postgresql/\(bin)/bin/pg_dump", ["--data-only", "--schema=\(schema)", "--dbname=" + String(url.prefix { $0 != "?" }) + "?sslmode=disable"])
        guard status == 0 else { throw DeploymentError("pg_dump failed: \(output)") }
        return output
    }

    @Test(arguments: ServerBackend.all) func tokensRotateAndTheAuditNamesTheTokenThatAsked(_ backend: ServerBackend) async throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)

        let created = try d.dredge(["tokens", "create", "--name", "alice"], server: admin)
        #expect(created.status == 0, "\(created.output)")
        let alice = try #require(created.output.split(separator: "\n").first { $0.hasPrefix("dredge_adm_") }).description

        // A reader (#55): says who it is, and may not pull (exit 77, saying which role it needs).
        let reader = try d.dredge(["tokens", "create", "--name", "rita", "--role", "reader", "--label", "region=eu", "--expires-in", "1d"], server: admin)
        #expect(reader.status == 0, "\(reader.output)")
        let rita = try #require(reader.output.split(separator: "\n").first { $0.hasPrefix("dredge_adm_") }).description
        let whoami = try d.dredge(["whoami"], server: admin, token: rita)
        #expect(whoami.status == 0 && whoami.output.contains("rita  reader") && whoami.output.contains("scope    label region=eu"), "\(whoami.output)")
        #expect(!whoami.output.contains("expires  never"), "\(whoami.output)")
        let refusedPull = try d.dredge(["pull", "--uid", "u-1"], server: admin, token: rita)
        #expect(refusedPull.status == 77 && refusedPull.output.contains("needs the role investigator; rita is reader"), "\(refusedPull.output)")
        let scopedAdmin = try d.dredge(["tokens", "create", "--name", "x", "--role", "admin", "--app", "oven"], server: admin)
        #expect(scopedAdmin.status == 64 && scopedAdmin.output.contains("an admin has no scope"), "\(scopedAdmin.output)")
        #expect(try d.dredge(["tokens"], server: admin).output.contains("rita  reader of label region=eu"))
        #expect(try d.dredge(["tokens", "revoke", "--name", "admin"], server: admin, token: alice).status == 0)
        #expect(try d.dredge(["agents"], server: admin).output.contains("refused the admin token"))
        let last = try d.dredge(["tokens", "revoke", "--name", "alice"], server: admin, token: alice)
        #expect(last.status == 1 && last.output.contains("last admin token"), "\(last.output)")
        switch backend {
        case .sqlite:
            let stored = ["", "-wal"].compactMap { FileManager.default.contents(atPath: d.data + "/dredge.sqlite" + $0) }
            #expect(!stored.isEmpty && stored.allSatisfy { $0.range(of: Data(alice.utf8)) == nil }, "only the hash is stored")
            #expect(try await SQLiteTokenVault(ServerDatabase(directory: d.data)).list().contains { $0.name == "alice" }, "the database holds the token's name")
        case .postgres:
            // Every table of the deployment's schema, dumped by pg_dump in a child process (not
            // opened here: this process's few threads may all be held by the synchronous tests
            // beside this one, waiting on children that wait on the database).
            let dump = try Self.pgDump(dataDirectory: d.data)
            #expect(dump.contains(TokenFile.hash(alice)) && dump.contains("alice") && !dump.contains(alice), "only the hash is stored, with the name")
        }

        // Enrollment tokens rotate the same way, at once.
        let fleet = try d.dredge(["tokens", "create", "--kind", "enrollment", "--name", "fleet-2"], server: admin, token: alice)
        let newEnrollment = try #require(fleet.output.split(separator: "\n").first { $0.hasPrefix("dredge_enr_") }).description
        #expect(try d.dredge(["tokens", "revoke", "--kind", "enrollment", "--name", "default"], server: admin, token: alice).status == 0)
        let refused = try d.enroll(state: d.dir.file("a1"), port: port)
        #expect(refused.0 == 1 && refused.1.contains("enrollment refused"), "\(refused.1)")
        #expect(try d.enroll(state: d.dir.file("a2"), port: port, token: newEnrollment).0 == 0)

        // A pull made with alice's token says so, in the pull and in the audit log.
        let agentID = try #require(try d.agents().first?["agentID"] as? String)
        let pull = try d.dredge(["pull", "--agent", agentID, "--since", "1d"], server: admin, token: alice)
        #expect(pull.status == 0, "\(pull.output)")
        let shown = try d.dredge(["pulls"], server: admin, token: alice)
        #expect(shown.output.contains("by alice") && shown.output.contains("queued"), "\(shown.output)")
        let audit = try d.dredge(["audit", "--json"], server: admin, token: alice)
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(audit.output.utf8)) as? [[String: Any]])
        #expect(entries.contains { $0["actor"] as? String == "alice" && $0["action"] as? String == "pull" && ($0["detail"] as? String)?.contains(agentID) == true })
        #expect(entries.contains { $0["actor"] as? String == "admin" && $0["action"] as? String == "token.create" })
        #expect(entries.contains { $0["actor"] as? String == "alice" && $0["action"] as? String == "token.revoke" })
    }

    @Test(arguments: ServerBackend.all) func dredgePullWaitShowsProgressThenTheFiles(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let agent = try d.runDevice(port: port, waitingFor: "u-2").agent
        defer { agent.stop() }

        let (status, output) = try d.dredge(["pull", "--uid", "u-2", "--since", "2d", "--type", "network", "--wait", "--timeout", "120"], server: admin)
        #expect(status == 0, "\(output)\n\(agent.output)")
        #expect(output.contains("[##############################] 100%  complete"), "\(output)")
        #expect(output.contains("1 of 1 agent(s) complete"))
        // Devices by name, and how to get the files, never where they lie on the server (#50).
        let agentID = try #require(try d.agents().first?["agentID"] as? String)
        #expect(output.contains("[\(agentID.prefix(8))]: complete") && output.contains("dredge fetch ") && output.contains("/console/pulls/"), "\(output)")
        #expect(!output.contains(d.data), "\(output)")
        let files = try d.pulledFiles(output, server: admin)
        #expect(!files.isEmpty)
        for file in files {
            #expect(file.hasPrefix("/") && FileManager.default.fileExists(atPath: file), "\(file)")
            #expect(contents(file).split(separator: "\n").allSatisfy { $0.contains(#""uid":"u-2""#) && $0.contains(#""type":"network""#) })
        }
    }

    /// Approvals end to end (#55): with `approvals.required`, `dredge pull` needs a reason, the
    /// running agent is sent nothing (its heartbeats come and go, the pull stays queued) until
    /// another person's `dredge approve`, after which it completes; the audit log says who
    /// asked, who approved and why. One back end: the rules are the queue's, run on both by
    /// `PullQueueConformanceTests`.
    @Test func aPullAwaitsApprovalThenCompletes() throws {
        let d = try Deployment()
        let path = d.data + "/server.json"
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        config["approvals"] = ["required": true]
        try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: path))
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let agent = try d.runDevice(port: port, waitingFor: "u-2").agent
        defer { agent.stop() }

        let unexplained = try d.dredge(["pull", "--uid", "u-2", "--since", "2d"], server: admin)
        #expect(unexplained.status == 1 && unexplained.output.contains("requires a reason"), "\(unexplained.output)")
        let made = try d.dredge(["pull", "--uid", "u-2", "--since", "2d", "--reason", "SUP-12"], server: admin)
        #expect(made.status == 0 && made.output.contains("awaits approval"), "\(made.output)")
        let id = String(try #require(made.output.split(separator: "\n").first(where: { $0.count == 32 })))
        let asked = Date()
        // Until approved, the connected agent is sent nothing: two heartbeats later it is still queued.
        func lastHeartbeat() throws -> Date? {
            let listed = try d.dredge(["agents", "--json"], server: admin)
            let agents = try #require(try JSONSerialization.jsonObject(with: Data(listed.output.utf8)) as? [[String: Any]])
            return (agents.first?["lastHeartbeatAt"] as? String).flatMap { try? Date($0, strategy: .iso8601) }
        }
        let deadline = Date().addingTimeInterval(60)
        while try (lastHeartbeat() ?? .distantPast) < asked.addingTimeInterval(2), Date() < deadline { Thread.sleep(forTimeInterval: 0.2) }
        let waiting = try d.dredge(["show", id], server: admin)
        #expect(waiting.output.contains("awaiting approval") && waiting.output.contains("queued"), "\(waiting.output)")
        #expect(try d.dredge(["approve", String(id.prefix(8))], server: admin).output.contains("another person approves it"))

        let bob = try #require(try d.dredge(["tokens", "create", "--name", "bob", "--role", "investigator"], server: admin).output
            .split(separator: "\n").first { $0.hasPrefix("dredge_adm_") }).description
        let approved = try d.dredge(["approve", String(id.prefix(8))], server: admin, token: bob)
        #expect(approved.status == 0 && approved.output.contains("approved pull \(id)"), "\(approved.output)")
        let done = try d.dredge(["show", id, "--wait"], server: admin)
        #expect(done.status == 0 && done.output.contains("approved by bob"), "\(done.output)\n\(agent.output)")
        let audit = try d.dredge(["audit", "--action", "pull.approve", "--json"], server: admin)
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(audit.output.utf8)) as? [[String: Any]])
        #expect(entries.count == 1 && entries.first?["actor"] as? String == "bob", "\(audit.output)")
        #expect((entries.first?["detail"] as? String)?.contains("requested by admin; reason \"SUP-12\"") == true, "\(audit.output)")
    }

    /// `dredge triggers` end to end (#54): a trigger defined from flags, listed, shown by a
    /// prefix of its id, disabled and removed, each audited; flags a device would refuse are
    /// refused before anything is sent. One back end: the registry's rules run on both in
    /// `TriggerRegistryConformanceTests`.
    @Test func dredgeTriggersDefinesListsShowsDisablesAndRemoves() throws {
        let d = try Deployment()
        let (server, _) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let made = try d.dredge(
            ["triggers", "create", "payment declined", "--level", "error+", "--type", "business", "--grep", "payment declined", "--where", "code=51", "--crash",
             "--label", "region=eu", "--before", "10m", "--after", "0s", "--per-device", "2", "--for", "12h", "--reason", "T-1"], server: admin)
        #expect(made.status == 0 && made.output.contains("defined: fires on level=error,critical type=business text~\"payment declined\" code=51 and crashes on region=eu"), "\(made.output)")
        #expect(made.output.contains("captures 600 s before to 0 s after; at most 2 a device and 100 in all a day"), "\(made.output)")
        let id = String(try #require(made.output.split(separator: " ").dropFirst().first))
        #expect(id.count == 32, "\(made.output)")
        let listed = try d.dredge(["triggers"], server: admin)
        #expect(listed.status == 0 && listed.output.contains("\(id)  in force  \"payment declined\"") && listed.output.contains("by admin"), "\(listed.output)")
        let shown = try d.dredge(["triggers", "show", String(id.prefix(6))], server: admin)
        #expect(shown.status == 0 && shown.output.contains("reason \"T-1\"") && shown.output.contains("0 captures from 0 devices in the last day; held by 0 devices"), "\(shown.output)")
        let json = try d.dredge(["triggers", "show", id, "--json"], server: admin)
        let activity = try #require(try JSONSerialization.jsonObject(with: Data(json.output.utf8)) as? [String: Any])
        let object = try #require(activity["trigger"] as? [String: Any], "\(json.output)")
        #expect(object["id"] as? String == id && (object["definition"] as? [String: Any])?["crash"] as? Bool == true, "\(json.output)")
        #expect((activity["captures"] as? [Any])?.isEmpty == true && activity["holders"] as? Int == 0, "\(json.output)")

        for (flags, says) in [
            (["--crash", "--for", "100d"], "cannot read --for"), (["--crash", "--before", "2h"], "cannot read --before"), (["--level", "loud"], "cannot read --level"),
            (["--crash-only", "--grep", "x"], "--crash-only takes no"), ([], "say what fires it"),
        ] {
            let refused = try d.dredge(["triggers", "create", "bad"] + flags, server: admin)
            #expect(refused.status != 0 && refused.output.contains(says), "\(flags): \(refused.output)")
        }
        // --crash alone: only crashes fire it (no empty match, which every record would fire).
        let crashes = try d.dredge(["triggers", "create", "crashes", "--crash", "--json"], server: admin)
        let crashOnly = try #require(try JSONSerialization.jsonObject(with: Data(crashes.output.utf8)) as? [String: Any])
        let definition = try #require(crashOnly["definition"] as? [String: Any])
        #expect(definition["match"] == nil && definition["crash"] as? Bool == true, "\(crashes.output)")
        #expect(try d.dredge(["triggers", "disable", String(id.prefix(6)), "--reason", "noisy"], server: admin).output.contains("disabled trigger \(id)"))
        let again = try d.dredge(["triggers", "disable", id], server: admin)
        #expect(again.status == 1 && again.output.contains("disabled already (admin: noisy)"), "\(again.output)")
        #expect(try d.dredge(["triggers"], server: admin).output.contains("\(id)  disabled"))
        #expect(try d.dredge(["triggers", "rm", id], server: admin).output.contains("removed trigger \(id)"))
        #expect(try d.dredge(["triggers", "rm", crashOnly["id"] as? String ?? ""], server: admin).status == 0)
        #expect(try d.dredge(["triggers"], server: admin).output.contains("no triggers"))
        let audit = try d.dredge(["audit", "--json"], server: admin)
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(audit.output.utf8)) as? [[String: Any]])
        #expect(Set(entries.compactMap { $0["action"] as? String }.filter { $0.hasPrefix("trigger") }) == ["trigger", "trigger.disable", "trigger.remove"], "\(audit.output)")
    }

    /// The agent trusts a different signing key than the server's: every command it gets is,
    /// to it, forged. It refuses with the reason, the pull shows it, the other agent is served.
    @Test(arguments: ServerBackend.all) func aForgedCommandIsRejectedAndTheReasonShowsOnThePull(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let store = d.dir.file("device.sqlite")
        try PullEndToEndTests.makeDeviceStore(store)
        for name in ["honest", "fooled"] { #expect(try d.enroll(state: d.dir.file(name), port: port).0 == 0) }
        let statePath = d.dir.file("fooled/agent.json")
        var file = try JSONSerialization.jsonObject(with: FileManager.default.contents(atPath: statePath)!) as! [String: Any]
        file["serverSigningKey"] = Hex.encode(ServerSigningKey.generate().verifyingKey.rawRepresentation)
        try JSONSerialization.data(withJSONObject: file).write(to: URL(fileURLWithPath: statePath))
        let fooledID = file["agentID"] as! String

        let honest = try d.runAgent(state: d.dir.file("honest"), store: store, log: "honest.log")
        let fooled = try d.runAgent(state: d.dir.file("fooled"), store: store, log: "fooled.log")
        defer { honest.stop(); fooled.stop() }
        #expect(try ManagedProcess.waitFor { try d.agents().filter { ($0["activeUIDs"] as? [String])?.contains("u-1") == true }.count == 2 })

        let (status, output) = try d.dredge(["pull", "--uid", "u-1", "--type", "network", "--wait", "--timeout", "120"], server: admin)
        #expect(status == 2, "one agent refused: \(output)")
        #expect(output.contains("[\(fooledID.prefix(8))]: rejected (rejectBadSignature"), "\(output)")
        #expect(output.contains("1 of 2 agent(s) complete"), "\(output)")
    }

    /// An enrolled agent that misbehaves: it accepts a pull and sends a chunk that was changed
    /// after sealing. The server refuses the chunk, fails the pull with the reason, keeps the
    /// tampered bytes out of the data directory, and goes on serving.
    @Test(arguments: ServerBackend.all) func aTamperedChunkFailsThePullAndTheServerGoesOn(_ backend: ServerBackend) async throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let client = try d.adminClient(server)
        let (tls, key, agentID) = try await Self.enrollLinkAgent(d, port: port, hostname: "rogue")
        let payload = d.dir.file("payload.zip")
        try Data((0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }).write(to: URL(fileURLWithPath: payload))

        let pullID = try await AgentLink.withConnection(host: "127.0.0.1", port: port, tls: tls, agentID: agentID, key: key) { link in
            let pull = try await client.createPull(PullRequest(uid: nil, agent: agentID, filter: .all))
            var command: WirePullCommand?
            while command == nil, let frame = try await link.next() {
                if case .pullCommand(let c)? = frame.body { command = c }
            }
            let cmd = try #require(command)
            try await link.send(.with { $0.commandAccepted = .with { $0.commandID = cmd.commandID } })
            let upload = try SealedUpload(
                zipPath: payload, uploadID: cmd.commandID, kind: .pull, agentID: agentID, key: try key.unwrapKey(Array(cmd.wrappedKey)),
                empty: false, createdAt: Timestamp.now.microseconds)
            try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
            var sealed = try upload.chunk(0)
            sealed[sealed.count / 2] ^= 0x01
            try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = cmd.commandID; $0.index = 0; $0.ciphertext = Data(sealed) } })
            // The server answers the chunk with an error (the link throws it) or a refusal.
            reading: while true {
                do {
                    guard let frame = try await link.next() else { break reading }
                    switch frame.body {
                    case .error?, .chunkAck?, .uploadResult?: break reading
                    default: continue
                    }
                } catch {
                    break reading
                }
            }
            return pull.id
        }
        // The refusal is sent once the failure is stored: no wait here (a CI run once read
        // `uploading` when the refusal went out first).
        let failed = try await client.pull(pullID)
        #expect(failed.targets.first?.status == .failed)
        #expect(failed.targets.first?.detail == "chunk 0 failed authentication")
        #expect(!FileManager.default.fileExists(atPath: d.data + "/pulls/\(pullID)/\(agentID)"))
        // The server goes on: the same agent authenticates again and heartbeats.
        try await AgentLink.withConnection(host: "127.0.0.1", port: port, tls: tls, agentID: agentID, key: key) { link in
            try await link.heartbeat(activeUIDs: ["u-9"])
            _ = try await link.next()
        }
        #expect(try await client.agents().first?.activeUIDs == ["u-9"])
    }
}
