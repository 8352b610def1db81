import DredgeDomain
import DredgeServer
import DredgeStore
import DredgeTestSupport
import Foundation
import Testing

/// A live tail end to end (#53): the real `dredge-server`, two real `dredge-agent`s whose
/// stores hold the same user, apps logging with `dredge-agent log`, and an engineer running
/// `dredge tail` over HTTPS. One back end: the registry's rules run on both in the conformance
/// suite, and this is about the processes.
@Suite struct LiveTailEndToEndTests {
    /// The records `dredge tail --format jsonl` printed: (app, message), in order; whole lines
    /// only (the last may be half written).
    static func printed(_ output: String) -> [(app: String, message: String)] {
        var lines = output.split(separator: "\n", omittingEmptySubsequences: false)
        lines.removeLast()
        return lines.compactMap { line in
            guard line.hasPrefix("{"), let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],  // a line that is not a record is a note
                let message = object["message"] as? String
            else { return nil }
            return (object["app"] as? String ?? "", message)
        }
    }

    @Test func twoDevicesOfOneUserAreTailedAcrossARestartWithoutDuplicates() throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: .sqlite)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)

        // Two devices whose apps logged u-1 before: they hold u-1 (what they logged before is not tailed).
        let stores = ["till-a", "till-b"].map { d.dir.file("\($0).sqlite") }
        func log(_ device: Int, _ message: String, level: String = "warning", uid: String = "u-1") throws {
            let logged = try ManagedProcess.run(
                "dredge-agent", ["log", "--store", stores[device], "--uid", uid, "--level", level, "--app", device == 0 ? "till-a" : "till-b", message])
            #expect(logged.status == 0, "\(logged.output)")
        }
        try log(0, "before-a")
        try log(1, "before-b")
        var agents: [ManagedProcess] = []
        for (i, store) in stores.enumerated() {
            #expect(try d.enroll(state: d.dir.file("agent-\(i)"), port: port).0 == 0)
            agents.append(try d.runAgent(state: d.dir.file("agent-\(i)"), store: store, log: "agent-\(i).log", reconnectMax: 1))
        }
        defer { for agent in agents { agent.stop() } }
        #expect(try ManagedProcess.waitFor { try d.agents().filter { ($0["activeUIDs"] as? [String])?.contains("u-1") == true }.count == 2 })

        let arguments = ["tail", "--uid", "u-1", "--level", "warning+", "--for", "10m", "--reason", "E2E-1", "--format", "jsonl", "--server", admin, "--token", d.created.adminToken]
            + (admin.hasPrefix("https:") ? ["--ca", d.data + "/ca.pem"] : [])
        let tail = try ManagedProcess("dredge", arguments, outputPath: d.dir.file("tail.out"), environment: d.dredgeEnvironment)
        defer { tail.stop(SIGKILL) }
        // Both devices run it.
        #expect(try ManagedProcess.waitFor { tail.output.components(separatedBy: ": running").count - 1 >= 2 }, "\(tail.output)\n\(agents[0].output)")

        try log(0, "a1")
        try log(1, "b1")
        try log(0, "quiet", level: "info")
        try log(1, "someone else", uid: "u-2")
        try log(0, "a2")
        #expect(try ManagedProcess.waitFor { Self.printed(tail.output).count >= 3 }, "\(tail.output)")

        // Device A is killed mid-tail; what its app logs meanwhile is sent once it is back, once.
        agents[0].stop(SIGKILL)
        try log(0, "a3")
        try log(0, "a4")
        agents[0] = try d.runAgent(state: d.dir.file("agent-0"), store: stores[0], log: "agent-0-again.log", reconnectMax: 1)
        try log(1, "b2")
        #expect(try ManagedProcess.waitFor { Self.printed(tail.output).count >= 6 }, "\(tail.output)\n\(agents[0].output)")
        let printed = Self.printed(tail.output)
        #expect(printed.filter { $0.app == "till-a" }.map(\.message) == ["a1", "a2", "a3", "a4"], "\(tail.output)")
        #expect(printed.filter { $0.app == "till-b" }.map(\.message) == ["b1", "b2"], "\(tail.output)")
        #expect(printed.count == 6, "nothing twice, nothing filtered out let through: \(tail.output)")

        // Ctrl-C stops the tail on the server; the command says how it ended and leaves.
        #expect(tail.stop(SIGINT) == 0, "\(tail.output)")
        #expect(tail.output.contains("ended: the engineer pressed Ctrl-C"), "\(tail.output)")
        let listed = try d.dredge(["tail", "--watch", String(Self.tailID(tail.output).prefix(8))], server: admin)
        #expect(listed.status == 0 && listed.output.contains("ended: the engineer pressed Ctrl-C"), "\(listed.output)")
        let audit = try d.dredge(["audit", "--action", "tail.stop"], server: admin)
        #expect(audit.output.contains("(ended, 4 records") && audit.output.contains("(ended, 2 records"), "\(audit.output)")

        // What it showed is downloaded: each device's records as it sent them, and the contexts they name.
        let tailID = try Self.tailID(tail.output)
        let out = d.dir.file("fetched")
        let fetched = try d.dredge(["fetch", String(tailID.prefix(8)), "--out", out], server: admin)
        #expect(fetched.status == 0 && fetched.output.contains("4 file(s)") && !fetched.output.contains("still running"), "\(fetched.output)")
        var fetchedMessages: [String: [String]] = [:]
        for folder in try FileManager.default.contentsOfDirectory(atPath: out + "/" + tailID) {
            let records = try String(contentsOfFile: out + "/" + tailID + "/" + folder + "/records.jsonl", encoding: .utf8)
            let contexts = try String(contentsOfFile: out + "/" + tailID + "/" + folder + "/contexts.jsonl", encoding: .utf8)
            let app = contexts.contains(#""app":"till-a""#) ? "till-a" : "till-b"
            fetchedMessages[app] = records.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["message"] as? String
            }
        }
        #expect(fetchedMessages == ["till-a": ["a1", "a2", "a3", "a4"], "till-b": ["b1", "b2"]], "\(fetched.output)")
        let again = try d.dredge(["fetch", tailID, "--out", out], server: admin)
        #expect(again.status == 0 && again.output.components(separatedBy: "already there").count - 1 == 4, "\(again.output)")
        let downloads = try d.dredge(["audit", "--action", "tail.download"], server: admin)
        #expect(downloads.output.components(separatedBy: "tail \(tailID) agent").count - 1 == 2, "one entry per device: \(downloads.output)")
    }

    /// A verbose tail opens the devices' verbosity window; the device ends it on its own at the
    /// tail's expiry, with the server gone.
    @Test func aVerboseTailsWindowEndsOnTheDeviceWithTheServerGone() throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: .sqlite)
        let (server, port) = try d.startServer()
        var serverStopped = false
        defer { if !serverStopped { server.stop() } }
        let admin = try d.adminAddress(server)
        let store = d.dir.file("device.sqlite")
        #expect(try ManagedProcess.run("dredge-agent", ["log", "--store", store, "--uid", "u-1", "hello"]).status == 0)
        #expect(try d.enroll(state: d.dir.file("agent"), port: port).0 == 0)
        let agent = try d.runAgent(state: d.dir.file("agent"), store: store)
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["activeUIDs"] as? [String])?.contains("u-1") == true } })

        let started = Date()
        let arguments = ["tail", "--uid", "u-1", "--verbose", "--for", "8s", "--format", "jsonl", "--server", admin, "--token", d.created.adminToken]
            + (admin.hasPrefix("https:") ? ["--ca", d.data + "/ca.pem"] : [])
        let tail = try ManagedProcess("dredge", arguments, outputPath: d.dir.file("tail.out"), environment: d.dredgeEnvironment)
        defer { tail.stop(SIGKILL) }
        func windows() throws -> [VerbosityWindow] {
            let logs = try LogStore(path: store)
            defer { try? logs.close() }  // a read-only look; its close changes nothing stored
            return try logs.verbosityWindows(at: Timestamp(started))
        }
        #expect(try ManagedProcess.waitFor { try windows().map(\.uid) == ["u-1"] }, "\(tail.output)\n\(agent.output)")
        // The server goes: the window stays (its end is the tail's, not the connection's)…
        server.stop(SIGKILL)
        serverStopped = true
        #expect(try windows().map(\.uid) == ["u-1"])
        // …until the tail's expiry on the device's clock: then removed (not merely past its
        // end: read as of before the expiry, it is gone).
        #expect(try ManagedProcess.waitFor(timeout: .seconds(60)) { try windows().isEmpty }, "\(agent.output)")
    }

    /// The tail's id, from the command's first note.
    static func tailID(_ output: String) throws -> String {
        guard let range = output.range(of: #"tail [0-9a-f]{32}"#, options: .regularExpression) else { throw DeploymentError("no tail id in: \(output)") }
        return String(output[range].dropFirst("tail ".count))
    }
}
