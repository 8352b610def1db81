import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// The rules of ``TailRegistry`` (#53), written once and run against every implementation in
/// ``PersistenceBackend/all``. Times are given, never read from the clock.
@Suite struct TailRegistryConformanceTests {
    let dir = TempDir()
    typealias Backend = PersistenceBackend

    static let serverKey = try! RSAPrivateKey.generate()
    static let issuer = CommandIssuer(encryptionKey: serverKey, signingKey: .generate())
    let base = Timestamp.now

    func newTail(uid: String = "u-1", agents: [String]? = nil, lifetime: Duration = .seconds(900), at: Timestamp? = nil, by: String = "alice") -> NewTail {
        Self.issuer.newTail(
            uid: uid, agents: agents, filter: LogFilter(since: base, types: ["app"], levels: [.warning, .error], text: "timeout"), lifetime: lifetime,
            recordsPerSecond: 200, bytesPerSecond: 1 << 20, verbose: true, verboseTypes: ["network", "app"], requestedBy: by, reason: "T-1", now: at ?? base)
    }

    func date(_ seconds: Double) -> Date { base.date.addingTimeInterval(seconds) }

    @Test(arguments: Backend.all)
    func aTailReadsBackAsItWasMadeAndIsAudited(_ backend: Backend) async throws {
        let (tails, audit) = try await backend.tails(dir)
        let first = newTail(agents: ["b", "a"])
        try await tails.create(first)
        let second = newTail(uid: "u-2")
        try await tails.create(second)
        let tail = try #require(try await tails.tail(first.id))
        #expect(tail.uid == "u-1" && tail.agents == ["b", "a"] && tail.requestedBy == "alice" && tail.reason == "T-1")
        // The tail's uid bounds the filter; a tail has no times.
        #expect(tail.filter == LogFilter(uid: "u-1", types: ["app"], levels: [.warning, .error], text: "timeout"))
        #expect(tail.issuedAt == base && tail.expiresAt == base.adding(.seconds(900)))
        #expect(tail.recordsPerSecond == 200 && tail.bytesPerSecond == 1 << 20 && tail.verbose && tail.verboseTypes == ["app", "network"])
        #expect(tail.stopped == nil && tail.parts.isEmpty && tail.isOpen(at: base))
        #expect(try await tails.tails(limit: 10).map(\.id).count == 2)
        #expect(try await tails.tails(limit: 1).count == 1)
        #expect(try await tails.tail(String(repeating: "0", count: 32)) == nil)
        let entries = try await audit.audit(limit: 10).filter { $0.action == "tail" }
        #expect(entries.count == 2 && entries.allSatisfy { $0.actor == "alice" })
        #expect(entries.contains { $0.detail.hasPrefix("tail \(first.id) of uid u-1 on device(s) b, a,") && $0.detail.contains("reason \"T-1\"") && $0.detail.contains("verbose") })
        #expect(try await audit.verifyChain().broken == nil)
    }

    /// An agent is due the open tails of the uids it holds (those naming devices only when it
    /// is one), not those stopped, expired, or whose part for it is final.
    @Test(arguments: Backend.all)
    func anAgentIsDueTheOpenTailsOfItsUsers(_ backend: Backend) async throws {
        let (tails, _) = try await backend.tails(dir)
        let anyDevice = newTail()
        let onB = newTail(uid: "u-2", agents: ["b"])
        let expired = newTail(lifetime: .seconds(60), at: base.adding(.seconds(-120)))
        let stopped = newTail()
        for tail in [anyDevice, onB, expired, stopped] { try await tails.create(tail) }
        _ = try await tails.stop(stopped.id, by: "alice", reason: "done", at: date(0))

        #expect(try await tails.due(for: "a", uids: ["u-1", "u-2"], now: base).map(\.tail.id) == [anyDevice.id])
        #expect(try await tails.due(for: "b", uids: ["u-2", "u-9"], now: base).map(\.tail.id) == [onB.id])
        #expect(try await tails.due(for: "b", uids: [], now: base).isEmpty)
        #expect(try await tails.due(for: "a", uids: ["u-1"], now: base.adding(.seconds(901))).isEmpty)
        // Never delivered: no key yet; delivered: its key.
        #expect(try await tails.due(for: "a", uids: ["u-1"], now: base).first?.wrappedKey == nil)
        let key = try Self.issuer.newTailKey()
        #expect(try await tails.deliver(anyDevice.id, agent: "a", wrappedKey: key, at: date(1)) == key)
        #expect(try await tails.due(for: "a", uids: ["u-1"], now: base).first?.wrappedKey == key)
        #expect(try await tails.endPart(anyDevice.id, agent: "a", status: .rejected, detail: "busy", at: date(2)))
        #expect(try await tails.due(for: "a", uids: ["u-1"], now: base).isEmpty)
        // Another device holding the uid joins the same tail.
        #expect(try await tails.due(for: "c", uids: ["u-1"], now: base).map(\.tail.id) == [anyDevice.id])
    }

