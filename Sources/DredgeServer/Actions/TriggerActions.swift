import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation

/// Standing triggers (#54), one set of actions for the API, the console and (through the API)
/// the command line: define one, list and read them, disable or remove one.
extension AdminActions {
    /// Triggers in force at once on one server.
    public static let maxTriggersInForce = WireLimits.maxTriggersPerSet

    private func triggerRegistry() throws -> any TriggerRegistry {
        guard let triggers = services.triggers else { throw ActionError(.unavailable, "this server keeps no triggers") }
        return triggers
    }

    /// Defines a trigger: its terms checked as a device checks them (``TriggerRule``, the one
    /// place they are written), its scope bounded by the caller's, capped, and stored with its
    /// `trigger` audit entry. Under required approvals it is refused: a capture cannot wait for
    /// a second person.
    public func createTrigger(_ request: TriggerRequest, by caller: Caller, via surface: String) async throws -> TriggerRecord {
        let triggers = try triggerRegistry()
        let definition = try Self.definition(request)
        let reason = request.reason ?? ""
        if let problem = reasonProblem(reason) { throw ActionError(.invalid, problem) }
        let seconds = request.durationSeconds ?? TriggerRequest.defaultDurationSeconds
        guard (60...TriggerRequest.maxDurationSeconds).contains(seconds) else {
            throw ActionError(.invalid, "a trigger lasts from a minute to \(TriggerRequest.maxDurationSeconds / 86_400) days")
        }
        if services.approvals.isRequired {
            throw ActionError(
                .forbidden, "this deployment requires a second person's approval to read a user's logs, and a trigger's captures cannot wait for one: make a pull instead",
                code: "approval_required")
        }
        let now = Timestamp(self.now())
        let trigger = NewTrigger(
            id: Hex.encode(secureRandomBytes(16)), definition: definition, makerScope: caller.scope, createdBy: caller.name, reason: reason, createdAt: now.date,
            expiresAt: now.adding(.seconds(seconds)))
        // The terms a device will be sent, checked now: a trigger no device would hold is never stored.
        do {
            _ = try TriggerRule(
                wire: TriggerRecord(
                    id: trigger.id, definition: definition, makerScope: trigger.makerScope, createdAt: trigger.createdAt, createdBy: trigger.createdBy, reason: reason,
                    expiresAt: trigger.expiresAt
                ).wire)
        } catch {
            throw ActionError(.invalid, error.description.replacingOccurrences(of: "trigger \(trigger.id): ", with: ""))
        }
        guard try await triggers.create(trigger, inForceAtMost: Self.maxTriggersInForce) else {
            throw ActionError(.conflict, "the server has \(Self.maxTriggersInForce) triggers in force, as many as a device may hold: disable one first", code: "too_many_triggers")
        }
        logger.info("trigger defined", metadata: ["trigger.id": "\(trigger.id)", "by": "\(caller.name)", "via": "\(surface)"])
        // The devices connected here are sent their new sets (on a shared database, every node's too).
        services.dispatcher.triggersChanged()
        guard let stored = try await triggers.trigger(trigger.id) else { throw ActionError(.conflict, "trigger \(trigger.id) was removed as it was made") }
        return stored
    }

    /// The triggers the caller may see, newest first: every one for an unscoped caller, its own
    /// for a scoped one. Removed triggers are not listed.
    public func triggers(limit: Int, for caller: Caller) async throws -> [TriggerRecord] {
        try await triggerRegistry().triggers(limit: max(0, min(limit, 1_000)), createdBy: caller.scope.isEverything ? nil : caller.name)
    }

    public func trigger(_ id: String, for caller: Caller) async throws -> TriggerRecord {
        let id = try Self.checkedID(id, "trigger")
        guard let trigger = try await triggerRegistry().trigger(id), caller.scope.isEverything || trigger.createdBy == caller.name else {
            throw ActionError(.notFound, "no trigger \(id)")
        }
        return trigger
    }

    /// Disables a trigger: its maker or an admin may. Devices stop matching it when they are
    /// sent their next set; what it captured stays. Audited (`trigger.disable`).
    public func disableTrigger(_ id: String, by caller: Caller, reason: String) async throws -> TriggerRecord {
        try await endTrigger(id, by: caller, reason: reason, removing: false)
    }

