import Foundation
import NIOCore

/// The open agent connections, so a shutdown can end them and wait until they have ended.
final class ConnectionSet: @unchecked Sendable {
    private let lock = NSLock()
    private var channels: [Int: any Channel] = [:]
    private var next = 0
    private var closing = false
    private var drainWaiters: [Int: CheckedContinuation<Void, Never>] = [:]
    private var nextWaiter = 0

    /// Adds `channel`; returns its token, and whether the set is closing (the caller closes
    /// the channel once it has kept the token).
    func insert(_ channel: any Channel) -> (token: Int, closing: Bool) {
        lock.withLock {
            next += 1
            channels[next] = channel
            return (next, closing)
        }
    }

    func remove(_ token: Int) {
        let waiters = lock.withLock { () -> [CheckedContinuation<Void, Never>] in
            channels.removeValue(forKey: token)
            guard channels.isEmpty else { return [] }
            defer { drainWaiters = [:] }
            return Array(drainWaiters.values)
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
    var parkedWaiters: Int { lock.withLock { drainWaiters.count } }

    /// ``drained()``, or until the waiting task is cancelled (a test's deadline ends the wait).
    func drainedOrCancelled() async {
        let id = lock.withLock {
            nextWaiter += 1
            return nextWaiter
        }
        await withTaskCancellationHandler {
            await wait(id: id)
        } onCancel: {
            let waiter = lock.withLock { drainWaiters.removeValue(forKey: id) }
            waiter?.resume()
        }
    }

    /// Waits until the set is empty; with an `id`, also returns once the task is cancelled.
    private func wait(id: Int?) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = lock.withLock { () -> Bool in
                // Cancelled before this registers: the cancellation handler found nothing to resume.
                if channels.isEmpty || (id != nil && Task.isCancelled) { return true }
                let key: Int
                if let id {
                    key = id
                } else {
                    nextWaiter += 1
                    key = nextWaiter
                }
                drainWaiters[key] = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Says `Goodbye` to every connection and closes it (``AgentConnections/close(_:saying:)``);
    /// connections inserted later are closed at once. Acts once.
    func closeAll(saying reason: String) {
        let all = lock.withLock { () -> [any Channel] in
            if closing { return [] }
            closing = true
            return Array(channels.values)
        }
        for channel in all { AgentConnections.close(channel, saying: reason) }
    }
}

/// The listening port, set once bound.
final class BoundAddress: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Int?
    var port: Int? {
        get { lock.withLock { value } }
        set { lock.withLock { value = newValue } }
    }
}
