import DredgeWire

/// Reconnection delays: exponential from `initial` to `maximum`, each with ±50 % random jitter
/// so a fleet of agents does not reconnect in step (Protocol/README.md § 6).
public struct Backoff: Sendable {
    public var initial: Duration
    public var maximum: Duration
    private var attempt = 0

    public init(initial: Duration = .seconds(1), maximum: Duration = .seconds(60)) {
        self.initial = initial
        self.maximum = maximum
    }

    /// The delay before the next attempt.
    public mutating func next<R: RandomNumberGenerator>(using rng: inout R) -> Duration {
        let base = min(maximum, initial * (1 << min(attempt, 30)))
        attempt += 1
        let factor = Double.random(in: 0.5...1.5, using: &rng)
        return base * factor
    }

    public mutating func next() -> Duration {
        var rng = SystemRandomNumberGenerator()
        return next(using: &rng)
    }

    /// After a connection that stayed up.
    public mutating func reset() { attempt = 0 }
}

extension Backoff {
    /// How long a connection must stay ready before a drop starts the backoff again from the
    /// shortest delay (Protocol § Connection states). A server that accepts and then falls over
    /// at once keeps its fleet backing off instead of back every second.
    public static let resetAfterConnected: Duration = .seconds(60)

    /// The delay before reconnecting after a connection that was ready for `readyFor` (nil:
    /// it never got that far). Resets first if it stayed up ``resetAfterConnected``.
    public mutating func afterConnection(readyFor: Duration?) -> Duration {
        if let readyFor, readyFor >= Self.resetAfterConnected { reset() }
        return next()
    }
}

/// When the agent tries the server again: after its ``Backoff``, or, once the server said in
/// its `Goodbye` that it is restarting and when it expects to be back (``PlannedReturn``,
/// Protocol § 6, Planned restarts), every few seconds until then — each wait drawn from 50–150 %
/// of the interval the server asked for, never longer than the backoff's longest — and then
/// with the backoff where it was. A connection that gets ready again ends the planned return:
/// a server that comes back and falls over at once is backed off from, as any other. Times and
/// randomness are passed in, so tests need no clock.
public struct Reconnection: Sendable {
    public private(set) var backoff: Backoff
    /// The server's planned return, and when trying at its interval ends.
    public private(set) var planned: PlannedReturn?
    private var plannedUntil: ContinuousClock.Instant?
    /// The server refused this agent for good (``refused(_:)``): what it said, until a
    /// connection is ready again.
    public private(set) var refusal: WireErrorCode?

    /// How long an agent the server refused for good waits between attempts: only enrolling
    /// again mends it (Protocol § Errors), and a fleet of such agents retrying every minute
    /// would cost the server a handshake each.
    public static let refusedDelay: Duration = .seconds(15 * 60)

    public init(backoff: Backoff) { self.backoff = backoff }

    /// Whether `code` (the server's fatal error) means this agent must enroll again: its key
    /// is unknown or revoked (`ERROR_AUTH_FAILED`), or the server's keys it pins are retired
    /// (`ERROR_KEYS_RETIRED`).
    public static func needsEnrollment(_ code: WireErrorCode?) -> Bool { code == .errorAuthFailed || code == .errorKeysRetired }

    /// The server refused this agent with `code`: until a connection is ready again, attempts
    /// are ``refusedDelay`` apart (the operator may yet mend it on the server's side: a
    /// restored backup, a revocation undone).
    public mutating func refused(_ code: WireErrorCode) { refusal = code }

    /// A connection ended that had been ready for `readyFor` (nil: it never got that far). One
    /// that stayed ready ``Backoff/resetAfterConnected`` starts the backoff again from its
    /// shortest delay; one that got ready at all ends a planned return (the server is back).
    public mutating func connectionEnded(readyFor: Duration?) {
        guard let readyFor else { return }
        if readyFor >= Backoff.resetAfterConnected { backoff.reset() }
        (planned, plannedUntil, refusal) = (nil, nil, nil)
    }

    /// The server is restarting (its `Goodbye` at `now`): try at its interval for its window.
    public mutating func serverRestarting(_ planned: PlannedReturn, at now: ContinuousClock.Instant) {
        self.planned = planned
        plannedUntil = now + planned.window
    }

    /// Whether the server's planned return is still awaited at `now`.
    public func awaitingReturn(at now: ContinuousClock.Instant) -> Bool { plannedUntil.map { now < $0 } ?? false }

    /// The wait before the next attempt.
    public mutating func delay<R: RandomNumberGenerator>(at now: ContinuousClock.Instant, using rng: inout R) -> Duration {
        if let planned, awaitingReturn(at: now) {
            return min(planned.retryEvery, backoff.maximum) * Double.random(in: 0.5...1.5, using: &rng)
        }
        (planned, plannedUntil) = (nil, nil)
        let next = backoff.next(using: &rng)
        if refusal != nil { return max(next, Self.refusedDelay * Double.random(in: 0.9...1.1, using: &rng)) }
        return next
    }

    public mutating func delay(at now: ContinuousClock.Instant = .now) -> Duration {
        var rng = SystemRandomNumberGenerator()
        return delay(at: now, using: &rng)
    }
}

/// Whether the server still answers heartbeats: with no `HeartbeatAck` (or any other frame)
/// for `missed` intervals, the connection is taken for dead and the agent reconnects, instead
/// of waiting for TCP keepalive (hours). Times are passed in, so tests need no clock.
public struct HeartbeatWatch: Sendable {
    public let interval: Duration
    public let missed: Int
    private var lastHeard: ContinuousClock.Instant

    public init(interval: Duration, missed: Int = Int(WireLimits.missedHeartbeatsBeforeClose), now: ContinuousClock.Instant) {
        self.interval = interval
        self.missed = missed
        self.lastHeard = now
    }

    /// The server sent something.
    public mutating func heard(at now: ContinuousClock.Instant) { lastHeard = max(lastHeard, now) }

    /// True once nothing has come for `missed` intervals.
    public func isOverdue(at now: ContinuousClock.Instant) -> Bool { now - lastHeard >= interval * missed }

    public var silenceAllowed: Duration { interval * missed }
}