    /// Removes a trigger: no longer listed, and captures of it are refused from now on. Its
    /// maker or an admin may. Audited (`trigger.remove`).
    public func removeTrigger(_ id: String, by caller: Caller, reason: String) async throws -> TriggerRecord {
        try await endTrigger(id, by: caller, reason: reason, removing: true)
    }

    private func endTrigger(_ id: String, by caller: Caller, reason: String, removing: Bool) async throws -> TriggerRecord {
        let trigger = try await self.trigger(id, for: caller)
        let verb = removing ? "remove" : "disable"
        guard trigger.createdBy == caller.name || caller.role == .admin else {
            throw ActionError(.forbidden, "\(trigger.createdBy) defined trigger \(trigger.id): they or an admin \(verb) it", code: "forbidden")
        }
        if let problem = reasonProblem(reason) { throw ActionError(.invalid, problem) }
        let registry = try triggerRegistry()
        let mark = removing
            ? try await registry.remove(trigger.id, by: caller.name, reason: reason, at: now())
            : try await registry.disable(trigger.id, by: caller.name, reason: reason, at: now())
        guard let mark else { throw ActionError(.notFound, "no trigger \(trigger.id)") }
        guard mark.isNew else {
            let earlier = removing ? mark.trigger.removed : (mark.trigger.disabled ?? mark.trigger.removed)
            throw ActionError(.conflict, "trigger \(trigger.id) was \(verb)d already\(earlier.map { " (\($0.by)\($0.reason.isEmpty ? "" : ": \($0.reason)"))" } ?? "")", code: "\(verb)d")
        }
        logger.info("trigger \(verb)d", metadata: ["trigger.id": "\(trigger.id)", "by": "\(caller.name)"])
        services.dispatcher.triggersChanged()
        return mark.trigger
    }

    /// A request with its defaults, its names read: what is stored.
    static func definition(_ r: TriggerRequest) throws -> TriggerDefinition {
        var match = r.match
        if var m = match {
            if let levels = m.levels {
                m.levels = try levels.map { name in
                    guard let level = LogLevel(name: name) else { throw ActionError(.invalid, "unknown level \(name.prefix(32).debugDescription)") }
                    return level.name
                }
            }
            if m.levels?.isEmpty == true { m.levels = nil }
            if m.types?.isEmpty == true { m.types = nil }
            if m.text?.isEmpty == true { m.text = nil }
            // A match with no condition would fire on every record: it is no match (crashes only).
            match = m == TriggerMatch() ? nil : m
        }
        let labels = r.labels ?? [:]
        if let problem = AccessScope(labels: labels).problem { throw ActionError(.invalid, problem) }
        let perDay = r.perDay ?? TriggerRequest.defaultPerDay
        guard (1...TriggerRequest.maxPerDay).contains(perDay) else { throw ActionError(.invalid, "captures a day, from all devices, are 1 to \(TriggerRequest.maxPerDay)") }
        func bounded(_ value: Int?, _ fallback: Int, _ what: String, max: UInt32) throws -> Int {
            let v = value ?? fallback
            guard v >= 0, v <= Int(max) else { throw ActionError(.invalid, "\(what) is 0 to \(max)") }
            return v
        }
        let before = try bounded(r.beforeSeconds, TriggerRequest.defaultBeforeSeconds, "the window before a match (seconds)", max: WireLimits.maxCaptureBeforeSeconds)
        let after = try bounded(r.afterSeconds, TriggerRequest.defaultAfterSeconds, "the window after a match (seconds)", max: WireLimits.maxCaptureAfterSeconds)
        let perDevice = r.perDevicePerDay ?? TriggerRequest.defaultPerDevicePerDay
        guard (1...Int(WireLimits.maxCapturesPerDeviceDay)).contains(perDevice) else {
            throw ActionError(.invalid, "captures a day from one device are 1 to \(WireLimits.maxCapturesPerDeviceDay)")
        }
        func nonEmpty(_ s: String?) -> String? { s?.isEmpty == false ? s : nil }
        return TriggerDefinition(
            name: r.name, match: match, crash: r.crash ?? false, uid: nonEmpty(r.uid), app: nonEmpty(r.app), minAppVersion: nonEmpty(r.minAppVersion),
            maxAppVersion: nonEmpty(r.maxAppVersion), labels: labels, beforeSeconds: before, afterSeconds: after, perDevicePerDay: perDevice, perDay: perDay)
    }
}
