import DredgeAdminAPI
import DredgeDomain
import Foundation

/// The durable pull queue, as the rest of the server sees it: every pull, who asked for it,
/// its wrapped key, and its status per target agent, with the status moves guarded. Which move
/// applies from which status, expiry and the deadlines are ``PullTargetLife``'s: an
/// implementation keeps only row I/O and guarded updates whose status lists come from it.
///
/// The rules every implementation keeps (``PullQueueConformanceTests`` checks each):
/// - A pull is created with all its targets `queued`, and its audit entry, at once; a pull by
///   uid alone may have none yet. ``adopt(agent:uids:now:)`` adds an agent to the unexpired
///   pulls by uid alone of the uids given, once each.
/// - A queued target past the pull's expiry is `expired`: ``deliverable(for:includingUnanswered:now:)``
///   marks it so and never returns it; ``pull(_:now:)`` shows it so even before.
/// - ``markDelivered(_:agent:at:)`` applies only to a queued or delivered target.
/// - A final status (complete, rejected, failed, expired) never changes again; ``update``
///   with `from` applies only from those statuses.
/// - ``markRemoved(_:by:reason:at:)`` records a removal once (a second one keeps the first),
///   ends every open target as `failed` (answered `ERROR_UPLOAD_INVALID`), drops the wrapped
///   key, and the pull takes no agent again (``adopt(agent:uids:now:)``); ``removable(keptUntil:limit:)``
///   lists only finished pulls not removed, whose expiry and last change are at or before the
///   cutoff.
/// - A stored filter that does not read back exactly throws ``UnreadablePull`` from
///   ``storedPull(_:)`` (and shows as nil in ``pull(_:now:)``), never a wider filter.
///
/// Keys are never in the clear here: the queue keeps the pull's key wrapped under the server's
/// encryption key, and ``CommandIssuer`` does the unwrapping and signing.
public protocol PullQueue: Sendable {
    /// Stores a new pull with its targets queued, and records who asked in the audit log.
    func create(_ pull: NewPull) async throws
    func pull(_ id: String, now: Timestamp) async throws -> PullRecord?
    /// Newest first; with `reason`, only the pulls whose reason holds it (ASCII letters in any
    /// case).
    func pulls(limit: Int, reason: String?, now: Timestamp) async throws -> [PullRecord]
    /// What a command is made from; throws ``UnreadablePull`` when the pull does not exist or
    /// its row does not read back exactly.
    func storedPull(_ id: String) async throws -> StoredPull
    /// The pull's key, wrapped under the server's encryption key; nil for an unknown pull.
    func wrappedKey(of pullID: String) async throws -> [UInt8]?
    /// The pulls to send `agentID` now: its queued ones, and with `includingUnanswered` those
    /// delivered and never answered, oldest first, each read with what its command is made
    /// from (one trip to the database, not one per pull). Queued ones past their expiry are
    /// expired. A pull whose row does not read back exactly is in the list with its
    /// ``UnreadablePull``: the others are still delivered.
    func deliverable(for agentID: String, includingUnanswered: Bool, now: Timestamp) async throws -> [DuePull]
    /// Claims a target for delivery just before its command is written: false when it is no
    /// longer queued or delivered, and then the command must not be sent.
    func markDelivered(_ pullID: String, agent: String, at: Date) async throws -> Bool
    /// Moves a target's status and progress unless its status is final (or, with `from`, not
    /// one of those). Nil progress values (and a nil `errorCode`, the wire code a failed
    /// upload was answered with) keep what is stored. Returns whether it applied.
    func update(
        _ pullID: String, agent: String, status: PullStatus, detail: String, chunksReceived: Int?, chunkCount: Int?, bytes: Int64?, files: [String]?,
        errorCode: Int?, from: Set<PullStatus>?, at: Date
    ) async throws -> Bool
    /// Expires delivered, exporting or uploading targets that will not finish (see
    /// ``PullTargetLife/Deadlines``); returns how many.
    func expireStalled(now: Date, listeningSince: Date, deadlines: PullTargetLife.Deadlines) async throws -> Int
    /// Agents with a queued pull.
    func agentsWithQueuedPulls() async throws -> Set<String>
    /// Approves a pull that waits for a second person's approval (#55): records who and when
    /// and the `pull.approve` audit entry (naming the requester and the reason) in one
    /// transaction, after which its targets are deliverable (on PostgreSQL every node is told to
    /// wake them). Nil when it does not wait: no such pull, no approval needed, approved
    /// already, removed, or expired at `now`. Who may approve is the caller's rule.
    func approve(_ pullID: String, by approver: String, now: Timestamp) async throws -> PullRecord?
    /// Queues for `agent` every pull by uid alone (no agent named) that has not expired at
    /// `now`, whose uid is one of `uids`, and that does not target `agent` yet: an agent that
    /// came to hold the uid after the pull was made. Returns those pulls' ids.
    func adopt(agent: String, uids: Set<String>, now: Timestamp) async throws -> [String]
    /// Records that the pull's results are deleted (its files and index rows: the caller
    /// deletes them, after this). Every target not final yet becomes `failed` (a removed pull is
    /// never delivered, and an upload for it is refused), and the wrapped key is dropped. A pull
    /// removed before keeps its first removal. Nil for an unknown pull.
    func markRemoved(_ pullID: String, by actor: String, reason: String, at: Date) async throws -> RemovalMark?
    /// Pulls kept long enough: not removed, finished (every target final; a pull with no
    /// target, expired), and neither expiring nor changing after `cutoff`. Oldest first.
    func removable(keptUntil cutoff: Date, limit: Int) async throws -> [String]
}

