import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Logging

/// What an engineer can do, once, for every surface: the admin API and the console are
/// adapters over these (they read requests and render answers; the rules, the validation and
/// the audit entries are here). A rule a user sees on both surfaces is tested once, through
/// the action (`AdminActionsTests`).
///
/// Each action takes the ``Caller`` (the admin token, or the signed-in session's) and throws
/// ``ActionError`` for what the caller can mend; anything else is the server's fault. Whether
/// the caller's role may run an action at all is checked where a request enters
/// (``authorize(_:_:on:)``, by ``AdminOperation``); what it may see, its scope, is applied here.
/// The audit throttles are shared by both surfaces: a search paged through the API and read
/// again in the console within ten minutes is one entry.
public final class AdminActions: Sendable {
    public let services: AdminServices
    /// Searches and record reads: one entry per actor and filter in ten minutes.
    let searchAudit = SearchAudit()
    /// Downloads: one entry per actor and device's files of a pull (or whole zip, or
    /// feedback) in ten minutes (see FileActions.swift).
    let downloadAudit = SearchAudit()
    /// Refused tokens: one entry per host a minute, the rest counted.
    let refusals = RefusalAudit()
    /// Refused operations (``authorize(_:_:on:)``): one entry per caller and operation in ten
    /// minutes, the rest counted.
    let deniedAudit = AuditThrottle(interval: 600)
    /// The wall clock the throttles and new tokens read; a test injects its own.
    let now: @Sendable () -> Date

    public init(_ services: AdminServices, now: @escaping @Sendable () -> Date = { Date() }) {
        self.services = services
        self.now = now
    }

    var logger: Logger { services.logger }

    // MARK: Pulls

    /// Makes a pull: checked (``PullQueue/create(_:registry:issuer:requestedBy:scope:logger:now:isConnected:wake:)``),
    /// queued with its audit entry, and its connected targets woken. A scoped caller's pull
    /// reaches only the devices of its scope (an agent outside it is no agent).
    public func createPull(_ request: PullRequest, by caller: Caller, via surface: String) async throws -> PullRecord {
        let s = services
        let pull: PullRecord
        do {
            let scope = try await scopedAgents(caller).map { PullScope(scope: caller.scope, agents: $0) }
            let approval = s.approvals.isRequired
            if approval, (request.reason ?? "").trimmingCharacters(in: .whitespaces).isEmpty {
                throw ActionError(.invalid, "this deployment requires a reason (a ticket, say) with each pull, for the person who approves it", code: "reason_required")
            }
            pull = try await s.pulls.create(
                request, registry: s.registry, issuer: s.issuer, requestedBy: caller.name, scope: scope, approvalRequired: approval, logger: s.logger,
                isConnected: s.dispatcher.isConnected
            ) {
                s.dispatcher.wake($0, with: $1)
            }
        } catch let error as PullRequestError {
            switch error {
            case .unknownAgent: throw ActionError(.notFound, error.description, code: "no_agent")
            case .noTarget, .invalid: throw ActionError(.invalid, error.description)
            }
        }
        logger.info("pull queued", metadata: ["pull.id": "\(pull.id)", "by": "\(pull.requestedBy)", "targets": "\(pull.targets.count)", "via": "\(surface)"])
        return pull
    }

