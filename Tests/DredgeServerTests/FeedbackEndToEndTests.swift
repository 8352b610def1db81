import Crypto
import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeServer
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// Feedback uploads through the real processes: given while the server is down, kept across an
/// agent restart, sent when the server is back, stored once.
@Suite struct FeedbackEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    @Test(arguments: ServerBackend.all) func feedbackGivenWhileTheServerIsDownArrivesOnceWhenItIsBack(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        var (server, port) = try d.startServer()
        let state = d.dir.file("agent"), store = d.dir.file("device.sqlite")
        try PullEndToEndTests.makeDeviceStore(store)
        #expect(try d.enroll(state: state, port: port).0 == 0)
        #expect(server.stop() == 0)

        // The user gives feedback; the server is unreachable.
        let (status, output) = try ManagedProcess.run(
            "dredge-agent", ["feedback", "--state", state, "--store", store, "--uid", "u-2", "--text", "the oven didn't turn off", "--days", "2"])
        #expect(status == 0, "\(output)")
        let id = try #require(output.split(separator: "\n").first { $0.count == 32 }.map(String.init))
        #expect(Feedback.pending(stateDirectory: state) == [id])

        // The agent starts, cannot connect, and is restarted: the feedback waits in the outbox.
        var agent = try d.runAgent(state: state, store: store, log: "agent1.log")
        #expect(try ManagedProcess.waitFor { agent.output.contains("feedback upload queued") }, "\(agent.output)")
        #expect(agent.stop() == 0)
        #expect(Feedback.pending(stateDirectory: state) == [id])
        agent = try d.runAgent(state: state, store: store, log: "agent2.log")

        // The server comes back on the same port.
        server = try ManagedProcess(
            "dredge-server", ["run", "--data", d.data, "--agent-port", String(port), "--admin-port", "0", "--heartbeat-seconds", "1"],
            outputPath: d.dir.file("server2.log"))
        defer { agent.stop(); server.stop() }
        let admin = try d.adminAddress(server)
        func listed() throws -> [[String: Any]] {
            let (_, json) = try d.dredge(["feedback", "--json"], server: admin)
            return (try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]]) ?? []
        }
        #expect(try ManagedProcess.waitFor(timeout: .seconds(120)) { try listed().first?["status"] as? String == "complete" }, "\(agent.output)\n\(server.output)")
        let record = try #require(try listed().first)
        #expect(record["id"] as? String == id)
        #expect(record["uid"] as? String == "u-2")
        #expect(record["text"] as? String == "the oven didn't turn off")
        #expect(record["agentID"] as? String == (try d.agents().first?["agentID"] as? String))
        #expect(try ManagedProcess.waitFor { Feedback.pending(stateDirectory: state).isEmpty }, "the outbox is emptied once the server confirmed")

        // The files: exactly the uid's records of the two days before the feedback, the feedback
        // itself among them.
        let dir = d.data + "/feedback/\(id)"
        let manifest = try JSONSerialization.jsonObject(with: FileManager.default.contents(atPath: dir + "/manifest.json")!) as! [String: Any]
        let filter = manifest["filter"] as! [String: Any]
        let since = try #require(Timestamp(rfc3339: filter["since"] as! String)), until = try #require(Timestamp(rfc3339: filter["until"] as! String))
        #expect(abs(until.microseconds - since.microseconds - 2 * 86_400_000_000) < 2_000_000)
        try PullEndToEndTests.expectLanded(dir, store: store, filter: LogFilter(since: since, until: until, uid: "u-2"))
        let files = try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".jsonl") }.sorted()
        #expect(files.contains { contents(dir + "/" + $0).contains(#""type":"feedback""#) && contents(dir + "/" + $0).contains("the oven didn't turn off") })
        #expect((manifest["feedback"] as? [String: Any])?["text"] as? String == "the oven didn't turn off")

        // Engineers see it: `dredge feedback show` and `dredge pulls`.
        let shown = try d.dredge(["feedback", "show", id], server: admin)
        #expect(shown.output.contains("text: the oven didn't turn off") && shown.output.contains("dredge feedback fetch \(id)"), "\(shown.output)")
        #expect(!shown.output.contains(dir + "/"), "no path on the server: \(shown.output)")
        #expect(try d.dredge(["pulls"], server: admin).output.contains("\(id)"))

        // And download its files from afar: the same bytes, by a unique prefix of its id; run
        // again, nothing is sent.
        let out = d.dir.file("fetched")
        let fetched = try d.dredge(["feedback", "fetch", String(id.prefix(6)), "--out", out], server: admin)
        #expect(fetched.status == 0, "\(fetched.output)")
        for file in files + ["manifest.json"] { #expect(contents(out + "/\(id)/" + file) == contents(dir + "/" + file), "\(file)") }
        #expect(try d.dredge(["feedback", "fetch", id, "--out", out], server: admin).output.contains("already there"))
        let zipped = try d.dredge(["feedback", "fetch", id, "--zip", "--out", out], server: admin)
        #expect(FileManager.default.contents(atPath: out + "/\(id)/\(id).zip") == FileManager.default.contents(atPath: d.data + "/feedback/\(id).zip"), "\(zipped.output)")

        // Never twice: the agent restarts and sends nothing more; the server holds one feedback.
        #expect(agent.stop() == 0)
        agent = try d.runAgent(state: state, store: store, log: "agent3.log")
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["connected"] as? Bool) == true } })
        // Once connected the agent resumes what it holds (found at start, before connecting),
        // and says how many: none.
        #expect(try ManagedProcess.waitFor { agent.output.contains("uploads resumed on the new connection") }, "\(agent.output)")
        #expect(agent.output.contains("uploads=0"), "\(agent.output)")
        #expect(try listed().count == 1)
        #expect(!agent.output.contains("feedback upload queued"))
    }

    /// The server fails on its side (here it cannot create `feedback/`): the feedback stays
    /// open with the reason, the agent keeps it and tries again after a backoff; once the server
    /// is mended it arrives, without restarting anything.
    @Test(arguments: ServerBackend.all) func aFeedbackTheServerFailedToStoreIsKeptAndSentAgain(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let state = d.dir.file("agent"), store = d.dir.file("device.sqlite")
        try PullEndToEndTests.makeDeviceStore(store)
        #expect(try d.enroll(state: state, port: port).0 == 0)
        try Data("in the way".utf8).write(to: URL(fileURLWithPath: d.data + "/feedback"))
        let agent = try d.runAgent(state: state, store: store)
        defer { agent.stop() }
        let (status, output) = try ManagedProcess.run("dredge-agent", ["feedback", "--state", state, "--store", store, "--uid", "u-1", "--text", "door stuck"])
        #expect(status == 0, "\(output)")
        func listed() throws -> [[String: Any]] {
            let (_, json) = try d.dredge(["feedback", "--json"], server: admin)
            return (try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]]) ?? []
        }
        #expect(try ManagedProcess.waitFor(timeout: .seconds(60)) {
            guard let f = try listed().first else { return false }
            return f["status"] as? String == "uploading" && !((f["detail"] as? String) ?? "").isEmpty
        }, "\(agent.output)")
        #expect(Feedback.pending(stateDirectory: state).count == 1)

        // Mended while both run: the agent's next try gets through.
        try FileManager.default.removeItem(atPath: d.data + "/feedback")
        #expect(try ManagedProcess.waitFor(timeout: .seconds(120)) { try listed().first?["status"] as? String == "complete" }, "\(agent.output)")
        #expect(try ManagedProcess.waitFor { Feedback.pending(stateDirectory: state).isEmpty })
    }

    /// A feedback whose key is wrapped for another server, or that names another agent, is
    /// refused at its first frame; nothing is recorded.
    @Test(arguments: ServerBackend.all) func aFeedbackTheServerCannotOpenIsRefused(_ backend: ServerBackend) async throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let client = try d.adminClient(server)
        let (tls, key, agentID) = try await AdminEndToEndTests.enrollLinkAgent(d, port: port, hostname: "odd")
        let zip = d.dir.file("feedback.zip")
        try Data(repeating: 7, count: 10_000).write(to: URL(fileURLWithPath: zip))
        let otherServer = try RSAPrivateKey.generate()

        try await AgentLink.withConnection(host: "127.0.0.1", port: port, tls: tls, agentID: agentID, key: key) { link in
            for (name, wrapFor, claimedAgent) in [("wrong key", otherServer.publicKey, agentID), ("other agent", try LoadedDeployment(directory: d.data).encryptionKey.publicKey, Self.another(agentID))] {
                let id = Hex.encode(secureRandomBytes(16))
                let uploadKey = SymmetricKey.uploadKey()
                let upload = try SealedUpload(
                    zipPath: zip, uploadID: id, kind: .feedback, agentID: String(claimedAgent), key: uploadKey, wrappedKey: try wrapFor.wrapKey(uploadKey),
                    feedback: .with { $0.feedbackID = id; $0.uid = "u-1"; $0.text = name; $0.createdAtUs = Timestamp.now.microseconds },
                    empty: false, createdAt: Timestamp.now.microseconds)
                try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
                var refusal: WireError?
                while refusal == nil {
                    do {
                        guard let frame = try await link.next() else { break }
                        if case .error(let e)? = frame.body { refusal = e }
                    } catch {
                        break
                    }
                }
                #expect(refusal?.code == .errorUploadInvalid, "\(name)")
                #expect(refusal?.uploadID == id, "\(name)")
            }
        }
        #expect(try await client.feedback().isEmpty)
    }

    /// An agent id that is not `id` (changing its first two digits to "00" left one id in 256
    /// unchanged, and that run waited for a refusal that never came).
    static func another(_ id: String) -> String { (id.hasPrefix("00") ? "ff" : "00") + id.dropFirst(2) }
}
