import DredgeAdminAPI
import DredgeAdminClient
import DredgeAgentCore
import DredgeDomain
@testable import DredgeServer
import DredgeStore
import DredgeTestSupport
import Foundation
import Testing

/// Polite uploads (#54), in process: the real agent (``AgentClient``) against the real server.
/// A device whose policy wants an unmetered network keeps its feedback while the network is
/// metered (the server hears nothing of it) and sends it once it is not; one whose day's budget
/// is spent holds its upload begun and finishes it when the policy allows more. Rates over a
/// shaped link: Tests/polite/ (network namespaces and tc).
@Suite struct PoliteUploadTests {
    typealias Device = PullOutcomeTests.Device

    @Test func aMeteredDeviceWaitsThenSends() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            try await withStopping(Device(server, store: store)) { device in
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.agents().first?.connected == true })
                try await device.client.setUploadPolicy(UploadPolicy(unmeteredOnly: true))
                try await device.client.setNetwork(.metered)
                let id = try await device.client.submitFeedback(uid: "u-2", text: "the oven stopped heating", days: 3)
                // Held before it began: the agent says why, and the server has nothing of it.
                #expect(try await PullOutcomeTests.waitFor { await device.client.uploadPolicyStatus().holdKind == "network" })
                let held = await device.client.uploadPolicyStatus()
                #expect(held.held?.contains("metered") == true && held.waitingFrames == 1, "\(held)")
                await #expect(throws: (any Error).self) { try await server.admin.feedback(id) }
                #expect(FileManager.default.fileExists(atPath: device.state.directory + "/uploads/\(id)/export.zip"))
                // A change of mind on the policy's terms keeps it waiting; the network turning unmetered sends it.
                try await device.client.setUploadPolicy(UploadPolicy(unmeteredOnly: true, maxBytesPerSecond: 1 << 20))
                #expect(try await PullOutcomeTests.waitFor { await device.client.uploadPolicyStatus().holdKind == "network" })
                await #expect(throws: (any Error).self) { try await server.admin.feedback(id) }
                try await device.client.setNetwork(.unmetered)
                #expect(try await PullOutcomeTests.waitFor { (try? await server.admin.feedback(id))?.status == .complete })
                let record = try await server.admin.feedback(id)
                #expect(record.uid == "u-2" && record.records > 0)
                let after = await device.client.uploadPolicyStatus()
                #expect(after.held == nil && after.waitingFrames == 0 && after.spentToday > 0, "\(after)")
            }
        }
    }

    /// A pull nobody marked urgent waits as feedback does; one marked urgent goes at once on a
    /// metered network (its command says so: the agent agreed `urgent`), unless the device's
    /// policy lets nothing by.
    @Test func anUrgentPullBypassesThePolicyWhenItAllows() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            try await withStopping(Device(server, store: store, heldPullKeepAlive: .milliseconds(500))) { device in
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.agents().first?.connected == true })
                try await device.client.setUploadPolicy(UploadPolicy(unmeteredOnly: true))
                try await device.client.setNetwork(.metered)
                let agent = device.state.file.agentID
                let plain = try await server.admin.createPull(PullRequest(uid: nil, agent: agent, filter: LogFilter(uid: "u-1")))
                #expect(plain.urgent == nil)
                #expect(try await PullOutcomeTests.waitFor { await device.client.uploadPolicyStatus().holdKind == "network" })
                let urgent = try await server.admin.createPull(PullRequest(uid: nil, agent: agent, filter: LogFilter(uid: "u-1"), urgent: true))
                #expect(urgent.urgent == true)
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.pull(urgent.id).targets.first?.status == .complete })
                // The plain one still waits: begun (so the server knows it is under way), no chunk sent.
                let waiting = try #require(try await server.admin.pull(plain.id).targets.first)
                #expect(waiting.status == .uploading && waiting.chunksReceived == 0, "\(waiting)")
                #expect(try await PullOutcomeTests.waitFor { await device.client.uploadPolicyStatus().holdKind == "network" })
                // Begun again while it waits, so the server hears of it (a pull nothing is heard of
                // for 15 minutes after its expiry ends): its target's time moves on.
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.pull(plain.id).targets.first.map { $0.updatedAt > waiting.updatedAt } == true })
                #expect(try await server.admin.pull(plain.id).targets.first?.chunksReceived == 0)
                // A policy that lets nothing by holds an urgent pull too.
                try await device.client.setUploadPolicy(UploadPolicy(unmeteredOnly: true, urgentBypass: false))
                let held = try await server.admin.createPull(PullRequest(uid: nil, agent: agent, filter: LogFilter(uid: "u-2"), urgent: true))
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.pull(held.id).targets.first?.status == .uploading })
                #expect(try await server.admin.pull(held.id).targets.first?.status != .complete)
                try await device.client.setNetwork(.unmetered)
                for id in [plain.id, held.id] {
                    #expect(try await PullOutcomeTests.waitFor { try await server.admin.pull(id).targets.first?.status == .complete })
                }
            }
        }
    }

    /// A live tail on a device whose policy holds it is refused with the policy's reason
    /// (`REJECT_POLICY`: the agent agreed `urgent`); an urgent one runs; the network turning
    /// metered ends a plain one that runs, and the server is told why.
    @Test func aTailFollowsTheDevicesPolicy() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            try await withStopping(Device(server, store: store)) { device in
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.agents().first?.activeUIDs.isEmpty == false })
                try await device.client.setUploadPolicy(UploadPolicy(unmeteredOnly: true))
                try await device.client.setNetwork(.metered)
                let agent = device.state.file.agentID
                let plain = try await server.admin.createTail(TailRequest(uid: "u-1", agent: agent, durationSeconds: 600))
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.tail(plain.id).parts.first?.status == .rejected })
                let refused = try #require(try await server.admin.tail(plain.id).parts.first)
                #expect(refused.detail.contains("upload policy") && refused.detail.contains("metered"), "\(refused.detail)")
                let urgent = try await server.admin.createTail(TailRequest(uid: "u-1", agent: agent, durationSeconds: 600, urgent: true))
                #expect(urgent.urgent == true)
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.tail(urgent.id).parts.first?.status == .running })
                // Unmetered: a plain tail runs, until the network turns metered again.
                try await device.client.setNetwork(.unmetered)
                let later = try await server.admin.createTail(TailRequest(uid: "u-1", agent: agent, durationSeconds: 600))
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.tail(later.id).parts.first?.status == .running })
                try await device.client.setNetwork(.metered)
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.tail(later.id).parts.first?.status == .ended })
                let ended = try #require(try await server.admin.tail(later.id).parts.first)
                #expect(ended.detail.contains("upload policy"), "\(ended.detail)")
                #expect(try await server.admin.tail(urgent.id).parts.first?.status == .running)
            }
        }
    }

    /// A policy another process writes (`dredge-agent policy set`, an app beside the agent)
    /// governs the next upload of a running agent that had none.
    @Test func aPolicyWrittenByAnotherProcessGovernsTheNextUpload() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            try await withStopping(Device(server, store: store)) { device in
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.agents().first?.connected == true })
                #expect(await device.client.uploadPolicyStatus().policy == UploadPolicy())
                try UploadPolicy(unmeteredOnly: true).save(stateDirectory: device.state.directory)
                try NetworkCost.metered.save(stateDirectory: device.state.directory)
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: device.state.file.agentID, filter: LogFilter(uid: "u-1")))
                #expect(try await PullOutcomeTests.waitFor { await device.client.uploadPolicyStatus().holdKind == "network" })
                #expect(try await server.admin.pull(pull.id).targets.first?.chunksReceived == 0)
                try NetworkCost.unmetered.save(stateDirectory: device.state.directory)
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.pull(pull.id).targets.first?.status == .complete })
            }
        }
    }

    @Test func aSpentDayHoldsTheUploadBegunAndMoreBudgetFinishesIt() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let budget = UploadPolicy.minDailyBytes
            try await withStopping(
                Device(server, store: store) { state in
                    // As a previous run left it: the day's budget all but spent.
                    try UploadPolicy(dailyBytes: budget).save(stateDirectory: state.directory)
                    let today = Timestamp.now.microseconds / 86_400_000_000
                    try Data(#"{"day": \#(today), "bytes": \#(budget - 100)}"#.utf8).write(to: URL(fileURLWithPath: state.directory + "/upload-usage.json"))
                }
            ) { device in
                let id = try await device.client.submitFeedback(uid: "u-2", text: "the display flickers", days: 3)
                #expect(try await PullOutcomeTests.waitFor { await device.client.uploadPolicyStatus().holdKind == "daily_budget" })
                // Begun (a beginning costs nothing), its chunks held: open on the server, nothing received.
                #expect(try await PullOutcomeTests.waitFor { (try? await server.admin.feedback(id))?.status == .uploading })
                let status = await device.client.uploadPolicyStatus()
                #expect(status.spentToday == budget - 100 && status.held?.contains("budget") == true, "\(status)")
                try await device.client.setUploadPolicy(UploadPolicy(dailyBytes: budget * 4))
                #expect(try await PullOutcomeTests.waitFor { (try? await server.admin.feedback(id))?.status == .complete })
                #expect(await device.client.uploadPolicyStatus().spentToday > budget - 100)
                // What was counted is kept for the next run.
                #expect(try await PullOutcomeTests.waitFor { UploadPolicy.spentToday(stateDirectory: device.state.directory) > budget - 100 })
            }
        }
    }
}

