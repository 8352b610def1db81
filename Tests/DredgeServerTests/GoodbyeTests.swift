import DredgeTestSupport
import Foundation
import Testing

@testable import DredgeServer

/// Both ends say why a connection ends: the agent says `Goodbye` when it stops (through its
/// connection's machine), and the server hears it as such rather than as a dropped connection.
@Suite struct GoodbyeTests {
    @Test func theAgentSaysGoodbyeWhenItStops() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            try await withStopping(PullOutcomeTests.Device(server, store: store)) { device in
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.agents().first?.connected == true })
                try await device.stop()
                let said = try await PullOutcomeTests.waitFor {
                    server.logs.records.contains { $0.message == "agent said goodbye" && $0.metadata["reason"] == "agent stopping" }
                }
                #expect(said, "\(server.logs.records.suffix(5).map { "\($0.message) \($0.metadata)" })")
                #expect(try await PullOutcomeTests.waitFor { try await server.admin.agents().first?.connected == false })
            }
        }
    }

    /// A link that says goodbye is heard the same way, with its reason.
    @Test func aLinkSaysGoodbyeThroughItsMachine() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent()
            try await agent.connect { link in
                try await link.heartbeat(activeUIDs: [])
                _ = try await link.next()
                link.goodbye("done for today")
                // The link closed its side once the Goodbye was written; the server then reads EOF.
                #expect(try await PullOutcomeTests.waitFor {
                    server.logs.records.contains { $0.message == "agent said goodbye" && $0.metadata["reason"] == "done for today" }
                })
            }
        }
    }
}
