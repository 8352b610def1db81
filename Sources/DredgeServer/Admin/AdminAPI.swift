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
/// a bearer admin token whose role may use it (``routeOperations``), JSON in and out. Routes are
/// listed in docs/admin-api.md.
public enum AdminAPI {
    /// Builds the Hummingbird application; a `Service` for the server's service group. Every
    /// route is an adapter over ``AdminActions``: one route collection per resource
    /// (``AgentRoutes``, ``PullRoutes``, ``FeedbackRoutes``, ``FileRoutes``, ``RecordRoutes``,
    /// ``AuditRoutes``, ``TokenRoutes``), and the console beside them.
    public static func application(
        actions: AdminActions, consoleSessions: ConsoleSessions? = nil, host: String = "127.0.0.1", port: Int, tls: TLSConfiguration? = nil,
        caPEM: String? = nil, connectionLimits: AdminConnectionLimits = .default, readiness: Readiness? = nil, metrics: MetricsEndpoint? = nil,
        reloadableTLS: ReloadableTLS? = nil, singleSignOn: SingleSignOn? = nil, onReady: @escaping @Sendable (Int) -> Void = { _ in }
    ) throws -> some ApplicationProtocol {
        let logger = actions.logger
        // HEAD answers every GET route with its headers (a download's size, ETag and SHA-256
        // without its bytes; `serve` neither reads nor audits the file then).
        let router = Router(context: AdminRequestContext.self, options: .autoGenerateHeadEndpoints)
        // Requests counted and timed by route, outermost: the status as answered, every route.
        if let metrics { router.add(middleware: HTTPMetricsMiddleware(metrics: metrics.metrics)) }
        router.add(middleware: ErrorMiddleware(logger: logger))
        router.get("health") { _, _ in try json(["status": "ok"]) }
        if let metrics {
            // For Prometheus, behind the scrape token only (``ScrapeToken``); a refused one is
            // audited as a refused admin token is.
            router.get("metrics") { request, context in
                if let token = metrics.token, !token.accepts(request.headers[.authorization]) {
                    await actions.refusedToken("a token that is not the scrape token", for: "GET /metrics", from: context.remoteAddress ?? "?")
                    throw AdminAPIError(.unauthorized, "unauthorized", "the metrics need the scrape token (metrics-token in the data directory)")
                }
                return await metrics.response()
            }
        }
        // Whether to send this server work (``Readiness``): 200 when every check passes, else
        // 503; each check named with `ok` or what is wrong. No token: load balancers ask.
        if let readiness {
            router.get("ready") { _, _ in
                let results = await readiness.evaluate()
                let ready = results.allSatisfy { $0.problem == nil }
                let checks = Dictionary(results.map { ($0.name, $0.problem ?? "ok") }, uniquingKeysWith: { first, _ in first })
                return try json(ReadinessAnswer(status: ready ? "ready" : "not ready", checks: checks), status: ready ? .ok : .serviceUnavailable)
            }
        }
        // A browser pointed at the listener finds the console.
        router.get("/") { _, _ in Response(status: .seeOther, headers: [.location: "/console/"]) }
        // The deployment's CA, public: `dredge login --fingerprint` fetches it and checks it
        // against the fingerprint `init` printed before trusting anything else.
        if let caPEM {
            router.get("ca.pem") { _, _ in
                Response(status: .ok, headers: [.contentType: "application/x-pem-file"], body: .init(byteBuffer: ByteBuffer(string: caPEM)))
            }
        }

        // Sessions are kept with the tokens (in the database) unless the caller set their lifetime or clock.
        let sessions = consoleSessions ?? ConsoleSessions(vault: actions.services.tokens)
        try Console.register(on: router, Console.Dependencies(actions: actions, sessions: sessions, secure: tls != nil, sso: singleSignOn))

        // How a person without a token gets one: no bearer middleware (``SignOnRoutes``).
        router.addRoutes(SignOnRoutes.collection(actions, singleSignOn), atPath: "v1/sso")
        let v1 = router.group("v1").add(middleware: BearerTokenMiddleware(actions: actions))
        v1.addRoutes(AgentRoutes.collection(actions), atPath: "agents")
        v1.addRoutes(PullRoutes.collection(actions), atPath: "pulls")
        v1.addRoutes(TailRoutes.collection(actions), atPath: "tails")
        v1.addRoutes(TriggerRoutes.collection(actions), atPath: "triggers")
        v1.addRoutes(FeedbackRoutes.collection(actions), atPath: "feedback")
        v1.addRoutes(CaptureRoutes.collection(actions), atPath: "captures")
        v1.addRoutes(FileRoutes.collection(actions))
        v1.addRoutes(RecordRoutes.collection(actions), atPath: "records")
        v1.addRoutes(AuditRoutes.collection(actions), atPath: "audit")
        v1.addRoutes(TokenRoutes.collection(actions), atPath: "tokens")
        v1.get("whoami") { _, context in try json(actions.whoami(try context.signedIn)) }

        let scheme = tls == nil ? "http" : "https"
        // Deadlines and caps of its own (``AdminConnectionLimits``), as the agent listener has.
        let gate = AdminConnectionGate(limits: connectionLimits)
        let refusals = RateLimitedLog(perMinute: 10)
        // One context for every connection, replaced when the certificate is renewed.
        let context = try tls.map { try reloadableTLS ?? ReloadableTLS($0) }
        return Application(
            router: router,
            server: HTTPServerBuilder { responder in
                AdminChildChannel(responder: responder, tls: context, gate: gate, refusals: refusals, logger: logger)
            },
            configuration: .init(address: .hostname(host, port: port), serverName: "dredge-admin"),
            onServerRunning: { channel in
                let bound = channel.localAddress?.port ?? port
                let name = host.contains(":") ? "[\(host)]" : host
                logger.info(
                    "admin API ready",
                    metadata: ["address": "\(name):\(bound)", "url": "\(scheme)://\(name):\(bound)", "console": "\(scheme)://\(name):\(bound)/console/"])
                onReady(bound)
            },
            logger: logger)
    }

