import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// `dredge-server backup` on a running server with a real agent connected, `restore` onto
/// another path, and `run` there (#56): the agent comes back by itself, the pull's records and
/// files are there, and a new pull works. The backup's consistency during uploads is tested in
/// process (``ServerBackupTests``, ``PostgresBackupTests``); this proves the commands and the
/// processes, on each back end: on PostgreSQL the backup dumps the database with `pg_dump` and
/// the restore loads it into a new database.
@Suite struct BackupEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    @Test(arguments: ServerBackend.all)
    func aRunningServerBackedUpAndRestoredElsewhereGetsItsAgentBack(backend: ServerBackend) throws {
        let d = try Deployment(adminTLS: false, backend: backend)
        let (server, port) = try d.startServer()
        var running = server
        defer { running.stop() }
        let admin = try d.adminAddress(server)
        let (agent, _, _) = try d.runDevice(port: port)
        defer { agent.stop() }

        let pulled = try d.dredge(["pull", "--uid", "u-1", "--since", "2d", "--wait"], server: admin)
        #expect(pulled.status == 0, "\(pulled.output)")
        let pullID = String(try #require(pulled.output.firstMatch(of: /pull ([0-9a-f]{32})/)?.1, "\(pulled.output)"))
        func records(_ admin: String) throws -> Int {
            try d.dredge(["logs", "--pull", pullID, "--format", "jsonl", "--limit", "0"], server: admin).output.split(separator: "\n").filter { $0.hasPrefix("{") }.count
        }
        // Every record of it searchable (they become so block by block), as many as landed.
        let landed = try #require((try d.pullTarget(pullID)?["detail"] as? String)?.firstMatch(of: /^(\d+) records/).map { Int($0.1)! })
        var before = 0
        try ManagedProcess.waitFor {
            before = try records(admin)
            return before == landed
        }
        try #require(before == landed && landed > 0)

        // Backed up while it runs, with the agent connected.
        let backup = d.dir.file("backup")
        let (backedUp, said) = try ManagedProcess.run("dredge-server", ["backup", "--data", d.data, "--to", backup])
        #expect(backedUp == 0, "\(said)")
        #expect(said.contains("1 agents, 1 pulls (1 complete targets)") && said.contains("Restore it with: dredge-server restore --from"), "\(said)")
        #expect(server.stop() == 0)

        // Restored on another path (another host's), on the same port: the agent comes back.
        let restored = d.dir.file("elsewhere/data")
        let (checked, verdict) = try ManagedProcess.run("dredge-server", ["restore", "--from", backup, "--check"])
        #expect(checked == 0 && verdict.contains("all as listed"), "\(verdict)")
        var into: [String] = []
        if backend == .postgres {
            // A new database on the same PostgreSQL, the deployment's schema in it.
            #expect(said.contains("dump:      PostgreSQL") && said.contains("--database postgres://"), "\(said)")
            let schema = try #require(try LoadedDeployment(directory: d.data).config.database?.firstMatch(of: /schema=([a-z0-9_]+)/)?.1)
            into = ["--database", TestPostgres.url(try TestPostgres.newDatabase(), schema: String(schema))]
        }
        let (restoredStatus, restoredSaid) = try ManagedProcess.run("dredge-server", ["restore", "--from", backup, "--data", restored] + into)
        #expect(restoredStatus == 0, "\(restoredSaid)")
        #expect(backend == .sqlite || restoredSaid.contains("Restored the database"), "\(restoredSaid)")
        running = try ManagedProcess(
            "dredge-server", ["run", "--data", restored, "--agent-port", String(port), "--admin-port", "0", "--heartbeat-seconds", "1"],
            outputPath: d.dir.file("restored.log"))
        let restoredAdmin = try d.adminAddress(running)
        let back = try ManagedProcess.waitFor(timeout: .seconds(120)) {
            try d.statusList(["agents", "--data", restored, "--json"]).contains { ($0["connected"] as? Bool) == true }
        }
        #expect(back, "agent log:\n\(agent.output.suffix(2000))")

        // The pull's records are searchable and its files download, checked against their SHA-256.
        #expect(try records(restoredAdmin) == before)
        let out = d.dir.file("fetched")
        let fetched = try d.dredge(["fetch", pullID, "--out", out], server: restoredAdmin)
        #expect(fetched.status == 0, "\(fetched.output)")
        let days = FileManager.default.enumerator(atPath: out)?.compactMap { $0 as? String }.filter { $0.hasSuffix(".jsonl") } ?? []
        #expect(!days.isEmpty, "\(fetched.output)")
        // And the restored server pulls again.
        let again = try d.dredge(["pull", "--uid", "u-2", "--since", "2d", "--wait"], server: restoredAdmin)
        #expect(again.status == 0 && again.output.contains("complete"), "\(again.output)")
        #expect(running.stop() == 0)
    }
}
