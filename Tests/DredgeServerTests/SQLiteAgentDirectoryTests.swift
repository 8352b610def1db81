import DredgeEnvelope
@testable import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
import GRDB
import Testing

@Suite struct SQLiteAgentDirectoryTests {
    @Test func pullsByUidFindTheAgentsWhoseLastHeartbeatReportedIt() async throws {
        let dir = TempDir()
        let registry = SQLiteAgentDirectory(try ServerDatabase(directory: dir.path))
        let a = try await registry.enroll(publicKey: try RSAPrivateKey.generate().publicKey, host: .with { $0.hostname = "a" })
        let b = try await registry.enroll(publicKey: try RSAPrivateKey.generate().publicKey, host: .with { $0.hostname = "b" })
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-1", "u-2"] })
        try await registry.heartbeat(b, .with { $0.activeUids = ["u-2"] })
        #expect(try await registry.agentIDs(withUID: "u-2") == [a, b].sorted())
        #expect(try await registry.agentIDs(withUID: "u-1") == [a])
        // The uid leaves a's store: the next heartbeat says so.
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-3"] })
        #expect(try await registry.agentIDs(withUID: "u-1").isEmpty)
        #expect(try await registry.agentIDs(withUID: "u-2") == [b])
        #expect(try await registry.agentIDs(withUID: "u-3") == [a])
        // A heartbeat for an agent that is not enrolled changes nothing.
        try await registry.heartbeat("0000", .with { $0.activeUids = ["u-3"] })
        #expect(try await registry.agentIDs(withUID: "u-3") == [a])
        #expect(try await registry.isEnrolled(a))
        #expect(try await !registry.isEnrolled("0000"))
        // Reopening keeps it.
        #expect(try await SQLiteAgentDirectory(try ServerDatabase(directory: dir.path)).agentIDs(withUID: "u-3") == [a])
    }

