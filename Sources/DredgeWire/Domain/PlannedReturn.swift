/// A server's word, in its `Goodbye`, that it is restarting and when it expects to be back
/// (README § Connection states, Planned restarts), with the protocol's bounds applied: the
/// window at most ``WireLimits/maxRestartWindow``, the interval within
/// ``WireLimits/restartRetryRange``. The agent tries to reconnect every ``retryEvery`` (each
/// wait drawn from 50–150 % of it) until ``window`` has passed since the `Goodbye`.
public struct PlannedReturn: Sendable, Equatable, CustomStringConvertible {
    /// How soon after its `Goodbye` the server expects to accept connections again.
    public let backWithin: Duration
    /// How often the agent tries meanwhile.
    public let retryEvery: Duration

    public init(backWithin: Duration, retryEvery: Duration) {
        self.backWithin = min(max(.zero, backWithin), WireLimits.maxRestartWindow)
        let range = WireLimits.restartRetryRange
        self.retryEvery = min(max(retryEvery, range.lowerBound), range.upperBound)
    }

    /// What a `Goodbye` says; nil when it names no time to come back (`back_within_ms` 0).
    public init?(_ goodbye: WireGoodbye) {
        guard goodbye.backWithinMs > 0 else { return nil }
        self.init(
            backWithin: .milliseconds(Int64(goodbye.backWithinMs)),
            retryEvery: goodbye.retryEveryMs == 0 ? WireLimits.defaultRestartRetry : .milliseconds(Int64(goodbye.retryEveryMs)))
    }

    /// How long after the `Goodbye` the agent keeps trying at ``retryEvery``: until the server
    /// said it would be back, and one interval more.
    public var window: Duration { backWithin + retryEvery }

    /// As people read it: `back within 60 s, retrying every 2 s`.
    public var description: String { "back within \(Self.seconds(backWithin)), retrying every \(Self.seconds(retryEvery))" }

    private static func seconds(_ duration: Duration) -> String {
        let milliseconds = milliseconds(duration)
        return milliseconds % 1_000 == 0 ? "\(milliseconds / 1_000) s" : "\(Double(milliseconds) / 1_000) s"
    }

    /// The `Goodbye` fields that say it.
    public func fill(_ goodbye: inout WireGoodbye) {
        goodbye.backWithinMs = Self.milliseconds(backWithin)
        goodbye.retryEveryMs = Self.milliseconds(retryEvery)
    }

    /// The Swift server's interval for the agents it says goodbye to: 2 s, and 1 s more for
    /// every 500 of them, at most 60 s: no more than about 500 agents a second come back.
    public static func retryInterval(agents: Int) -> Duration {
        min(WireLimits.defaultRestartRetry + .seconds(max(0, agents) / 500), WireLimits.restartRetryRange.upperBound)
    }

    private static func milliseconds(_ duration: Duration) -> UInt32 {
        let (seconds, attoseconds) = duration.components
        return UInt32(clamping: seconds * 1_000 + attoseconds / 1_000_000_000_000_000)
    }
}
