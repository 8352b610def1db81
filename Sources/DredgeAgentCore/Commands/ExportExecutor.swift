import Foundation
import NIOPosix

/// The threads the agent's exports run on: a bounded number at a time, off the connection's
/// path and off Swift's cooperative pool (an export reads the store, deflates on every core
/// and writes a zip; it blocks while it does).
///
/// A pull command takes a place before it is accepted (``reserve()``); when none is free the
/// agent answers `REJECT_BUSY` (Protocol/README.md § Pull commands) and forgets the command,
/// so the engineer can ask again later. An export accepted before a restart runs whatever the
/// count (``reserveAnyway()``): it was promised.
final class ExportExecutor: @unchecked Sendable {  // the count under `lock`
    let capacity: Int
    private let pool: NIOThreadPool
    private let lock = NSLock()
    private var inFlight = 0

    init(capacity: Int) {
        self.capacity = max(1, capacity)
        pool = NIOThreadPool(numberOfThreads: self.capacity)
        pool.start()
    }

    deinit {
        pool.shutdownGracefully { _ in }  // nothing is waiting for the threads to end
    }

    /// Exports accepted and not finished.
    var running: Int { lock.withLock { inFlight } }

    /// Takes a place if one is free.
    func reserve() -> Bool {
        lock.withLock {
            guard inFlight < capacity else { return false }
            inFlight += 1
            return true
        }
    }

    /// Takes a place whether or not one is free (the export then waits for a thread).
    func reserveAnyway() { lock.withLock { inFlight += 1 } }

    /// Gives back a place reserved and not used.
    func release() { lock.withLock { inFlight -= 1 } }

    /// Runs `work` in a place reserved before, which is given back when it returns; `work(false)`
    /// when the threads have stopped and it will not run.
    func run(_ work: @escaping @Sendable (_ run: Bool) -> Void) {
        pool.submit { state in
            work(state == .active)
            self.release()
        }
    }
}
