import DredgeDomain
import Foundation

/// The bounded buffer between log calls and the writer thread.
///
/// A log call takes one uncontended lock, appends, and wakes the writer only if it sleeps. The
/// writer swaps the whole buffer out in one step, so producers never wait on SQLite.
///
/// Sequence numbers: every accepted entry, and every sign-in attribution, is an operation; the
/// writer reports how many it finished (written or failed, in order). `flush` waits until the
/// finished count reaches the count of operations it saw when called.
final class WriteQueue: @unchecked Sendable {  // every var is under `condition` (Mutex cannot wait on a condition)
    struct Batch {
        var entries: [LogEntry]
        var dropped: LossWindow?
        /// Each runs once the entries before `position` in `entries` are stored, and before
        /// the rest: exactly where it was queued among them.
        var attributions: [(position: Int, attribution: SignInAttribution)] = []
    }

    /// Entries that never reached the store, summarised for the loss table.
    struct LossWindow: Equatable {
        var count: Int
        var first: Timestamp
        var last: Timestamp

        mutating func add(_ ts: Timestamp) {
            count += 1
            first = min(first, ts)
            last = max(last, ts)
        }
    }

    struct Counters {
        var accepted: UInt64 = 0
        var finished: UInt64 = 0
        var droppedQueueFull: UInt64 = 0
        var droppedClosed: UInt64 = 0
        var failedWrites: UInt64 = 0
        var depth = 0
        /// Entries and attributions taken in, and those the writer is done with: what a flush
        /// waits on.
        var operations: UInt64 = 0
        var operationsDone: UInt64 = 0
    }

    private let condition = NSCondition()
    private var buffer: [LogEntry]
    private var spare: [LogEntry]
    private let capacity: Int
    private let policy: OverflowPolicy

    private var counters = Counters()
    private var writerSleeping = false
    /// The writer holds a small batch back for more (see `StoreConfiguration.writeLinger`).
    private var lingering = false
    private let linger: Duration
    private let lingerBelow: Int
    private var blockedProducers = 0
    private var closed = false
    /// Set once the writer has run the retention pass it runs at open.
    private var ready = false
    private var pendingDrop: LossWindow?
    private var attributions: [(position: Int, attribution: SignInAttribution)] = []
    private var unreportedFailure: StoreError?
    private var asyncWaiters: [(target: UInt64, continuation: CheckedContinuation<Void, any Error>)] = []
    private var syncFlushers = 0
    private var flushWaiting: Bool { syncFlushers > 0 || !asyncWaiters.isEmpty }

    init(capacity: Int, policy: OverflowPolicy, linger: Duration = .zero, lingerBelow: Int = 64) {
        self.capacity = max(1, capacity)  // LogStore refuses a configuration below 1 first
        self.policy = policy
        self.linger = linger
        self.lingerBelow = lingerBelow
        self.buffer = []
        self.spare = []
        buffer.reserveCapacity(min(capacity, 4096))
        spare.reserveCapacity(min(capacity, 4096))
    }

