import DredgeDomain

/// A standing trigger as an agent holds and matches it (README § 21, Triggers and captures):
/// the terms of a `Trigger` message, checked and in domain types. ``init(wire:)`` is the one
/// place the terms are checked, for the agent (a set it receives) and the server (a trigger an
/// engineer defines) alike.
public struct TriggerRule: Sendable, Equatable {
    /// What records fire it; nil for a trigger only a crash fires.
    public struct Match: Sendable, Equatable {
        public var levels: Set<LogLevel>?
        public var types: Set<LogType>?
        public var text: String?
        public var metadataKey: String?
        /// With ``metadataKey``: the member's value (a string's own text, any other value's
        /// serialized form, README § 21).
        public var metadataValue: String?

        public init(levels: Set<LogLevel>? = nil, types: Set<LogType>? = nil, text: String? = nil, metadataKey: String? = nil, metadataValue: String? = nil) {
            self.levels = levels
            self.types = types
            self.text = text
            self.metadataKey = metadataKey
            self.metadataValue = metadataValue
        }
    }

    public struct Invalid: Error, CustomStringConvertible, Sendable {
        public var description: String
        public init(_ description: String) { self.description = description }
    }

    public var id: String
    public var name: String
    public var match: Match?
    public var crash: Bool
    /// Only this user's records and runs; nil: any user's.
    public var uid: String?
    /// Only records whose context names this app; nil: any app.
    public var app: String?
    /// Only app versions in this range (``AppVersionOrder``), either end open when nil.
    public var minAppVersion: String?
    public var maxAppVersion: String?
    public var beforeSeconds: UInt32
    public var afterSeconds: UInt32
    public var maxPerDeviceDay: UInt32
    public var expiresAt: Timestamp

    public init(
        id: String, name: String, match: Match?, crash: Bool = false, uid: String? = nil, app: String? = nil, minAppVersion: String? = nil,
        maxAppVersion: String? = nil, beforeSeconds: UInt32, afterSeconds: UInt32, maxPerDeviceDay: UInt32, expiresAt: Timestamp
    ) {
        self.id = id
        self.name = name
        self.match = match
        self.crash = crash
        self.uid = uid
        self.app = app
        self.minAppVersion = minAppVersion
        self.maxAppVersion = maxAppVersion
        self.beforeSeconds = beforeSeconds
        self.afterSeconds = afterSeconds
        self.maxPerDeviceDay = maxPerDeviceDay
        self.expiresAt = expiresAt
    }

