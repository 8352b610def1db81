import DredgeDomain
import DredgeStore
import Foundation
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking  // URLSession and URLRequest live here on Linux
#endif

/// Passive logging of the app's HTTP exchanges as `network` records, so a failed request can be
/// looked at after the fact, without a proxy.
///
/// Each exchange becomes one record: method, URL (query values redacted by rule), status,
/// duration, request and response sizes, error, headers with secrets redacted, and a
/// correlation id. If the request carries no correlation header, one is generated and *sent*,
/// so backend teams can find the same request in their logs. Bodies are off unless enabled per
/// host, with a size cap.
///
/// Two hooks: ``URLSession/data(for:logging:)`` for Foundation's URLSession, and
/// ``begin(_:)`` / ``NetworkExchange/finish(status:responseHeaders:responseBytes:error:responseBody:)``
/// for any other client. Off unless enabled (``isEnabled``); disabled, the hooks do nothing.
public final class NetworkLogger: Sendable {
    public struct Configuration: Sendable {
        /// The header that carries the correlation id; added to requests without one.
        public var correlationHeader = "X-Conversation-ID"
        /// Headers whose values are replaced by `<redacted>` (case-insensitive). Authorization,
        /// Proxy-Authorization, Cookie and Set-Cookie always are.
        public var redactedHeaders: Set<String> = []
        /// Which query values are kept; the others become `REDACTED`.
        public var query: QueryRule = .redactAll
        /// Hosts whose bodies are recorded, with the most bytes kept of each body.
        public var bodies: [String: Int] = [:]
        /// Level of exchanges that got a response below 400.
        public var successLevel: LogLevel = .info

        public init() {}
    }

    public enum QueryRule: Sendable, Equatable {
        /// Every query value becomes `<redacted>`; the names stay.
        case redactAll
        /// Only these names' values are redacted.
        case redact(Set<String>)
        /// Every value but these names' is redacted.
        case keep(Set<String>)
    }

    static let alwaysRedacted: Set<String> = ["authorization", "proxy-authorization", "cookie", "set-cookie"]

    public let configuration: Configuration
    let logger: DredgeLogger
    let redacted: Set<String>
    /// `configuration.bodies` by lowercased host.
    let bodyCaps: [String: Int]
    private let enabled: Atomic<Bool>
    /// Correlation ids: 64 random bits per logger, then a counter. Unique without a system call
    /// per request (`UUID()` reads the random device every time).
    private let idPrefix: String
    private let idCounter = Atomic<UInt64>(0)

    public init(center: LogCenter, configuration: Configuration = Configuration(), enabled: Bool = true) {
        self.configuration = configuration
        logger = center.logger(type: .network)
        redacted = Self.alwaysRedacted.union(configuration.redactedHeaders.map { $0.lowercased() })
        bodyCaps = Dictionary(configuration.bodies.map { ($0.key.lowercased(), $0.value) }, uniquingKeysWith: min)
        self.enabled = Atomic(enabled)
        var random = SystemRandomNumberGenerator()
        idPrefix = String(random.next() as UInt64, radix: 16).leftPadded(to: 16)
    }

    func nextCorrelationID() -> String {
        let n = idCounter.wrappingAdd(1, ordering: .relaxed).newValue
        return idPrefix + String(n, radix: 16).leftPadded(to: 16)
    }

    public var isEnabled: Bool {
        get { enabled.load(ordering: .relaxed) }
        set { enabled.store(newValue, ordering: .relaxed) }
    }

    /// Starts logging a request: returns the exchange, whose ``NetworkExchange/request`` is the
    /// request to send (with the correlation header added if it had none). Nil when disabled.
    public func begin(_ request: URLRequest) -> NetworkExchange? {
        guard isEnabled else { return nil }
        var request = request
        let header = configuration.correlationHeader
        let correlation: String
        if let existing = request.value(forHTTPHeaderField: header), !existing.isEmpty {
            correlation = existing
        } else {
            correlation = nextCorrelationID()
            request.setValue(correlation, forHTTPHeaderField: header)
        }
        return NetworkExchange(logger: self, request: request, correlationID: correlation, start: ContinuousClock.now)
    }

