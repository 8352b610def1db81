import DredgeDomain
import DredgeStore
import DredgeWire
import Foundation

/// Matches what the store took against the triggers the agent holds (Protocol/README.md § 21,
/// *Matching*), off the app's logging path: the agent reads its store after where it last read,
/// as a tail does, and each record that fires a trigger goes to the ``CapturePlanner``.
///
/// A record fires a trigger only when it was stored after the agent began to hold that trigger
/// (``HeldTriggers/startedAfter``), and never when it came from a rewind buffer (its metadata
/// `dredge.rewound`): such a record tells of the past. The caller checks expiry (the planner
/// refuses an expired trigger by the clock it is given).
public enum TriggerMatcher {
    /// Rows read at most per step.
    public static let batch = 1_000

    /// Reads up to `limit` records after ``HeldTriggers/cursor``, matches them, and moves the
    /// cursor past them. Returns the captures planned, oldest first.
    public static func step(
        _ held: inout HeldTriggers, store: LogStore, now: Timestamp, limit: Int = batch, newID: () -> String
    ) throws -> [CapturePlanner.Planned] {
        guard let version = held.version, !held.rules.isEmpty else {
            // Nothing to match: the cursor follows the store, so a later set starts from there.
            held.cursor = max(held.cursor, try store.lastRowID())
            return []
        }
        let rules = held.rules.filter { $0.match != nil }
        let records = try store.records(after: held.cursor, matching: LogFilter(), limit: limit)
        guard !records.isEmpty else { return [] }
        var contexts: [ContextID: LogContext] = [:]
        if !rules.isEmpty { contexts = try store.contexts(Set(records.map(\.context))) }
        var planned: [CapturePlanner.Planned] = []
        for record in records {
            defer { held.cursor = record.id }
            guard !rules.isEmpty else { continue }
            // A uid the protocol refuses could never be captured (the server refuses its capture).
            guard record.uid.isEmpty || UserID.isValid(record.uid) else { continue }
            let metadata = record.metadataJSON == "{}" ? nil : record.metadataJSON
            if let metadata, metadata.contains("dredge.rewound"), MetadataMember.holds(metadata, key: "dredge.rewound", value: "true") { continue }
            let context = contexts[record.context]
            let view = MatchableRecord(
                level: record.level, type: record.type.rawValue, uid: record.uid, message: record.message, metadata: metadata, app: context?.app ?? "",
                appVersion: context?.appVersion ?? "")
            // A record logged after the trigger's end (beyond the clocks' skew) is outside its life.
            for rule in rules
            where record.id > (held.startedAfter[rule.id] ?? .max) && record.timestamp.microseconds <= rule.expiresAt.microseconds &+ WireLimits.clockSkewMicroseconds
                && rule.fires(on: view)
            {
                if let capture = held.planner.consider(
                    rule, setVersion: version, firedAtUs: record.timestamp.microseconds, uid: record.uid, row: record.id, crash: false, now: now, newID: newID)
                {
                    planned.append(capture)
                }
            }
        }
        return planned
    }
}
