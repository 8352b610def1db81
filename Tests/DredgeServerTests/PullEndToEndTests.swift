import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeReception
import DredgeSamples
import DredgeServer
import DredgeStore
import DredgeTestSupport
import Foundation
import NIOCore
import Testing

/// Pulls through the real processes: the operator queues a pull, the server delivers it over
/// TLS, the agent exports, encrypts and uploads, the server verifies, decrypts and unpacks.
@Suite struct PullEndToEndTests {
    /// A device store with three users over three days.
    static func makeDeviceStore(_ path: String) throws {
        let (store, ctx) = try openDeviceStore(path, host: "oven-7")
        let now = Timestamp.now
        for e in SampleLogs(count: 12_000, uids: ["u-1", "u-2", "u-3"], from: now.subtracting(.seconds(60 * 3_600)), to: now, context: ctx) { store.enqueue(e) }
        try store.close()
    }

    /// A device's store for writing test logs: the queue blocks, nothing is dropped.
    static func openDeviceStore(_ path: String, host: String) throws -> (LogStore, ContextID) {
        var config = StoreConfiguration()
        config.overflowPolicy = .block
        let store = try LogStore(path: path, configuration: config)
        return (store, try store.register(LogContext(host: host, os: "Linux", app: "oven", appVersion: "1", process: "oven[1]")))
    }

    /// What the store holds for `filter`, per day file, as the export writes it.
    static func expected(_ path: String, _ filter: LogFilter) throws -> [String: String] {
        var config = StoreConfiguration()
        config.readOnly = true
        let store = try LogStore(path: path, configuration: config)
        var days: [String: String] = [:]
        try store.forEachRecord(matching: filter) { days[$0.timestamp.utcDay + ".jsonl", default: ""] += $0.jsonLine + "\n" }
        return days
    }

    /// Checks that `dir` holds exactly what `filter` selects in the device's store at `store`:
    /// the same set of day files (nothing missing, nothing extra) beside its `manifest.json`,
    /// each with the expected lines.
    static func expectLanded(_ dir: String, store: String, filter: LogFilter, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let expected = try expected(store, filter)
        #expect(!expected.isEmpty, "the filter selects nothing: the check would prove little", sourceLocation: sourceLocation)
        let arrived = Set(try FileManager.default.contentsOfDirectory(atPath: dir))
        #expect(arrived == Set(expected.keys).union([PayloadLimits.manifestName]), "\(dir)", sourceLocation: sourceLocation)
        for (name, text) in expected { #expect(contents(dir + "/" + name) == text, "\(name)", sourceLocation: sourceLocation) }
    }

    func targetStatus(_ d: AgentServerEndToEndTests.Deployment, _ id: String) throws -> String? {
        try d.pullTarget(id)?["status"] as? String
    }

    @Test(arguments: ServerBackend.all) func aPullByUidArrivesAsExactlyTheFilteredRecords(_ backend: ServerBackend) throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let (agent, _, store) = try d.runDevice(port: port, waitingFor: "u-2")
        defer { agent.stop() }

        let (status, id) = try d.pull(["--uid", "u-2", "--since", "2d", "--level", "warning+", "--type", "network,player"])
        #expect(status == 0, "\(id)")
        #expect(try ManagedProcess.waitFor { try targetStatus(d, id) == "complete" }, "\(agent.output)\n\(server.output)")

        let agentID = try #require(try d.agents().first?["agentID"] as? String)
        let dir = d.data + "/pulls/\(id)/\(agentID)"
        let since = Timestamp.now.subtracting(.seconds(2 * 86_400))
        // The filter the server sent, re-evaluated on the device's store: the since bound was
        // resolved when the pull was made, so read it back from the manifest.
        let manifest = try JSONSerialization.jsonObject(with: FileManager.default.contents(atPath: dir + "/manifest.json")!) as! [String: Any]
        let filterSince = Timestamp(rfc3339: (manifest["filter"] as! [String: Any])["since"] as! String)!
        #expect(abs(filterSince.microseconds - since.microseconds) < 120_000_000)
        let expected = try Self.expected(store, LogFilter(since: filterSince, uid: "u-2", types: [.network, .player], levels: [.warning, .error, .critical]))
        #expect(!expected.isEmpty)
        let files = try FileManager.default.contentsOfDirectory(atPath: dir).sorted()
        #expect(files == (expected.keys + [PayloadLimits.manifestName]).sorted())
        for file in expected.keys { #expect(contents(dir + "/" + file) == expected[file], "\(file)") }
    }

    @Test(arguments: ServerBackend.all) func twoPullsAtOnceBothCompleteWhileHeartbeatsContinue(_ backend: ServerBackend) throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let (agent, _, store) = try d.runDevice(port: port, waitingFor: "u-1")
        defer { agent.stop() }
        let first = try d.pull(["--uid", "u-1"]).id
        let second = try d.pull(["--uid", "u-3", "--type", "network"]).id
        // Through the running server's admin API: on PostgreSQL an idle agent's heartbeats are
        // held in the node's memory (written every 20 minutes), which its listing shows.
        let admin = try d.adminAddress(server)
        func lastHeartbeat() throws -> String? {
            let (_, json) = try d.dredge(["agents", "--json"], server: admin)
            return ((try? JSONSerialization.jsonObject(with: Data(json.utf8))) as? [[String: Any]])?.first?["lastHeartbeatAt"] as? String
        }
        let heartbeatBefore = try #require(try lastHeartbeat())
        #expect(try ManagedProcess.waitFor { try targetStatus(d, first) == "complete" && targetStatus(d, second) == "complete" }, "\(agent.output)")
        // Heartbeats kept flowing.
        #expect(try ManagedProcess.waitFor { try lastHeartbeat().map { $0 != heartbeatBefore } ?? false })
        let agentID = try #require(try d.agents().first?["agentID"] as? String)
        for (id, filter) in [(first, LogFilter(uid: "u-1")), (second, LogFilter(uid: "u-3", types: [.network]))] {
            try Self.expectLanded(d.data + "/pulls/\(id)/\(agentID)", store: store, filter: filter)
        }
    }

