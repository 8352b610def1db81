import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation

/// The live tails (#53, Protocol § 20), as the rest of the server sees them: each tail, who
/// asked and why, and each device's part in it, with what the server holds of it. Both back ends
/// keep the same rules (``TailRegistryConformanceTests`` checks each):
/// - A tail is created open with no part, and its `tail` audit entry, at once.
/// - A tail is open until it is stopped or its expiry passes. ``due(for:uids:now:)`` lists the
///   open tails an agent should run: of one of the uids it holds, for it when the tail names its
///   devices, and whose part for it is not final.
/// - ``deliver(_:agent:wrappedKey:at:)`` makes the part (`delivered`) with its key the first
///   time, and returns the key kept from then on; it returns nil once the tail is not open or
///   the part is final, and then no command may be sent.
/// - ``accepted(_:agent:startCursor:at:)`` keeps the *first* start cursor a part is given; the
///   part runs from then on, holding nothing (seq 0 at the start cursor) until a batch is held.
/// - ``held(_:agent:seq:cursor:records:dropped:bytes:at:)`` applies only to a running part of an
///   open tail (with ``WireLimits/tailExpiryGrace`` past its expiry), for the batch right after
///   the last one held, whose cursor is past the last one's.
/// - A final part (rejected, ended) never changes again.
/// - ``markRemoved(_:by:reason:at:)`` stops an open tail first and records the first removal
///   only; ``removable(keptUntil:limit:)`` lists stopped tails not removed, stopped at or before
///   the cutoff.
/// - ``stop(_:by:reason:at:)`` records the first stop only, ends every part not final, and
///   writes the `tail.stop` audit entry (what was seen, from which devices, for how long) in
///   the same transaction; ``stopExpired(now:)`` does the same, by `server`, for the tails
///   whose expiry and its grace passed.
///
/// A part's key is kept wrapped under the server's encryption key: ``CommandIssuer`` makes,
/// unwraps and rewraps it, never this store.
public protocol TailRegistry: Sendable {
    /// Stores a new tail, open and with no part, and its `tail` audit entry.
    func create(_ tail: NewTail) async throws
    func tail(_ id: String) async throws -> TailRecord?
    /// Newest first.
    func tails(limit: Int) async throws -> [TailRecord]
    /// The open tails `agentID` should run now (see the rules above), oldest first.
    func due(for agentID: String, uids: Set<String>, now: Timestamp) async throws -> [DueTail]
    /// Claims the agent's part for a command about to be written: makes it `delivered` with
    /// `wrappedKey` if it has none, and returns the part's key (the one first given). Nil when
    /// the tail is not open at `at` or the part is final: the command must not be sent.
    func deliver(_ tailID: String, agent: String, wrappedKey: [UInt8], at: Date) async throws -> [UInt8]?
    /// The agent accepted the tail (`TailAccepted`): the part runs, the first start cursor is
    /// kept, and what is held is returned for the acknowledgement. Nil when the tail is not open
    /// at `at` (its expiry and ``WireLimits/tailExpiryGrace`` passed, or it stopped), was never
    /// delivered to the agent, or the part is final.
    func accepted(_ tailID: String, agent: String, startCursor: UInt64, at: Date) async throws -> TailHold?
    /// What is held of the agent's part now, read only: nil when a batch may not be taken (as
    /// for ``accepted(_:agent:startCursor:at:)``, or the part was never accepted).
    func hold(_ tailID: String, agent: String, at: Date) async throws -> TailHold?
    /// A batch is stored: it is held. False unless it is the one after the last one held, with
    /// a cursor past its cursor, of a running part of a tail open at `at` (grace included).
    func held(_ tailID: String, agent: String, seq: UInt64, cursor: UInt64, records: Int, dropped: UInt64, bytes: Int64, at: Date) async throws -> Bool
    /// Ends the agent's part (`rejected` or `ended`) with why, unless it is final already.
    /// Returns whether it applied.
    func endPart(_ tailID: String, agent: String, status: TailPartStatus, detail: String, at: Date) async throws -> Bool
    /// Stops the tail: the first stop is kept; parts not final end with the reason; audited as
    /// `tail.stop`. Nil for an unknown tail; ``StopMark/isNew`` false when it had stopped.
    func stop(_ tailID: String, by actor: String, reason: String, at: Date) async throws -> TailStopMark?
    /// Stops, by `server`, the tails whose expiry and ``WireLimits/tailExpiryGrace`` are past at
    /// `now` and that did not stop yet; returns their ids.
    func stopExpired(now: Timestamp) async throws -> [String]
    /// How many tails are open at `now`: all, or those `requestedBy` asked for.
    func openCount(requestedBy: String?, now: Timestamp) async throws -> Int
    /// Records that what the tail held is deleted (its files and index rows: the caller deletes
    /// them, after this), stopping it first if it runs (audited as its stop). A tail removed
    /// before keeps its first removal. Nil for an unknown tail.
    func markRemoved(_ tailID: String, by actor: String, reason: String, at: Date) async throws -> RemovalMark?
    /// Tails kept long enough: stopped at or before `cutoff` and not removed. Oldest first.
    func removable(keptUntil cutoff: Date, limit: Int) async throws -> [String]
}

