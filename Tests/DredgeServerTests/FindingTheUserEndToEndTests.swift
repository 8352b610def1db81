import DredgeDomain
import DredgeSamples
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// An engineer finds a user whatever the age of their records, and a pull by a uid no device
/// holds yet waits for one: the real server, agent and `dredge` on loopback.
@Suite struct FindingTheUserEndToEndTests {
    @Test(arguments: ServerBackend.all) func aUserIsFoundByOldRecordsAndAPullWaitsForTheDeviceThatLogsItLater(_ backend: ServerBackend) throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)

        // A till whose store holds u-old's records of 40 hours ago (older than a day: not an
        // active uid) and u-now's of the last hour; its newest record names the device.
        let store = d.dir.file("till.sqlite")
        var config = StoreConfiguration()
        config.overflowPolicy = .block
        let logs = try LogStore(path: store, configuration: config)
        let old = try logs.register(LogContext(host: "till-7", os: "Linux", app: "checkout", appVersion: "3.1.0", process: "checkout[1]"))
        let current = try logs.register(
            LogContext(host: "till-7", os: "Linux", app: "checkout", appVersion: "3.2.1", process: "checkout[2]", extra: ["store": "berlin", "lane": "4"]))
        let now = Timestamp.now
        var oldRecords = 0
        for e in SampleLogs(count: 40, uids: ["u-old"], from: now.subtracting(.seconds(41 * 3_600)), to: now.subtracting(.seconds(40 * 3_600)), context: old) {
            logs.enqueue(e)
            if e.uid == "u-old" { oldRecords += 1 }
        }
        for e in SampleLogs(count: 40, uids: ["u-now"], from: now.subtracting(.seconds(3_600)), to: now, context: current) { logs.enqueue(e) }
        try logs.close()

        // Nobody holds u-later yet: the pull is queued with no agent and waits.
        // Three minutes: long enough for what follows, and `show --wait` below ends by then if the join never comes.
        let waiting = try d.dredge(["pull", "--uid", "u-later", "--expires-in", "3"], server: admin)
        #expect(waiting.status == 0 && waiting.output.contains("no agent holds uid u-later yet"), "\(waiting.output)")
        let waitingID = try #require(waiting.output.split(separator: "\n").map(String.init).first(where: WireID.isValid), "\(waiting.output)")

        #expect(try d.enroll(state: d.dir.file("agent"), port: port).0 == 0)
        let agent = try d.runAgent(state: d.dir.file("agent"), store: store)
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["reportedUsers"] as? Int) == 2 } }, "\(agent.output)")

        // `dredge agents --uid u-old`: the till, named by its newest record, with when it last saw u-old.
        let found = try d.dredge(["agents", "--uid", "u-old", "--online", "--host", "till-7", "--json"], server: admin)
        let agents = try #require(try JSONSerialization.jsonObject(with: Data(found.output.utf8)) as? [[String: Any]], "\(found.output)")
        #expect(agents.count == 1, "\(found.output)")
        let till = try #require(agents.first)
        #expect(till["hostname"] as? String == "till-7" && till["app"] as? String == "checkout" && till["appVersion"] as? String == "3.2.1", "\(till)")
        #expect(till["labels"] as? [String: String] == ["store": "berlin", "lane": "4"], "\(till)")
        #expect(till["activeUIDs"] as? [String] == ["u-now"], "u-old is not active, and still found")
        let lastSeen = try #require(till["uidLastSeen"] as? String)
        let seen = try #require(ISO8601DateFormatter().date(from: lastSeen))
        let expected = Date(timeIntervalSince1970: Double(now.subtracting(.seconds(40 * 3_600)).microseconds / 3_600_000_000 * 3_600))
        #expect(abs(seen.timeIntervalSince(expected)) <= 3_600, "the hour of u-old's newest record: \(lastSeen)")
        let text = try d.dredge(["agents", "--uid", "u-old"], server: admin)
        #expect(text.status == 0 && text.output.contains("checkout 3.2.1") && text.output.contains("lane=4,store=berlin") && text.output.contains("u-old last seen"), "\(text.output)")
        let nobody = try d.dredge(["agents", "--uid", "u-nobody"], server: admin)
        #expect(nobody.status == 0 && nobody.output.contains("no agent holds uid u-nobody"), "\(nobody.output)")

        // A pull by u-old reaches the till and brings its records (not the anonymous ones).
        let pulled = try d.dredge(["pull", "--uid", "u-old", "--wait", "--timeout", "120"], server: admin)
        #expect(pulled.status == 0 && pulled.output.contains("1 of 1 agent(s) complete"), "\(pulled.output)")
        let pulledRecords = Self.records(of: try d.pulledFiles(pulled.output, server: admin))
        #expect(oldRecords > 20 && pulledRecords.count == oldRecords, "\(pulled.output)")

        // The till logs u-later: its next heartbeat holds the uid, and the waiting pull joins it.
        let logged = try ManagedProcess.run("dredge-agent", ["log", "--store", store, "--uid", "u-later", "signed in at the till"])
        #expect(logged.status == 0, "\(logged.output)")
        let shown = try d.dredge(["show", waitingID, "--wait"], server: admin)
        #expect(shown.status == 0 && shown.output.contains("1 of 1 agent(s) complete"), "\(shown.output)\n\(agent.output)")
        let shownRecords = Self.records(of: try d.pulledFiles(shown.output, server: admin))
        #expect(shownRecords.contains { $0.contains("signed in at the till") }, "\(shown.output)")
    }

    /// The records of these per-day files.
    static func records(of files: [String]) -> [Substring] { files.flatMap { contents($0).split(separator: "\n") } }
}
