import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// Today's programs on a deployment an earlier release made and ran (#56): each fixture in
/// Tests/upgrade/fixtures/ was made by that release's own `dredge-server`, `dredge-agent` and
/// `dredge` (Tests/upgrade/make-fixture.sh): a data directory with an enrolled agent and a
/// landed, indexed pull; the agent's state and store beside it. Today's server opens it and
/// migrates it, the old pull's records and files are there, the agent enrolled by the old
/// release connects with today's agent, and a new pull works. A fixture made on PostgreSQL
/// (`make-fixture.sh --postgres`) holds its schema as `database.sql`, loaded into a new
/// database of the tests' PostgreSQL (and runs only where there is one).
@Suite struct UpgradeEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    static let directory = Vectors.repositoryRoot.appendingPathComponent("Tests/upgrade/fixtures").path

    /// The fixtures' names (`NAME.json` beside `NAME.tar.gz`).
    static let all: [String] = ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [])
        .filter { $0.hasSuffix(".json") }.map { String($0.dropLast(".json".count)) }.sorted()
    /// Those this run can use: the PostgreSQL ones only with the tests' PostgreSQL.
    static let fixtures = all.filter { TestPostgres.url != nil || (try? fixture($0))?.backend != "postgres" }

    static func fixture(_ name: String) throws -> Fixture {
        try JSONDecoder().decode(Fixture.self, from: Data(contentsOf: URL(fileURLWithPath: directory + "/" + name + ".json")))
    }

    struct Fixture: Decodable {
        /// `sqlite` (or absent: the fixtures made before the choice) or `postgres`.
        var backend: String?
        var commit: String
        var version: String
        var adminToken: String
        var agentID: String
        var pull: String
        var uid: String
        var records: Int
    }

    @Test func thereIsAFixture() throws {
        #expect(!Self.fixtures.isEmpty, "no fixture in \(Self.directory)")
        for name in Self.all { #expect(try Self.fixture(name).version.isEmpty == false, "\(name).json reads") }
    }

    @Test(arguments: fixtures) func anEarlierReleasesDeploymentUpgradesAndRunsOn(_ name: String) throws {
        let fixture = try Self.fixture(name)
        let dir = TempDir()
        let unpack = Process()
        unpack.executableURL = URL(fileURLWithPath: "/usr/bin/tar")
        unpack.arguments = ["-xzf", Self.directory + "/" + name + ".tar.gz", "-C", dir.path]
        try unpack.run()
        unpack.waitUntilExit()
        try #require(unpack.terminationStatus == 0)
        let data = dir.file("server")
        // Kept until removed: the fixture's pull is older than any retention by the time this runs.
        let configPath = data + "/server.json"
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: configPath))) as? [String: Any])
        config["results"] = ["keepDays": 0]
        // And a copy of the audit log outside the database, which the old release did not have.
        config["audit"] = ["file": "audit.jsonl"]
        if fixture.backend == "postgres" {
            // The old release's schema, loaded into a database of its own; server.json names it.
            let schema = try #require((config["database"] as? String)?.firstMatch(of: /schema=([a-z0-9_]+)/).map { String($0.1) })
            let database = try TestPostgres.newDatabase()
            // pg_dump's \restrict lines (newer dumps) are for psql's safety, not the schema: left out, so any psql loads it.
            let sql = try String(contentsOfFile: dir.file("database.sql"), encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
                .filter { !$0.hasPrefix("\\restrict") && !$0.hasPrefix("\\unrestrict") }.joined(separator: "\n")
            try sql.write(toFile: dir.file("database-plain.sql"), atomically: true, encoding: .utf8)
            let (loaded, said) = try ManagedProcess.run("/usr/bin/psql", [database, "-q", "-v", "ON_ERROR_STOP=1", "-c", "CREATE EXTENSION IF NOT EXISTS unaccent SCHEMA public", "-f", dir.file("database-plain.sql")])
            try #require(loaded == 0, "\(said)")
            config["database"] = TestPostgres.url(database, schema: schema)
        }
        try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: configPath))

        let server = try ManagedProcess(
            "dredge-server", ["run", "--data", data, "--agent-port", "0", "--admin-port", "0", "--heartbeat-seconds", "1"], outputPath: dir.file("server.log"))
        defer { server.stop() }
        var port: Int?, admin: String?
        _ = try ManagedProcess.waitFor {
            let lines = server.output.split(separator: "\n")
            port = lines.first { $0.contains("agent listener ready") }?.firstMatch(of: /address=127\.0\.0\.1:(\d+)/).map { Int($0.1)! }
            admin = lines.first { $0.contains("admin API ready") }?.firstMatch(of: /url=(http:\/\/127\.0\.0\.1:\d+)/).map { String($0.1) }
            return port != nil && admin != nil
        }
        let (agentPort, adminURL) = (try #require(port, "\(server.output)"), try #require(admin, "\(server.output)"))
        let environment = ["XDG_CONFIG_HOME": dir.file("config"), "DREDGE_SERVER": "", "DREDGE_TOKEN": "", "DREDGE_CA": "", "DREDGE_PROFILE": ""]
        func dredge(_ arguments: [String]) throws -> (status: Int32, output: String) {
            try ManagedProcess.run("dredge", arguments + ["--server", adminURL, "--token", fixture.adminToken], environment: environment)
        }
        func records(_ pull: String) throws -> Int {
            try dredge(["logs", "--pull", pull, "--format", "jsonl", "--limit", "0"]).output.split(separator: "\n").filter { $0.hasPrefix("{") }.count
        }

        // The old pull, its records and its files, through the admin token the old release made.
        var found = 0
        try ManagedProcess.waitFor {
            found = try records(fixture.pull)
            return found == fixture.records
        }
        #expect(found == fixture.records, "made by \(fixture.version) at \(fixture.commit.prefix(9)):\n\(server.output.suffix(3000))")
        let fetched = try dredge(["fetch", fixture.pull, "--out", dir.file("fetched")])
        #expect(fetched.status == 0, "\(fetched.output)")
        #expect(FileManager.default.enumerator(atPath: dir.file("fetched"))?.contains { ($0 as? String)?.hasSuffix(".jsonl") == true } == true)

        // The agent the old release enrolled, run by today's agent, connects with its key.
        let agent = try ManagedProcess(
            "dredge-agent", ["run", "--state", dir.file("agent"), "--store", dir.file("store.sqlite"), "--server", "localhost:\(agentPort)"],
            outputPath: dir.file("agent.log"))
        defer { agent.stop() }
        let online = try ManagedProcess.waitFor {
            let (status, output, _) = try ManagedProcess.runSeparately("dredge-server", ["agents", "--data", data, "--json"])
            guard status == 0, let list = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [[String: Any]] else { return false }
            return list.contains { $0["agentID"] as? String == fixture.agentID && $0["connected"] as? Bool == true && ($0["activeUIDs"] as? [String])?.contains(fixture.uid) == true }
        }
        #expect(online, "agent log:\n\(agent.output.suffix(2000))")

        // And pulls again: everything the store holds for the uid, the old records included.
        let again = try dredge(["pull", "--uid", fixture.uid, "--since", "3650d", "--wait"])
        #expect(again.status == 0 && again.output.contains("complete"), "\(again.output)")
        let id = try #require(again.output.firstMatch(of: /pull ([0-9a-f]{32})/).map { String($0.1) }, "\(again.output)")
        #expect(try ManagedProcess.waitFor { try records(id) == fixture.records })

        // The server's keys rotated: the old release's agent state kept no key generation, and
        // today's agent takes the announcement its pinned key verifies, then pulls on.
        func pinned() throws -> Int? {
            let file = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dir.file("agent") + "/agent.json"))) as? [String: Any]
            return file?["keyGeneration"] as? Int
        }
        #expect(try pinned() == nil, "the old release's agent.json names no generation")
        let rotated = try ManagedProcess.run("dredge-server", ["keys", "rotate", "--data", data, "--overlap", "1h"])
        #expect(rotated.status == 0, "\(rotated.output)")
        #expect(try ManagedProcess.waitFor { try pinned() == 2 }, "agent log:\n\(agent.output.suffix(2000))")
        let afterRotation = try dredge(["pull", "--uid", fixture.uid, "--since", "3650d", "--wait"])
        #expect(afterRotation.status == 0 && afterRotation.output.contains("complete"), "\(afterRotation.output)")
        // The old release's audit entries, chained when the schema step that adds the chain ran.
        let verified = try dredge(["audit", "verify"])
        #expect(verified.status == 0 && verified.output.contains("audit log: intact"), "\(verified.output)")
        #expect(server.output.contains("audit log chain intact"), "\(server.output.suffix(3000))")
        // The copy reaches the last entry, its hash the chain's.
        let last = try #require(verified.output.firstMatch(of: /last entry (\d+), hash ([0-9a-f]{64})/), "\(verified.output)")
        let copied = try ManagedProcess.waitFor {
            let text = (try? String(contentsOfFile: data + "/audit.jsonl", encoding: .utf8)) ?? ""
            return text.split(separator: "\n").contains { $0.contains("\"id\":\(last.1)") && $0.contains("\"hash\":\"\(last.2)\"") }
        }
        #expect(copied, "\(server.output.suffix(2000))")
        #expect(agent.stop() == 0)
        #expect(server.stop() == 0)
    }
}
