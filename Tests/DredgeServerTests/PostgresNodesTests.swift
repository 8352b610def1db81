import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeTestSupport
import Foundation
import Logging
import DredgeWire
import Testing
@testable import DredgeServer

/// What several nodes on one PostgreSQL database rely on, in process: two stores over the
/// same schema stand for two nodes.
@Suite(.enabled(if: TestPostgres.url != nil, "needs DREDGE_TEST_POSTGRES (make test starts a cluster)"))
struct PostgresNodesTests {
    let dir = TempDir()

    /// Counts the dispatcher's wakes.
    final class Counter: @unchecked Sendable {
        private let lock = NSLock()
        private var value = 0
        func increment() { lock.withLock { value += 1 } }
        var count: Int { lock.withLock { value } }

        /// Whether the count reaches `n` within `timeout` (a bound for a failing test, not a
        /// measurement).
        func reaches(_ n: Int, within timeout: Duration = .seconds(30)) async -> Bool {
            let deadline = ContinuousClock.now + timeout
            while ContinuousClock.now < deadline {
                if count >= n { return true }
                try? await Task.sleep(for: .milliseconds(10))
            }
            // Once more after the deadline: a sleep that overran it (a busy machine) still counts.
            return count >= n
        }
    }

    @Test func aPullQueuedOnOneNodeWakesItsAgentOnAnotherWithoutASweep() async throws {
        let nodeA = PostgresPullQueue(try await TestPostgres.database(for: dir))
        let nodeB = PostgresPullQueue(try await TestPostgres.database(for: dir))
        // A sweep once an hour: only the notification can wake the agent in time.
        let dispatcher = PullDispatcher(pulls: nodeB, sweepInterval: .seconds(3600), logger: Logger(label: "test"), notices: nodeB)
        try await withBackground({ try await dispatcher.run() }) {
            let agent = String(repeating: "c", count: 32)
            let wakes = Counter()
            let token = dispatcher.register(agent) { _ in wakes.increment() }
            defer { dispatcher.unregister(agent, token: token) }
            #expect(await wakes.reaches(1), "the first wake, at registration")

            let pull = try PullQueueConformanceTests.newPull(targets: [agent], at: .now)
            try await nodeA.create(pull)
            #expect(await wakes.reaches(2), "node A's pull wakes the agent held by node B")
            #expect(try await nodeB.deliverable(for: agent, includingUnanswered: false).map(\.id) == [pull.id])

            // An agent that comes to hold a uid joins a pull by uid, and is woken too.
            let byUID = try PullQueueConformanceTests.newPull(targets: [], filter: LogFilter(uid: "u-9"), at: .now)
            try await nodeA.create(byUID)
            #expect(try await nodeA.adopt(agent: agent, uids: ["u-9"], now: .now) == [byUID.id])
            #expect(await wakes.reaches(3), "an adoption on node A wakes the agent on node B")
        }
    }

    @Test func aNodeThatStartsListeningLateIsToldWhatWasQueuedMeanwhile() async throws {
        let nodeA = PostgresPullQueue(try await TestPostgres.database(for: dir))
        let nodeB = PostgresPullQueue(try await TestPostgres.database(for: dir))
        let agent = String(repeating: "d", count: 32)
        try await nodeA.create(try PullQueueConformanceTests.newPull(targets: [agent], at: .now))
        let told = AsyncStream<[String]>.makeStream()
        try await withBackground({ await nodeB.listen(logger: Logger(label: "test")) { told.continuation.yield($0) } }) {
            var it = told.stream.makeAsyncIterator()
            // And the triggers may have changed meanwhile: every agent's set is looked at again (#54).
            #expect(await it.next() == [agent, PullDispatcher.triggersChangedMark])
        }
    }

    /// The node's lease ran out long ago, as if it had stopped renewing it (killed, cut off).
    static func expire(_ node: NodeLease, on db: PostgresDatabase) async throws {
        try await db.write { try await $0.run("UPDATE node SET renewed_at = renewed_at - 1000 WHERE id = \(node.id)") }
    }