    /// Approves a pull that waits for a second person (#55): the approver may be any
    /// investigator or admin except the one who asked, whose scope holds every device the pull
    /// reaches (an unscoped pull by uid, which devices may join later, needs an unscoped
    /// approver). Its devices are then sent it. Refusals: not found (or wholly outside the
    /// scope), not waiting (approved already, removed, expired: a conflict), one's own pull or
    /// devices beyond the approver's scope (forbidden).
    public func approvePull(_ id: String, by caller: Caller) async throws -> PullRecord {
        let id = try Self.checkedID(id, "pull")
        guard let pull = try await services.pulls.pull(id, now: Timestamp(now())) else { throw ActionError(.notFound, "no pull \(id)") }
        let agents = try await scopedAgents(caller)
        if let agents {
            // One that reached none of the scope's devices is no pull; one that may reach others is not this approver's.
            guard pull.targets.contains(where: { agents.contains($0.agentID) }) else { throw ActionError(.notFound, "no pull \(id)") }
            guard pull.targets.allSatisfy({ agents.contains($0.agentID) }), !(pull.agentID.isEmpty && pull.scope == nil) else {
                throw ActionError(
                    .forbidden, "pull \(pull.id) may reach devices outside \(caller.name)'s scope: an approver whose scope holds them all approves it", code: "forbidden")
            }
        }
        guard let approval = pull.approval else { throw ActionError(.conflict, "pull \(pull.id) needs no approval") }
        if let by = approval.approvedBy, let at = approval.approvedAt {
            throw ActionError(.conflict, "pull \(pull.id) was approved already, by \(by) at \(Timestamp(at).rfc3339)")
        }
        guard pull.requestedBy != caller.name else {
            throw ActionError(.forbidden, "\(caller.name) asked for pull \(pull.id): another person approves it", code: "own_request")
        }
        guard pull.removed == nil else { throw ActionError(.conflict, "pull \(pull.id) was removed") }
        let at = Timestamp(now())
        guard pull.expiresAt > at else { throw ActionError(.conflict, "pull \(pull.id) expired unapproved") }
        guard let approved = try await services.pulls.approve(pull.id, by: caller.name, now: at) else {
            throw ActionError(.conflict, "pull \(pull.id) no longer waits for approval (approved, removed or expired meanwhile)")
        }
        services.dispatcher.wake(approved.targets.map(\.agentID), with: nil)
        logger.notice("pull approved", metadata: ["pull.id": "\(pull.id)", "by": "\(caller.name)", "requested by": "\(pull.requestedBy)"])
        return agents.flatMap { Self.pull(approved, within: $0) } ?? approved
    }

    /// Removes a pull's or a feedback's results (files and index rows); the record stays.
    /// No such pull or feedback is ``ActionError/Kind/notFound``.
    public func remove(_ kind: RemovalReport.Kind, _ id: String, by caller: Caller, reason: String) async throws -> RemovalReport {
        let actor = caller.name
        guard let results = services.results else { throw ActionError(.unavailable, "this server does not remove results") }
        guard WireID.isValid(id) else { throw ActionError(.invalid, "\(kind.rawValue) id must be 32 lowercase hex characters") }
        if let problem = reasonProblem(reason) { throw ActionError(.invalid, problem) }
        // A tail still running is stopped first, through the hub: its devices and watchers are told.
        if kind == .tail, let tails = services.tails, let tail = try await tails.tail(id), tail.stopped == nil {
            let stopReason = "its records were removed" + (reason.isEmpty ? "" : ": \(reason)")
            if let mark = try await tails.stop(id, by: actor, reason: stopReason, at: now()), mark.isNew {
                services.tailHub.stopped(id, reason: stopReason, agents: mark.tail.parts.map(\.agentID))
            }
        }
        let report: RemovalReport?
        do {
            report = try await results.remove(kind, id, by: actor, reason: reason)
        } catch let busy as ResultsKeeper.RemovalInProgress {
            throw ActionError(.conflict, busy.description)
        }
        guard let report else { throw ActionError(.notFound, "no \(kind.rawValue) \(id)") }
        logger.info("\(kind.rawValue) removed", metadata: ["\(kind.rawValue).id": "\(id)", "by": "\(actor)", "bytes": "\(report.freedBytes)"])
        return report
    }

    // MARK: Agents

