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
