import DredgeAdminClient
import DredgeAgentCore
import DredgeDomain
import DredgeServer
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
