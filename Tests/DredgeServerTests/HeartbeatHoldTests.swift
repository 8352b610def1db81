import DredgeTestSupport
import Synchronization
import Testing
@testable import DredgeServer

/// How idle heartbeats are held between writes (``HeartbeatHold``), on an injected clock.
@Suite struct HeartbeatHoldTests {
    /// A clock the test moves.
    final class Clock: Sendable {
        private let now = Mutex(ContinuousClock.now)
        func advance(_ d: Duration) { now.withLock { $0 += d } }
        var read: @Sendable () -> ContinuousClock.Instant { { self.now.withLock { $0 } } }
    }

    /// Heartbeats every 30 s from `agents` for 65 minutes: how many times each agent's row is
    /// written (by the timed flushes).
    func writesPerAgent(refresh: Duration, agents: Int = 50) -> [String: Int] {
        let clock = Clock()
        let hold = HeartbeatHold(flushEvery: .seconds(1), refreshEvery: refresh, clock: clock.read)
        let ids = (0..<agents).map { "agent-\($0)" }
        for id in ids { hold.wrote(["u-1"], of: id) }  // each connected, its first heartbeat written in full
        var writes: [String: Int] = [:]
        var t = 0.0
        for _ in 0..<130 {
            // The fleet's heartbeats spread over the 30 s, one clock step per agent.
            for id in ids {
                clock.advance(.milliseconds(30_000 / agents))
                t += 30.0 / Double(agents)
                switch hold.step(id, uids: ["u-1"], hasReport: false, at: t, records: 7) {
                case .hold: break
                case .flush(let due), .write(with: let due):
                    for agent in due.keys { writes[agent, default: 0] += 1 }
                }
            }
        }
        return writes
    }

    @Test func withARefreshAnIdleAgentsRowIsWrittenOncePerRefresh() {
        let writes = writesPerAgent(refresh: .seconds(1200))
        // 65 minutes at one write per 20 minutes: 3 each (the first heartbeats were written in full).
        #expect(writes.count == 50)
        #expect(writes.values.allSatisfy { $0 == 3 }, "\(Set(writes.values))")
    }

    @Test func withoutARefreshEveryFlushWritesWhatIsHeld() {
        let writes = writesPerAgent(refresh: .zero)
        // One heartbeat per agent every 30 s, each written at the next flush: 130 in the 65 minutes.
        #expect(writes.count == 50)
        #expect(writes.values.allSatisfy { $0 >= 129 }, "\(Set(writes.values))")
    }

    @Test func aListingOrADisconnectionTakesWhatIsHeldDueOrNot() {
        let clock = Clock()
        let hold = HeartbeatHold(flushEvery: .seconds(1), refreshEvery: .seconds(1200), clock: clock.read)
        for id in ["a", "b"] { hold.wrote([], of: id) }
        clock.advance(.seconds(30))
        // Not due: held, whatever the flushes.
        #expect(hold.step("a", uids: [], hasReport: false, at: 30, records: 1).written.isEmpty)
        #expect(hold.step("b", uids: [], hasReport: false, at: 31, records: 2).written.isEmpty)
        #expect(hold.release("a").mapValues(\.at) == ["a": 30])
        #expect(hold.release("a").isEmpty)
        #expect(hold.takePending().mapValues(\.at) == ["b": 31])
        #expect(hold.takePending().isEmpty)
    }

    /// A flush looks at the agents whose refresh came, not at every agent held: with 10,000
    /// agents held and 10 due, it looks at 10 (it looked at all 10,000, once a second and at
    /// every full write, under the lock every heartbeat takes).
    @Test func aFlushLooksOnlyAtTheAgentsDue() {
        let clock = Clock()
        let hold = HeartbeatHold(flushEvery: .seconds(1), refreshEvery: .seconds(300), clock: clock.read)
        let early = (0..<10).map { "early-\($0)" }, late = (0..<10_000).map { "late-\($0)" }
        for id in early { hold.wrote(["u"], of: id) }
        clock.advance(.seconds(100))
        for id in late { hold.wrote(["u"], of: id) }
        for (n, id) in (early + late).enumerated() { _ = hold.step(id, uids: ["u"], hasReport: false, at: Double(n), records: 1) }
        clock.advance(.seconds(150))
        #expect(hold.step("late-0", uids: ["u"], hasReport: false, at: 1e6, records: 1).written.isEmpty)
        #expect(hold.examinedByLastTake == 0)
        clock.advance(.seconds(60))  // 310 s after the early agents' writes, 210 after the others'
        let due = hold.step("late-1", uids: ["u"], hasReport: false, at: 1e6 + 1, records: 1).written
        #expect(Set(due.keys) == Set(early))
        #expect(hold.examinedByLastTake == early.count)
    }

