@testable import DredgeServer
import Testing

/// The node's ingress cap's fair queuing (``IngressSchedule``), on times the test gives.
@Suite struct IngressScheduleTests {
    @Test func anIdleNodeGrantsAtOnceThenEachRequestWaitsForItsBytes() throws {
        var s = IngressSchedule(bytesPerSecond: 1_000_000)
        s.enqueue(id: 1, agent: "a", bytes: 500_000)
        let firstTurn = s.next(now: 10)
        let first = try #require(firstTurn)
        #expect(first.id == 1 && first.wait == 0)
        s.enqueue(id: 2, agent: "a", bytes: 250_000)
        let secondTurn = s.next(now: 10.1)
        let second = try #require(secondTurn)
        #expect(abs(second.wait - 0.4) < 1e-9)  // the first's slot ends at 10.5
        let none = s.next(now: 10.2)
        #expect(none == nil)
        // Idle past the slot: granted at once again, nothing saved up beyond it.
        s.enqueue(id: 3, agent: "b", bytes: 1_000_000)
        let third = s.next(now: 20)
        #expect(third?.wait == 0)
        s.enqueue(id: 4, agent: "b", bytes: 1)
        let fourth = s.next(now: 20)
        #expect(abs((fourth?.wait ?? 0) - 1) < 1e-9 && fourth != nil)
    }

    /// Agent a sends 256 KiB chunks, b 64 KiB ones, c only from the middle on; each keeps one
    /// request waiting, as a connection does. The bytes each is granted stay equal within a
    /// chunk, and the node's slots add up to the cap.
    @Test func agentsWithDifferentChunksGetEqualBytes() throws {
        let sizes: [String: Double] = ["a": 262_144, "b": 65_536, "c": 65_536]
        var s = IngressSchedule(bytesPerSecond: 1_048_576)
        var granted: [String: Double] = [:]
        var id: UInt64 = 0
        for agent in ["a", "b"] {
            id += 1
            s.enqueue(id: id, agent: agent, bytes: sizes[agent]!)
        }
        var now = 0.0, owner: [UInt64: String] = [1: "a", 2: "b"]
        for round in 0..<2_000 {
            if round == 1_000 {
                id += 1
                owner[id] = "c"
                s.enqueue(id: id, agent: "c", bytes: sizes["c"]!)
                granted = [:]
            }
            let next = s.next(now: now)
            let turn = try #require(next)
            now += turn.wait
            let agent = owner[turn.id]!
            granted[agent, default: 0] += turn.bytes
            id += 1
            owner[id] = agent
            s.enqueue(id: id, agent: agent, bytes: sizes[agent]!)
        }
        let shares = granted.values
        #expect(shares.max()! - shares.min()! <= 262_144, "\(granted)")
        #expect(granted.count == 3)
    }

    @Test func aRemovedRequestIsNeverGranted() {
        var s = IngressSchedule(bytesPerSecond: 1_000)
        s.enqueue(id: 1, agent: "a", bytes: 10)
        s.enqueue(id: 2, agent: "b", bytes: 10)
        s.remove(id: 1)
        let next = s.next(now: 0)
        let after = s.next(now: 0)
        #expect(next?.id == 2)
        #expect(after == nil)
    }
}
