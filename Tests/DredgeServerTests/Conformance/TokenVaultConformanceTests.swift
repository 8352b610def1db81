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
        #expect(try await tokens.admin(for: admin.token, now: Date())?.name == "alice")
        #expect(try await tokens.admin(for: enroll.token, now: Date())?.name == nil)
        #expect(try await tokens.acceptsEnrollment(enroll.token))
        #expect(try await !tokens.acceptsEnrollment(admin.token))
        #expect(try await tokens.admin(for: admin.token + "0", now: Date())?.name == nil)
        #expect(try await tokens.admin(for: "", now: Date())?.name == nil)

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
        #expect(try await tokens.admin(for: admin.token, now: Date())?.name == "alice")
    }

    /// An enrollment token may expire and have a number of uses: each enrollment takes one,
    /// a use given back counts again, and past either the token is refused, saying which.
    @Test(arguments: PersistenceBackend.all)
    func enrollmentTokensExpireAndRunOutOfUses(_ backend: PersistenceBackend) async throws {
        let tokens = try await backend.tokens(dir)
        let week = Self.t0.addingTimeInterval(7 * 86_400)
        let limited = try await tokens.create(name: "batch-7", kind: .enrollment, limits: TokenLimits(expiresAt: week, uses: 2), now: Self.t0)
        let open = try await tokens.create(name: "fleet", kind: .enrollment, now: Self.t0)
        #expect(limited.info == TokenInfo(name: "batch-7", kind: .enrollment, createdAt: Self.t0, expiresAt: week, usesLeft: 2))
        #expect(try await tokens.list().first { $0.name == "batch-7" } == limited.info)

        #expect(try await tokens.acceptsEnrollment(limited.token, now: Self.t0))
        #expect(try await tokens.useEnrollment(limited.token, now: Self.t0) == .accepted(name: "batch-7"))
        #expect(try await tokens.list().first { $0.name == "batch-7" }?.usesLeft == 1)
        #expect(try await tokens.useEnrollment(limited.token, now: Self.t0) == .accepted(name: "batch-7"))
        #expect(try await tokens.useEnrollment(limited.token, now: Self.t0) == .usedUp(name: "batch-7"))
        #expect(try await !tokens.acceptsEnrollment(limited.token, now: Self.t0))
        #expect(try await tokens.list().first { $0.name == "batch-7" }?.usesLeft == 0)
        // An enrollment that failed after taking a use gives it back.
        try await tokens.returnEnrollmentUse(limited.token)
        #expect(try await tokens.useEnrollment(limited.token, now: Self.t0) == .accepted(name: "batch-7"))
        // Past its expiry it is refused, uses or not.
        try await tokens.returnEnrollmentUse(limited.token)
        #expect(try await tokens.useEnrollment(limited.token, now: week) == .expired(name: "batch-7"))
        #expect(try await tokens.list().first { $0.name == "batch-7" }?.usesLeft == 1, "a refusal takes nothing")
        // A use given back is the token's, not its name's: a new token of the same name gains none.
        try await tokens.revoke(name: "batch-7", kind: .enrollment)
        _ = try await tokens.create(name: "batch-7", kind: .enrollment, limits: TokenLimits(uses: 1), now: Self.t0)
        try await tokens.returnEnrollmentUse(limited.token)
        #expect(try await tokens.list().first { $0.name == "batch-7" }?.usesLeft == 1)

        // Without limits: every use accepted, nothing counted; a use given back changes nothing.
        for _ in 0..<3 { #expect(try await tokens.useEnrollment(open.token, now: week) == .accepted(name: "fleet")) }
        try await tokens.returnEnrollmentUse(open.token)
        #expect(try await tokens.list().first { $0.name == "fleet" }?.usesLeft == nil)
        // Not an enrollment token: unknown, whatever else it is.
        let admin = try await tokens.create(name: "alice", kind: .admin, now: Self.t0)
        #expect(try await tokens.useEnrollment(admin.token, now: Self.t0) == .unknown)
        #expect(try await tokens.useEnrollment("dredge_enr_00", now: Self.t0) == .unknown)
        // Limits are for enrollment tokens only, and a number of uses is at least one.
        await #expect(throws: TokenError.self) { try await tokens.create(name: "bob", kind: .admin, limits: TokenLimits(uses: 3), now: Self.t0) }
        await #expect(throws: TokenError.self) { try await tokens.create(name: "none", kind: .enrollment, limits: TokenLimits(uses: 0), now: Self.t0) }
        #expect(try await tokens.list().allSatisfy { !["bob", "none"].contains($0.name) })
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
        #expect(try await tokens.admin(for: first.token, now: Date())?.name == nil)
        await #expect(throws: TokenError.lastAdmin) { try await tokens.revoke(name: "second", kind: .admin) }
        // Refused, and nothing changed.
        #expect(try await tokens.admin(for: second.token, now: Date())?.name == "second")
        #expect(try await tokens.list().map(\.name) == ["second"])
    }

    /// An admin token keeps the role and scope it was made with (admin, everything, unless
    /// told), read back by every check, listed, and carried by its console sessions; it is
    /// refused from its expiry on. Only a lasting admin (role admin, no expiry) keeps the last
    /// place: readers, investigators and admins that expire do not count.
    @Test(arguments: PersistenceBackend.all)
    func adminTokensKeepTheirRoleScopeAndExpiry(_ backend: PersistenceBackend) async throws {
        let tokens = try await backend.tokens(dir)
        let scope = AccessScope(apps: [AppScope(name: "oven-control", versions: [.init(.atLeast, "2.1")])], labels: ["region": "eu"])
        let root = try await tokens.create(name: "root", kind: .admin, now: Self.t0)
        let olga = try await tokens.create(name: "olga", kind: .admin, limits: TokenLimits(role: .investigator, scope: scope), now: Self.t0)
        let end = Self.t0.addingTimeInterval(3600)
        let temp = try await tokens.create(name: "temp", kind: .admin, limits: TokenLimits(expiresAt: end, role: .admin), now: Self.t0)
        #expect(try await tokens.admin(for: root.token, now: Self.t0) == Caller(name: "root", role: .admin))
        #expect(try await tokens.admin(for: olga.token, now: Self.t0) == Caller(name: "olga", role: .investigator, scope: scope))
        #expect(try await tokens.admin(for: temp.token, now: end.addingTimeInterval(-1)) == Caller(name: "temp", role: .admin, expiresAt: end))
        #expect(try await tokens.admin(for: temp.token, now: end) == nil, "refused from its expiry on")
        let listed = try await tokens.list()
        #expect(listed.map(\.role) == [.investigator, .admin, .admin] && listed.first?.scope == scope && listed.last?.expiresAt == end)
        #expect(olga.info.role == .investigator && olga.info.scope == scope)

        // Its sessions carry its role and scope, read from the token.
        let session = StoredConsoleSession(key: String(repeating: "a", count: 64), tokenName: "olga", tokenSHA256: TokenFile.hash(olga.token), expires: Self.t0.addingTimeInterval(60), caller: nil)
        try await tokens.openSession(session, capacity: 10, now: Self.t0)
        #expect(try await tokens.session(key: session.key, now: Self.t0)?.caller == Caller(name: "olga", role: .investigator, scope: scope))

        // A scope on an admin, a role on an enrollment token, a bad scope: refused.
        await #expect(throws: TokenError.self) { try await tokens.create(name: "x", kind: .admin, limits: TokenLimits(role: .admin, scope: scope), now: Self.t0) }
        await #expect(throws: TokenError.self) { try await tokens.create(name: "y", kind: .enrollment, limits: TokenLimits(role: .reader), now: Self.t0) }
        await #expect(throws: TokenError.self) {
            try await tokens.create(name: "z", kind: .admin, limits: TokenLimits(role: .reader, scope: AccessScope(labels: ["": "x"])), now: Self.t0)
        }
        // root is the last lasting admin: the investigator and the admin that expires do not count.
        await #expect(throws: TokenError.lastAdmin) { try await tokens.revoke(name: "root", kind: .admin) }
        try await tokens.revoke(name: "temp", kind: .admin)
        try await tokens.revoke(name: "olga", kind: .admin)
        #expect(try await tokens.list().map(\.name) == ["root"])
    }

    /// A token single sign-on makes for a person (`dredge login --sso`) is named
    /// `sso:SUBJECT~LOGIN`, which no other token may be, signs in as the person (`sso:SUBJECT`,
    /// whichever login), must expire, and is deleted once expired when the next one is made.
    @Test(arguments: PersistenceBackend.all)
    func signedOnTokensSignInAsTheirPersonAndGoOnceExpired(_ backend: PersistenceBackend) async throws {
        let tokens = try await backend.tokens(dir)
        _ = try await tokens.create(name: "root", kind: .admin, now: Self.t0)
        let hour = Self.t0.addingTimeInterval(3600)
        let signedOn = TokenLimits(expiresAt: hour, role: .investigator, signedOn: true)
        let laptop = try await tokens.create(name: TokenLimits.signedOnName(subject: "auth0|42"), kind: .admin, limits: signedOn, now: Self.t0)
        let jumpHost = try await tokens.create(name: TokenLimits.signedOnName(subject: "auth0|42"), kind: .admin, limits: signedOn, now: Self.t0)
        #expect(laptop.info.name.hasPrefix("sso:auth0|42~") && laptop.info.name != jumpHost.info.name)
        for token in [laptop, jumpHost] {
            #expect(try await tokens.admin(for: token.token, now: Self.t0) == Caller(name: "sso:auth0|42", role: .investigator, expiresAt: hour))
        }
        // A subject that holds the separator, a `%`, a `/` or a space is itself, read back.
        for subject in ["bob~x", "bob~x~1a2b3c4d", "50%/a b", "é~"] {
            let made = try await tokens.create(name: TokenLimits.signedOnName(subject: subject), kind: .admin, limits: signedOn, now: Self.t0)
            #expect(!made.info.name.dropFirst(4).dropLast(9).contains("~") && !made.info.name.contains("/"), "\(made.info.name)")
            #expect(try await tokens.admin(for: made.token, now: Self.t0)?.name == "sso:" + subject)
        }
        // Only the server's own path makes such names, and only expiring admin tokens.
        await #expect(throws: TokenError.invalidName("sso:auth0|42~00")) { try await tokens.create(name: "sso:auth0|42~00", kind: .admin, now: Self.t0) }
        await #expect(throws: TokenError.self) {
            try await tokens.create(name: "sso:x~00", kind: .admin, limits: TokenLimits(role: .reader, signedOn: true), now: Self.t0)
        }
        await #expect(throws: TokenError.invalidName("alice")) { try await tokens.create(name: "alice", kind: .admin, limits: signedOn, now: Self.t0) }

        // Once they have expired, the next login's token deletes them; other tokens stay.
        let later = hour.addingTimeInterval(1)
        let temp = try await tokens.create(name: "temp", kind: .admin, limits: TokenLimits(expiresAt: hour), now: Self.t0)
        let next = try await tokens.create(
            name: TokenLimits.signedOnName(subject: "alice"), kind: .admin, limits: TokenLimits(expiresAt: later.addingTimeInterval(3600), role: .admin, signedOn: true), now: later)
        #expect(try await tokens.list().map(\.name).sorted() == ["root", "temp", next.info.name].sorted())
        #expect(temp.info.expiresAt == hour)
        #expect(try await tokens.admin(for: next.token, now: later)?.name == "sso:alice")
    }

    /// Console sessions are kept with the tokens: found again by a vault opened anew on the same
    /// database (a restart, another node), until they expire, are closed, or their token is
    /// revoked; over the capacity, the ones expiring first go.
    @Test(arguments: PersistenceBackend.all)
    func consoleSessionsLiveWithTheirTokenAcrossARestart(_ backend: PersistenceBackend) async throws {
        let tokens = try await backend.tokens(dir)
        let alice = try await tokens.create(name: "alice", kind: .admin, now: Self.t0)
        _ = try await tokens.create(name: "bob", kind: .admin, now: Self.t0)
        func session(_ key: String, _ name: String = "alice", token: String? = nil, for seconds: TimeInterval = 3600) -> StoredConsoleSession {
            StoredConsoleSession(key: key, tokenName: name, tokenSHA256: TokenFile.hash(token ?? alice.token), expires: Self.t0.addingTimeInterval(seconds), caller: Caller(name: name, role: .admin))
        }
        try await tokens.openSession(session("k1"), capacity: 10, now: Self.t0)
        try await tokens.openSession(session("k2", for: 60), capacity: 10, now: Self.t0)

        let restarted = try await backend.tokens(dir)
        #expect(try await restarted.session(key: "k1", now: Self.t0.addingTimeInterval(10)) == session("k1"))
        #expect(try await restarted.session(key: "nope", now: Self.t0) == nil)
        // Expired: nil, and forgotten (not found even at an earlier time).
        #expect(try await restarted.session(key: "k2", now: Self.t0.addingTimeInterval(60)) == nil)
        #expect(try await restarted.session(key: "k2", now: Self.t0) == nil)
        try await restarted.closeSession(key: "k1")
        #expect(try await tokens.session(key: "k1", now: Self.t0) == nil)

        // A session names its token by hash and name: another token's hash under alice's name is no session.
        try await tokens.openSession(session("forged", token: "dredge_adm_not-a-token"), capacity: 10, now: Self.t0)
        #expect(try await tokens.session(key: "forged", now: Self.t0) == nil)
        // Revoking the token ends its sessions; the other token's stay.
        try await tokens.openSession(session("k3"), capacity: 10, now: Self.t0)
        let bobToken = try await tokens.create(name: "carol", kind: .admin, now: Self.t0)
        try await tokens.openSession(session("k4", "carol", token: bobToken.token), capacity: 10, now: Self.t0)
        try await tokens.revoke(name: "alice", kind: .admin)
        #expect(try await restarted.session(key: "k3", now: Self.t0) == nil)
        #expect(try await restarted.session(key: "k4", now: Self.t0)?.tokenName == "carol")
        // A refused revocation (the last admin token) ends nothing.
        try await tokens.revoke(name: "bob", kind: .admin)
        await #expect(throws: TokenError.lastAdmin) { try await tokens.revoke(name: "carol", kind: .admin) }
        #expect(try await restarted.session(key: "k4", now: Self.t0)?.tokenName == "carol")

        // At the capacity, opening one more forgets the session that expires first.
        for (key, seconds) in [("c1", 300.0), ("c2", 100.0), ("c3", 200.0)] {
            try await tokens.openSession(session(key, "carol", token: bobToken.token, for: seconds), capacity: 4, now: Self.t0)
        }
        try await tokens.openSession(session("c4", "carol", token: bobToken.token, for: 400), capacity: 4, now: Self.t0)
        var live: [String] = []
        for key in ["k4", "c1", "c2", "c3", "c4"] where try await tokens.session(key: key, now: Self.t0) != nil { live.append(key) }
        #expect(live == ["k4", "c1", "c3", "c4"])
    }
}