    @Test(arguments: ServerBackend.all) func aPullForAnOfflineAgentIsDeliveredWhenItConnectsAndAnExpiredOneNever(_ backend: ServerBackend) async throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let state = d.dir.file("agent"), store = d.dir.file("device.sqlite")
        try Self.makeDeviceStore(store)
        #expect(try d.enroll(state: state, port: port).0 == 0)
        let agentID = try #require(try d.agents().first?["agentID"] as? String)

        // Queued while the agent is offline: one that lives, one that expires first.
        let (s1, live) = try d.pull(["--agent", agentID])
        #expect(s1 == 0, "\(live)")
        let deployment = try LoadedDeployment(directory: d.data)
        let queue = try await ServerPersistence.open(deployment).pulls
        // Issued an hour ago for a minute (an injected clock): expired before the agent comes.
        let expiring = try CommandIssuer(encryptionKey: deployment.encryptionKey, signingKey: deployment.signingKey).newPull(
            uid: "", agentID: agentID, filter: .all, targets: [agentID], lifetime: .seconds(60), requestedBy: "test", now: Timestamp.now.subtracting(.seconds(3600)))
        try await queue.create(expiring)
        let expired = expiring.id
        #expect(try targetStatus(d, live) == "queued")

        let agent = try d.runAgent(state: state, store: store)
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor { try targetStatus(d, live) == "complete" }, "\(agent.output)\n\(server.output)")
        #expect(try targetStatus(d, expired) == "expired")
        #expect(!agent.output.contains(expired), "the expired pull never reached the agent")
        // Everything the agent has, since the pull had no filter but the agent.
        try Self.expectLanded(d.data + "/pulls/\(live)/\(agentID)", store: store, filter: .all)
        // The audit log records who asked.
        #expect(try await queue.pull(live)?.requestedBy == "local-operator")
    }
}

@Suite struct FaultyNetworkTests {
    /// 40,000 records of one user with incompressible payloads: an upload of ~33 chunks.
    static func makeLargeStore(_ store: String) throws {
        let (logStore, ctx) = try PullEndToEndTests.openDeviceStore(store, host: "oven-9")
        var rng = SplitMix64(seed: 9)
        let now = Timestamp.now
        for i in 0..<40_000 {
            // Incompressible-ish payloads so the zip is large: ~10 MB.
            let noise = (0..<24).map { _ in String(rng.next(), radix: 36) }.joined()
            logStore.enqueue(LogEntry(timestamp: now.subtracting(.seconds(Int64(40_000 - i))), level: .info, type: .app, uid: "u-1", message: "event \(i) \(noise)", context: ctx))
        }
        try logStore.close()
    }

    static func pointAgent(_ state: String, at port: Int) throws {
        var file = try JSONSerialization.jsonObject(with: FileManager.default.contents(atPath: state + "/agent.json")!) as! [String: Any]
        file["serverPort"] = port
        try JSONSerialization.data(withJSONObject: file).write(to: URL(fileURLWithPath: state + "/agent.json"))
    }

