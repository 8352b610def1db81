import DredgeDomain
import Foundation

/// What records fire a standing trigger (#54, Protocol § 21): every field present must hold.
public struct TriggerMatch: Codable, Sendable, Equatable {
    /// Level names, any of (nil or empty: every level).
    public var levels: [String]?
    /// Type names, any of (nil or empty: every type).
    public var types: [String]?
    /// Occurs in the message or the metadata, ASCII letters without regard to case (§ 10).
    public var text: String?
    /// A member at the top level of the record's metadata.
    public var metadataKey: String?
    /// With ``metadataKey``: its value (a string's own text, another value as it is written: `503`).
    public var metadataValue: String?

    public init(levels: [String]? = nil, types: [String]? = nil, text: String? = nil, metadataKey: String? = nil, metadataValue: String? = nil) {
        self.levels = levels
        self.types = types
        self.text = text
        self.metadataKey = metadataKey
        self.metadataValue = metadataValue
    }

    /// As the command line and the console write it: `level=error,critical type=business text~"payment declined" http.status=503`.
    public var summary: String {
        var parts: [String] = []
        if let levels, !levels.isEmpty { parts.append("level=\(levels.joined(separator: ","))") }
        if let types, !types.isEmpty { parts.append("type=\(types.joined(separator: ","))") }
        if let text, !text.isEmpty { parts.append("text~\(text.debugDescription)") }
        if let metadataKey { parts.append(metadataValue.map { "\(metadataKey)=\($0)" } ?? "has \(metadataKey)") }
        return parts.isEmpty ? "every record" : parts.joined(separator: " ")
    }
}

/// A standing trigger to define (`POST /v1/triggers`, `dredge triggers create`).
public struct TriggerRequest: Codable, Sendable, Equatable {
    public static let defaultBeforeSeconds = 300
    public static let defaultAfterSeconds = 60
    public static let defaultPerDevicePerDay = 3
    public static let defaultPerDay = 100
    /// A trigger lasts 7 days unless told, at most 90.
    public static let defaultDurationSeconds = 7 * 86_400
    public static let maxDurationSeconds = 90 * 86_400
    public static let maxPerDay = 100_000

    public var name: String
    /// Nil: no record fires it (then ``crash`` must be set).
    public var match: TriggerMatch?
    /// A crash (a run's unclean end) fires it too.
    public var crash: Bool?
    /// Only this user's records and runs, on the devices that hold the user.
    public var uid: String?
    /// Only records of this app, at or between these versions (the device checks each record).
    public var app: String?
    public var minAppVersion: String?
    public var maxAppVersion: String?
    /// Only devices that carry each label.
    public var labels: [String: String]?
    /// The window around a match, in seconds.
    public var beforeSeconds: Int?
    public var afterSeconds: Int?
    /// Captures one device may send in a rolling day, and all devices together.
    public var perDevicePerDay: Int?
    public var perDay: Int?
    public var durationSeconds: Int?
    public var reason: String?

    public init(
        name: String, match: TriggerMatch? = nil, crash: Bool? = nil, uid: String? = nil, app: String? = nil, minAppVersion: String? = nil, maxAppVersion: String? = nil,
        labels: [String: String]? = nil, beforeSeconds: Int? = nil, afterSeconds: Int? = nil, perDevicePerDay: Int? = nil, perDay: Int? = nil, durationSeconds: Int? = nil,
        reason: String? = nil
    ) {
        self.name = name
        self.match = match
        self.crash = crash
        self.uid = uid
        self.app = app
        self.minAppVersion = minAppVersion
        self.maxAppVersion = maxAppVersion
        self.labels = labels
        self.beforeSeconds = beforeSeconds
        self.afterSeconds = afterSeconds
        self.perDevicePerDay = perDevicePerDay
        self.perDay = perDay
        self.durationSeconds = durationSeconds
        self.reason = reason
    }
}

/// What a trigger fires on and captures, as stored: a request with its defaults applied.
public struct TriggerDefinition: Codable, Sendable, Equatable {
    public var name: String
    public var match: TriggerMatch?
    public var crash: Bool
    public var uid: String?
    public var app: String?
    public var minAppVersion: String?
    public var maxAppVersion: String?
    public var labels: [String: String]
    public var beforeSeconds: Int
    public var afterSeconds: Int
    public var perDevicePerDay: Int
    public var perDay: Int

    public init(
        name: String, match: TriggerMatch?, crash: Bool, uid: String?, app: String?, minAppVersion: String?, maxAppVersion: String?, labels: [String: String],
        beforeSeconds: Int, afterSeconds: Int, perDevicePerDay: Int, perDay: Int
    ) {
        self.name = name
        self.match = match
        self.crash = crash
        self.uid = uid
        self.app = app
        self.minAppVersion = minAppVersion
        self.maxAppVersion = maxAppVersion
        self.labels = labels
        self.beforeSeconds = beforeSeconds
        self.afterSeconds = afterSeconds
        self.perDevicePerDay = perDevicePerDay
        self.perDay = perDay
    }

