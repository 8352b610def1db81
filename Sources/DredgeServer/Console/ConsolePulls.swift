import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Hummingbird
import Mustache
import ServiceLifecycle
import Synchronization

/// The console's pulls: the list, a new pull, and one pull with each agent's progress — what
/// `dredge pulls`, `dredge pull` and `dredge show` do.
extension Console {
    /// The time ranges the new-pull form offers.
    enum Range: String, CaseIterable {
        case hour = "1h", today, twoDays = "2d", custom

        var label: String {
            switch self {
            case .hour: "last hour"
            case .today: "today"
            case .twoDays: "last 2 days"
            case .custom: "from … to …"
            }
        }
    }

    /// A new-pull form's fields as a request, or what is wrong with them (the CLI's rules:
    /// levels and types by name, times within 1970–9999, until after since).
    static func pullRequest(_ form: [String: String], now: Timestamp) -> Result<PullRequest, PullRequestError> {
        func field(_ name: String) -> String? {
            let value = (form[name] ?? "").trimmingCharacters(in: .whitespaces)
            return value.isEmpty ? nil : value
        }
        var filter = LogFilter()
        // Dates typed in are a custom range, whichever button is pressed.
        let range = field("since") != nil || field("until") != nil ? .custom : Range(rawValue: form["range"] ?? "2d")
        switch range {
        case .hour?: filter.since = now.adding(.seconds(-3600))
        case .today?: filter.since = Timestamp(userInput: "today", now: now, timeZone: displayZone)
        case .twoDays?: filter.since = now.adding(.seconds(-2 * 86_400))
        case .custom?:
            func time(_ name: String) -> Result<Timestamp?, PullRequestError> {
                guard let text = field(name) else { return .success(nil) }
                guard let time = timeInput(text, now: now) else { return .failure(.invalid(timeInputProblem(name))) }
                return .success(time)
            }
            switch (time("since"), time("until")) {
            case (.success(let since), .success(let until)):
                guard since != nil || until != nil else { return .failure(.invalid("a custom range needs a start, an end, or both")) }
                filter.since = since
                filter.until = until
            case (.failure(let error), _), (_, .failure(let error)): return .failure(error)
            }
        case nil: return .failure(.invalid("the range is one of \(Range.allCases.map(\.rawValue).joined(separator: ", "))"))
        }
        let levels = LogLevel.allCases.filter { form["level-\($0.name)"] != nil }
        if !levels.isEmpty { filter.levels = Set(levels) }
        if let types = field("types") {
            var set = Set<LogType>()
            for name in types.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !name.isEmpty {
                guard let type = LogType(name) else {
                    return .failure(.invalid("“\(name)” is not a log type: lowercase letters, digits, “.”, “-”, “_”, at most \(LogType.maxLength) bytes (app, network, …)"))
                }
                set.insert(type)
            }
            if !set.isEmpty { filter.types = set }
        }
        filter.text = form["text"].flatMap { $0.isEmpty ? nil : $0 }  // as typed, as `--grep` takes it
        return .success(PullRequest(uid: field("uid"), agent: field("agent"), filter: filter, reason: field("reason"), urgent: form["urgent"] == "on" ? true : nil))
    }

    /// A row of a pulls table (the pulls page, an agent's page).
    static func pullRow(_ pull: PullRecord, _ hosts: [String: String]) -> [String: Any] {
        let counts = Dictionary(grouping: pull.targets, by: \.status).map { "\($0.value.count) \($0.key.rawValue)" }.sorted()
        return [
            "id": pull.id, "shortID": String(pull.id.prefix(8)), "issuedAt": timeText(pull.issuedAt.date), "by": pull.requestedBy,
            "who": pull.uid.isEmpty ? "agent \(hosts[pull.agentID] ?? String(pull.agentID.prefix(8)))" : "uid \(pull.uid)", "reason": pull.reason ?? "",
            "status": pull.removed != nil
                ? "removed" : pull.isAwaitingApproval && pull.expiresAt > .now ? "awaiting approval" : counts.isEmpty ? "waiting for an agent" : counts.joined(separator: ", "),
        ]
    }

