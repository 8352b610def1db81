import DredgeAdminAPI
import DredgeDomain
import Foundation

/// The standing triggers (#54, Protocol § 21), as the rest of the server sees them. Both back
/// ends keep the same rules (``TriggerRegistryConformanceTests`` checks each):
/// - A trigger is stored with its `trigger` audit entry, in force until it is disabled, removed
///   or expires.
/// - The *version* counts the changes made to the triggers: each create, first disable and
///   first removal adds one, in the transaction that makes the change (expiry is no change: a
///   device stops matching an expired trigger by its own clock). Sets sent to devices carry it.
/// - ``disable(_:by:reason:at:)`` and ``remove(_:by:reason:at:)`` keep the first of each, audited
///   (`trigger.disable`, `trigger.remove`); a removed trigger is no longer listed, and one
///   disabled or removed is no longer in force.
public protocol TriggerRegistry: Sendable {
    /// Stores a new trigger and its `trigger` audit entry, and the version goes up by one,
    /// unless `limit` triggers are in force at its creation (then nothing is stored: false).
    /// Counted in the transaction that stores it, so two at once cannot pass the limit.
    func create(_ trigger: NewTrigger, inForceAtMost limit: Int) async throws -> Bool
    /// A trigger, removed ones included (``TriggerRecord/removed`` set).
    func trigger(_ id: String) async throws -> TriggerRecord?
    /// The triggers not removed, newest first: all, or those `createdBy` defined.
    func triggers(limit: Int, createdBy: String?) async throws -> [TriggerRecord]
    /// Disables a trigger: the first disable is kept and audited, and the version goes up. Nil
    /// for an unknown trigger.
    func disable(_ id: String, by actor: String, reason: String, at: Date) async throws -> TriggerMark?
    /// Removes a trigger: the first removal is kept and audited,
    /// and the version goes up. Nil for an unknown trigger.
    func remove(_ id: String, by actor: String, reason: String, at: Date) async throws -> TriggerMark?
    /// The version now, and the triggers in force at `now`, oldest first: what devices are sent.
    func inForce(now: Timestamp) async throws -> TriggersInForce
}

/// A trigger about to be stored.
public struct NewTrigger: Sendable, Equatable {
    public var id: String
    public var definition: TriggerDefinition
    public var makerScope: AccessScope
    public var createdBy: String
    public var reason: String
    public var createdAt: Date
    public var expiresAt: Timestamp

    public init(id: String, definition: TriggerDefinition, makerScope: AccessScope, createdBy: String, reason: String, createdAt: Date, expiresAt: Timestamp) {
        self.id = id
        self.definition = definition
        self.makerScope = makerScope
        self.createdBy = createdBy
        self.reason = reason
        self.createdAt = createdAt
        self.expiresAt = expiresAt
    }

    public var auditDetail: String { definition.auditDetail(id: id, expiresAt: expiresAt, reason: reason) }
}

/// What ``TriggerRegistry/disable(_:by:reason:at:)`` or ``TriggerRegistry/remove(_:by:reason:at:)`` did.
public struct TriggerMark: Sendable, Equatable {
    /// The trigger as it is now.
    public var trigger: TriggerRecord
    /// False when it had been disabled (removed) before: the earlier one is kept.
    public var isNew: Bool
}

/// The triggers devices are sent, and the version of the changes they reflect.
public struct TriggersInForce: Sendable, Equatable {
    public var version: UInt64
    public var triggers: [TriggerRecord]

    public init(version: UInt64, triggers: [TriggerRecord]) {
        self.version = version
        self.triggers = triggers
    }
}

/// The rows both back ends store a trigger in: its definition and its maker's scope as JSON.
enum TriggerRows {
    static func encoded(_ trigger: NewTrigger) throws -> (definition: String, scope: String) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return (String(decoding: try encoder.encode(trigger.definition), as: UTF8.self), String(decoding: try encoder.encode(trigger.makerScope), as: UTF8.self))
    }

    /// A trigger from its stored columns; a definition or scope that does not read is a clear
    /// error naming the trigger (never a trap, never a trigger with no terms).
    static func record(
        id: String, definition: String, scope: String, createdAt: Double, createdBy: String, reason: String, expiresAt: Int64, disabled: TriggerEnding?,
        removed: TriggerEnding?
    ) throws -> TriggerRecord {
        let decoded: TriggerDefinition
        let maker: AccessScope
        do {
            decoded = try JSONDecoder().decode(TriggerDefinition.self, from: Data(definition.utf8))
            maker = try JSONDecoder().decode(AccessScope.self, from: Data(scope.utf8))
        } catch {
            throw DeploymentError("trigger \(id) does not read back from the database (\(error)): it was changed outside the server")
        }
        return TriggerRecord(
            id: id, definition: decoded, makerScope: maker, createdAt: Date(timeIntervalSince1970: createdAt), createdBy: createdBy, reason: reason,
            expiresAt: Timestamp(microseconds: expiresAt), disabled: disabled, removed: removed)
    }

    /// The detail of a `trigger.disable` or `trigger.remove` entry, the same for every back end.
    static func endingDetail(_ trigger: TriggerRecord, _ reason: String) -> String {
        "trigger \(trigger.id) \(trigger.definition.name.debugDescription)" + (reason.isEmpty ? "" : "; reason \(reason.debugDescription)")
    }

    static func ending(at: Double?, by: String?, reason: String?) -> TriggerEnding? {
        guard let at else { return nil }
        return TriggerEnding(at: Date(timeIntervalSince1970: at), by: by ?? "", reason: reason ?? "")
    }
}