    static let maximumBody = 64 * 1024

    /// What each `/v1` route is, for ``AdminOperation``'s table of roles: by method and route as
    /// the router names it (HEAD as GET). A route missing here is refused to everyone
    /// (``BearerTokenMiddleware``), so a new route is closed until it is named.
    static let routeOperations: [String: AdminOperation] = [
        "GET /v1/whoami": .whoami,
        "GET /v1/agents": .listAgents,
        "POST /v1/agents/{id}/revoke": .revokeAgent,
        "GET /v1/pulls": .readPulls,
        "GET /v1/pulls/{id}": .readPulls,
        "POST /v1/pulls": .createPull,
        "POST /v1/pulls/{id}/approve": .approvePull,
        "DELETE /v1/pulls/{id}": .removeResults,
        "GET /v1/pulls/{id}/files": .readFiles,
        "GET /v1/pulls/{id}/files/{agent}/{name}": .readFiles,
        "GET /v1/pulls/{id}/zip": .readFiles,
        "GET /v1/tails": .readTails,
        "GET /v1/tails/{id}": .readTails,
        "POST /v1/tails": .createTail,
        "DELETE /v1/tails/{id}": .stopTail,
        "DELETE /v1/tails/{id}/records": .removeResults,
        "GET /v1/tails/{id}/stream": .watchTail,
        "GET /v1/tails/{id}/files": .readFiles,
        "GET /v1/tails/{id}/files/{agent}/{name}": .readFiles,
        "GET /v1/triggers": .readTriggers,
        "GET /v1/triggers/{id}": .readTriggers,
        "POST /v1/triggers": .createTrigger,
        "POST /v1/triggers/{id}/disable": .disableTrigger,
        "DELETE /v1/triggers/{id}": .disableTrigger,
        "GET /v1/triggers/{id}/captures": .readTriggers,
        "GET /v1/captures": .readTriggers,
        "GET /v1/captures/{id}": .readTriggers,
        "DELETE /v1/captures/{id}": .removeResults,
        "GET /v1/captures/{id}/files": .readFiles,
        "GET /v1/captures/{id}/files/{name}": .readFiles,
        "GET /v1/feedback": .readFeedback,
        "GET /v1/feedback/{id}": .readFeedback,
        "DELETE /v1/feedback/{id}": .removeResults,
        "GET /v1/feedback/{id}/files": .readFiles,
        "GET /v1/feedback/{id}/files/{name}": .readFiles,
        "POST /v1/records/search": .searchRecords,
        "POST /v1/records/stats": .searchRecords,
        "GET /v1/records/vocabulary": .searchRecords,
        "GET /v1/records/{id}": .searchRecords,
        "GET /v1/audit": .readAudit,
        "GET /v1/audit/verify": .readAudit,
        "GET /v1/tokens": .manageTokens,
        "POST /v1/tokens": .manageTokens,
        "DELETE /v1/tokens/{kind}/{name}": .manageTokens,
    ]