    static func registerPulls(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        console.get("pulls") { request, _ in
            guard let session = try await checked(request, d, .readPulls) else { return toSignIn(request) }
            var page = signedInPage("Pulls", session, current: "Pulls")
            let reason = (query(request)["reason"] ?? "").trimmingCharacters(in: .whitespaces)
            page["reason"] = reason
            page["filtered"] = !reason.isEmpty
            let hosts = try await d.actions.hostnames(for: session.caller)
            let pulls: [PullRecord]
            do {
                pulls = try await d.actions.pulls(limit: 100, reason: reason, disk: false, for: session.caller)
            } catch let error as ActionError {
                page["problem"] = sentence(error)
                return html(library, "pulls", page, status: AdminAPIError(error).status)
            }
            page["rows"] = pulls.map { pullRow($0, hosts) }
            return html(library, "pulls", page)
        }

        @Sendable func newPullPage(_ session: ConsoleSessions.Session, _ form: [String: String], problem: String?, status: HTTPResponse.Status) async throws
            -> Response
        {
            var page = signedInPage("New pull", session, current: "Pulls")
            for name in ["uid", "types", "text", "reason", "since", "until"] { page[name] = form[name] ?? "" }
            page["urgent"] = form["urgent"] == "on"
            let range = form["range"] ?? "2d"
            page["ranges"] = Range.allCases.map { ["value": $0.rawValue, "label": $0.label, "checked": $0.rawValue == range] }
            page["levels"] = LogLevel.allCases.map { ["name": $0.name, "checked": form["level-\($0.name)"] != nil] }
            page["agents"] = try await d.actions.agents(for: session.caller).sorted { $0.hostname < $1.hostname }.map { agent -> [String: Any] in
                ["id": agent.agentID, "label": "\(agent.hostname) (\(agent.agentID.prefix(8)))\(agent.connected ? "" : ", offline")", "selected": agent.agentID == form["agent"]]
            }
            if let problem { page["problem"] = problem }
            return html(library, "new-pull", page, status: status)
        }

        console.get("pulls/new") { request, _ in
            guard let session = try await checked(request, d, .createPull) else { return toSignIn(request) }
            var form: [String: String] = [:]
            for (key, value) in query(request) { form[key] = value }  // a link can fill it in (`?uid=…`)
            return try await newPullPage(session, form, problem: nil, status: .ok)
        }
        console.post("pulls") { request, context in
            let form = try await formFields(request, context)
            return try await asPoster(request, form, library, d, .createPull) { session in
                let pull: PullRecord
                do {
                    let asked = try pullRequest(form, now: .now).get()
                    pull = try await d.actions.createPull(asked, by: session.caller, via: "console")
                } catch let error as PullRequestError {
                    return try await newPullPage(session, form, problem: sentence(error), status: .badRequest)
                } catch let error as ActionError {
                    return try await newPullPage(session, form, problem: sentence(error), status: AdminAPIError(error).status)
                }
                return redirect("/console/pulls/\(pull.id)")
            }
        }

        console.get("pulls/:id") { request, context in
            guard let session = try await checked(request, d, .readPulls) else { return toSignIn(request) }
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such pull.") }
            let pull = try await d.actions.pull(id, disk: false, for: session.caller)
            let hosts = try await d.actions.hostnames(for: session.caller)
            var page = signedInPage("Pull \(pull.id.prefix(8))", session, current: "Pulls")
            page["id"] = pull.id
            page["who"] = pull.uid.isEmpty ? "agent \(hosts[pull.agentID] ?? pull.agentID)" : "uid \(pull.uid)" + (pull.agentID.isEmpty ? "" : " on agent \(hosts[pull.agentID] ?? pull.agentID)")
            page["filter"] = pull.filter.map(describe) ?? "its stored filter does not read back: the pull failed"
            page["by"] = pull.requestedBy
            if let reason = pull.reason { page["reason"] = reason }
            page["urgent"] = pull.urgent == true
            page["issuedAt"] = timeText(pull.issuedAt.date)
            page["expiresAt"] = timeText(pull.expiresAt.date)
            if let removed = pull.removed { page["removed"] = "removed \(timeText(removed.at)) by \(removed.by)" + (removed.reason.isEmpty ? "" : " (\(removed.reason))") }
            if let approval = pull.approval {
                if let by = approval.approvedBy, let at = approval.approvedAt {
                    page["approved"] = "by \(by), \(timeText(at))"
                } else if pull.removed == nil, pull.expiresAt > .now {
                    page["awaiting"] = true
                    // Another investigator or admin approves it: the one who asked is not offered the button.
                    page["mayApprove"] = session.caller.role >= AdminOperation.approvePull.leastRole && session.caller.name != pull.requestedBy ? true : nil
                } else {
                    page["approved"] = pull.removed != nil ? "never: it was removed first" : "never: it expired unapproved"
                }
            }
            page["targets"] = pull.targets.map { target -> [String: Any] in
                let progress = TargetProgress(target)
                return [
                    "host": hosts[target.agentID] ?? "?", "agentID": target.agentID, "shortID": String(target.agentID.prefix(8)), "status": progress.status,
                    "detail": progress.detail, "progress": progress.progress, "files": progress.files,
                ]
            }
            // The same user live, on the same device when the pull named one.
            if !pull.uid.isEmpty { page["watch"] = url("/console/tails/new", [("uid", pull.uid)] + (pull.agentID.isEmpty ? [] : [("agent", pull.agentID)])) }
            page["waiting"] = pull.targets.isEmpty ? true : nil
            page["open"] = pull.isFinished ? nil : true
            return html(library, "pull", page)
        }

        // Approving is one button on the pull's page (its facts are the question); audited as pull.approve.
        console.post("pulls/:id/approve") { request, context in
            let form = try await formFields(request, context)
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such pull.") }
            return try await asPoster(request, form, library, d, .approvePull) { session in
                _ = try await d.actions.approvePull(id, by: session.caller)
                return redirect("/console/pulls/\(id)")
            }
        }

        // Removing a pull's files asks first, on a page of its own: acting never depends on the page's script.
        @Sendable func removePage(_ session: ConsoleSessions.Session, _ pull: PullRecord, problem: String?, status: HTTPResponse.Status) async throws -> Response {
            var page = signedInPage("Remove pull \(pull.id.prefix(8))", session, current: "Pulls")
            let hosts = try await d.actions.hostnames(for: session.caller)
            let devices = pull.targets.map { hosts[$0.agentID] ?? String($0.agentID.prefix(8)) }
            page["heading"] = "Remove the files of pull \(pull.id.prefix(8))?"
            page["question"] =
                "Its files from \(devices.isEmpty ? "no device yet" : devices.joined(separator: ", ")) and their records in the index are deleted "
                + "now, and an upload still under way is stopped. The pull itself stays listed (who asked, when, why), and the audit log records the removal. "
                + "This cannot be undone."
            page["action"] = "/console/pulls/\(pull.id)/remove"
            page["askReason"] = true
            page["button"] = "Remove its files"
            page["back"] = "/console/pulls/\(pull.id)"
            if let problem { page["problem"] = problem }
            return html(library, "confirm", page, status: status)
        }
        console.get("pulls/:id/remove") { request, context in
            guard let session = try await checked(request, d, .removeResults) else { return toSignIn(request) }
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such pull.") }
            let pull = try await d.actions.pull(id, disk: false, for: session.caller)
            if pull.removed != nil { return redirect("/console/pulls/\(pull.id)") }
            return try await removePage(session, pull, problem: nil, status: .ok)
        }
        console.post("pulls/:id/remove") { request, context in
            let form = try await formFields(request, context)
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such pull.") }
            return try await asPoster(request, form, library, d, .removeResults) { session in
                do {
                    _ = try await d.actions.remove(.pull, id, by: session.caller, reason: (form["reason"] ?? "").trimmingCharacters(in: .whitespaces))
                } catch let error as ActionError where error.kind != .notFound {
                    return try await removePage(session, try await d.actions.pull(id, disk: false, for: session.caller), problem: sentence(error), status: AdminAPIError(error).status)
                }
                return redirect("/console/pulls/\(id)")
            }
        }

        // Server-sent events for the pull page: each target's progress whenever it changes
        // (looked at twice a second), then `done` once the pull is finished. The stream ends
        // then, after ten minutes (the page opens another), or when the session ends.
        let streams = EventStreams()
        console.get("pulls/:id/events") { request, context in
            guard let cookie = request.cookies[sessionCookie]?.value, let session = try await checked(request, d, .readPulls) else {
                throw AdminAPIError(.unauthorized, "unauthorized", "Sign in first.")
            }
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such pull.") }
            _ = try await d.actions.pull(id, disk: false, for: session.caller)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            // State: the last progress sent.
            return try await eventStream(request, cookie: cookie, streams, d, every: .milliseconds(500), state: "") { last in
                let pull: PullRecord
                do {
                    pull = try await d.actions.pull(id, disk: false, for: session.caller)
                } catch let error as ActionError where error.kind == .notFound {
                    return .finish(nil)
                }
                let state = String(decoding: try encoder.encode(pull.targets.map(TargetProgress.init)), as: UTF8.self)  // one line: JSON escapes newlines
                let changed = state != last ? "data: \(state)\n\n" : nil
                last = state
                if pull.isFinished { return .finish((changed ?? "") + "event: done\ndata: {}\n\n") }
                return changed.map { .send($0, more: false) } ?? .quiet
            }
        }
    }

