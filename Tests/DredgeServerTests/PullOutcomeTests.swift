import DredgeAdminAPI
@testable import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgeServer
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Logging
import Testing

/// Every pull ends: an agent that cannot carry one out says so, a saved command that no longer
/// admits is not run again on every start, the server's own full disk is waited out, and a pull
/// the agent never finishes is ended by the server.
@Suite struct PullOutcomeTests {
    /// The real agent (``AgentClient``) in this process against ``InProcessServer``; a test runs
    /// it in ``withStopping(_:_:)``.
    final class Device: StoppedAtTheEnd, @unchecked Sendable {
        let state: AgentState
        let client: AgentClient
        let task: Task<Void, Error>

        init(
            _ server: InProcessServer, store: String, retry: Duration = .seconds(5), maxExports: Int = 2, logs: LogCapture? = nil,
            heldPullKeepAlive: Duration = .seconds(300), before: (AgentState) async throws -> Void = { _ in }
        ) async throws {
            let dir = server.dir.file("agent-\(UUID().uuidString)")
            state = try await AgentEnrollment.enroll(
                host: "127.0.0.1", port: server.agentPort, caPEM: contents(server.data + "/ca.pem"), token: server.created.enrollmentToken,
                stateDirectory: dir, hostInfo: .with { $0.hostname = "device" })
            try await before(state)
            let logger = Logger(label: "test.agent") { _ in logs.map { $0 as any LogHandler } ?? SwiftLogNoOpLogHandler() }
            client = try AgentClient(
                state: state, store: try LogStore(path: store), hostInfo: .with { $0.hostname = "device" }, logger: logger, firstRetryDelay: retry, maxExports: maxExports,
                heldPullKeepAlive: heldPullKeepAlive)
            task = Task { [client] in try await client.run() }
        }

        /// Cancels the agent and returns once it has ended (its connection closed, its exports
        /// stopped). Its run loop ends in cancellation, which is how it is asked to stop.
        func stop() async throws {
            task.cancel()
            if case .failure(let error) = await task.result, !(error is CancellationError) { throw error }
        }
    }

