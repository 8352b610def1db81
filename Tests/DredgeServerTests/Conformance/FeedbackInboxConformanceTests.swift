import DredgeAdminAPI
import DredgeDomain
import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// The rules of ``FeedbackInbox``, run against every ``PersistenceBackend``.
@Suite struct FeedbackInboxConformanceTests {
    /// A fresh directory for each test (Swift Testing makes a suite instance per test).
    let dir = TempDir()

    static func id(_ n: Int) -> String { String(format: "%032x", n) }
    static let agent = String(repeating: "a", count: 32)
    static let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    @Test(arguments: PersistenceBackend.all)
    func feedbackIsRecordedOnceAndMovesUntilFinal(_ backend: PersistenceBackend) async throws {
        let inbox = try await backend.feedback(dir)
        try await inbox.begin(id: Self.id(1), agentID: Self.agent, uid: "u-1", text: "the oven", createdAt: Timestamp(microseconds: 7), chunkCount: 3, bytes: 900, at: Self.t0)
        // A second begin of the same id changes nothing.
        try await inbox.begin(id: Self.id(1), agentID: Self.agent, uid: "u-2", text: "other", createdAt: Timestamp(microseconds: 8), chunkCount: 9, bytes: 1, at: Self.t0)
        var record = try #require(try await inbox.feedback(Self.id(1)))
        #expect(record.uid == "u-1" && record.text == "the oven" && record.createdAt == Timestamp(microseconds: 7) && record.receivedAt == Self.t0)
        #expect(record.status == .uploading && record.chunkCount == 3 && record.bytes == 900 && record.chunksReceived == 0)

        #expect(try await inbox.update(Self.id(1), status: .uploading, detail: "", chunksReceived: 2, records: nil, files: nil, errorCode: nil))
        #expect(try await inbox.update(Self.id(1), status: .complete, detail: "12 records", chunksReceived: nil, records: 12, files: ["/f/a.jsonl"], errorCode: nil))
        record = try #require(try await inbox.feedback(Self.id(1)))
        #expect(record.status == .complete && record.chunksReceived == 2 && record.records == 12 && record.files == ["/f/a.jsonl"])
        for status in FeedbackStatus.allCases {
            #expect(try await !inbox.update(Self.id(1), status: status, detail: "", chunksReceived: 0, records: 0, files: [], errorCode: nil), "final: \(status)")
        }
        #expect(try await inbox.feedback(Self.id(1))?.records == 12)
        #expect(try await inbox.feedback(Self.id(1))?.errorCode == nil)
        // A failed one keeps the wire code it was answered with.
        try await inbox.begin(id: Self.id(3), agentID: Self.agent, uid: "u-1", text: "x", createdAt: Timestamp(microseconds: 7), chunkCount: 1, bytes: 9, at: Self.t0)
        #expect(try await inbox.update(Self.id(3), status: .failed, detail: "bad zip", chunksReceived: nil, records: nil, files: nil, errorCode: 12))
        #expect(try await !inbox.update(Self.id(3), status: .failed, detail: "other", chunksReceived: nil, records: nil, files: nil, errorCode: 10))
        let failed = try #require(try await inbox.feedback(Self.id(3)))
        #expect(failed.status == .failed && failed.errorCode == 12 && failed.detail == "bad zip")
        #expect(try await inbox.feedback(Self.id(2)) == nil)
        #expect(try await !inbox.update(Self.id(2), status: .failed, detail: "", chunksReceived: nil, records: nil, files: nil, errorCode: nil))
    }

    @Test(arguments: PersistenceBackend.all)
    func usageCountsOneAgentsWindow(_ backend: PersistenceBackend) async throws {
        let inbox = try await backend.feedback(dir)
        let other = String(repeating: "b", count: 32)
        try await inbox.begin(id: Self.id(1), agentID: Self.agent, uid: "u", text: "x", createdAt: Timestamp(microseconds: 1), chunkCount: 1, bytes: 100, at: Self.t0)
        try await inbox.begin(id: Self.id(2), agentID: Self.agent, uid: "u", text: "x", createdAt: Timestamp(microseconds: 1), chunkCount: 1, bytes: 50, at: Self.t0.addingTimeInterval(3_600))
        try await inbox.begin(id: Self.id(3), agentID: other, uid: "u", text: "x", createdAt: Timestamp(microseconds: 1), chunkCount: 1, bytes: 7, at: Self.t0.addingTimeInterval(3_600))
        let all = try await inbox.usage(agentID: Self.agent, since: Self.t0)
        #expect(all.count == 2 && all.bytes == 150)
        let recent = try await inbox.usage(agentID: Self.agent, since: Self.t0.addingTimeInterval(1))
        #expect(recent.count == 1 && recent.bytes == 50)
        let none = try await inbox.usage(agentID: String(repeating: "c", count: 32), since: .distantPast)
        #expect(none.count == 0 && none.bytes == 0)
        #expect(try await inbox.all(limit: 10).map(\.id) == [Self.id(3), Self.id(2), Self.id(1)], "newest first")
        #expect(try await inbox.all(limit: 1).count == 1)
    }