/// What ``PullQueue/markRemoved(_:by:reason:at:)`` and ``FeedbackInbox/markRemoved(_:by:reason:at:)`` did.
public struct RemovalMark: Sendable, Equatable {
    /// The removal in effect.
    public var removal: Removal
    /// False when it had been removed before (``removal`` is that earlier one).
    public var isNew: Bool

    public init(removal: Removal, isNew: Bool) {
        self.removal = removal
        self.isNew = isNew
    }
}

/// What administrators did, newest first: pulls, searches, token changes, refused tokens.
public protocol AuditLog: Sendable {
    func record(actor: String, action: String, detail: String, at: Date) async throws
    /// Newest first, each with its id; `query.before` pages back.
    func audit(_ query: AuditQuery) async throws -> [AuditEntry]
    /// Oldest first: the entries after the id `after` (at most `limit`), each with its hash as
    /// stored: what ``verifyChain()`` checks and ``AuditShipper`` copies out.
    func chainEntries(after: Int64, limit: Int) async throws -> [AuditChain.Stored]
}

extension AuditLog {
    /// Walks the whole log in id order and checks its hash chain (``AuditChain``).
    public func verifyChain() async throws -> AuditChain.Verdict {
        var verifier = AuditChain.Verifier()
        var after: Int64 = .min
        while true {
            let page = try await chainEntries(after: after, limit: AuditChain.page)
            guard let last = page.last?.id else { break }
            verifier.feed(page)
            after = last
        }
        return verifier.verdict
    }
}

/// A pull about to be queued: everything but its statuses.
public struct NewPull: Sendable, Equatable {
    public var id: String
    /// Empty for a pull by agent only.
    public var uid: String
    /// Empty for a pull by uid only.
    public var agentID: String
    public var filter: LogFilter
    public var issuedAt: Timestamp
    public var expiresAt: Timestamp
    /// The pull's AES key, wrapped under the server's encryption key.
    public var wrappedKey: [UInt8]
    /// The admin token's name (or `local-operator`).
    public var requestedBy: String
    public var targets: [String]
    /// Why, as the requester said (empty: not said); in the audit entry.
    public var reason: String = ""
    /// A scoped caller's pull (``PullScope``): the scope as JSON. Such a pull reaches only the
    /// targets it was made with: no agent joins it later (``PullQueue/adopt(agent:uids:now:)``).
    public var scope: String?
    /// It waits for a second person's approval (``PullQueue/approve(_:by:now:)``) before any
    /// device is sent it.
    public var approvalRequired = false
    /// Marked urgent (#54, Protocol § 22).
    public var urgent = false

