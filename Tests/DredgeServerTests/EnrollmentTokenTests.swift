@testable import DredgeServer
import DredgeAdminAPI
import DredgeAgentCore
import DredgeEnvelope
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// Enrollment tokens that expire or have a number of uses (#56), through the admin API and the
/// real wire protocol: each enrollment takes a use, one that fails gives it back, and past
/// either limit a device is refused with the reason (the enrolled ones keep working).
@Suite struct EnrollmentTokenTests {
    @Test func aLimitedTokenEnrollsAsManyAgentsAsItSaysAndNoMore() async throws {
        try await withStopping(InProcessServer()) { server in
            let created = try await server.admin.createToken(TokenRequest(name: "batch-7", kind: .enrollment, expiresInSeconds: 3600, uses: 1))
            #expect(created.info.usesLeft == 1 && (created.info.expiresAt ?? .distantPast) > Date().addingTimeInterval(3500))
            let tls = try AgentLink.tlsContext(caPEM: contents(server.data + "/ca.pem"))
            func enroll(_ key: RSAPrivateKey) async throws -> String {
                try await AgentEnrollment.register(host: "127.0.0.1", port: server.agentPort, tls: tls, token: created.token, key: key, hostInfo: .with { $0.hostname = "new" })
            }
            // A key enrolled already (with the deployment's own token) is refused, and takes no use.
            let known = try RSAPrivateKey.generate()
            _ = try await AgentEnrollment.register(
                host: "127.0.0.1", port: server.agentPort, tls: tls, token: server.created.enrollmentToken, key: known, hostInfo: .with { $0.hostname = "known" })
            await #expect { try await enroll(known) } throws: { "\($0)".contains("already enrolled") }
            #expect(try await server.admin.tokens().first { $0.name == "batch-7" }?.usesLeft == 1)

            let first = try await enroll(try RSAPrivateKey.generate())
            #expect(WireID.isValid(first))
            #expect(try await server.admin.tokens().first { $0.name == "batch-7" }?.usesLeft == 0)
            await #expect { try await enroll(try RSAPrivateKey.generate()) } throws: { "\($0)".contains("enrollment token used up; ask for a new one") }
            #expect(server.logs.records.contains { $0.message == "enrollment refused: token used up" && $0.metadata["token"] == "batch-7" })

            // Expired: refused, saying so.
            let vault = SQLiteTokenVault(try ServerDatabase(directory: server.data))
            let old = try await vault.create(name: "old", kind: .enrollment, limits: TokenLimits(expiresAt: Date().addingTimeInterval(-1)), now: Date())
            await #expect {
                try await AgentEnrollment.register(host: "127.0.0.1", port: server.agentPort, tls: tls, token: old.token, key: try RSAPrivateKey.generate(), hostInfo: .init())
            } throws: { "\($0)".contains("enrollment token expired") }

            // Limits are for enrollment tokens, within bounds; the audit says what was made.
            await #expect { try await server.admin.createToken(TokenRequest(name: "bob", kind: .admin, uses: 2)) } throws: { "\($0)".contains("only enrollment tokens") }
            await #expect { try await server.admin.createToken(TokenRequest(name: "x", kind: .enrollment, expiresInSeconds: 5)) } throws: { "\($0)".contains("expiresInSeconds must be 60") }
            await #expect { try await server.admin.createToken(TokenRequest(name: "y", kind: .enrollment, uses: 0)) } throws: { "\($0)".contains("uses must be 1") }
            let made = try await server.admin.audit(AuditQuery(action: AuditAction.tokenCreate.rawValue)).map(\.detail)
            #expect(made.contains { $0.hasPrefix("enrollment token 'batch-7', expires ") && $0.hasSuffix(", 1 use") }, "\(made)")
        }
    }
}
