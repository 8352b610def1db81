import AsyncHTTPClient
import DredgeAdminAPI
import DredgeDomain
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// A client of the server's admin API: what `dredge` and the benchmarks use. Every call sends
/// the bearer token; every failure is an ``AdminClientError`` that says what to do.
///
/// HTTPS is verified against the system's trust roots, or against one pinned CA only (the
/// deployment's, which `dredge login` stores): a certificate any other CA signed is refused.
public struct AdminClient: Sendable {
    /// Which certificates the client accepts from an `https://` server.
    public enum Trust: Sendable, Hashable {
        /// The system's trust roots (an operator's certificate from a public or company CA).
        case system
        /// Only certificates this CA (PEM) signed.
        case pinned(caPEM: String)
    }

    public let baseURL: URL
    let token: String
    let http: HTTPClient

    /// - Parameter server: `https://HOST:PORT` (`HOST:PORT` alone means https), or
    ///   `http://` to a loopback address only: a token never crosses a network in the clear.
    public init(server: String, token: String, trust: Trust = .system) throws {
        let text = server.contains("://") ? server : "https://" + server
        guard let url = URL(string: text), let scheme = url.scheme, ["http", "https"].contains(scheme), let host = url.host, !host.isEmpty else {
            throw AdminClientError.badServerAddress(server)
        }
        guard scheme == "https" || HostAddress.isLoopback(host) else { throw AdminClientError.plainHTTP(server) }
        baseURL = url
        self.token = token
        http = try Self.client(trust)
    }

    /// One HTTP client per trust, for the life of the process (like `HTTPClient.shared`): a
    /// command makes a handful of calls, and connections are kept between them.
    private static let clients = Mutex<[Trust?: HTTPClient]>([:])

