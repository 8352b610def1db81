import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation

/// Live tails (#53), one set of actions for the API, the console and (through the API) the
/// command line: start one, list and read them, stop one, and watch one as it arrives.
extension AdminActions {
    /// Tails one caller may have open at once, and one server.
    public static let maxOpenTailsPerCaller = 5
    public static let maxOpenTails = 100

    private func tailRegistry() throws -> any TailRegistry {
        guard let tails = services.tails else { throw ActionError(.unavailable, "this server runs no live tails") }
        return tails
    }

    /// Starts a tail of `request.uid`'s devices: checked, capped (per caller and per server),
    /// stored with its `tail` audit entry, and the devices connected that hold the uid woken to
    /// be sent it. A scoped caller's tail reaches the devices of its scope that hold the uid now,
    /// and no other later. Under required approvals a tail is refused: it cannot wait for a
    /// second person (a pull can).
    public func createTail(_ request: TailRequest, by caller: Caller, via surface: String) async throws -> TailRecord {
        let tails = try tailRegistry()
        if let problem = UserID.problem(request.uid) { throw ActionError(.invalid, "uid: \(problem)") }
        var filter = request.filter
        if let uid = filter.uid, uid != request.uid { throw ActionError(.invalid, "the filter's uid is not the tail's uid") }
        (filter.uid, filter.since, filter.until) = (request.uid, nil, nil)
        if let problem = filter.problem { throw ActionError(.invalid, problem) }
        let reason = request.reason ?? ""
        if let problem = reasonProblem(reason) { throw ActionError(.invalid, problem) }
        let seconds = request.durationSeconds ?? TailRequest.defaultDuration
        guard (1...Int(WireLimits.maxTailDurationMicroseconds / 1_000_000)).contains(seconds) else {
            throw ActionError(.invalid, "a tail runs from 1 second to \(WireLimits.maxTailDurationMicroseconds / 60_000_000) minutes")
        }
        let records = request.recordsPerSecond ?? TailRequest.defaultRecordsPerSecond
        let bytes = request.bytesPerSecond ?? TailRequest.defaultBytesPerSecond
        guard WireLimits.tailRecordRate.contains(records), WireLimits.tailByteRate.contains(bytes) else {
            throw ActionError(.invalid, "rates are \(WireLimits.tailRecordRate) records/s and \(WireLimits.tailByteRate) bytes/s")
        }
        let verboseTypes = request.verboseTypes ?? []
        for name in verboseTypes where LogType(name) == nil { throw ActionError(.invalid, "verbose type \(name.prefix(64).debugDescription) is not a type name") }
        if let agent = request.agent, !WireID.isValid(agent) { throw ActionError(.invalid, "agent id must be 32 lowercase hex characters") }
        if services.approvals.isRequired {
            throw ActionError(
                .forbidden, "this deployment requires a second person's approval to read a user's logs, and a live tail cannot wait for one: make a pull instead",
                code: "approval_required")
        }

        // Which devices: those named (an agent, a host), within the caller's scope; nil: any that holds the uid.
        let scope = try await scopedAgents(caller)
        var agents: [String]?
        if request.agent != nil || request.host != nil || scope != nil {
            let holders = Set(try await services.registry.holders(of: request.uid).map(\.agentID))
            var chosen = try await services.registry.agents().filter { agent in
                (request.agent.map { $0 == agent.agentID } ?? true) && (request.host.map { $0 == agent.hostname } ?? true) && (scope?.contains(agent.agentID) ?? true)
            }.map(\.agentID)
            // A scoped caller reaches the devices that hold the uid now; a named device may come to hold it.
            if scope != nil { chosen = chosen.filter(holders.contains) }
            guard !chosen.isEmpty else {
                throw ActionError(.notFound, "no device \(request.agent.map { "\($0) " } ?? "")\(request.host.map { "of host \($0) " } ?? "")that \(scope == nil ? "" : "is in \(caller.name)'s scope and ")holds uid \(request.uid)", code: "no_agent")
            }
            agents = chosen.sorted()
        }

        let now = Timestamp(self.now())
        if try await tails.openCount(requestedBy: caller.name, now: now) >= Self.maxOpenTailsPerCaller {
            throw ActionError(.conflict, "\(caller.name) has \(Self.maxOpenTailsPerCaller) tails open: stop one first (dredge tail --stop ID)", code: "too_many_tails")
        }
        if try await tails.openCount(requestedBy: nil, now: now) >= Self.maxOpenTails {
            throw ActionError(.conflict, "the server runs \(Self.maxOpenTails) tails already: try again later", code: "too_many_tails")
        }
        let tail = services.issuer.newTail(
            uid: request.uid, agents: agents, filter: filter, lifetime: .seconds(seconds), recordsPerSecond: records, bytesPerSecond: bytes,
            verbose: request.verbose ?? false, verboseTypes: verboseTypes, requestedBy: caller.name, reason: reason, now: now)
        var made = tail
        made.urgent = request.urgent ?? false
        try await tails.create(made)
        // The devices connected here that hold the uid are sent it now; others when they connect or come to hold it.
        let holders = try await services.registry.holders(of: request.uid).map(\.agentID).filter { agents?.contains($0) ?? true }
        services.dispatcher.wake(holders, with: nil)
        logger.info("tail started", metadata: ["tail.id": "\(tail.id)", "by": "\(caller.name)", "holders": "\(holders.count)", "via": "\(surface)"])
        guard let stored = try await tails.tail(tail.id) else { throw ActionError(.conflict, "tail \(tail.id) was removed as it was made") }
        return stored
    }

    /// The tails the caller may see, newest first: every one for an unscoped caller, its own for
    /// a scoped one.
    public func tails(limit: Int, for caller: Caller) async throws -> [TailRecord] {
        let all = try await tailRegistry().tails(limit: max(0, min(limit, 1_000)))
        return caller.scope.isEverything ? all : all.filter { $0.requestedBy == caller.name }
    }

    public func tail(_ id: String, for caller: Caller) async throws -> TailRecord {
        let id = try Self.checkedID(id, "tail")
        guard let tail = try await tailRegistry().tail(id), caller.scope.isEverything || tail.requestedBy == caller.name else {
            throw ActionError(.notFound, "no tail \(id)")
        }
        return tail
    }

    /// Stops a tail: its requester or an admin may. Its devices stop sending and its watchers
    /// end; audited (`tail.stop`). A tail stopped before is a conflict, with who stopped it.
    public func stopTail(_ id: String, by caller: Caller, reason: String) async throws -> TailRecord {
        let tail = try await self.tail(id, for: caller)
        guard tail.requestedBy == caller.name || caller.role == .admin else {
            throw ActionError(.forbidden, "\(tail.requestedBy) started tail \(tail.id): they or an admin stop it", code: "forbidden")
        }
        if let problem = reasonProblem(reason) { throw ActionError(.invalid, problem) }
        let at = now()
        if !tail.isOpen(at: Timestamp(at)) && tail.stopped == nil {
            // Expired and not yet marked: marked now, by the server.
            _ = try await tailRegistry().stop(tail.id, by: TailRows.server, reason: "expired", at: at)
            services.tailHub.stopped(tail.id, reason: "expired", agents: tail.parts.map(\.agentID))
        }
        guard let mark = try await tailRegistry().stop(tail.id, by: caller.name, reason: reason.isEmpty ? "stopped by \(caller.name)" : reason, at: at) else {
            throw ActionError(.notFound, "no tail \(tail.id)")
        }
        guard mark.isNew, let stopped = mark.tail.stopped else {
            let before = mark.tail.stopped
            throw ActionError(.conflict, "tail \(tail.id) stopped already\(before.map { " (\($0.by): \($0.reason))" } ?? "")", code: "stopped")
        }
        services.tailHub.stopped(tail.id, reason: stopped.reason, agents: mark.tail.parts.map(\.agentID))
        logger.info("tail stopped", metadata: ["tail.id": "\(tail.id)", "by": "\(caller.name)"])
        return mark.tail
    }

    /// Starts watching a tail here: its requester or an admin may. The watcher gets what the
    /// devices send from now on (``TailHub``); the caller unsubscribes it when done.
    public func watchTail(_ id: String, by caller: Caller) async throws -> (tail: TailRecord, watcher: TailHub.Watcher) {
        let tail = try await self.tail(id, for: caller)
        guard tail.requestedBy == caller.name || caller.role == .admin else {
            throw ActionError(.forbidden, "\(tail.requestedBy) started tail \(tail.id): they or an admin watch it", code: "forbidden")
        }
        guard let watcher = services.tailHub.subscribe(tail.id) else {
            throw ActionError(.conflict, "tail \(tail.id) has \(TailHub.watchersPerTail) watchers on this server already", code: "too_many_watchers")
        }
        // Read again once subscribed: a stop in between would otherwise go unseen.
        let now: TailRecord
        do {
            guard let read = try await tailRegistry().tail(tail.id) else { throw ActionError(.notFound, "no tail \(tail.id)") }
            now = read
        } catch {
            services.tailHub.unsubscribe(watcher)
            throw error
        }
        if let stopped = now.stopped {
            watcher.end(stopped.reason)
        } else if !now.isOpen(at: Timestamp(self.now())) {
            watcher.end("expired")
        }
        return (now, watcher)
    }

    /// Stops, by `server`, the open tails `requester` started (their token was revoked).
    func stopTails(of requester: String, because reason: String) async throws {
        guard let tails = services.tails else { return }
        let at = now()
        for tail in try await tails.tails(limit: 1_000) where tail.requestedBy == requester && tail.isOpen(at: Timestamp(at)) {
            guard let mark = try await tails.stop(tail.id, by: TailRows.server, reason: reason, at: at), mark.isNew else { continue }
            services.tailHub.stopped(tail.id, reason: reason, agents: mark.tail.parts.map(\.agentID))
            logger.notice("tail stopped: its token was revoked", metadata: ["tail.id": "\(tail.id)", "by": "\(requester)"])
        }
    }
}
