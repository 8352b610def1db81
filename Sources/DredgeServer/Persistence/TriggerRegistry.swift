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

    // MARK: The sets devices hold

    /// Records what an agent answered to the set it was sent: the set it holds now (it took
    /// it), or its refusal (it keeps the set it held before, which stays recorded). An answer
    /// to a set issued before the one recorded held changes nothing (a late answer on an older
    /// connection).
    func recordAnswer(_ answer: TriggerSetAnswer) async throws
    /// What the agent answered last: the set it holds (nil: none recorded) and its last refusal
    /// since it took that set.
    func answer(of agentID: String) async throws -> HeldTriggerSet?
    /// How many agents hold a set with this trigger in it.
    func holders(of triggerID: String) async throws -> Int

    // MARK: Captures

    /// Records a capture the first time its header arrives, counted against its budgets in the
    /// rolling day before `capture.at`: at most `budgets.perDevicePerDay` of the trigger's
    /// captures from the agent, `budgets.perDay` from all agents, and `budgets.bytesPerDevicePerDay`
    /// bytes of the agent's captures of any trigger; and never a window that overlaps one of the
    /// trigger's captures from the agent. Decided in the transaction that stores it, so two at
    /// once cannot pass a budget. A capture with this id already recorded is answered as it
    /// stands (a resumption, never refused and counted again).
    func beginCapture(_ capture: NewCapture, budgets: CaptureBudgets) async throws -> CaptureBegin
    /// Moves a capture's status, unless it is already final; returns whether it applied.
    func updateCapture(_ id: String, status: FeedbackStatus, detail: String, chunksReceived: Int?, records: Int?, files: [String]?, errorCode: Int?) async throws -> Bool
    func capture(_ id: String) async throws -> CaptureRecord?
    /// Newest first: all, or one trigger's.
    func captures(of triggerID: String?, limit: Int) async throws -> [CaptureRecord]
    /// A trigger's captures begun at or after `since`, and the devices they came from.
    func tally(of triggerID: String, since: Date) async throws -> CaptureTally
    /// Fails the captures begun more than `after` ago and still not complete. Returns how many.
    func failAbandonedCaptures(now: Date, after: Duration) async throws -> Int
    /// Records that the capture's files and index rows are deleted (the caller deletes them,
    /// after this); an upload still open becomes `failed`. The first removal is kept. Nil for
    /// an unknown capture.
    func markCaptureRemoved(_ id: String, by actor: String, reason: String, at: Date) async throws -> RemovalMark?
    /// Captures kept long enough: not removed, final, and received at or before `cutoff`.
    /// Oldest first.
    func removableCaptures(receivedUntil cutoff: Date, limit: Int) async throws -> [String]
}

/// What an agent answered to a trigger set (`TriggerSetAck`, Protocol § 21).
public struct TriggerSetAnswer: Sendable, Equatable {
    public var agentID: String
    /// The set's `version` and `issued_at_us`.
    public var version: UInt64
    public var issuedAt: Timestamp
    /// The triggers of the set it answered.
    public var triggerIDs: [String]
    /// Nil: it holds the set. Else why it refused it (the reason's name and its detail).
    public var refusal: String?
    public var at: Date

    public init(agentID: String, version: UInt64, issuedAt: Timestamp, triggerIDs: [String], refusal: String?, at: Date) {
        self.agentID = agentID
        self.version = version
        self.issuedAt = issuedAt
        self.triggerIDs = triggerIDs
        self.refusal = refusal
        self.at = at
    }
}

/// The set an agent holds, as it last answered.
public struct HeldTriggerSet: Sendable, Equatable {
    /// One set, by its `version` and `issued_at_us`, and when it was answered.
    public struct Answered: Sendable, Equatable {
        public var version: UInt64
        public var issuedAt: Timestamp
        public var at: Date

        public init(version: UInt64, issuedAt: Timestamp, at: Date) {
            self.version = version
            self.issuedAt = issuedAt
            self.at = at
        }
    }

    /// The set it took last; nil: it never took one.
    public var held: Answered?
    /// The triggers of that set.
    public var triggerIDs: [String]
    /// The set it refused last after taking `held`, and why; nil: none.
    public var refused: Answered?
    public var refusal: String?

    public init(held: Answered?, triggerIDs: [String], refused: Answered?, refusal: String?) {
        self.held = held
        self.triggerIDs = triggerIDs
        self.refused = refused
        self.refusal = refusal
    }
}

/// A capture about to be recorded (its header was checked).
public struct NewCapture: Sendable, Equatable {
    public var id: String
    public var agentID: String
    public var triggerID: String
    public var setVersion: UInt64
    public var uid: String
    public var since: Timestamp
    public var until: Timestamp
    public var matchedAt: Timestamp
    public var crash: Bool
    public var chunkCount: Int
    /// The upload's declared size.
    public var bytes: Int64
    public var at: Date

