import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// The rules of ``TriggerRegistry`` (#54), written once and run against every implementation in
/// ``PersistenceBackend/all``. Times are given, never read from the clock.
@Suite struct TriggerRegistryConformanceTests {
    let dir = TempDir()
    typealias Backend = PersistenceBackend
    let base = Timestamp.now

    func newTrigger(_ name: String = "payment declined", uid: String? = nil, lifetime: Duration = .seconds(86_400), at: Timestamp? = nil, by: String = "alice")
        -> NewTrigger
    {
        let created = at ?? base
        return NewTrigger(
            id: Hex.encode((0..<16).map { _ in UInt8.random(in: 0...255) }),
            definition: TriggerDefinition(
                name: name, match: TriggerMatch(levels: ["error", "critical"], types: ["business"], text: "payment declined", metadataKey: "code", metadataValue: "51"),
                crash: true, uid: uid, app: "shop", minAppVersion: "2.0", maxAppVersion: nil, labels: ["region": "eu"], beforeSeconds: 300, afterSeconds: 60,
                perDevicePerDay: 3, perDay: 100),
            makerScope: AccessScope(labels: ["region": "eu"]), createdBy: by, reason: "T-1", createdAt: created.date, expiresAt: created.adding(lifetime))
    }

    func date(_ seconds: Double) -> Date { base.date.addingTimeInterval(seconds) }

    @Test(arguments: Backend.all)
    func aTriggerReadsBackAsItWasMadeAndIsAudited(_ backend: Backend) async throws {
        let (triggers, audit) = try await backend.triggers(dir)
        let first = newTrigger(uid: "u-1")
        #expect(try await triggers.create(first, inForceAtMost: 64))
        let second = newTrigger("checkout 503", at: base.adding(.seconds(1)))
        #expect(try await triggers.create(second, inForceAtMost: 64))
        let read = try #require(try await triggers.trigger(first.id))
        #expect(read.definition == first.definition && read.makerScope == first.makerScope)
        #expect(read.createdBy == "alice" && read.reason == "T-1" && read.expiresAt == first.expiresAt)
        #expect(abs(read.createdAt.timeIntervalSince(first.createdAt)) < 0.001)
        #expect(read.disabled == nil && read.removed == nil && read.isInForce(at: base))
        #expect(try await triggers.triggers(limit: 10, createdBy: nil).map(\.id) == [second.id, first.id], "newest first")
        #expect(try await triggers.triggers(limit: 1, createdBy: nil).count == 1)
        #expect(try await triggers.trigger(String(repeating: "0", count: 32)) == nil)
        let entries = try await audit.audit(limit: 10).filter { $0.action == "trigger" }
        #expect(entries.count == 2 && entries.allSatisfy { $0.actor == "alice" })
        #expect(entries.contains { $0.detail.hasPrefix("trigger \(first.id) \"payment declined\": level=error,critical type=business") && $0.detail.contains("of uid \"u-1\"") && $0.detail.contains("reason \"T-1\"") })
        #expect(try await audit.verifyChain().broken == nil)
    }

