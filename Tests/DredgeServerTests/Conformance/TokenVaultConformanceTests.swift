import DredgeAdminAPI
import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// The rules of ``TokenVault``, run against every ``PersistenceBackend``.
@Suite struct TokenVaultConformanceTests {
    /// A fresh directory for each test (Swift Testing makes a suite instance per test).
    let dir = TempDir()
    static let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    @Test(arguments: PersistenceBackend.all)
    func aTokenIsAcceptedOnlyAsItsKindAndOnlyUntilRevoked(_ backend: PersistenceBackend) async throws {
        let tokens = try await backend.tokens(dir)
        let admin = try await tokens.create(name: "alice", kind: .admin, now: Self.t0)
        let enroll = try await tokens.create(name: "fleet", kind: .enrollment, now: Self.t0)
        #expect(admin.token.hasPrefix("dredge_adm_") && enroll.token.hasPrefix("dredge_enr_") && admin.token != enroll.token)
        #expect(admin.info == TokenInfo(name: "alice", kind: .admin, createdAt: Self.t0))
        #expect(try await tokens.adminName(for: admin.token) == "alice")
        #expect(try await tokens.adminName(for: enroll.token) == nil)
        #expect(try await tokens.acceptsEnrollment(enroll.token))
        #expect(try await !tokens.acceptsEnrollment(admin.token))
        #expect(try await tokens.adminName(for: admin.token + "0") == nil)
        #expect(try await tokens.adminName(for: "") == nil)

        // The same name may be used once per kind.
        _ = try await tokens.create(name: "alice", kind: .enrollment, now: Self.t0)
        await #expect(throws: TokenError.exists("alice")) { try await tokens.create(name: "alice", kind: .admin, now: Self.t0) }
        let listed = try await tokens.list()
        #expect(listed.map(\.kind) == [.admin, .enrollment, .enrollment] && listed.map(\.name) == ["alice", "alice", "fleet"])

        try await tokens.revoke(name: "fleet", kind: .enrollment)
        #expect(try await !tokens.acceptsEnrollment(enroll.token))
        await #expect(throws: TokenError.unknown("fleet")) { try await tokens.revoke(name: "fleet", kind: .enrollment) }
        // Revoking one kind's token leaves the other kind's of the same name.
        try await tokens.revoke(name: "alice", kind: .enrollment)
        #expect(try await tokens.adminName(for: admin.token) == "alice")
    }

    @Test(arguments: PersistenceBackend.all)
    func namesAreCheckedAndTheLastAdminTokenStays(_ backend: PersistenceBackend) async throws {
        let tokens = try await backend.tokens(dir)
        for bad in ["", "has space", "semi;colon", String(repeating: "a", count: 65), "ünï", "-", "local-operator"] {
            await #expect(throws: TokenError.invalidName(bad)) { try await tokens.create(name: bad, kind: .admin, now: Self.t0) }
        }
        #expect(try await tokens.list().isEmpty)
        let first = try await tokens.create(name: "first", kind: .admin, now: Self.t0)
        let second = try await tokens.create(name: "second", kind: .admin, now: Self.t0)
        try await tokens.revoke(name: "first", kind: .admin)
        #expect(try await tokens.adminName(for: first.token) == nil)
        await #expect(throws: TokenError.lastAdmin) { try await tokens.revoke(name: "second", kind: .admin) }
        // Refused, and nothing changed.
        #expect(try await tokens.adminName(for: second.token) == "second")
        #expect(try await tokens.list().map(\.name) == ["second"])
    }
}
