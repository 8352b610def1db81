import DredgeDomain
import DredgeTestSupport
import Foundation
import Testing
@testable import DredgeServer

/// `dredge logs` through real processes: a server, a running agent, a pull by `dredge pull`,
/// then the engineer reads and searches it, and a `--follow` started before the pull prints
/// its records as they arrive.
@Suite struct LogsCommandEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    /// The complete JSON lines of `output`: what follows its last newline is left out, since a
    /// process still writing (a follow) may have flushed half a line.
    static func jsonLines(_ output: String) throws -> [[String: Any]] {
        try output.split(separator: "\n", omittingEmptySubsequences: false).dropLast().filter { $0.hasPrefix("{") }.map { line in
            try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        }
    }

    @Test(arguments: ServerBackend.all) func anEngineerPullsThenReadsAndSearchesOneTimeline(_ backend: ServerBackend) throws {
        let d = try Deployment(backend: backend)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let (agent, _, _) = try d.runDevice(port: port)
        defer { agent.stop() }
        let follow = try ManagedProcess(
            "dredge", ["logs", "--follow", "--format", "jsonl", "--uid", "u-1", "--server", admin, "--token", d.created.adminToken, "--ca", d.data + "/ca.pem"],
            outputPath: d.dir.file("follow.out"), environment: d.dredgeEnvironment)
        defer { follow.stop() }

        let pulled = try d.dredge(["pull", "--uid", "u-1", "--since", "2d", "--level", "warning+", "--wait", "--json", "--reason", "TICKET-42"], server: admin)
        #expect(pulled.status == 0, "\(pulled.output)")
        // stdout (the pull, pretty JSON) and stderr (progress) come mixed: the JSON is from "{" to "}".
        let lines = pulled.output.split(separator: "\n", omittingEmptySubsequences: false)
        let start = try #require(lines.firstIndex(of: "{")), end = try #require(lines.lastIndex(of: "}"))
        let pull = try #require(try JSONSerialization.jsonObject(with: Data(lines[start...end].joined(separator: "\n").utf8)) as? [String: Any])
        let pullID = try #require(pull["id"] as? String)
        let files = try #require((pull["targets"] as? [[String: Any]])?.first?["files"] as? [String]).filter { $0.hasSuffix(".jsonl") }
        let onDisk = try files.flatMap { try contents($0).split(separator: "\n") }.count
        #expect(onDisk > 100)

        // Everything the pull brought is read back, once indexed.
        var all: [[String: Any]] = []
        try ManagedProcess.waitFor {
            all = try Self.jsonLines(try d.dredge(["logs", "--uid", "u-1", "--format", "jsonl", "--limit", "0"], server: admin).output)
            return all.count == onDisk
        }
        #expect(all.count == onDisk)
        #expect(all.allSatisfy { $0["uid"] as? String == "u-1" && $0["host"] as? String == "oven-7" && $0["source_id"] as? String == pullID })
        let times = all.compactMap { $0["ts"] as? String }
        #expect(times == times.sorted() && times.count == all.count)
        #expect(Set(all.compactMap { $0["level"] as? String }).isSubset(of: ["warning", "error", "critical"]))

        // The follow started before the pull printed the same records as they arrived.
        #expect(try ManagedProcess.waitFor(timeout: .seconds(30)) { try Self.jsonLines(follow.output).count == onDisk }, "\(follow.output.suffix(500))")

        // #50: the latest records, oldest first (--tail), and everything newest first (--reverse).
        func logLines(_ arguments: [String]) throws -> [Substring] {
            try d.dredge(["logs", "--uid", "u-1", "--format", "jsonl"] + arguments, server: admin).output.split(separator: "\n").filter { $0.hasPrefix("{") }
        }
        let ascending = try logLines(["--limit", "0"])
        #expect(ascending.count == onDisk)
        #expect(try logLines(["--tail", "7"]) == Array(ascending.suffix(7)))
        #expect(try logLines(["--reverse", "--limit", "0"]) == Array(ascending.reversed()))
        #expect(try logLines(["--tail", "3", "--reverse"]) == Array(ascending.reversed().prefix(3)))
        let cut = try d.dredge(["logs", "--uid", "u-1", "--format", "jsonl", "--reverse", "--limit", "3"], server: admin)
        #expect(cut.output.split(separator: "\n").filter { $0.hasPrefix("{") } == Array(ascending.reversed().prefix(3)))
        #expect(cut.output.contains("showing the newest 3"), "\(cut.output.suffix(300))")
        #expect(try d.dredge(["logs", "--uid", "u-1", "--tail", "0"], server: admin).status != 0)
        #expect(try d.dredge(["logs", "--uid", "u-1", "--reverse", "--follow"], server: admin).status != 0)

        // Searches: metadata, full text with a level, a time window around a record, and JSON.
        let status503 = try d.dredge(["logs", "--pull", pullID, "--where", "http.status=503", "--format", "jsonl", "--limit", "0"], server: admin)
        let expected503 = all.filter { (($0["metadata"] as? [String: Any])?["http.status"] as? Int) == 503 }
        #expect(try Self.jsonLines(status503.output).count == expected503.count && !expected503.isEmpty)
        let text = try d.dredge(["logs", "--uid", "u-1", "--words", "payment declined", "--level", "error", "--color", "never", "--limit", "2"], server: admin)
        #expect(text.status == 0)
        let textLines = text.output.split(separator: "\n").filter { !$0.hasPrefix("dredge:") }
        #expect(textLines.count == 2 && textLines.allSatisfy { $0.contains("oven-7") && $0.contains("payment declined") && $0.contains("ERROR") }, "\(text.output)")
        #expect(text.output.contains("more records match"), "a cut result says so")
        // The flag's old name still searches, and says what it matches now.
        let oldName = try d.dredge(["logs", "--uid", "u-1", "--grep", "payment declined", "--level", "error", "--color", "never", "--limit", "2"], server: admin)
        #expect(oldName.status == 0 && oldName.output.contains("is now `--words`: it matches whole words"), "\(oldName.output)")
        #expect(oldName.output.split(separator: "\n").filter { !$0.hasPrefix("dredge:") } == textLines)
        // A word that only starts others finds nothing, and says what would (#50).
        let prefix = try d.dredge(["logs", "--uid", "u-1", "--words", "paym"], server: admin)
        #expect(prefix.status == 0 && prefix.output.contains("no records match") && prefix.output.contains("--words 'paym*'"), "\(prefix.output)")
        let middle = try #require(times[times.count / 2] as String?)
        let around = try d.dredge(["logs", "--uid", "u-1", "--around", middle, "--window", "1s", "--format", "jsonl"], server: admin)
        #expect(try Self.jsonLines(around.output).contains { $0["ts"] as? String == middle }, "\(around.output.prefix(300))")
        let json = try d.dredge(["logs", "--uid", "u-1", "--format", "json", "--limit", "5"], server: admin)
        let array = try JSONSerialization.jsonObject(with: Data(json.output.split(separator: "\n").filter { !$0.hasPrefix("dredge:") }.joined(separator: "\n").utf8)) as? [[String: Any]]
        #expect(array?.count == 5, "\(json.output.prefix(300))")
        let none = try d.dredge(["logs", "--uid", "nobody"], server: admin)
        #expect(none.status == 0 && none.output.contains("no records match"))
        // A type or host no record has is told, with the known ones nearest first (#50).
        let typo = try d.dredge(["logs", "--uid", "u-1", "--type", "netwrok", "--host", "oven-8"], server: admin)
        #expect(typo.status == 0 && typo.output.contains("no records match"), "\(typo.output)")
        #expect(typo.output.contains(#"dredge: --type netwrok: no record has type "netwrok"; known: "network""#), "\(typo.output)")
        #expect(typo.output.contains(#"dredge: --host oven-8: no record has host "oven-8"; known: "oven-7""#), "\(typo.output)")
        let knownType = try d.dredge(["logs", "--uid", "nobody", "--type", "network"], server: admin)
        #expect(knownType.status == 0 && !knownType.output.contains("no record has"), "\(knownType.output)")
        let typoPull = try d.dredge(["pull", "--uid", "u-1", "--type", "netwrok,network"], server: admin)
        #expect(typoPull.status == 0 && typoPull.output.contains(#"dredge: warning: no record pulled so far has type "netwrok"; known: "network""#), "\(typoPull.output)")
        #expect(!typoPull.output.contains(#"has type "network""#), "\(typoPull.output)")

        // Ids by their start, git-style; the lists narrowed by status and uid.
        let short = String(pullID.prefix(8))
        let byPrefix = try Self.jsonLines(try d.dredge(["logs", "--pull", short, "--format", "jsonl", "--limit", "0"], server: admin).output)
        #expect(byPrefix.count == onDisk)
        let shown = try d.dredge(["show", short, "--wait"], server: admin)
        #expect(shown.status == 0 && shown.output.contains("pull \(pullID)"), "\(shown.output)")
        let complete = try d.dredge(["pulls", "--status", "complete", "--uid", "u-1"], server: admin)
        #expect(complete.output.contains(pullID), "\(complete.output)")
        let queued = try d.dredge(["pulls", "--status", "queued"], server: admin)
        #expect(!queued.output.contains(pullID) && queued.output.contains("no pulls or feedback match"), "\(queued.output)")
        let unknown = try d.dredge(["show", "ffff"], server: admin)
        #expect(unknown.status == 1 && unknown.output.contains("no pull id starts with ffff") || pullID.hasPrefix("ffff"), "\(unknown.output)")
        // The agent names the device as its newest record's context does (host oven-7, app oven 1).
        let online = try d.dredge(["agents", "--online", "--uid", "u-1", "--host", "oven-7"], server: admin)
        #expect(online.output.contains("online since") && online.output.contains("oven 1") && online.output.split(separator: "\n").count == 1, "\(online.output)")
        let nobody = try d.dredge(["agents", "--uid", "nobody"], server: admin)
        #expect(nobody.output.contains("no agent holds uid nobody (1 enrolled)"), "\(nobody.output)")
        for tool in ["dredge", "dredge-server", "dredge-agent"] {
            let version = try ManagedProcess.run(tool, ["--version"])
            #expect(version.status == 0 && version.output.trimmingCharacters(in: .whitespacesAndNewlines) == DredgeVersion.current, "\(tool): \(version.output)")
        }

        // The reasons are in the audit log, which reads by action and actor, page by page.
        _ = try d.dredge(["logs", "--uid", "u-1", "--level", "critical", "--reason", "TICKET-43"], server: admin)
        let pullsAudited = try d.dredge(["audit", "--action", "pull"], server: admin)
        #expect(pullsAudited.output.contains("reason \"TICKET-42\"") && !pullsAudited.output.contains("records.search"), "\(pullsAudited.output)")
        let searchesAudited = try d.dredge(["audit", "--action", "records", "--actor", "admin"], server: admin)
        #expect(searchesAudited.output.contains("reason=\"TICKET-43\""), "\(searchesAudited.output)")
        let firstPage = try d.dredge(["audit", "--limit", "2"], server: admin)
        let more = try #require(firstPage.output.split(separator: "\n").first { $0.hasPrefix("dredge: more entries may follow: --before ") })
        let before = String(more.split(separator: " ").last ?? "")
        let nextPage = try d.dredge(["audit", "--limit", "2", "--before", before], server: admin)
        let firstIDs = firstPage.output.split(separator: "\n").filter { !$0.hasPrefix("dredge:") }.compactMap { Int($0.split(separator: " ").first ?? "") }
        let nextIDs = nextPage.output.split(separator: "\n").filter { !$0.hasPrefix("dredge:") }.compactMap { Int($0.split(separator: " ").first ?? "") }
        #expect(firstIDs.count == 2 && !nextIDs.isEmpty && nextIDs.allSatisfy { $0 < firstIDs.min()! }, "\(firstPage.output) / \(nextPage.output)")

        // Bad flags: exit 64, and the error lists what is accepted.
        for (arguments, says) in [
            (["--since", "99999999d"], "yesterday"), (["--since", "2026-02-30"], "this machine's"), (["--level", "loud"], "critical"),
            (["--where", "status"], "key=value"), (["--type", "Bad Type"], "lowercase"), (["--around", "now", "--since", "2d"], "not both"),
            (["--around", "now", "--window", "5y"], "30s"), (["--pull", "../x"], "32 lowercase hex"), (["--words", "***"], "no word"),
            (["--grep", "a", "--words", "b"], "old name of --words"),
            (["--reason", "a\tb"], "control"), (["--follow", "--format", "json"], "jsonl"),
        ] {
            let result = try d.dredge(["logs"] + arguments, server: admin)
            #expect(result.status == 64 && result.output.contains(says), "\(arguments): \(result.output)")
        }

        // Everything the server wrote (pulled files in clear, zips, databases and their logs,
        // directories) is its user's alone (#49).
        let open = Self.readableByOthers(d.data)
        #expect(open.isEmpty, "\(open)")
        #expect(FileManager.default.fileExists(atPath: d.data + "/pulls/\(pullID)"))
    }

    /// Entries under `path` whose mode lets the group or others in, with their modes.
    static func readableByOthers(_ path: String) -> [String] {
        var found: [String] = []
        let walker = FileManager.default.enumerator(atPath: path)
        while let relative = walker?.nextObject() as? String {
            var info = stat()
            guard lstat(path + "/" + relative, &info) == 0, info.st_mode & 0o077 != 0, info.st_mode & S_IFMT != S_IFLNK else { continue }
            found.append("\(relative) \(String(info.st_mode & 0o777, radix: 8))")
        }
        return found
    }
}
