import NIOCore
import Synchronization

/// The chunks of one connection between arriving and being committed: ordering and
/// back-pressure, and nothing else (no upload, store or file is known here).
///
/// A chunk is taken in (``admit(_:)``) once there is room for it (``room()``): at most
/// ``capacity`` are in the pipeline at once. Its write runs elsewhere (on a pool, in any
/// order) and reports back through ``written(_:_:commit:)``; chunks are then committed strictly
/// in the order they were taken in, by one thread at a time: whichever thread finishes the write
/// at the front commits every chunk at the front whose write is done, and a thread that
/// finishes a chunk further back leaves it to that committer. A key stays in the pipeline,
/// so a second copy of it is refused, until its commit has returned.
final class ChunkPipeline<Key: Hashable & Sendable, Outcome: Sendable>: Sendable {
    private struct State {
        /// Taken in and not yet handed to a commit, in arrival order.
        var order = CircularBuffer<Key>(initialCapacity: 8)
        var outcomes: [Key: Outcome] = [:]
        /// Every key in the pipeline, including those being committed.
        var keys: Set<Key> = []
        var committing = false
        var roomWaiters: [CheckedContinuation<Void, Never>] = []
        var idleWaiters: [CheckedContinuation<Void, Never>] = []

        var isIdle: Bool { order.isEmpty && !committing }
    }

    let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) {
        precondition(capacity > 0, "a pipeline holds at least one chunk")
        self.capacity = capacity
    }

    /// Chunks taken in and not yet handed to a commit.
    var count: Int { state.withLock { $0.order.count } }

    /// Waits parked in ``room()`` and in ``idle()`` now (a test waits for a wait to be parked
    /// before it looks at what the wait did not do).
    var parked: (room: Int, idle: Int) { state.withLock { ($0.roomWaiters.count, $0.idleWaiters.count) } }

    /// Returns once fewer than ``capacity`` chunks are waiting for their write or their turn.
    func room() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if s.order.count < capacity { return true }
                s.roomWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Takes `key` in, behind every chunk taken in before it; false, and nothing taken, when a
    /// chunk with that key is still in the pipeline (being written or committed). Call after
    /// ``room()``, from one task at a time (the connection's), so arrival order is defined.
    func admit(_ key: Key) -> Bool {
        state.withLock { s in
            guard s.keys.insert(key).inserted else { return false }
            s.order.append(key)
            return true
        }
    }

    /// `key`'s write finished with `outcome` (on any thread). If no other thread is committing,
    /// this one commits, in arrival order and in batches, every chunk at the front whose write
    /// is done, calling `commit` outside the pipeline's lock; otherwise it leaves its chunk to
    /// the thread that is. Then wakes who waits for room or for the pipeline to be idle.
    func written(_ key: Key, _ outcome: Outcome, commit: ([(key: Key, outcome: Outcome)]) -> Void) {
        var mine = state.withLock { s -> Bool in
            precondition(s.keys.contains(key), "a chunk's write reported that was never taken in")
            s.outcomes[key] = outcome
            if s.committing { return false }
            s.committing = true
            return true
        }
        while mine {
            let ready = state.withLock { s -> [(key: Key, outcome: Outcome)] in
                var ready: [(key: Key, outcome: Outcome)] = []
                while let first = s.order.first, let outcome = s.outcomes.removeValue(forKey: first) {
                    ready.append((first, outcome))
                    s.order.removeFirst()
                }
                return ready
            }
            if !ready.isEmpty { commit(ready) }
            let (room, idle) = state.withLock { s -> ([CheckedContinuation<Void, Never>], [CheckedContinuation<Void, Never>]) in
                for chunk in ready { s.keys.remove(chunk.key) }
                if let first = s.order.first, s.outcomes[first] != nil {
                    mine = true
                } else {
                    mine = false
                    s.committing = false
                }
                var room: [CheckedContinuation<Void, Never>] = []
                if s.order.count < capacity { swap(&room, &s.roomWaiters) }
                var idle: [CheckedContinuation<Void, Never>] = []
                if s.isIdle { swap(&idle, &s.idleWaiters) }
                return (room, idle)
            }
            for waiter in room { waiter.resume() }
            for waiter in idle { waiter.resume() }
        }
    }

    /// Returns once every chunk taken in is committed and no commit runs.
    func idle() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if s.isIdle { return true }
                s.idleWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }
}