/// The node's ingress cap (`connections.maxIngressBytesPerSecond`): two devices upload at once
/// through a capped node; both land whole, and their chunks waited for their turns.
@Suite struct IngressCapTests {
    typealias Device = PullOutcomeTests.Device

    /// A store whose user u-2 has about `megabytes` of records that do not compress.
    static func incompressibleStore(_ path: String, megabytes: Int) throws {
        let (store, context) = try PullEndToEndTests.openDeviceStore(path, host: "oven-\(UUID().uuidString.prefix(4))")
        let now = Timestamp.now
        for i in 0..<(megabytes * 2_500) {
            let noise = Data((0..<300).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
            store.enqueue(LogEntry(timestamp: now.subtracting(.seconds(Int64(3_000 - i % 3_000))), level: .info, type: "business", uid: "u-2", message: noise, context: context))
        }
        try store.close()
    }

    @Test func twoDevicesShareACappedNodeAndNothingIsLost() async throws {
        // A quarter of the least cap a configuration may set, so the cap is what paces them.
        let limits = ConnectionLimits(handshakeSeconds: 120, missedHeartbeats: 100, maxIngressBytesPerSecond: IngressGovernor.minBytesPerSecond / 4)
        try await withStopping(InProcessServer(connectionLimits: limits)) { server in
            let (first, second) = (server.dir.file("first.sqlite"), server.dir.file("second.sqlite"))
            try Self.incompressibleStore(first, megabytes: 2)
            try Self.incompressibleStore(second, megabytes: 2)
            try await withStopping(Device(server, store: first)) { a in
                try await withStopping(Device(server, store: second)) { b in
                    #expect(try await PullOutcomeTests.waitFor { try await server.admin.agents().filter(\.connected).count == 2 })
                    // Both exported and held first (a metered network), then let go together.
                    for device in [a, b] {
                        try await device.client.setUploadPolicy(UploadPolicy(unmeteredOnly: true))
                        try await device.client.setNetwork(.metered)
                    }
                    async let idA = a.client.submitFeedback(uid: "u-2", text: "first", days: 1)
                    async let idB = b.client.submitFeedback(uid: "u-2", text: "second", days: 1)
                    let ids = try await [idA, idB]
                    for device in [a, b] {
                        #expect(try await PullOutcomeTests.waitFor { await device.client.uploadPolicyStatus().holdKind == "network" })
                    }
                    let before = try #require(server.listener.ingress).granted
                    for device in [a, b] { try await device.client.setNetwork(.unmetered) }
                    #expect(try await PullOutcomeTests.waitFor(.seconds(180)) {
                        try await ids.asyncMap { try? await server.admin.feedback($0) }.allSatisfy { $0?.status == .complete }
                    })
                    let ingress = try #require(server.listener.ingress)
                    let records = try await ids.asyncMap { try await server.admin.feedback($0) }
                    let total = records.reduce(0) { $0 + $1.bytes }
                    #expect(records.allSatisfy { $0.records == 2 * 2_500 + 1 && $0.chunkCount > 20 }, "\(records.map { ($0.records, $0.chunkCount) })")
                    // Every chunk went through the cap, and chunks waited for their turn. (That the
                    // turns are shared equally by bytes: IngressScheduleTests.)
                    #expect(ingress.granted - before >= UInt64(total), "\(ingress.granted - before) < \(total)")
                    #expect(ingress.delayed > 0)
                }
            }
        }
    }
}

extension Array {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for element in self { out.append(try await transform(element)) }
        return out
    }
}
