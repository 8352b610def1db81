import DredgeAgentCore
import DredgeTestSupport
import Foundation
import Logging
import NIOCore
import NIOPosix
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

    /// An agent given several nodes moves to the next one at once when its node says it is
    /// restarting, and waits (the interval the server asked for) only once every node failed.
    @Test func anAgentOfAClusterTriesTheNextNodeAtOnceOnAPlannedRestart() async throws {
        // Heartbeats every 5 s, not 1: the agent takes a server silent for three intervals as
        // gone, and under the whole suite's load 3 s of silence happened, so the connection
        // dropped before the server stopped and no goodbye reached it (twice in four runs).
        try await withStopping(InProcessServer(heartbeatSeconds: 5)) { server in
            // The next node: a port nothing listens on (refused at once).
            let closed = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
            let nextPort = try #require(closed.localAddress?.port)
            try await closed.close().get()
            let state = try await AgentEnrollment.enroll(
                servers: [ServerAddress(host: "127.0.0.1", port: server.agentPort)], caPEM: contents(server.data + "/ca.pem"),
                token: server.created.enrollmentToken, stateDirectory: server.dir.file("agent"), hostInfo: .with { $0.hostname = "device" })
            let logs = LogCapture()
            let client = try AgentClient(
                state: state, store: nil, hostInfo: .with { $0.hostname = "device" }, logger: Logger(label: "test.agent") { _ in logs },
                servers: [server.agentPort, nextPort].map { ServerAddress(host: "127.0.0.1", port: $0) })
            try await withBackground({ try await client.run() }) { () async throws in
                #expect(try await PullOutcomeTests.waitFor { try await server.registry.agents().first?.connected == true })
                try await server.stop()
                // The wait after the goodbye (a "reconnecting" before it, from a connection a
                // loaded machine dropped earlier, is not the one this is about).
                #expect(try await PullOutcomeTests.waitFor { logs.records.drop { $0.message != "the server is restarting" }.contains { $0.message == "reconnecting" } })
                let after = logs.records.drop { $0.message != "the server is restarting" }.map { record in
                    record.message == "connection to the server failed" ? "failed at \(record.metadata["server"].map { "\($0)" } ?? "?")" : record.message
                }
                #expect(Array(after.prefix(3)) == ["the server is restarting", "failed at 127.0.0.1:\(nextPort)", "reconnecting"], "\(after)")
            }
        }
    }
}