    /// A part keeps the first key it was delivered with; nothing is delivered once the tail is
    /// not open or the part is final.
    @Test(arguments: Backend.all)
    func aPartKeepsItsFirstKey(_ backend: Backend) async throws {
        let (tails, _) = try await backend.tails(dir)
        let tail = newTail()
        try await tails.create(tail)
        let (k1, k2) = (try Self.issuer.newTailKey(), try Self.issuer.newTailKey())
        #expect(try await tails.deliver(tail.id, agent: "a", wrappedKey: k1, at: date(1)) == k1)
        #expect(try await tails.deliver(tail.id, agent: "a", wrappedKey: k2, at: date(2)) == k1)
        #expect(try await tails.deliver(tail.id, agent: "b", wrappedKey: k2, at: date(900)) == nil)
        #expect(try await tails.deliver(String(repeating: "0", count: 32), agent: "a", wrappedKey: k2, at: date(1)) == nil)
        let part = try #require(try await tails.tail(tail.id)?.parts.first)
        #expect(part.agentID == "a" && part.status == .delivered && part.startCursor == nil && part.heldSeq == 0)
        _ = try await tails.stop(tail.id, by: "alice", reason: "done", at: date(3))
        #expect(try await tails.deliver(tail.id, agent: "a", wrappedKey: k1, at: date(4)) == nil)
        #expect(try await tails.deliver(tail.id, agent: "c", wrappedKey: k1, at: date(4)) == nil)
    }