    /// The operation a request to a `/v1` route is, or nil when the route is not in the table.
    static func operation(_ method: HTTPRequest.Method, route: String?) -> AdminOperation? {
        guard let route else { return nil }
        return routeOperations["\(method == .head ? "GET" : method.rawValue) \(route)"]
    }

    /// A file of a pull, streamed, with `Range` (one range: 206; past the end: 416) and
    /// `If-Range` (the range only while the ETag is the one given, else the whole file: RFC 9110
    /// § 13.1.5), its SHA-256 as `ETag` and `Repr-Digest`. Every download is audited
    /// (``AdminActions/downloading(_:by:)``: one entry per token and device's files of a pull,
    /// whole zip or feedback in ten minutes).
    static func serve(
        _ download: AdminActions.Download, request: Request, context: some RequestContext, actions: AdminActions, caller: Caller
    ) async throws -> Response {
        let located = download.located, file = located.file
        let etag = "\"\(file.sha256)\""
        // A strong comparison; there is no Last-Modified, so a date never matches either.
        let rangeAsked = request.headers[.ifRange].map { $0 == etag } ?? true ? request.headers[.range] : nil
        let range = ByteRange.parse(rangeAsked, size: file.size)
        let headOnly = request.method == .head  // nothing downloaded: not audited, the file not opened
        if !headOnly && range != .unsatisfiable { try await actions.downloading(download, by: caller) }
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
            // As a range: a live tail's file may hold more than is served.
            let body = file.size == 0 || headOnly ? ResponseBody() : try await FileIO().loadFile(path: located.path, range: 0...Int(file.size - 1), context: context)
            return Response(status: .ok, headers: headers, body: body)
        case .partial(let bytes):
            headers[.contentRange] = "bytes \(bytes.lowerBound)-\(bytes.upperBound)/\(file.size)"
            headers[.contentLength] = String(bytes.count)
            if headOnly { return Response(status: .partialContent, headers: headers) }
            let body = try await FileIO().loadFile(path: located.path, range: Int(bytes.lowerBound)...Int(bytes.upperBound), context: context)
            return Response(status: .partialContent, headers: headers, body: body)
        }
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

    /// `?context=N` of a record: 0 to ``RecordInContext/maximumContext``, 10 when absent.
    static func recordContext(_ request: Request) throws -> Int {
        guard let text = request.uri.queryParameters.get("context") else { return 10 }
        guard let count = Int(text), (0...RecordInContext.maximumContext).contains(count) else {
            throw AdminAPIError(.badRequest, "bad_request", "context is a number of records from 0 to \(RecordInContext.maximumContext)")
        }
        return count
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
        } catch let error as DecodingError {
            throw AdminAPIError(.badRequest, "bad_request", "cannot read the request body as \(T.self): \(Self.explained(error))")
        } catch {
            throw AdminAPIError(.badRequest, "bad_request", "cannot read the request body as \(T.self): \(error)")
        }
    }

    /// A decoding error as one line: where in the body (`filter.levels[0]`) and what is wrong.
    static func explained(_ error: DecodingError) -> String {
        func path(_ keys: [any CodingKey]) -> String {
            let text = keys.reduce("") { text, key in
                key.intValue.map { "\(text)[\($0)]" } ?? (text.isEmpty ? key.stringValue : "\(text).\(key.stringValue)")
            }
            return text.isEmpty ? "the body" : text
        }
        switch error {
        case .dataCorrupted(let c): return "\(path(c.codingPath)): \(c.debugDescription)"
        case .keyNotFound(let key, let c): return "\(path(c.codingPath + [key])) is missing"
        case .typeMismatch(let type, let c): return "\(path(c.codingPath)) is not \(type == String.self ? "a string" : "of type \(type)")"
        case .valueNotFound(let type, let c): return "\(path(c.codingPath)) is null where \(type) is wanted"
        @unknown default: return "\(error)"
        }
    }

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) throws -> Response {
        let body = try JSONEncoder.adminAPI.encode(value)
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }
}

