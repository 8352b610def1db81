import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeTestSupport
import Foundation
import Testing
@testable import DredgeServer

/// Results are deleted with their index rows (by an engineer, or after the retention), the
/// records stay marked, removals cut short are finished at start, and the indexer never brings
/// back what was removed. Real stores, real files, real index; injected clocks.
@Suite struct ResultsKeeperTests {
    let dir = TempDir()
    let paths: DataDirectory
    let database: ServerDatabase
    let pulls: SQLitePullQueue
    let feedback: SQLiteFeedbackInbox
    let tails: SQLiteTailRegistry
    let index: SQLiteRecordIndex
    let indexer: Indexer

    static let issuer = CommandIssuer(encryptionKey: try! RSAPrivateKey.generate(), signingKey: .generate())
    static let agentA = RecordIndexConformanceTests.agentA
    static let agentB = RecordIndexConformanceTests.agentB

    init() throws {
        paths = DataDirectory(dir.path)
        database = try ServerDatabase(directory: dir.path)
        pulls = SQLitePullQueue(database)
        feedback = SQLiteFeedbackInbox(database)
        tails = SQLiteTailRegistry(database)
        index = try SQLiteRecordIndex(directory: dir.path)
        indexer = Indexer(index: index, registry: nil, tails: tails, paths: paths, logger: .init(label: "test"))
    }

    func keeper(keepDays: Int = 30) -> ResultsKeeper {
        ResultsKeeper(
            paths: paths, pulls: pulls, feedback: feedback, tails: tails, records: index, indexer: indexer, audit: pulls, retention: ResultsRetention(keepDays: keepDays),
            logger: .init(label: "test"))
    }

    /// A pull whose targets are `agents`, made at `now` (expiring a minute later).
    func pull(_ agents: [String], now: Date = Date()) async throws -> String {
        let new = try Self.issuer.newPull(
            uid: "u-1", agentID: "", filter: LogFilter(uid: "u-1"), targets: agents, lifetime: .seconds(60), requestedBy: "alice", now: Timestamp(now))
        try await pulls.create(new)
        return new.id
    }

    /// A pull's files from one agent as the server leaves them (day file, manifest, zip),
    /// indexed; the target marked complete at `at`.
    func land(pull id: String, agent: String, message: String, at: Date = Date()) async throws {
        let source = IndexedSource(kind: .pull, id: id, agentID: agent)
        try RecordSearchTests.land(paths, source, days: ["2027-01-15.jsonl": [RecordIndexConformanceTests.line(1, message)]])
        try Data(repeating: 7, count: 1000).write(to: URL(fileURLWithPath: try paths.pullZip(id, agent: agent)))
        try await indexer.index(source)
        #expect(try await pulls.update(id, agent: agent, status: .complete, detail: "1 records", at: at))
    }

    func landFeedback(_ id: String, message: String, at: Date = Date()) async throws {
        try await feedback.begin(id: id, agentID: Self.agentA, uid: "u-1", text: "it broke", createdAt: Timestamp(at), chunkCount: 1, bytes: 10, at: at)
        let source = IndexedSource(kind: .feedback, id: id, agentID: Self.agentA)
        try RecordSearchTests.land(paths, source, days: ["2027-01-15.jsonl": [RecordIndexConformanceTests.line(2, message)]])
        try Data(repeating: 7, count: 500).write(to: URL(fileURLWithPath: try paths.feedbackZip(id)))
        try await indexer.index(source)
        #expect(try await feedback.update(id, status: .complete, detail: "", chunksReceived: 1, records: 1, files: [], errorCode: nil))
    }

