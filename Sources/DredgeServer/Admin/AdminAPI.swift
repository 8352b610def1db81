import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import Logging
import NIOCore
import NIOSSL
import Synchronization

/// The admin HTTP API engineers use (through `dredge`): loopback only, every `/v1` route behind
/// a bearer admin token, JSON in and out. Routes are listed in docs/admin-api.md.
public enum AdminAPI {
    /// Builds the Hummingbird application; a `Service` for the server's service group.
    public static func application(
        registry: any AgentDirectory, pulls: any PullQueue, audit: any AuditLog, issuer: CommandIssuer, feedback: any FeedbackInbox, tokens: any TokenVault,
        dispatcher: PullDispatcher, records: (any RecordIndex)? = nil, indexer: Indexer? = nil, files: PullFiles? = nil, results: ResultsKeeper? = nil,
        consoleSessions: ConsoleSessions = ConsoleSessions(), host: String = "127.0.0.1", port: Int, tls: TLSConfiguration? = nil, caPEM: String? = nil,
        connectionLimits: AdminConnectionLimits = .default, logger: Logger,
        onReady: @escaping @Sendable (Int) -> Void = { _ in }
    ) throws -> some ApplicationProtocol {
        // HEAD answers every GET route with its headers (a download's size, ETag and SHA-256
        // without its bytes; `serve` neither reads nor audits the file then).
        let router = Router(context: AdminRequestContext.self, options: .autoGenerateHeadEndpoints)
        router.add(middleware: ErrorMiddleware(logger: logger))
        router.get("health") { _, _ in try json(["status": "ok"]) }
        // The deployment's CA, public: `dredge login --fingerprint` fetches it and checks it
        // against the fingerprint `init` printed before trusting anything else.
        if let caPEM {
            router.get("ca.pem") { _, _ in
                Response(status: .ok, headers: [.contentType: "application/x-pem-file"], body: .init(byteBuffer: ByteBuffer(string: caPEM)))
            }
        }

        try Console.register(
            on: router,
            Console.Dependencies(
                registry: registry, pulls: pulls, feedback: feedback, records: records, files: files, issuer: issuer, dispatcher: dispatcher, tokens: tokens, audit: audit, sessions: consoleSessions, secure: tls != nil, logger: logger))

        let v1 = router.group("v1").add(middleware: BearerTokenMiddleware(tokens: tokens, audit: audit, logger: logger))
        let searchAudit = SearchAudit()
        v1.get("agents") { request, _ in
            guard let uid = request.uri.queryParameters.get("uid") else { return try json(await registry.agents()) }
            if let problem = UserID.problem(uid) { throw AdminAPIError(.badRequest, "bad_request", "uid: \(problem)") }
            // The agents that hold the uid, each with when it last saw it.
            let holders = Dictionary(try await registry.holders(of: uid).map { ($0.agentID, $0.lastSeen) }, uniquingKeysWith: { a, _ in a })
            return try json(try await registry.agents().compactMap { agent -> AgentRecord? in
                guard let seen = holders[agent.agentID] else { return nil }
                var agent = agent
                agent.uidLastSeen = seen
                return agent
            })
        }
        v1.get("pulls") { request, _ in
            let limit = request.uri.queryParameters.get("limit", as: Int.self) ?? 100
            let listed = try await pulls.pulls(limit: min(max(limit, 1), 1000), now: .now)
            return try json(try diskWanted(request) ? await measured(listed, results, logger) : listed)
        }
        v1.post("pulls") { request, context in
            let body = try await decode(PullRequest.self, from: request)
            let pull: PullRecord
            do {
                pull = try await pulls.create(
                    body, registry: registry, issuer: issuer, requestedBy: context.tokenName ?? "?", logger: logger, isConnected: dispatcher.isConnected
                ) { dispatcher.wake($0, with: $1) }
            } catch let error as PullRequestError {
                switch error {
                case .unknownAgent: throw AdminAPIError(.notFound, "no_agent", error.description)
                case .noTarget, .invalid: throw AdminAPIError(.badRequest, "bad_request", error.description)
                }
            }
            logger.info("pull queued", metadata: ["pull.id": "\(pull.id)", "by": "\(pull.requestedBy)", "targets": "\(pull.targets.count)"])
            return try json(pull, status: .created)
        }
        v1.get("pulls/:id") { request, context in
            let id = try validID(context.parameters.require("id"), "pull")
            guard let pull = try await pulls.pull(id, now: .now) else { throw AdminAPIError(.notFound, "not_found", "no pull \(id)") }
            return try json(try diskWanted(request) ? await measured([pull], results, logger).first ?? pull : pull)
        }
        let downloadAudit = SearchAudit()
        v1.get("pulls/:id/files") { _, context in
            guard let files else { throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not serve files") }
            let id = try validID(context.parameters.require("id"), "pull")
            guard let list = try await files.list(id) else { throw AdminAPIError(.notFound, "not_found", "no pull \(id)") }
            return try json(list.map(\.file))
        }
        v1.get("pulls/:id/files/:agent/:name") { request, context in
            guard let files else { throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not serve files") }
            let id = try validID(context.parameters.require("id"), "pull")
            let agent = try validID(context.parameters.require("agent"), "agent")
            let name = try context.parameters.require("name")
            guard let located = try await files.locate(id, agent: agent, name: name) else {
                throw AdminAPIError(.notFound, "not_found", "pull \(id) has no file \(WireID.echo(name).debugDescription) from agent \(agent)")
            }
            return try await serve(located, request: request, context: context, audit: audit, throttle: downloadAudit, detail: "pull \(id) agent \(agent) file \(located.file.name)")
        }
        v1.get("pulls/:id/zip") { request, context in
            guard let files else { throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not serve files") }
            let id = try validID(context.parameters.require("id"), "pull")
            let located: PullFiles.Located
            do {
                guard let zip = try await files.wholeZip(id) else { throw AdminAPIError(.notFound, "not_found", "no pull \(id)") }
                located = zip
            } catch PullFiles.WholeZipError.nothingYet {
                throw AdminAPIError(.notFound, "not_found", "pull \(id) has no files yet (none of its agents is complete, or it was removed)")
            } catch PullFiles.WholeZipError.changing {
                throw AdminAPIError(.serviceUnavailable, "unavailable", "pull \(id)'s files are changing; ask again")
            }
            return try await serve(located, request: request, context: context, audit: audit, throttle: downloadAudit, detail: "pull \(id) whole zip")
        }
        v1.get("feedback") { request, _ in
            let limit = request.uri.queryParameters.get("limit", as: Int.self) ?? 100
            let listed = try await feedback.all(limit: min(max(limit, 1), 1000))
            return try json(try diskWanted(request) ? await measured(listed, results, logger) : listed)
        }
        v1.get("feedback/:id") { request, context in
            let id = try validID(context.parameters.require("id"), "feedback")
            guard let record = try await feedback.feedback(id) else { throw AdminAPIError(.notFound, "not_found", "no feedback \(id)") }
            return try json(try diskWanted(request) ? await measured([record], results, logger).first ?? record : record)
        }
        v1.get("feedback/:id/files") { _, context in
            guard let files else { throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not serve files") }
            let id = try validID(context.parameters.require("id"), "feedback")
            guard let list = try await files.list(feedback: id) else { throw AdminAPIError(.notFound, "not_found", "no feedback \(id)") }
            return try json(list.map(\.file))
        }
        v1.get("feedback/:id/files/:name") { request, context in
            guard let files else { throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not serve files") }
            let id = try validID(context.parameters.require("id"), "feedback")
            let name = try context.parameters.require("name")
            guard let located = try await files.locate(feedback: id, name: name) else {
                throw AdminAPIError(.notFound, "not_found", "feedback \(id) has no file \(WireID.echo(name).debugDescription)")
            }
            return try await serve(
                located, request: request, context: context, audit: audit, throttle: downloadAudit, action: "feedback.download",
                detail: "feedback \(id) file \(located.file.name)")
        }
        // DELETE /v1/pulls/{id}, DELETE /v1/feedback/{id}: the results go, the record stays.
        for (kind, path) in [(RemovalReport.Kind.pull, "pulls/:id"), (.feedback, "feedback/:id")] {
            v1.delete(RouterPath(path)) { request, context in
                guard let results else { throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not remove results") }
                let id = try validID(context.parameters.require("id"), kind.rawValue)
                let reason = try removalReason(request), actor = context.tokenName ?? "?"
                let report: RemovalReport?
                do {
                    report = try await results.remove(kind, id, by: actor, reason: reason)
                } catch let busy as ResultsKeeper.RemovalInProgress {
                    throw AdminAPIError(.conflict, "conflict", busy.description)
                }
                guard let report else { throw AdminAPIError(.notFound, "not_found", "no \(kind.rawValue) \(id)") }
                logger.info("\(kind.rawValue) removed", metadata: ["\(kind.rawValue).id": "\(id)", "by": "\(actor)", "bytes": "\(report.freedBytes)"])
                return try json(report)
            }
        }
        v1.post("records/search") { request, context in
            guard let records else { throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not index records") }
            let search = try await decode(RecordSearch.self, from: request)
            try checkSearch(search)
            var page: RecordPage
            do {
                page = try await records.search(search)
            } catch let error as RecordSearchError {
                throw AdminAPIError(.badRequest, "bad_request", error.description)
            }
            if let indexer { page.indexing += indexer.queued }
            // Every search is audited; its further pages and a follow's looks (the same actor and
            // filter) are recorded again only after ten minutes.
            try await searchAudit.record("records.search", actor: context.tokenName ?? "?", detail: describe(search), in: audit)
            // Written by hand: each record's metadata goes in as the index holds it, not parsed
            // and written again.
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: try page.jsonBytes())))
        }
        v1.get("records/:id") { request, context in
            guard let records else { throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not index records") }
            guard let id = Int64(try context.parameters.require("id")), id > 0 else { throw AdminAPIError(.badRequest, "bad_request", "a record id is a positive integer") }
            let count = try recordContext(request)
            guard let found = try await records.record(id, context: count) else { throw AdminAPIError(.notFound, "not_found", "no record \(id)") }
            try await searchAudit.record("records.read", actor: context.tokenName ?? "?", detail: "record \(id) context \(count)", in: audit)
            return try json(found)
        }
        v1.get("audit") { request, _ in
            let parameters = request.uri.queryParameters
            var query = AuditQuery()
            if let limit = parameters.get("limit") {
                guard let n = Int(limit), (1...10_000).contains(n) else { throw AdminAPIError(.badRequest, "bad_request", "limit is 1 to 10000") }
                query.limit = n
            }
            if let since = parameters.get("since") {
                guard let micros = Int64(since), Timestamp(microseconds: micros).isAccepted else {
                    throw AdminAPIError(.badRequest, "bad_request", "since is µs since 1970 (up to 9999)")
                }
                query.since = Timestamp(microseconds: micros).date
            }
            // Empty means not given.
            query.actor = parameters.get("actor").flatMap { $0.isEmpty ? nil : String($0) }
            query.action = parameters.get("action").flatMap { $0.isEmpty ? nil : String($0) }
            if let before = parameters.get("before") {
                guard let id = Int64(before) else { throw AdminAPIError(.badRequest, "bad_request", "before is an entry's id") }
                query.before = id
            }
            return try json(await audit.audit(query))
        }
        v1.get("tokens") { _, _ in try json(await tokens.list()) }
        v1.post("tokens") { request, context in
            let body = try await decode(TokenRequest.self, from: request)
            let created: TokenCreated
            do {
                created = try await tokens.create(name: body.name, kind: body.kind, now: Date())
            } catch let error as TokenError {
                throw AdminAPIError(error == .exists(body.name) ? .conflict : .badRequest, error == .exists(body.name) ? "conflict" : "bad_request", error.description)
            }
            try await audit.record(actor: context.tokenName ?? "?", action: "token.create", detail: "\(body.kind.rawValue) token '\(body.name)'", at: Date())
            return try json(created, status: .created)
        }
        v1.delete("tokens/:kind/:name") { _, context in
            let name = try context.parameters.require("name")
            guard let kind = TokenKind(rawValue: try context.parameters.require("kind")) else {
                throw AdminAPIError(.notFound, "not_found", "token kinds are admin and enrollment")
            }
            do {
                try await tokens.revoke(name: name, kind: kind)
            } catch let error as TokenError {
                throw AdminAPIError(error == .lastAdmin ? .conflict : .notFound, error == .lastAdmin ? "conflict" : "not_found", error.description)
            }
            try await audit.record(actor: context.tokenName ?? "?", action: "token.revoke", detail: "\(kind.rawValue) token '\(name)'", at: Date())
            return try json(await tokens.list())
        }

        let scheme = tls == nil ? "http" : "https"
        // Deadlines and caps of its own (``AdminConnectionLimits``), as the agent listener has.
        let gate = AdminConnectionGate(limits: connectionLimits)
        let refusals = RateLimitedLog(perMinute: 10)
        return Application(
            router: router,
            server: HTTPServerBuilder { responder in
                try AdminChildChannel(responder: responder, tls: tls, gate: gate, refusals: refusals, logger: logger)
            },
            configuration: .init(address: .hostname(host, port: port), serverName: "dredge-admin"),
            onServerRunning: { channel in
                let bound = channel.localAddress?.port ?? port
                let name = host.contains(":") ? "[\(host)]" : host
                logger.info("admin API ready", metadata: ["address": "\(name):\(bound)", "url": "\(scheme)://\(name):\(bound)"])
                onReady(bound)
            },
            logger: logger)
    }

    static let maximumBody = 64 * 1024

    /// A file of a pull, streamed, with `Range` (one range: 206; past the end: 416) and
    /// `If-Range` (the range only while the ETag is the one given, else the whole file: RFC 9110
    /// § 13.1.5), its SHA-256 as `ETag` and `Repr-Digest`. Every download is audited; the same
    /// file again by the same token (a resumed or repeated download) is recorded again only after
    /// ten minutes.
    static func serve(
        _ located: PullFiles.Located, request: Request, context: AdminRequestContext, audit: any AuditLog, throttle: SearchAudit,
        action: String = "pull.download", detail: String
    ) async throws -> Response {
        let file = located.file
        let etag = "\"\(file.sha256)\""
        // A strong comparison; there is no Last-Modified, so a date never matches either.
        let rangeAsked = request.headers[.ifRange].map { $0 == etag } ?? true ? request.headers[.range] : nil
        let range = ByteRange.parse(rangeAsked, size: file.size)
        let headOnly = request.method == .head  // nothing downloaded: not audited, the file not opened
        if !headOnly && range != .unsatisfiable { try await throttle.record(action, actor: context.tokenName ?? "?", detail: detail, in: audit) }
        var headers: HTTPFields = [
            .acceptRanges: "bytes", .eTag: etag,
            .contentType: file.kind == .zip ? "application/zip" : file.kind == .manifest ? "application/json" : "application/x-ndjson",
            .contentDisposition: "attachment; filename=\"\(file.name)\"",
        ]
        if let digestName = HTTPFields.Element.Name("Repr-Digest"), let sha = Hex.decode(file.sha256) {
            headers[digestName] = "sha-256=:\(Data(sha).base64EncodedString()):"
        }
        switch range {
        case .unsatisfiable:
            headers[.contentRange] = "bytes */\(file.size)"
            return Response(status: .rangeNotSatisfiable, headers: headers)
        case .whole:
            headers[.contentLength] = String(file.size)
            let body = file.size == 0 || headOnly ? ResponseBody() : try await FileIO().loadFile(path: located.path, context: context)
            return Response(status: .ok, headers: headers, body: body)
        case .partial(let bytes):
            headers[.contentRange] = "bytes \(bytes.lowerBound)-\(bytes.upperBound)/\(file.size)"
            headers[.contentLength] = String(bytes.count)
            if headOnly { return Response(status: .partialContent, headers: headers) }
            let body = try await FileIO().loadFile(path: located.path, range: Int(bytes.lowerBound)...Int(bytes.upperBound), context: context)
            return Response(status: .partialContent, headers: headers, body: body)
        }
    }

    /// Ids in a search have the protocol's form, a uid the store's rules; texts hold no control
    /// characters, and lists are bounded.
    static func checkSearch(_ search: RecordSearch) throws {
        func bad(_ message: String) -> AdminAPIError { AdminAPIError(.badRequest, "bad_request", message) }
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
        if let pull = search.pull { _ = try validID(pull, "pull") }
        if let feedback = search.feedback { _ = try validID(feedback, "feedback") }
        for agent in search.agents ?? [] { _ = try validID(agent, "agent") }
        if let uid = search.uid, let problem = UserID.problem(uid) { throw AdminAPIError(.badRequest, "bad_request", "uid: \(problem)") }
        if let reason = search.reason, let problem = reasonProblem(reason) { throw bad(problem) }
        if let since = search.since, let until = search.until, until <= since {
            throw AdminAPIError(.badRequest, "bad_request", "until must be after since")
        }
    }

    /// A search as the audit log shows it: each narrowing, readably.
    static func describe(_ s: RecordSearch) -> String {
        var parts: [String] = []
        if let uid = s.uid { parts.append("uid=\(uid)") }
        if let agents = s.agents, !agents.isEmpty { parts.append("agent=\(agents.joined(separator: ","))") }
        if let hosts = s.hosts, !hosts.isEmpty { parts.append("host=\(hosts.joined(separator: ","))") }
        if let apps = s.apps, !apps.isEmpty { parts.append("app=\(apps.joined(separator: ","))") }
        if let pull = s.pull { parts.append("pull=\(pull)") }
        if let feedback = s.feedback { parts.append("feedback=\(feedback)") }
        if let since = s.since { parts.append("since=\(since.rfc3339)") }
        if let until = s.until { parts.append("until=\(until.rfc3339)") }
        if let levels = s.levels, !levels.isEmpty { parts.append("level=\(levels.joined(separator: ","))") }
        if let types = s.types, !types.isEmpty { parts.append("type=\(types.joined(separator: ","))") }
        if let text = s.text { parts.append("text=\(text.debugDescription)") }
        for m in s.metadata ?? [] { parts.append("where \(m.key)=\(m.value)") }
        if let reason = s.reason, !reason.isEmpty { parts.append("reason=\(reason.debugDescription)") }
        return ConnectionUploads.bounded(parts.isEmpty ? "everything" : parts.joined(separator: " "))
    }

    /// The `disk` parameter of a listing or a single pull or feedback: `false` leaves
    /// `diskBytes` out (and the result directories unwalked), for callers that do not show it,
    /// such as the CLI resolving a prefix or checking whether a pull was removed.
    static func diskWanted(_ request: Request) throws -> Bool {
        switch request.uri.queryParameters.get("disk") {
        case nil, "true": return true
        case "false": return false
        case let other?: throw AdminAPIError(.badRequest, "bad_request", "disk must be true or false, not '\(other)'")
        }
    }

    /// Pulls with their disk use; as they are (without it) when measuring fails: a listing
    /// never fails for want of a size.
    static func measured(_ pulls: [PullRecord], _ results: ResultsKeeper?, _ logger: Logger) async -> [PullRecord] {
        await measured(pulls, logger) { try await results?.measured($0) }
    }

    static func measured(_ feedback: [FeedbackRecord], _ results: ResultsKeeper?, _ logger: Logger) async -> [FeedbackRecord] {
        await measured(feedback, logger) { try await results?.measured($0) }
    }

    private static func measured<Record>(_ records: [Record], _ logger: Logger, _ measure: ([Record]) async throws -> [Record]?) async -> [Record] {
        do {
            return try await measure(records) ?? records
        } catch {
            logger.warning("cannot measure the disk use of results", metadata: ["error": "\(error)"])
            return records
        }
    }

    /// `?context=N` of a record: 0 to ``RecordInContext/maximumContext``, 10 when absent.
    static func recordContext(_ request: Request) throws -> Int {
        guard let text = request.uri.queryParameters.get("context") else { return 10 }
        guard let count = Int(text), (0...RecordInContext.maximumContext).contains(count) else {
            throw AdminAPIError(.badRequest, "bad_request", "context is a number of records from 0 to \(RecordInContext.maximumContext)")
        }
        return count
    }

    /// A removal's `?reason=`: empty when absent; refused when it breaks the rule of reasons.
    static func removalReason(_ request: Request) throws -> String {
        let reason = request.uri.queryParameters.get("reason") ?? ""
        if let problem = reasonProblem(reason) { throw AdminAPIError(.badRequest, "bad_request", problem) }
        return reason
    }

    /// An id from a URL or a body, checked against the protocol's form before any use.
    static func validID(_ id: String, _ what: String) throws -> String {
        guard WireID.isValid(id) else { throw AdminAPIError(.badRequest, "bad_request", "\(what) id must be 32 lowercase hex characters") }
        return id
    }

    static func decode<T: Decodable>(_ type: T.Type, from request: Request) async throws -> T {
        var request = request
        let buffer: ByteBuffer
        do {
            buffer = try await request.collectBody(upTo: maximumBody)
        } catch {
            throw AdminAPIError(.contentTooLarge, "bad_request", "request body larger than \(maximumBody) bytes")
        }
        do {
            return try JSONDecoder.adminAPI.decode(T.self, from: Data(buffer.readableBytesView))
        } catch {
            throw AdminAPIError(.badRequest, "bad_request", "cannot read the request body as \(T.self): \(error)")
        }
    }

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) throws -> Response {
        let body = try JSONEncoder.adminAPI.encode(value)
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }
}

/// At most one audit entry per key and interval: a key is admitted, then refused until the
/// interval has passed, the refusals counted. Bounded: when full of keys still in their
/// interval, it forgets them all (some entries are then recorded twice, none lost).
final class AuditThrottle: Sendable {
    let interval: TimeInterval
    static let capacity = 10_000
    private let state = Mutex<[String: (last: Date, suppressed: Int)]>([:])

    init(interval: TimeInterval) { self.interval = interval }

    /// Nil: not now (counted). Else record, with how many were refused since the last entry.
    func admit(_ key: String, now: Date) -> Int? {
        state.withLock { state in
            if let entry = state[key], now.timeIntervalSince(entry.last) < interval {
                state[key]?.suppressed += 1
                return nil
            }
            if state.count >= Self.capacity {
                state = state.filter { now.timeIntervalSince($0.value.last) < interval }
                if state.count >= Self.capacity { state.removeAll() }
            }
            let suppressed = state[key]?.suppressed ?? 0
            state[key] = (now, 0)
            return suppressed
        }
    }

    /// The entry could not be written: the key is admitted again next time.
    func forget(_ key: String) {
        _ = state.withLock { $0.removeValue(forKey: key) }
    }
}

/// When a search is recorded in the audit log: the first time an actor runs it (its filter, as
/// ``AdminAPI/describe(_:)`` writes it), then again only after ten minutes, so the pages of a
/// search and the looks of a follow do not flood the log, while no filter is ever run unrecorded.
final class SearchAudit: Sendable {
    private let throttle = AuditThrottle(interval: 600)

    func shouldRecord(actor: String, detail: String, now: Date) -> Bool { throttle.admit(actor + "\u{0}" + detail, now: now) != nil }

    /// The write failed: the search is not recorded, so it must be the next time.
    func forget(actor: String, detail: String) { throttle.forget(actor + "\u{0}" + detail) }

    /// Records `action` unless the same actor and detail were recorded in the last ten
    /// minutes; a write that fails is thrown, and the next one tries again.
    func record(_ action: String, actor: String, detail: String, in audit: any AuditLog) async throws {
        guard shouldRecord(actor: actor, detail: detail, now: Date()) else { return }
        do {
            try await audit.record(actor: actor, action: action, detail: detail, at: Date())
        } catch {
            forget(actor: actor, detail: detail)
            throw error
        }
    }
}

/// Carries the name of the admin token that authenticated the request, for the audit log.
public struct AdminRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    public var tokenName: String?
    /// Where the request came from, for the audit log of refused tokens.
    public var remoteAddress: String?

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        tokenName = nil
        remoteAddress = source.channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" }
    }
}

/// `Authorization: Bearer <admin token>`, checked against the token hashes the server keeps.
/// A refused token is recorded in the audit log (`auth.failed`, with the source address and
/// the route), at most once a minute per source address, so a flood cannot fill the log.
struct BearerTokenMiddleware: RouterMiddleware {
    let tokens: any TokenVault
    let audit: any AuditLog
    let logger: Logger
    let refusals = RefusalAudit()

    func handle(_ request: Request, context: AdminRequestContext, next: (Request, AdminRequestContext) async throws -> Response) async throws -> Response {
        guard let header = request.headers[.authorization] else {
            await refused(request, context, "no bearer token")
            throw AdminAPIError(.unauthorized, "unauthorized", "missing bearer token")
        }
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer", let name = try await tokens.adminName(for: String(parts[1])) else {
            await refused(request, context, "a token that is not an admin token")
            throw AdminAPIError(.unauthorized, "unauthorized", "admin token not accepted")
        }
        var context = context
        context.tokenName = name
        return try await next(request, context)
    }
}

extension BearerTokenMiddleware {
    private func refused(_ request: Request, _ context: AdminRequestContext, _ why: String) async {
        let source = context.remoteAddress ?? "?"
        // The host alone: each new connection has a new port.
        let host = source.split(separator: ":").dropLast().joined(separator: ":")
        guard let suppressed = refusals.admit(host: host.isEmpty ? source : host, now: Date()) else { return }
        let detail = "\(why) for \(request.method) \(ConnectionUploads.bounded(request.uri.path).debugDescription) from \(source)"
            + (suppressed > 0 ? " (and \(suppressed) more from that host not recorded)" : "")
        do {
            try await audit.record(actor: "-", action: "auth.failed", detail: detail, at: Date())
        } catch {
            logger.error("could not record a refused admin token in the audit log", metadata: ["error": "\(error)"])
        }
    }
}

/// Refused tokens recorded at most once a minute per host; the refusals in between are
/// counted and reported with the next entry.
final class RefusalAudit: Sendable {
    private let throttle = AuditThrottle(interval: 60)