    /// What one look of an event stream found.
    enum EventStep {
        /// Events to write; with `more`, look again at once.
        case send(String, more: Bool)
        /// Nothing new (a comment every 15 s keeps the connection known alive).
        case quiet
        /// The stream is done, after writing these events if any.
        case finish(String?)
    }

    /// A console page's server-sent events: `look` is called every `interval` with the
    /// stream's state. Bounded: a browser holds at most six HTTP/1.1 connections to a site, and
    /// each stream reads the stores every interval; over the bound (``EventStreams``), 204 and
    /// the page stops asking. `opened` runs once a place is taken (its failure gives it back).
    /// The stream ends when `look` says so, after ten minutes (the page opens another), at the
    /// server's shutdown, when the session ends (looked at each time, its token with it), or
    /// when a write fails: a comment every 15 s finds a browser that went away.
    static func eventStream<State: Sendable>(
        _ request: Request, cookie: String, _ streams: EventStreams, _ d: Dependencies, every interval: Duration, state initial: State,
        opened: @Sendable () async throws -> Void = {}, look: @escaping @Sendable (inout State) async throws -> EventStep
    ) async throws -> Response {
        try await eventStreamResponse(request, cookie: cookie, streams, open: opened) { _, writer in
            var state = initial, lastWrite = ContinuousClock.now
            let end = ContinuousClock.now + .seconds(600)
            looking: while ContinuousClock.now < end, !Task.isShuttingDownGracefully, try await d.sessions.session(cookie) != nil {
                switch try await look(&state) {
                case .send(let events, let more):
                    try await writer.write(ByteBuffer(string: events))
                    lastWrite = .now
                    if more { continue looking }
                case .quiet:
                    if ContinuousClock.now - lastWrite > .seconds(15) {
                        try await writer.write(ByteBuffer(string: ": still here\n\n"))
                        lastWrite = .now
                    }
                case .finish(let events):
                    if let events { try await writer.write(ByteBuffer(string: events)) }
                    break looking
                }
                try await Task.sleep(for: interval)
            }
        }
    }