/// What ``TailRegistry/stop(_:by:reason:at:)`` did.
public struct TailStopMark: Sendable, Equatable {
    /// The tail as it is now.
    public var tail: TailRecord
    /// False when it had stopped before (``TailRecord/stopped`` is that earlier stop).
    public var isNew: Bool
}

/// A tail about to be stored.
public struct NewTail: Sendable, Equatable {
    public var id: String
    public var uid: String
    /// Only these devices (nil: any device that holds the uid, now or during the tail).
    public var agents: [String]?
    /// The records it shows; its uid is the tail's, its times are not used.
    public var filter: LogFilter
    public var issuedAt: Timestamp
    public var expiresAt: Timestamp
    public var recordsPerSecond: UInt32
    public var bytesPerSecond: UInt64
    public var verbose: Bool
    public var verboseTypes: [String]
    public var requestedBy: String
    /// Why, as the requester said (empty: not said).
    public var reason: String
    /// Marked urgent (#54, Protocol § 22).
    public var urgent = false

    public init(
        id: String, uid: String, agents: [String]?, filter: LogFilter, issuedAt: Timestamp, expiresAt: Timestamp, recordsPerSecond: UInt32, bytesPerSecond: UInt64,
        verbose: Bool, verboseTypes: [String], requestedBy: String, reason: String
    ) {
        self.id = id
        self.uid = uid
        self.agents = agents
        self.filter = filter
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.recordsPerSecond = recordsPerSecond
        self.bytesPerSecond = bytesPerSecond
        self.verbose = verbose
        self.verboseTypes = verboseTypes
        self.requestedBy = requestedBy
        self.reason = reason
    }

    /// Its `tail` audit entry, the same for every implementation: "tail ID of uid U on any
    /// device holding it, levels warning,error; until … at most 200 records/s and 1048576
    /// bytes/s; verbose; reason "T-1"".
    public var auditDetail: String {
        let whom = agents.map { "of uid \(uid) on \($0.isEmpty ? "no device" : "device(s) \($0.joined(separator: ", "))")" } ?? "of uid \(uid) on any device holding it"
        var shown = filter
        shown.uid = nil
        shown.since = nil
        shown.until = nil
        let verbosity = verbose ? "; verbose" + (verboseTypes.isEmpty ? "" : " for \(verboseTypes.joined(separator: ","))") : ""
        return "tail \(id) \(whom), \(shown.summary(time: \.rfc3339)); until \(expiresAt.rfc3339) at most \(recordsPerSecond) records/s and \(bytesPerSecond) bytes/s"
            + verbosity + (reason.isEmpty ? "" : "; reason \(reason.debugDescription)") + (urgent ? "; urgent" : "")
    }
}

/// A tail an agent should run (``TailRegistry/due(for:uids:now:)``), with its part's key when
/// it was delivered before.
public struct DueTail: Sendable, Equatable {
    public var tail: TailRecord
    /// The part's key wrapped under the server's key; nil when never delivered to this agent.
    public var wrappedKey: [UInt8]?
}

