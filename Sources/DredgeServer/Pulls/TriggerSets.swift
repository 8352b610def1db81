import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation

/// Which triggers an agent is sent, and the signed set that carries them (Protocol/README.md
/// § 21, *The set*).
/// The device a trigger set is made for: what its agent said of itself on its connection
/// (bounded as the registry keeps it) and the uids it holds (§ 9).
public struct TriggerAudience: Sendable, Equatable {
    public var agentID: String
    public var app: String
    public var appVersion: String
    public var labels: [String: String]
    public var uids: Set<String>

    public init(agentID: String, app: String, appVersion: String, labels: [String: String], uids: Set<String>) {
        self.agentID = agentID
        self.app = app
        self.appVersion = appVersion
        self.labels = labels
        self.uids = uids
    }

    /// `agent` as the registry lists it, holding `uids`.
    public init(_ agent: AgentRecord, holding uids: Set<String>) {
        self.init(agentID: agent.agentID, app: agent.app, appVersion: agent.appVersion, labels: agent.labels, uids: uids)
    }

    /// The agent of a connection that said `host` of itself, holding `uids`.
    public init(agentID: String, host: WireHostInfo, uids: Set<String>) {
        let bounded = host.bounded
        self.init(agentID: agentID, app: bounded.app, appVersion: bounded.appVersion, labels: bounded.extra, uids: uids)
    }
}

extension TriggerRecord {
    /// Whether this trigger is in force for the device `audience` (§ 9): its maker's scope
    /// admits the device, the device carries each of its labels, and a trigger of one user
    /// reaches only the devices that hold that user (a set tells a device which users are
    /// watched). The app and version bounds travel with the trigger: the device applies them to
    /// each record (one store may hold several apps' records).
    public func reaches(_ audience: TriggerAudience) -> Bool {
        reachesDevice(audience) && (definition.uid.map { audience.uids.contains($0) } ?? true)
    }

    /// Whether this trigger is in force for the device whatever users it holds: its maker's
    /// scope and its labels.
    public func reachesDevice(_ audience: TriggerAudience) -> Bool {
        guard makerScope.admits(app: audience.app, version: audience.appVersion, labels: audience.labels) else { return false }
        return definition.labels.allSatisfy { audience.labels[$0.key] == $0.value }
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
    /// The set for `audience`: the triggers in force that reach it, oldest first, at most
    /// MAX_TRIGGERS_PER_SET, signed with the signing key of the generation it pins (the current
    /// one when not said). Throws ``UnreadablePull`` when that generation is retired.
    public func triggerSet(for audience: TriggerAudience, from inForce: TriggersInForce, keyGeneration: Int? = nil, now: Timestamp = .now) throws -> WireTriggerSet {
        guard let signing = keyGeneration.map({ keys.generation($0) }) ?? keys.current else {
            throw UnreadablePull("agent \(audience.agentID) pins generation \(keyGeneration ?? 0) of the server's keys, which is retired: enroll it again")
        }
        var set = WireTriggerSet.with {
            $0.agentID = audience.agentID
            $0.version = inForce.version
            $0.issuedAtUs = now.microseconds
            $0.triggers = inForce.triggers.filter { $0.isInForce(at: now) && $0.reaches(audience) }.prefix(WireLimits.maxTriggersPerSet).map(\.wire)
        }
        try signing.signingKey.sign(&set)
        return set
    }
}
