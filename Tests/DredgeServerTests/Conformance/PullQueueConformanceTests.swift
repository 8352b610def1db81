import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// The rules of ``PullQueue`` and ``AuditLog``, written once and run against every
/// implementation in ``PersistenceBackend/all``: a second back end (PostgreSQL) joins that list and must
/// pass the same tests. Everything goes through the protocols, with injected clocks.
@Suite struct PullQueueConformanceTests {
    /// A fresh directory for each test (Swift Testing makes a suite instance per test).
    let dir = TempDir()

    typealias Backend = PersistenceBackend

    static let serverKey = try! RSAPrivateKey.generate()
    static let issuer = CommandIssuer(encryptionKey: serverKey, signingKey: .generate())
    static let base = Timestamp(microseconds: 1_800_000_000_000_000)

    static func newPull(targets: [String] = ["a"], filter: LogFilter = LogFilter(uid: "u-1"), lifetime: Duration = .seconds(600), at: Timestamp = base) throws -> NewPull {
        try issuer.newPull(uid: filter.uid ?? "", agentID: "", filter: filter, targets: targets, lifetime: lifetime, requestedBy: "alice", now: at)
    }

    static func status(_ queue: any PullQueue, _ id: String, _ agent: String = "a", now: Timestamp = base) async throws -> PullStatus? {
        try await queue.pull(id, now: now)?.targets.first { $0.agentID == agent }?.status
    }

    @Test(arguments: Backend.all)
    func aPullReadsBackAsItWasQueued(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        let filter = LogFilter(since: Timestamp(microseconds: 5), uid: "u-1", types: ["app", "network"], levels: [.error, .critical], text: "time out")
        let new = try Self.newPull(targets: ["b", "a"], filter: filter)
        try await queue.create(new)
        let pull = try #require(try await queue.pull(new.id, now: Self.base))
        #expect(pull.id == new.id && pull.uid == "u-1" && pull.agentID == "" && pull.requestedBy == "alice")
        #expect(pull.filter == filter)
        #expect(pull.issuedAt == Self.base && pull.expiresAt == Self.base.adding(.seconds(600)))
        #expect(pull.targets.map(\.agentID) == ["a", "b"])
        #expect(pull.targets.allSatisfy { $0.status == .queued && $0.chunksReceived == 0 && $0.files.isEmpty })

        let stored = try await queue.storedPull(new.id)
        #expect(stored == StoredPull(id: new.id, uid: "u-1", filter: filter, issuedAt: new.issuedAt, expiresAt: new.expiresAt, wrappedKey: new.wrappedKey))
        #expect(try await queue.wrappedKey(of: new.id) == new.wrappedKey)
        // Unwrapped with the server's key, not taken from the issuer's memory of the pulls it made.
        #expect(try Self.serverKey.unwrapKey(new.wrappedKey).withUnsafeBytes { Array($0) }.count == 32)

        #expect(try await queue.pull(String(repeating: "0", count: 32), now: Self.base) == nil)
        #expect(try await queue.wrappedKey(of: String(repeating: "0", count: 32)) == nil)
        await #expect(throws: UnreadablePull.self) { try await queue.storedPull(String(repeating: "0", count: 32)) }
    }

