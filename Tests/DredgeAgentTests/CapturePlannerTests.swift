import DredgeAgentCore
import DredgeDomain
import DredgeWire
import Foundation
import Testing

/// The captures a device makes of its triggers (Protocol § 21), on a clock the test moves:
/// windows, kept apart per trigger; budgets per rolling day; quiet after the server's
/// ERROR_BUDGET_SPENT; crashes; what survives a restart.
@Suite struct CapturePlannerTests {
    static let start = Timestamp(microseconds: 1_795_340_400_000_000)
    static func at(_ seconds: Int64) -> Timestamp { Timestamp(microseconds: start.microseconds + seconds * 1_000_000) }
    static func us(_ seconds: Int64) -> Int64 { at(seconds).microseconds }

    static func rule(id: String = String(repeating: "a", count: 32), before: UInt32 = 300, after: UInt32 = 60, perDay: UInt32 = 3, expires: Int64 = 7 * 86_400)
        -> TriggerRule
    {
        TriggerRule(
            id: id, name: "payment declined", match: TriggerRule.Match(levels: [.error]), crash: true, beforeSeconds: before, afterSeconds: after,
            maxPerDeviceDay: perDay, expiresAt: at(expires))
    }

    /// Lets the expectations call the planner's mutating methods.
    final class Box {
        var p: CapturePlanner
        init(_ p: CapturePlanner = CapturePlanner()) { self.p = p }

        func fire(
            _ rule: TriggerRule, setVersion: UInt64, firedAtUs: Int64, uid: String, row: Int64?, crash: Bool, now: Timestamp, newID: () -> String
        ) -> CapturePlanner.Planned? {
            p.consider(rule, setVersion: setVersion, firedAtUs: firedAtUs, uid: uid, row: row, crash: crash, now: now, newID: newID)
        }
    }

    final class IDs {
        var next = 0
        func make() -> String {
            next += 1
            return String(format: "%032x", next)
        }
    }

    @Test func aFiringCapturesItsWindowAndFiringsInsideItMakeNoOther() throws {
        let planner = Box()
        let ids = IDs()
        let rule = Self.rule()
        let first = try #require(planner.fire(rule, setVersion: 7, firedAtUs: Self.us(1_000), uid: "u-1", row: 42, crash: false, now: Self.at(1_000), newID: ids.make))
        #expect(first.sinceUs == Self.us(700) && first.untilUs == Self.us(1_060) + 1 && first.matchedAtUs == Self.us(1_000))
        #expect(first.uid == "u-1" && first.matchedRow == 42 && first.setVersion == 7 && !first.crash && first.triggerID == rule.id)
        // Fired again inside the window (even at its last µs): no new capture, nothing counted.
        #expect(planner.fire(rule, setVersion: 7, firedAtUs: Self.us(1_030), uid: "u-1", row: 43, crash: false, now: Self.at(1_030), newID: ids.make) == nil)
        #expect(planner.fire(rule, setVersion: 7, firedAtUs: Self.us(1_060), uid: "u-2", row: 44, crash: false, now: Self.at(1_060), newID: ids.make) == nil)
        #expect(planner.p.madeToday(rule.id, now: Self.at(1_060)) == 1 && planner.p.pending == [first])
        // After it: a window of its own, starting where the first ended.
        let second = try #require(planner.fire(rule, setVersion: 7, firedAtUs: Self.us(1_100), uid: "u-1", row: 50, crash: false, now: Self.at(1_100), newID: ids.make))
        #expect(second.sinceUs == first.untilUs && second.untilUs == Self.us(1_160) + 1 && second.captureID != first.captureID)
        // Another trigger keeps its own windows.
        let other = Self.rule(id: String(repeating: "b", count: 32))
        let third = try #require(planner.fire(other, setVersion: 7, firedAtUs: Self.us(1_030), uid: "", row: 45, crash: false, now: Self.at(1_100), newID: ids.make))
        #expect(third.sinceUs == Self.us(730) && third.uid == "")
    }

    @Test func aCaptureIsDueOnceItsWindowClosedAndSettled() throws {
        let planner = Box()
        let ids = IDs()
        let planned = try #require(planner.fire(Self.rule(), setVersion: 1, firedAtUs: Self.us(100), uid: "u-1", row: 1, crash: false, now: Self.at(100), newID: ids.make))
        #expect(planner.p.due(now: Self.at(160)).isEmpty, "the window is still open")
        #expect(planner.p.due(now: Self.at(161)).isEmpty, "closed, not settled")
        #expect(planner.p.due(now: Self.at(163)) == [planned])
        planner.p.finished(planned.captureID)
        #expect(planner.p.due(now: Self.at(200)).isEmpty && planner.p.pending.isEmpty)
        #expect(planner.p.madeToday(Self.rule().id, now: Self.at(200)) == 1, "finished, still counted")
    }

