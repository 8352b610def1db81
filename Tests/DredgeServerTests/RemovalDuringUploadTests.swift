import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
@testable import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
import Logging
import Testing

/// An engineer removes a pull (or the retention does) while one of its agents is still
/// uploading: the upload is refused from then on, and nothing of it lands or is indexed.
@Suite struct RemovalDuringUploadTests {
    @Test func aPullRemovedWhileItsUploadRunsLeavesNothingBehind() async throws {
        // Heartbeats every minute: this agent sends none, and a loaded run can take seconds
        // between its frames (at 1 s, the server closed it as silent).
        try await withStopping(InProcessServer(heartbeatSeconds: 60)) { server in
            let store = try server.deviceStore()
            let a = try await server.enrollAgent()
            let paths = DataDirectory(server.data)
            let keeper = ResultsKeeper(
                paths: paths, pulls: server.pulls, feedback: server.feedback, records: server.records, indexer: server.indexer, audit: server.pulls,
                retention: ResultsRetention(keepDays: 30), logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() })
            let (pullID, result) = try await a.connect { link in
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: a.agentID, filter: .all))
                let cmd = try await LinkAgent.acceptNextPull(over: link)
                let upload = try a.pullUpload(cmd, store: store, dir: server.dir, chunkSize: WireLimits.minChunkBytes)
                let count = upload.header.chunkCount
                try #require(count > 4, "chunks before and after the removal")
                try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
                let ready = try await LinkAgent.answer(to: cmd.commandID, over: link)
                #expect(ready?.uploadReady.uploadID == cmd.commandID, "\(String(describing: ready))")
                // All but the last chunk arrive, are acknowledged and are being unpacked as they come.
                for index in 0..<(count - 1) {
                    try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = cmd.commandID; $0.index = index; $0.ciphertext = Data(try! upload.chunk(index)) } })
                }
                var acked = 0
                while acked < count - 1 {
                    let answer = try #require(try await LinkAgent.answer(to: cmd.commandID, over: link))
                    guard case .chunkAck? = answer.body else {
                        Issue.record("not an acknowledgement: \(answer)")
                        return (pull.id, WireUploadResult?.none)
                    }
                    acked += 1
                }
                // Removed now, then the rest comes.
                #expect(try await keeper.removePull(pull.id, by: "alice", reason: "TICKET-1")?.newlyRemoved == true)
                try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = cmd.commandID; $0.index = count - 1; $0.ciphertext = Data(try! upload.chunk(count - 1)) } })
                try await link.send(.with { $0.uploadComplete = .with { $0.uploadID = cmd.commandID } })
                var result: WireUploadResult?
                while result == nil, let answer = try await LinkAgent.answer(to: cmd.commandID, over: link) {
                    if case .uploadResult(let r)? = answer.body { result = r }
                }
                return (pull.id, result)
            }
            #expect(result?.ok == false && result?.error == .errorUploadInvalid, "\(String(describing: result))")
            // Nothing landed: no directory of the pull, no records, and the pull stays removed with its target failed.
            #expect(!FileManager.default.fileExists(atPath: try paths.pull(pullID)), "\(InProcessServer.snapshot(server.data + "/pulls").keys.sorted())")
            try await RecordSearchTests.indexed(server.indexer)
            #expect(try await server.records.search(RecordSearch(pull: pullID)).records.isEmpty)
            let pull = try #require(try await server.pulls.pull(pullID))
            #expect(pull.removed?.by == "alice" && pull.removed?.reason == "TICKET-1")
            #expect(pull.targets.first?.status == .failed)
        }
    }
}
