import Foundation

/// Lets through at most `perMinute` log records a minute; the next one let through says how
/// many were held back. For events an outsider can cause at will (enrollment refusals).
final class RateLimitedLog: @unchecked Sendable {
    typealias Clock = @Sendable () -> ContinuousClock.Instant
    private let lock = NSLock()
    private let perMinute: Int
    private var now: Clock
    private var windowStart: ContinuousClock.Instant
    private var inWindow = 0
    private var suppressed = 0

    init(perMinute: Int, now: @escaping Clock = { ContinuousClock.now }) {
        self.perMinute = perMinute
        self.now = now
        self.windowStart = now()
    }

    /// Replaces the clock (tests hold time still, so a slow machine does not open a new window).
    func useClock(_ clock: @escaping Clock) {
        lock.withLock {
            now = clock
            windowStart = clock()
        }
    }

    func log(_ emit: (_ suppressed: Int) -> Void) {
        let held: Int? = lock.withLock {
            let now = self.now()
            if now - windowStart >= .seconds(60) {
                windowStart = now
                inWindow = 0
            }
            guard inWindow < perMinute else {
                suppressed += 1
                return nil
            }
            inWindow += 1
            defer { suppressed = 0 }
            return suppressed
        }
        if let held { emit(held) }
    }
}