    /// Its `trigger` audit entry: "trigger ID "payment declined": level=error type=business; on
    /// devices labelled region=eu; window 300 s before, 60 s after; at most 3 a device and 100
    /// a day; until …; reason "T-1"".
    public func auditDetail(id: String, expiresAt: Timestamp, reason: String) -> String {
        var scope: [String] = []
        // The maker's words quoted as Swift writes a string: a quote or a line break in them cannot pass for the entry's own.
        if let uid { scope.append("of uid \(uid.debugDescription)") }
        if let app {
            scope.append("app \(app.debugDescription)\(minAppVersion.map { " >= \($0.debugDescription)" } ?? "")\(maxAppVersion.map { " <= \($0.debugDescription)" } ?? "")")
        }
        if !labels.isEmpty { scope.append("labelled " + labels.sorted { $0.key < $1.key }.map { "\($0.key.debugDescription)=\($0.value.debugDescription)" }.joined(separator: ",")) }
        let fires = [match.map(\.summary), crash ? "crashes" : nil].compactMap { $0 }.joined(separator: " and ")
        return "trigger \(id) \(name.debugDescription): \(fires)\(scope.isEmpty ? "" : "; " + scope.joined(separator: " "))"
            + "; window \(beforeSeconds) s before, \(afterSeconds) s after; at most \(perDevicePerDay) a device and \(perDay) a day; until \(expiresAt)"
            + (reason.isEmpty ? "" : "; reason \(reason.debugDescription)")
    }
}

/// When and by whom a trigger was disabled or removed, and why.
public struct TriggerEnding: Codable, Sendable, Equatable {
    public var at: Date
    public var by: String
    public var reason: String

    public init(at: Date, by: String, reason: String) {
        self.at = at
        self.by = by
        self.reason = reason
    }
}

/// A standing trigger (#54): what fires it, where, its window and budgets, who made it and
/// whether it is in force.
public struct TriggerRecord: Codable, Sendable, Equatable {
    public var id: String
    public var definition: TriggerDefinition
    /// The devices its maker may reach (a scoped investigator's trigger reaches no other).
    public var makerScope: AccessScope
    public var createdAt: Date
    public var createdBy: String
    public var reason: String
    public var expiresAt: Timestamp
    public var disabled: TriggerEnding?
    public var removed: TriggerEnding?

    public init(
        id: String, definition: TriggerDefinition, makerScope: AccessScope, createdAt: Date, createdBy: String, reason: String, expiresAt: Timestamp,
        disabled: TriggerEnding? = nil, removed: TriggerEnding? = nil
    ) {
        self.id = id
        self.definition = definition
        self.makerScope = makerScope
        self.createdAt = createdAt
        self.createdBy = createdBy
        self.reason = reason
        self.expiresAt = expiresAt
        self.disabled = disabled
        self.removed = removed
    }

    /// Sent to devices and matched: neither disabled nor removed, and not expired at `now`.
    public func isInForce(at now: Timestamp) -> Bool { disabled == nil && removed == nil && now < expiresAt }

    /// `in force`, `expired`, `disabled` or `removed`.
    public func state(at now: Timestamp) -> String {
        removed != nil ? "removed" : disabled != nil ? "disabled" : now >= expiresAt ? "expired" : "in force"
    }
}

/// A capture (#54, Protocol § 21): the records around what fired a trigger on one device,
/// uploaded by the device itself, and where its upload stands. Its statuses are a feedback's.
public struct CaptureRecord: Codable, Sendable, Equatable {
    /// Its upload id.
    public var id: String
    public var agentID: String
    public var triggerID: String
    /// The version of the set the device matched it under (for people; checked against the
    /// trigger as it stands).
    public var setVersion: UInt64
    /// Whose records it holds; empty: every user's on the device.
    public var uid: String
    /// The window, `[since, until)`, on the device's clock.
    public var since: Timestamp
    public var until: Timestamp
    /// When the record that fired it was logged (a crash: the last record of the run).
    public var matchedAt: Timestamp
    /// Fired by a run's unclean end rather than a record.
    public var crash: Bool
    public var receivedAt: Date
    public var status: FeedbackStatus
    public var detail: String
    public var chunksReceived: Int
    public var chunkCount: Int
    public var bytes: Int64
    public var records: Int
    /// The decrypted per-day files and the manifest, absolute paths on the server.
    public var files: [String]
    /// When the server failed the upload: the protocol's error code it answered with.
    public var errorCode: Int?
    /// Set once its files and index rows are deleted; the record stays.
    public var removed: Removal?

    public init(
        id: String, agentID: String, triggerID: String, setVersion: UInt64, uid: String, since: Timestamp, until: Timestamp, matchedAt: Timestamp, crash: Bool,
        receivedAt: Date, status: FeedbackStatus, detail: String = "", chunksReceived: Int = 0, chunkCount: Int, bytes: Int64, records: Int = 0, files: [String] = [],
        errorCode: Int? = nil, removed: Removal? = nil
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
        self.receivedAt = receivedAt
        self.status = status
        self.detail = detail
        self.chunksReceived = chunksReceived
        self.chunkCount = chunkCount
        self.bytes = bytes
        self.records = records
        self.files = files
        self.errorCode = errorCode
        self.removed = removed
    }
}

/// A trigger's captures in a span of time: how many, from how many devices.
public struct CaptureTally: Codable, Sendable, Equatable {
    public var captures: Int
    public var devices: Int

    public init(captures: Int, devices: Int) {
        self.captures = captures
        self.devices = devices
    }
}

/// A trigger with what it brought in (`GET /v1/triggers/{id}/captures`): how many devices
/// hold it, its captures in the last day from how many devices, and its newest captures.
public struct TriggerActivity: Codable, Sendable, Equatable {
    public var trigger: TriggerRecord
    /// Devices whose last answer says they hold a set with this trigger.
    public var holders: Int
    /// Captures begun in the rolling day before the request, and from how many devices.
    public var lastDay: CaptureTally
    /// Newest first.
    public var captures: [CaptureRecord]

    public init(trigger: TriggerRecord, holders: Int, lastDay: CaptureTally, captures: [CaptureRecord]) {
        self.trigger = trigger
        self.holders = holders
        self.lastDay = lastDay
        self.captures = captures
    }
}
