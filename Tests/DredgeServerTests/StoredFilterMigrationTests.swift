import DredgeDomain
import DredgeEnvelope
import DredgeTestSupport
import DredgeWire
import Foundation
import GRDB
import Testing

@testable import DredgeServer

/// Pulls stored before filters had a versioned form are rewritten in it when the server opens
/// its database; a row that was already damaged stays unreadable and its pull fails, closed.
@Suite struct StoredFilterMigrationTests {
    @Test func oldFiltersAreRewrittenAndDamagedOnesStayUnreadable() throws {
        let dir = TempDir()
        let path = dir.file("pulls.sqlite")
        let key = try RSAPrivateKey.generate()
        let agentKey = try RSAPrivateKey.generate()
        let issuer = CommandIssuer(encryptionKey: key, signingKey: .generate())
        let filter = LogFilter(since: Timestamp(microseconds: 1_000), uid: "u-1", types: ["app"], levels: [.error], text: "x")
        var old = try PullStore(path: path)
        func queue() throws -> String {
            let pull = try issuer.newPull(uid: "u-1", agentID: "", filter: filter, targets: ["a"], lifetime: .seconds(600), requestedBy: "t")
            try old.create(pull)
            return pull.id
        }
        let kept = try queue(), damaged = try queue()
        // What the previous release wrote: the filter type's synthesized JSON, levels as numbers.
        try old.db.write { db in
            try db.execute(sql: #"UPDATE pull SET filter = '{"since":1000,"uid":"u-1","types":["app"],"levels":[5],"text":"x"}' WHERE id = ?"#, arguments: [kept])
            try db.execute(sql: #"UPDATE pull SET filter = '{"uid":7}' WHERE id = ?"#, arguments: [damaged])
            try db.execute(sql: "DELETE FROM grdb_migrations WHERE identifier = 'pulls-v3-stored-filter'")
        }
        old = try PullStore(path: path)
        let stored = try old.db.read { try String.fetchOne($0, sql: "SELECT filter FROM pull WHERE id = ?", arguments: [kept]) }
        #expect(stored == (try StoredFilter.encode(filter)))
        #expect(try old.pull(kept)?.filter == filter)
        let command = try issuer.command(try old.storedPull(kept), agent: "a", agentKey: agentKey.publicKey)
        #expect(try LogFilter(wire: command.filter) == filter)

        #expect(try old.pull(damaged)?.filter == nil)
        #expect(throws: UnreadablePull.self) { try old.storedPull(damaged) }
    }

    /// A filter the admin API would refuse is refused by the queue too, before anything is stored.
    @Test func anInvalidFilterIsNotQueued() throws {
        let dir = TempDir()
        let pulls = try PullStore(path: dir.file("pulls.sqlite"))
        let issuer = CommandIssuer(encryptionKey: try RSAPrivateKey.generate(), signingKey: .generate())
        #expect(throws: (any Error).self) {
            try pulls.create(issuer.newPull(uid: "u-1", agentID: "", filter: LogFilter(uid: "u\u{0}"), targets: ["a"], lifetime: .seconds(60), requestedBy: "t"))
        }
        #expect(try pulls.pulls().isEmpty)
    }
}