/// What the server holds of an agent's part (``TailRegistry/accepted(_:agent:startCursor:at:)``):
/// what its stream is made from.
public struct TailHold: Sendable, Equatable {
    public var uid: String
    public var expiresAt: Timestamp
    /// The part's key, wrapped under the server's key.
    public var wrappedKey: [UInt8]
    /// The last batch held (0 and the start cursor: none).
    public var seq: UInt64
    public var cursor: UInt64
    /// Bytes of record lines held on disk: what follows is not held.
    public var bytes: Int64

    public init(uid: String, expiresAt: Timestamp, wrappedKey: [UInt8], seq: UInt64, cursor: UInt64, bytes: Int64) {
        self.uid = uid
        self.expiresAt = expiresAt
        self.wrappedKey = wrappedKey
        self.seq = seq
        self.cursor = cursor
        self.bytes = bytes
    }
}

extension TailRecord {
    /// The `tail.stop` audit entry's detail: the tail, why, each device's part, how long it ran.
    func stopDetail(by actor: String, reason: String, at: Date) -> String {
        let ran = max(0, Int(at.timeIntervalSince(issuedAt.date).rounded()))
        let devices = parts.isEmpty
            ? "no device joined"
            : "\(parts.count) device(s): " + parts.map { "\($0.agentID) (\($0.status.rawValue), \($0.records) records, \($0.dropped) left out)" }.joined(separator: ", ")
        return "tail \(id) of uid \(uid) stopped by \(actor): \(reason); \(devices); ran \(ran / 60) min \(ran % 60) s"
    }
}

/// Reading a tail's stored columns, the same for every implementation.
enum TailRows {
    /// Who stops a tail at its expiry.
    static let server = "server"

    /// An agent's part as a batch or an acceptance is taken against it.
    struct Part {
        var running: Bool
        /// The kept start cursor; nil before the first acceptance.
        var start: UInt64?
        var seq: UInt64
        var cursor: UInt64
        var bytes: Int64
        var key: [UInt8]
    }

    /// What a part not final yet says once its tail stops.
    static func stoppedDetail(_ reason: String) -> String { "the tail stopped: \(reason)" }

    static func status(_ stored: String, of id: String) throws -> TailPartStatus {
        guard let status = TailPartStatus(rawValue: stored) else { throw DeploymentError("the stored status of a part of tail \(id) is unreadable: \(stored.debugDescription)") }
        return status
    }

    static func strings(_ json: String, of id: String, _ what: String) throws -> [String] {
        do {
            return try JSONDecoder().decode([String].self, from: Data(json.utf8))
        } catch {
            throw DeploymentError("the stored \(what) of tail \(id) are unreadable: \(error)")
        }
    }

    /// A new tail's columns as both back ends store them (its filter checked first).
    static func encoded(_ tail: NewTail) throws -> (filter: String, agents: String?, verboseTypes: String) {
        if let problem = tail.filter.problem { throw DeploymentError(problem) }
        return (try StoredFilter.encode(tail.filter), try tail.agents.map(json), try json(tail.verboseTypes))
    }

    static func json(_ strings: [String]) throws -> String {
        String(decoding: try JSONEncoder().encode(strings), as: UTF8.self)
    }

    static func filter(_ stored: String, of id: String) throws -> LogFilter {
        do {
            return try StoredFilter.decode(stored)
        } catch {
            throw DeploymentError("the stored filter of tail \(id) is unreadable: \(error)")
        }
    }

    /// ``WireLimits/tailExpiryGrace`` in microseconds.
    static let grace = Int64(WireLimits.tailExpiryGrace.components.seconds) * 1_000_000

    /// The latest a batch is taken: the expiry and its grace.
    static func lastTaken(_ expiresAt: Int64) -> Int64 { expiresAt + grace }

    /// Cursors and seqs are u64; the databases keep i64. Stored as the same 64 bits.
    static func stored(_ value: UInt64) -> Int64 { Int64(bitPattern: value) }
    static func read(_ value: Int64) -> UInt64 { UInt64(bitPattern: value) }
}
