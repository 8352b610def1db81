import Foundation

/// Runs an agent's pull deliveries for one connection: a wake starts a pass in a task of its
/// own, or, when one is running, another pass after it; no task waits between wakes.
///
/// A pass reads the agent's due pulls when a wake asked for it (the connection's first pass,
/// the sweep, a late join), or when an earlier read failed; a pass woken only by pulls this
/// process just queued (``FreshPull``) sends those without reading.
final class DeliveryRunner: @unchecked Sendable {  // state under `lock`
    enum Pass: Sendable {
        /// The agent's pulls could not be read: the next wake tries again.
        case unread
        case delivered
        /// This connection is no longer the agent's live one: no more passes.
        case stop
    }

    /// What one pass is to do.
    struct Request: Sendable {
        /// Read the agent's due pulls (they include the fresh ones, if still queued).
        var read: Bool
        /// With `read`: the pulls delivered before and never answered, too (a connection's
        /// first pass).
        var includingUnanswered: Bool
        /// Pulls just queued for the agent, oldest first; sent as they are when not `read`.
        var fresh: [FreshPull]
    }

    /// Fresh pulls kept for the next pass at most; past that, the pass reads instead.
    static let freshLimit = 16

    private let lock = NSLock()
    private var running = false
    private var again = false
    private var stopped = false
    /// The first pass of a connection also sends the pulls delivered before and never answered.
    private var reconnecting = true
    /// The next pass reads the agent's due pulls.
    private var readOwed = false
    private var fresh: [FreshPull] = []
    private var idleWaiters: [CheckedContinuation<Void, Never>] = []
    private let pass: @Sendable (Request) async -> Pass

    init(pass: @escaping @Sendable (Request) async -> Pass) {
        self.pass = pass
    }

    /// Starts a pass (or another after the running one): for `pull`, just queued for the
    /// agent, or, with nil, to read what is due.
    func wake(_ pull: FreshPull? = nil) {
        let start = lock.withLock { () -> Bool in
            if stopped { return false }
            if let pull, fresh.count < Self.freshLimit {
                fresh.append(pull)
            } else {
                readOwed = true
            }
            if running {
                again = true
                return false
            }
            running = true
            return true
        }
        if start { Task { await self.loop() } }
    }

    /// No pass starts from now on; returns when the running one (if any) is done.
    func stop() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = lock.withLock { () -> Bool in
                stopped = true
                if !running { return true }
                idleWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    private func loop() async {
        while true {
            let request = lock.withLock { () -> Request in
                defer {
                    again = false
                    readOwed = false
                    fresh = []
                }
                return Request(read: readOwed || reconnecting, includingUnanswered: reconnecting, fresh: fresh)
            }
            let result = await pass(request)
            let (more, waiters) = lock.withLock { () -> (Bool, [CheckedContinuation<Void, Never>]) in
                switch result {
                case .delivered: reconnecting = false
                case .unread: readOwed = true
                case .stop: stopped = true
                }
                if again && !stopped { return (true, []) }
                running = false
                defer { idleWaiters = [] }
                return (false, idleWaiters)
            }
            for waiter in waiters { waiter.resume() }
            if !more { return }
        }
    }
}
