import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeTestSupport
import DredgeWire
import Foundation
import GRDB
import Testing

@testable import DredgeServer

/// A deployment made before the one database (`server.sqlite`, `pulls.sqlite` at an older
/// schema, `feedback.sqlite`, `tokens.json`) is imported when the server first opens its data
/// directory: everything reads back through the stores, old filters are rewritten in the
/// versioned form, a damaged one stays unreadable, and a file that cannot be read stops the
/// open and imports nothing.
@Suite struct LegacyImportTests {
    let dir = TempDir()
    let issuer = CommandIssuer(encryptionKey: try! RSAPrivateKey.generate(), signingKey: .generate())
    let filter = LogFilter(since: Timestamp(microseconds: 1_000), uid: "u-1", types: ["app"], levels: [.error], text: "x")
    let agentKey = try! RSAPrivateKey.generate()
    let admin = TokenFile.generate(.admin), enrollment = TokenFile.generate(.enrollment)

    /// Writes the files of the earlier release; returns the ids of a readable and a damaged pull.
    func writeLegacyDeployment(tokensJSON: String? = nil) throws -> (kept: String, damaged: String) {
        let registry = try DatabaseQueue(path: dir.file("server.sqlite"))
        var m = DatabaseMigrator()
        SQLiteAgentDirectory.legacySchema(&m, prefix: "")
        try m.migrate(registry)
        try registry.write { db in
            try db.execute(
                sql: "INSERT INTO agent (id, public_key, hostname, os, app, app_version, enrolled_at, active_uids, generation) VALUES (?, ?, 'oven', 'Linux', 'app', '1', 1000, '[\"u-1\"]', 4)",
                arguments: [agentKey.publicKey.agentID, Data(agentKey.publicKey.spki)])
            try db.execute(sql: "INSERT INTO agent_uid (uid, agent_id) VALUES ('u-1', ?)", arguments: [agentKey.publicKey.agentID])
        }
        // pulls.sqlite as the release before versioned filters left it: at pulls-v2, filters as
        // the filter type's synthesized JSON (levels as numbers).
        let pulls = try DatabaseQueue(path: dir.file("pulls.sqlite"))
        m = DatabaseMigrator()
        SQLitePullQueue.legacySchema(&m)
        try m.migrate(pulls, upTo: "pulls-v2")
        var ids: [String] = []
        for stored in [#"{"since":1000,"uid":"u-1","types":["app"],"levels":[5],"text":"x"}"#, #"{"uid":7}"#] {
            let pull = try issuer.newPull(uid: "u-1", agentID: "", filter: filter, targets: [agentKey.publicKey.agentID], lifetime: .seconds(600), requestedBy: "t")
            try pulls.write { db in
                try db.execute(
                    sql: "INSERT INTO pull (id, uid, agent_id, filter, issued_at, expires_at, wrapped_key, requested_by, created_at) VALUES (?, 'u-1', '', ?, ?, ?, ?, 't', ?)",
                    arguments: [pull.id, stored, pull.issuedAt.microseconds, pull.expiresAt.microseconds, Data(pull.wrappedKey), Double(ids.count)])
                try db.execute(sql: "INSERT INTO pull_target (pull_id, agent_id, status, updated_at) VALUES (?, ?, 'queued', 1)", arguments: [pull.id, agentKey.publicKey.agentID])
                try db.execute(sql: "INSERT INTO audit (at, actor, action, detail) VALUES (1, 't', 'pull', ?)", arguments: [pull.id])
            }
            ids.append(pull.id)
        }
        let feedback = try DatabaseQueue(path: dir.file("feedback.sqlite"))
        m = DatabaseMigrator()
        SQLiteFeedbackInbox.legacySchema(&m)
        try m.migrate(feedback)
        try feedback.write { db in
            try db.execute(
                sql: "INSERT INTO feedback (id, agent_id, uid, text, created_at_us, received_at, status, records, files) VALUES (?, ?, 'u-1', 'the oven', 7, 2000, 'complete', 12, '[\"/f/a.jsonl\"]')",
                arguments: [String(repeating: "f", count: 32), agentKey.publicKey.agentID])
        }
        let json = try tokensJSON ?? String(decoding: JSONEncoder.iso8601.encode(TokenFile(tokens: [
            .init(name: "admin", kind: .admin, token: admin, createdAt: Date(timeIntervalSince1970: 1_000)),
            .init(name: "default", kind: .enrollment, token: enrollment, createdAt: Date(timeIntervalSince1970: 1_000)),
        ])), as: UTF8.self)
        try json.write(toFile: dir.file("tokens.json"), atomically: true, encoding: .utf8)
        return (ids[0], ids[1])
    }

