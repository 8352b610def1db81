import DredgeAdminAPI
import DredgeDomain
import DredgeTestSupport
import Foundation
import Logging
import Testing
@testable import DredgeServer

/// What several nodes on one PostgreSQL database rely on, in process: two stores over the
/// same schema stand for two nodes.
@Suite(.enabled(if: TestPostgres.url != nil, "needs DREDGE_TEST_POSTGRES (make test starts a cluster)"))
struct PostgresNodesTests {
    let dir = TempDir()

    /// Counts what a stream yields, in the background.
    final class Counter: @unchecked Sendable {
        private let lock = NSLock()
        private var value = 0
        private var task: Task<Void, Never>?
        init(_ stream: AsyncStream<Void>) {
            task = Task { [weak self] in
                for await _ in stream { self?.lock.withLock { self?.value += 1 } }
            }
        }
        deinit { task?.cancel() }
        var count: Int { lock.withLock { value } }

        /// Whether the count reaches `n` within `timeout` (a bound for a failing test, not a
        /// measurement).
        func reaches(_ n: Int, within timeout: Duration = .seconds(30)) async -> Bool {
            let deadline = ContinuousClock.now + timeout
            while ContinuousClock.now < deadline {
                if count >= n { return true }
                try? await Task.sleep(for: .milliseconds(10))
            }
            return false
        }
    }

    @Test func aPullQueuedOnOneNodeWakesItsAgentOnAnotherWithoutASweep() async throws {
        let nodeA = PostgresPullQueue(try await TestPostgres.database(for: dir))
        let nodeB = PostgresPullQueue(try await TestPostgres.database(for: dir))
        // A sweep once an hour: only the notification can wake the agent in time.
        let dispatcher = PullDispatcher(pulls: nodeB, sweepInterval: .seconds(3600), logger: Logger(label: "test"), notices: nodeB)
        let running = Task { try await dispatcher.run() }
        defer { running.cancel() }
        let agent = String(repeating: "c", count: 32)
        let (stream, token) = dispatcher.register(agent)
        defer { dispatcher.unregister(agent, token: token) }
        let wakes = Counter(stream)
        #expect(await wakes.reaches(1), "the first wake, at registration")

        let pull = try PullQueueConformanceTests.newPull(targets: [agent], at: .now)
        try await nodeA.create(pull)
        #expect(await wakes.reaches(2), "node A's pull wakes the agent held by node B")
        #expect(try await nodeB.deliverable(for: agent, includingUnanswered: false) == [pull.id])

        // An agent that comes to hold a uid joins a pull by uid, and is woken too.
        let byUID = try PullQueueConformanceTests.newPull(targets: [], filter: LogFilter(uid: "u-9"), at: .now)
        try await nodeA.create(byUID)
        #expect(try await nodeA.adopt(agent: agent, uids: ["u-9"], now: .now) == [byUID.id])
        #expect(await wakes.reaches(3), "an adoption on node A wakes the agent on node B")
    }

    @Test func aNodeThatStartsListeningLateIsToldWhatWasQueuedMeanwhile() async throws {
        let nodeA = PostgresPullQueue(try await TestPostgres.database(for: dir))
        let nodeB = PostgresPullQueue(try await TestPostgres.database(for: dir))
        let agent = String(repeating: "d", count: 32)
        try await nodeA.create(try PullQueueConformanceTests.newPull(targets: [agent], at: .now))
        let told = AsyncStream<[String]>.makeStream()
        let listening = Task { await nodeB.listen(logger: Logger(label: "test")) { told.continuation.yield($0) } }
        defer { listening.cancel() }
        var it = told.stream.makeAsyncIterator()
        #expect(await it.next() == [agent])
    }
}
