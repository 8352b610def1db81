import DredgeAdminAPI
import DredgeAdminClient
import DredgeDomain
import DredgeServer
import DredgeTestSupport
import Foundation
import NIOCore
import NIOPosix
import Testing

/// The real `dredge-server` and `dredge-agent` processes on loopback.
@Suite struct AgentServerEndToEndTests {
    struct Deployment {
        let dir = TempDir()
        let created: ServerDeployment.Created

        /// - Parameters:
        ///   - adminTLS: the admin API speaks HTTPS (the default of `init`); plain HTTP where a
        ///     test calls it with URLSession, which cannot pin a CA on Linux.
        ///   - adminHost: where the admin API listens.
        ///   - backend: where the server keeps its state: SQLite in the data directory, or a
        ///     schema of its own in the tests' PostgreSQL, made by `dredge-server init --database`.
        init(adminTLS: Bool = true, adminHost: String = "127.0.0.1", backend: ServerBackend = .sqlite) throws {
            var options = ServerDeployment.Options(dataDirectory: dir.file("server"))
            options.adminPlainHTTP = !adminTLS
            options.adminHost = adminHost
            switch backend {
            case .sqlite: created = try ServerDeployment.initialize(options)
            case .postgres: created = try Self.initOnPostgres(dataDirectory: dir.file("server"), adminTLS: adminTLS, adminHost: adminHost)
            }
            // A longer handshake deadline than the default 10 s, and 30 missed heartbeats instead
            // of 3: the synchronous tests of this suite hold the test process's few cooperative
            // threads while they wait, which can stall an async test's handshake, or a hand-driven
            // link that sends no heartbeats, for seconds. Both deadlines are tested in process
            // (ConnectionRulesTests, ConnectionDeadlineTests).
            let path = data + "/server.json"
            var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
            config["connections"] = ["handshakeSeconds": 120, "missedHeartbeats": 30]
            try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: path))
        }

        var data: String { dir.file("server") }

        /// `dredge-server init --database URL`, as an operator runs it, and what it printed.
        static func initOnPostgres(dataDirectory: String, adminTLS: Bool, adminHost: String) throws -> ServerDeployment.Created {
            guard let url = TestPostgres.url else { throw DeploymentError("DREDGE_TEST_POSTGRES is not set") }
            let schema = "e_" + UUID().uuidString.lowercased().filter { $0.isLetter || $0.isNumber }
            let (status, output) = try ManagedProcess.run(
                "dredge-server",
                ["init", "--data", dataDirectory, "--database", url + (url.contains("?") ? "&" : "?") + "schema=" + schema, "--admin-listen", adminHost]
                    + (adminTLS ? [] : ["--admin-plain-http"]))
            guard status == 0 else { throw DeploymentError("dredge-server init --database failed: \(output)") }
            let lines = output.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            func value(_ label: String) throws -> String {
                guard let line = lines.first(where: { $0.hasPrefix(label) }) else { throw DeploymentError("init printed no '\(label)': \(output)") }
                return line.dropFirst(label.count).trimmingCharacters(in: .whitespaces)
            }
            guard let adminLine = lines.firstIndex(where: { $0.hasPrefix("Admin token for engineers") }), adminLine + 1 < lines.count,
                let urlLine = lines.first(where: { $0.contains("(the admin API: ") }),
                let urlStart = urlLine.range(of: "(the admin API: ")
            else { throw DeploymentError("init printed no admin token or URL: \(output)") }
            return ServerDeployment.Created(
                caPath: try value("CA certificate:"), caFingerprint: try value("CA fingerprint:"), agentAddress: try value("server:"),
                enrollmentToken: try value("enrollment token:"), adminToken: lines[adminLine + 1],
                adminURL: String(urlLine[urlStart.upperBound...].prefix(while: { $0 != ")" })))
        }

        /// - Parameter openFiles: runs the server under this open-file limit (soft and hard).
        func startServer(openFiles: Int? = nil) throws -> (ManagedProcess, Int) {
            let arguments = ["run", "--data", data, "--agent-port", "0", "--admin-port", "0", "--heartbeat-seconds", "1"]
            let log = dir.file("server-\(UUID().uuidString).log")
            let server =
                try openFiles.map { limit in try ManagedProcess("/usr/bin/prlimit", ["--nofile=\(limit):\(limit)", builtProduct("dredge-server")] + arguments, outputPath: log) }
                ?? ManagedProcess("dredge-server", arguments, outputPath: log)
            var port: Int?
            try ManagedProcess.waitFor {
                guard let line = server.output.split(separator: "\n").first(where: { $0.contains("agent listener ready") }),
                    let range = line.range(of: #"address=127\.0\.0\.1:(\d+)"#, options: .regularExpression)
                else { return false }
                port = Int(line[range].split(separator: ":").last!)
                return true
            }
            guard let port else { throw DeploymentError("server did not start: \(server.output)") }
            return (server, port)
        }

        /// The admin API's URL (`https://127.0.0.1:PORT`), from the server's log line.
        func adminAddress(_ server: ManagedProcess) throws -> String {
            var address: String?
            _ = try ManagedProcess.waitFor {
                guard let line = server.output.split(separator: "\n").first(where: { $0.contains("admin API ready") }),
                    let range = line.range(of: #"url=https?://[0-9.]+:\d+"#, options: .regularExpression),
                    line.contains("console=\(line[range].dropFirst("url=".count))/console/"),  // #50: where the console is
                    server.output.contains("dredge-server starting") && server.output.contains("version=\(DredgeVersion.current)")
                else { return false }
                address = String(line[range].dropFirst("url=".count))
                return true
            }
            guard let address else { throw DeploymentError("admin API did not start: \(server.output)") }
            return address
        }

        /// `dredge ARGS --server ADMIN --token TOKEN --ca CA` (the init admin token unless given;
        /// the deployment's CA for https), with a configuration directory of its own.
        func dredge(_ arguments: [String], server: String, token: String? = nil) throws -> (status: Int32, output: String) {
            try ManagedProcess.run(
                "dredge", arguments + ["--server", server, "--token", token ?? created.adminToken] + (server.hasPrefix("https:") ? ["--ca", data + "/ca.pem"] : []),
                environment: dredgeEnvironment)
        }

        /// The per-day files (paths on the server, as `dredge show --json` lists them) of the pull
        /// that a `dredge pull` or `dredge show` output names: the text output sends the
        /// engineer to `dredge fetch` instead of printing them.
        func pulledFiles(_ output: String, server: String) throws -> [String] {
            let id = try #require(output.firstMatch(of: /(?:queued pull|^pull) ([0-9a-f]{32})/.anchorsMatchLineEndings())?.1, "\(output)")
            let shown = try dredge(["show", String(id), "--json"], server: server)
            let pull = try #require(try JSONSerialization.jsonObject(with: Data(shown.output.utf8)) as? [String: Any], "\(shown.output)")
            let targets = try #require(pull["targets"] as? [[String: Any]])
            return targets.flatMap { ($0["files"] as? [String]) ?? [] }.filter { $0.hasSuffix(".jsonl") }
        }

        /// An admin client of the running server that trusts the deployment's CA only.
        func adminClient(_ server: ManagedProcess) throws -> AdminClient {
            try AdminClient(server: try adminAddress(server), token: created.adminToken, trust: .pinned(caPEM: contents(data + "/ca.pem")))
        }

        /// Where `dredge login` keeps its profiles in these tests: not the user's.
        var dredgeEnvironment: [String: String] { ["XDG_CONFIG_HOME": dir.file("config"), "DREDGE_SERVER": "", "DREDGE_TOKEN": "", "DREDGE_CA": "", "DREDGE_PROFILE": ""] }

        /// A device with three users' logs (`PullEndToEndTests.makeDeviceStore`), enrolled and
        /// running, once the server has seen `uid` in its heartbeats.
        func runDevice(port: Int, waitingFor uid: String = "u-1") throws -> (agent: ManagedProcess, state: String, store: String) {
            let state = dir.file("agent"), store = dir.file("device.sqlite")
            try PullEndToEndTests.makeDeviceStore(store)
            let (status, output) = try enroll(state: state, port: port)
            guard status == 0 else { throw DeploymentError("enrollment failed: \(output)") }
            let agent = try runAgent(state: state, store: store)
            guard try ManagedProcess.waitFor({ try agents().contains { ($0["activeUIDs"] as? [String])?.contains(uid) == true } }) else {
                agent.stop()
                throw DeploymentError("the agent never reported \(uid): \(agent.output)")
            }
            return (agent, state, store)
        }

        /// The agents, as `dredge-server agents --json` lists them; throws, with what the
        /// command printed, when it fails or its output is not a JSON list.
        func agents() throws -> [[String: Any]] {
            try statusList(["agents", "--data", data, "--json"])
        }

        /// A `dredge-server` status command's JSON list (standard output only).
        func statusList(_ arguments: [String]) throws -> [[String: Any]] {
            let (status, output, errors) = try ManagedProcess.runSeparately("dredge-server", arguments)
            guard status == 0 else {
                throw DeploymentError("dredge-server \(arguments.joined(separator: " ")) exited with \(status):\n\(output)\n\(errors)")
            }
            guard let list = (try? JSONSerialization.jsonObject(with: Data(output.utf8))) as? [[String: Any]] else {
                throw DeploymentError("dredge-server \(arguments.joined(separator: " ")) printed no JSON list:\n\(output)\nstderr:\n\(errors)")
            }
            return list
        }

        /// `dredge-agent run` for a state directory and a store.
        /// - Parameter reconnectMax: the agent's longest reconnect delay: short where a test
        ///   cuts connections many times (the backoff only starts again from 1 s after a
        ///   connection stayed up a minute).
        func runAgent(state: String, store: String, log: String = "agent.log", reconnectMax: Int = 60) throws -> ManagedProcess {
            try ManagedProcess("dredge-agent", ["run", "--create", "--state", state, "--store", store, "--reconnect-max-seconds", String(reconnectMax)], outputPath: dir.file(log))
        }

        /// Queues a pull with `dredge-server pull ARGS`; returns its exit status and the pull id
        /// (standard output only: a warning or a log line on standard error, as on PostgreSQL
        /// now and then, must not become part of the id), or on failure what it said.
        func pull(_ arguments: [String]) throws -> (status: Int32, id: String) {
            let (status, output, errors) = try ManagedProcess.runSeparately("dredge-server", ["pull", "--data", data] + arguments)
            return (status, status == 0 ? output.trimmingCharacters(in: .whitespacesAndNewlines) : output + errors)
        }

        /// The first target of a pull, as `dredge-server pulls --json` shows it.
        func pullTarget(_ id: String) throws -> [String: Any]? {
            let pulls = try statusList(["pulls", "--data", data, "--json"])
            return (pulls.first { $0["id"] as? String == id }?["targets"] as? [[String: Any]])?.first
        }

        func enroll(state: String, port: Int, token: String? = nil, ca: String? = nil) throws -> (Int32, String) {
            try ManagedProcess.run("dredge-agent", ["enroll", "--state", state, "--server", "localhost:\(port)", "--ca", ca ?? data + "/ca.pem", "--token", token ?? created.enrollmentToken])
        }
    }

    @Test(arguments: ServerBackend.all) func anAgentEnrollsConnectsHeartbeatsAndReconnectsAfterAServerRestart(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        var (server, port) = try d.startServer()
        let state = d.dir.file("agent"), store = d.dir.file("logs.sqlite")
        let (status, output) = try d.enroll(state: state, port: port)
        #expect(status == 0, "\(output)")
        #expect(output.contains("enrolled as agent "))
        _ = try ManagedProcess.run("dredge-agent", ["log", "--store", store, "--uid", "u-42", "oven door opened"])
        _ = try ManagedProcess.run("dredge-agent", ["log", "--store", store, "--uid", "u-7", "preheat started"])

        let agent = try d.runAgent(state: state, store: store)
        let online = try ManagedProcess.waitFor {
            try d.agents().contains { ($0["connected"] as? Bool) == true && ($0["activeUIDs"] as? [String]) == ["u-42", "u-7"] }
        }
        #expect(online, "agent log:\n\(agent.output)\nserver log:\n\(server.output)")

        // The server goes away and comes back on the same port: the agent reconnects by itself.
        // It was told the restart is planned (Protocol § 6): it tries every 1–3 s meanwhile,
        // not after a backoff that grows to a minute.
        #expect(server.stop() == 0)
        #expect(try ManagedProcess.waitFor { try d.agents().allSatisfy { ($0["connected"] as? Bool) == false } })
        let restarted = try ManagedProcess("dredge-server", ["run", "--data", d.data, "--agent-port", String(port), "--admin-port", "0", "--heartbeat-seconds", "1"], outputPath: d.dir.file("server2.log"))
        server = restarted
        #expect(try ManagedProcess.waitFor(timeout: .seconds(90)) { try d.agents().contains { ($0["connected"] as? Bool) == true } }, "agent log:\n\(agent.output)")
        let told = agent.output.components(separatedBy: "\n").drop { !$0.contains("the server is restarting") }
        #expect(told.first?.contains("expected=back within 60 s, retrying every 2 s") == true, "agent log:\n\(agent.output)")
        // Its first wait, right after the Goodbye: 50–150 % of the 2 s asked for.
        let firstWait = told.first { $0.hasSuffix("reconnecting") }.flatMap { line in
            line.firstMatch(of: #/in=([0-9.]+) s /#).flatMap { Double($0.1) }
        }
        #expect(firstWait.map { $0 >= 1 && $0 <= 3 } == true, "agent log:\n\(agent.output)")

        // Both stop gracefully.
        #expect(agent.stop() == 0)
        #expect(try ManagedProcess.waitFor { try d.agents().allSatisfy { ($0["connected"] as? Bool) == false } })
        #expect(server.stop() == 0)
        #expect(server.output.contains("dredge-server stopped"))
    }

    /// A second `dredge-server run` on the data directory of a running server (SQLite) is
    /// refused with the holder's pid, and the first one's agents stay online: before, it started
    /// beside it and marked every agent offline.
    @Test func aSecondServerOnTheSameDataDirectoryIsRefused() throws {
        let d = try Deployment()
        let (server, port) = try d.startServer()
        let (agent, _, _) = try d.runDevice(port: port)
        let second = try ManagedProcess("dredge-server", ["run", "--data", d.data, "--agent-port", "0", "--admin-port", "0"], outputPath: d.dir.file("second.log"))
        let ended = ManagedProcess.waitFor(timeout: .seconds(60)) { !second.process.isRunning }
        #expect(ended, "the second server is still running: \(second.output)")
        #expect(second.stop() != 0)
        #expect(second.output.contains("is in use by another dredge-server (pid \(server.process.processIdentifier))"), "\(second.output)")
        #expect(try d.agents().contains { ($0["connected"] as? Bool) == true }, "the first server's agent shows offline")
        #expect(agent.stop() == 0)
        #expect(server.stop() == 0)
        // Once the first has stopped, the directory is free again.
        let (again, _) = try d.startServer()
        #expect(again.stop() == 0)
    }

    @Test(arguments: ServerBackend.all) func aWrongTokenOrAWrongCAIsRefusedAndTheServerKeepsServing(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }

        let (badToken, tokenOutput) = try d.enroll(state: d.dir.file("a1"), port: port, token: "dredge_enr_guess")
        #expect(badToken == 1)
        #expect(tokenOutput.contains("enrollment refused"))
        #expect(!FileManager.default.fileExists(atPath: d.dir.file("a1/agent.json")))

        let other = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: d.dir.file("other")))
        let (badCA, caOutput) = try d.enroll(state: d.dir.file("a2"), port: port, ca: other.caPath)
        #expect(badCA == 1)
        #expect(caOutput.contains("TLS handshake failed"))

        // Garbage on the agent port: that connection fails, nobody else notices.
        let garbage = try ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port).wait()
        try garbage.writeAndFlush(ByteBuffer(string: "GET / HTTP/1.1\r\nHost: dredge\r\n\r\n")).wait()
        try? garbage.close().wait()

        let (status, output) = try d.enroll(state: d.dir.file("a3"), port: port)
        #expect(status == 0, "\(output)")
        #expect(try d.agents().count == 1)
    }

    @Test(arguments: ServerBackend.all) func anAgentThatIsNotEnrolledCannotAuthenticate(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        // Enroll with one server, then point the agent at another deployment's server that
        // trusts the same CA file: copy the CA so TLS passes and only authentication decides.
        let state = d.dir.file("agent")
        #expect(try d.enroll(state: state, port: port).0 == 0)
        let d2 = try Deployment()
        let (server2, port2) = try d2.startServer()
        defer { server2.stop() }
        var file = try JSONSerialization.jsonObject(with: FileManager.default.contents(atPath: state + "/agent.json")!) as! [String: Any]
        file["serverPort"] = port2
        try JSONSerialization.data(withJSONObject: file).write(to: URL(fileURLWithPath: state + "/agent.json"))
        try FileManager.default.removeItem(atPath: state + "/ca.pem")
        try FileManager.default.copyItem(atPath: d2.data + "/ca.pem", toPath: state + "/ca.pem")

        let agent = try d.runAgent(state: state, store: d.dir.file("logs.sqlite"))
        #expect(try ManagedProcess.waitFor { server2.output.contains("agent authentication failed") }, "\(server2.output)")
        #expect(try ManagedProcess.waitFor { agent.output.contains("errorAuthFailed") }, "\(agent.output)")
        // It says what mends it, and waits long before it tries again (AgentLivenessTests).
        #expect(try ManagedProcess.waitFor { agent.output.contains("the server refuses this agent: enroll it again") }, "\(agent.output)")
        #expect(try d2.agents().isEmpty)
        #expect(agent.stop() == 0)
    }
}
