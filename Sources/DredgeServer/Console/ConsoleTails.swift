import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Hummingbird
import Mustache
import NIOCore
import NIOPosix
import Synchronization

/// The console's live tails (#53): "Watch live" on a user (an agent's page, the log viewer) or
/// a pull opens a form; starting it opens the tail's page, the viewer in a live mode: records
/// added as the devices log them (server-sent events read from what the server stored,
/// ``TailWatch``), paused and resumed, the devices' states, and a stop. What `dredge tail` does.
extension Console {
    /// The tails this node's console sessions started, by session key: signing out here stops
    /// them (the engineer's session ended). Kept in this node's memory: a sign-out through
    /// another node of a cluster, or after a restart, leaves them to their expiry, which is
    /// never past the session's.
    final class StartedTails: Sendable {
        private let started = Mutex<[String: Set<String>]>([:])

        /// Sessions remembered at most (those never signed out are forgotten first, at random).
        static let capacity = 10_000

        func add(_ tailID: String, session key: String) {
            started.withLock { all in
                if all[key] == nil, all.count >= Self.capacity, let any = all.keys.first { all[any] = nil }
                all[key, default: []].insert(tailID)
            }
        }
        func take(_ key: String) -> Set<String> { started.withLock { $0.removeValue(forKey: key) ?? [] } }
    }

    /// A new-tail form's fields as a request, or what is wrong with them. The viewer's filter
    /// fields, with their names (`level` as `warning+` or `error,fault`, `type` as a comma
    /// list, `text`, `host`), so the viewer's "Watch live" carries its search over.
    static func tailRequest(_ form: [String: String], longest: Int) -> Result<TailRequest, PullRequestError> {
        func field(_ name: String) -> String? {
            let value = (form[name] ?? "").trimmingCharacters(in: .whitespaces)
            return value.isEmpty ? nil : value
        }
        guard let uid = field("uid") else { return .failure(.invalid("a tail watches one user: give their user id")) }
        var filter = LogFilter()
        if let level = field("level") {
            guard let levels = LogLevel.parseSet(level) else {
                return .failure(.invalid("level is one of \(LogLevel.allCases.map(\.name).joined(separator: ", ")), or one with + (warning+: warning and above)"))
            }
            filter.levels = levels
        }
        if let types = field("type") {
            var set = Set<LogType>()
            for name in types.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !name.isEmpty {
                guard let type = LogType(name) else { return .failure(.invalid("“\(name)” is not a log type (app, network, …)")) }
                set.insert(type)
            }
            if !set.isEmpty { filter.types = set }
        }
        filter.text = field("text")
        let minutes = field("minutes") ?? "15"
        guard let count = Int(minutes), (1...60).contains(count) else { return .failure(.invalid("a tail runs 1 to 60 minutes")) }
        // Never past the session that starts it.
        let seconds = min(count * 60, longest)
        guard seconds >= 1 else { return .failure(.invalid("this session ends now: sign in again")) }
        return .success(
            TailRequest(
                uid: uid, agent: field("agent"), host: field("host"), filter: filter, durationSeconds: seconds, verbose: form["verbose"] != nil,
                reason: field("reason"), urgent: form["urgent"] != nil ? true : nil))
    }

    /// A row of the tails list.
    static func tailRow(_ tail: TailRecord, _ hosts: [String: String], now: Timestamp) -> [String: Any] {
        let records = tail.parts.map(\.records).reduce(0, +)
        let devices = tail.parts.map { hosts[$0.agentID].flatMap { $0.isEmpty ? nil : $0 } ?? String($0.agentID.prefix(8)) }
        let state =
            tail.removed != nil
            ? "records removed" : tail.stopped.map { "stopped \(timeText($0.at)) by \($0.by)" } ?? (tail.isOpen(at: now) ? "live until \(timeText(tail.expiresAt.date))" : "expired")
        return [
            "id": tail.id, "shortID": String(tail.id.prefix(8)), "uid": tail.uid, "by": tail.requestedBy, "startedAt": timeText(tail.issuedAt.date),
            "state": state, "open": tail.isOpen(at: now) && tail.stopped == nil, "reason": tail.reason ?? "",
            "seen": "\(records) record\(records == 1 ? "" : "s") from \(devices.isEmpty ? "no device yet" : devices.joined(separator: ", "))",
        ]
    }

