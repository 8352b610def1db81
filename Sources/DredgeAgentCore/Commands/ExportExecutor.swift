import Foundation
import NIOPosix
import Synchronization

/// The threads the agent's exports run on: a bounded number at a time, off the connection's
/// path and off Swift's cooperative pool (an export reads the store, deflates on every core
/// and writes a zip; it blocks while it does).
///
/// A pull command takes a place before it is accepted (``reserve()``); when none is free the
/// agent answers `REJECT_BUSY` (Protocol/README.md § Pull commands) and forgets the command,
/// so the engineer can ask again later. An export accepted before a restart runs whatever the
/// count (``reserveAnyway()``): it was promised.
///
/// Beside the exports' threads it has one thread for the agent's short blocking steps
/// (``blocking(_:)``): a command's admission (an Ed25519 verification and an RSA unwrap), the
/// durable writes that keep an accepted command and the memory of commands seen, and sealing
/// chunks. They never wait behind an export, and never hold a thread of Swift's cooperative
/// pool (where the agent's connection runs) while they compute or wait for the disk.
final class ExportExecutor: Sendable {
    let capacity: Int
    private let pool: NIOThreadPool
    private let steps: NIOThreadPool
    private let inFlight = Mutex(0)

    init(capacity: Int) {
        self.capacity = max(1, capacity)
        pool = NIOThreadPool(numberOfThreads: self.capacity)
        pool.start()
        steps = NIOThreadPool(numberOfThreads: 1)
        steps.start()
    }

    deinit {
        pool.shutdownGracefully { _ in }  // nothing is waiting for the threads to end
        steps.shutdownGracefully { _ in }
    }

    /// Runs a short blocking step on the steps' thread, in the order asked, and returns its
    /// result; throws when the threads have stopped.
    func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await steps.runIfActive(body)
    }

    /// Runs a short blocking step on the steps' thread without waiting for it, after the steps
    /// asked before (also while the threads are stopping: it is a write that must not be lost).
    func step(_ body: @escaping @Sendable () -> Void) {
        steps.submit { _ in body() }
    }

    /// Runs an export the agent started by itself (a capture, #54) on the exports' threads,
    /// counted among the running exports (a pull command meanwhile may be answered busy), and
    /// returns its result; throws when the threads have stopped.
    func export<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        reserveAnyway()
        return try await withCheckedThrowingContinuation { (done: CheckedContinuation<T, any Error>) in
            run { active in
                guard active else { return done.resume(throwing: AgentError("the agent is stopping")) }
                done.resume(with: Result { try body() })
            }
        }
    }

    /// Exports accepted and not finished.
    var running: Int { inFlight.withLock { $0 } }

    /// Takes a place if one is free.
    func reserve() -> Bool {
        inFlight.withLock { count in
            guard count < capacity else { return false }
            count += 1
            return true
        }
    }

    /// Takes a place whether or not one is free (the export then waits for a thread).
    func reserveAnyway() { inFlight.withLock { $0 += 1 } }

    /// Gives back a place reserved and not used.
    func release() { inFlight.withLock { $0 -= 1 } }

    /// Runs `work` in a place reserved before, which is given back when it returns; `work(false)`
    /// when the threads have stopped and it will not run.
    func run(_ work: @escaping @Sendable (_ run: Bool) -> Void) {
        pool.submit { state in
            work(state == .active)
            self.release()
        }
    }
}