    /// A pull that waits for approval (#55) is deliverable to nobody until approved; approval
    /// happens once (whoever asks second is told nil), is audited with the requester and the
    /// reason, and is refused for a pull that needs none, is removed, or has expired.
    @Test(arguments: Backend.all)
    func aPullAwaitingApprovalGoesOutOnlyOnceApproved(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        var waiting = try Self.newPull(targets: ["a", "b"])
        waiting.approvalRequired = true
        waiting.reason = "TICKET-9"
        let plain = try Self.newPull(targets: ["a"])
        try await queue.create(waiting)
        try await queue.create(plain)
        #expect(try await queue.pull(waiting.id, now: Self.base)?.approval == PullApproval())
        #expect(try await queue.pull(plain.id, now: Self.base)?.approval == nil)
        #expect(try await queue.deliverable(for: "a", includingUnanswered: true, now: Self.base).map(\.id) == [plain.id])
        #expect(try await queue.deliverable(for: "b", includingUnanswered: true, now: Self.base).isEmpty)
        #expect(try await queue.approve(plain.id, by: "bob", now: Self.base) == nil, "it needs no approval")

        let approved = try #require(try await queue.approve(waiting.id, by: "bob", now: Self.base.adding(.seconds(5))))
        #expect(approved.approval?.approvedBy == "bob" && approved.approval?.approvedAt == Self.base.adding(.seconds(5)).date)
        #expect(approved.isAwaitingApproval == false)
        #expect(try await queue.approve(waiting.id, by: "carol", now: Self.base) == nil, "approved once")
        #expect(Set(try await queue.deliverable(for: "a", includingUnanswered: true, now: Self.base).map(\.id)) == [plain.id, waiting.id])
        #expect(try await queue.deliverable(for: "b", includingUnanswered: true, now: Self.base).map(\.id) == [waiting.id])
        let entries = try await queue.audit(AuditQuery(action: "pull.approve"))
        #expect(entries.map(\.actor) == ["bob"])
        #expect(entries.first?.detail == "pull \(waiting.id) of uid u-1 requested by alice; reason \"TICKET-9\"")
        #expect(try await queue.audit(AuditQuery(action: "pull")).contains { $0.detail.hasSuffix("; awaiting approval") && $0.detail.contains(waiting.id) })

        // Expired or removed, it can no longer be approved, and is never sent.
        var late = try Self.newPull(targets: ["a"], lifetime: .seconds(60))
        late.approvalRequired = true
        try await queue.create(late)
        #expect(try await queue.approve(late.id, by: "bob", now: Self.base.adding(.seconds(60))) == nil)
        var removed = try Self.newPull(targets: ["a"])
        removed.approvalRequired = true
        try await queue.create(removed)
        _ = try await queue.markRemoved(removed.id, by: "admin", reason: "", at: Self.base.date)
        #expect(try await queue.approve(removed.id, by: "bob", now: Self.base) == nil)
        #expect(try await queue.verifyChain().broken == nil)
    }

    /// A pull whose stored filter does not read back is never a wider filter: it shows with
    /// no filter, ``PullQueue/storedPull(_:)`` throws, and ``PullQueue/deliverable(for:includingUnanswered:now:)``
    /// lists it with its ``UnreadablePull`` beside the agent's readable pulls.
    @Test(arguments: Backend.all)
    func aDamagedFilterIsUnreadableNeverWider(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        let damaged = try Self.newPull(), kept = try Self.newPull()
        try await queue.create(damaged)
        try await queue.create(kept)
        try await backend.damageFilter(dir, damaged.id)
        #expect(try await queue.pull(damaged.id, now: Self.base)?.filter == nil)
        await #expect(throws: UnreadablePull.self) { try await queue.storedPull(damaged.id) }
        let due = try await queue.deliverable(for: "a", includingUnanswered: false, now: Self.base)
        #expect(due.map(\.id).sorted() == [damaged.id, kept.id].sorted())
        #expect(throws: UnreadablePull.self) { try due.first { $0.id == damaged.id }?.stored.get() }
        #expect(try due.first { $0.id == kept.id }?.stored.get().filter == kept.filter)
    }

    @Test(arguments: Backend.all)
    func pullsAreListedNewestFirstAndAudited(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        var ids: [String] = []
        for _ in 0..<3 {
            let new = try Self.newPull()
            try await queue.create(new)
            ids.append(new.id)
        }
        #expect(try await queue.pulls(limit: 10, now: Self.base).map(\.id) == ids.reversed())
        #expect(try await queue.pulls(limit: 2, now: Self.base).map(\.id) == Array(ids.reversed().prefix(2)))
        let audit = try await queue.audit(limit: 10)
        #expect(audit.count == 3 && audit.allSatisfy { $0.action == "pull" && $0.actor == "alice" })
        #expect(audit.first?.detail.contains(ids[2]) == true, "newest first")

        try await queue.record(actor: "bob", action: "token.create", detail: "admin token 'carol'", at: Date())
        let latest = try await queue.audit(limit: 1)
        #expect(latest.map(\.actor) == ["bob"] && latest.first?.action == "token.create")
    }

