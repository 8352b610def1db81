import DredgeAgentCore
import DredgeTestSupport
import DredgeWire
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

    /// After a planned restart's `Goodbye` the agent tries at the server's interval (50–150 % of
    /// it) until the window ends, however long its backoff had grown, then backs off from where
    /// it was; a connection that had stayed up a minute still resets the backoff, and one that
    /// gets ready again ends the planned return.
    @Test func aPlannedRestartIsWaitedForAtTheServersInterval() {
        var rng = SeededRandom(7)
        let start = ContinuousClock.now
        var reconnection = Reconnection(backoff: Backoff(initial: .seconds(1), maximum: .seconds(60)))
        // A server that failed again and again: the backoff is long.
        for _ in 0..<8 { _ = reconnection.delay(at: start, using: &rng) }
        #expect(reconnection.delay(at: start, using: &rng) >= .seconds(30))
        reconnection.connectionEnded(readyFor: .seconds(5))
        reconnection.serverRestarting(PlannedReturn(backWithin: .seconds(40), retryEvery: .seconds(2)), at: start)
        var at = start
        var planned: [Duration] = []
        while reconnection.awaitingReturn(at: at) {
            let delay = reconnection.delay(at: at, using: &rng)
            planned.append(delay)
            reconnection.connectionEnded(readyFor: nil)
            at += delay
        }
        #expect(planned.count >= 14 && planned.allSatisfy { $0 >= .seconds(1) && $0 <= .seconds(3) }, "\(planned)")
        #expect(at - start >= .seconds(42), "until the window (40 s and one interval) has passed")
        // Then the backoff, where it was.
        #expect(reconnection.delay(at: at, using: &rng) >= .seconds(30))

        // Told after a connection that had been up for an hour: the backoff starts again.
        var fresh = Reconnection(backoff: Backoff(initial: .seconds(1), maximum: .seconds(60)))
        for _ in 0..<8 { _ = fresh.delay(at: start, using: &rng) }
        fresh.connectionEnded(readyFor: .seconds(3_600))
        fresh.serverRestarting(PlannedReturn(backWithin: .seconds(5), retryEvery: .seconds(2)), at: start)
        #expect(fresh.delay(at: start, using: &rng) <= .seconds(3))
        #expect(fresh.delay(at: start + .seconds(8), using: &rng) <= .seconds(1.5), "the backoff was reset")

        // Back, then down again at once: the planned return is over, the backoff grows again.
        var relapse = Reconnection(backoff: Backoff(initial: .seconds(1), maximum: .seconds(60)))
        relapse.serverRestarting(PlannedReturn(backWithin: .seconds(600), retryEvery: .seconds(2)), at: start)
        relapse.connectionEnded(readyFor: .seconds(1))
        #expect(!relapse.awaitingReturn(at: start + .seconds(1)))
        var waits: [Duration] = []
        for _ in 0..<7 {
            waits.append(relapse.delay(at: start + .seconds(2), using: &rng))
            relapse.connectionEnded(readyFor: .seconds(1))
        }
        #expect(waits.last! >= .seconds(30), "\(waits)")

        // A server's interval longer than the agent's longest wait is cut to it.
        var impatient = Reconnection(backoff: Backoff(initial: .seconds(1), maximum: .seconds(5)))
        impatient.serverRestarting(PlannedReturn(backWithin: .seconds(600), retryEvery: .seconds(60)), at: start)
        #expect(impatient.delay(at: start, using: &rng) <= .seconds(7.5))
    }

    /// An agent the server refused for good (unknown or revoked, its pinned keys retired)
    /// tries again only every quarter of an hour, until a connection is ready again; other
    /// failures keep the usual backoff.
    @Test func anAgentRefusedForGoodWaitsLongUntilAConnectionIsReady() {
        var rng = SeededRandom(11)
        let start = ContinuousClock.now
        #expect(Reconnection.needsEnrollment(.errorAuthFailed) && Reconnection.needsEnrollment(.errorKeysRetired))
        #expect(!Reconnection.needsEnrollment(.errorInternal) && !Reconnection.needsEnrollment(nil))
        var reconnection = Reconnection(backoff: Backoff(initial: .seconds(1), maximum: .seconds(60)))
        #expect(reconnection.delay(at: start, using: &rng) <= .seconds(1.5))
        reconnection.refused(.errorKeysRetired)
        var waits: [Duration] = []
        for _ in 0..<5 {
            waits.append(reconnection.delay(at: start, using: &rng))
            reconnection.connectionEnded(readyFor: nil)
        }
        #expect(waits.allSatisfy { $0 >= Reconnection.refusedDelay * 0.9 && $0 <= Reconnection.refusedDelay * 1.1 }, "\(waits)")
        #expect(Reconnection.refusedDelay == .seconds(900))
        // Mended on the server's side (a revocation undone, a newer backup restored): a
        // connection got ready, and the usual backoff is back.
        reconnection.connectionEnded(readyFor: .seconds(2))
        #expect(reconnection.refusal == nil)
        #expect(reconnection.delay(at: start, using: &rng) <= .seconds(60 * 1.5))
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

