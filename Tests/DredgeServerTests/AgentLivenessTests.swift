import DredgeAgentCore
import Testing

/// The agent's reconnect backoff and its watch on the server's heartbeat acks, with the times
/// passed in: no clock, no sleeps.
@Suite struct AgentLivenessTests {
    @Test func theBackoffStartsAgainOnlyAfterAMinuteConnected() {
        var backoff = Backoff(initial: .seconds(1), maximum: .seconds(60))
        var delays: [Duration] = []
        // A server that accepts, then fails within seconds, again and again.
        for _ in 0..<8 { delays.append(backoff.afterConnection(readyFor: .seconds(5))) }
        #expect(delays.last! >= .seconds(30), "\(delays)")
        #expect(delays.last! <= .seconds(90))
        // A connection that stayed up a minute: the next drop is the network's.
        #expect(backoff.afterConnection(readyFor: .seconds(61)) <= .seconds(1.5))
        // One that never got ready does not reset either.
        var never = Backoff()
        for _ in 0..<6 { _ = never.afterConnection(readyFor: nil) }
        #expect(never.afterConnection(readyFor: nil) >= .seconds(30))
    }

    @Test func threeMissedIntervalsMakeTheServerOverdue() {
        let start = ContinuousClock.now
        var watch = HeartbeatWatch(interval: .seconds(30), now: start)
        #expect(!watch.isOverdue(at: start + .seconds(89)))
        #expect(watch.isOverdue(at: start + .seconds(90)))
        watch.heard(at: start + .seconds(80))
        #expect(!watch.isOverdue(at: start + .seconds(169)))
        #expect(watch.isOverdue(at: start + .seconds(170)))
        // An earlier instant reported late never moves the watch back.
        watch.heard(at: start + .seconds(10))
        #expect(!watch.isOverdue(at: start + .seconds(169)))
    }
}
