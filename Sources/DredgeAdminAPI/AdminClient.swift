import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A client of the server's admin API: what `dredge` and the benchmarks use. Every call sends
/// the bearer token; every failure is an ``AdminClientError`` that says what to do.
public struct AdminClient: Sendable {
    public let baseURL: URL
    let token: String
    let session: URLSession

    /// - Parameter server: `http://127.0.0.1:7080`, or `host:port`.
    public init(server: String, token: String) throws {
        let text = server.contains("://") ? server : "http://" + server
        guard let url = URL(string: text), let scheme = url.scheme, ["http", "https"].contains(scheme), url.host != nil else {
            throw AdminClientError.badServerAddress(server)
        }
        baseURL = url
        self.token = token
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = 30
        session = URLSession(configuration: configuration)
    }

    public func agents() async throws -> [AgentRecord] {
        try await call("GET", "/v1/agents")
    }

    public func createPull(_ request: PullRequest) async throws -> PullRecord {
        try await call("POST", "/v1/pulls", body: request)
    }

    /// Newest first: the 100 most recent, or up to 1000 with `limit`.
    public func pulls(limit: Int? = nil) async throws -> [PullRecord] {
        try await call("GET", "/v1/pulls", query: limit.map { [URLQueryItem(name: "limit", value: String($0))] } ?? [])
    }

    public func pull(_ id: String) async throws -> PullRecord {
        try await call("GET", "/v1/pulls/\(try Self.pathComponent(id))")
    }

    /// Newest first: the 100 most recent, or up to 1000 with `limit`.
    public func feedback(limit: Int? = nil) async throws -> [FeedbackRecord] {
        try await call("GET", "/v1/feedback", query: limit.map { [URLQueryItem(name: "limit", value: String($0))] } ?? [])
    }

    public func feedback(_ id: String) async throws -> FeedbackRecord {
        try await call("GET", "/v1/feedback/\(try Self.pathComponent(id))")
    }

    /// One page of records across everything pulled (`POST /v1/records/search`).
    public func search(_ search: RecordSearch) async throws -> RecordPage {
        try await call("POST", "/v1/records/search", body: search)
    }

    public func audit(_ query: AuditQuery = AuditQuery()) async throws -> [AuditEntry] {
        var items: [URLQueryItem] = [URLQueryItem(name: "limit", value: String(query.limit))]
        if let since = query.since { items.append(URLQueryItem(name: "since", value: String(Int64((since.timeIntervalSince1970 * 1_000_000).rounded())))) }
        if let actor = query.actor { items.append(URLQueryItem(name: "actor", value: actor)) }
        if let action = query.action { items.append(URLQueryItem(name: "action", value: action)) }
        if let before = query.before { items.append(URLQueryItem(name: "before", value: String(before))) }
        return try await call("GET", "/v1/audit", query: items)
    }

    public func tokens() async throws -> [TokenInfo] {
        try await call("GET", "/v1/tokens")
    }

    public func createToken(_ request: TokenRequest) async throws -> TokenCreated {
        try await call("POST", "/v1/tokens", body: request)
    }

    public func revokeToken(kind: TokenKind, name: String) async throws {
        let _: [TokenInfo] = try await call("DELETE", "/v1/tokens/\(kind.rawValue)/\(try Self.pathComponent(name))")
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

    func call<Response: Decodable>(_ method: String, _ path: String, body: (some Encodable)?, query: [URLQueryItem] = []) async throws -> Response {
        var url = baseURL.appendingPathComponent(path)
        if !query.isEmpty, var components = URLComponents(url: url, resolvingAgainstBaseURL: false) {
            components.queryItems = query
            // `+` is a space to many servers' query parsers: sent encoded.
            components.percentEncodedQuery = components.percentEncodedQuery?.replacingOccurrences(of: "+", with: "%2B")
            url = components.url ?? url
        }
        var request = URLRequest(url: url)
        request.httpMethod = method
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        if let body {
            request.httpBody = try JSONEncoder.adminAPI.encode(body)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let data: Data
        let response: URLResponse
        do {
            (data, response) = try await session.data(for: request)
        } catch {
            throw AdminClientError.unreachable(baseURL.absoluteString, "\(error.localizedDescription)")
        }
        guard let http = response as? HTTPURLResponse else {
            throw AdminClientError.unreachable(baseURL.absoluteString, "not an HTTP response")
        }
        guard (200..<300).contains(http.statusCode) else {
            let body = try? JSONDecoder.adminAPI.decode(APIErrorBody.self, from: data)
            let message = body?.error ?? String(decoding: data.prefix(200), as: UTF8.self)
            switch http.statusCode {
            case 401: throw AdminClientError.unauthorized(message)
            case 404: throw AdminClientError.notFound(message)
            case 400, 409, 413, 422: throw AdminClientError.badRequest(message)
            default: throw AdminClientError.server(http.statusCode, message)
            }
        }
        do {
            return try JSONDecoder.adminAPI.decode(Response.self, from: data)
        } catch {
            throw AdminClientError.server(http.statusCode, "unreadable answer from the server: \(error)")
        }
    }
}

public enum AdminClientError: Error, CustomStringConvertible, Equatable, Sendable {
    case badServerAddress(String)
    case unreachable(String, String)
    case unauthorized(String)
    case notFound(String)
    case badRequest(String)
    case server(Int, String)

    public var description: String {
        switch self {
        case .badServerAddress(let address):
            "'\(address)' is not a server address: give http://HOST:PORT of the admin API"
        case .unreachable(let url, let reason):
            "cannot reach the Dredge server at \(url) (\(reason)): is `dredge-server run` running, and is the address right?"
        case .unauthorized(let message):
            "the server refused the admin token (\(message)): check --token or DREDGE_TOKEN"
        case .notFound(let message), .badRequest(let message):
            message
        case .server(let status, let message):
            "the server answered \(status): \(message)"
        }
    }
}