    /// A pull's reason is kept with it, shown with it, and found by any part of it in any
    /// case of its ASCII letters; a pull without one shows none.
    @Test(arguments: Backend.all)
    func aPullKeepsItsReasonAndIsFoundByIt(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        var ticket = try Self.newPull()
        ticket.reason = "SUP-1234: Ünïcode checkout"
        var other = try Self.newPull()
        other.reason = "sup-99 oven door"
        let none = try Self.newPull()
        for pull in [ticket, other, none] { try await queue.create(pull) }

        #expect(try await queue.pull(ticket.id, now: Self.base)?.reason == "SUP-1234: Ünïcode checkout")
        #expect(try await queue.pull(none.id, now: Self.base)?.reason == nil)
        #expect(try await queue.pulls(limit: 10, reason: "sup-1234", now: Self.base).map(\.id) == [ticket.id])
        #expect(try await queue.pulls(limit: 10, reason: "SUP-", now: Self.base).map(\.id) == [other.id, ticket.id], "newest first")
        #expect(try await queue.pulls(limit: 1, reason: "sup", now: Self.base).map(\.id) == [other.id])
        #expect(try await queue.pulls(limit: 10, reason: "Ünïcode", now: Self.base).map(\.id) == [ticket.id])
        #expect(try await queue.pulls(limit: 10, reason: "ünïcode", now: Self.base).isEmpty, "letters beyond ASCII as written, on both back ends")
        #expect(try await queue.pulls(limit: 10, reason: "%", now: Self.base).isEmpty, "no pattern characters")
        #expect(try await queue.pulls(limit: 10, reason: "SUP-5", now: Self.base).isEmpty)
        #expect(try await queue.pulls(limit: 10, reason: nil, now: Self.base).count == 3)
    }

    @Test(arguments: Backend.all)
    func theAuditLogIsReadByTimeActorActionAndPage(_ backend: Backend) async throws {
        let log = try await backend.pulls(dir)
        let t0 = Date(timeIntervalSince1970: 1_800_000_000)
        let entries: [(String, String, TimeInterval)] = [
            ("alice", "pull", 0), ("bob", "token.create", 10), ("alice", "records.search", 20), ("-", "auth.failed", 30),
            ("bob", "token.revoke", 40), ("carol", "tokens_x", 50), ("alice", "token%", 60), ("alice", "pull.download", 70),
        ]
        for (actor, action, offset) in entries { try await log.record(actor: actor, action: action, detail: "d", at: t0.addingTimeInterval(offset)) }
        let all = try await log.audit(AuditQuery())
        #expect(all.map(\.action) == entries.reversed().map(\.1), "newest first")
        let ids = all.compactMap(\.id)
        #expect(ids.count == entries.count && ids == ids.sorted(by: >))
        #expect(try await log.audit(AuditQuery(since: t0.addingTimeInterval(35))).map(\.action) == ["pull.download", "token%", "tokens_x", "token.revoke"])
        #expect(try await log.audit(AuditQuery(actor: "alice")).map(\.action) == ["pull.download", "token%", "records.search", "pull"])
        // One of the log's actions matches itself only (#50: `pull` is the pulls made); another
        // name matches the actions under it, its `%` and `_` taken literally.
        #expect(try await log.audit(AuditQuery(action: "pull")).map(\.action) == ["pull"])
        #expect(try await log.audit(AuditQuery(action: "token")).map(\.action) == ["token.revoke", "token.create"])
        #expect(try await log.audit(AuditQuery(action: "token%")).map(\.action) == ["token%"])
        #expect(try await log.audit(AuditQuery(action: "tokens_x")).map(\.action) == ["tokens_x"])
        #expect(try await log.audit(AuditQuery(action: "token_")).isEmpty)
        // Pages: each after the last entry of the one before, nothing skipped or repeated.
        var seen: [String] = []
        var before: Int64?
        while true {
            let page = try await log.audit(AuditQuery(before: before, limit: 3))
            seen += page.map(\.action)
            guard page.count == 3, let last = page.last?.id else { break }
            before = last
        }
        #expect(seen == entries.reversed().map(\.1))
    }

