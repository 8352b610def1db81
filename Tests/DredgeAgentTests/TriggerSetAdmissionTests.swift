import Crypto
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// The agent's checks on a trigger set (Protocol § 21), each refusal with its reason, in the
/// specified order; and what it holds of its triggers across restarts.
@Suite struct TriggerSetAdmissionTests {
    static let agentKey = try! RSAPrivateKey.generate()
    static let encryption = try! RSAPrivateKey.generate()
    let server = ServerSigningKey.generate()
    let now = Timestamp(rfc3339: "2026-11-30T10:00:00Z")!
    var agentID: String { Self.agentKey.publicKey.agentID }

    var keys: PinnedServerKeys {
        get throws {
            try PinnedServerKeys(
                AgentState.File(
                    agentID: agentID, serverHost: "127.0.0.1", serverPort: 1, servers: nil, serverSigningKey: Hex.encode(server.verifyingKey.rawRepresentation),
                    serverEncryptionKey: Hex.encode(Self.encryption.publicKey.spki), enrolledAt: now.date, keyGeneration: 1))
        }
    }

    static let trigger = WireTrigger.with {
        $0.triggerID = "7a0b1c2d3e4f50617283940a1b2c3d4e"
        $0.name = "payment declined"
        $0.match = .with { $0.levels = [.error]; $0.text = "payment declined" }
        $0.beforeS = 300
        $0.afterS = 60
        $0.maxPerDeviceDay = 3
        $0.expiresAtUs = 1_896_000_000_000_000
    }

    func set(_ change: (inout WireTriggerSet) -> Void = { _ in }, signedBy signer: ServerSigningKey? = nil, sign: Bool = true) throws -> WireTriggerSet {
        var s = WireTriggerSet.with {
            $0.agentID = agentID
            $0.version = 3
            $0.issuedAtUs = now.microseconds - 1_000_000
            $0.triggers = [Self.trigger]
        }
        change(&s)
        if sign { try (signer ?? server).sign(&s) }
        return s
    }

    func admit(_ s: WireTriggerSet, held: Int64? = nil) throws -> TriggerSetAdmission.Decision {
        TriggerSetAdmission.admit(s, agentID: agentID, serverKeys: try keys, heldIssuedAtUs: held, now: now)
    }

    func reason(_ d: TriggerSetAdmission.Decision) -> WireRejectReason? {
        if case .reject(let reason, _) = d { return reason }
        return nil
    }

    @Test func aSignedSetForThisAgentIsHeldAndAcknowledged() throws {
        let s = try set()
        let decision = try admit(s)
        guard case .hold(let rules) = decision else { Issue.record("refused: \(decision)"); return }
        #expect(rules.map(\.id) == [Self.trigger.triggerID])
        let ack = decision.ack(for: s).triggerSetAck
        #expect(ack.version == 3 && ack.issuedAtUs == s.issuedAtUs && ack.reason == .rejectUnspecified && ack.detail.isEmpty)
        #expect(reason(try admit(try set { $0.triggers = []; $0.version = 0 })) == nil, "a server that never had a trigger")
    }

