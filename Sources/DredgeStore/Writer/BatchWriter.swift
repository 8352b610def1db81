import Foundation
import GRDB
import Synchronization

/// The store's single writer: a dedicated thread that drains the ``WriteQueue`` into
/// transactions of at most `maxBatchSize` records, and runs retention at start, every
/// `retentionInterval`, and whenever a size check finds the store over its limit.
///
/// A failed write (a full disk, an I/O error) drops that batch, counts it, reports it to the
/// next `flush`, and records it as a `write.failed` loss once a write succeeds again. It never
/// touches records already committed.
final class BatchWriter: Sendable {
    private let queue: WriteQueue
    private let pool: DatabasePool
    private let configuration: StoreConfiguration
    private let retention: Retention
    private let path: String
    private let exited = DispatchSemaphore(value: 0)
    /// Held for a whole retention pass, so passes never overlap (the writer's own and
    /// ``retentionPass()``'s callers').
    private let maintenance = Mutex(Maintenance())

    private struct Maintenance {
        var lastReport: RetentionReport?
        var errors: UInt64 = 0
    }

    /// The size the store is held under, as the last pass read it (from open until then):
    /// what the size check after commits compares with. Its own lock, never held for a pass.
    private let maxBytes: Mutex<Int64>

    init(queue: WriteQueue, pool: DatabasePool, configuration: StoreConfiguration, path: String, maxBytes: Int64) {
        self.queue = queue
        self.pool = pool
        self.configuration = configuration
        self.path = path
        self.retention = Retention(path: path, safeguardBytes: configuration.retention.maxBytes)
        self.maxBytes = Mutex(maxBytes)
    }

    func start() {
        let thread = Thread { [self] in
            var loop = Loop(writer: self)
            loop.run()
            exited.signal()
        }
        thread.name = "dredge-store-writer"
        thread.start()
    }

    /// Returns once the writer has drained the queue and stopped. Call after `queue.close()`.
    func join() { exited.wait() }

    /// Runs one retention pass now. Safe to call from any thread; passes never overlap.
    func retentionPass() throws -> RetentionReport {
        try maintenance.withLock { maintenance in
            let report = try retention.run(pool: pool, now: configuration.now())
            maintenance.lastReport = report
            self.maxBytes.withLock { $0 = report.maxBytes }
            return report
        }
    }

    var lastRetention: RetentionReport? { maintenance.withLock { $0.lastReport } }

    var retentionFailures: UInt64 { maintenance.withLock { $0.errors } }

    private func runRetention() {
        do {
            _ = try retentionPass()
        } catch {
            maintenance.withLock { $0.errors += 1 }
        }
    }

    /// The writer thread's loop and the state only it touches (made on that thread).
    private struct Loop {
        let writer: BatchWriter
        var inserter: RecordInserter
        var pendingFailure: WriteQueue.LossWindow?
        var batchesSinceSizeCheck = 0

        init(writer: BatchWriter) {
            self.writer = writer
            inserter = RecordInserter(limits: writer.configuration.limits)
        }

        mutating func run() {
            let (queue, configuration) = (writer.queue, writer.configuration)
            writer.runRetention()
            queue.markReady()
            var nextRetention = Date().addingTimeInterval(configuration.retentionInterval.seconds)
            while let batch = queue.take(until: nextRetention) {
                write(batch)
                if Date() >= nextRetention {
                    writer.runRetention()
                    nextRetention = Date().addingTimeInterval(configuration.retentionInterval.seconds)
                }
            }
        }

        /// Counts a committed transaction and runs retention when the store has grown over its
        /// size limit. Checked before the transaction's entries are reported finished, so a
        /// `flush` also waits for the retention its own records caused.
        private mutating func checkSizeAfterCommit() {
            batchesSinceSizeCheck += 1
            guard batchesSinceSizeCheck >= writer.configuration.sizeCheckEveryBatches else { return }
            batchesSinceSizeCheck = 0
            if Retention.bytesOnDisk(writer.path) > writer.maxBytes.withLock({ $0 }) { writer.runRetention() }
        }

        private mutating func write(_ batch: WriteQueue.Batch) {
            let (queue, pool, configuration, path) = (writer.queue, writer.pool, writer.configuration, writer.path)
            var entries = batch.entries
            var dropped = batch.dropped
            var start = entries.startIndex
            let attributions = batch.attributions
            var nextAttribution = attributions.startIndex
            repeat {
                // An attribution runs exactly where it was queued: after the entries before it.
                while nextAttribution < attributions.endIndex, attributions[nextAttribution].position <= start {
                    attribute(attributions[nextAttribution].attribution)
                    nextAttribution += 1
                }
                var end = min(start + configuration.maxBatchSize, entries.endIndex)
                if nextAttribution < attributions.endIndex { end = min(end, attributions[nextAttribution].position) }
                let slice = entries[start..<end]
                do {
                    let failure = pendingFailure
                    try pool.write { db in
                        try inserter.insert(slice, in: db)
                        let now = configuration.now()
                        if let dropped {
                            try LossTable.insert(LossRecord(recordedAt: now, reason: .queueFull, count: Int64(dropped.count), first: dropped.first, last: dropped.last), db: db)
                        }
                        if let failure {
                            try LossTable.insert(LossRecord(recordedAt: now, reason: .writeFailed, count: Int64(failure.count), first: failure.first, last: failure.last), db: db)
                        }
                    }
                    dropped = nil
                    pendingFailure = nil
                    checkSizeAfterCommit()
                    queue.finish(count: slice.count, error: nil)
                } catch {
                    let storeError = StoreError.wrap(error, path: path)
                    if let first = slice.first {
                        var window = pendingFailure ?? WriteQueue.LossWindow(count: 0, first: first.timestamp, last: first.timestamp)
                        for entry in slice { window.add(entry.timestamp) }
                        pendingFailure = window
                    }
                    let failure = StoreError(
                        code: storeError.code == .diskFull ? .diskFull : .writeFailed,
                        message: "\(slice.count) records not stored: \(storeError.message)", path: path)
                    queue.finish(count: slice.count, error: failure)
                }
                start = end
            } while start < entries.endIndex
            if let dropped { queue.restoreDrop(dropped) }
            queue.recycle(&entries)
            for (_, attribution) in attributions[nextAttribution...] { attribute(attribution) }
        }

        /// Runs an attribution in a transaction of its own. A failure leaves the records
        /// anonymous and is reported to the next flush.
        private func attribute(_ attribution: SignInAttribution) {
            let (queue, configuration, path) = (writer.queue, writer.configuration, writer.path)
            do {
                try writer.pool.write { db in
                    try attribution.apply(in: db, maxUIDBytes: configuration.limits.maxUIDBytes)
                }
                queue.finishAttribution(error: nil)
            } catch {
                let storeError = StoreError.wrap(error, path: path)
                queue.finishAttribution(
                    error: StoreError(
                        code: storeError.code == .diskFull ? .diskFull : .writeFailed,
                        message: "records logged before a sign-in were not given the user's uid: \(storeError.message)", path: path))
            }
        }
    }
}

extension Duration {
    var seconds: Double {
        let (s, atto) = components
        return Double(s) + Double(atto) / 1e18
    }
}
