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