    /// Revokes an agent (a lost or stolen device, a decommissioned host): its connection ends
    /// at once, on whichever node holds it; it may not authenticate again; pulls by uid no
    /// longer reach it; what it uploaded is kept. Audited with the reason. Revoking one revoked
    /// already changes nothing and says since when (a conflict).
    public func revokeAgent(_ id: String, reason: String?, by caller: Caller) async throws -> AgentRecord {
        let actor = caller.name
        let id = try Self.checkedID(id, "agent")
        if let reason, let problem = reasonProblem(reason) { throw ActionError(.invalid, problem) }
        switch try await services.registry.revoke(id, by: actor, at: now()) {
        case .unknown: throw ActionError(.notFound, "no agent \(id)")
        case .alreadyRevoked(let since): throw ActionError(.conflict, "agent \(id) was revoked already, at \(since.formatted(.iso8601))")
        case .revoked: break
        }
        services.dispatcher.revoked(id)
        let why = reason.map { $0.trimmingCharacters(in: .whitespaces) }.flatMap { $0.isEmpty ? nil : $0 }
        try await services.audit.record(actor: actor, .agentRevoke, detail: "agent \(id)" + (why.map { ": \($0)" } ?? ""))
        logger.notice("agent revoked", metadata: ["agent.id": "\(id)", "by": "\(actor)"])
        guard let agent = try await services.registry.agents().first(where: { $0.agentID == id }) else { throw ActionError(.notFound, "no agent \(id)") }
        return agent
    }

    // MARK: Tokens

    /// Makes a token: any token may expire; an enrollment token may have a number of uses, an
    /// admin token a role and a scope (``TokenRequest/limitsProblem``).
    public func createToken(_ request: TokenRequest, by caller: Caller) async throws -> TokenCreated {
        let (name, kind) = (request.name, request.kind)
        if let problem = request.limitsProblem { throw ActionError(.invalid, problem) }
        let at = now()
        let limits = TokenLimits(
            expiresAt: request.expiresInSeconds.map { at.addingTimeInterval(TimeInterval($0)) }, uses: request.uses, role: request.role ?? .admin,
            scope: request.scope ?? .everything)
        let created: TokenCreated
        do {
            created = try await services.tokens.create(name: name, kind: kind, limits: limits, now: at)
        } catch let error as TokenError {
            throw ActionError(error == .exists(name) ? .conflict : .invalid, error.description)
        }
        var detail = "\(kind.rawValue) token '\(name)'"
        if kind == .admin { detail += ", role \(limits.role.rawValue)" + (limits.scope.isEverything ? "" : ", scope \(limits.scope)") }
        if let expiresAt = created.info.expiresAt { detail += ", expires \(Timestamp(expiresAt).rfc3339)" }
        if let uses = request.uses { detail += ", \(uses) use\(uses == 1 ? "" : "s")" }
        try await services.audit.record(actor: caller.name, .tokenCreate, detail: ConnectionUploads.bounded(detail))
        return created
    }

    public func revokeToken(name: String, kind: TokenKind, by caller: Caller) async throws {
        let actor = caller.name
        do {
            try await services.tokens.revoke(name: name, kind: kind)
        } catch let error as TokenError {
            throw ActionError(error == .lastAdmin ? .conflict : .notFound, error.description)
        }
        try await services.audit.record(actor: actor, .tokenRevoke, detail: "\(kind.rawValue) token '\(name)'")
        // Its live tails stop with it (Protocol § 20, Stopping).
        if kind == .admin { try await stopTails(of: Caller.person(ofToken: name), because: "the token of \(name) was revoked") }
    }

    // MARK: Records

    /// A page of records: the search checked, narrowed to the caller's scope, run, and
    /// audited (``searchAudit``). Nothing outside the scope is read, or counted.
    public func search(_ search: RecordSearch, by caller: Caller) async throws -> RecordPage {
        try Self.check(search)
        var page = try await page(search, caller)
        // What waits to be indexed is the whole server's: told to unscoped callers only.
        if caller.scope.isEverything, let indexer = services.indexer { page.indexing += indexer.queued } else if !caller.scope.isEverything { page.indexing = 0 }
        try await searchOpened(search, by: caller)
        return page
    }

    /// Audits a search whose pages are read by the caller itself (the console's follow).
    public func searchOpened(_ search: RecordSearch, by caller: Caller) async throws {
        try await searchAudit.record(.recordsSearch, actor: caller.name, detail: Self.describe(search), in: services.audit, now: now())
    }

