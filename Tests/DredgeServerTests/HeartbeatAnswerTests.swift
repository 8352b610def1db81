import DredgeAgentCore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// A heartbeat with nothing new in it is answered on the listener's event loop (the registry
/// holds it in memory); any other goes through the connection's task and the database. Both
/// ways answer alike: every heartbeat is acknowledged, in the order sent, and the registry
/// shows what the last one said.
@Suite struct HeartbeatAnswerTests {
    static func ackSeq(_ frame: WireFrame?) -> UInt64? {
        if case .heartbeatAck(let ack)? = frame?.body { return ack.seq }
        return nil
    }

    @Test func heartbeatsAreAnsweredInOrderWhicheverWayTheyAreHandled() async throws {
        let server = try await InProcessServer()
        defer { Task { await server.stop() } }
        let agent = try await server.enrollAgent()
        // First, full (a new connection), quiet, quiet, new uids (full), quiet, new uids again.
        let said: [[String]] = [["u-1"], ["u-1"], ["u-1"], ["u-1", "u-2"], ["u-2", "u-1"], ["u-3"]]
        try await agent.connect { link in
            // One at a time: each answered before the next is sent.
            var acks: [UInt64] = []
            for uids in said {
                try await link.heartbeat(activeUIDs: uids)
                acks.append(try #require(Self.ackSeq(try await link.next())))
            }
            #expect(acks == Array(1...UInt64(said.count)))
            #expect(try await server.admin.agents().first?.activeUIDs == ["u-3"])

            // All at once: some arrive while the connection's task still handles one before
            // them (which must not be overtaken), others when nothing of it runs.
            for round in 0..<16 {
                for uids in said { try await link.heartbeat(activeUIDs: round % 2 == 0 ? uids : ["u-4"]) }
                acks = []
                for _ in said { acks.append(try #require(Self.ackSeq(try await link.next()))) }
                let first = UInt64(said.count * (round + 1) + 1)
                #expect(acks == Array(first..<first + UInt64(said.count)), "round \(round)")
            }
        }
        #expect(try await server.admin.agents().first?.activeUIDs == ["u-4"])
        #expect(try await server.registry.agentIDs(withUID: "u-3").isEmpty)
    }
}