    @Test(arguments: Backend.all)
    func anInvalidFilterIsNeverQueued(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        var bad = try Self.newPull()
        bad.filter = LogFilter(since: Timestamp(microseconds: 10), until: Timestamp(microseconds: 10))
        await #expect(throws: (any Error).self) { try await queue.create(bad) }
        #expect(try await queue.pull(bad.id, now: Self.base) == nil)
        #expect(try await queue.audit(limit: 10).isEmpty)
    }

    @Test(arguments: Backend.all)
    func deliveryFollowsQueueAndExpiry(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        let first = try Self.newPull(targets: ["a", "b"]), second = try Self.newPull(lifetime: .seconds(60))
        try await queue.create(first)
        try await queue.create(second)
        #expect(try await queue.agentsWithQueuedPulls() == ["a", "b"])
        let due = try await queue.deliverable(for: "a", includingUnanswered: false, now: Self.base)
        #expect(due.map(\.id) == [first.id, second.id])
        // Each read with what its command is made from, as stored and as storedPull reads it.
        for (pull, made) in zip(due, [first, second]) {
            let stored = try pull.stored.get()
            #expect(stored == StoredPull(id: made.id, uid: made.uid, filter: made.filter, issuedAt: made.issuedAt, expiresAt: made.expiresAt, wrappedKey: made.wrappedKey))
            #expect(stored == (try await queue.storedPull(made.id)))
        }

        // Claimed, it is no longer queued, but an unanswered delivery comes back on reconnect.
        #expect(try await queue.markDelivered(first.id, agent: "a", at: Date()))
        #expect(try await queue.deliverable(for: "a", includingUnanswered: false, now: Self.base).map(\.id) == [second.id])
        #expect(try await queue.deliverable(for: "a", includingUnanswered: true, now: Self.base).map(\.id) == [first.id, second.id])
        #expect(try await queue.markDelivered(first.id, agent: "a", at: Date()), "a redelivery may claim it again")

        // Once the agent answered, it cannot be claimed for delivery again.
        #expect(try await queue.update(first.id, agent: "a", status: .exporting, detail: "", chunksReceived: nil, chunkCount: nil, bytes: nil, files: nil, errorCode: nil, from: [.queued, .delivered], at: Date()))
        #expect(try await !queue.markDelivered(first.id, agent: "a", at: Date()))
        #expect(try await queue.deliverable(for: "a", includingUnanswered: true, now: Self.base).map(\.id) == [second.id])

        // Past its expiry a queued pull is shown expired, and expired by the next delivery pass.
        let later = Self.base.adding(.seconds(61))
        #expect(try await Self.status(queue, second.id, now: later) == .expired)
        #expect(try await queue.deliverable(for: "a", includingUnanswered: true, now: later).map(\.id).isEmpty)
        #expect(try await Self.status(queue, second.id, now: Self.base) == .expired, "expired for good, whatever the clock says")
        #expect(try await !queue.markDelivered(second.id, agent: "a", at: Date()))
        #expect(try await queue.agentsWithQueuedPulls() == ["b"])
    }

