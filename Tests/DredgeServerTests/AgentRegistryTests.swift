import DredgeEnvelope
import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

@Suite struct AgentRegistryTests {
    @Test func pullsByUidFindTheAgentsWhoseLastHeartbeatReportedIt() async throws {
        let dir = TempDir()
        let registry = AgentRegistry(try ServerDatabase(directory: dir.path))
        let a = try await registry.enroll(publicKey: try RSAPrivateKey.generate().publicKey, host: .with { $0.hostname = "a" })
        let b = try await registry.enroll(publicKey: try RSAPrivateKey.generate().publicKey, host: .with { $0.hostname = "b" })
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-1", "u-2"] })
        try await registry.heartbeat(b, .with { $0.activeUids = ["u-2"] })
        #expect(try await registry.agentIDs(withUID: "u-2") == [a, b].sorted())
        #expect(try await registry.agentIDs(withUID: "u-1") == [a])
        // The uid leaves a's store: the next heartbeat says so.
        try await registry.heartbeat(a, .with { $0.activeUids = ["u-3"] })
        #expect(try await registry.agentIDs(withUID: "u-1").isEmpty)
        #expect(try await registry.agentIDs(withUID: "u-2") == [b])
        #expect(try await registry.agentIDs(withUID: "u-3") == [a])
        // A heartbeat for an agent that is not enrolled changes nothing.
        try await registry.heartbeat("0000", .with { $0.activeUids = ["u-3"] })
        #expect(try await registry.agentIDs(withUID: "u-3") == [a])
        #expect(try await registry.isEnrolled(a) && !registry.isEnrolled("0000"))
        // Reopening keeps it.
        #expect(try await AgentRegistry(try ServerDatabase(directory: dir.path)).agentIDs(withUID: "u-3") == [a])
    }
}
