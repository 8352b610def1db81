import Synchronization

/// Lets through at most `perMinute` log records a minute; the next one let through says how
/// many were held back. For events an outsider can cause at will (enrollment refusals).
final class RateLimitedLog: Sendable {
    typealias Clock = @Sendable () -> ContinuousClock.Instant

    private struct State {
        var now: Clock
        var windowStart: ContinuousClock.Instant
        var inWindow = 0
        var suppressed = 0
    }

    private let perMinute: Int
    private let state: Mutex<State>

    init(perMinute: Int, now: @escaping Clock = { ContinuousClock.now }) {
        self.perMinute = perMinute
        state = Mutex(State(now: now, windowStart: now()))
    }

    /// Replaces the clock (tests hold time still, so a slow machine does not open a new window).
    func useClock(_ clock: @escaping Clock) {
        state.withLock { s in
            s.now = clock
            s.windowStart = clock()
        }
    }

    func log(_ emit: (_ suppressed: Int) -> Void) {
        let held = state.withLock { s -> Int? in
            let now = s.now()
            if now - s.windowStart >= .seconds(60) {
                s.windowStart = now
                s.inWindow = 0
            }
            guard s.inWindow < perMinute else {
                s.suppressed += 1
                return nil
            }
            s.inWindow += 1
            defer { s.suppressed = 0 }
            return s.suppressed
        }
        if let held { emit(held) }
    }
}