    /// The first start cursor is kept; batches are held one at a time, in order, each past the
    /// last one's cursor, while the tail is open (its grace after expiry included); an
    /// acceptance after batches gives back what is held.
    @Test(arguments: Backend.all)
    func batchesAreHeldInOrderFromTheFirstStartCursor(_ backend: Backend) async throws {
        let (tails, _) = try await backend.tails(dir)
        let tail = newTail()
        try await tails.create(tail)
        #expect(try await tails.accepted(tail.id, agent: "a", startCursor: 100, at: date(1)) == nil)
        let key = try Self.issuer.newTailKey()
        _ = try await tails.deliver(tail.id, agent: "a", wrappedKey: key, at: date(1))
        // Not accepted yet: nothing is taken.
        #expect(try await !tails.held(tail.id, agent: "a", seq: 1, cursor: 150, records: 1, dropped: 0, bytes: 10, at: date(1)))
        #expect(try await tails.hold(tail.id, agent: "a", at: date(1)) == nil, "delivered, not accepted: nothing is taken")
        #expect(try await tails.accepted(tail.id, agent: "a", startCursor: 100, at: date(2)) == TailHold(uid: "u-1", expiresAt: tail.expiresAt, wrappedKey: key, seq: 0, cursor: 100, bytes: 0))
        #expect(try await tails.hold(tail.id, agent: "a", at: date(2)) == TailHold(uid: "u-1", expiresAt: tail.expiresAt, wrappedKey: key, seq: 0, cursor: 100, bytes: 0))
        // Accepted again (an agent that restarted, whose store moved on): the first cursor holds.
        #expect(try await tails.accepted(tail.id, agent: "a", startCursor: 500, at: date(3))?.cursor == 100)
        #expect(try await !tails.held(tail.id, agent: "a", seq: 2, cursor: 150, records: 1, dropped: 0, bytes: 10, at: date(4)))
        #expect(try await !tails.held(tail.id, agent: "a", seq: 1, cursor: 100, records: 1, dropped: 0, bytes: 10, at: date(4)))
        #expect(try await tails.held(tail.id, agent: "a", seq: 1, cursor: 150, records: 3, dropped: 1, bytes: 300, at: date(4)))
        #expect(try await !tails.held(tail.id, agent: "a", seq: 1, cursor: 160, records: 3, dropped: 1, bytes: 300, at: date(5)))
        #expect(try await tails.accepted(tail.id, agent: "a", startCursor: 900, at: date(6)) == TailHold(uid: "u-1", expiresAt: tail.expiresAt, wrappedKey: key, seq: 1, cursor: 150, bytes: 300))
        // Cursors are u64: the top half reads back as it was given.
        #expect(try await tails.held(tail.id, agent: "a", seq: 2, cursor: UInt64.max - 1, records: 2, dropped: 0, bytes: 500, at: date(7)))
        #expect(try await !tails.held(tail.id, agent: "a", seq: 3, cursor: 200, records: 1, dropped: 0, bytes: 600, at: date(8)))
        // Within the grace after expiry a batch is still taken; after it, none is.
        #expect(try await tails.held(tail.id, agent: "a", seq: 3, cursor: UInt64.max, records: 1, dropped: 5, bytes: 600, at: date(930)))
        #expect(try await tails.hold(tail.id, agent: "a", at: date(930))?.seq == 3)
        #expect(try await tails.accepted(tail.id, agent: "a", startCursor: 1, at: date(961)) == nil)
        #expect(try await tails.hold(tail.id, agent: "a", at: date(961)) == nil, "past the grace")
        let part = try #require(try await tails.tail(tail.id)?.parts.first)
        #expect(part.status == .running && part.startCursor == 100 && part.heldSeq == 3 && part.heldCursor == UInt64.max)
        #expect(part.records == 6 && part.dropped == 6 && part.bytes == 600)
    }

    /// A final part never changes again, and a part ends only as rejected or ended.
    @Test(arguments: Backend.all)
    func aFinalPartNeverChanges(_ backend: Backend) async throws {
        let (tails, _) = try await backend.tails(dir)
        let tail = newTail()
        try await tails.create(tail)
        let key = try Self.issuer.newTailKey()
        _ = try await tails.deliver(tail.id, agent: "a", wrappedKey: key, at: date(1))
        _ = try await tails.accepted(tail.id, agent: "a", startCursor: 7, at: date(1))
        #expect(try await tails.endPart(tail.id, agent: "a", status: .ended, detail: "batch 2 does not authenticate", at: date(2)))
        #expect(try await !tails.endPart(tail.id, agent: "a", status: .rejected, detail: "late", at: date(3)))
        #expect(try await tails.accepted(tail.id, agent: "a", startCursor: 7, at: date(3)) == nil)
        #expect(try await tails.deliver(tail.id, agent: "a", wrappedKey: key, at: date(3)) == nil)
        #expect(try await !tails.held(tail.id, agent: "a", seq: 1, cursor: 8, records: 1, dropped: 0, bytes: 1, at: date(3)))
        #expect(try await !tails.endPart(tail.id, agent: "nobody", status: .ended, detail: "x", at: date(3)))
        await #expect(throws: DeploymentError.self) { try await tails.endPart(tail.id, agent: "a", status: .running, detail: "", at: date(3)) }
        let part = try #require(try await tails.tail(tail.id)?.parts.first)
        #expect(part.status == .ended && part.detail == "batch 2 does not authenticate")
    }