    /// A console event stream's answer, whatever it sends: its headers (an answer to `HEAD`
    /// too), a place among `streams` for the session (over the bound, 204 and the page stops
    /// asking), `open` once the place is taken (its failure gives the place back), then `body`
    /// writing the stream in the request's zone (it runs after the handler returned), the place
    /// given back and the body finished when it returns.
    static func eventStreamResponse<Opened: Sendable>(
        _ request: Request, cookie: String, _ streams: EventStreams, open: @Sendable () async throws -> Opened,
        body: @escaping @Sendable (Opened, inout any ResponseBodyWriter) async throws -> Void
    ) async throws -> Response {
        var headers = securityHeaders
        headers[.contentType] = "text/event-stream"
        headers[HTTPFields.Element.Name("X-Accel-Buffering")!] = "no"
        if request.method == .head { return Response(status: .ok, headers: headers) }
        let key = ConsoleSessions.key(cookie)
        guard streams.open(key) else { return Response(status: .noContent, headers: securityHeaders) }
        let opened: Opened
        do {
            opened = try await open()
        } catch {
            streams.close(key)
            throw error
        }
        let zone = displayZone
        return Response(
            status: .ok, headers: headers,
            body: ResponseBody { writer in
                defer { streams.close(key) }
                try await $displayZone.withValue(zone) { try await body(opened, &writer) }
                try await writer.finish(nil)
            })
    }