    /// A live tail of u-1 from `agent` that held one record, indexed; stopped at `stoppedAt`
    /// (nil: running).
    func tail(agent: String, message: String, stoppedAt: Date? = nil) async throws -> String {
        let new = Self.issuer.newTail(
            uid: "u-1", agents: nil, filter: LogFilter(), lifetime: .seconds(600), recordsPerSecond: 100, bytesPerSecond: 1 << 20, verbose: false, verboseTypes: [],
            requestedBy: "alice", reason: "")
        try await tails.create(new)
        #expect(try await tails.deliver(new.id, agent: agent, wrappedKey: try Self.issuer.newTailKey(), at: Date()) != nil)
        _ = try await tails.accepted(new.id, agent: agent, startCursor: 0, at: Date())
        let directory = try paths.tailFiles(new.id, agent: agent)
        var known: TailFiles.KnownContexts?
        let line = Array(RecordIndexConformanceTests.line(1, message).utf8)
        let batch = TailBatchReader.Batch(records: [line], contexts: [1: Array(#"{"host":"h","app":"a"}"#.utf8)], times: [0])
        let bytes = try TailFiles.append(batch, after: 0, known: &known, in: directory)
        #expect(try await tails.held(new.id, agent: agent, seq: 1, cursor: 1, records: 1, dropped: 0, bytes: bytes, at: Date()))
        if let stoppedAt { _ = try await tails.stop(new.id, by: "alice", reason: "done", at: stoppedAt) }
        try await indexer.index(IndexedSource(kind: .tail, id: new.id, agentID: agent))
        return new.id
    }

    /// What a live tail held is removed as a pull's results: by an engineer (its files and
    /// index rows go, the tail stays marked, audited as `tail.remove`), and by the retention
    /// once it stopped longer ago than kept; a running tail is not the retention's.
    @Test func whatATailHeldIsRemovedByHandAndByTheRetention() async throws {
        let byHand = try await tail(agent: Self.agentA, message: "tail by hand", stoppedAt: Date())
        let old = try await tail(agent: Self.agentB, message: "tail old", stoppedAt: Date().addingTimeInterval(-40 * 86_400))
        let running = try await tail(agent: Self.agentA, message: "tail running")
        // A tail still running is indexed once it ends, whole.
        #expect(try await Set(messages()) == ["tail by hand", "tail old"])
        let keeper = keeper()
        let report = try #require(try await keeper.remove(.tail, byHand, by: "bob", reason: "T-9"))
        #expect(report.kind == .tail && report.newlyRemoved && report.freedBytes > 0 && report.unindexedSources == 1)
        #expect(!exists(try paths.tail(byHand)))
        #expect(try await tails.tail(byHand)?.removed?.by == "bob")
        #expect(try await pulls.audit(limit: 5).contains { $0.action == "tail.remove" && $0.actor == "bob" && $0.detail.contains("reason=\"T-9\"") })
        let pass = try await keeper.applyRetention()
        #expect(pass.tails == [old])
        let (oldDirectory, runningDirectory) = (try paths.tail(old), try paths.tail(running))
        #expect(!exists(oldDirectory) && exists(runningDirectory))
        #expect(try await messages().isEmpty)
        _ = try await tails.stop(running, by: "alice", reason: "done", at: Date())
        try await indexer.index(IndexedSource(kind: .tail, id: running, agentID: Self.agentA))
        #expect(try await messages() == ["tail running"])
        // Removed again: nothing more, the first removal kept.
        #expect(try await keeper.remove(.tail, byHand, by: "carol")?.newlyRemoved == false)
    }

    func messages(_ search: RecordSearch = RecordSearch()) async throws -> [String] {
        try await index.search(search).records.map(\.message)
    }

    func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path) }

    @Test func anEngineerRemovesAPullItsFilesAndRecordsAndTheRecordStaysMarked() async throws {
        let removed = try await pull([Self.agentA, Self.agentB])
        let kept = try await pull([Self.agentA])
        try await land(pull: removed, agent: Self.agentA, message: "removed one")
        #expect(try await pulls.update(removed, agent: Self.agentB, status: .uploading, detail: ""))
        try await land(pull: kept, agent: Self.agentA, message: "kept one")
        let keeper = keeper()
        let before = try await keeper.diskUse(pull: removed)
        #expect(before > 1000, "the day file, the manifest and the zip")
        #expect(try await keeper.measured(try await pulls.pulls()).first { $0.id == removed }?.diskBytes == before)

        let report = try #require(try await keeper.removePull(removed, by: "alice", reason: "T-1"))
        #expect(report.newlyRemoved && report.kind == .pull && report.id == removed)
        #expect(report.freedBytes == before && report.unindexedSources == 1)
        #expect(!exists(try paths.pull(removed)))
        #expect(try await keeper.diskUse(pull: removed) == 0)
        #expect(try await messages() == ["kept one"])
        #expect(try await messages(RecordSearch(pull: removed)).isEmpty)
        #expect(!(try await index.indexedSources()).contains { $0.id == removed })

        let record = try #require(try await pulls.pull(removed))
        #expect(record.removed?.by == "alice" && record.removed?.reason == "T-1")
        #expect(record.targets.first { $0.agentID == Self.agentB }?.status == .failed, "the agent still uploading is refused from now on")
        #expect(try await pulls.pull(kept)?.removed == nil)
        #expect(exists(try paths.pullFiles(kept, agent: Self.agentA)))

        let audit = try await pulls.audit(AuditQuery(action: "pull.remove"))
        #expect(audit.count == 1 && audit.first?.actor == "alice")
        #expect(audit.first.map { $0.detail.contains(removed) && $0.detail.contains("T-1") } == true)

        // Again: nothing more to delete, the first removal stands, nothing more audited.
        let again = try #require(try await keeper.removePull(removed, by: "bob"))
        #expect(!again.newlyRemoved && again.freedBytes == 0 && again.removal.by == "alice")
        #expect(try await pulls.audit(AuditQuery(action: "pull.remove")).count == 1)
        #expect(try await keeper.removePull(String(repeating: "0", count: 32), by: "alice") == nil)
    }

    @Test func feedbackIsRemovedWithItsZipAndRecords() async throws {
        let id = String(repeating: "f", count: 32)
        try await landFeedback(id, message: "feedback one")
        let keeper = keeper()
        let before = try await keeper.diskUse(feedback: id)
        #expect(before > 500)
        let report = try #require(try await keeper.removeFeedback(id, by: "alice"))
        #expect(report.newlyRemoved && report.freedBytes == before && report.unindexedSources == 1)
        #expect(try !exists(paths.feedbackFiles(id)) && !exists(try paths.feedbackZip(id)))
        #expect(try await messages().isEmpty)
        #expect(try await feedback.feedback(id)?.removed?.by == "alice")
        #expect(try await pulls.audit(AuditQuery(action: "feedback.remove")).count == 1)
    }

    @Test func retentionRemovesOnlyWhatWasKeptLongEnough() async throws {
        let now = Date()
        let old = try await pull([Self.agentA], now: now)
        try await land(pull: old, agent: Self.agentA, message: "old", at: now)
        let running = try await pull([Self.agentA], now: now)
        #expect(try await pulls.update(running, agent: Self.agentA, status: .uploading, detail: "", at: now))
        let fb = String(repeating: "f", count: 32)
        try await landFeedback(fb, message: "feedback", at: now)
        let day = 86_400.0

        // 0 days: kept until removed by hand.
        #expect(try await keeper(keepDays: 0).applyRetention(now: now.addingTimeInterval(3650 * day)) == .init())
        // Not yet.
        #expect(try await keeper().applyRetention(now: now.addingTimeInterval(29 * day)) == .init())
        #expect(exists(try paths.pull(old)))

        let pass = try await keeper().applyRetention(now: now.addingTimeInterval(31 * day))
        #expect(pass.pulls == [old] && pass.feedback == [fb] && pass.freedBytes > 1500)
        #expect(try !exists(paths.pull(old)) && !exists(try paths.feedbackFiles(fb)))
        #expect(try await messages().isEmpty)
        #expect(try await pulls.pull(old)?.removed?.by == Removal.retention)
        #expect(try await pulls.pull(running)?.removed == nil, "a pull still running is never removed by the retention")
        #expect(try await pulls.audit(AuditQuery(actor: Removal.retention)).count == 2)
        // Nothing left to do.
        #expect(try await keeper().applyRetention(now: now.addingTimeInterval(31 * day)) == .init())
    }

    @Test func aRemovalCutShortIsFinishedAtStartAndResultsNoRecordNamesAreKept() async throws {
        let cutShort = try await pull([Self.agentA])
        try await land(pull: cutShort, agent: Self.agentA, message: "cut short")
        // The record was marked, then the server died: files and index rows are still there.
        _ = try await pulls.markRemoved(cutShort, by: "alice", reason: "", at: Date())
        // Results of a pull the database does not know (restored from another backup, say).
        let unknown = String(repeating: "9", count: 32)
        let orphan = IndexedSource(kind: .pull, id: unknown, agentID: Self.agentA)
        try RecordSearchTests.land(paths, orphan, days: ["2027-01-15.jsonl": [RecordIndexConformanceTests.line(3, "orphan")]])
        try await indexer.index(orphan)
        let kept = try await pull([Self.agentA])
        try await land(pull: kept, agent: Self.agentA, message: "kept")
        #expect(Set(try await messages()) == ["cut short", "orphan", "kept"])

        let finished = try await keeper().finishInterruptedRemovals()
        #expect(finished == [cutShort])
        #expect(try !exists(paths.pull(cutShort)))
        #expect(try exists(paths.pullFiles(unknown, agent: Self.agentA)), "results no record names may be all that is left of them: kept")
        #expect(Set(try await messages()) == ["orphan", "kept"])
        #expect(exists(try paths.pullFiles(kept, agent: Self.agentA)))
        #expect(try await keeper().finishInterruptedRemovals().isEmpty)
    }

    /// A removal whose deletion did not finish is tried again while the server runs, once
    /// every retry interval, not only at the next start.
    @Test func aRemovalLeftUnfinishedIsTriedAgainWithinTheHour() async throws {
        let id = try await pull([Self.agentA])
        try await land(pull: id, agent: Self.agentA, message: "left behind")
        // Marked, its deletion failed (as a read-only disk would make it): files and rows remain.
        _ = try await pulls.markRemoved(id, by: "alice", reason: "T-1", at: Date())
        let keeper = keeper(keepDays: 0)
        try await keeper.housekeeping(now: Date().addingTimeInterval(60))
        #expect(try exists(paths.pull(id)), "not yet: the server finished removals when it started")
        try await keeper.housekeeping(now: Date().addingTimeInterval(ResultsKeeper.retryInterval + 1))
        #expect(try !exists(paths.pull(id)))
        #expect(try await messages().isEmpty)
        let entries = try await pulls.audit(AuditQuery(action: "pull.remove"))
        #expect(entries.count == 1 && entries.first?.actor == "alice" && entries.first?.detail.contains("removed before") == true, "\(entries)")
    }

    /// Two removals of the same results never run at once (an engineer's and the hourly
    /// retry's would delete the same files): the second is refused, and nothing it would have
    /// done is done; once the first ends the id is free again.
    @Test func oneRemovalOfAResultRunsAtATime() async throws {
        let id = try await pull([Self.agentA])
        try await land(pull: id, agent: Self.agentA, message: "busy")
        let keeper = keeper()
        await #expect(throws: ResultsKeeper.RemovalInProgress.self) {
            try await keeper.exclusively(id) { try await keeper.removePull(id, by: "bob") }
        }
        #expect(try exists(paths.pull(id)))
        #expect(try await pulls.pull(id)?.removed == nil, "not even marked")
        #expect(try await keeper.removePull(id, by: "bob")?.newlyRemoved == true)
        #expect(try !exists(paths.pull(id)))
    }

    @Test func theIndexerNeverBringsBackARemovedSource() async throws {
        let id = try await pull([Self.agentA])
        let source = IndexedSource(kind: .pull, id: id, agentID: Self.agentA)
        try RecordSearchTests.land(paths, source, days: ["2027-01-15.jsonl": [RecordIndexConformanceTests.line(1, "waiting")]])
        #expect(try await pulls.update(id, agent: Self.agentA, status: .complete, detail: ""))
        // Landed and waiting to be indexed when the engineer removes it.
        indexer.landed(source)
        #expect(indexer.backlog == 1)
        _ = try await keeper().removePull(id, by: "alice")
        try await withBackground({ try await indexer.run() }) {
            try await RecordSearchTests.indexed(indexer)
            #expect(try await messages().isEmpty)
            #expect(try await !index.isIndexed(source))
            #expect(indexer.queued == 0, "not waiting for a retry: its files are gone for good")
        }
    }
}