    /// The trigger's terms, checked (README § 21, The trigger set): the first rule broken, in
    /// the order the text lists them, is the error.
    public init(wire t: WireTrigger) throws(Invalid) {
        guard WireID.isValid(t.triggerID) else { throw Invalid("the trigger id is not 32 lowercase hex characters") }
        let label = "trigger \(t.triggerID)"
        guard Self.isText(t.name, max: WireLimits.triggerNameBytes, allowEmpty: false) else {
            throw Invalid("\(label): a name is 1 to \(WireLimits.triggerNameBytes) bytes without NUL")
        }
        var match: Match?
        if t.hasMatch {
            let m = t.match
            var rule = Match()
            if !m.levels.isEmpty {
                var levels = Set<LogLevel>()
                for level in m.levels {
                    guard let value = LogLevel(rawValue: level.rawValue) else { throw Invalid("\(label): unknown level \(level.rawValue)") }
                    levels.insert(value)
                }
                rule.levels = levels
            }
            if !m.types.isEmpty {
                var types = Set<LogType>()
                for name in m.types {
                    guard let type = LogType(name) else { throw Invalid("\(label): '\(name.prefix(64))' is not a type name") }
                    types.insert(type)
                }
                rule.types = types
            }
            if m.hasText {
                guard Self.isText(m.text, max: DomainLimits.filterTextBytes, allowEmpty: true) else {
                    throw Invalid("\(label): a text is at most \(DomainLimits.filterTextBytes) bytes without NUL")
                }
                if !m.text.isEmpty { rule.text = m.text }
            }
            if m.hasMetadataKey {
                guard Self.isText(m.metadataKey, max: WireLimits.triggerMetadataKeyBytes, allowEmpty: false) else {
                    throw Invalid("\(label): a metadata member's name is 1 to \(WireLimits.triggerMetadataKeyBytes) bytes without NUL")
                }
                rule.metadataKey = m.metadataKey
            }
            if m.hasMetadataValue {
                guard m.hasMetadataKey else { throw Invalid("\(label): a metadata value needs the member's name") }
                guard Self.isText(m.metadataValue, max: WireLimits.triggerMetadataValueBytes, allowEmpty: true) else {
                    throw Invalid("\(label): a metadata value is at most \(WireLimits.triggerMetadataValueBytes) bytes without NUL")
                }
                rule.metadataValue = m.metadataValue
            }
            guard rule != Match() else {
                throw Invalid("\(label): a match has at least one condition (a crash-only trigger has none: leave the match out)")
            }
            match = rule
        }
        guard match != nil || t.crash else { throw Invalid("\(label): it has no match and is not a crash trigger, so nothing fires it") }
        if !t.uid.isEmpty, let problem = UserID.problem(t.uid) { throw Invalid("\(label): uid: \(problem)") }
        guard Self.isText(t.app, max: WireLimits.triggerAppBytes, allowEmpty: true) else {
            throw Invalid("\(label): an app name is at most \(WireLimits.triggerAppBytes) bytes without NUL")
        }
        for version in [t.minAppVersion, t.maxAppVersion] {
            guard Self.isText(version, max: WireLimits.triggerAppVersionBytes, allowEmpty: true) else {
                throw Invalid("\(label): an app version bound is at most \(WireLimits.triggerAppVersionBytes) bytes without NUL")
            }
        }
        if !t.minAppVersion.isEmpty, !t.maxAppVersion.isEmpty, AppVersionOrder.compare(t.minAppVersion, t.maxAppVersion) > 0 {
            throw Invalid("\(label): the lowest app version is above the highest")
        }
        guard t.beforeS <= WireLimits.maxCaptureBeforeSeconds, t.afterS <= WireLimits.maxCaptureAfterSeconds else {
            throw Invalid("\(label): a window is at most \(WireLimits.maxCaptureBeforeSeconds) s before and \(WireLimits.maxCaptureAfterSeconds) s after")
        }
        guard (1...WireLimits.maxCapturesPerDeviceDay).contains(t.maxPerDeviceDay) else {
            throw Invalid("\(label): captures per device and day are 1 to \(WireLimits.maxCapturesPerDeviceDay)")
        }
        guard Timestamp.acceptedRange.contains(t.expiresAtUs) else { throw Invalid("\(label): expires_at_us is outside 1970–9999") }
        self.init(
            id: t.triggerID, name: t.name, match: match, crash: t.crash, uid: t.uid.isEmpty ? nil : t.uid, app: t.app.isEmpty ? nil : t.app,
            minAppVersion: t.minAppVersion.isEmpty ? nil : t.minAppVersion, maxAppVersion: t.maxAppVersion.isEmpty ? nil : t.maxAppVersion,
            beforeSeconds: t.beforeS, afterSeconds: t.afterS, maxPerDeviceDay: t.maxPerDeviceDay, expiresAt: Timestamp(microseconds: t.expiresAtUs))
    }

    /// The wire form, as the server puts it in a set.
    public var wire: WireTrigger {
        WireTrigger.with { t in
            t.triggerID = id
            t.name = name
            if let match {
                t.match = .with { m in
                    if let levels = match.levels { m.levels = levels.sorted().map { WireLevel(rawValue: $0.rawValue) ?? .info } }
                    if let types = match.types { m.types = types.map(\.rawValue).sorted() }
                    if let text = match.text { m.text = text }
                    if let key = match.metadataKey { m.metadataKey = key }
                    if let value = match.metadataValue { m.metadataValue = value }
                }
            }
            t.crash = crash
            t.uid = uid ?? ""
            t.app = app ?? ""
            t.minAppVersion = minAppVersion ?? ""
            t.maxAppVersion = maxAppVersion ?? ""
            t.beforeS = beforeSeconds
            t.afterS = afterSeconds
            t.maxPerDeviceDay = maxPerDeviceDay
            t.expiresAtUs = expiresAt.microseconds
        }
    }

    static func isText(_ text: String, max: Int, allowEmpty: Bool) -> Bool {
        let count = text.utf8.count
        return (allowEmpty || count > 0) && count <= max && !text.utf8.contains(0)
    }
}

/// The checks on a whole set (README § 21): its own fields, then each trigger's.
public enum TriggerSetTerms {
    /// The set's triggers, checked, in the order listed. Throws the first rule broken.
    public static func check(_ set: WireTriggerSet) throws(TriggerRule.Invalid) -> [TriggerRule] {
        guard set.version >= 1 || set.triggers.isEmpty else { throw TriggerRule.Invalid("a set that holds triggers has a version of at least 1") }
        guard Timestamp.acceptedRange.contains(set.issuedAtUs) else { throw TriggerRule.Invalid("issued_at_us is outside 1970–9999") }
        guard set.triggers.count <= WireLimits.maxTriggersPerSet else {
            throw TriggerRule.Invalid("a set holds at most \(WireLimits.maxTriggersPerSet) triggers, not \(set.triggers.count)")
        }
        var rules: [TriggerRule] = []
        var ids = Set<String>()
        for trigger in set.triggers {
            let rule = try TriggerRule(wire: trigger)
            guard ids.insert(rule.id).inserted else { throw TriggerRule.Invalid("trigger \(rule.id) is listed twice") }
            rules.append(rule)
        }
        return rules
    }
}
