import DredgeDomain
import DredgePayload
import DredgeWire
import Foundation
import SwiftProtobuf

/// What the agent holds of its triggers across restarts (Protocol § 21): the last set it
/// accepted, as it came (its terms checked again when read back), where in the store each
/// trigger began to be matched (never a record stored before it was held), where matching has
/// read up to, and the ``CapturePlanner``'s windows, budgets and pending captures.
///
/// Kept in `triggers.json` in the agent's state directory, written durably (a crash leaves the
/// old file or the new, never a torn one), mode 0600.
public struct HeldTriggers: Sendable, Equatable {
    public static let fileName = "triggers.json"

    /// The set held, as received; nil before any.
    public private(set) var set: WireTriggerSet?
    /// Its triggers, checked, in the order listed.
    public private(set) var rules: [TriggerRule] = []
    /// Trigger id → the store position (row id) after which it matches records.
    public private(set) var startedAfter: [String: Int64] = [:]
    /// How far matching has read the store (row id).
    public var cursor: Int64 = 0
    /// Trigger id → when the agent began to hold it (µs, its clock): a run that ended before
    /// fires no crash capture of it.
    public private(set) var heldAtUs: [String: Int64] = [:]
    /// The runs of the store's apps already looked at for crashes (nil: none looked at yet).
    public var runsSeen: Set<String>?
    public var planner = CapturePlanner()

    public init() {}

    public var version: UInt64? { self.set?.version }
    public var issuedAtUs: Int64? { self.set?.issuedAtUs }

    /// Holds `set` (admitted: ``TriggerSetAdmission``) with its checked `rules`. A trigger new to
    /// the agent matches what its store takes after `storeEnd`; one held before keeps its start.
    public mutating func hold(_ set: WireTriggerSet, rules: [TriggerRule], storeEnd: Int64, now: Timestamp = .now) {
        var starts: [String: Int64] = [:], since: [String: Int64] = [:]
        for rule in rules {
            starts[rule.id] = startedAfter[rule.id] ?? storeEnd
            since[rule.id] = heldAtUs[rule.id] ?? now.microseconds
        }
        self.set = set
        self.rules = rules
        startedAfter = starts
        heldAtUs = since
        planner.held(Set(rules.map(\.id)), now: now)
    }

    /// The store was made anew and ends at `storeEnd`: matching goes on from there, every
    /// trigger matching only what it takes from now on.
    public mutating func restart(at storeEnd: Int64) {
        cursor = storeEnd
        for id in startedAfter.keys { startedAfter[id] = storeEnd }
    }

    /// What is written to disk.
    struct Stored: Codable {
        var set: Data?
        var startedAfter: [String: Int64]
        var cursor: Int64
        var planner: CapturePlanner
        var heldAtUs: [String: Int64]?
        var runsSeen: [String]?
    }

    public func encoded() throws -> [UInt8] {
        let stored = Stored(
            set: try set?.serializedData(), startedAfter: startedAfter, cursor: cursor, planner: planner, heldAtUs: heldAtUs, runsSeen: runsSeen.map { $0.sorted() })
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return Array(try encoder.encode(stored)) + [10]
    }

    /// Reads what `encoded()` wrote; the set's terms are checked again (the file is the agent's
    /// own, but a set that no longer reads as valid is never matched). Throws what is wrong.
    public init(decoding bytes: [UInt8]) throws {
        let stored: Stored
        do {
            stored = try JSONDecoder().decode(Stored.self, from: Data(bytes))
        } catch {
            throw AgentError("the held triggers do not read back (\(error))")
        }
        if let data = stored.set {
            let set: WireTriggerSet
            do {
                set = try WireTriggerSet(serializedBytes: data)
            } catch {
                throw AgentError("the held trigger set does not decode (\(error))")
            }
            do {
                rules = try TriggerSetTerms.check(set)
            } catch {
                throw AgentError("the held trigger set no longer holds its terms: \(error)")
            }
            self.set = set
        }
        startedAfter = stored.startedAfter.filter { id, _ in rules.contains { $0.id == id } }
        heldAtUs = (stored.heldAtUs ?? [:]).filter { id, _ in rules.contains { $0.id == id } }
        runsSeen = stored.runsSeen.map(Set.init)
        cursor = stored.cursor
        planner = stored.planner
    }

    /// Writes it durably to `directory`/``fileName``.
    public func save(in directory: String) throws {
        try DurableFile.write(try encoded(), to: directory + "/" + Self.fileName, mode: 0o600)
    }

    /// Reads it from `directory`: an empty hold when there is no file yet. A file that does not
    /// read is an error the agent reports; it then starts with none (and the server sends the
    /// set again on the next connection).
    public static func load(from directory: String) throws -> HeldTriggers {
        guard let data = FileManager.default.contents(atPath: directory + "/" + fileName) else { return HeldTriggers() }
        return try HeldTriggers(decoding: Array(data))
    }
}