    @Test(arguments: PersistenceBackend.all)
    func onlyOpenFeedbackIsAbandoned(_ backend: PersistenceBackend) async throws {
        let inbox = try await backend.feedback(dir)
        for n in 1...3 {
            try await inbox.begin(id: Self.id(n), agentID: Self.agent, uid: "u", text: "x", createdAt: Timestamp(microseconds: 1), chunkCount: 1, bytes: 1, at: Self.t0)
        }
        try await inbox.begin(id: Self.id(4), agentID: Self.agent, uid: "u", text: "x", createdAt: Timestamp(microseconds: 1), chunkCount: 1, bytes: 1, at: Self.t0.addingTimeInterval(86_400))
        _ = try await inbox.update(Self.id(2), status: .complete, detail: "", chunksReceived: 1, records: 1, files: [], errorCode: nil)
        _ = try await inbox.update(Self.id(3), status: .failed, detail: "bad zip", chunksReceived: nil, records: nil, files: nil, errorCode: nil)
        #expect(try await inbox.failAbandoned(now: Self.t0.addingTimeInterval(3_600), after: .seconds(7_200)) == 0)
        #expect(try await inbox.failAbandoned(now: Self.t0.addingTimeInterval(7_200), after: .seconds(7_200)) == 1)
        #expect(try await inbox.feedback(Self.id(1))?.status == .failed)
        #expect(try await inbox.feedback(Self.id(2))?.status == .complete)
        #expect(try await inbox.feedback(Self.id(3))?.detail == "bad zip")
        #expect(try await inbox.feedback(Self.id(4))?.status == .uploading)
    }

    @Test(arguments: PersistenceBackend.all)
    func removedFeedbackKeepsItsFirstRemovalAndRemovableIsFinalFeedbackBeforeTheCutoff(_ backend: PersistenceBackend) async throws {
        let inbox = try await backend.feedback(dir)
        for n in 1...3 {
            try await inbox.begin(
                id: Self.id(n), agentID: Self.agent, uid: "u-1", text: "t", createdAt: Timestamp(microseconds: 7), chunkCount: 1, bytes: 9,
                at: Self.t0.addingTimeInterval(Double(n) * 10))
        }
        #expect(try await inbox.update(Self.id(1), status: .complete, detail: "", chunksReceived: 1, records: 3, files: [], errorCode: nil))
        #expect(try await inbox.update(Self.id(3), status: .failed, detail: "bad", chunksReceived: nil, records: nil, files: nil, errorCode: 12))
        // id 2 is still uploading.
        #expect(try await inbox.removable(receivedUntil: Self.t0.addingTimeInterval(9), limit: 10).isEmpty)
        #expect(try await inbox.removable(receivedUntil: Self.t0.addingTimeInterval(10), limit: 10) == [Self.id(1)])
        #expect(try await inbox.removable(receivedUntil: Self.t0.addingTimeInterval(100), limit: 10) == [Self.id(1), Self.id(3)], "oldest first, never one still open")
        #expect(try await inbox.removable(receivedUntil: Self.t0.addingTimeInterval(100), limit: 1) == [Self.id(1)])

        let at = Date(timeIntervalSince1970: 1_800_000_500)
        let mark = try #require(try await inbox.markRemoved(Self.id(2), by: "alice", reason: "T-9", at: at))
        #expect(mark == RemovalMark(removal: Removal(at: at, by: "alice", reason: "T-9"), isNew: true))
        let open = try #require(try await inbox.feedback(Self.id(2)))
        #expect(open.removed == Removal(at: at, by: "alice", reason: "T-9") && open.status == .failed && open.errorCode == 8, "an open upload ends, answered ERROR_UPLOAD_INVALID")
        #expect(try await inbox.markRemoved(Self.id(2), by: "bob", reason: "", at: at.addingTimeInterval(1))?.isNew == false)
        #expect(try await inbox.feedback(Self.id(2))?.removed?.by == "alice")
        #expect(try await inbox.feedback(Self.id(1))?.removed == nil)
        #expect(try await inbox.markRemoved(Self.id(9), by: "alice", reason: "", at: at) == nil)
        _ = try await inbox.markRemoved(Self.id(1), by: "alice", reason: "", at: at)
        #expect(try await inbox.removable(receivedUntil: Self.t0.addingTimeInterval(100), limit: 10) == [Self.id(3)], "a removed one is not listed again")
    }
}
