import DredgeTestSupport
import Foundation
import Testing
@testable import DredgeServer

/// An engineer on another host — here a second loopback address, 127.0.0.2 — reaches the admin
/// API over HTTPS only, pins the deployment's CA by the fingerprint `init` printed, and then
/// pulls, reads and downloads with no shell on the server. Real processes throughout.
@Suite struct RemoteAccessEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    @Test(arguments: ServerBackend.all) func anEngineerOnAnotherAddressLogsInPullsSearchesAndDownloadsOverHTTPS(_ backend: ServerBackend) throws {
        let d = try Deployment(adminHost: "127.0.0.2", backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        #expect(admin.hasPrefix("https://127.0.0.2:"), "\(admin)")
        let (agent, _, _) = try d.runDevice(port: port)
        defer { agent.stop() }
        let env = d.dredgeEnvironment
        func dredge(_ arguments: [String]) throws -> (status: Int32, output: String) { try ManagedProcess.run("dredge", arguments, environment: env) }
        let profiles = d.dir.file("config/dredge/profiles.json")

        // Nothing trusts the deployment's CA yet, and the wrong fingerprint is not taken.
        let untrusted = try dredge(["agents", "--server", admin, "--token", d.created.adminToken])
        #expect(untrusted.status == 1 && untrusted.output.contains("is not trusted"), "\(untrusted.output)")
        let wrongPrint = "sha256:" + String(repeating: "ab", count: 32)
        let refused = try dredge(["login", "--server", admin, "--fingerprint", wrongPrint, "--token", d.created.adminToken])
        #expect(refused.status == 1 && refused.output.contains("does not have that fingerprint"), "\(refused.output)")
        #expect(!FileManager.default.fileExists(atPath: profiles))
        let badToken = try dredge(["login", "--server", admin, "--fingerprint", d.created.caFingerprint, "--token", "dredge_adm_guess"])
        #expect(badToken.status == 1 && badToken.output.contains("refused the admin token"), "\(badToken.output)")
        #expect(!FileManager.default.fileExists(atPath: profiles))
        let plain = try dredge(["login", "--server", admin.replacingOccurrences(of: "https:", with: "http:"), "--token", d.created.adminToken])
        #expect(plain.status == 1, "\(plain.output)")
        let clear = try dredge(["agents", "--server", "http://192.0.2.1:7080", "--token", d.created.adminToken])
        #expect(clear.status == 1 && clear.output.contains("plain http only to a loopback address"), "\(clear.output)")

        // The line init printed, with this run's port.
        let login = try dredge(["login", "--server", admin, "--fingerprint", d.created.caFingerprint, "--token", d.created.adminToken])
        #expect(login.status == 0, "\(login.output)")
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: profiles)[.posixPermissions] as? Int)
        #expect(mode == 0o600, "profiles.json has mode \(String(mode, radix: 8))")
        #expect(try dredge(["agents", "--online"]).output.contains("u-1"))

        // Pull and download in one go; the files are the server's, byte for byte.
        let out = d.dir.file("engineer")
        let pulled = try dredge(["pull", "--uid", "u-1", "--since", "2d", "--wait", "--out", out, "--reason", "TICKET-7"])
        #expect(pulled.status == 0, "\(pulled.output)")
        let pullID = try #require(try FileManager.default.contentsOfDirectory(atPath: out).first)
        let agentID = try #require(try FileManager.default.contentsOfDirectory(atPath: d.data + "/pulls/" + pullID).first { $0.count == 32 })
        // The device's folder goes by its host's name, then its id (#50).
        #expect(try FileManager.default.contentsOfDirectory(atPath: out + "/" + pullID) == ["oven-7_" + agentID])
        let local = out + "/" + pullID + "/oven-7_" + agentID
        let onServer = d.data + "/pulls/" + pullID + "/" + agentID
        let names = try FileManager.default.contentsOfDirectory(atPath: onServer).sorted()
        #expect(names.contains("manifest.json") && names.contains { $0.hasSuffix(".jsonl") })
        #expect(try FileManager.default.contentsOfDirectory(atPath: local).sorted() == names)
        for name in names { #expect(try contents(local + "/" + name) == contents(onServer + "/" + name), "\(name)") }

        // The reason is part of the pull: shown, and found by it (#50).
        let shown = try dredge(["show", String(pullID.prefix(8))])
        #expect(shown.status == 0 && shown.output.contains("  reason: TICKET-7\n"), "\(shown.output)")
        let byReason = try dredge(["pulls", "--reason", "ticket-7"])
        #expect(byReason.status == 0 && byReason.output.contains(pullID) && byReason.output.contains("by admin  (TICKET-7)"), "\(byReason.output)")
        let noneByReason = try dredge(["pulls", "--reason", "TICKET-8"])
        #expect(noneByReason.status == 0 && noneByReason.output == "no pulls match\n", "\(noneByReason.output)")

        // Search reads the same pull.
        // Indexed after the files land, so `pull --wait` can return first.
        var first = (status: Int32(0), output: "")
        #expect(try ManagedProcess.waitFor {
            first = try dredge(["logs", "--pull", String(pullID.prefix(8)), "--limit", "1", "--format", "jsonl"])
            return first.status == 0 && first.output.contains("\"uid\":\"u-1\"")
        }, "\(first.output)")

        // An interrupted download goes on from where it stopped; a damaged one is caught.
        let day = try #require(names.first { $0.hasSuffix(".jsonl") })
        let whole = try Data(contentsOf: URL(fileURLWithPath: local + "/" + day))
        try FileManager.default.removeItem(atPath: local + "/" + day)
        try whole.prefix(whole.count / 2).write(to: URL(fileURLWithPath: local + "/" + day + ".part"))
        let resumed = try dredge(["fetch", pullID, "--out", out])
        #expect(resumed.status == 0 && resumed.output.contains("resumed from byte \(whole.count / 2)") && resumed.output.contains("already there"), "\(resumed.output)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: local + "/" + day)) == whole)
        try FileManager.default.removeItem(atPath: local + "/" + day)
        try Data(repeating: 0x41, count: whole.count / 2).write(to: URL(fileURLWithPath: local + "/" + day + ".part"))
        let damaged = try dredge(["fetch", pullID, "--out", out])
        #expect(damaged.status == 1 && damaged.output.contains("SHA-256"), "\(damaged.output)")
        #expect(!FileManager.default.fileExists(atPath: local + "/" + day + ".part"), "the damaged part is removed")
        #expect(try dredge(["fetch", pullID, "--out", out]).status == 0)
        #expect(try Data(contentsOf: URL(fileURLWithPath: local + "/" + day)) == whole)

        // The agent's zip, too.
        let zipped = try dredge(["fetch", pullID, "--zip", "--out", out])
        #expect(zipped.status == 0, "\(zipped.output)")
        #expect(try contents(local + "/" + agentID + ".zip") == contents(d.data + "/pulls/" + pullID + "/" + agentID + ".zip"))

        // The download is in the audit log, with the token that asked: one entry for the pull,
        // naming the file it began with, not one per file (#50).
        let audit = try dredge(["audit", "--action", "pull.download", "--json"])
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(audit.output.utf8)) as? [[String: Any]], "\(audit.output)")
        #expect(entries.count == 1 && entries[0]["actor"] as? String == "admin", "\(audit.output)")
        #expect((entries.first?["detail"] as? String).map { d in names.contains { d == "pull \(pullID) agent \(agentID) file \($0)" } } == true, "\(audit.output)")
        // Read by a person, the device is named by its host.
        let read = try dredge(["audit", "--action", "pull.download"])
        #expect(read.output.contains("agent oven-7 (oven) [\(agentID)] file "), "\(read.output)")

        // The environment overrides the profile; a profile others can read is refused.
        let overridden = try ManagedProcess.run("dredge", ["agents"], environment: env.merging(["DREDGE_TOKEN": "dredge_adm_guess"]) { $1 })
        #expect(overridden.status == 1 && overridden.output.contains("refused the admin token"), "\(overridden.output)")
        chmod(profiles, 0o644)
        let exposed = try dredge(["agents"])
        #expect(exposed.status == 1 && exposed.output.contains("others can read it"), "\(exposed.output)")
        chmod(profiles, 0o600)
        #expect(try dredge(["logout"]).status == 0)
        #expect(try dredge(["agents"]).output.contains("no admin token"))
    }
}