    /// The agent is killed with SIGKILL mid-upload and started again: it finds the accepted
    /// command and the export on disk and finishes the upload.
    @Test(arguments: ServerBackend.all) func anAgentKilledMidUploadFinishesItAfterARestart(_ backend: ServerBackend) throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let state = d.dir.file("agent"), store = d.dir.file("device.sqlite")
        try Self.makeLargeStore(store)
        #expect(try d.enroll(state: state, port: port).0 == 0)
        // Cuts slow the upload down enough to kill the agent in the middle of it.
        let proxy = try CuttingProxy(targetPort: port, cutAfter: 300_000...600_000)
        try Self.pointAgent(state, at: proxy.port)
        var agent = try d.runAgent(state: state, store: store, reconnectMax: 1)
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["activeUIDs"] as? [String]) == ["u-1"] } })
        let (status, id) = try d.pull(["--uid", "u-1"])
        #expect(status == 0, "\(id)")
        let midway = try ManagedProcess.waitFor(timeout: .seconds(120)) {
            guard let t = try d.pullTarget(id), let received = t["chunksReceived"] as? Int, let count = t["chunkCount"] as? Int else { return false }
            return received > 2 && received < count
        }
        #expect(midway, "agent:\n\(agent.output)")
        agent.stop(SIGKILL)
        #expect(FileManager.default.fileExists(atPath: state + "/uploads/\(id)/command.pb"))
        agent = try d.runAgent(state: state, store: store, log: "agent2.log", reconnectMax: 1)
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor(timeout: .seconds(180)) { try d.pullTarget(id)?["status"] as? String == "complete" }, "agent:\n\(agent.output)")
        #expect(agent.output.contains("resuming upload"))
        // The agent removes it once the result reaches it, just after the server records it.
        #expect(try ManagedProcess.waitFor { !FileManager.default.fileExists(atPath: state + "/uploads/\(id)") }, "the agent cleans up after the upload")
        let agentID = try #require(try d.agents().first?["agentID"] as? String)
        try PullEndToEndTests.expectLanded(d.data + "/pulls/\(id)/\(agentID)", store: store, filter: LogFilter(uid: "u-1"))
    }

    /// Every connection between agent and server is cut after 0.3–1.2 MB sent by the agent,
    /// many times during one upload: the upload resumes each time and
    /// completes with exactly the filtered records. Then the server is killed with SIGKILL
    /// mid-upload and restarted: the upload resumes from the chunks stored before the kill.
    @Test(arguments: ServerBackend.all) func uploadsSurviveCutConnectionsAndAServerKilledMidUpload(_ backend: ServerBackend) throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: backend)
        var (server, port) = try d.startServer()
        let state = d.dir.file("agent"), store = d.dir.file("device.sqlite")
        try Self.makeLargeStore(store)
        #expect(try d.enroll(state: state, port: port).0 == 0)

        // The agent talks to the server through the cutting proxy.
        let proxy = try CuttingProxy(targetPort: port, cutAfter: 300_000...1_200_000)
        try Self.pointAgent(state, at: proxy.port)
        let agent = try d.runAgent(state: state, store: store, reconnectMax: 1)
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["activeUIDs"] as? [String]) == ["u-1"] } }, "agent:\n\(agent.output)")

        let (status, id) = try d.pull(["--uid", "u-1"])
        #expect(status == 0, "\(id)")
        // Kill the server once part of the upload is stored.
        let midway = try ManagedProcess.waitFor(timeout: .seconds(120)) {
            guard let t = try d.pullTarget(id), let received = t["chunksReceived"] as? Int, let count = t["chunkCount"] as? Int else { return false }
            return received > 2 && received < count
        }
        #expect(midway, "agent:\n\(agent.output)")
        #expect(server.stop(SIGKILL) != 0)
        let stored = try d.pullTarget(id)?["chunksReceived"] as? Int ?? 0
        // Every chunk acknowledged before the kill is on disk after it: that is what the
        // restarted server offers the agent in its bitmap.
        let agentID = try #require(try d.agents().first?["agentID"] as? String)
        let held = try UploadAssembler.stored(in: try DataDirectory(d.data).upload(id, agent: agentID))?.received.count ?? 0
        #expect(held >= stored, "\(held) chunks on disk, \(stored) recorded")
        // On the same port. Something else may hold it for a moment (a connection of the proxy,
        // say): the restart is tried again then.
        for attempt in 1...10 {
            server = try ManagedProcess(
                "dredge-server", ["run", "--data", d.data, "--agent-port", String(port), "--admin-port", "0", "--heartbeat-seconds", "1"],
                outputPath: d.dir.file("server-restarted-\(attempt).log"))
            let started = try ManagedProcess.waitFor(timeout: .seconds(60)) { server.output.contains("agent listener ready") || !server.process.isRunning }
            if started && server.process.isRunning { break }
            _ = server.stop()
            Thread.sleep(forTimeInterval: 0.5)
        }
        defer { server.stop() }

        #expect(try ManagedProcess.waitFor(timeout: .seconds(180)) { try d.pullTarget(id)?["status"] as? String == "complete" }, "agent:\n\(agent.output)\nserver:\n\(server.output)")
        #expect(proxy.cuts.withLockedValue { $0 } >= 3, "the connection was cut during the upload")
        #expect(stored > 0)
        // Larger than any one connection carries before it is cut (1.2 MB at most): it arrived
        // only because each connection went on from the chunks the server already held.
        let target = try #require(try d.pullTarget(id))
        #expect((target["bytes"] as? Int ?? 0) > 1_200_000, "\(target)")

        let dir = d.data + "/pulls/\(id)/\(agentID)"
        let manifestData = try #require(FileManager.default.contents(atPath: dir + "/manifest.json"))
        let manifest = try #require(try JSONSerialization.jsonObject(with: manifestData) as? [String: Any])
        #expect(manifest["record_count"] as? Int == 40_000)
        try PullEndToEndTests.expectLanded(dir, store: store, filter: LogFilter(uid: "u-1"))
    }
}