    @Test(arguments: Backend.all)
    func finalStatusesNeverChangeAndFromGuardsMoves(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        let new = try Self.newPull()
        try await queue.create(new)
        func move(_ status: PullStatus, from: Set<PullStatus>? = nil, chunks: Int? = nil, files: [String]? = nil) async throws -> Bool {
            try await queue.update(new.id, agent: "a", status: status, detail: "\(status)", chunksReceived: chunks, chunkCount: chunks.map { _ in 4 }, bytes: nil, files: files, errorCode: nil, from: from, at: Date())
        }
        #expect(try await !move(.exporting, from: [.delivered]), "only from delivered")
        #expect(try await Self.status(queue, new.id) == .queued)
        #expect(try await move(.uploading, chunks: 2))
        #expect(try await !move(.exporting, from: [.queued, .delivered]), "a repeated answer never takes an upload back")
        #expect(try await move(.uploading))
        let progress = try #require(try await queue.pull(new.id, now: Self.base)?.targets.first)
        #expect(progress.chunksReceived == 2 && progress.chunkCount == 4, "nil progress keeps what is stored")
        #expect(try await move(.complete, files: ["/x/2026-11-21.jsonl"]))
        for status in PullStatus.allCases {
            #expect(try await !move(status), "complete is final: \(status)")
        }
        let done = try #require(try await queue.pull(new.id, now: Self.base)?.targets.first)
        #expect(done.status == .complete && done.files == ["/x/2026-11-21.jsonl"] && done.detail == "complete")
        #expect(try await queue.update("nope", agent: "a", status: .failed, detail: "", chunksReceived: nil, chunkCount: nil, bytes: nil, files: nil, errorCode: nil, from: nil, at: Date()) == false)
    }

    /// A failed upload keeps the wire code it was answered with, so the same answer can be given
    /// again; a later move never replaces it.
    @Test(arguments: Backend.all)
    func aFailedUploadKeepsItsErrorCode(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        let new = try Self.newPull()
        try await queue.create(new)
        #expect(try await queue.pull(new.id, now: Self.base)?.targets.first?.errorCode == nil)
        #expect(try await queue.update(new.id, agent: "a", status: .failed, detail: "chunk 3 failed authentication", chunksReceived: nil, chunkCount: nil, bytes: nil, files: nil, errorCode: 10, from: nil, at: Date()))
        #expect(try await !queue.update(new.id, agent: "a", status: .failed, detail: "again", chunksReceived: nil, chunkCount: nil, bytes: nil, files: nil, errorCode: 12, from: nil, at: Date()))
        let failed = try #require(try await queue.pull(new.id, now: Self.base)?.targets.first)
        #expect(failed.status == .failed && failed.errorCode == 10 && failed.detail == "chunk 3 failed authentication")
    }

    @Test(arguments: Backend.all)
    func stalledTargetsExpireByTheDeadlines(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        let start = Self.base.date
        let quiet = try Self.newPull(lifetime: .seconds(60)), moving = try Self.newPull(lifetime: .seconds(60)), queued = try Self.newPull(lifetime: .seconds(60))
        for pull in [quiet, moving, queued] { try await queue.create(pull) }
        _ = try await queue.update(quiet.id, agent: "a", status: .delivered, detail: "", chunksReceived: nil, chunkCount: nil, bytes: nil, files: nil, errorCode: nil, from: nil, at: start)
        _ = try await queue.update(moving.id, agent: "a", status: .uploading, detail: "", chunksReceived: 1, chunkCount: 9, bytes: nil, files: nil, errorCode: nil, from: nil, at: start.addingTimeInterval(600))
        let deadlines = PullTargetLife.Deadlines(quietAfterExpiry: .seconds(600), afterExpiry: .seconds(3600))

        // Before the quiet period has passed since the expiry: nothing ends.
        #expect(try await queue.expireStalled(now: start.addingTimeInterval(300), listeningSince: .distantPast, deadlines: deadlines) == 0)
        // A server that just started does not count its own downtime as the agent's silence.
        #expect(try await queue.expireStalled(now: start.addingTimeInterval(700), listeningSince: start.addingTimeInterval(650), deadlines: deadlines) == 0)
        #expect(try await queue.expireStalled(now: start.addingTimeInterval(700), listeningSince: .distantPast, deadlines: deadlines) == 1)
        #expect(try await Self.status(queue, quiet.id) == .expired)
        #expect(try await Self.status(queue, moving.id) == .uploading, "heard from recently")
        #expect(try await Self.status(queue, queued.id) == .queued, "queued pulls expire on delivery, not here")
        // Past the hard limit everything still open ends, progress or not.
        #expect(try await queue.expireStalled(now: start.addingTimeInterval(3700), listeningSince: .distantPast, deadlines: deadlines) == 1)
        #expect(try await Self.status(queue, moving.id) == .expired)
        #expect(try await queue.expireStalled(now: start.addingTimeInterval(9000), listeningSince: .distantPast, deadlines: deadlines) == 0)
    }