    @Test func theBudgetIsARollingDayAndTheServerCanQuietATrigger() throws {
        let planner = Box()
        let ids = IDs()
        let rule = Self.rule(before: 0, after: 0, perDay: 2)
        for t in [Int64(10), 20] {
            #expect(planner.fire(rule, setVersion: 1, firedAtUs: Self.us(t), uid: "u", row: t, crash: false, now: Self.at(t), newID: ids.make) != nil)
        }
        #expect(planner.fire(rule, setVersion: 1, firedAtUs: Self.us(30), uid: "u", row: 30, crash: false, now: Self.at(30), newID: ids.make) == nil, "spent for the day")
        #expect(planner.p.madeToday(rule.id, now: Self.at(30)) == 2)
        // A day after the first: one more.
        #expect(planner.fire(rule, setVersion: 1, firedAtUs: Self.us(86_411), uid: "u", row: 40, crash: false, now: Self.at(86_411), newID: ids.make) != nil)
        #expect(planner.fire(rule, setVersion: 1, firedAtUs: Self.us(86_415), uid: "u", row: 41, crash: false, now: Self.at(86_415), newID: ids.make) == nil)

        let quiet = Box()
        quiet.p.budgetSpent(rule.id, now: Self.at(0))
        #expect(quiet.fire(rule, setVersion: 1, firedAtUs: Self.us(3_599), uid: "u", row: 1, crash: false, now: Self.at(3_599), newID: ids.make) == nil, "quiet for an hour")
        #expect(quiet.fire(rule, setVersion: 1, firedAtUs: Self.us(3_600), uid: "u", row: 2, crash: false, now: Self.at(3_600), newID: ids.make) != nil)
    }

    @Test func anExpiredTriggerMakesNothingAndACrashCapturesTheMinutesBefore() throws {
        let planner = Box()
        let ids = IDs()
        let rule = Self.rule(expires: 100)
        #expect(planner.fire(rule, setVersion: 1, firedAtUs: Self.us(99), uid: "u", row: 1, crash: false, now: Self.at(100), newID: ids.make) == nil, "by the agent's clock")
        let crash = try #require(planner.fire(Self.rule(), setVersion: 1, firedAtUs: Self.us(500), uid: "u-1", row: 9, crash: true, now: Self.at(600), newID: ids.make))
        #expect(crash.crash && crash.sinceUs == Self.us(200) && crash.untilUs == Self.us(500) + 1 && crash.matchedRow == nil, "after_s does not apply")
    }

    @Test func hostileTimesNeitherTrapNorLeaveTheTimeRange() throws {
        let planner = Box()
        let ids = IDs()
        let rule = Self.rule(before: 3_600, after: 600, expires: Int64.max / 2_000_000)
        let early = try #require(planner.fire(rule, setVersion: 1, firedAtUs: 5, uid: "u", row: 1, crash: false, now: Self.at(0), newID: ids.make))
        #expect(early.sinceUs == 0 && early.untilUs == 600_000_006)
        let late = Timestamp.acceptedRange.upperBound
        let planned = try #require(planner.fire(rule, setVersion: 1, firedAtUs: late - 1, uid: "u", row: 2, crash: false, now: Self.at(0), newID: ids.make))
        #expect(planned.untilUs == late && planned.sinceUs == late - 1 - 3_600_000_000)
        #expect(planner.fire(rule, setVersion: 1, firedAtUs: .max, uid: "u", row: 3, crash: false, now: Self.at(0), newID: ids.make) == nil)
        #expect(planner.fire(Self.rule(id: String(repeating: "c", count: 32)), setVersion: 1, firedAtUs: .min, uid: "u", row: 4, crash: false, now: Self.at(0), newID: ids.make) == nil)
    }

    /// What a restart keeps: the windows, the budgets and the pending captures; a new set lets
    /// go of the triggers it no longer holds, except one with a capture pending.
    @Test func itSurvivesARestartAndANewSet() throws {
        let planner = Box()
        let ids = IDs()
        let a = Self.rule(id: String(repeating: "a", count: 32), perDay: 1)
        let b = Self.rule(id: String(repeating: "b", count: 32), perDay: 1)
        let pendingA = try #require(planner.fire(a, setVersion: 1, firedAtUs: Self.us(10), uid: "u", row: 1, crash: false, now: Self.at(10), newID: ids.make))
        let doneB = try #require(planner.fire(b, setVersion: 1, firedAtUs: Self.us(10), uid: "u", row: 2, crash: false, now: Self.at(10), newID: ids.make))
        planner.p.finished(doneB.captureID)
        let restarted = Box(try JSONDecoder().decode(CapturePlanner.self, from: try JSONEncoder().encode(planner.p)))
        #expect(restarted.p == planner.p && restarted.p.pending == [pendingA])
        #expect(restarted.fire(b, setVersion: 1, firedAtUs: Self.us(500), uid: "u", row: 3, crash: false, now: Self.at(500), newID: ids.make) == nil, "b's budget is spent")
        restarted.p.held([])
        #expect(restarted.p.madeToday(a.id, now: Self.at(500)) == 1, "a capture of a is pending: its book stays")
        #expect(restarted.p.madeToday(b.id, now: Self.at(500)) == 0, "b is no longer held")
    }
}