    static func registerTails(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        console.get("tails") { request, _ in
            guard let session = try await checked(request, d, .readTails) else { return toSignIn(request) }
            var page = signedInPage("Live", session, current: "Live")
            let hosts = try await d.actions.hostnames(for: session.caller)
            let now = Timestamp.now
            page["rows"] = try await d.actions.tails(limit: 100, for: session.caller).map { tailRow($0, hosts, now: now) }
            return html(library, "tails", page)
        }

        @Sendable func newTailPage(_ session: ConsoleSessions.Session, _ form: [String: String], problem: String?, status: HTTPResponse.Status) async throws
            -> Response
        {
            var page = signedInPage("Watch live", session, current: "Live")
            for name in ["uid", "host", "level", "type", "text", "reason"] { page[name] = form[name] ?? "" }
            page["minutes"] = form["minutes"] ?? "15"
            page["verbose"] = form["verbose"] != nil
            page["urgent"] = form["urgent"] != nil
            page["agents"] = try await d.actions.agents(for: session.caller).sorted { $0.hostname < $1.hostname }.map { agent -> [String: Any] in
                ["id": agent.agentID, "label": "\(agent.hostname) (\(agent.agentID.prefix(8)))\(agent.connected ? "" : ", offline")", "selected": agent.agentID == form["agent"]]
            }
            if let problem { page["problem"] = problem }
            return html(library, "new-tail", page, status: status)
        }

        console.get("tails/new") { request, _ in
            guard let session = try await checked(request, d, .createTail) else { return toSignIn(request) }
            // A link fills it in: a user, a device, the viewer's filters.
            return try await newTailPage(session, query(request), problem: nil, status: .ok)
        }
        let started = d.startedTails
        console.post("tails") { request, context in
            let form = try await formFields(request, context)
            return try await asPoster(request, form, library, d, .createTail) { session in
                let tail: TailRecord
                do {
                    let asked = try tailRequest(form, longest: Int(session.expires.timeIntervalSince(d.sessions.now()))).get()
                    tail = try await d.actions.createTail(asked, by: session.caller, via: "console")
                } catch let error as PullRequestError {
                    return try await newTailPage(session, form, problem: sentence(error), status: .badRequest)
                } catch let error as ActionError {
                    return try await newTailPage(session, form, problem: sentence(error), status: AdminAPIError(error).status)
                }
                if let cookie = request.cookies[sessionCookie]?.value { started.add(tail.id, session: ConsoleSessions.key(cookie)) }
                return redirect("/console/tails/\(tail.id)")
            }
        }

        console.get("tails/:id") { request, context in
            guard let session = try await checked(request, d, .readTails) else { return toSignIn(request) }
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such tail.") }
            let tail = try await d.actions.tail(id, for: session.caller)
            let hosts = try await d.actions.hostnames(for: session.caller)
            let now = Timestamp.now
            var page = signedInPage("Live: \(tail.uid)", session, current: "Live")
            for (key, value) in tailRow(tail, hosts, now: now) { page[key] = value }
            page["filter"] = tail.filter.levels == nil && tail.filter.types == nil && tail.filter.text == nil ? "every record" : describe(tail.filter)
            page["expiresAt"] = timeText(tail.expiresAt.date)
            if tail.verbose { page["verbose"] = tail.verboseTypes.isEmpty ? "debug and trace records too" : "debug and trace records of \(tail.verboseTypes.joined(separator: ", ")) too" }
            // Watching (its records, live or stored) is its requester's or an admin's, as on the
            // API (``AdminActions/watchTail(_:by:)``): others see the tail's facts only.
            let mine = (tail.requestedBy == session.caller.name || session.caller.role == .admin) && session.caller.role >= AdminOperation.watchTail.leastRole
            if tail.isOpen(at: now), tail.stopped == nil, tail.removed == nil {
                if mine { page["events"] = "/console/tails/\(tail.id)/events" }
                page["mayStop"] = mine && session.caller.role >= AdminOperation.stopTail.leastRole ? true : nil
            }
            // What it showed so far (the newest rows), read as a watcher reads; the page's events go on from there.
            if mine, tail.removed == nil, let paths = d.actions.services.files?.paths {
                let (rows, positions) = try await NIOThreadPool.singleton.runIfActive { try storedRows(tail, hosts: hosts, paths: paths) }
                page["rows"] = rows.map { Console.logRow($0) }
                page["earlier"] = rows.count == maxStoredRows || rows.count < tail.parts.map(\.records).reduce(0, +) ? "The newest records it showed; search for the rest." : nil
                if page["events"] != nil {
                    page["events"] = url("/console/tails/\(tail.id)/events", [("from", positions.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ","))])
                }
            }
            page["devices"] = tail.parts.map { part -> [String: Any] in
                ["agentID": part.agentID, "host": hosts[part.agentID] ?? "?", "shortID": String(part.agentID.prefix(8)), "status": part.status.rawValue,
                 "records": "\(part.records)", "dropped": part.dropped > 0 ? "\(part.dropped) left out" : "", "detail": part.detail]
            }
            // What it held, searched as any pull's records (once each device's part ended and was indexed).
            page["logs"] = url("/console/logs", [("uid", tail.uid), ("since", tail.issuedAt.rfc3339)])
            // And downloaded, by those who may read its records (as ``AdminActions/files(ofTail:for:)`` says).
            if tail.requestedBy == session.caller.name || session.caller.role == .admin, tail.removed == nil { page["files"] = "/console/tails/\(tail.id)/files" }
            return html(library, "tail", page)
        }