    @Test(arguments: Backend.all)
    func agentsThatComeToHoldAUIDJoinItsOpenPulls(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        // By uid alone with no agent yet; by uid alone with one; by agent; another uid; expired.
        let waiting = try Self.newPull(targets: [])
        let open = try Self.newPull(targets: ["a"])
        let named = try Self.issuer.newPull(uid: "u-1", agentID: "a", filter: LogFilter(uid: "u-1"), targets: ["a"], lifetime: .seconds(600), requestedBy: "alice", now: Self.base)
        let other = try Self.newPull(targets: [], filter: LogFilter(uid: "u-2"))
        let expired = try Self.newPull(targets: [], lifetime: .seconds(10), at: Self.base.subtracting(.seconds(20)))
        for pull in [waiting, open, named, other, expired] { try await queue.create(pull) }

        let empty = try #require(try await queue.pull(waiting.id, now: Self.base))
        #expect(empty.targets.isEmpty && !empty.isFinished(at: Self.base), "a pull with no target waits")
        #expect(empty.isFinished(at: Self.base.adding(.seconds(601))), "until it expires")

        let joined = try await queue.adopt(agent: "b", uids: ["u-1"], now: Self.base)
        #expect(Set(joined) == [waiting.id, open.id])
        #expect(try await Self.status(queue, waiting.id, "b") == .queued)
        #expect(try await queue.pull(open.id, now: Self.base)?.targets.map(\.agentID) == ["a", "b"])
        #expect(try await queue.pull(named.id, now: Self.base)?.targets.map(\.agentID) == ["a"], "a pull naming its agent takes no other")
        #expect(try await queue.pull(other.id, now: Self.base)?.targets.isEmpty == true)
        #expect(try await queue.pull(expired.id, now: Self.base)?.targets.isEmpty == true, "an expired pull takes no one")
        #expect(try await queue.deliverable(for: "b", includingUnanswered: false, now: Self.base).map(\.id).sorted() == [waiting.id, open.id].sorted())
        #expect(try await queue.agentsWithQueuedPulls().contains("b"))

        // Once each: again, and for the agent already there, nothing.
        #expect(try await queue.adopt(agent: "b", uids: ["u-1"], now: Self.base).isEmpty)
        #expect(try await queue.adopt(agent: "a", uids: ["u-1"], now: Self.base) == [waiting.id])
        // Past the expiry, nobody joins.
        #expect(try await queue.adopt(agent: "c", uids: ["u-1", "u-2"], now: Self.base.adding(.seconds(600))).isEmpty)
        #expect(try await queue.adopt(agent: "c", uids: ["u-2"], now: Self.base) == [other.id])
    }

