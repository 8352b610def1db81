import Crypto
import DredgeEnvelope
import DredgeExport
import DredgeStore
import DredgeWire
import Foundation
import Testing

@Suite struct PullAdmissionTests {
    static let agentKey = try! RSAPrivateKey.generate()
    let server = ServerSigningKey.generate()
    let now = Timestamp(rfc3339: "2026-11-21T10:00:00Z")!

    func command(id: String = "c1", agent: String = "", expiresIn: Int64 = 3_600, issuedAgo: Int64 = 10, key: SymmetricKey = SymmetricKey(size: .bits256), filter: LogFilter = LogFilter(uid: "u-1", types: [.network], levels: [.error])) throws -> WirePullCommand {
        var c = try WirePullCommand.with {
            $0.commandID = id
            $0.target = .with { $0.uid = "u-1"; $0.agentID = agent }
            $0.filter = filter.wire
            $0.issuedAtUs = now.microseconds - issuedAgo * 1_000_000
            $0.expiresAtUs = now.microseconds + expiresIn * 1_000_000
            $0.wrappedKey = Data(try Self.agentKey.publicKey.wrapKey(key))
        }
        try server.sign(&c)
        return c
    }

    func gate() -> PullAdmission {
        PullAdmission(agentID: Self.agentKey.publicKey.agentID, serverKey: server.verifyingKey, agentKey: Self.agentKey)
    }

    func reason(_ d: PullAdmission.Decision) -> WireRejectReason? {
        if case .reject(let r, _) = d { return r } else { return nil }
    }

    @Test func aValidCommandIsAcceptedWithItsKeyAndFilter() throws {
        var g = gate()
        let key = SymmetricKey(size: .bits256)
        let filter = LogFilter(since: now.subtracting(.seconds(86_400)), until: now, uid: "u-1", types: [.network, .player], levels: [.warning, .error], text: "timeout")
        guard case .accept(let accepted) = g.admit(try command(key: key, filter: filter), now: now) else { Issue.record("rejected"); return }
        #expect(accepted.key == key)
        #expect(accepted.filter == filter)
        #expect(accepted.commandID == "c1")
        let answer = PullAdmission.Decision.accept(accepted).frame(commandID: "c1")
        #expect(answer.commandAccepted.uploadID == "c1")
    }

    @Test func eachFailureHasItsOwnReason() throws {
        var g = gate()
        var unsigned = try command(id: "u")
        unsigned.signature = Data()
        #expect(reason(g.admit(unsigned, now: now)) == .rejectUnsigned)

        var forged = try command(id: "f")
        forged.target.uid = "someone-else"
        #expect(reason(g.admit(forged, now: now)) == .rejectBadSignature)
        var impostor = try command(id: "i")
        try ServerSigningKey.generate().sign(&impostor)
        #expect(reason(g.admit(impostor, now: now)) == .rejectBadSignature)

        #expect(reason(g.admit(try command(id: "e", expiresIn: -1), now: now)) == .rejectExpired)
        #expect(reason(g.admit(try command(id: "future", issuedAgo: -3_600), now: now)) == .rejectExpired)

        let once = try command(id: "r")
        #expect(reason(g.admit(once, now: now)) == nil)
        #expect(reason(g.admit(once, now: now)) == .rejectReplayed)

        #expect(reason(g.admit(try command(id: "n", agent: "another-agent"), now: now)) == .rejectNotForMe)

        var badKey = try command(id: "k")
        badKey.wrappedKey = Data(try PullAdmissionTests.otherKey.publicKey.wrapKey(SymmetricKey(size: .bits256)))
        try server.sign(&badKey)
        #expect(reason(g.admit(badKey, now: now)) == .rejectBadKey)

        var invalid = try command(id: "v")
        invalid.filter.types = ["Not A Type"]
        try server.sign(&invalid)
        #expect(reason(g.admit(invalid, now: now)) == .rejectInvalid)
        var emptyRange = try command(id: "w")
        emptyRange.filter.sinceUs = 10
        emptyRange.filter.untilUs = 10
        try server.sign(&emptyRange)
        #expect(reason(g.admit(emptyRange, now: now)) == .rejectInvalid)
    }

    static let otherKey = try! RSAPrivateKey.generate()

    @Test func replayMemoryLastsUntilExpiryAndSurvivesARestart() throws {
        var g = gate()
        let c = try command(id: "persist", expiresIn: 60)
        #expect(reason(g.admit(c, now: now)) == nil)
        // The agent restarts with its saved memory.
        var restarted = PullAdmission(agentID: Self.agentKey.publicKey.agentID, serverKey: server.verifyingKey, agentKey: Self.agentKey, seen: g.seen)
        #expect(reason(restarted.admit(c, now: now)) == .rejectReplayed)
        // After expiry the id is forgotten, and the command is refused as expired anyway.
        #expect(reason(restarted.admit(c, now: now.adding(.seconds(61)))) == .rejectExpired)
        #expect(restarted.seen["persist"] == nil)
    }
}
