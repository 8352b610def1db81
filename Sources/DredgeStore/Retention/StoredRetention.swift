import DredgeDomain
import Foundation
import GRDB

/// The retention policy a store keeps in itself (in its `meta` table), with who set it and
/// when, and what it replaced.
///
/// The policy belongs to whoever configured the store (the app), not to every process that
/// opens it: an agent, a second process of the app or a restart applies the policy the store
/// records, read again before every retention pass, never a stricter default of its own. Only
/// a configuration that sets ``StoreConfiguration/retention`` explicitly records a new policy;
/// a change is kept as ``previous`` and shown by ``StoreStatistics/retention`` (and by
/// `dredge-agent stats`).
public struct StoredRetention: Sendable, Hashable, Codable {
    public var policy: RetentionPolicy
    /// When it was recorded.
    public var setAt: Timestamp
    /// The process that recorded it (`name[pid]`).
    public var setBy: String
    /// The policy it replaced, when it replaced a different one.
    public var previous: RetentionPolicy?

    static let key = "retention"

    public init(policy: RetentionPolicy, setAt: Timestamp, setBy: String, previous: RetentionPolicy? = nil) {
        self.policy = policy
        self.setAt = setAt
        self.setBy = setBy
        self.previous = previous
    }

    /// What a store records.
    public enum Recorded: Sendable, Hashable {
        case recorded(StoredRetention)
        /// A store made before policies were recorded.
        case none
        /// A value that does not read back (damaged, or written by a newer library): never
        /// taken as a policy, nor as a default; why.
        case unreadable(String)

        public var stored: StoredRetention? {
            if case .recorded(let s) = self { return s }
            return nil
        }
    }

    /// What the store records (its `meta` table must exist).
    static func look(_ db: Database) throws -> Recorded {
        guard let data = try Data.fetchOne(db, sql: "SELECT value FROM meta WHERE key = ?", arguments: [key]) else { return .none }
        do {
            return .recorded(try JSONDecoder().decode(StoredRetention.self, from: data))
        } catch {
            return .unreadable("the retention policy recorded in the store does not read back (\(error))")
        }
    }

    func write(_ db: Database) throws {
        let data = try JSONEncoder().encode(self)
        try db.execute(sql: "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", arguments: [Self.key, data])
    }

    /// Settles the policy at open, in the transaction that makes the store's install key (so
    /// `created` is decided there): what the store records afterwards and the policy this
    /// replaced, if any.
    /// - A configuration that sets a policy records it (replacing another one, kept as
    ///   ``previous``, or one that does not read back).
    /// - Otherwise what the store records stands. A store that records none gets this
    ///   configuration's policy (the default) when this open created it, or when its owner (not
    ///   an agent) opens it. One that does not read back is replaced by its owner's and left
    ///   alone by a follower, which then deletes nothing by age (``Retention``).
    static func settle(
        _ db: Database, configuration: StoreConfiguration, created: Bool, now: Timestamp
    ) throws -> (recorded: Recorded, replaced: RetentionPolicy?) {
        let found = try look(db)
        let wanted = configuration.retention.normalized
        let records: Bool
        switch found {
        case .recorded(let stored): records = configuration.setsRetention && stored.policy != wanted
        case .none: records = configuration.setsRetention || created || configuration.retentionRole == .owner
        case .unreadable: records = configuration.setsRetention || configuration.retentionRole == .owner
        }
        guard records else { return (found, nil) }
        let new = StoredRetention(policy: wanted, setAt: now, setBy: processName, previous: found.stored?.policy)
        try new.write(db)
        return (.recorded(new), found.stored?.policy)
    }

    static var processName: String {
        "\(ProcessInfo.processInfo.processName)[\(ProcessInfo.processInfo.processIdentifier)]"
    }
}

extension RetentionPolicy: Codable {
    enum CodingKeys: String, CodingKey {
        case maxAgeMicroseconds, maxBytes, lowWaterFraction
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let micros = try c.decode(Int64.self, forKey: .maxAgeMicroseconds)
        self.init(maxAge: .microseconds(micros), maxBytes: try c.decode(Int64.self, forKey: .maxBytes), lowWaterFraction: try c.decode(Double.self, forKey: .lowWaterFraction))
        guard micros > 0, maxBytes > 0, lowWaterFraction > 0, lowWaterFraction <= 1 else {
            throw DecodingError.dataCorrupted(.init(codingPath: c.codingPath, debugDescription: "a retention policy out of range"))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(maxAge.saturatingMicroseconds, forKey: .maxAgeMicroseconds)
        try c.encode(maxBytes, forKey: .maxBytes)
        try c.encode(lowWaterFraction, forKey: .lowWaterFraction)
    }
}

extension RetentionPolicy {
    /// The policy as the store keeps it: `maxAge` in whole µs.
    var normalized: RetentionPolicy {
        var p = self
        p.maxAge = .microseconds(maxAge.saturatingMicroseconds)
        return p
    }
}

extension RetentionPolicy: CustomStringConvertible {
    /// `3 days, 200000000 bytes`.
    public var description: String {
        let seconds = maxAge.components.seconds
        let age =
            seconds % 86_400 == 0 ? "\(seconds / 86_400) day\(seconds == 86_400 ? "" : "s")"
            : seconds % 3600 == 0 ? "\(seconds / 3600) h" : "\(seconds) s"
        return "\(age), \(maxBytes) bytes"
    }
}