    @Test(arguments: Backend.all)
    func aRemovedPullEndsItsOpenTargetsAndKeepsItsFirstRemoval(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        let running = try Self.newPull(targets: ["a", "b"])
        try await queue.create(running)
        #expect(try await queue.update(running.id, agent: "a", status: .complete, detail: "9 records", at: Self.base.date))
        #expect(try await queue.update(running.id, agent: "b", status: .uploading, detail: "", at: Self.base.date))
        let at = Date(timeIntervalSince1970: 1_800_000_100)

        let mark = try #require(try await queue.markRemoved(running.id, by: "alice", reason: "T-1", at: at))
        #expect(mark == RemovalMark(removal: Removal(at: at, by: "alice", reason: "T-1"), isNew: true))
        let pull = try #require(try await queue.pull(running.id, now: Self.base))
        #expect(pull.removed == Removal(at: at, by: "alice", reason: "T-1"))
        #expect(pull.targets.first { $0.agentID == "a" }?.status == .complete, "a finished target stays as it was")
        let b = try #require(pull.targets.first { $0.agentID == "b" })
        #expect(b.status == .failed && b.detail.contains("alice") && b.errorCode == 8, "an open one ends: its upload is refused (ERROR_UPLOAD_INVALID)")
        #expect(try await queue.wrappedKey(of: running.id)?.isEmpty != false, "the key is dropped")
        #expect(try await queue.deliverable(for: "b", includingUnanswered: true, now: Self.base).map(\.id).isEmpty)

        // A second removal keeps the first.
        let again = try #require(try await queue.markRemoved(running.id, by: "bob", reason: "", at: at.addingTimeInterval(60)))
        #expect(again == RemovalMark(removal: Removal(at: at, by: "alice", reason: "T-1"), isNew: false))
        #expect(try await queue.pull(running.id, now: Self.base)?.removed?.by == "alice")
        #expect(try await queue.markRemoved(String(repeating: "0", count: 32), by: "alice", reason: "", at: at) == nil)
        // A removed pull by uid alone takes no agent that comes to hold the uid.
        let waiting = try Self.newPull(targets: [])
        try await queue.create(waiting)
        _ = try await queue.markRemoved(waiting.id, by: "alice", reason: "", at: at)
        #expect(try await queue.adopt(agent: "c", uids: ["u-1"], now: Self.base).isEmpty)
        #expect(try await queue.pull(waiting.id, now: Self.base)?.targets.isEmpty == true)
        // Another pull is untouched.
        let other = try Self.newPull()
        try await queue.create(other)
        #expect(try await queue.pull(other.id, now: Self.base)?.removed == nil)
        #expect(try await queue.wrappedKey(of: other.id) == other.wrappedKey)
    }

    @Test(arguments: Backend.all)
    func removablePullsAreFinishedAndUnchangedSinceTheCutoff(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        let base = Self.base.date
        // Each expires at base + 600 s.
        let done = try Self.newPull()
        let running = try Self.newPull()
        let waitedInVain = try Self.newPull(targets: [])
        let lateChange = try Self.newPull()
        let removed = try Self.newPull()
        for p in [done, running, waitedInVain, lateChange, removed] { try await queue.create(p) }
        #expect(try await queue.update(done.id, agent: "a", status: .complete, detail: "", at: base.addingTimeInterval(100)))
        #expect(try await queue.update(running.id, agent: "a", status: .uploading, detail: "", at: base.addingTimeInterval(100)))
        #expect(try await queue.update(lateChange.id, agent: "a", status: .failed, detail: "", at: base.addingTimeInterval(5000)))
        #expect(try await queue.update(removed.id, agent: "a", status: .complete, detail: "", at: base.addingTimeInterval(100)))
        _ = try await queue.markRemoved(removed.id, by: "alice", reason: "", at: base.addingTimeInterval(200))

        #expect(try await queue.removable(keptUntil: base.addingTimeInterval(599), limit: 100).isEmpty, "none has expired by then")
        #expect(Set(try await queue.removable(keptUntil: base.addingTimeInterval(600), limit: 100)) == [done.id, waitedInVain.id])
        #expect(Set(try await queue.removable(keptUntil: base.addingTimeInterval(4999), limit: 100)) == [done.id, waitedInVain.id])
        #expect(Set(try await queue.removable(keptUntil: base.addingTimeInterval(5000), limit: 100)) == [done.id, waitedInVain.id, lateChange.id])
        #expect(try await queue.removable(keptUntil: base.addingTimeInterval(86_400 * 365), limit: 2).count == 2)
        #expect(!(try await queue.removable(keptUntil: base.addingTimeInterval(86_400 * 365), limit: 100)).contains(running.id), "never one still running")
    }