        console.post("tails/:id/stop") { request, context in
            let form = try await formFields(request, context)
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such tail.") }
            return try await asPoster(request, form, library, d, .stopTail) { session in
                do {
                    _ = try await d.actions.stopTail(id, by: session.caller, reason: "")
                } catch let error as ActionError {
                    // Stopped already (another watcher, its expiry): the page says by whom.
                    guard error.kind == .conflict else { throw error }
                }
                return redirect("/console/tails/\(id)")
            }
        }

        // Server-sent events: the tail's devices, then each run of records as the server holds
        // them (an event's data: the rows, as text) with the devices' counts after them, what a
        // device left out (`dropped`), what this page fell behind by (`missed`), and `end` (the
        // last). The last event of each write carries where the page then stands in each
        // device's records as its id, so a browser that reconnects (`Last-Event-ID`: after ten
        // minutes, a dropped connection) goes on from the last write it read whole, missing
        // nothing (a write cut short is sent again). Bounded as each other kind of stream is,
        // on its own: 4 per session, 200 in all; ended by the session's end and shutdown.
        let streams = EventStreams()
        console.get("tails/:id/events") { request, context in
            guard let cookie = request.cookies[sessionCookie]?.value, let session = try await checked(request, d, .watchTail) else {
                throw AdminAPIError(.unauthorized, "unauthorized", "Sign in first.")
            }
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such tail.") }
            // Where the page stood: as its last event said (a reconnect), else as the page was rendered.
            let resumed = (request.headers[HTTPFields.Element.Name("Last-Event-ID")!] ?? query(request)["from"]).map(tailPositions)
            guard let paths = d.actions.services.files?.paths, let registry = d.actions.services.tails else {
                throw AdminAPIError(.serviceUnavailable, "unavailable", "This server does not serve tails' records.")
            }
            return try await eventStreamResponse(request, cookie: cookie, streams, open: { try await d.actions.watchTail(id, by: session.caller) }) { opened, writer in
                let (tail, watcher) = opened
                let watch = TailWatch(
                    tail: tail, watcher: watcher, tails: registry, registry: d.actions.services.registry, hub: d.actions.services.tailHub, paths: paths)
                let end = ContinuousClock.now + .seconds(600)
                let ended = try await watch.run(
                    from: resumed, quiet: .seconds(15),
                    goOn: {
                        guard ContinuousClock.now < end, !Task.isShuttingDownGracefully else { return false }
                        return try await d.sessions.session(cookie) != nil
                    },
                    send: { events, parts, hosts, positions in
                        // Records came: the devices' counts with them.
                        let all = events.contains { $0.kind == .record } && !events.contains { $0.kind == .devices } ? events + [TailEvent(kind: .devices, devices: parts)] : events
                        try await writer.write(ByteBuffer(string: try tailEvents(all, tailID: tail.id, hosts: hosts, positions: positions)))
                    },
                    idle: { try await writer.write(ByteBuffer(string: ": still here\n\n")) })
                if let ended {
                    let data = String(decoding: try JSONEncoder().encode(["reason": ended]), as: UTF8.self)
                    try await writer.write(ByteBuffer(string: "event: end\ndata: \(data)\n\n"))
                }
            }
        }
    }

    /// The records a tail's page shows when it opens: at most this many, the newest.
    static let maxStoredRows = 500

    /// What `tail` showed lately, read as a watcher reads it (``TailFollower``): each device's
    /// records in the last ``storedWindow`` bytes it held (never the whole file), the newest
    /// ``maxStoredRows`` of them all in time order; and where that reading ended in each
    /// device's records (what the page's events go on from).
    static func storedRows(_ tail: TailRecord, hosts: [String: String], paths: DataDirectory) throws -> ([FoundRecord], [String: Int64]) {
        var follower = TailFollower(tail, paths: paths)
        var starts: [String: Int64] = [:]
        for part in tail.parts {
            follower.name(part.agentID, host: hosts[part.agentID] ?? "")
            starts[part.agentID] = try recordStart(in: paths.tailFiles(tail.id, agent: part.agentID) + "/" + TailFiles.records, atOrAfter: max(0, part.bytes - storedWindow), before: part.bytes)
        }
        try follower.resume(starts, tail: tail)
        var rows: [FoundRecord] = []
        while true {
            let (events, more) = try follower.events(tail)
            rows += events.compactMap { $0.foundRecord(tailID: tail.id) }
            if !more { break }
        }
        let ordered = rows.enumerated().sorted { ($0.element.ts, $0.offset) < ($1.element.ts, $1.offset) }.map(\.element)
        return (Array(ordered.suffix(maxStoredRows)), follower.shown)
    }

    /// Bytes of each device's records a tail's page reads when it opens.
    static let storedWindow: Int64 = 512 * 1024

    /// Where the first record at or after `offset` begins in `file` (0, or just after a line
    /// break), below `end`; `end` when none does.
    static func recordStart(in file: String, atOrAfter offset: Int64, before end: Int64) throws -> Int64 {
        guard offset > 0 else { return 0 }
        guard let handle = FileHandle(forReadingAtPath: file) else { return end }
        defer { try? handle.close() }  // read only: nothing to lose
        try handle.seek(toOffset: UInt64(offset - 1))
        let bytes = [UInt8](try handle.read(upToCount: Int(end - offset + 1)) ?? Data())
        guard let newline = bytes.firstIndex(of: 0x0A) else { return end }
        return offset + Int64(newline)
    }

    /// A device's state as the live page shows it, and as its `devices` events carry it.
    struct LiveDevice: Encodable {
        var agentID: String, host: String, status: String, records: String, dropped: String, detail: String
    }

    /// A record as the live page writes it into a row (as text): the viewer's columns.
    struct LiveRecord: Encodable {
        var agent: String, time: String, host: String, app: String, level: String, type: String, uid: String, message: String, metadata: String

        init(_ r: FoundRecord) {
            let row = Console.logRow(r)
            func text(_ key: String) -> String { row[key] as? String ?? "" }
            agent = r.agentID
            (time, host, app, level, type, uid, message, metadata) = (
                text("time"), text("host"), text("app"), text("level"), text("type"), text("uid"), text("message"), text("metadata")
            )
        }
    }

    /// A run of a tail's events as server-sent events, the last carrying `positions` as its id
    /// (``tailPositions(_:)`` reads it back): records in one event (JSON escapes line breaks).
    static func tailEvents(_ events: [TailEvent], tailID: String, hosts: [String: String], positions: [String: Int64]) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        func json(_ value: some Encodable) throws -> String { String(decoding: try encoder.encode(value), as: UTF8.self) }
        var out = "", records: [LiveRecord] = []
        func flush() throws {
            guard !records.isEmpty else { return }
            out += "data: \(try json(records))\n\n"
            records = []
        }
        for event in events {
            switch event.kind {
            case .record:
                if let found = event.foundRecord(tailID: tailID) { records.append(LiveRecord(found)) }
            case .devices:
                try flush()
                let devices = (event.devices ?? []).map { part in
                    LiveDevice(
                        agentID: part.agentID, host: hosts[part.agentID].flatMap { $0.isEmpty ? nil : $0 } ?? String(part.agentID.prefix(8)), status: part.status.rawValue,
                        records: "\(part.records)", dropped: part.dropped > 0 ? "\(part.dropped) left out" : "", detail: part.detail)
                }
                out += "event: devices\ndata: \(try json(devices))\n\n"
            case .dropped, .missed:
                try flush()
                let host = event.host.flatMap { $0.isEmpty ? nil : $0 } ?? event.agent.map { String($0.prefix(8)) } ?? "a device"
                out += "event: \(event.kind.rawValue)\ndata: \(try json(["host": host, "count": "\(event.count ?? 0)"]))\n\n"
            case .end:
                continue  // written once the watch ends
            }
        }
        try flush()
        // Where the page stands: the last event's id, what a reconnecting browser sends back.
        let id = positions.sorted { $0.key < $1.key }.prefix(maxResumedDevices).map { "\($0.key):\($0.value)" }.joined(separator: ",")
        return out.isEmpty ? "" : out.dropLast(1) + "id: \(id)\n\n"
    }

    /// Devices a page's position names at most (a tail's devices beyond start afresh on a reconnect).
    static let maxResumedDevices = 64

    /// `agent:bytes,…` as ``tailEvents`` wrote it; what does not read so is left out.
    static func tailPositions(_ text: String) -> [String: Int64] {
        var positions: [String: Int64] = [:]
        for item in text.split(separator: ",").prefix(maxResumedDevices) {
            let parts = item.split(separator: ":")
            guard parts.count == 2, WireID.isValid(String(parts[0])), let bytes = Int64(parts[1]), bytes >= 0 else { continue }
            positions[String(parts[0])] = bytes
        }
        return positions
    }
}