    /// What a heartbeat reads and deletes by agent is found through an index, never by reading
    /// the whole table: `agent_uid` is keyed by uid first, and without its index by agent each
    /// full heartbeat read all of it twice (most of the server's CPU while 18,720 agents
    /// reconnected).
    @Test func lookupsByAgentUseAnIndex() async throws {
        let dir = TempDir()
        let database = try ServerDatabase(directory: dir.path)
        for sql in [
            "SELECT uid FROM agent_uid WHERE agent_id = ? UNION SELECT uid FROM agent_user WHERE agent_id = ?",
            "DELETE FROM agent_uid WHERE agent_id = ?",
            "DELETE FROM agent_user WHERE agent_id = ?",
        ] {
            let plan = try await database.pool.read { db in
                try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + sql, arguments: StatementArguments(Array(repeating: "a", count: sql.filter { $0 == "?" }.count)))
                    .map { $0["detail"] as String }
            }
            #expect(!plan.isEmpty && plan.allSatisfy { !$0.hasPrefix("SCAN") }, "\(sql): \(plan)")
        }
    }

    /// Heartbeats with unchanged uids wait in memory and are written together; what the
    /// registry answers is never behind, a change of uids is written at once, and a heartbeat
    /// time never goes back.
    @Test func heartbeatsAreWrittenInBatchesAndReadBackCurrent() async throws {
        let dir = TempDir()
        let database = try ServerDatabase(directory: dir.path)
        let registry = SQLiteAgentDirectory(database, heartbeatFlush: .seconds(3600))
        let a = try await registry.enroll(publicKey: try RSAPrivateKey.generate().publicKey, host: .with { $0.hostname = "a" })
        func stored() async throws -> Double? {
            try await database.pool.read { try Double.fetchOne($0, sql: "SELECT last_heartbeat_at FROM agent WHERE id = ?", arguments: [a]) }
        }
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-1"] }, now: Date(timeIntervalSince1970: 100))
        #expect(try await stored() == 100)
        // Same uids: held, not yet in the database.
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-1"]; $0.stats.records = 7 }, now: Date(timeIntervalSince1970: 200))
        #expect(try await stored() == 100)
        // The registry's own answer is current (what it holds, shown over the row), and
        // listing writes nothing.
        let record = try #require(try await registry.agents().first)
        #expect(record.lastHeartbeatAt == Date(timeIntervalSince1970: 200) && record.storeRecords == 7)
        #expect(try await stored() == 100)
        try await registry.flushHeartbeats()
        #expect(try await stored() == 200)
        // An older heartbeat held after a newer one was written does not take the time back.
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-1"] }, now: Date(timeIntervalSince1970: 150))
        try await registry.flushHeartbeats()
        #expect(try await stored() == 200)
        // New uids: written at once, and found by uid.
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-2"] }, now: Date(timeIntervalSince1970: 300))
        #expect(try await stored() == 300)
        #expect(try await registry.agentIDs(withUID: "u-2") == [a])
        #expect(try await registry.agentIDs(withUID: "u-1").isEmpty)
    }

    /// An idle agent (same uids, no report) is written once per `presenceRefresh` however often
    /// it heartbeats, its listing stays current meanwhile, and its disconnection writes what is
    /// held of it.
    @Test func anIdleAgentsRowIsWrittenOncePerRefreshAndAtDisconnection() async throws {
        let dir = TempDir()
        let database = try ServerDatabase(directory: dir.path)
        let clock = HeartbeatHoldTests.Clock()
        let registry = SQLiteAgentDirectory(database, heartbeatFlush: .seconds(1), presenceRefresh: .seconds(300), clock: clock.read)
        let a = try await registry.enroll(publicKey: try RSAPrivateKey.generate().publicKey, host: .with { $0.hostname = "a" })
        let generation = try await registry.connected(a, from: "127.0.0.1", host: .with { $0.hostname = "a" })
        func stored() async throws -> Double? {
            try await database.pool.read { try Double.fetchOne($0, sql: "SELECT last_heartbeat_at FROM agent WHERE id = ?", arguments: [a]) }
        }
        let commits = CommitCounter()
        database.pool.add(transactionObserver: commits)
        // The first heartbeat is written in full; then one every 30 s for 9 minutes.
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-1"] }, now: Date(timeIntervalSince1970: 0))
        #expect(try await stored() == 0 && commits.count == 1)
        for beat in 1...18 {
            clock.advance(.seconds(30))
            try await registry.heartbeat(a, .with { $0.activeUids = ["u-1"] }, now: Date(timeIntervalSince1970: Double(beat) * 30))
            let listed = try #require(try await registry.agents().first)
            #expect(listed.lastHeartbeatAt == Date(timeIntervalSince1970: Double(beat) * 30), "beat \(beat)")
        }
        // Written again once, at the heartbeat that found the row 300 s old (the 10th).
        #expect(commits.count == 2)
        #expect(try await stored() == 300)
        // Disconnection writes the newest held heartbeat with the presence.
        try await registry.disconnected(a, generation: generation)
        #expect(try await stored() == 540)
        #expect(try await registry.agents().first?.connected == false)
        #expect(commits.count == 3)
    }

    /// A flush of many held heartbeats is written in transactions of at most
    /// ``SQLiteAgentDirectory/heldPerTransaction`` rows, so other writes wait for one batch, not the
    /// whole flush; every row gets its own time and count.
    @Test func aLargeFlushIsWrittenInBatchesAndLosesNoHeartbeat() async throws {
        let dir = TempDir()
        let database = try ServerDatabase(directory: dir.path)
        let registry = SQLiteAgentDirectory(database, heartbeatFlush: .seconds(3600))
        let first = try await registry.enroll(publicKey: try RSAPrivateKey.generate().publicKey, host: .with { $0.hostname = "a" })
        // More agents than two batches hold, copied from the enrolled one (an RSA key each
        // would take the test seconds).
        let count = 2 * SQLiteAgentDirectory.heldPerTransaction + 22
        let ids = [first] + (1..<count).map { String(format: "agent-%04d", $0) }
        try await database.pool.write { db in
            for id in ids.dropFirst() {
                try db.execute(
                    sql: """
                        INSERT INTO agent (id, public_key, hostname, os, app, app_version, enrolled_at, labels)
                        SELECT ?, randomblob(32), hostname, os, app, app_version, enrolled_at, labels FROM agent WHERE id = ?
                        """,
                    arguments: [id, first])
            }
        }
        for id in ids { try await registry.heartbeat(id, .with { $0.activeUids = ["u-1"] }, now: Date(timeIntervalSince1970: 100)) }
        for (i, id) in ids.enumerated() {
            try await registry.heartbeat(id, .with { $0.activeUids = ["u-1"]; $0.stats.records = UInt64(i) }, now: Date(timeIntervalSince1970: 200 + Double(i)))
        }
        let commits = CommitCounter()
        database.pool.add(transactionObserver: commits)
        try await registry.flushHeartbeats()
        #expect(commits.count == (count + SQLiteAgentDirectory.heldPerTransaction - 1) / SQLiteAgentDirectory.heldPerTransaction)
        let rows = try await database.pool.read { db in
            try Row.fetchAll(db, sql: "SELECT id, last_heartbeat_at, store_records FROM agent").map { (String.fromDatabaseValue($0[0]) ?? "", Double.fromDatabaseValue($0[1]), Int.fromDatabaseValue($0[2])) }
        }
        #expect(rows.count == count)
        for (i, id) in ids.enumerated() {
            let row = try #require(rows.first { $0.0 == id })
            #expect(row.1 == 200 + Double(i) && row.2 == i, "agent \(id)")
        }
    }
}

/// Counts the transactions committed that changed the agent table.
final class CommitCounter: TransactionObserver, @unchecked Sendable {
    private let lock = NSLock()
    private var changed = false
    private var commits = 0
    var count: Int { lock.withLock { commits } }

    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool { eventKind.tableName == "agent" }
    func databaseDidChange(with event: DatabaseEvent) { lock.withLock { changed = true } }
    func databaseDidCommit(_ db: Database) { lock.withLock { if changed { commits += 1 }; changed = false } }
    func databaseDidRollback(_ db: Database) { lock.withLock { changed = false } }
}