    /// The audit log is a hash chain (#55): whatever writes it (a pull, a recorded action), it
    /// verifies whole; an entry edited, removed, moved or stripped of its hash behind the
    /// store's back breaks it at that entry, and the verdict says where. Text is chained as
    /// stored (a NUL becomes U+FFFD on both back ends).
    @Test(arguments: Backend.all)
    func theAuditLogIsAHashChainThatShowsTampering(_ backend: Backend) async throws {
        let queue = try await backend.pulls(dir)
        #expect(try await queue.verifyChain() == AuditVerification(entries: 0))
        try await queue.record(actor: "alice", action: "token.create", detail: "bob", at: Date(timeIntervalSince1970: 1_800_000_000.25))
        try await queue.create(try Self.newPull())
        for n in 0..<4 { try await queue.record(actor: "bob", action: "search", detail: "q=\(n) ü\u{0}", at: Date(timeIntervalSince1970: 1_800_000_001 + Double(n))) }
        let entries = try await queue.audit(AuditQuery(limit: 100)).sorted { ($0.id ?? 0) < ($1.id ?? 0) }
        let ids = entries.compactMap(\.id)
        try #require(ids.count == 6)
        let whole = try await queue.verifyChain()
        #expect(whole.intact && whole.entries == 6 && whole.lastID == ids[5] && whole.lastHash?.count == 64, "\(whole)")

        func brokenAt() async throws -> Int64? { try await queue.verifyChain().brokenAt }
        // An edit: the entry no longer hashes to what it holds.
        try await backend.execute(dir, "UPDATE audit SET detail = 'carol' WHERE id = \(ids[0])")
        #expect(try await brokenAt() == ids[0])
        try await backend.execute(dir, "UPDATE audit SET detail = 'bob' WHERE id = \(ids[0])")
        #expect(try await queue.verifyChain() == whole, "put back as it was, it holds again")
        // A hash cleared.
        try await backend.execute(dir, "UPDATE audit SET hash = NULL WHERE id = \(ids[4])")
        let cleared = try await queue.verifyChain()
        #expect(cleared.brokenAt == ids[4] && cleared.broken?.contains("no hash") == true && cleared.breaks == 2 && cleared.entries == 6, "\(cleared)")
        // A removal: the next entry no longer follows.
        try await backend.execute(dir, "DELETE FROM audit WHERE id = \(ids[4])")
        let removed = try await queue.verifyChain()
        #expect(removed.brokenAt == ids[5] && removed.broken?.contains("does not follow entry \(ids[3])") == true, "\(removed)")
        // An entry moved to the end, hash and all: the one after its old place no longer follows.
        try await backend.execute(dir, "INSERT INTO audit (at, actor, action, detail, hash) SELECT at, actor, action, detail, hash FROM audit WHERE id = \(ids[1])")
        try await backend.execute(dir, "DELETE FROM audit WHERE id = \(ids[1])")
        let moved = try await queue.verifyChain()
        #expect(moved.brokenAt == ids[2] && moved.breaks == 3, "its old place, then its new one after the last: \(moved)")
        // An entry written now chains on after the last one: the breaks stay where they are.
        try await queue.record(actor: "carol", action: "search", detail: "later", at: Date())
        #expect(try await queue.verifyChain().breaks == 3)
    }

    /// Writers on separate connections (the nodes of a cluster) chain one after another: the
    /// log verifies whole after they all wrote at once.
    @Test(arguments: Backend.all)
    func concurrentWritersChainInIdOrder(_ backend: Backend) async throws {
        let one = try await backend.pulls(dir), two = try await backend.pulls(dir)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (n, queue) in [one, two].enumerated() {
                group.addTask {
                    for i in 0..<40 { try await queue.record(actor: "node-\(n)", action: "search", detail: "q=\(i)", at: Date()) }
                }
            }
            try await group.waitForAll()
        }
        let verdict = try await one.verifyChain()
        #expect(verdict.intact && verdict.entries == 80, "\(verdict)")
    }
}