    static func waitFor(_ timeout: Duration = .seconds(60), _ condition: () async throws -> Bool) async throws -> Bool {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            if try await condition() { return true }
            try await Task.sleep(for: .milliseconds(100))
        }
        return try await condition()
    }

    /// A pull for the agent of `state`, delivered, and its command kept in the agent's state as
    /// a previous run of the agent would have left it (after `change`); its id.
    static func saveCommand(_ server: InProcessServer, _ state: AgentState, change: (inout WirePullCommand) throws -> Void = { _ in }) async throws -> String {
        let id = try await server.queuePull(agentID: state.file.agentID, lifetime: .seconds(600))
        try await server.pulls.markDelivered(id, agent: state.file.agentID)
        var command = try server.issuer.command(try await server.pulls.storedPull(id), agent: state.file.agentID, agentKey: state.key.publicKey)
        try change(&command)
        let dir = state.directory + "/uploads/\(id)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let bytes: [UInt8] = try command.serializedBytes()
        try Data(bytes).write(to: URL(fileURLWithPath: dir + "/command.pb"))
        return id
    }

    /// The device's store is damaged while the agent runs (pages scribbled over): the export
    /// fails, the agent reports it, the pull shows `failed` with the reason instead of
    /// `exporting` for ever, and the agent drops it.
    @Test func anExportThatFailsIsReportedAndThePullEnds() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            try await withStopping(Device(server, store: store)) { device in
                #expect(try await Self.waitFor { try await server.admin.agents().first?.connected == true })
                let handle = try FileHandle(forUpdating: URL(fileURLWithPath: store))
                let size = try handle.seekToEnd()
                try handle.seek(toOffset: 8192)
                #expect(size > 1 << 20)
                try handle.write(contentsOf: Data(repeating: 0xFF, count: max(0, Int(size) - 16_384)))
                try handle.close()
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: device.state.file.agentID, filter: LogFilter(uid: "u-1")))
                #expect(try await Self.waitFor { try await server.admin.pull(pull.id).targets.first?.status == .failed })
                let target = try #require(try await server.admin.pull(pull.id).targets.first)
                #expect(target.detail.contains("export failed"), "\(target.detail)")
                #expect(try await Self.waitFor { !FileManager.default.fileExists(atPath: device.state.directory + "/uploads/\(pull.id)") })
            }
        }
    }

    /// An app that embeds the agent submits a user's feedback through it
    /// (``AgentClient/submitFeedback(uid:text:days:)``, docs/agent.md): the uid's recent logs
    /// arrive with it; a uid or text the protocol refuses is refused at once, and an agent
    /// without a store says so.
    @Test func anEmbeddingAppSubmitsFeedbackThroughTheAgent() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            try await withStopping(Device(server, store: store)) { device in
                let id = try await device.client.submitFeedback(uid: "u-2", text: "the oven stopped heating", days: 3)
                #expect(try await Self.waitFor { (try? await server.admin.feedback(id))?.status == .complete })
                let record = try await server.admin.feedback(id)
                #expect(record.uid == "u-2" && record.text == "the oven stopped heating" && record.agentID == device.state.file.agentID && record.records > 0)
                await #expect(throws: (any Error).self) { try await device.client.submitFeedback(uid: "u\u{0}2", text: "x") }
                await #expect(throws: (any Error).self) { try await device.client.submitFeedback(uid: "u-2", text: "") }
            }
            let state = try await AgentEnrollment.enroll(
                host: "127.0.0.1", port: server.agentPort, caPEM: contents(server.data + "/ca.pem"), token: server.created.enrollmentToken,
                stateDirectory: server.dir.file("storeless"), hostInfo: .with { $0.hostname = "no-store" })
            let storeless = try AgentClient(state: state, store: nil, hostInfo: .with { $0.hostname = "no-store" }, logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() })
            await #expect(throws: AgentError.self) { try await storeless.submitFeedback(uid: "u-2", text: "nothing to send") }
        }
    }

    /// An agent running as many exports as it may answers a new pull `REJECT_BUSY` and keeps
    /// no place for it; once an export ends, the next pull is accepted and completes.
    @Test func anAgentWithNoRoomForAnotherExportAnswersBusy() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            try await withStopping(Device(server, store: store, maxExports: 1)) { device in
                #expect(try await Self.waitFor { try await server.admin.agents().first?.connected == true })
                let exports = await device.client.uploads.exports
                #expect(exports.reserve(), "the one place, taken as a running export would")
                let busy = try await server.admin.createPull(PullRequest(uid: nil, agent: device.state.file.agentID, filter: LogFilter(uid: "u-1")))
                #expect(try await Self.waitFor { try await server.admin.pull(busy.id).targets.first?.status == .rejected })
                let target = try #require(try await server.admin.pull(busy.id).targets.first)
                #expect(target.detail.hasPrefix("rejectBusy"), "\(target.detail)")
                #expect(exports.running == 1, "a refused command takes no place")
                #expect(!FileManager.default.fileExists(atPath: device.state.directory + "/uploads/\(busy.id)"))

                exports.release()
                let next = try await server.admin.createPull(PullRequest(uid: nil, agent: device.state.file.agentID, filter: LogFilter(uid: "u-1")))
                #expect(try await Self.waitFor { try await server.admin.pull(next.id).targets.first?.status == .complete })
                #expect(try await Self.waitFor { exports.running == 0 }, "the export's place is given back when it ends")
            }
        }
    }

    /// A saved command that no longer admits (a filter from before 1970, queued straight into
    /// the store as an old server might have) is checked again at start: reported as failed,
    /// never exported, and the agent keeps running.
    @Test func aSavedCommandIsCheckedAgainBeforeItResumes() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            var pullID = ""
            try await withStopping(Device(server, store: store) { state in
                // The command the agent kept says something no agent accepts (a since of
                // Int64.min), signed by the server as if an older server had sent it.
                let signer = try LoadedDeployment(directory: server.data).signingKey
                pullID = try await Self.saveCommand(server, state) { command in
                    command.filter.sinceUs = .min
                    try signer.sign(&command)
                }
            }) { device in
                #expect(try await Self.waitFor { try await server.admin.pull(pullID).targets.first?.status == .failed })
                let target = try #require(try await server.admin.pull(pullID).targets.first)
                #expect(target.detail.contains("invalid"), "\(target.detail)")
                #expect(target.chunkCount == 0, "nothing was uploaded")
                #expect(try await Self.waitFor { !FileManager.default.fileExists(atPath: device.state.directory + "/uploads/\(pullID)") })
                #expect(try await Self.waitFor { try await server.admin.agents().first?.connected == true })
            }
        }
    }

    /// A saved command whose export was started as many times as allowed and never finished
    /// (it took the agent down with it, say) is given up at the next start: the export thread
    /// counts the attempt before making it, finds one too many, and the pull is reported failed
    /// with nothing exported or uploaded.
    @Test func anExportStartedTooOftenIsGivenUp() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            var pullID = ""
            try await withStopping(Device(server, store: store) { state in
                pullID = try await Self.saveCommand(server, state)
                try Data(String(UploadManager.maxExportAttempts).utf8).write(to: URL(fileURLWithPath: state.directory + "/uploads/\(pullID)/attempts"))
            }) { device in
                #expect(try await Self.waitFor { try await server.admin.pull(pullID).targets.first?.status == .failed })
                let target = try #require(try await server.admin.pull(pullID).targets.first)
                #expect(target.detail.contains("started \(UploadManager.maxExportAttempts) times and never finished"), "\(target.detail)")
                #expect(try await Self.waitFor { !FileManager.default.fileExists(atPath: device.state.directory + "/uploads/\(pullID)") })
            }
        }
    }

    /// The server's disk fills while chunks arrive: it answers ERROR_INTERNAL, the pull stays
    /// open with the reason, the agent keeps its export and retries; once there is room the
    /// pull completes with every record.
    @Test(.enabled(if: TmpfsMount.isSupported)) func aFullServerDiskIsWaitedOutNotFatal() async throws {
        let mount = try TmpfsMount(megabytes: 32)
        defer { mount.remove() }
        try await withStopping(InProcessServer(dataDirectory: mount.path + "/server")) { server in
            let store = try server.deviceStore()
            // Enough of u-1's records that do not compress for an upload of several chunks: a
            // window of them is refused at once.
            let (extra, context) = try PullEndToEndTests.openDeviceStore(store, host: "oven-7")
            for n in 0..<6_000 {
                let noise = Hex.encode(secureRandomBytes(96))
                extra.enqueue(LogEntry(timestamp: Timestamp.now.subtracting(.seconds(Int64(n))), level: .info, type: "app", uid: "u-1", message: noise, context: context))
            }
            try extra.close()
            let agentLogs = LogCapture()
            try await withStopping(Device(server, store: store, retry: .milliseconds(500), logs: agentLogs)) { device in
                #expect(try await Self.waitFor { try await server.admin.agents().first?.connected == true })
                // Leave almost no room (enough for the databases' next pages, not for a chunk), then pull.
                func free() -> Int {
                    var stat = statvfs()
                    statvfs(mount.path, &stat)
                    return Int(stat.f_bavail) * Int(stat.f_frsize)
                }
                let filler = mount.path + "/filler"
                let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: { FileManager.default.createFile(atPath: filler, contents: nil); return filler }()))
                while free() > 192 * 1024 { try handle.write(contentsOf: Data(count: min(1 << 20, free() - 160 * 1024))) }
                try handle.close()
                #expect(free() < 256 * 1024)
                let pull = try await server.admin.createPull(PullRequest(uid: "u-1", agent: device.state.file.agentID, filter: .all))
                // The server refuses what it cannot store, at warning level (its databases share the
                // full disk, so the pull's detail may not change); the agent keeps its export meanwhile.
                #expect(try await Self.waitFor { server.logs.records.contains { $0.level >= .warning && $0.metadata["upload.id"] == "\(pull.id)" } })
                #expect(FileManager.default.fileExists(atPath: device.state.directory + "/uploads/\(pull.id)/export.zip"))
                let stuck = try #require(try await server.admin.pull(pull.id).targets.first)
                #expect(!stuck.status.isFinal, "\(stuck)")
                try FileManager.default.removeItem(atPath: filler)
                let done = try await Self.waitFor(.seconds(120)) { try await server.admin.pull(pull.id).targets.first?.status == .complete }
                #expect(done, "\(server.logs.records.filter { $0.level >= .notice }.suffix(5).map { "\($0.message) \($0.metadata)" })")
                // The agent's wait grew once per attempt, not once per refused chunk (#49): every
                // "will retry" but the last is followed by its retry before the next one.
                let retries = agentLogs.records.map(\.message).filter { $0.hasPrefix("the server cannot take the upload now") || $0.hasPrefix("retrying an upload the server") }
                #expect(retries.count >= 2 && retries.first?.hasPrefix("the server cannot") == true, "\(retries)")
                #expect(zip(retries, retries.dropFirst()).allSatisfy { $0.hasPrefix("the server cannot") != $1.hasPrefix("the server cannot") }, "\(retries)")
                let target = try #require(try await server.admin.pull(pull.id).targets.first)
                let expected = try PullEndToEndTests.expected(store, LogFilter(uid: "u-1"))
                #expect(Set(target.files.map { ($0 as NSString).lastPathComponent }) == Set(expected.keys).union(["manifest.json"]))
            }
        }
    }

    /// A delivered pull whose agent never finishes is ended by the server after its expiry
    /// (injected clock), with the reason; a target still moving is left until the hard limit;
    /// the server's own downtime never counts as the agent's silence.
    @Test func deliveredPullsThatNeverFinishExpire() async throws {
        let dir = TempDir()
        let pulls = SQLitePullQueue(try ServerDatabase(directory: dir.path))
        let issuer = CommandIssuer(encryptionKey: try RSAPrivateKey.generate(), signingKey: .generate())
        let base = Date()
        func make() async throws -> String {
            let pull = try issuer.newPull(uid: "u", agentID: "", filter: LogFilter(uid: "u"), targets: ["a"], lifetime: .seconds(60), requestedBy: "t", now: Timestamp(base))
            try await pulls.create(pull)
            return pull.id
        }
        let quiet = try await make(), moving = try await make(), done = try await make(), restarted = try await make()
        try await pulls.update(quiet, agent: "a", status: .delivered, at: base)
        try await pulls.update(moving, agent: "a", status: .uploading, chunksReceived: 1, at: base.addingTimeInterval(600))
        try await pulls.update(done, agent: "a", status: .complete, at: base)
        try await pulls.update(restarted, agent: "a", status: .exporting, at: base)
        let deadlines = PullTargetLife.Deadlines(quietAfterExpiry: .seconds(600), afterExpiry: .seconds(3600))
        func expire(at seconds: Double, listening: Double? = nil, only ids: [String]) async throws -> [String] {
            _ = try await pulls.expireStalled(now: base.addingTimeInterval(seconds), listeningSince: listening.map { base.addingTimeInterval($0) } ?? .distantPast, deadlines: deadlines)
            var expired: [String] = []
            for id in ids where try await pulls.pull(id)?.targets.first?.status == .expired { expired.append(id) }
            return expired
        }
        // A server that started listening at +500 s has heard nothing for only 161 s at +661 s.
        #expect(try await expire(at: 661, listening: 500, only: [restarted]).isEmpty)
        #expect(try await expire(at: 659, only: [quiet, moving, done]).isEmpty)
        #expect(try await expire(at: 661, only: [quiet, moving, done, restarted]) == [quiet, restarted])
        #expect(try await pulls.pull(quiet)?.targets.first?.detail.contains("no word from the agent") == true)
        // Still moving near the hard limit: kept until it, then given up.
        try await pulls.update(moving, agent: "a", status: .uploading, chunksReceived: 2, at: base.addingTimeInterval(3400))
        #expect(try await expire(at: 60 + 3599, only: [moving]).isEmpty)
        #expect(try await expire(at: 60 + 3601, only: [moving, done]) == [moving])
        #expect(try await pulls.pull(moving)?.targets.first?.detail.contains("given up") == true)
        #expect(try await pulls.pull(done)?.targets.first?.status == .complete)
        // Final is final: a late report changes nothing.
        #expect(try await pulls.update(quiet, agent: "a", status: .uploading, chunksReceived: 5) == false)
        #expect(try await pulls.pull(quiet)?.targets.first?.status == .expired)
    }
}

extension PullOutcomeTests {
    /// The agent's first heartbeat follows authentication at once, not an interval later: with
    /// a 10-minute interval, the server still learns the device's users (and can route a pull
    /// by uid to it) within seconds of the connection.
    @Test func theFirstHeartbeatFollowsAuthenticationAtOnce() async throws {
        try await withStopping(InProcessServer(heartbeatSeconds: 600)) { server in
            let store = try server.deviceStore()
            try await withStopping(Device(server, store: store)) { device in
                #expect(try await Self.waitFor(.seconds(120)) { try await server.admin.agents().first?.activeUIDs.sorted() == ["u-1", "u-2", "u-3"] })
                let pull = try await server.admin.createPull(PullRequest(uid: "u-2", agent: nil, filter: .all))
                #expect(pull.targets.map(\.agentID) == [device.state.file.agentID])
            }
        }
    }
}
