import DredgeDomain
import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// Standing triggers end to end (#54) through the processes a deployment runs: the real
/// `dredge-server`, a real `dredge-agent run` on a device store, apps logging into it as
/// processes (`dredge-agent log`; `store-crash-child`, a `LogCenter` with a rewind buffer that
/// crashes), and an engineer's `dredge triggers`. One back end: the registry's rules run on
/// both in the conformance suite; this is about the processes.
@Suite struct TriggerEndToEndTests {
    struct Activity {
        var holders: Int
        var captures: [[String: Any]]
    }

    static func activity(_ d: AgentServerEndToEndTests.Deployment, _ admin: String, _ id: String) throws -> Activity {
        let shown = try d.dredge(["triggers", "show", id, "--json"], server: admin)
        guard shown.status == 0, let object = try JSONSerialization.jsonObject(with: Data(shown.output.utf8)) as? [String: Any] else {
            throw DeploymentError("dredge triggers show failed: \(shown.output)")
        }
        return Activity(holders: object["holders"] as? Int ?? -1, captures: object["captures"] as? [[String: Any]] ?? [])
    }

    static func created(_ output: String) throws -> String {
        guard let id = output.firstMatch(of: /[0-9a-f]{32}/) else { throw DeploymentError("no trigger id in: \(output)") }
        return String(id.0)
    }

    @Test func aTriggerFiresOncePerBudgetAndACrashedAppsMinutesArrive() throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: .sqlite)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let store = d.dir.file("device.sqlite")
        func log(_ message: String, level: String = "info", uid: String = "u-1") throws {
            let logged = try ManagedProcess.run("dredge-agent", ["log", "--store", store, "--uid", uid, "--level", level, "--type", "business", "--app", "shop", message])
            #expect(logged.status == 0, "\(logged.output)")
        }
        try log("signed in")
        #expect(try d.enroll(state: d.dir.file("agent"), port: port).0 == 0)
        let agent = try d.runAgent(state: d.dir.file("agent"), store: store)
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["activeUIDs"] as? [String])?.contains("u-1") == true } }, "\(agent.output)")

        // An engineer's trigger: errors saying "payment declined", a minute before, once per device a day.
        let made = try d.dredge(
            ["triggers", "create", "payment declined", "--level", "error+", "--grep", "payment declined", "--before", "1m", "--after", "0s", "--per-device", "1", "--reason", "E2E-54"],
            server: admin)
        #expect(made.status == 0, "\(made.output)")
        let trigger = try Self.created(made.output)
        #expect(try ManagedProcess.waitFor { try Self.activity(d, admin, trigger).holders == 1 }, "\(agent.output)")

        try log("checkout opened")
        try log("basket: 3 items")
        try log("paying with card ending 4242")
        try log("payment declined by the issuer", level: "error")
        #expect(try ManagedProcess.waitFor(timeout: .seconds(120)) { try Self.activity(d, admin, trigger).captures.first?["status"] as? String == "complete" }, "\(agent.output)")
        let capture = try #require(try Self.activity(d, admin, trigger).captures.first)
        let captureID = try #require(capture["id"] as? String)
        #expect(capture["uid"] as? String == "u-1" && capture["crash"] as? Bool == false)
        // The window's records, the match with them, searchable as the capture's.
        // (Indexed after it lands: looked for until it is.)
        let window = ["checkout opened", "basket: 3 items", "paying with card ending 4242", "payment declined by the issuer"]
        var logs = (status: Int32(0), output: "")
        #expect(try ManagedProcess.waitFor {
            logs = try d.dredge(["logs", "--capture", captureID, "--format", "jsonl"], server: admin)
            return logs.status == 0 && window.allSatisfy(logs.output.contains)
        }, "\(logs.output)")

        // Once per budget: the same error again fires nothing. (Event: a second trigger's capture,
        // of a record logged after it, arrives; the agent matches in the store's order.)
        try log("payment declined again", level: "error")
        let sentinel = try d.dredge(["triggers", "create", "sentinel", "--grep", "sentinel-mark", "--before", "10s", "--after", "0s"], server: admin)
        #expect(sentinel.status == 0, "\(sentinel.output)")
        let sentinelID = try Self.created(sentinel.output)
        #expect(try ManagedProcess.waitFor { try Self.activity(d, admin, sentinelID).holders == 1 })
        try log("sentinel-mark")
        #expect(try ManagedProcess.waitFor(timeout: .seconds(120)) { try Self.activity(d, admin, sentinelID).captures.first?["status"] as? String == "complete" })
        #expect(try Self.activity(d, admin, trigger).captures.count == 1)
        let shown = try d.dredge(["triggers", "show", trigger], server: admin)
        #expect(shown.output.contains("1 capture") && shown.output.contains("held by 1 device"), "\(shown.output)")

        // A crash: an app with a rewind buffer crashes (SIGSEGV); the agent finds its run ended
        // uncleanly and uploads its last minutes, the rewound debug records with them.
        let crashes = try d.dredge(["triggers", "create", "crashes", "--crash-only", "--app", "crash-child", "--before", "10m"], server: admin)
        #expect(crashes.status == 0, "\(crashes.output)")
        let crashTrigger = try Self.created(crashes.output)
        #expect(try ManagedProcess.waitFor { try Self.activity(d, admin, crashTrigger).holders == 1 })
        let (child, first) = try startCrashChild(["rewind", store, "50", "segv"])
        #expect(first.hasPrefix("ready"), "\(first)")
        child.waitUntilExit()
        #expect(child.terminationReason == .uncaughtSignal && child.terminationStatus == SIGSEGV)
        #expect(try ManagedProcess.waitFor(timeout: .seconds(120)) { try Self.activity(d, admin, crashTrigger).captures.first?["status"] as? String == "complete" }, "\(agent.output)")
        let crash = try #require(try Self.activity(d, admin, crashTrigger).captures.first)
        #expect(crash["crash"] as? Bool == true && crash["uid"] as? String == "crash-user" && crash["records"] as? Int == 100, "\(crash)")
        let crashID = try #require(crash["id"] as? String)
        var crashLogs = (status: Int32(0), output: "")
        #expect(try ManagedProcess.waitFor {
            crashLogs = try d.dredge(["logs", "--capture", crashID, "--format", "jsonl", "--level", "debug+"], server: admin)
            return crashLogs.output.contains("rewound 49") && crashLogs.output.contains("stored 49")
        }, "\(crashLogs.output)")
    }
}