    @Test func presenceIsLeasedPerNode() async throws {
        let db = try await TestPostgres.database(for: dir)
        let leaseA = NodeLease(db, name: "A"), leaseB = NodeLease(db, name: "B")
        let nodeA = PostgresAgentDirectory(db, node: leaseA), nodeB = PostgresAgentDirectory(db, node: leaseB)
        try await nodeA.resetPresence()
        let key = AgentDirectoryConformanceTests.keys[0].publicKey
        let id = try await nodeA.enroll(publicKey: key, host: AgentDirectoryConformanceTests.host, now: Date())
        let onA = try await nodeA.connected(id, from: "10.0.0.1:1", host: AgentDirectoryConformanceTests.host, now: Date())

        // Node B starts: it clears nothing of node A's.
        try await nodeB.resetPresence()
        #expect(try await nodeB.agents().first?.connected == true, "a starting node leaves a live node's agents present")
        #expect(Set(try await leaseB.liveNodes().map(\.name)) == ["A", "B"])

        // Node A dies: once its lease has run out its agents read as offline, without a write by anyone.
        try await Self.expire(leaseA, on: db)
        #expect(try await nodeB.agents().first?.connected == false, "a dead node's agents are offline once its lease runs out")
        #expect(try await leaseB.liveNodes().map(\.name) == ["B"])

        // The agent moves to B; A's connection, ending late, changes nothing.
        _ = try await nodeB.connected(id, from: "10.0.0.1:2", host: AgentDirectoryConformanceTests.host, now: Date())
        try await nodeA.disconnected(id, generation: onA)
        #expect(try await nodeA.agents().first?.connected == true)

        // A node that renews a lease that ran out (it was cut off, not dead) has its agents
        // back, even when another node started meanwhile.
        try await leaseA.renew()
        _ = try await nodeA.connected(id, from: "10.0.0.1:3", host: AgentDirectoryConformanceTests.host, now: Date())
        #expect(try await nodeB.agents().first?.connected == true)
        try await Self.expire(leaseA, on: db)
        #expect(try await nodeB.agents().first?.connected == false)
        try await PostgresAgentDirectory(db, node: NodeLease(db, name: "C")).resetPresence()
        try await leaseA.renew()
        #expect(try await nodeB.agents().first?.connected == true)
        // A graceful stop ends the lease at once.
        try await leaseA.leave()
        #expect(try await nodeB.agents().first?.connected == false)
    }

    @Test func aListingShowsHeldHeartbeatsAndADisconnectionWritesThem() async throws {
        let db = try await TestPostgres.database(for: dir)
        let node = PostgresAgentDirectory(db, presenceRefresh: .seconds(3600))
        let id = try await node.enroll(publicKey: AgentDirectoryConformanceTests.keys[0].publicKey, host: AgentDirectoryConformanceTests.host, now: Date())
        let generation = try await node.connected(id, from: nil, host: AgentDirectoryConformanceTests.host, now: Date())
        let beat = WireHeartbeat.with { $0.activeUids = ["u-1"] }
        try await node.heartbeat(id, beat, now: Date(timeIntervalSince1970: 5_000))
        try await node.heartbeat(id, beat, now: Date(timeIntervalSince1970: 6_000))  // held
        let other = PostgresAgentDirectory(db)
        #expect(try await other.agents().first?.lastHeartbeatAt == Date(timeIntervalSince1970: 5_000), "held, not written")
        // The node's own listing shows what it holds, and writes none of it.
        let listed = try #require(try await node.agents().first)
        #expect(listed.lastHeartbeatAt == Date(timeIntervalSince1970: 6_000))
        #expect(try await other.agents().first?.lastHeartbeatAt == Date(timeIntervalSince1970: 5_000), "a listing writes nothing")
        try await node.disconnected(id, generation: generation)
        #expect(try await other.agents().first?.lastHeartbeatAt == Date(timeIntervalSince1970: 6_000))
    }

