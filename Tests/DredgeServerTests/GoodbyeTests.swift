import DredgeAgentCore
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

    /// A server that stops gracefully tells its agents when it expects to be back (a planned
    /// restart, Protocol § 6): 60 s by default, retrying every 2 s for a small fleet. With
    /// `restartWithinSeconds` 0 it says nothing, and agents back off as before.
    @Test(arguments: [60, 0]) func aStoppingServerSaysWhenItWillBeBack(_ restartWithin: Int) async throws {
        let limits = ConnectionLimits(handshakeSeconds: 120, missedHeartbeats: 100, restartWithinSeconds: restartWithin)
        try await withStopping(InProcessServer(connectionLimits: limits)) { server in
            let agent = try await server.enrollAgent()
            try await agent.connect { link in
                try await link.heartbeat(activeUIDs: [])
                _ = try await link.next()
                async let stopped: Void = server.stop()
                let error = await #expect(throws: AgentError.self) { while try await link.next() != nil {} }
                try await stopped
                let said = error?.description ?? ""
                if restartWithin > 0 {
                    #expect(said.hasSuffix("goodbye (back within 60 s, retrying every 2 s)"), "\(said)")
                    #expect(server.logs.records.contains { $0.message == "telling the agents when to come back" && $0.metadata["agents"] == "1" })
                } else {
                    #expect(said.hasSuffix("the server closed the connection: goodbye"), "\(said)")
                }
            }
        }
    }
}