    /// The next page of a followed search (``searchOpened(_:by:)`` audited it once, not per page).
    public func followed(_ search: RecordSearch, by caller: Caller) async throws -> RecordPage {
        try Self.check(search)
        return try await page(search, caller)
    }

    /// A page of a search checked already, narrowed to the caller's scope.
    private func page(_ search: RecordSearch, _ caller: Caller) async throws -> RecordPage {
        guard let narrowed = try await scoped(search, caller) else { return .empty }
        return try await indexed(narrowed, .page) { try await $0.search(narrowed) }
    }

    /// `search` narrowed to the devices of `caller`'s scope, and to its apps; nil when the
    /// scope leaves nothing to search (nothing is then read). Unscoped callers' searches are as asked.
    func scoped(_ search: RecordSearch, _ caller: Caller) async throws -> RecordSearch? {
        guard let agents = try await scopedAgents(caller) else { return search }
        var narrowed = search
        let asked = search.agents.flatMap { $0.isEmpty ? nil : Set($0) }
        narrowed.agents = agents.filter { asked?.contains($0) ?? true }.sorted()
        if let apps = caller.scope.appNames {
            narrowed.apps = (search.apps.flatMap { $0.isEmpty ? nil : $0 } ?? apps.sorted()).filter(apps.contains)
            if narrowed.apps?.isEmpty == true { return nil }
        }
        return narrowed.agents?.isEmpty == true ? nil : narrowed
    }

    /// `read` on the index, for a search checked first; the index's refusal as an invalid request.
    /// Its time is measured as a search of `kind` (`GET /metrics`).
    private func indexed<T>(_ search: RecordSearch, _ kind: ServerMetrics.SearchKind, _ read: (any RecordIndex) async throws -> T) async throws -> T {
        guard let records = services.records else { throw ActionError(.unavailable, "this server does not index records") }
        do {
            let start = ContinuousClock.now
            let value = try await read(records)
            services.metrics?.searched(kind, took: ContinuousClock.now - start)
            return value
        } catch let error as RecordSearchError {
            throw ActionError(.invalid, error.description)
        }
    }

    /// How many records a search matches, per level, per host and over time: checked as a
    /// search is, and audited as one (the audit's throttle keeps a page and its counts one entry).
    public func stats(_ search: RecordSearch, by caller: Caller) async throws -> RecordStats {
        try Self.check(search)
        let counted = RecordStats.counted(search)
        var stats = RecordStats()
        if let narrowed = try await scoped(counted, caller) { stats = try await indexed(narrowed, .stats) { try await $0.stats(narrowed) } }
        try await searchOpened(search, by: caller)
        return stats
    }

    /// The types, hosts and apps the records have, for telling a filter's typo. A scoped
    /// caller is told only the hosts and apps of its scope.
    public func vocabulary(for caller: Caller) async throws -> RecordVocabulary {
        guard let records = services.records else { throw ActionError(.unavailable, "this server does not index records") }
        var vocabulary = try await records.vocabulary()
        guard !caller.scope.isEverything else { return vocabulary }
        let agents = try await services.registry.agents().filter(caller.admits)
        let hosts = Set(agents.map(\.hostname)), apps = caller.scope.appNames
        vocabulary.hosts = vocabulary.hosts.filter(hosts.contains)
        if let apps { vocabulary.apps = vocabulary.apps.filter(apps.contains) }
        return vocabulary
    }

    /// A record with up to `context` records of its source on each side, audited; nil when no
    /// record has the id, or the caller's scope does not reach it.
    public func record(_ id: Int64, context: Int, by caller: Caller) async throws -> RecordInContext? {
        let actor = caller.name
        guard let records = services.records else { throw ActionError(.unavailable, "this server does not index records") }
        guard id > 0 else { throw ActionError(.invalid, "a record id is a positive integer") }
        guard (0...RecordInContext.maximumContext).contains(context) else {
            throw ActionError(.invalid, "context is a number of records from 0 to \(RecordInContext.maximumContext)")
        }
        guard var found = try await records.record(id, context: context) else { return nil }
        if let agents = try await scopedAgents(caller) {
            let apps = caller.scope.appNames
            func reaches(_ r: FoundRecord) -> Bool { agents.contains(r.agentID) && apps.map { $0.contains(r.app) } ?? true }
            guard reaches(found.record) else { return nil }
            found.before = found.before.filter(reaches)
            found.after = found.after.filter(reaches)
        }
        try await searchAudit.record(.recordsRead, actor: actor, detail: "record \(id) context \(context)", in: services.audit, now: now())
        return found
    }