    /// An agent written at every heartbeat (its uids change each time) leaves no pile of
    /// replaced entries: they are dropped once they outnumber the live ones, and an idle agent
    /// written before them is still flushed when its refresh comes.
    @Test func replacedWritesDoNotPileUp() {
        let clock = Clock()
        let hold = HeartbeatHold(flushEvery: .seconds(1), refreshEvery: .seconds(300), clock: clock.read)
        hold.wrote(["u"], of: "idle")
        #expect(hold.step("idle", uids: ["u"], hasReport: false, at: 1, records: 1).written.isEmpty)
        for i in 0..<5_000 {
            clock.advance(.milliseconds(1))
            hold.wrote(["u\(i % 2)"], of: "flip")
        }
        clock.advance(.seconds(300))
        let due = hold.step("idle", uids: ["u"], hasReport: false, at: 2, records: 1).written
        #expect(due.mapValues(\.at) == ["idle": 2])
        #expect(hold.examinedByLastTake < 1_100, "\(hold.examinedByLastTake) entries looked at")
    }

    /// The hold decides as the plain rule says (an agent's held heartbeat is written at the
    /// first flush `refreshEvery` or more after its row was last written; a listing or a
    /// disconnection takes what is held), over random heartbeats, writes, disconnections and
    /// listings of 40 agents for two hours, against a model that checks every agent each time.
    @Test(arguments: [1, 2, 3, 4]) func itWritesWhatThePlainRuleWrites(seed: UInt64) throws {
        var random = SeededRandom(seed)
        let clock = Clock()
        let refresh = Duration.seconds(120)
        let hold = HeartbeatHold(flushEvery: .seconds(1), refreshEvery: refresh, clock: clock.read)
        var model = PlainHold(refresh: refresh, flushEvery: .seconds(1), lastFlush: clock.read())
        let agents = (0..<40).map { "agent-\($0)" }
        var t = 0.0
        for _ in 0..<20_000 {
            let step = Duration.milliseconds(Int64.random(in: 0...700, using: &random))
            clock.advance(step)
            t += 1
            let now = clock.read()
            let agent = agents.randomElement(using: &random)!
            switch Int.random(in: 0..<100, using: &random) {
            case 0..<80:
                let uids = Bool.random(using: &random) || Int.random(in: 0..<10, using: &random) > 0 ? ["u"] : ["u", "v"]
                let got = hold.step(agent, uids: uids, hasReport: false, at: t, records: 1)
                let wanted = model.step(agent, uids: uids, at: t, now: now)
                try #require(got.kind == wanted.kind && got.written.mapValues(\.at) == wanted.written, "step \(t) of \(agent)")
                if case .write = got {
                    hold.wrote(uids, of: agent)
                    model.wrote(uids, of: agent, now: now)
                }
            case 80..<90:
                try #require(hold.release(agent).mapValues(\.at) == model.release(agent), "release at \(t)")
            case 90..<92:
                try #require(hold.takePending().mapValues(\.at) == model.takeAll(now: now), "listing at \(t)")
            default:
                hold.forget(agent)
                model.forget(agent)
            }
        }
    }
}

/// ``HeartbeatHold``'s rule written plainly: every flush checks every held agent.
fileprivate struct PlainHold {
    let refresh: Duration
    let flushEvery: Duration
    var lastFlush: ContinuousClock.Instant
    var uids: [String: [String]] = [:]
    var pending: [String: Double] = [:]
    var written: [String: ContinuousClock.Instant] = [:]

    enum Kind { case hold, flush, write }

    mutating func step(_ agent: String, uids new: [String], at: Double, now: ContinuousClock.Instant) -> (kind: Kind, written: [String: Double]) {
        guard uids[agent] == new else { return (.write, take(now: now)) }
        if (pending[agent] ?? -.infinity) <= at { pending[agent] = at }
        return now - lastFlush >= flushEvery ? (.flush, take(now: now)) : (.hold, [:])
    }

    mutating func take(now: ContinuousClock.Instant) -> [String: Double] {
        lastFlush = now
        let due = pending.filter { written[$0.key].map { now - $0 >= refresh } ?? true }
        for agent in due.keys {
            pending[agent] = nil
            written[agent] = now
        }
        return due
    }

    mutating func takeAll(now: ContinuousClock.Instant) -> [String: Double] {
        lastFlush = now
        defer { pending = [:] }
        for agent in pending.keys { written[agent] = now }
        return pending
    }

    mutating func wrote(_ new: [String], of agent: String, now: ContinuousClock.Instant) {
        uids[agent] = new
        written[agent] = now
    }

    mutating func release(_ agent: String) -> [String: Double] {
        uids[agent] = nil
        written[agent] = nil
        return pending.removeValue(forKey: agent).map { [agent: $0] } ?? [:]
    }

    mutating func forget(_ agent: String) {
        uids[agent] = nil
        written[agent] = nil
    }
}

extension HeartbeatHold.Step {
    fileprivate var kind: PlainHold.Kind {
        switch self {
        case .hold: .hold
        case .flush: .flush
        case .write: .write
        }
    }
}

extension HeartbeatHold.Step {
    /// The held heartbeats this step writes.
    var written: HeartbeatHold.Held {
        switch self {
        case .hold: [:]
        case .flush(let due), .write(with: let due): due
        }
    }
}
