import DredgeAdminAPI
@testable import DredgeServer
import DredgeTestSupport
import Foundation
import GRDB
import Testing

/// The audit log's hash chain (#55), pure: what each kind of tampering looks like to the
/// verifier, fed in pages; and a database from before the chain, chained as it migrates.
@Suite struct AuditChainTests {
    static func chain(_ count: Int) -> [AuditChain.Stored] {
        var previous = AuditChain.genesis
        return (1...count).map { n in
            let at = 1_800_000_000 + Double(n) / 8
            let hash = AuditChain.link(after: previous, at: at, actor: "alice", action: "search", detail: "q=\(n)")
            previous = hash
            return AuditChain.Stored(id: Int64(n * 10), at: at, actor: "alice", action: "search", detail: "q=\(n)", hash: hash)
        }
    }

    static func verify(_ entries: [AuditChain.Stored], page: Int = 3) -> AuditVerification {
        var verifier = AuditChain.Verifier()
        var rest = entries[...]
        while !rest.isEmpty {
            verifier.feed(rest.prefix(page))
            rest = rest.dropFirst(page)
        }
        return verifier.verdict
    }

    @Test func aWholeChainHoldsAcrossPages() {
        let entries = Self.chain(7)
        let verdict = Self.verify(entries)
        #expect(verdict.intact && verdict.entries == 7 && verdict.lastID == 70)
        #expect(verdict.lastHash == entries.last?.hash.map { $0.map { String(format: "%02x", $0) }.joined() })
        #expect(Self.verify([]) == AuditVerification())
    }

    @Test func everyFieldAndTheOrderAreCovered() {
        let entries = Self.chain(5)
        var edited = entries
        edited[2].detail = "q=other"
        #expect(Self.verify(edited).brokenAt == 30)
        edited = entries
        edited[2].actor = "mallory"
        #expect(Self.verify(edited).brokenAt == 30)
        edited = entries
        edited[2].action = "pull"
        #expect(Self.verify(edited).brokenAt == 30)
        edited = entries
        edited[2].at += 1
        #expect(Self.verify(edited).brokenAt == 30)
        // Fields run together differently ("ab" + "c" is not "a" + "bc").
        #expect(AuditChain.link(after: AuditChain.genesis, at: 1, actor: "ab", action: "c", detail: "")
            != AuditChain.link(after: AuditChain.genesis, at: 1, actor: "a", action: "bc", detail: ""))
        var removed = entries
        removed.remove(at: 1)
        let verdict = Self.verify(removed)
        #expect(verdict.brokenAt == 30 && verdict.breaks == 1 && verdict.entries == 4 && verdict.broken?.contains("does not follow entry 10") == true, "\(verdict)")
        #expect(Self.verify(Array(entries.dropFirst())).brokenAt == 20, "the first entry removed")
        var swapped = entries
        (swapped[1].id, swapped[2].id) = (swapped[2].id, swapped[1].id)
        #expect(Self.verify(swapped).broken?.contains("not in id order") == true)
        var cleared = entries
        cleared[4].hash = nil
        #expect(Self.verify(cleared).brokenAt == 50)
        // A break early does not hide the ones after it: each is counted, the first described.
        var twice = entries
        twice[0].hash = nil
        twice[3].detail = "q=edited"
        let both = Self.verify(twice)
        #expect(both.brokenAt == 10 && both.breaks == 3 && both.entries == 5, "the cleared hash, the entry after it, and the edit: \(both)")
        #expect(Self.verify(Array(entries.dropLast(2))).intact, "entries cut from the end leave it whole: the last id says so")
    }

    /// A database from before the chain (its audit entries without hashes) is chained as it
    /// migrates, in id order, and verifies whole.
    @Test func entriesFromBeforeTheChainAreChainedAsTheDatabaseMigrates() async throws {
        let dir = TempDir()
        let path = dir.file(ServerDatabase.fileName)
        let queue = try DatabaseQueue(path: path)
        try ServerDatabase.migrator(importingFrom: dir.path).migrate(queue, upTo: "results-v1-removed")
        try await queue.write { db in
            for n in 1...3 {
                try db.execute(sql: "INSERT INTO audit (at, actor, action, detail) VALUES (?, 'alice', 'search', ?)", arguments: [1_800_000_000 + Double(n), "q=\(n)"])
            }
        }
        try queue.close()
        let pulls = SQLitePullQueue(try ServerDatabase(directory: dir.path))
        try await pulls.record(actor: "bob", action: "token.create", detail: "x", at: Date())
        let verdict = try await pulls.verifyChain()
        #expect(verdict.intact && verdict.entries == 4, "\(verdict)")
    }
}
