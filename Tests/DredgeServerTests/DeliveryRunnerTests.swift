import DredgeDomain
import Foundation
import Synchronization
import Testing
@testable import DredgeServer

/// What each delivery pass of a connection is asked to do (``DeliveryRunner``): read the
/// agent's due pulls, or send the pulls just queued as they came with their wakes.
@Suite struct DeliveryRunnerTests {
    /// A runner whose passes are recorded, each held until `release` lets it finish with the
    /// given result.
    final class Recorder: @unchecked Sendable {
        let requests = Mutex<[DeliveryRunner.Request]>([])
        private let gates = Mutex<[CheckedContinuation<DeliveryRunner.Pass, Never>]>([])
        private(set) var runner: DeliveryRunner!

        init() {
            runner = DeliveryRunner { [self] request in
                requests.withLock { $0.append(request) }
                return await withCheckedContinuation { continuation in gates.withLock { $0.append(continuation) } }
            }
        }

        /// Waits for pass number `count` to start.
        func passStarted(_ count: Int) async throws {
            for _ in 0..<2000 {
                if gates.withLock({ $0.count }) > 0 && requests.withLock({ $0.count }) >= count { return }
                try await Task.sleep(for: .milliseconds(5))
            }
            throw DeploymentError("pass \(count) never started")
        }

        /// Ends the running pass with `result`.
        func release(_ result: DeliveryRunner.Pass) {
            gates.withLock { $0.removeFirst() }.resume(returning: result)
        }

        var last: DeliveryRunner.Request? { requests.withLock { $0.last } }
    }

    static func fresh(_ id: String) -> FreshPull {
        FreshPull(StoredPull(id: id, uid: "", filter: .all, issuedAt: .now, expiresAt: .now.adding(.seconds(60)), wrappedKey: [1]))
    }

    @Test func theFirstPassReadsAndPullsQueuedLaterAreSentWithoutReading() async throws {
        let r = Recorder()
        r.runner.wake()
        try await r.passStarted(1)
        #expect(r.last?.read == true && r.last?.includingUnanswered == true)
        r.runner.wake(Self.fresh("p1"))  // while the first pass runs
        r.runner.wake(Self.fresh("p2"))
        r.release(.delivered)
        try await r.passStarted(2)
        #expect(r.last?.read == false)
        #expect(r.last?.fresh.map(\.pull.id) == ["p1", "p2"])
        r.release(.delivered)
        r.runner.wake()  // the sweep, a late join
        try await r.passStarted(3)
        #expect(r.last?.read == true && r.last?.includingUnanswered == false)
        #expect(r.last?.fresh.isEmpty == true)
        r.release(.delivered)
        await r.runner.stop()
    }

    @Test func aReadThatFailedIsMadeByTheNextPassEvenForAFreshPull() async throws {
        let r = Recorder()
        r.runner.wake()
        try await r.passStarted(1)
        r.release(.unread)
        r.runner.wake(Self.fresh("p1"))
        try await r.passStarted(2)
        #expect(r.last?.read == true && r.last?.includingUnanswered == true, "still the connection's first read")
        r.release(.delivered)
        r.runner.wake(Self.fresh("p2"))
        try await r.passStarted(3)
        #expect(r.last?.read == false)
        r.release(.unread)  // its key could not be read
        r.runner.wake(Self.fresh("p3"))
        try await r.passStarted(4)
        #expect(r.last?.read == true && r.last?.includingUnanswered == false)
        r.release(.delivered)
        await r.runner.stop()
    }

    @Test func tooManyFreshPullsAtOnceAreReadInstead() async throws {
        let r = Recorder()
        r.runner.wake()
        try await r.passStarted(1)
        for i in 0...DeliveryRunner.freshLimit { r.runner.wake(Self.fresh("p\(i)")) }
        r.release(.delivered)
        try await r.passStarted(2)
        #expect(r.last?.read == true)
        r.release(.delivered)
        await r.runner.stop()
        #expect(r.requests.withLock { $0.count } == 2, "the wakes while a pass ran make one pass")
    }
}