    /// Each check refuses with its reason, and an earlier check wins over a later one.
    @Test func eachCheckRefusesWithItsReasonInOrder() throws {
        #expect(reason(try admit(try set(sign: false))) == .rejectUnsigned)
        #expect(reason(try admit(try set(signedBy: .generate()))) == .rejectBadSignature)
        var changed = try set()
        changed.version = 4
        #expect(reason(try admit(changed)) == .rejectBadSignature, "the signature covers the version")
        #expect(reason(try admit(try set { $0.agentID = String(repeating: "0", count: 32) })) == .rejectNotForMe)
        #expect(reason(try admit(try set { $0.agentID = "0"; $0.issuedAtUs = -1 })) == .rejectNotForMe, "not for me before the time's form")
        #expect(reason(try admit(try set { $0.issuedAtUs = -1 })) == .rejectInvalid)
        #expect(reason(try admit(try set { $0.issuedAtUs = now.microseconds + WireLimits.clockSkewMicroseconds + 1 })) == .rejectExpired)
        #expect(reason(try admit(try set { $0.issuedAtUs = now.microseconds + WireLimits.clockSkewMicroseconds })) == nil, "within the skew")
        // An older set, replayed, never undoes the newer one held; the same one again is fine.
        let s = try set()
        #expect(reason(try admit(s, held: s.issuedAtUs + 1)) == .rejectExpired)
        #expect(reason(try admit(s, held: s.issuedAtUs)) == nil)
        #expect(reason(try admit(try set { $0.version = 0 })) == .rejectInvalid, "version 0 with triggers")
        #expect(reason(try admit(try set { $0.triggers[0].match = WireTriggerMatch() })) == .rejectInvalid, "a match with no condition")
        #expect(reason(try admit(try set { $0.triggers.append(Self.trigger) })) == .rejectInvalid, "a trigger twice")
        let refused = try admit(try set { $0.triggers[0].beforeS = 3_601 })
        let ack = refused.ack(for: try set { $0.triggers[0].beforeS = 3_601 }).triggerSetAck
        #expect(ack.reason == .rejectInvalid && ack.detail.contains("a window is at most"), "\(ack.detail)")
    }

    @Test func theHeldTriggersSurviveARestartAndKeepWhereEachBegan() throws {
        let dir = TempDir()
        #expect(try HeldTriggers.load(from: dir.path) == HeldTriggers(), "no file yet: none held")
        var held = HeldTriggers()
        let first = try set()
        guard case .hold(let rules) = try admit(first) else { Issue.record("refused"); return }
        held.hold(first, rules: rules, storeEnd: 100)
        held.cursor = 150
        let rule = try #require(rules.first)
        _ = held.planner.consider(rule, setVersion: 3, firedAtUs: now.microseconds, uid: "u-1", row: 120, crash: false, now: now) { String(repeating: "c", count: 32) }
        try held.save(in: dir.path)
        let mode = try FileManager.default.attributesOfItem(atPath: dir.path + "/" + HeldTriggers.fileName)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        var back = try HeldTriggers.load(from: dir.path)
        #expect(back == held && back.startedAfter[rule.id] == 100 && back.planner.pending.count == 1 && back.version == 3)

        // A new set: a trigger held before keeps its start, a new one starts at the store's end.
        let other = WireTrigger.with {
            $0.triggerID = "8b1c2d3e4f50617283940a1b2c3d4e5f"
            $0.name = "crashes"
            $0.crash = true
            $0.maxPerDeviceDay = 1
            $0.expiresAtUs = Self.trigger.expiresAtUs
        }
        let second = try set { $0.version = 4; $0.issuedAtUs += 1; $0.triggers.append(other) }
        guard case .hold(let more) = try admit(second, held: back.issuedAtUs) else { Issue.record("refused"); return }
        back.hold(second, rules: more, storeEnd: 200)
        #expect(back.startedAfter == [rule.id: 100, other.triggerID: 200])
        let third = try set { $0.version = 5; $0.issuedAtUs += 2; $0.triggers = [other] }
        guard case .hold(let fewer) = try admit(third, held: back.issuedAtUs) else { Issue.record("refused"); return }
        back.hold(third, rules: fewer, storeEnd: 300)
        #expect(back.startedAfter == [other.triggerID: 200], "a trigger no longer held is let go")

        // A damaged file is an error to report, never a trap and never a set with no terms.
        try Data("{\"set\": \"AAAA\", \"startedAfter\": {}, \"cursor\": 0, \"planner\": {}}".utf8).write(to: URL(fileURLWithPath: dir.path + "/" + HeldTriggers.fileName))
        #expect(throws: AgentError.self) { try HeldTriggers.load(from: dir.path) }
        try Data("not json".utf8).write(to: URL(fileURLWithPath: dir.path + "/" + HeldTriggers.fileName))
        #expect(throws: AgentError.self) { try HeldTriggers.load(from: dir.path) }
    }
}