    /// The URL with query values redacted by the rule (and any user:password removed).
    public func redact(_ url: URL?) -> String {
        guard let url, var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return url?.absoluteString ?? "" }
        if components.user != nil || components.password != nil {
            components.user = nil
            components.password = nil
        }
        components.percentEncodedQueryItems = components.percentEncodedQueryItems?.map { item in
            let name = item.name.lowercased()
            let hide: Bool
            switch configuration.query {
            case .redactAll: hide = true
            case .redact(let names): hide = names.contains { $0.lowercased() == name }
            case .keep(let names): hide = !names.contains { $0.lowercased() == name }
            }
            return hide && item.value != nil ? URLQueryItem(name: item.name, value: "REDACTED") : item
        }
        return components.string ?? ""
    }

    func headers(_ fields: [String: String]) -> LogValue {
        var out: [String: LogValue] = [:]
        for (name, value) in fields {
            out[name] = .string(redacted.contains(name.lowercased()) ? "<redacted>" : value)
        }
        return .object(out)
    }

    func body(_ data: Data?, host: String?) -> LogValue? {
        guard let data, let host, let cap = bodyCaps[host.lowercased()] else { return nil }
        let kept = data.prefix(cap)
        let text = String(decoding: kept, as: UTF8.self)
        return .string(data.count > cap ? text + "…[\(data.count - cap) more bytes]" : text)
    }
}

/// One HTTP exchange being logged.
public struct NetworkExchange: Sendable {
    let logger: NetworkLogger
    /// The request to send: the original with the correlation header.
    public let request: URLRequest
    public let correlationID: String
    let start: ContinuousClock.Instant

    /// Ends the exchange and writes its record. Give `error` for transport failures (no
    /// response); sizes are the bodies' byte counts.
    public func finish(status: Int?, responseHeaders: [String: String] = [:], responseBytes: Int = 0, error: (any Error)? = nil, responseBody: Data? = nil) {
        let elapsed = ContinuousClock.now - start
        let milliseconds = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
        let method = request.httpMethod ?? "GET"
        let url = logger.redact(request.url)
        let host = request.url?.host
        let requestHeaders = request.allHTTPHeaderFields ?? [:]
        var fields: LogFields = [
            "method": method,
            "url": url,
            "host": host ?? "",
            "duration_ms": (milliseconds * 10).rounded() / 10,
            "request_bytes": request.httpBody?.count ?? 0,
            "response_bytes": responseBytes,
            "correlation_id": correlationID,
            "request_headers": logger.headers(requestHeaders),
            "response_headers": logger.headers(responseHeaders),
        ]
        if let status { fields["status"] = status }
        if let error { fields["error"] = String(describing: error) }
        if let body = logger.body(request.httpBody, host: host) { fields["request_body"] = body }
        if let body = logger.body(responseBody, host: host) { fields["response_body"] = body }

        let level: LogLevel
        let outcome: String
        if let error {
            level = .error
            outcome = "failed: \(error.localizedDescription)"
        } else if let status {
            level = status >= 500 ? .error : status >= 400 ? .warning : logger.configuration.successLevel
            outcome = "\(status)"
        } else {
            level = .error
            outcome = "no response"
        }
        let message = "\(method) \(url) → \(outcome) in \(Int(milliseconds.rounded())) ms"
        logger.logger.log(level, LogMessage(stringLiteral: message), metadata: fields)
    }
}

extension URLSession {
    /// `data(for:)`, logged by `logging` when given and enabled: the request goes out with the
    /// correlation header, and one `network` record is written when it ends, failed or not.
    public func data(for request: URLRequest, logging: NetworkLogger?) async throws -> (Data, URLResponse) {
        guard let exchange = logging?.begin(request) else { return try await data(for: request) }
        do {
            let (data, response) = try await data(for: exchange.request)
            let http = response as? HTTPURLResponse
            var headers: [String: String] = [:]
            for (key, value) in http?.allHeaderFields ?? [:] {
                if let key = key as? String { headers[key] = value as? String ?? "\(value)" }
            }
            exchange.finish(status: http?.statusCode, responseHeaders: headers, responseBytes: data.count, responseBody: data)
            return (data, response)
        } catch {
            exchange.finish(status: nil, error: error)
            throw error
        }
    }
}

extension String {
    fileprivate func leftPadded(to length: Int) -> String {
        count >= length ? self : String(repeating: "0", count: length - count) + self
    }
}