    @Test func aSourceIsIndexedByOneNodeAndTakenOverWhenItDies() async throws {
        let db = try await TestPostgres.database(for: dir)
        let leaseA = NodeLease(db, name: "A"), leaseB = NodeLease(db, name: "B")
        let nodeA = PostgresRecordIndex(db, node: leaseA), nodeB = PostgresRecordIndex(db, node: leaseB)
        let source = RecordIndexConformanceTests.pull1
        func lines(_ words: [String]) -> [UInt8] {
            Array(words.enumerated().map { RecordIndexConformanceTests.line($0.offset, $0.element) + "\n" }.joined().utf8)
        }
        try await nodeA.begin(source, contexts: RecordIndexConformanceTests.contexts, landedAt: Date())
        _ = try await nodeA.add(source, lines: lines(["alpha", "beta"]))
        // Both nodes caught up on what landed: B leaves the source to A while A lives.
        await #expect(throws: IndexedElsewhere.self) {
            try await nodeB.begin(source, contexts: RecordIndexConformanceTests.contexts, landedAt: Date())
        }
        // A dies mid-source; B takes it over from the start, and what A still sends goes nowhere.
        try await Self.expire(leaseA, on: db)
        try await nodeB.begin(source, contexts: RecordIndexConformanceTests.contexts, landedAt: Date())
        await #expect(throws: IndexedElsewhere.self) { _ = try await nodeA.add(source, lines: lines(["stray"])) }
        _ = try await nodeB.add(source, lines: lines(["alpha", "beta", "gamma"]))
        try await nodeA.finish(source)
        #expect(try await !nodeB.isIndexed(source), "only the claimant finishes a source")
        try await nodeB.finish(source)
        #expect(try await nodeA.isIndexed(source))
        let found = try await nodeA.search(RecordSearch(limit: 10)).records.map(\.message)
        #expect(found == ["alpha", "beta", "gamma"])
        // Finished, it may be indexed again by anyone (a rebuild).
        try await nodeA.begin(source, contexts: RecordIndexConformanceTests.contexts, landedAt: Date())
    }

    /// Failures back off, doubling up to an hour; a source another node is indexing is no
    /// failure, and is looked at again after the base delay however often it was found so.
    @Test func aSourceIndexedElsewhereIsLookedAtAgainSoonWhileFailuresBackOff() {
        let base = Duration.seconds(60)
        #expect((1...8).map { Indexer.retryDelay(afterFailure: $0, base: base) } == [60, 120, 240, 480, 960, 1920, 3600, 3600].map { Duration.seconds($0) })
        #expect(Indexer.retryDelay(afterFailure: 0, base: base) == base)
    }

    /// The same feedback reaching two nodes (its node died mid-upload, the agent sent it again
    /// elsewhere) is one record: the second begin changes nothing, and once one node completed
    /// it the other cannot move it (each node has its own connections to the database).
    @Test func feedbackIsRecordedOnceWhicheverNodesItReaches() async throws {
        let nodeA = PostgresFeedbackInbox(try await TestPostgres.database(for: dir))
        let nodeB = PostgresFeedbackInbox(try await TestPostgres.database(for: dir))
        let id = FeedbackInboxConformanceTests.id(1), agent = FeedbackInboxConformanceTests.agent, t0 = FeedbackInboxConformanceTests.t0
        try await nodeA.begin(id: id, agentID: agent, uid: "u-1", text: "the oven", createdAt: Timestamp(microseconds: 7), chunkCount: 3, bytes: 900, at: t0)
        #expect(try await nodeA.update(id, status: .uploading, detail: "", chunksReceived: 2, records: nil, files: nil, errorCode: nil))
        try await nodeB.begin(id: id, agentID: agent, uid: "u-1", text: "the oven", createdAt: Timestamp(microseconds: 7), chunkCount: 3, bytes: 900, at: t0.addingTimeInterval(60))
        let resumed = try #require(try await nodeB.feedback(id))
        #expect(resumed.receivedAt == t0 && resumed.chunksReceived == 2, "B sees A's record, and begins nothing new")
        #expect(try await nodeB.update(id, status: .complete, detail: "", chunksReceived: 3, records: 12, files: ["/f/a.jsonl"], errorCode: nil))
        #expect(try await !nodeA.update(id, status: .failed, detail: "late", chunksReceived: nil, records: nil, files: nil, errorCode: 10), "final on every node")
        #expect(try await nodeA.all(limit: 10).map(\.id) == [id])
        #expect(try await nodeA.feedback(id)?.status == .complete)
    }

    /// Node B is told of a source node A is indexing (a listener's report, a catch-up): it
    /// leaves it to A while A lives, and takes it over at a retry once A died.
    @Test func aSourceFoundIndexedElsewhereIsTakenOverAtARetryOnceItsNodeDies() async throws {
        let db = try await TestPostgres.database(for: dir)
        let leaseA = NodeLease(db, name: "A"), leaseB = NodeLease(db, name: "B")
        let nodeA = PostgresRecordIndex(db, node: leaseA), nodeB = PostgresRecordIndex(db, node: leaseB)
        let paths = DataDirectory(dir.file("data"))
        let source = RecordIndexConformanceTests.pull1
        let lines = [RecordIndexConformanceTests.line(1, "a one"), RecordIndexConformanceTests.line(2, "a two")]
        try RecordSearchTests.land(paths, source, days: ["2027-01-15.jsonl": lines])
        try await nodeA.begin(source, contexts: RecordIndexConformanceTests.contexts, landedAt: Date())
        _ = try await nodeA.add(source, lines: Array((lines[0] + "\n").utf8))

        let indexer = Indexer(index: nodeB, registry: nil, paths: paths, logger: Logger(label: "test"), retryBase: .milliseconds(100))
        indexer.landed(source)
        try await withBackground({ try await indexer.run() }) {
            // Tried, and waiting for its retry: no longer in the queue, still counted as queued.
            for _ in 0..<1500 where !(indexer.backlog == 0 && indexer.queued == 1) { try await Task.sleep(for: .milliseconds(20)) }
            #expect(indexer.backlog == 0 && indexer.queued == 1)
            #expect(try await !nodeB.isIndexed(source), "left to the live node")

            try await Self.expire(leaseA, on: db)
            for _ in 0..<1500 where try await !nodeB.isIndexed(source) { try await Task.sleep(for: .milliseconds(20)) }
            #expect(try await nodeB.isIndexed(source), "taken over")
            #expect(try await nodeB.search(RecordSearch(limit: 10)).records.map(\.message) == ["a one", "a two"], "each record once")
        }
    }

    /// A source that landed on node A after node B started, and that A died indexing, is taken
    /// over by B's periodic catch-up, with no restart and no report from A's listener.
    @Test func aRunningNodeTakesOverWhatADeadNodeLeftHalfIndexed() async throws {
        let db = try await TestPostgres.database(for: dir)
        let leaseA = NodeLease(db, name: "A"), leaseB = NodeLease(db, name: "B")
        let nodeA = PostgresRecordIndex(db, node: leaseA), nodeB = PostgresRecordIndex(db, node: leaseB)
        let paths = DataDirectory(dir.file("data"))
        try FileManager.default.createDirectory(atPath: paths.pulls, withIntermediateDirectories: true)
        // B runs, catching up every 50 ms; a failed source would wait an hour for its retry.
        // Its start's catch-up is over once what had landed before is indexed.
        let earlier = IndexedSource(kind: .pull, id: String(format: "%032x", 99), agentID: RecordIndexConformanceTests.agentA)
        try RecordSearchTests.land(paths, earlier, days: ["2027-01-15.jsonl": [RecordIndexConformanceTests.line(0, "before")]])
        let indexer = Indexer(index: nodeB, registry: nil, paths: paths, logger: Logger(label: "test"), retryBase: .seconds(3600), catchUpEvery: .milliseconds(50))
        try await withBackground({ try await indexer.run() }) {
            for _ in 0..<1500 where try await !nodeB.isIndexed(earlier) { try await Task.sleep(for: .milliseconds(20)) }
            #expect(try await nodeB.isIndexed(earlier))

            // A claimed the source and indexed a block of it, then died.
            let source = RecordIndexConformanceTests.pull1
            let lines = [RecordIndexConformanceTests.line(1, "a one"), RecordIndexConformanceTests.line(2, "a two")]
            try await nodeA.begin(source, contexts: RecordIndexConformanceTests.contexts, landedAt: Date())
            _ = try await nodeA.add(source, lines: Array((lines[0] + "\n").utf8))
            try await Self.expire(leaseA, on: db)
            // Its files land in the shared directory whole (one rename), as the listener moves them.
            let staging = DataDirectory(dir.file("staging"))
            try RecordSearchTests.land(staging, source, days: ["2027-01-15.jsonl": lines])
            try FileManager.default.moveItem(atPath: staging.pulls + "/" + source.id, toPath: paths.pulls + "/" + source.id)

            for _ in 0..<1500 where try await !nodeB.isIndexed(source) { try await Task.sleep(for: .milliseconds(20)) }
            #expect(try await nodeB.isIndexed(source), "taken over by the running node")
            #expect(try await nodeB.search(RecordSearch(limit: 10)).records.map(\.message) == ["before", "a one", "a two"], "each record once")
        }
    }
}