    public init(
        id: String, agentID: String, triggerID: String, setVersion: UInt64, uid: String, since: Timestamp, until: Timestamp, matchedAt: Timestamp, crash: Bool,
        chunkCount: Int, bytes: Int64, at: Date
    ) {
        self.id = id
        self.agentID = agentID
        self.triggerID = triggerID
        self.setVersion = setVersion
        self.uid = uid
        self.since = since
        self.until = until
        self.matchedAt = matchedAt
        self.crash = crash
        self.chunkCount = chunkCount
        self.bytes = bytes
        self.at = at
    }
}

/// What a capture is counted against (``TriggerRegistry/beginCapture(_:budgets:)``).
public struct CaptureBudgets: Sendable, Equatable {
    /// The trigger's captures from one device in a rolling day.
    public var perDevicePerDay: Int
    /// The trigger's captures from all devices in a rolling day.
    public var perDay: Int
    /// Bytes (as declared in their headers) of one device's captures of any trigger in a rolling day.
    public var bytesPerDevicePerDay: Int64

    public init(perDevicePerDay: Int, perDay: Int, bytesPerDevicePerDay: Int64) {
        self.perDevicePerDay = perDevicePerDay
        self.perDay = perDay
        self.bytesPerDevicePerDay = bytesPerDevicePerDay
    }
}

/// What ``TriggerRegistry/beginCapture(_:budgets:)`` did.
public enum CaptureBegin: Sendable, Equatable {
    /// Recorded and counted.
    case begun
    /// Recorded before (a resumption): as it stands.
    case existing(CaptureRecord)
    /// Over a budget: nothing stored. Says which.
    case overBudget(String)
    /// Its window overlaps one of the trigger's captures from the agent: nothing stored.
    case overlaps(String)
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

    /// A list of ids (or paths) as stored: JSON.
    static func ids(_ ids: [String]) throws -> String { String(decoding: try JSONEncoder().encode(ids), as: UTF8.self) }

    /// A stored capture status, or an error naming the damaged row.
    static func status(_ stored: String, of id: String) throws -> FeedbackStatus {
        guard let status = FeedbackStatus(rawValue: stored) else { throw DeploymentError("the stored status of capture \(id) is unreadable: \(stored.debugDescription)") }
        return status
    }

    static func abandoned(_ after: Duration) -> String { "not completed within \(after) of its first frame; abandoned" }

    /// The set an agent holds from its stored columns.
    static func held(
        agentID: String, version: Int64?, issuedAtUs: Int64?, triggerIDs: String, heldAt: Double?, refusedVersion: Int64?, refusedIssuedAtUs: Int64?, refusal: String?,
        refusedAt: Double?
    ) throws -> HeldTriggerSet {
        let ids: [String]
        do {
            ids = try JSONDecoder().decode([String].self, from: Data(triggerIDs.utf8))
        } catch {
            throw DeploymentError("the trigger set agent \(agentID) holds does not read back from the database (\(error))")
        }
        func answered(_ version: Int64?, _ issued: Int64?, _ at: Double?) -> HeldTriggerSet.Answered? {
            guard let version, let issued, let at else { return nil }
            return HeldTriggerSet.Answered(version: UInt64(max(0, version)), issuedAt: Timestamp(microseconds: issued), at: Date(timeIntervalSince1970: at))
        }
        return HeldTriggerSet(
            held: answered(version, issuedAtUs, heldAt), triggerIDs: ids, refused: answered(refusedVersion, refusedIssuedAtUs, refusedAt), refusal: refusal)
    }

    /// A rolling day.
    static let day: Double = 86_400

    /// Why `capture` is over a budget, with `device` captures of its trigger from its agent,
    /// `all` from every agent and `bytes` of its agent's captures in the rolling day; nil when
    /// within them.
    static func overBudget(_ capture: NewCapture, device: Int, all: Int, bytes: Int64, _ budgets: CaptureBudgets) -> String? {
        let trigger = capture.triggerID
        if device >= budgets.perDevicePerDay { return "trigger \(trigger) allows \(budgets.perDevicePerDay) captures a day from one device; this one's are spent" }
        if all >= budgets.perDay { return "trigger \(trigger) allows \(budgets.perDay) captures a day from all devices; they are spent" }
        if bytes + capture.bytes > budgets.bytesPerDevicePerDay {
            return "this server takes \(budgets.bytesPerDevicePerDay) bytes of captures a day from one device; this one's are spent"
        }
        return nil
    }

    static func overlapDetail(_ other: String) -> String { "the window overlaps that of capture \(other) of the same trigger from this device" }

    static func ending(at: Double?, by: String?, reason: String?) -> TriggerEnding? {
        guard let at else { return nil }
        return TriggerEnding(at: Date(timeIntervalSince1970: at), by: by ?? "", reason: reason ?? "")
    }
}