    /// `nil`: no verification, only to fetch the CA whose fingerprint the caller then checks.
    static func client(_ trust: Trust?) throws -> HTTPClient {
        try clients.withLock { clients in
            if let client = clients[trust] { return client }
            var tls = TLSConfiguration.makeClientConfiguration()
            switch trust {
            case .system?:
                break
            case .pinned(let pem)?:
                let roots: [NIOSSLCertificate]
                do { roots = try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8)) } catch { throw AdminClientError.badCA("\(error)") }
                guard !roots.isEmpty else { throw AdminClientError.badCA("no certificate in it") }
                tls.trustRoots = .certificates(roots)
            case nil:
                tls.certificateVerification = .none
            }
            let configuration = HTTPClient.Configuration(
                tlsConfiguration: tls, redirectConfiguration: .disallow, timeout: .init(connect: .seconds(10), read: .seconds(60)))
            let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
            clients[trust] = client
            return client
        }
    }

    /// The deployment CA a server hands out at `/ca.pem`, accepted only if its SHA-256 (of the
    /// DER) is `fingerprint` (`sha256:` + hex, as `dredge-server init` prints it). The TLS of
    /// this one request is not verified: the fingerprint is what makes the answer trustworthy.
    public static func fetchCA(server: String, fingerprint: String) async throws -> String {
        let client = try AdminClient(server: server, token: "")
        let expected = fingerprint.lowercased().replacingOccurrences(of: "sha256:", with: "").replacingOccurrences(of: ":", with: "")
        guard expected.count == 64, expected.allSatisfy(\.isHexDigit) else {
            throw AdminClientError.badRequest("'\(fingerprint)' is not a fingerprint: give sha256: and 64 hex digits, as `dredge-server init` printed it")
        }
        let (status, body) = try await client.send("GET", client.url("/ca.pem"), headers: [:], body: nil, through: try Self.client(nil))
        guard status == 200 else { throw AdminClientError.server(status, "the server did not hand out its CA") }
        guard let pem = verifiedCA(String(decoding: body.prefix(64 * 1024), as: UTF8.self), sha256Hex: expected) else {
            throw AdminClientError.fingerprintMismatch(server)
        }
        return pem
    }

    /// The first certificate of `pem`, re-encoded alone, if its DER's SHA-256 is `sha256Hex`:
    /// whatever else the text holds (a second CA slipped in after the real one) is dropped,
    /// so only the certificate the fingerprint names is ever pinned.
    static func verifiedCA(_ pem: String, sha256Hex expected: String) -> String? {
        guard let der = pemBody(pem), FileDigest.sha256(der) == expected else { return nil }
        let base64 = Data(der).base64EncodedString()
        var lines: [String] = []
        var rest = Substring(base64)
        while !rest.isEmpty {
            lines.append(String(rest.prefix(64)))
            rest = rest.dropFirst(64)
        }
        return "-----BEGIN CERTIFICATE-----\n" + lines.joined(separator: "\n") + "\n-----END CERTIFICATE-----\n"
    }

    /// The DER of the first certificate in a PEM text.
    static func pemBody(_ pem: String) -> [UInt8]? {
        guard let begin = pem.range(of: "-----BEGIN CERTIFICATE-----"), let end = pem.range(of: "-----END CERTIFICATE-----", range: begin.upperBound..<pem.endIndex) else {
            return nil
        }
        let base64 = pem[begin.upperBound..<end.lowerBound].filter { !$0.isWhitespace }
        return Data(base64Encoded: String(base64)).map { Array($0) }
    }


    /// `GET /health` (no token needed): throws unless the server answers 200.
    public func health() async throws {
        let (status, data) = try await send("GET", url("/health"), headers: [:], body: nil)
        try Self.check(status, data)
    }

    /// Every enrolled agent; with `uid`, only those that hold it, each with when it last saw it.
    public func agents(uid: String? = nil) async throws -> [AgentRecord] {
        try await call("GET", "/v1/agents", query: uid.map { [URLQueryItem(name: "uid", value: $0)] } ?? [])
    }

    // MARK: Live tails (#53)

    public func createTail(_ request: TailRequest) async throws -> TailRecord {
        try await call("POST", "/v1/tails", body: request)
    }

    /// Newest first.
    public func tails(limit: Int? = nil) async throws -> [TailRecord] {
        try await call("GET", "/v1/tails", query: Self.listing(limit: limit, diskUse: true))
    }

    public func tail(_ id: String) async throws -> TailRecord {
        try await call("GET", "/v1/tails/\(try Self.pathComponent(id))")
    }

    public func stopTail(_ id: String, reason: String = "") async throws -> TailRecord {
        try await call("DELETE", "/v1/tails/\(try Self.pathComponent(id))", query: reason.isEmpty ? [] : [URLQueryItem(name: "reason", value: reason)])
    }

    /// Defines a standing trigger (#54).
    public func createTrigger(_ request: TriggerRequest) async throws -> TriggerRecord {
        try await call("POST", "/v1/triggers", body: request)
    }

    /// Newest first; removed triggers are not listed.
    public func triggers(limit: Int? = nil) async throws -> [TriggerRecord] {
        try await call("GET", "/v1/triggers", query: limit.map { [URLQueryItem(name: "limit", value: "\($0)")] } ?? [])
    }

    public func trigger(_ id: String) async throws -> TriggerRecord {
        try await call("GET", "/v1/triggers/\(try Self.pathComponent(id))")
    }

    public func disableTrigger(_ id: String, reason: String = "") async throws -> TriggerRecord {
        try await call("POST", "/v1/triggers/\(try Self.pathComponent(id))/disable", query: reason.isEmpty ? [] : [URLQueryItem(name: "reason", value: reason)])
    }

    public func removeTrigger(_ id: String, reason: String = "") async throws -> TriggerRecord {
        try await call("DELETE", "/v1/triggers/\(try Self.pathComponent(id))", query: reason.isEmpty ? [] : [URLQueryItem(name: "reason", value: reason)])
    }

    /// A trigger, the devices that hold it, its captures of the last day and its newest
    /// captures (`GET /v1/triggers/{id}/captures`).
    public func triggerActivity(_ id: String, limit: Int? = nil) async throws -> TriggerActivity {
        try await call("GET", "/v1/triggers/\(try Self.pathComponent(id))/captures", query: limit.map { [URLQueryItem(name: "limit", value: "\($0)")] } ?? [])
    }

    /// The newest captures of every trigger the caller may read.
    public func captures(limit: Int? = nil) async throws -> [CaptureRecord] {
        try await call("GET", "/v1/captures", query: limit.map { [URLQueryItem(name: "limit", value: "\($0)")] } ?? [])
    }

    public func capture(_ id: String) async throws -> CaptureRecord {
        try await call("GET", "/v1/captures/\(try Self.pathComponent(id))")
    }

    /// Deletes a capture's files and index rows (`DELETE /v1/captures/{id}`); the record stays, marked removed.
    public func removeCapture(_ id: String, reason: String? = nil) async throws -> RemovalReport {
        try await call("DELETE", "/v1/captures/\(try Self.pathComponent(id))", query: reason.map { [URLQueryItem(name: "reason", value: $0)] } ?? [])
    }

    /// Calls `each` with every event of the tail's stream (`GET /v1/tails/{id}/stream`), as it
    /// arrives, until the `end` event (the last) or the server closes the stream.
    public func watchTail(_ id: String, _ each: (TailEvent) async throws -> Void) async throws {
        let response = try await start("GET", url("/v1/tails/\(try Self.pathComponent(id))/stream"), headers: [:], body: nil)
        guard response.status == .ok else {
            let body: ByteBuffer
            do { body = try await response.body.collect(upTo: 1 << 20) } catch { throw describe(error) }
            try Self.check(Int(response.status.code), Data(body.readableBytesView))
            return
        }
        var pending: [UInt8] = []
        do {
            for try await chunk in response.body {
                pending += chunk.readableBytesView
                var start = 0
                while let newline = pending[start...].firstIndex(of: 0x0A) {
                    let line = pending[start..<newline]
                    start = newline + 1
                    // Empty lines keep a quiet stream alive.
                    guard line.contains(where: { $0 != 0x20 && $0 != 0x0D }) else { continue }
                    let event: TailEvent
                    do {
                        event = try JSONDecoder.adminAPI.decode(TailEvent.self, from: Data(line))
                    } catch {
                        throw AdminClientError.server(200, "unreadable line in the tail's stream: \(error)")
                    }
                    try await each(event)
                    if event.kind == .end { return }
                }
                pending.removeFirst(start)
                guard pending.count <= Self.maximumAnswer else { throw AdminClientError.server(200, "a line of the tail's stream is over \(Self.maximumAnswer) bytes") }
            }
        } catch let error as AdminClientError {
            throw error
        } catch {
            throw describe(error)
        }
    }

    public func createPull(_ request: PullRequest) async throws -> PullRecord {
        try await call("POST", "/v1/pulls", body: request)
    }

    /// Newest first: the 100 most recent, or up to 1000 with `limit`; with `reason`, only those
    /// whose reason holds it (ASCII letters in any case); without their disk use (`diskBytes`,
    /// which costs the server a walk of each pull's directory) when `diskUse` is false.
    public func pulls(limit: Int? = nil, reason: String? = nil, diskUse: Bool = true) async throws -> [PullRecord] {
        try await call("GET", "/v1/pulls", query: Self.listing(limit: limit, diskUse: diskUse) + (reason.map { [URLQueryItem(name: "reason", value: $0)] } ?? []))
    }

    static func listing(limit: Int?, diskUse: Bool) -> [URLQueryItem] {
        (limit.map { [URLQueryItem(name: "limit", value: String($0))] } ?? []) + (diskUse ? [] : [URLQueryItem(name: "disk", value: "false")])
    }

    /// One pull; without its disk use when `diskUse` is false (as for ``pulls(limit:diskUse:)``).
    public func pull(_ id: String, diskUse: Bool = true) async throws -> PullRecord {
        try await call("GET", "/v1/pulls/\(try Self.pathComponent(id))", query: Self.listing(limit: nil, diskUse: diskUse))
    }

    /// Newest first: the 100 most recent, or up to 1000 with `limit`; `diskUse` as for ``pulls(limit:diskUse:)``.
    public func feedback(limit: Int? = nil, diskUse: Bool = true) async throws -> [FeedbackRecord] {
        try await call("GET", "/v1/feedback", query: Self.listing(limit: limit, diskUse: diskUse))
    }

    public func feedback(_ id: String, diskUse: Bool = true) async throws -> FeedbackRecord {
        try await call("GET", "/v1/feedback/\(try Self.pathComponent(id))", query: Self.listing(limit: nil, diskUse: diskUse))
    }

    /// Deletes a pull's files and index rows (`DELETE /v1/pulls/{id}`); the record stays, marked removed.
    public func removePull(_ id: String, reason: String? = nil) async throws -> RemovalReport {
        try await call("DELETE", "/v1/pulls/\(try Self.pathComponent(id))", query: reason.map { [URLQueryItem(name: "reason", value: $0)] } ?? [])
    }

    /// Deletes what a live tail held, its files and index rows (`DELETE /v1/tails/{id}/records`);
    /// a tail still running is stopped first.
    public func removeTail(_ id: String, reason: String? = nil) async throws -> RemovalReport {
        try await call("DELETE", "/v1/tails/\(try Self.pathComponent(id))/records", query: reason.map { [URLQueryItem(name: "reason", value: $0)] } ?? [])
    }

    /// Deletes a feedback's files and index rows (`DELETE /v1/feedback/{id}`).
    public func removeFeedback(_ id: String, reason: String? = nil) async throws -> RemovalReport {
        try await call("DELETE", "/v1/feedback/\(try Self.pathComponent(id))", query: reason.map { [URLQueryItem(name: "reason", value: $0)] } ?? [])
    }

    /// One page of records across everything pulled (`POST /v1/records/search`).
    public func search(_ search: RecordSearch) async throws -> RecordPage {
        try await call("POST", "/v1/records/search", body: search)
    }

    /// How many records a search matches, per level, per host and over time (`POST /v1/records/stats`).
    public func stats(_ search: RecordSearch) async throws -> RecordStats {
        try await call("POST", "/v1/records/stats", body: search)
    }

    /// The types, hosts and apps the server's records have (`GET /v1/records/vocabulary`).
    public func vocabulary() async throws -> RecordVocabulary {
        try await call("GET", "/v1/records/vocabulary")
    }

    /// A record by id with up to `context` records on each side from the same device's payload
    /// (`GET /v1/records/{id}?context=N`).
    public func record(_ id: Int64, context: Int = 10) async throws -> RecordInContext {
        try await call("GET", "/v1/records/\(id)", query: [URLQueryItem(name: "context", value: String(context))])
    }

    public func audit(_ query: AuditQuery = AuditQuery()) async throws -> [AuditEntry] {
        var items: [URLQueryItem] = [URLQueryItem(name: "limit", value: String(query.limit))]
        if let since = query.since { items.append(URLQueryItem(name: "since", value: String(Int64((since.timeIntervalSince1970 * 1_000_000).rounded())))) }
        if let actor = query.actor { items.append(URLQueryItem(name: "actor", value: actor)) }
        if let action = query.action { items.append(URLQueryItem(name: "action", value: action)) }
        if let before = query.before { items.append(URLQueryItem(name: "before", value: String(before))) }
        return try await call("GET", "/v1/audit", query: items)
    }

    /// The audit log's hash chain, checked by the server from its first entry.
    public func verifyAudit() async throws -> AuditVerification {
        try await call("GET", "/v1/audit/verify")
    }

    /// Revokes an agent; the agent as it is now.
    public func revokeAgent(_ id: String, reason: String?) async throws -> AgentRecord {
        try await call("POST", "/v1/agents/\(try Self.pathComponent(id))/revoke", body: AgentRevocationRequest(reason: reason))
    }

    public func tokens() async throws -> [TokenInfo] {
        try await call("GET", "/v1/tokens")
    }

    public func createToken(_ request: TokenRequest) async throws -> TokenCreated {
        try await call("POST", "/v1/tokens", body: request)
    }

    /// Approves a pull that awaits a second person's approval (#55).
    public func approvePull(_ id: String) async throws -> PullRecord {
        try await call("POST", "/v1/pulls/\(try Self.pathComponent(id))/approve", body: Empty())
    }

    /// Who this client's token signs in: its name, role, scope and expiry (a server before
    /// roles answers 404: every token was an admin there).
    public func whoami() async throws -> CallerInfo {
        try await call("GET", "/v1/whoami")
    }

    /// `POST /v1/sso/device` (no token): begins `dredge login --sso`.
    public func startDeviceSignIn() async throws -> DeviceSignInStarted {
        try await call("POST", "/v1/sso/device")
    }

    /// `POST /v1/sso/device/token` (no token): one poll; pending, or signed in with a token.
    public func pollDeviceSignIn(_ poll: DeviceSignInPoll) async throws -> DeviceSignInAnswer {
        try await call("POST", "/v1/sso/device/token", body: poll)
    }

    public func revokeToken(kind: TokenKind, name: String) async throws {
        // A token single sign-on made is named for its person (`sso:SUBJECT~LOGIN`): sent as
        // it is, percent-encoded where a path needs it, and decoded by the server.
        let component = name.hasPrefix("sso:") && !name.contains("/") ? name : try Self.pathComponent(name)
        let _: [TokenInfo] = try await call("DELETE", "/v1/tokens/\(kind.rawValue)/\(component)")
    }

    /// Polls a pull until every target is final, calling `progress` after each look.
    public func wait(for id: String, every interval: Duration = .milliseconds(250), progress: (PullRecord) -> Void = { _ in }) async throws -> PullRecord {
        while true {
            let pull = try await pull(id)
            progress(pull)
            if pull.isFinished { return pull }
            try await Task.sleep(for: interval)
        }
    }

    static func pathComponent(_ text: String) throws -> String {
        guard !text.isEmpty, text.allSatisfy({ $0.isLetter || $0.isNumber || "-_.".contains($0) }) else {
            throw AdminClientError.badRequest("'\(text)' is not a valid id or name")
        }
        return text
    }

    struct Empty: Encodable {}

    func call<Response: Decodable>(_ method: String, _ path: String, query: [URLQueryItem] = []) async throws -> Response {
        try await call(method, path, body: Optional<Empty>.none, query: query)
    }

    func url(_ path: String, query: [URLQueryItem] = []) -> URL {
        var url = baseURL.appendingPathComponent(path)
        if !query.isEmpty, var components = URLComponents(url: url, resolvingAgainstBaseURL: false) {
            components.queryItems = query
            // `+` is a space to many servers' query parsers: sent encoded.
            components.percentEncodedQuery = components.percentEncodedQuery?.replacingOccurrences(of: "+", with: "%2B")
            url = components.url ?? url
        }
        return url
    }

    func call<Response: Decodable>(_ method: String, _ path: String, body: (some Encodable)?, query: [URLQueryItem] = []) async throws -> Response {
        let encoded = try body.map { try JSONEncoder.adminAPI.encode($0) }
        let (status, data) = try await send(method, url(path, query: query), headers: encoded == nil ? [:] : ["Content-Type": "application/json"], body: encoded)
        try Self.check(status, data)
        do {
            return try JSONDecoder.adminAPI.decode(Response.self, from: data)
        } catch {
            throw AdminClientError.server(status, "unreadable answer from the server: \(error)")
        }
    }

    /// Answers of at most this size are read whole (a page of records, a listing).
    static let maximumAnswer = 256 << 20

    func send(_ method: String, _ url: URL, headers: [String: String], body: Data?, through client: HTTPClient? = nil) async throws -> (Int, Data) {
        let response = try await start(method, url, headers: headers, body: body, through: client)
        do {
            let buffer = try await response.body.collect(upTo: Self.maximumAnswer)
            return (Int(response.status.code), Data(buffer.readableBytesView))
        } catch {
            throw describe(error)
        }
    }

    /// Sends a request and returns once the answer's head is in; the body streams.
    func start(_ method: String, _ url: URL, headers: [String: String], body: Data?, through client: HTTPClient? = nil) async throws -> HTTPClientResponse {
        var request = HTTPClientRequest(url: url.absoluteString)
        request.method = HTTPMethod(rawValue: method)
        if !token.isEmpty { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        request.headers.add(name: "Accept", value: "application/json")
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let body { request.body = .bytes(ByteBuffer(bytes: body)) }
        do {
            return try await (client ?? http).execute(request, timeout: .seconds(60))
        } catch {
            throw describe(error)
        }
    }

    /// A transport failure as the engineer can act on it: an untrusted certificate says so.
    func describe(_ error: any Error) -> AdminClientError {
        if let error = error as? AdminClientError { return error }
        let text = "\(error)"
        if text.contains("CERTIFICATE_VERIFY_FAILED") { return .untrusted(baseURL.absoluteString, "its certificate is not signed by the CA this client trusts") }
        if error is NIOSSLError || text.contains("handshakeFailed") { return .untrusted(baseURL.absoluteString, text) }
        if let error = error as? HTTPClientError, error == .remoteConnectionClosed, baseURL.scheme == "http" {
            return .unreachable(baseURL.absoluteString, "the connection was closed: does the server speak https?")
        }
        // It answered, but not in HTTP: Dredge's agent port (TLS with the same CA) does that.
        if error is HTTPParserError {
            return .unreachable(
                baseURL.absoluteString,
                "it did not answer in HTTP: is this the agent port? The admin API is on the address `dredge-server init` printed (port 7080 unless --admin-port chose another)")
        }
        let address = "\(baseURL.host ?? "?"):\(baseURL.port ?? (baseURL.scheme == "http" ? 80 : 443))"
        // The socket's error, under NIO's per-address connection errors when a name was resolved.
        let socket = (error as? NIOConnectionError)?.connectionErrors.first?.error ?? error
        if let io = socket as? IOError, let failure = ConnectFailure(errno: io.errnoCode, address: address) { return .unreachable(baseURL.absoluteString, failure.description) }
        if let connection = error as? NIOConnectionError, connection.connectionErrors.isEmpty, connection.dnsAError != nil || connection.dnsAAAAError != nil {
            return .unreachable(baseURL.absoluteString, "no host of that name could be found (\(connection.host))")
        }
        var timedOut = (error as? HTTPClientError) == .connectTimeout
        if case ChannelError.connectTimeout? = error as? ChannelError { timedOut = true }
        if timedOut {
            return .unreachable(baseURL.absoluteString, "\(address) did not answer in time: is the address right, and does a firewall let it through?")
        }
        return .unreachable(baseURL.absoluteString, text)
    }

    static func check(_ status: Int, _ data: Data) throws {
        guard (200..<300).contains(status) else {
            let body = try? JSONDecoder.adminAPI.decode(APIErrorBody.self, from: data)
            let message = body?.error ?? String(decoding: data.prefix(200), as: UTF8.self)
            switch status {
            case 401: throw AdminClientError.unauthorized(message)
            case 403: throw AdminClientError.forbidden(message)
            case 404: throw AdminClientError.notFound(message)
            case 400, 409, 413, 416, 422: throw AdminClientError.badRequest(message)
            default: throw AdminClientError.server(status, message)
            }
        }
    }
}

