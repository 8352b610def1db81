import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation

/// Which triggers an agent is sent, and the signed set that carries them (Protocol/README.md
/// § 21, *The set*).
extension TriggerRecord {
    /// Whether this trigger is in force for the device `agent`, which holds `uids` (§ 9): its
    /// maker's scope admits the device, the device carries each of its labels, and a trigger
    /// of one user reaches only the devices that hold that user (a set tells a device which
    /// users are watched). The app and version bounds travel with the trigger: the device
    /// applies them to each record (one store may hold several apps' records).
    public func reaches(_ agent: AgentRecord, holding uids: Set<String>) -> Bool {
        guard makerScope.admits(app: agent.app, version: agent.appVersion, labels: agent.labels) else { return false }
        guard definition.labels.allSatisfy({ agent.labels[$0.key] == $0.value }) else { return false }
        if let uid = definition.uid, !uids.contains(uid) { return false }
        return true
    }

    /// The trigger as a device is sent it.
    public var wire: WireTrigger {
        let d = definition
        return WireTrigger.with { t in
            t.triggerID = id
            t.name = d.name
            if let m = d.match {
                t.match = .with { w in
                    w.levels = (m.levels ?? []).compactMap { LogLevel(name: $0).flatMap { WireLevel(rawValue: $0.rawValue) } }
                    w.types = m.types ?? []
                    if let text = m.text { w.text = text }
                    if let key = m.metadataKey { w.metadataKey = key }
                    if let value = m.metadataValue { w.metadataValue = value }
                }
            }
            t.crash = d.crash
            t.uid = d.uid ?? ""
            t.app = d.app ?? ""
            t.minAppVersion = d.minAppVersion ?? ""
            t.maxAppVersion = d.maxAppVersion ?? ""
            t.beforeS = UInt32(clamping: d.beforeSeconds)
            t.afterS = UInt32(clamping: d.afterSeconds)
            t.maxPerDeviceDay = UInt32(clamping: d.perDevicePerDay)
            t.expiresAtUs = expiresAt.microseconds
        }
    }
}

extension CommandIssuer {
    /// The set for `agent`: the triggers in force that reach it, oldest first, at most
    /// MAX_TRIGGERS_PER_SET, signed with the signing key of the generation it pins (the current
    /// one when not said). Throws ``UnreadablePull`` when that generation is retired.
    public func triggerSet(for agent: AgentRecord, holding uids: Set<String>, from inForce: TriggersInForce, keyGeneration: Int? = nil, now: Timestamp = .now)
        throws -> WireTriggerSet
    {
        guard let signing = keyGeneration.map({ keys.generation($0) }) ?? keys.current else {
            throw UnreadablePull("agent \(agent.agentID) pins generation \(keyGeneration ?? 0) of the server's keys, which is retired: enroll it again")
        }
        var set = WireTriggerSet.with {
            $0.agentID = agent.agentID
            $0.version = inForce.version
            $0.issuedAtUs = now.microseconds
            $0.triggers = inForce.triggers.filter { $0.isInForce(at: now) && $0.reaches(agent, holding: uids) }.prefix(WireLimits.maxTriggersPerSet).map(\.wire)
        }
        try signing.signingKey.sign(&set)
        return set
    }
}