    /// A stop is kept once, ends the parts still open (a final one keeps its status), is audited
    /// with what the tail saw; expired tails are stopped by the server, once.
    @Test(arguments: Backend.all)
    func aStopIsKeptOnceAndAudited(_ backend: Backend) async throws {
        let (tails, audit) = try await backend.tails(dir)
        let tail = newTail()
        let other = newTail(by: "bob")
        let expiring = newTail(lifetime: .seconds(60), at: base.adding(.seconds(-30)))
        for t in [tail, other, expiring] { try await tails.create(t) }
        #expect(try await tails.openCount(requestedBy: nil, now: base) == 3)
        #expect(try await tails.openCount(requestedBy: "alice", now: base) == 2)
        #expect(try await tails.openCount(requestedBy: "alice", now: base.adding(.seconds(31))) == 1)
        for agent in ["a", "b", "c"] { _ = try await tails.deliver(tail.id, agent: agent, wrappedKey: try Self.issuer.newTailKey(), at: date(1)) }
        _ = try await tails.accepted(tail.id, agent: "a", startCursor: 10, at: date(1))
        #expect(try await tails.held(tail.id, agent: "a", seq: 1, cursor: 12, records: 2, dropped: 0, bytes: 90, at: date(2)))
        _ = try await tails.endPart(tail.id, agent: "c", status: .rejected, detail: "busy", at: date(2))

        let mark = try #require(try await tails.stop(tail.id, by: "bob", reason: "seen enough", at: date(125)))
        #expect(mark.isNew && mark.tail.stopped == TailStopping(at: date(125), by: "bob", reason: "seen enough") && !mark.tail.isOpen(at: base))
        #expect(mark.tail.parts.map(\.status) == [.ended, .ended, .rejected])
        #expect(mark.tail.parts.first?.detail == "the tail stopped: seen enough" && mark.tail.parts.last?.detail == "busy")
        let again = try #require(try await tails.stop(tail.id, by: "carol", reason: "again", at: date(130)))
        #expect(!again.isNew && again.tail.stopped?.by == "bob")
        #expect(try await tails.stop(String(repeating: "0", count: 32), by: "bob", reason: "x", at: date(1)) == nil)
        let stops = try await audit.audit(limit: 10).filter { $0.action == "tail.stop" }
        #expect(stops.count == 1 && stops.first?.actor == "bob")
        #expect(stops.first?.detail == "tail \(tail.id) of uid u-1 stopped by bob: seen enough; 3 device(s): a (ended, 2 records, 0 left out), b (ended, 0 records, 0 left out), c (rejected, 0 records, 0 left out); ran 2 min 5 s")

        // Within the grace after its expiry, not yet.
        #expect(try await tails.stopExpired(now: base.adding(.seconds(89))).isEmpty)
        #expect(try await tails.stopExpired(now: base.adding(.seconds(90))) == [expiring.id])
        #expect(try await tails.stopExpired(now: base.adding(.seconds(90))).isEmpty)
        #expect(try await tails.tail(expiring.id)?.stopped?.by == "server")
        #expect(try await tails.openCount(requestedBy: nil, now: base) == 1)
        #expect(try await audit.verifyChain().broken == nil)
    }

    /// A removal stops an open tail first and is kept once; the retention lists stopped tails
    /// not removed, stopped at or before its cutoff.
    @Test(arguments: Backend.all)
    func aRemovalIsKeptOnceAndStopsTheTail(_ backend: Backend) async throws {
        let (tails, audit) = try await backend.tails(dir)
        let open = newTail()
        let stopped = newTail()
        for t in [open, stopped] { try await tails.create(t) }
        _ = try await tails.stop(stopped.id, by: "alice", reason: "done", at: date(10))
        #expect(try await tails.removable(keptUntil: date(9), limit: 10).isEmpty)
        #expect(try await tails.removable(keptUntil: date(10), limit: 10) == [stopped.id])
        let mark = try #require(try await tails.markRemoved(open.id, by: "bob", reason: "T-3", at: date(20)))
        #expect(mark.isNew && mark.removal == Removal(at: date(20), by: "bob", reason: "T-3"))
        let removed = try #require(try await tails.tail(open.id))
        #expect(removed.removed?.by == "bob" && removed.stopped?.by == "bob" && removed.stopped?.reason == "its records were removed: T-3")
        #expect(try await tails.markRemoved(open.id, by: "carol", reason: "", at: date(30))?.isNew == false)
        #expect(try await tails.markRemoved(String(repeating: "0", count: 32), by: "carol", reason: "", at: date(30)) == nil)
        #expect(try await tails.removable(keptUntil: date(100), limit: 10) == [stopped.id], "a removed tail is not listed again")
        #expect(try await audit.audit(limit: 10).contains { $0.action == "tail.stop" && $0.actor == "bob" })
    }
}