    /// The feedback inbox: what users said, from which device, when, and where its upload
    /// stands; newest first.
    static func registerFeedback(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        console.get("feedback") { request, _ in
            guard let session = try await checked(request, d, .readFeedback) else { return toSignIn(request) }
            let hosts = try await d.actions.hostnames(for: session.caller)
            var page = signedInPage("Feedback", session, current: "Feedback")
            page["rows"] = try await d.actions.feedback(limit: 200, disk: false, for: session.caller).map { f -> [String: Any] in
                var status = f.status.rawValue + (f.status == .complete ? ", \(f.records) records" : "")
                if let removed = f.removed { status = "removed \(timeText(removed.at)) by \(removed.by)" }
                return [
                    "id": f.id, "shortID": String(f.id.prefix(8)), "text": f.text, "uid": f.uid, "host": hosts[f.agentID] ?? "?", "agentID": f.agentID,
                    "createdAt": timeText(f.createdAt.date), "status": status,
                    // The user's timeline up to a second after they gave it (their logs were read then).
                    "moment": logsAt(Timestamp(microseconds: f.createdAt.microseconds + 1_000_000), f.uid.isEmpty ? ("feedback", f.id) : ("uid", f.uid)),
                ]
            }
            return html(library, "feedback", page)
        }
    }

    /// The pull pages' event streams open at once: at most ``perSession`` per session and
    /// ``overall`` in all.
    /// A place is given back when its stream ends, or after 11 minutes in any case (a stream
    /// lasts at most 10; a response whose body never ran gives nothing back).
    final class EventStreams: Sendable {
        static let perSession = 4
        static let overall = 200
        static let longest: TimeInterval = 660
        let now: @Sendable () -> Date
        /// Per session, when each of its open streams began.
        private let open = Mutex<[String: [Date]]>([:])

        init(now: @escaping @Sendable () -> Date = { Date() }) { self.now = now }

        func open(_ session: String) -> Bool {
            let at = now()
            return open.withLock { all in
                all = all.compactMapValues { starts in
                    let live = starts.filter { at.timeIntervalSince($0) < Self.longest }
                    return live.isEmpty ? nil : live
                }
                guard all[session, default: []].count < Self.perSession, all.values.reduce(0, { $0 + $1.count }) < Self.overall else { return false }
                all[session, default: []].append(at)
                return true
            }
        }

        func close(_ session: String) {
            open.withLock { all in
                guard var starts = all[session], !starts.isEmpty else { return }
                starts.removeFirst()
                all[session] = starts.isEmpty ? nil : starts
            }
        }
    }

    /// One target's progress as the pull page shows it, and as its events carry it.
    struct TargetProgress: Encodable {
        var agentID: String
        var status: String
        var progress: String
        var files: String
        var detail: String

        init(_ target: PullTarget) {
            agentID = target.agentID
            status = target.status.rawValue
            progress = target.chunkCount > 0 ? "\(target.chunksReceived) of \(target.chunkCount) chunks" : ""
            files = target.status == .complete ? "\(target.files.count) files" : ""
            detail = target.detail
        }
    }

    /// A filter as a line: the time range, levels, types and text asked for.
    static func describe(_ filter: LogFilter) -> String { filter.summary { timeText($0.date) } }
}