/// Carries who the admin token that authenticated the request signs in: its name for the
/// audit log, its role and scope for what it may do and see.
public struct AdminRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    public var caller: Caller?
    /// Where the request came from, for the audit log of refused tokens.
    public var remoteAddress: String?

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        caller = nil
        remoteAddress = source.channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" }
    }

    /// The caller ``BearerTokenMiddleware`` let in: every `/v1` route has one.
    var signedIn: Caller {
        get throws {
            guard let caller else { throw AdminAPIError(.unauthorized, "unauthorized", "missing bearer token") }
            return caller
        }
    }
}

/// `Authorization: Bearer <admin token>`, checked against the token hashes the server keeps
/// (an expired token is no token), then the token's role against the route's operation
/// (``AdminAPI/routeOperations``, ``AdminActions/authorize(_:_:on:)``: 403 `forbidden`, audited).
/// A refused token is recorded in the audit log (`auth.failed`, with the source address and
/// the route), at most once a minute per source address, so a flood cannot fill the log.
struct BearerTokenMiddleware: RouterMiddleware {
    let actions: AdminActions

    func handle(_ request: Request, context: AdminRequestContext, next: (Request, AdminRequestContext) async throws -> Response) async throws -> Response {
        guard let header = request.headers[.authorization] else {
            await refused(request, context, "no bearer token")
            throw AdminAPIError(.unauthorized, "unauthorized", "missing bearer token")
        }
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer", let caller = try await actions.services.tokens.admin(for: String(parts[1]), now: actions.now()) else {
            await refused(request, context, "a token that is not an admin token (or has expired)")
            throw AdminAPIError(.unauthorized, "unauthorized", "admin token not accepted (unknown, revoked or expired)")
        }
        let route = "\(request.method) \(context.endpointPath ?? ConnectionUploads.bounded(request.uri.path).debugDescription)"
        guard let operation = AdminAPI.operation(request.method, route: context.endpointPath) else {
            actions.logger.error("an admin API route has no access rule: refused", metadata: ["route": "\(route)"])
            throw AdminAPIError(.forbidden, "forbidden", "\(route) has no access rule on this server: refused to every role")
        }
        try await actions.authorize(operation, caller, on: route)
        var context = context
        context.caller = caller
        return try await next(request, context)
    }

    private func refused(_ request: Request, _ context: AdminRequestContext, _ why: String) async {
        await actions.refusedToken(why, for: "\(request.method) \(ConnectionUploads.bounded(request.uri.path).debugDescription)", from: context.remoteAddress ?? "?")
    }
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
        } catch let error as ActionError {
            throw AdminAPIError(error)
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

    /// An action's refusal, as the API answers it.
    init(_ error: ActionError) {
        let status: HTTPResponse.Status =
            switch error.kind {
            case .invalid: .badRequest
            case .notFound: .notFound
            case .conflict: .conflict
            case .unavailable: .serviceUnavailable
            case .forbidden: .forbidden
            }
        self.init(status, error.code, error.message)
    }

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var headers: HTTPFields = [.contentType: "application/json"]
        if status == .unauthorized { headers[.wwwAuthenticate] = "Bearer realm=\"dredge\"" }
        let body = try JSONEncoder.adminAPI.encode(APIErrorBody(code: code, error: message))
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }
}