    /// The version counts changes, in the transaction that makes them; what is in force is
    /// neither disabled, removed nor expired, and expiry changes no version.
    @Test(arguments: Backend.all)
    func theVersionCountsChangesAndOnlyTriggersInForceAreSent(_ backend: Backend) async throws {
        let (triggers, audit) = try await backend.triggers(dir)
        #expect(try await triggers.inForce(now: base) == TriggersInForce(version: 0, triggers: []))
        let a = newTrigger("a")
        let b = newTrigger("b", at: base.adding(.seconds(1)))
        let short = newTrigger("short", lifetime: .seconds(60), at: base.adding(.seconds(2)))
        for trigger in [a, b, short] { #expect(try await triggers.create(trigger, inForceAtMost: 64)) }
        var now = try await triggers.inForce(now: base.adding(.seconds(3)))
        #expect(now.version == 3 && now.triggers.map(\.id) == [a.id, b.id, short.id], "oldest first")
        now = try await triggers.inForce(now: base.adding(.seconds(62)))
        #expect(now.version == 3 && now.triggers.map(\.id) == [a.id, b.id], "an expired trigger is not sent, and its expiry is no change")

        let disabled = try #require(try await triggers.disable(a.id, by: "bob", reason: "too noisy", at: date(10)))
        #expect(disabled.isNew && disabled.trigger.disabled?.by == "bob" && disabled.trigger.disabled?.reason == "too noisy")
        let again = try #require(try await triggers.disable(a.id, by: "carol", reason: "again", at: date(11)))
        #expect(!again.isNew && again.trigger.disabled?.by == "bob", "the first disable is kept")
        now = try await triggers.inForce(now: base.adding(.seconds(12)))
        #expect(now.version == 4 && now.triggers.map(\.id) == [b.id, short.id])
        #expect(try await triggers.triggers(limit: 10, createdBy: nil).map(\.id).contains(a.id), "a disabled trigger is still listed")

        let removed = try #require(try await triggers.remove(b.id, by: "bob", reason: "done", at: date(20)))
        #expect(removed.isNew && removed.trigger.removed?.reason == "done" && !removed.trigger.isInForce(at: base))
        #expect(try await triggers.remove(b.id, by: "carol", reason: "", at: date(21))?.isNew == false)
        let removedDisabled = try #require(try await triggers.remove(a.id, by: "bob", reason: "", at: date(22)))
        #expect(removedDisabled.isNew && removedDisabled.trigger.disabled?.by == "bob")
        #expect(try await triggers.disable(b.id, by: "carol", reason: "", at: date(23))?.isNew == false, "a removed trigger is not disabled")
        now = try await triggers.inForce(now: base.adding(.seconds(24)))
        #expect(now.version == 6 && now.triggers.map(\.id) == [short.id])
        #expect(try await triggers.triggers(limit: 10, createdBy: nil).map(\.id) == [short.id], "removed triggers are not listed")
        #expect(try await triggers.trigger(b.id)?.removed?.by == "bob", "but read by id")
        #expect(try await triggers.disable(String(repeating: "0", count: 32), by: "x", reason: "", at: date(30)) == nil)
        #expect(try await triggers.remove(String(repeating: "0", count: 32), by: "x", reason: "", at: date(30)) == nil)

        let actions = try await audit.audit(limit: 20).map(\.action)
        #expect(actions.filter { $0 == "trigger.disable" }.count == 1 && actions.filter { $0 == "trigger.remove" }.count == 2)
        #expect(try await audit.verifyChain().broken == nil)
    }

    /// The limit on triggers in force is counted where they are stored: a trigger over it is not
    /// stored (nor audited, nor a change), one that expired or was disabled makes room; a
    /// maker's own triggers are listed before any limit is applied.
    @Test(arguments: Backend.all)
    func theLimitIsKeptWhereTriggersAreStored(_ backend: Backend) async throws {
        let (triggers, audit) = try await backend.triggers(dir)
        let a = newTrigger("a", by: "ivan")
        let b = newTrigger("b", lifetime: .seconds(30), at: base.adding(.seconds(1)), by: "sara")
        #expect(try await triggers.create(a, inForceAtMost: 2))
        #expect(try await triggers.create(b, inForceAtMost: 2))
        let c = newTrigger("c", at: base.adding(.seconds(2)), by: "sara")
        #expect(try await triggers.create(c, inForceAtMost: 2) == false)
        #expect(try await triggers.trigger(c.id) == nil)
        #expect(try await triggers.inForce(now: base).version == 2)
        #expect(try await audit.audit(limit: 10).filter { $0.action == "trigger" }.count == 2)
        let later = newTrigger("c", at: base.adding(.seconds(40)), by: "sara")
        #expect(try await triggers.create(later, inForceAtMost: 2), "b expired: room for one")
        #expect(try await triggers.triggers(limit: 1, createdBy: "ivan").map(\.id) == [a.id], "the maker's own, before the limit")
        #expect(try await triggers.triggers(limit: 10, createdBy: "sara").map(\.id) == [later.id, b.id])
        #expect(try await triggers.triggers(limit: 10, createdBy: "nobody").isEmpty)
    }

    /// A definition changed behind the server's back is a clear error, never a trigger with no terms.
    @Test(arguments: Backend.all)
    func aDamagedDefinitionIsAClearError(_ backend: Backend) async throws {
        let (triggers, _) = try await backend.triggers(dir)
        let trigger = newTrigger()
        #expect(try await triggers.create(trigger, inForceAtMost: 64))
        try await backend.execute(dir, "UPDATE standing_trigger SET definition = '{\"name\": 7}' WHERE id = '\(trigger.id)'")
        let error = await #expect(throws: (any Error).self) { try await triggers.inForce(now: base) }
        #expect("\(error.map { "\($0)" } ?? "")".contains("trigger \(trigger.id) does not read back"))
    }

    /// What each agent answered: the set it took, then a refusal beside it (the set held stays),
    /// then a newer set it took (the refusal goes). `holders` counts the agents whose held set
    /// lists a trigger.
    @Test(arguments: Backend.all)
    func anAgentsAnswersAreRecordedAndCountTheHolders(_ backend: Backend) async throws {
        let (triggers, _) = try await backend.triggers(dir)
        let a = String(repeating: "a", count: 32), b = String(repeating: "b", count: 32)
        let t1 = newTrigger("one"), t2 = newTrigger("two")
        #expect(try await triggers.answer(of: a) == nil)
        try await triggers.recordAnswer(TriggerSetAnswer(agentID: a, version: 3, issuedAt: base, triggerIDs: [t1.id, t2.id], refusal: nil, at: date(1)))
        try await triggers.recordAnswer(TriggerSetAnswer(agentID: b, version: 3, issuedAt: base, triggerIDs: [t1.id], refusal: nil, at: date(1)))
        let held = try #require(try await triggers.answer(of: a))
        #expect(held.held?.version == 3 && held.held?.issuedAt == base && held.triggerIDs == [t1.id, t2.id] && held.refused == nil && held.refusal == nil)
        #expect(try await triggers.holders(of: t1.id) == 2)
        #expect(try await triggers.holders(of: t2.id) == 1)
        try await triggers.recordAnswer(
            TriggerSetAnswer(agentID: a, version: 4, issuedAt: base.adding(.seconds(5)), triggerIDs: [t2.id], refusal: "REJECT_INVALID: a bad term", at: date(6)))
        let refused = try #require(try await triggers.answer(of: a))
        #expect(refused.held?.version == 3 && refused.triggerIDs == [t1.id, t2.id], "the set held stays")
        #expect(refused.refused?.version == 4 && refused.refusal == "REJECT_INVALID: a bad term")
        try await triggers.recordAnswer(TriggerSetAnswer(agentID: a, version: 5, issuedAt: base.adding(.seconds(9)), triggerIDs: [], refusal: nil, at: date(10)))
        let emptied = try #require(try await triggers.answer(of: a))
        #expect(emptied.held?.version == 5 && emptied.triggerIDs.isEmpty && emptied.refused == nil && emptied.refusal == nil)
        #expect(try await triggers.holders(of: t2.id) == 0)
        // A refusal from an agent that never took a set: recorded with no set held.
        let c = String(repeating: "c", count: 32)
        try await triggers.recordAnswer(TriggerSetAnswer(agentID: c, version: 1, issuedAt: base, triggerIDs: [t1.id], refusal: "REJECT_EXPIRED", at: date(1)))
        let never = try #require(try await triggers.answer(of: c))
        #expect(never.held == nil && never.triggerIDs.isEmpty && never.refusal == "REJECT_EXPIRED")
    }

    func newCapture(_ trigger: String, agent: String, since: Double, until: Double, at: Double, id: String = Hex.encode((0..<16).map { _ in UInt8.random(in: 0...255) }))
        -> NewCapture
    {
        NewCapture(
            id: id, agentID: agent, triggerID: trigger, setVersion: 2, uid: "u-1", since: base.adding(.seconds(since)), until: base.adding(.seconds(until)),
            matchedAt: base.adding(.seconds(since + 1)), crash: false, chunkCount: 1, bytes: 1000, at: date(at))
    }

    /// Captures: counted against the device's and the trigger's rolling-day budgets in the
    /// transaction that records them (nothing stored over a budget), never overlapping one of
    /// the same trigger and device, a resumption answered as it stands; their statuses move as
    /// a feedback's, removal and retention as a pull's.
    @Test(arguments: Backend.all)
    func capturesKeepTheirBudgetsAndNeverOverlap(_ backend: Backend) async throws {
        let (triggers, _) = try await backend.triggers(dir)
        let t = newTrigger()
        let a = String(repeating: "a", count: 32), b = String(repeating: "b", count: 32), c = String(repeating: "c", count: 32)
        let first = newCapture(t.id, agent: a, since: 0, until: 10, at: 20)
        #expect(try await triggers.beginCapture(first, budgets: CaptureBudgets(perDevicePerDay: 2, perDay: 3, bytesPerDevicePerDay: 1 << 40)) == .begun)
        let stored = try #require(try await triggers.capture(first.id))
        #expect(stored.agentID == a && stored.triggerID == t.id && stored.setVersion == 2 && stored.uid == "u-1" && stored.since == first.since && stored.until == first.until)
        #expect(stored.matchedAt == first.matchedAt && !stored.crash && stored.status == .uploading && stored.chunkCount == 1 && stored.bytes == 1000)
        // Begun again: as it stands, not counted.
        guard case .existing(let again) = try await triggers.beginCapture(first, budgets: CaptureBudgets(perDevicePerDay: 2, perDay: 3, bytesPerDevicePerDay: 1 << 40)) else {
            Issue.record("a capture begun again was not answered as it stands")
            return
        }
        #expect(again == stored)
        // Overlapping the first (same trigger and device): refused; touching its end is not.
        guard case .overlaps = try await triggers.beginCapture(newCapture(t.id, agent: a, since: 9, until: 15, at: 21), budgets: CaptureBudgets(perDevicePerDay: 2, perDay: 3, bytesPerDevicePerDay: 1 << 40)) else {
            Issue.record("an overlapping window was recorded")
            return
        }
        #expect(try await triggers.beginCapture(newCapture(t.id, agent: b, since: 9, until: 15, at: 21), budgets: CaptureBudgets(perDevicePerDay: 2, perDay: 3, bytesPerDevicePerDay: 1 << 40)) == .begun, "another device's")
        #expect(try await triggers.beginCapture(newCapture(t.id, agent: a, since: 10, until: 15, at: 22), budgets: CaptureBudgets(perDevicePerDay: 2, perDay: 3, bytesPerDevicePerDay: 1 << 40)) == .begun)
        // The device's budget (2) is spent, then the trigger's (3): nothing stored.
        let over = newCapture(t.id, agent: a, since: 20, until: 25, at: 23)
        guard case .overBudget(let device) = try await triggers.beginCapture(over, budgets: CaptureBudgets(perDevicePerDay: 2, perDay: 10, bytesPerDevicePerDay: 1 << 40)) else {
            Issue.record("a capture over the device's budget was recorded")
            return
        }
        #expect(device.contains("one device"))
        guard case .overBudget(let all) = try await triggers.beginCapture(newCapture(t.id, agent: c, since: 0, until: 5, at: 23), budgets: CaptureBudgets(perDevicePerDay: 2, perDay: 3, bytesPerDevicePerDay: 1 << 40)) else {
            Issue.record("a capture over the trigger's budget was recorded")
            return
        }
        #expect(all.contains("all devices"))
        #expect(try await triggers.capture(over.id) == nil)
        // A rolling day later the device may again.
        #expect(try await triggers.beginCapture(newCapture(t.id, agent: a, since: 30, until: 35, at: 20 + 86_401), budgets: CaptureBudgets(perDevicePerDay: 2, perDay: 3, bytesPerDevicePerDay: 1 << 40)) == .begun)
        #expect(try await triggers.tally(of: t.id, since: date(0)) == CaptureTally(captures: 4, devices: 2))
        #expect(try await triggers.tally(of: t.id, since: date(86_000)) == CaptureTally(captures: 1, devices: 1))
        #expect(try await triggers.captures(of: t.id, limit: 10).count == 4)
        #expect(try await triggers.captures(of: nil, limit: 2).count == 2)
        // Bytes of one device's captures of any trigger: 1,000 each here.
        let other = newTrigger("other")
        guard case .overBudget(let bytes) = try await triggers.beginCapture(
            newCapture(other.id, agent: b, since: 0, until: 5, at: 30), budgets: CaptureBudgets(perDevicePerDay: 5, perDay: 5, bytesPerDevicePerDay: 1_999))
        else {
            Issue.record("a capture over the device's bytes was recorded")
            return
        }
        #expect(bytes.contains("bytes"))
        #expect(try await triggers.beginCapture(
            newCapture(other.id, agent: b, since: 0, until: 5, at: 30), budgets: CaptureBudgets(perDevicePerDay: 5, perDay: 5, bytesPerDevicePerDay: 2_000)) == .begun)

