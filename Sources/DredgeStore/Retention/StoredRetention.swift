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

    /// What the store records, or nil (a store made before policies were recorded). A value
    /// that does not read back is an error, never taken as "none": that would mean a default.
    static func read(_ db: Database) throws -> StoredRetention? {
        guard let data = try Data.fetchOne(db, sql: "SELECT value FROM meta WHERE key = ?", arguments: [key]) else { return nil }
        do {
            return try JSONDecoder().decode(StoredRetention.self, from: data)
        } catch {
            throw StoreError(code: .io, message: "the retention policy recorded in the store does not read back (\(error)); it is left as it is")
        }
    }

    func write(_ db: Database) throws {
        let data = try JSONEncoder().encode(self)
        try db.execute(sql: "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", arguments: [Self.key, data])
    }

    /// Settles the policy at open: what the store records afterwards (nil: none, so nothing is
    /// deleted by age or size) and the policy this replaced, if any:
    /// - a configuration that sets a policy records it (a different one it replaces is kept as
    ///   ``previous``);
    /// - otherwise the store's policy stands; a store that records none gets this
    ///   configuration's default when it is new (`created`) or when its owner (not an agent)
    ///   opens it, and keeps none for an agent that finds an existing store without one;
    /// - a recorded policy that does not read back is replaced by its owner's and is an error
    ///   for a follower.
    static func settle(
        _ db: Database, configuration: StoreConfiguration, created: Bool, now: Timestamp
    ) throws -> (recorded: StoredRetention?, replaced: RetentionPolicy?) {
        let stored: StoredRetention?
        do {
            stored = try read(db)
        } catch where configuration.retentionRole == .owner {
            // Damaged: its owner records its own policy over it. A follower gets the error and
            // applies nothing.
            let new = StoredRetention(policy: configuration.retention, setAt: now, setBy: processName)
            try new.write(db)
            return (new, nil)
        }
        let records: Bool
        if configuration.setsRetention {
            records = stored?.policy != configuration.retention
        } else {
            records = stored == nil && (created || configuration.retentionRole == .owner)
        }
        guard records else { return (stored, nil) }
        let new = StoredRetention(policy: configuration.retention, setAt: now, setBy: processName, previous: stored?.policy)
        try new.write(db)
        return (new, stored?.policy)
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
        let (seconds, attoseconds) = maxAge.components
        try c.encode(seconds * 1_000_000 + attoseconds / 1_000_000_000_000, forKey: .maxAgeMicroseconds)
        try c.encode(maxBytes, forKey: .maxBytes)
        try c.encode(lowWaterFraction, forKey: .lowWaterFraction)
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