    /// Appends an entry, or applies the overflow policy. Returns false if the entry was dropped.
    @discardableResult
    func enqueue(_ entry: LogEntry) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        if closed {
            counters.droppedClosed += 1
            return false
        }
        if buffer.count >= capacity {
            switch policy {
            case .dropNewest:
                counters.droppedQueueFull += 1
                if pendingDrop == nil {
                    pendingDrop = LossWindow(count: 1, first: entry.timestamp, last: entry.timestamp)
                } else {
                    pendingDrop!.add(entry.timestamp)
                }
                return false
            case .block:
                blockedProducers += 1
                while buffer.count >= capacity && !closed { condition.wait() }
                blockedProducers -= 1
                if closed {
                    counters.droppedClosed += 1
                    return false
                }
            }
        }
        buffer.append(entry)
        counters.accepted += 1
        counters.operations += 1
        if writerSleeping || (lingering && buffer.count >= lingerBelow) { condition.broadcast() }
        return true
    }

    /// Queues an attribution behind every entry enqueued so far. Returns false if the queue is
    /// closed.
    func attribute(_ attribution: SignInAttribution) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard !closed else { return false }
        attributions.append((buffer.count, attribution))
        counters.operations += 1
        if writerSleeping || lingering { condition.broadcast() }
        return true
    }

    /// Writer side: waits until there are entries, the deadline passes, or the queue closes.
    /// Returns nil only when closed and empty.
    func take(until deadline: Date) -> Batch? {
        condition.lock()
        defer { condition.unlock() }
        while buffer.isEmpty && pendingDrop == nil && attributions.isEmpty && !closed {
            writerSleeping = true
            let signalled = condition.wait(until: deadline)
            writerSleeping = false
            if !signalled { break }
        }
        if buffer.isEmpty && pendingDrop == nil && attributions.isEmpty && closed { return nil }
        // A few records: wait a little for more, unless someone waits for them.
        if linger > .zero && !buffer.isEmpty && buffer.count < lingerBelow && !closed && !flushWaiting && attributions.isEmpty {
            let until = Date().addingTimeInterval(Double(linger.components.attoseconds) / 1e18 + Double(linger.components.seconds))
            lingering = true
            while buffer.count < lingerBelow && !closed && !flushWaiting {
                if !condition.wait(until: until) { break }
            }
            lingering = false
        }
        swap(&buffer, &spare)
        let entries = spare
        spare = []
        let dropped = pendingDrop
        pendingDrop = nil
        let taken = attributions
        attributions = []
        if blockedProducers > 0 { condition.broadcast() }
        return Batch(entries: entries, dropped: dropped, attributions: taken)
    }

    /// Writer side: hands the emptied array back so its capacity is reused.
    func recycle(_ array: inout [LogEntry]) {
        array.removeAll(keepingCapacity: true)
        condition.lock()
        if spare.capacity < array.capacity { swap(&spare, &array) }
        condition.unlock()
    }

    /// Writer side: `count` entries, in order, are done; `error` if they were not stored.
    func finish(count: Int, error: StoreError?) {
        condition.lock()
        counters.finished += UInt64(count)
        counters.operationsDone += UInt64(count)
        if let error {
            counters.failedWrites += UInt64(count)
            report(error)
        }
        resumeAsyncWaiters()
        condition.broadcast()
        condition.unlock()
    }

    /// Writer side: an attribution is done; `error` if it could not be applied.
    func finishAttribution(error: StoreError?) {
        condition.lock()
        counters.operationsDone += 1
        if let error { report(error) }
        resumeAsyncWaiters()
        condition.broadcast()
        condition.unlock()
    }

    /// Keeps a failure for the next flush to throw. Called with the lock held.
    private func report(_ error: StoreError) {
        var failure = error
        if let previous = unreportedFailure, previous.code == .writeFailed || previous.code == error.code {
            failure.message = "\(previous.message); \(error.message)"
        }
        unreportedFailure = failure
    }

    /// Resumes the async flushes whose entries are all finished. Called with the lock held;
    /// resuming a continuation only schedules its task, so it is safe under the lock.
    private func resumeAsyncWaiters() {
        guard ready || closed else { return }
        let finished = counters.operationsDone
        var resumable: [CheckedContinuation<Void, any Error>] = []
        asyncWaiters.removeAll { waiter in
            if waiter.target <= finished { resumable.append(waiter.continuation); return true }
            return false
        }
        guard !resumable.isEmpty else { return }
        let failure = takeFailure()
        for continuation in resumable {
            if let failure { continuation.resume(throwing: failure) } else { continuation.resume() }
        }
    }

    /// Puts back drop counts the writer could not persist, so the next batch records them.
    func restoreDrop(_ window: LossWindow) {
        condition.lock()
        if var pending = pendingDrop {
            pending.count += window.count
            pending.first = min(pending.first, window.first)
            pending.last = max(pending.last, window.last)
            pendingDrop = pending
        } else {
            pendingDrop = window
        }
        condition.unlock()
    }

    private func takeFailure() -> StoreError? {
        defer { unreportedFailure = nil }
        return unreportedFailure
    }

    /// Writer side: the retention pass at open is done.
    func markReady() {
        condition.lock()
        ready = true
        resumeAsyncWaiters()
        condition.broadcast()
        condition.unlock()
    }

    /// Blocks until every entry accepted before the call is finished (and the writer has done
    /// its work at open). Throws the first write failure not yet reported by an earlier flush.
    func flush() throws {
        condition.lock()
        let target = counters.operations
        syncFlushers += 1
        if writerSleeping || lingering { condition.broadcast() }
        while counters.operationsDone < target || !(ready || closed) { condition.wait() }
        syncFlushers -= 1
        let failure = takeFailure()
        condition.unlock()
        if let failure { throw failure }
    }

    func flush() async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            condition.lock()
            let target = counters.operations
            if counters.operationsDone >= target && (ready || closed) {
                let failure = takeFailure()
                condition.unlock()
                if let failure { continuation.resume(throwing: failure) } else { continuation.resume() }
                return
            }
            asyncWaiters.append((target, continuation))
            if writerSleeping || lingering { condition.broadcast() }
            condition.unlock()
        }
    }

    /// Refuses new entries and wakes everyone. The writer drains what is left.
    func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        condition.unlock()
    }

    var snapshot: Counters {
        condition.lock()
        defer { condition.unlock() }
        var c = counters
        c.depth = buffer.count
        return c
    }
}
