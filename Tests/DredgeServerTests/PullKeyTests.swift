import Crypto
import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

@testable import DredgeServer

/// A pull's key costs one RSA private-key operation at most: the issuer that made the pull (or
/// delivered it) keeps its key, and the upload's reception takes it from there instead of
/// unwrapping the stored form again.
@Suite struct PullKeyTests {
    /// The stored wrapped key here does not unwrap with the server's key at all; only the
    /// issuer's memory knows the key. The pull is delivered and its upload received and landed,
    /// which it could not be if reception unwrapped the stored form itself.
    @Test func anUploadIsReceivedWithTheKeyTheIssuerKeeps() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let agent = try await server.enrollAgent()
            let key = SymmetricKey.uploadKey()
            let unwrappable = secureRandomBytes(256)
            #expect(throws: (any Error).self) { _ = try LoadedDeployment(directory: server.data).encryptionKey.unwrapKey(unwrappable) }
            server.issuer.recentKeys.insert(key, for: unwrappable)
            let now = Timestamp.now
            let pull = NewPull(
                id: Hex.encode(secureRandomBytes(16)), uid: "", agentID: agent.agentID, filter: LogFilter(uid: "u-1"), issuedAt: now, expiresAt: now.adding(.seconds(3600)),
                wrappedKey: unwrappable, requestedBy: "test", targets: [agent.agentID])
            try await server.pulls.create(pull)
            server.listener.dispatcher.wake([agent.agentID])
            let outcome = try await agent.connect { link in
                let command = try await LinkAgent.acceptNextPull(over: link)
                #expect(command.commandID == pull.id)
                return try await LinkAgent.send(try agent.pullUpload(command, store: store, dir: server.dir), over: link)
            }
            #expect(outcome.result.ok, "\(outcome)")
            #expect(try await server.admin.pull(pull.id).targets.first?.status == .complete)
        }
    }
}
