import Crypto
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
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
            $0.commandID = Self.id(id)
            $0.target = .with { $0.uid = "u-1"; $0.agentID = agent }
            $0.filter = filter.wire
            $0.issuedAtUs = now.microseconds - issuedAgo * 1_000_000
            $0.expiresAtUs = now.microseconds + expiresIn * 1_000_000
            $0.wrappedKey = Data(try Self.agentKey.publicKey.wrapKey(key))
        }
        try server.sign(&c)
        return c
    }

    /// A valid command id for a readable label (a valid id stays itself).
    static func id(_ label: String) -> String {
        WireID.isValid(label) ? label : String(Hex.encode(Array(SHA256.hash(data: Data(label.utf8)))).prefix(32))
    }

    func gate() -> PullAdmission {
        PullAdmission(agentID: Self.agentKey.publicKey.agentID, serverKey: server.verifyingKey, agentKey: Self.agentKey)
    }

    func reason(_ d: PullAdmission.Decision) -> WireRejectReason? {
        if case .reject(let r, _) = d { return r } else { return nil }
    }

    /// The answer a repeated command gets, nil if it was not taken for a repeat.
    func repeated(_ d: PullAdmission.Decision) -> PullAdmission.Remembered.Answer?? {
        if case .repeated(let r) = d { return .some(r.answer) } else { return nil }
    }

    @Test func aValidCommandIsAcceptedWithItsKeyAndFilter() throws {
        var g = gate()
        let key = SymmetricKey(size: .bits256)
        let filter = LogFilter(since: now.subtracting(.seconds(86_400)), until: now, uid: "u-1", types: [.network, .player], levels: [.warning, .error], text: "timeout")
        guard case .accept(let accepted) = g.admit(try command(key: key, filter: filter), now: now) else { Issue.record("rejected"); return }
        #expect(accepted.key == key)
        #expect(accepted.filter == filter)
        #expect(accepted.commandID == Self.id("c1"))
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
        #expect(repeated(g.admit(once, now: now)) == .some(.accepted))

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
        #expect(repeated(restarted.admit(c, now: now)) == .some(.accepted))
        // After expiry the id is forgotten, and the command is refused as expired anyway.
        #expect(reason(restarted.admit(c, now: now.adding(.seconds(61)))) == .rejectExpired)
        #expect(restarted.seen[Self.id("persist")] == nil)
    }

    /// A signed command with times outside 1970–9999 (a since of Int64.min once crashed every
    /// agent it reached, in day arithmetic while writing the manifest), a malformed id, or a uid
    /// with a control character is refused as invalid, and remembered by no one.
    @Test func outOfRangeTimesMalformedIdsAndControlCharactersAreInvalid() throws {
        var g = gate()
        func signed(_ change: (inout WirePullCommand) -> Void) throws -> WirePullCommand {
            var c = try command(id: UUID().uuidString)
            change(&c)
            try server.sign(&c)
            return c
        }
        let cases: [(String, WirePullCommand)] = [
            ("since Int64.min", try signed { $0.filter.sinceUs = .min }),
            ("until Int64.max", try signed { $0.filter.untilUs = .max }),
            ("since before 1970", try signed { $0.filter.sinceUs = -1 }),
            ("expires Int64.max", try signed { $0.expiresAtUs = .max }),
            ("id ../pulls", try signed { $0.commandID = "../pulls" }),
            ("id uppercase", try signed { $0.commandID = $0.commandID.uppercased() }),
            ("id 100 KB", try signed { $0.commandID = String(repeating: "a", count: 100_000) }),
            ("filter uid with NUL", try signed { $0.filter.uid = "u-1\u{0}x" }),
            ("target uid with newline", try signed { $0.target.uid = "u-1\nx" }),
            ("text with NUL", try signed { $0.filter.text = "a\u{0}" }),
            ("text over 1,024 bytes", try signed { $0.filter.text = String(repeating: "é", count: 513) }),
        ]
        for (name, c) in cases {
            #expect(reason(g.admit(c, now: now)) == .rejectInvalid, "\(name)")
        }
        #expect(!g.seen.values.contains { $0.expiresAtUs == .max })
    }

    /// A command delivered again (the server never got the answer) is answered as the first
    /// time, and is not run twice: accepted again, rejected for the same reason, or its failure
    /// reported again.
    @Test func aRepeatedCommandGetsItsFirstAnswer() throws {
        var g = gate()
        let accepted = try command(id: "acc")
        guard case .accept = g.admit(accepted, now: now) else { Issue.record("rejected"); return }
        let again = g.admit(accepted, now: now)
        #expect(repeated(again) == .some(.accepted))
        #expect(again.frame(commandID: accepted.commandID).commandAccepted.commandID == accepted.commandID)

        let notMine = try command(id: "other", agent: String(repeating: "b", count: 32))
        #expect(reason(g.admit(notMine, now: now)) == .rejectNotForMe)
        let rejectedAgain = g.admit(notMine, now: now).frame(commandID: notMine.commandID)
        #expect(rejectedAgain.commandRejected.reason == .rejectNotForMe)

        g.rememberFailure(accepted.commandID, "the store is damaged", until: 0)
        let failed = g.admit(accepted, now: now).frame(commandID: accepted.commandID)
        #expect(failed.error.code == .errorInternal && failed.error.uploadID == accepted.commandID && !failed.error.fatal)
        #expect(failed.error.detail == "the store is damaged")
    }

    /// Busy is the last check: a command that breaks an earlier rule gets that rule's reason;
    /// a valid one gets `REJECT_BUSY` and is not remembered, so a later delivery is accepted.
    @Test func busyComesLastAndIsForgotten() throws {
        var g = gate()
        let valid = try command(id: "busy")
        #expect(reason(g.admit(valid, now: now, busy: true)) == .rejectBusy)
        #expect(g.seen[valid.commandID] == nil)
        guard case .accept = g.admit(valid, now: now) else { Issue.record("not accepted once there was room"); return }
        let notMine = try command(id: "not-mine", agent: String(repeating: "b", count: 32))
        #expect(reason(g.admit(notMine, now: now, busy: true)) == .rejectNotForMe)
        let expired = try command(id: "old", expiresIn: -10)
        #expect(reason(g.admit(expired, now: now, busy: true)) == .rejectExpired)
    }

    /// The memory an older agent saved (bare expiries) still reads; those ids, whose answer
    /// is unknown, are refused as replayed.
    @Test func theOlderFormOfTheMemoryStillReads() throws {
        let c = try command(id: "old")
        let saved = Data(#"{"\#(c.commandID)": \#(c.expiresAtUs)}"#.utf8)
        let seen = try JSONDecoder().decode([String: PullAdmission.Remembered].self, from: saved)
        var g = PullAdmission(agentID: Self.agentKey.publicKey.agentID, serverKey: server.verifyingKey, agentKey: Self.agentKey, seen: seen)
        let answer = g.admit(c, now: now)
        #expect(repeated(answer) == .some(nil))
        #expect(answer.frame(commandID: c.commandID).commandRejected.reason == .rejectReplayed)
    }

    /// The signed target uid bounds the export whatever the filter says: a filter without a
    /// uid gets the target's, one with another uid is refused.
    @Test func theTargetUIDBoundsTheFilter() throws {
        var g = gate()
        guard case .accept(let a) = g.admit(try command(id: "no-uid", filter: LogFilter(types: [.network])), now: now) else {
            Issue.record("rejected")
            return
        }
        #expect(a.filter.uid == "u-1")
        #expect(reason(g.admit(try command(id: "other-uid", filter: LogFilter(uid: "u-2")), now: now)) == .rejectInvalid)
    }
}