public enum AdminClientError: Error, CustomStringConvertible, Equatable, Sendable {
    case badServerAddress(String)
    case unreachable(String, String)
    case unauthorized(String)
    /// The token's role (or scope) may not do that.
    case forbidden(String)
    case notFound(String)
    case badRequest(String)
    case server(Int, String)
    /// The server's certificate is not signed by the CA this client trusts.
    case untrusted(String, String)
    /// The CA the server handed out is not the one the fingerprint names.
    case fingerprintMismatch(String)
    /// A CA file that holds no usable certificate.
    case badCA(String)
    /// A downloaded file whose SHA-256 is not the one the server listed.
    case corrupt(String)
    /// Plain http to an address that is not loopback.
    case plainHTTP(String)
    /// Writing a download on this machine failed (disk full, no permission).
    case localFile(String, String)

    public var description: String {
        switch self {
        case .badServerAddress(let address):
            "'\(address)' is not a server address: give https://HOST:PORT of the admin API"
        case .unreachable(let url, let reason):
            "cannot reach the Dredge server at \(url) (\(reason)): is `dredge-server run` running, and is the address right?"
        case .unauthorized(let message):
            "the server refused the admin token (\(message)): check --token or DREDGE_TOKEN"
        case .forbidden(let message):
            "not allowed: \(message) (ask an admin for a token with that role: dredge tokens create --role)"
        case .notFound(let message), .badRequest(let message):
            message
        case .server(let status, let message):
            "the server answered \(status): \(message)"
        case .untrusted(let url, let reason):
            "the certificate of \(url) is not trusted (\(reason)): log in again with the deployment's --ca or --fingerprint, or check that the address is the server's"
        case .fingerprintMismatch(let url):
            "the CA that \(url) hands out does not have that fingerprint: not logging in (is the address or the fingerprint wrong, or is something in between?)"
        case .badCA(let reason):
            "the CA certificate is not usable: \(reason)"
        case .corrupt(let what):
            what
        case .plainHTTP(let address):
            "'\(address)': plain http only to a loopback address (the token would cross the network in the clear); give https://"
        case .localFile(let path, let reason):
            "cannot write \(path): \(reason)"
        }
    }
}