    /// Ids in a search have the protocol's form, a uid the store's rules; texts hold no control
    /// characters, and lists are bounded.
    public static func check(_ search: RecordSearch) throws {
        func bad(_ message: String) -> ActionError { ActionError(.invalid, message) }
        let lists: [(String, Int)] = [
            ("agents", search.agents?.count ?? 0), ("hosts", search.hosts?.count ?? 0), ("apps", search.apps?.count ?? 0),
            ("levels", search.levels?.count ?? 0), ("types", search.types?.count ?? 0), ("metadata", search.metadata?.count ?? 0),
        ]
        for (name, count) in lists where count > 64 { throw bad("at most 64 \(name) in one search") }
        let texts = [search.text].compactMap { $0 } + (search.hosts ?? []) + (search.apps ?? []) + (search.types ?? [])
            + (search.metadata ?? []).flatMap { [$0.key, $0.value] }
        for text in texts {
            if text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) { throw bad("a search text holds a control character") }
            if text.utf8.count > 4096 { throw bad("a search text is longer than 4096 bytes") }
        }
        for time in [search.since, search.until].compactMap({ $0 }) where !time.isAccepted {
            throw bad("times must lie between 1970 and 9999")
        }
        for (id, what) in [(search.pull, "pull"), (search.feedback, "feedback"), (search.capture, "capture")] {
            if let id, !WireID.isValid(id) { throw bad("\(what) id must be 32 lowercase hex characters") }
        }
        for agent in search.agents ?? [] where !WireID.isValid(agent) { throw bad("agent id must be 32 lowercase hex characters") }
        if let uid = search.uid, let problem = UserID.problem(uid) { throw bad("uid: \(problem)") }
        if let reason = search.reason, let problem = reasonProblem(reason) { throw bad(problem) }
        if let since = search.since, let until = search.until, until <= since { throw bad("until must be after since") }
    }

    /// A search as the audit log shows it: each narrowing, readably.
    public static func describe(_ s: RecordSearch) -> String {
        var parts: [String] = []
        if let uid = s.uid { parts.append("uid=\(uid)") }
        if let agents = s.agents, !agents.isEmpty { parts.append("agent=\(agents.joined(separator: ","))") }
        if let hosts = s.hosts, !hosts.isEmpty { parts.append("host=\(hosts.joined(separator: ","))") }
        if let apps = s.apps, !apps.isEmpty { parts.append("app=\(apps.joined(separator: ","))") }
        if let pull = s.pull { parts.append("pull=\(pull)") }
        if let feedback = s.feedback { parts.append("feedback=\(feedback)") }
        if let capture = s.capture { parts.append("capture=\(capture)") }
        if let since = s.since { parts.append("since=\(since.rfc3339)") }
        if let until = s.until { parts.append("until=\(until.rfc3339)") }
        if let levels = s.levels, !levels.isEmpty { parts.append("level=\(levels.joined(separator: ","))") }
        if let types = s.types, !types.isEmpty { parts.append("type=\(types.joined(separator: ","))") }
        if let text = s.text { parts.append("text=\(text.debugDescription)") }
        for m in s.metadata ?? [] { parts.append("where \(m.key)=\(m.value)") }
        if let reason = s.reason, !reason.isEmpty { parts.append("reason=\(reason.debugDescription)") }
        return ConnectionUploads.bounded(parts.isEmpty ? "everything" : parts.joined(separator: " "))
    }

    // MARK: Sign-in

    /// A token that is not an admin token (for `what`, from `source`, `host:port`), recorded as
    /// `auth.failed` at most once a minute per host, the refusals in between counted. Never
    /// throws: a refusal the log cannot hold is logged.
    public func refusedToken(_ why: String, for what: String, from source: String) async {
        // The host alone: each new connection has a new port.
        let host = source.split(separator: ":").dropLast().joined(separator: ":")
        guard let suppressed = refusals.admit(host: host.isEmpty ? source : host, now: now()) else { return }
        let detail = "\(why) for \(what) from \(source)" + (suppressed > 0 ? " (and \(suppressed) more from that host not recorded)" : "")
        do {
            try await services.audit.record(actor: "-", .authFailed, detail: detail)
        } catch {
            logger.error("could not record a refused admin token in the audit log", metadata: ["error": "\(error)"])
        }
    }

    /// A console sign-in, recorded first: one the audit log cannot hold does not happen.
    public func signedIn(_ caller: Caller, from source: String) async throws {
        try await services.audit.record(actor: caller.name, .consoleSignIn, detail: "from \(source) as \(caller.role.rawValue)" + (caller.scope.isEverything ? "" : " of \(caller.scope)"))
    }

    /// A short-lived admin token for a person single sign-on vouched for (`dredge login --sso`):
    /// their role, scope and expiry (`caller`, from their groups), named for them
    /// (``TokenLimits/signedOnName(subject:)``), recorded as `token.create` by the person. One
    /// the audit log cannot hold is revoked again before anyone sees it.
    public func signedOnToken(for caller: Caller, shown: String, from source: String) async throws -> TokenCreated {
        guard caller.name.hasPrefix(SingleSignOn.namePrefix), let expiresAt = caller.expiresAt else { throw ActionError(.invalid, "only a signed-on person with an expiry gets such a token") }
        let name = TokenLimits.signedOnName(subject: String(caller.name.dropFirst(SingleSignOn.namePrefix.count)))
        let created: TokenCreated
        do {
            created = try await services.tokens.create(
                name: name, kind: .admin, limits: TokenLimits(expiresAt: expiresAt, role: caller.role, scope: caller.scope, signedOn: true), now: now())
        } catch let error as TokenError {
            throw ActionError(.invalid, error.description)
        }
        var detail = "admin token '\(name)' for dredge login --sso from \(source) (\(shown)), role \(caller.role.rawValue)"
        if !caller.scope.isEverything { detail += ", scope \(caller.scope)" }
        detail += ", expires \(Timestamp(expiresAt).rfc3339)"
        do {
            try await services.audit.record(actor: caller.name, .tokenCreate, detail: ConnectionUploads.bounded(detail))
        } catch {
            try await services.tokens.revoke(name: name, kind: .admin)
            throw error
        }
        return created
    }

    public func signedOut(_ name: String) async throws {
        try await services.audit.record(actor: name, .consoleSignOut, detail: "")
    }
}

/// Why an action was refused, for the caller to mend: each surface shows it its own way (the
/// API as a status and a JSON error code, the console as a sentence on the page).
public struct ActionError: Error, CustomStringConvertible, Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// The request breaks a rule (400).
        case invalid
        /// What it names does not exist (404).
        case notFound
        /// It clashes with what is there (409): a name taken, the last admin token, a removal
        /// under way.
        case conflict
        /// This server does not do that (503): no index, no files, no removal.
        case unavailable
        /// The caller's role may not do that (403).
        case forbidden
    }

    public let kind: Kind
    public let message: String
    /// The API's error code: by kind unless said.
    public let code: String

    public init(_ kind: Kind, _ message: String, code: String? = nil) {
        self.kind = kind
        self.message = message
        self.code = code ?? {
            switch kind {
            case .invalid: "bad_request"
            case .notFound: "not_found"
            case .conflict: "conflict"
            case .unavailable: "unavailable"
            case .forbidden: "forbidden"
            }
        }()
    }

    public var description: String { message }
}

extension AuditLog {
    /// Records one of the audit log's actions.
    public func record(actor: String, _ action: AuditAction, detail: String, at: Date = Date()) async throws {
        try await record(actor: actor, action: action.rawValue, detail: detail, at: at)
    }
}
