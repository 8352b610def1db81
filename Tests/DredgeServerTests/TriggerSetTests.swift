import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeServer
import DredgeWire
import Foundation
import Testing

/// Which triggers an agent is sent (Protocol § 21): those in force whose maker's scope, labels
/// and user reach the device, signed with the key it pins; the agent's own checks hold it.
@Suite struct TriggerSetTests {
    static let serverKey = try! RSAPrivateKey.generate()
    static let agentKey = try! RSAPrivateKey.generate()
    let signing = ServerSigningKey.generate()
    let now = Timestamp(rfc3339: "2026-11-30T10:00:00Z")!

    var agent: AgentRecord {
        AgentRecord(
            agentID: Self.agentKey.publicKey.agentID, hostname: "oven-7", os: "Linux", app: "oven-control", appVersion: "2.4.1", labels: ["region": "eu", "tier": "gold"],
            enrolledAt: now.date, connected: true, connectedAt: nil, remoteAddress: nil, lastHeartbeatAt: nil, activeUIDs: ["u-1"], storeRecords: 0)
    }

    func trigger(_ name: String, uid: String? = nil, labels: [String: String] = [:], maker: AccessScope = .everything, lifetime: Duration = .seconds(86_400))
        -> TriggerRecord
    {
        TriggerRecord(
            id: Hex.encode((0..<16).map { _ in UInt8.random(in: 0...255) }),
            definition: TriggerDefinition(
                name: name, match: TriggerMatch(levels: ["error"], metadataKey: "http.status", metadataValue: "503"), crash: false, uid: uid, app: "oven-control",
                minAppVersion: "2.0", maxAppVersion: nil, labels: labels, beforeSeconds: 120, afterSeconds: 30, perDevicePerDay: 4, perDay: 100),
            makerScope: maker, createdAt: now.date, createdBy: "ivan", reason: "", expiresAt: now.adding(lifetime))
    }

    @Test func anAgentIsSentTheTriggersThatReachItSignedForIt() throws {
        let issuer = CommandIssuer(encryptionKey: Self.serverKey, signingKey: signing)
        let everywhere = trigger("everywhere")
        let eu = trigger("eu", labels: ["region": "eu"])
        let us = trigger("us", labels: ["region": "us"])
        let mine = trigger("u-1's", uid: "u-1")
        let others = trigger("u-2's", uid: "u-2")
        let scoped = trigger("scoped to us", maker: AccessScope(labels: ["region": "us"]))
        let scopedHere = trigger("scoped to gold", maker: AccessScope(labels: ["tier": "gold"]))
        let expired = trigger("expired", lifetime: .seconds(-1))
        let inForce = TriggersInForce(version: 9, triggers: [everywhere, eu, us, mine, others, scoped, scopedHere, expired])
        let set = try issuer.triggerSet(for: TriggerAudience(agent, holding: ["u-1"]), from: inForce, now: now)
        #expect(set.agentID == agent.agentID && set.version == 9 && set.issuedAtUs == now.microseconds)
        #expect(set.triggers.map(\.name) == ["everywhere", "eu", "u-1's", "scoped to gold"])
        let sent = try #require(set.triggers.first)
        #expect(sent.match.levels == [.error] && sent.match.metadataKey == "http.status" && sent.match.metadataValue == "503" && sent.app == "oven-control")
        #expect(sent.minAppVersion == "2.0" && sent.beforeS == 120 && sent.afterS == 30 && sent.maxPerDeviceDay == 4 && sent.expiresAtUs == everywhere.expiresAt.microseconds)
        #expect(set.triggers[2].uid == "u-1")

        // The agent's own checks hold it.
        let keys = try PinnedServerKeys(
            AgentState.File(
                agentID: agent.agentID, serverHost: "127.0.0.1", serverPort: 1, servers: nil, serverSigningKey: Hex.encode(signing.verifyingKey.rawRepresentation),
                serverEncryptionKey: Hex.encode(Self.serverKey.publicKey.spki), enrolledAt: now.date, keyGeneration: 1))
        guard case .hold(let rules) = TriggerSetAdmission.admit(set, agentID: agent.agentID, serverKeys: keys, heldIssuedAtUs: nil, now: now) else {
            Issue.record("the agent refused its set")
            return
        }
        #expect(rules.map(\.id) == set.triggers.map(\.triggerID))
        let none = try issuer.triggerSet(for: TriggerAudience(agent, holding: []), from: TriggersInForce(version: 0, triggers: []), now: now)
        #expect(none.triggers.isEmpty && none.version == 0)
        #expect(throws: (any Error).self) { try issuer.triggerSet(for: TriggerAudience(agent, holding: []), from: inForce, keyGeneration: 7, now: now) }
    }
}