    public init(
        id: String, uid: String, agentID: String, filter: LogFilter, issuedAt: Timestamp, expiresAt: Timestamp, wrappedKey: [UInt8], requestedBy: String,
        targets: [String]
    ) {
        self.id = id
        self.uid = uid
        self.agentID = agentID
        self.filter = filter
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.wrappedKey = wrappedKey
        self.requestedBy = requestedBy
        self.targets = targets
    }
}

/// A queued pull as read back to make its command.
public struct StoredPull: Sendable, Equatable {
    public var id: String
    public var uid: String
    public var filter: LogFilter
    public var issuedAt: Timestamp
    public var expiresAt: Timestamp
    public var wrappedKey: [UInt8]
    /// Marked urgent (#54): its command says so to agents that agreed `urgent`.
    public var urgent: Bool

    public init(id: String, uid: String, filter: LogFilter, issuedAt: Timestamp, expiresAt: Timestamp, wrappedKey: [UInt8], urgent: Bool = false) {
        self.urgent = urgent
        self.id = id
        self.uid = uid
        self.filter = filter
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.wrappedKey = wrappedKey
    }
}

/// A pull due for an agent (``PullQueue/deliverable(for:includingUnanswered:now:)``), with
/// what its command is made from or why it can never be made.
public struct DuePull: Sendable {
    public var id: String
    public var stored: Result<StoredPull, UnreadablePull>

    public init(id: String, stored: Result<StoredPull, UnreadablePull>) {
        self.id = id
        self.stored = stored
    }
}

/// A stored pull that can never become a command (it is gone, or its row does not read back
/// exactly, or its key does not unwrap): the pull fails for its target, with this reason.
public struct UnreadablePull: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The usual defaults: now, and nothing but the status and its detail.
extension PullQueue {
    public func pull(_ id: String) async throws -> PullRecord? { try await pull(id, now: .now) }
    public func pulls(limit: Int = 1000) async throws -> [PullRecord] { try await pulls(limit: limit, reason: nil, now: .now) }
    public func pulls(limit: Int, now: Timestamp) async throws -> [PullRecord] { try await pulls(limit: limit, reason: nil, now: now) }
    public func deliverable(for agentID: String, includingUnanswered: Bool) async throws -> [DuePull] {
        try await deliverable(for: agentID, includingUnanswered: includingUnanswered, now: .now)
    }
    @discardableResult
    public func markDelivered(_ pullID: String, agent: String) async throws -> Bool { try await markDelivered(pullID, agent: agent, at: Date()) }
    @discardableResult
    public func update(
        _ pullID: String, agent: String, status: PullStatus, detail: String = "", chunksReceived: Int? = nil, chunkCount: Int? = nil, bytes: Int64? = nil,
        files: [String]? = nil, errorCode: Int? = nil, from: Set<PullStatus>? = nil
    ) async throws -> Bool {
        try await update(
            pullID, agent: agent, status: status, detail: detail, chunksReceived: chunksReceived, chunkCount: chunkCount, bytes: bytes, files: files,
            errorCode: errorCode, from: from, at: Date())
    }
    @discardableResult
    public func update(_ pullID: String, agent: String, status: PullStatus, detail: String = "", chunksReceived: Int? = nil, at now: Date) async throws -> Bool {
        try await update(
            pullID, agent: agent, status: status, detail: detail, chunksReceived: chunksReceived, chunkCount: nil, bytes: nil, files: nil, errorCode: nil, from: nil, at: now)
    }
}

extension PullQueue {
    /// Applies one of ``PullTargetLife``'s moves (``update`` guarded by its `from` statuses).
    @discardableResult
    public func move(
        _ pullID: String, agent: String, _ move: PullTargetLife.Move, detail: String = "", chunksReceived: Int? = nil, chunkCount: Int? = nil,
        bytes: Int64? = nil, files: [String]? = nil, errorCode: Int? = nil, at now: Date = Date()
    ) async throws -> Bool {
        try await update(
            pullID, agent: agent, status: move.to, detail: detail, chunksReceived: chunksReceived, chunkCount: chunkCount, bytes: bytes, files: files,
            errorCode: errorCode, from: move.from, at: now)
    }
}

