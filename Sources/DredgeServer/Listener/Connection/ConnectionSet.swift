import DredgeWire
import Synchronization

/// The open agent connections, so a shutdown can end them and wait until they have ended.
final class ConnectionSet: Sendable {
    private struct State {
        var connections: [Int: ConnectionOutbound] = [:]
        var next = 0
        var closing = false
        var drainWaiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter = 0
    }

    private let state = Mutex(State())

    /// Adds a connection; returns its token, and whether the set is closing (the caller closes
    /// the connection once it has kept the token).
    func insert(_ connection: ConnectionOutbound) -> (token: Int, closing: Bool) {
        state.withLock { s in
            s.next += 1
            s.connections[s.next] = connection
            return (s.next, s.closing)
        }
    }

    func remove(_ token: Int) {
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.connections.removeValue(forKey: token)
            guard s.connections.isEmpty else { return [] }
            defer { s.drainWaiters = [:] }
            return Array(s.drainWaiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once every connection inserted has been removed (each connection removes itself
    /// when its driver has ended it). Cancellation does not end the wait: the listener's own
    /// shutdown stops the thread pools only after this, and a connection's cleanup uses them.
    func drained() async {
        await wait(id: nil)
    }

    /// Waits parked in ``drained()`` or ``drainedOrCancelled()`` now (tests wait for a wait to
    /// be parked before they look at what it did not do).
    var parkedWaiters: Int { state.withLock { $0.drainWaiters.count } }

    /// ``drained()``, or until the waiting task is cancelled (a test's deadline ends the wait).
    func drainedOrCancelled() async {
        let id = state.withLock { s in
            s.nextWaiter += 1
            return s.nextWaiter
        }
        await withTaskCancellationHandler {
            await wait(id: id)
        } onCancel: {
            let waiter = state.withLock { $0.drainWaiters.removeValue(forKey: id) }
            waiter?.resume()
        }
    }

    /// Waits until the set is empty; with an `id`, also returns once the task is cancelled.
    private func wait(id: Int?) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                // Cancelled before this registers: the cancellation handler found nothing to resume.
                if s.connections.isEmpty || (id != nil && Task.isCancelled) { return true }
                let key: Int
                if let id {
                    key = id
                } else {
                    s.nextWaiter += 1
                    key = s.nextWaiter
                }
                s.drainWaiters[key] = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Says `Goodbye` to every connection and closes it (``ConnectionOutbound/goodbye(_:returning:)``);
    /// connections inserted later are closed at once. Acts once. `returning`: how soon the
    /// server expects to be back, given the number of connections it is saying goodbye to (a
    /// planned restart; nil: nothing is said).
    func closeAll(saying reason: String, returning: ((_ connections: Int) -> PlannedReturn?)? = nil) {
        let all = state.withLock { s -> [ConnectionOutbound] in
            if s.closing { return [] }
            s.closing = true
            return Array(s.connections.values)
        }
        let planned = returning?(all.count)
        for connection in all { connection.goodbye(reason, returning: planned) }
    }
}

/// The listening port, set once bound.
final class BoundAddress: Sendable {
    private let value = Mutex<Int?>(nil)
    var port: Int? {
        get { value.withLock { $0 } }
        set { value.withLock { $0 = newValue } }
    }
}
