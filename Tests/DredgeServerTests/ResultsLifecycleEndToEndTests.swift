import DredgeAdminAPI
import DredgeAdminClient
import DredgeTestSupport
import Foundation
import Testing
import ZIPFoundation
@testable import DredgeServer

/// An engineer sees what a pull takes on the server's disk and removes it with `dredge rm`:
/// the files and the searchable records go, the pull stays listed as removed, and the audit
/// log says who removed it and why. Real processes throughout.
@Suite struct ResultsLifecycleEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    @Test(arguments: ServerBackend.all) func anEngineerRemovesAPullAndItsRecordsWithDredgeRm(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let (agent, _, _) = try d.runDevice(port: port)
        defer { agent.stop() }
        func dredge(_ arguments: [String]) throws -> (status: Int32, output: String) { try d.dredge(arguments, server: admin) }

        let pulled = try dredge(["pull", "--uid", "u-1", "--since", "2d", "--wait"])
        #expect(pulled.status == 0, "\(pulled.output)")
        let pulls = try dredge(["pulls", "--json"])
        let listed = try #require(try JSONSerialization.jsonObject(with: Data(pulls.output.utf8)) as? [[String: Any]], "\(pulls.output)")
        let pullID = try #require(listed.first?["id"] as? String)
        let onServer = d.data + "/pulls/" + pullID
        let bytes = try #require(listed.first?["diskBytes"] as? Int, "\(pulls.output)")
        #expect(try bytes > 0 && Int64(bytes) == ResultsKeeper.size([onServer]), "the disk use is what the files take")
        let text = try dredge(["pulls"])
        #expect(text.output.contains("on the server's disk"), "\(text.output)")
        // Indexed after the files land, so `pull --wait` can return first.
        #expect(try ManagedProcess.waitFor { try dredge(["logs", "--pull", pullID, "--format", "jsonl"]).output.contains("\"uid\":\"u-1\"") })

        // The whole pull as one zip: every agent's files, each as the server holds it.
        let engineer = d.dir.file("engineer")
        let one = try dredge(["fetch", String(pullID.prefix(6)), "--one-zip", "--out", engineer])
        #expect(one.status == 0 && one.output.contains("checked"), "\(one.output)")
        let archive = try Archive(url: URL(fileURLWithPath: engineer + "/" + pullID + ".zip"), accessMode: .read)
        let zipped = archive.map(\.path).sorted()
        let agentID = try #require(try FileManager.default.contentsOfDirectory(atPath: onServer).first { !$0.hasSuffix(".zip") })
        let served = try FileManager.default.contentsOfDirectory(atPath: onServer + "/" + agentID).sorted().map { agentID + "/" + $0 }
        #expect(zipped == served, "\(zipped) vs \(served)")
        for entry in archive {
            var bytes = Data()
            _ = try archive.extract(entry) { bytes.append($0) }
            #expect(bytes == (try Data(contentsOf: URL(fileURLWithPath: onServer + "/" + entry.path))), "\(entry.path)")
        }
        let oneAgain = try dredge(["fetch", pullID, "--one-zip", "--out", engineer])
        #expect(oneAgain.status == 0, "made once, served again: \(oneAgain.output)")

        // Interrupted: it goes on from the byte it stopped at, while the zip is the same one
        // (If-Range); a part of another version of the zip is not appended to: it comes whole.
        let zipPath = engineer + "/" + pullID + ".zip"
        let whole = try Data(contentsOf: URL(fileURLWithPath: zipPath))
        try FileManager.default.removeItem(atPath: zipPath)
        try whole.prefix(whole.count / 2).write(to: URL(fileURLWithPath: zipPath + ".part"))
        try Data(FileDigest.sha256(whole).utf8).write(to: URL(fileURLWithPath: zipPath + ".part.etag"))
        let resumed = try dredge(["fetch", pullID, "--one-zip", "--out", engineer])
        #expect(resumed.status == 0 && resumed.output.contains("resumed from byte \(whole.count / 2)"), "\(resumed.output)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: zipPath)) == whole)
        #expect(!FileManager.default.fileExists(atPath: zipPath + ".part.etag"))
        try FileManager.default.removeItem(atPath: zipPath)
        try Data(repeating: 0x41, count: whole.count / 2).write(to: URL(fileURLWithPath: zipPath + ".part"))
        try Data(String(repeating: "0", count: 64).utf8).write(to: URL(fileURLWithPath: zipPath + ".part.etag"))
        let other = try dredge(["fetch", pullID, "--one-zip", "--out", engineer])
        #expect(other.status == 0 && other.output.contains("downloaded"), "\(other.output)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: zipPath)) == whole)
        #expect(try dredge(["audit", "--action", "pull.download"]).output.contains("pull \(pullID) whole zip"))
        let bytesWithZip = try ResultsKeeper.size([onServer])

        // Refused before anything is touched: a bad reason, an id of nothing.
        let badReason = try dredge(["rm", pullID, "--reason", "two\nlines"])
        #expect(badReason.status != 0 && badReason.output.contains("--reason"), "\(badReason.output)")
        let nothing = try dredge(["rm", "0000"])
        #expect(nothing.status == 1 && nothing.output.contains("no pull, feedback, tail or capture id starts with 0000"), "\(nothing.output)")
        #expect(FileManager.default.fileExists(atPath: onServer))

        let removed = try dredge(["rm", String(pullID.prefix(6)), "--reason", "TICKET-9 done", "--json"])
        #expect(removed.status == 0, "\(removed.output)")
        let reports = try #require(try JSONSerialization.jsonObject(with: Data(removed.output.utf8)) as? [[String: Any]], "\(removed.output)")
        #expect(reports.count == 1 && reports.first?["id"] as? String == pullID && reports.first?["newlyRemoved"] as? Bool == true)
        #expect(reports.first?["freedBytes"] as? Int == Int(bytesWithZip), "the bytes deleted, the zip made for the download too: \(removed.output)")
        #expect(!FileManager.default.fileExists(atPath: onServer), "the files are gone")
        // An index step still running at the removal takes its records out when it ends.
        var logs = (status: Int32(0), output: "")
        #expect(try ManagedProcess.waitFor {
            logs = try dredge(["logs", "--pull", pullID, "--format", "jsonl"])
            return !logs.output.contains("\"uid\":\"u-1\"")
        }, "its records are out of the index: \(logs.output)")
        let after = try dredge(["pulls"])
        #expect(after.output.contains("\(pullID)") && after.output.contains("removed") && after.output.contains("by admin (TICKET-9 done)"), "\(after.output)")
        let fetch = try dredge(["fetch", pullID, "--out", engineer])
        #expect(fetch.status == 1 && fetch.output.contains("removed"), "\(fetch.output)")
        let oneAfter = try dredge(["fetch", pullID, "--one-zip", "--out", engineer + "/after"])
        #expect(oneAfter.status == 1 && oneAfter.output.contains("removed"), "\(oneAfter.output)")

        let audit = try dredge(["audit", "--action", "pull.remove", "--json"])
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(audit.output.utf8)) as? [[String: Any]], "\(audit.output)")
        #expect(entries.count == 1)
        #expect(entries.first?["actor"] as? String == "admin")
        #expect((entries.first?["detail"] as? String).map { $0.contains(pullID) && $0.contains("TICKET-9 done") } == true, "\(audit.output)")

        // Again: said so, nothing more recorded.
        let again = try dredge(["rm", pullID])
        #expect(again.status == 0 && again.output.contains("was removed before"), "\(again.output)")
        #expect(try dredge(["audit", "--action", "pull.remove", "--json"]).output == audit.output)
    }

    @Test func aRetentionOutOfRangeIsRefusedAtStart() throws {
        let d = try Deployment()
        let refused = try ManagedProcess.run("dredge-server", ["run", "--data", d.data, "--keep-days", "-1"])
        #expect(refused.status != 0 && refused.output.contains("--keep-days"), "\(refused.output)")
        for minutes in ["0", "10081", "x"] {
            let session = try ManagedProcess.run("dredge-server", ["run", "--data", d.data, "--console-session-minutes", minutes])
            #expect(session.status != 0 && session.output.contains("--console-session-minutes"), "\(session.output)")
        }
    }
}