extension NewPull {
    /// Its `pull` audit entry, as a sentence, the same for every implementation: "pull ID of uid
    /// U on any device holding it, since …, levels warning,error; queued for 2 devices: A, B;
    /// reason "T-1"" (times in UTC; the filter in ``LogFilter/summary(time:)``'s words).
    public var auditDetail: String {
        let whom =
            uid.isEmpty ? "of agent \(agentID)"
            : agentID.isEmpty ? (scope == nil ? "of uid \(uid) on any device holding it" : "of uid \(uid) on the devices of the requester's scope holding it")
            : "of uid \(uid) on agent \(agentID)"
        var filter = self.filter
        filter.uid = nil  // said above
        let devices = targets.isEmpty ? "no device holds it yet" : "queued for \(targets.count) device(s): \(targets.joined(separator: ", "))"
        return "pull \(id) \(whom), \(filter.summary(time: \.rfc3339)); \(devices)" + (reason.isEmpty ? "" : "; reason \(reason.debugDescription)")
            + (approvalRequired ? "; awaiting approval" : "") + (urgent ? "; urgent" : "")
    }
}

/// Reading a pull's stored columns, the same for every implementation: a value that does not
/// read back is an error naming the row (never a guess), except the filter a pull *shows*.
enum PullRows {
    /// What a reason search looks for (``PullReason/folded(_:)``), matched against the reason
    /// folded the same way by the database (both back ends fold ASCII only, so they agree).
    static func reasonNeedle(_ text: String) -> String { PullReason.folded(text) }

    /// A stored status.
    static func status(_ stored: String, of id: String) throws -> PullStatus {
        guard let status = PullStatus(rawValue: stored) else { throw DeploymentError("the stored status of \(id) is unreadable: \(stored.debugDescription)") }
        return status
    }

    /// A stored list of file names.
    static func files(_ json: String, of id: String) throws -> [String] {
        do {
            return try JSONDecoder().decode([String].self, from: Data(json.utf8))
        } catch {
            throw DeploymentError("the stored file list of \(id) is unreadable: \(error)")
        }
    }

    /// The filter a pull shows: nil when the stored one does not read back (its delivery then
    /// fails the pull with the reason; see ``PullQueue/storedPull(_:)``).
    static func shownFilter(_ stored: String) -> LogFilter? {
        do {
            return try StoredFilter.decode(stored)
        } catch {
            return nil
        }
    }

    /// When the listener started, for ``PullTargetLife/Deadlines``: `distantPast` (not said)
    /// counts every silence.
    static func listening(since: Date) -> Timestamp {
        since == .distantPast ? Timestamp(microseconds: .min) : Timestamp(since)
    }
}

/// Reading a feedback's stored status, the same for every ``FeedbackInbox``.
enum FeedbackRows {
    /// A stored status, or an error naming the damaged row (never a guess).
    static func status(_ stored: String, of id: String) throws -> FeedbackStatus {
        guard let status = FeedbackStatus(rawValue: stored) else { throw DeploymentError("the stored status of feedback \(id) is unreadable: \(stored.debugDescription)") }
        return status
    }
}

extension AuditLog {
    public func audit(limit: Int = 1000) async throws -> [AuditEntry] { try await audit(AuditQuery(limit: limit)) }
    public func record(actor: String, action: String, detail: String) async throws { try await record(actor: actor, action: action, detail: detail, at: Date()) }
}

/// The `pull.approve` audit entry's detail: the pull, whom it is for, who asked and why.
func approvalDetail(pull id: String, uid: String, agent: String, requestedBy: String, reason: String) -> String {
    let whom = uid.isEmpty ? "of agent \(agent)" : agent.isEmpty ? "of uid \(uid)" : "of uid \(uid) on agent \(agent)"
    return "pull \(id) \(whom) requested by \(requestedBy)" + (reason.isEmpty ? "" : "; reason \(reason.debugDescription)")
}