    @Test func anEarlierDeploymentIsImportedOnceAndReadsBack() async throws {
        let (kept, damaged) = try writeLegacyDeployment()
        let database = try ServerDatabase(directory: dir.path)
        #expect(database.imported == ServerDatabase.legacyFiles && database.importProblems.isEmpty)
        for name in ServerDatabase.legacyFiles {
            #expect(!FileManager.default.fileExists(atPath: dir.file(name)) && FileManager.default.fileExists(atPath: dir.file(name + ".imported")), "\(name)")
        }
        let (agents, pulls, feedback, tokens) = (SQLiteAgentDirectory(database), SQLitePullQueue(database), SQLiteFeedbackInbox(database), SQLiteTokenVault(database))
        let agent = try #require(try await agents.agents().first)
        #expect(agent.agentID == agentKey.publicKey.agentID && agent.hostname == "oven" && agent.activeUIDs == ["u-1"])
        #expect(try await agents.agentIDs(withUID: "u-1") == [agent.agentID])
        #expect(try await agents.publicKey(of: agent.agentID)?.spki == agentKey.publicKey.spki)
        // Presence generations go on from where they were.
        #expect(try await agents.connected(agent.agentID, from: nil, host: .init()) == 5)

        // The old filter is rewritten in the versioned form and makes the same command.
        let stored = try await database.pool.read { try String.fetchOne($0, sql: "SELECT filter FROM pull WHERE id = ?", arguments: [kept]) }
        #expect(stored == (try StoredFilter.encode(filter)))
        #expect(try await pulls.pull(kept)?.filter == filter)
        let command = try issuer.command(try await pulls.storedPull(kept), agent: agent.agentID, agentKey: agentKey.publicKey)
        #expect(try LogFilter(wire: command.filter) == filter)
        // The damaged one stays unreadable: it never becomes a wider filter.
        #expect(try await pulls.pull(damaged)?.filter == nil)
        await #expect(throws: UnreadablePull.self) { try await pulls.storedPull(damaged) }
        let due = try await pulls.deliverable(for: agent.agentID, includingUnanswered: false)
        #expect(due.map(\.id) == [kept, damaged])
        #expect(try due.first?.stored.get().filter == filter)
        #expect(throws: UnreadablePull.self) { try due.last?.stored.get() }
        #expect(try await pulls.audit().count == 2)

        #expect(try await feedback.feedback(String(repeating: "f", count: 32))?.records == 12)
        #expect(try await tokens.admin(for: admin, now: Date())?.name == "admin")
        #expect(try await tokens.acceptsEnrollment(enrollment))

        // Opened again: nothing is imported twice.
        let again = try ServerDatabase(directory: dir.path)
        #expect(again.imported.isEmpty)
        #expect(try await SQLitePullQueue(again).pulls().count == 2)
        #expect(try await SQLiteTokenVault(again).list().count == 2)
    }

    @Test func anUnreadableFileStopsTheOpenAndImportsNothing() async throws {
        _ = try writeLegacyDeployment(tokensJSON: #"{"tokens":[{"name":"admin"}]}"#)
        #expect(throws: DeploymentError.self) { try ServerDatabase(directory: dir.path) }
        for name in ServerDatabase.legacyFiles { #expect(FileManager.default.fileExists(atPath: dir.file(name)), "\(name)") }
        let half = try DatabaseQueue(path: dir.file(ServerDatabase.fileName))
        #expect(try await half.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM agent") } == 0)
        try half.close()

        // Mended, the next open imports everything.
        try FileManager.default.removeItem(atPath: dir.file("tokens.json"))
        let database = try ServerDatabase(directory: dir.path)
        #expect(database.imported == ["server.sqlite", "pulls.sqlite", "feedback.sqlite"])
        #expect(try await SQLiteAgentDirectory(database).agents().count == 1)
        #expect(try await SQLitePullQueue(database).pulls().count == 2)
    }

    /// A filter the admin API would refuse is refused by the queue too, before anything is stored.
    @Test func anInvalidFilterIsNotQueued() async throws {
        let pulls = SQLitePullQueue(try ServerDatabase(directory: dir.path))
        await #expect(throws: (any Error).self) {
            try await pulls.create(issuer.newPull(uid: "u-1", agentID: "", filter: LogFilter(uid: "u\u{0}"), targets: ["a"], lifetime: .seconds(60), requestedBy: "t"))
        }
        #expect(try await pulls.pulls().isEmpty)
    }
}

extension JSONEncoder {
    fileprivate static var iso8601: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }
}