        // Statuses: final ones never move.
        #expect(try await triggers.updateCapture(first.id, status: .complete, detail: "3 records", chunksReceived: 1, records: 3, files: ["/x/manifest.json"], errorCode: nil))
        #expect(!(try await triggers.updateCapture(first.id, status: .failed, detail: "late", chunksReceived: nil, records: nil, files: nil, errorCode: 5)))
        let done = try #require(try await triggers.capture(first.id))
        #expect(done.status == .complete && done.records == 3 && done.files == ["/x/manifest.json"] && done.detail == "3 records" && done.errorCode == nil)
        // Abandoned after the lifetime; removal keeps the first; retention lists final ones not removed.
        #expect(try await triggers.failAbandonedCaptures(now: date(20 + 86_401 + 7 * 86_400 + 1), after: .seconds(7 * 86_400)) == 4)
        let mark = try #require(try await triggers.markCaptureRemoved(first.id, by: "alice", reason: "done", at: date(100)))
        #expect(mark.isNew && mark.removal.by == "alice")
        #expect(try await triggers.markCaptureRemoved(first.id, by: "bob", reason: "", at: date(101))?.isNew == false)
        #expect(try await triggers.markCaptureRemoved(String(repeating: "f", count: 32), by: "bob", reason: "", at: date(101)) == nil)
        let removable = try await triggers.removableCaptures(receivedUntil: date(86_400 * 30), limit: 10)
        #expect(removable.count == 4 && !removable.contains(first.id))
    }

    /// Many devices begin captures of one trigger at once, each with its own window: no more
    /// than the trigger's day budget are recorded, whatever the interleaving; and one device's
    /// overlapping windows at once: one is recorded.
    @Test(arguments: Backend.all)
    func capturesBegunAtOnceNeverPassABudget(_ backend: Backend) async throws {
        let (triggers, _) = try await backend.triggers(dir)
        let t = newTrigger()
        let budgets = CaptureBudgets(perDevicePerDay: 5, perDay: 3, bytesPerDevicePerDay: 1 << 40)
        let outcomes = try await withThrowingTaskGroup(of: CaptureBegin.self) { group in
            for n in 0..<12 {
                let agent = Hex.encode((0..<16).map { _ in UInt8(n) })
                group.addTask { try await triggers.beginCapture(self.newCapture(t.id, agent: agent, since: 0, until: 10, at: 1), budgets: budgets) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(outcomes.filter { $0 == .begun }.count == 3)
        #expect(try await triggers.tally(of: t.id, since: date(0)).captures == 3)
        let u = newTrigger("u")
        let a = String(repeating: "a", count: 32)
        let overlapping = try await withThrowingTaskGroup(of: CaptureBegin.self) { group in
            for n in 0..<8 {
                group.addTask { try await triggers.beginCapture(self.newCapture(u.id, agent: a, since: Double(n), until: Double(n) + 10, at: 1), budgets: budgets) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(overlapping.filter { $0 == .begun }.count == 1)
    }
}
