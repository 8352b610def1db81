import Synchronization

/// Runs passes one after another, each over everything asked for since the one before began.
///
/// ``ask(_:)`` folds a request into what is pending and, when no pass runs, starts one in a
/// task of its own; asked while a pass runs, the request waits for the next pass, which starts
/// as the running one ends. No task exists while nothing is pending, so an idle owner (a
/// connection) costs no task. A pass may end the runner (``After/stop``): nothing runs after
/// it, and later requests are dropped, as after ``stop()``.
///
/// The connection wing's serial work is made of it: an agent's pull deliveries
/// (``DeliveryRunner``), an upload's status writes and the removal of landed uploads' chunks
/// (``ConnectionUploads``).
final class SerialRunner<Pending: Sendable>: Sendable {
    /// What a pass says about the passes after it.
    enum After: Sendable {
        /// Run again when something is asked.
        case next
        /// Run no more.
        case stop
    }

    private struct State {
        var pending: Pending
        /// Something was asked since the running pass (if any) began.
        var owed = false
        var running = false
        var stopped = false
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let empty: Pending
    private let state: Mutex<State>
    private let pass: @Sendable (Pending) async -> After

    /// - Parameter empty: what is pending when nothing is (each pass starts it over).
    /// - Parameter pass: one pass over what was asked; called by one task at a time.
    init(empty: Pending, pass: @escaping @Sendable (Pending) async -> After) {
        self.empty = empty
        self.pass = pass
        state = Mutex(State(pending: empty))
    }

    /// Folds a request into the pending work (`fold` runs under the runner's lock: keep it to
    /// a few assignments) and starts a pass if none runs. Returns false, and folds nothing,
    /// once the runner is stopped.
    @discardableResult
    func ask(_ fold: (inout Pending) -> Void) -> Bool {
        let start = state.withLock { s -> Bool? in
            if s.stopped { return nil }
            fold(&s.pending)
            s.owed = true
            if s.running { return false }
            s.running = true
            return true
        }
        guard let start else { return false }
        if start { Task { await self.run() } }
        return true
    }

    /// Returns once no pass runs and nothing is pending (or the runner is stopped and its last
    /// pass has ended).
    func idle() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if !s.running { return true }
                s.idleWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// No pass starts from now on and what is pending is dropped; returns once the running
    /// pass, if any, has ended.
    func stop() async {
        state.withLock { s in
            s.stopped = true
            s.pending = empty
            s.owed = false
        }
        await idle()
    }

    /// Whether the runner was stopped (by ``stop()`` or by a pass).
    var isStopped: Bool { state.withLock { $0.stopped } }

    /// Waits parked in ``idle()`` or ``stop()`` now (a test waits for a wait to be parked
    /// before it looks at what the wait did not do).
    var parked: Int { state.withLock { $0.idleWaiters.count } }

    private func run() async {
        while true {
            // Taking the pending work and ending the run are one step under the lock: a request
            // asked meanwhile either comes with this pass or finds no pass running and starts one.
            let (next, waiters) = state.withLock { s -> (Pending?, [CheckedContinuation<Void, Never>]) in
                guard s.owed, !s.stopped else {
                    s.running = false
                    defer { s.idleWaiters = [] }
                    return (nil, s.idleWaiters)
                }
                s.owed = false
                let pending = s.pending
                s.pending = empty
                return (pending, [])
            }
            guard let next else {
                for waiter in waiters { waiter.resume() }
                return
            }
            if await pass(next) == .stop {
                state.withLock { s in
                    s.stopped = true
                    s.pending = empty
                    s.owed = false
                }
            }
        }
    }
}