    /// Nil: do not record now (counted). Else record, saying how many were not recorded since.
    func admit(host: String, now: Date) -> Int? { throttle.admit(host, now: now) }
}

/// Turns every error into an ``APIErrorBody``: Hummingbird's own (unknown route, bad method),
/// ours, and unexpected ones (logged, answered 500 without details).
struct ErrorMiddleware: RouterMiddleware {
    typealias Context = AdminRequestContext
    let logger: Logger

    func handle(_ request: Request, context: AdminRequestContext, next: (Request, AdminRequestContext) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as AdminAPIError {
            throw error
        } catch let error as HTTPError {
            throw AdminAPIError(error.status, error.status == .notFound ? "not_found" : "bad_request", error.body ?? "\(error.status)")
        } catch {
            logger.error("admin API request failed", metadata: ["path": "\(request.uri.path)", "error": "\(error)"])
            throw AdminAPIError(.internalServerError, "internal", "internal error; see the server log")
        }
    }
}

struct AdminAPIError: HTTPResponseError {
    let status: HTTPResponse.Status
    let code: String
    let message: String

    init(_ status: HTTPResponse.Status, _ code: String, _ message: String) {
        self.status = status
        self.code = code
        self.message = message
    }

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var headers: HTTPFields = [.contentType: "application/json"]
        if status == .unauthorized { headers[.wwwAuthenticate] = "Bearer realm=\"dredge\"" }
        let body = try JSONEncoder.adminAPI.encode(APIErrorBody(code: code, error: message))
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }
}
