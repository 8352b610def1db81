import Crypto
import DredgeEnvelope
import Foundation
import Hummingbird
import Logging
import Metrics
import NIOCore
import Prometheus

/// `"metrics"` in `server.json`: where Prometheus scrapes the server's metrics.
///
/// The admin listener always serves `GET /metrics` behind the scrape token (``ScrapeToken``),
/// never an admin token: a scraper can read figures and nothing else. `listen` adds a
/// listener of its own, plain HTTP without a token, for a scraper on loopback or a private
/// network (the figures name no user, device or address).
public struct MetricsSettings: Codable, Sendable, Equatable {
    /// `HOST:PORT` (`[IPv6]:PORT`) of a listener that serves only `GET /metrics`, without a
    /// token; none when absent.
    public var listen: String?

    public init(listen: String? = nil) { self.listen = listen }

    public static let `default` = MetricsSettings()

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        listen = try c.decodeIfPresent(String.self, forKey: .listen)
        if let listen, Self.address(listen) == nil {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath + [CodingKeys.listen], debugDescription: "'\(listen)' is not HOST:PORT or [IPv6]:PORT with a port of 0 to 65535"))
        }
    }

    /// The listener's host and port, when `listen` is set.
    public var address: (host: String, port: Int)? { listen.flatMap(Self.address) }

    static func address(_ text: String) -> (host: String, port: Int)? {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65_535).contains(port) else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, !host.contains("/"), !host.contains(" ") else { return nil }
        return (host, port)
    }
}

/// The token Prometheus sends to read `GET /metrics` on the admin listener
/// (`Authorization: Bearer …`; in Prometheus' configuration, `authorization.credentials_file`):
/// `metrics-token` in the data directory, made at the server's first start (0600). Only its
/// SHA-256 is kept in memory, compared in constant time. To change it, replace the file (or
/// delete it, and a new one is made) and restart.
public struct ScrapeToken: Sendable {
    public static let fileName = "metrics-token"
    private let digest: SHA256.Digest

    public init(_ token: String) { digest = SHA256.hash(data: Data(token.utf8)) }

    /// The data directory's token, made first if there is none. `created` says it was.
    public static func loadOrCreate(directory: String) throws -> (token: ScrapeToken, created: Bool) {
        let path = directory + "/" + fileName
        func read() throws -> ScrapeToken? {
            guard let data = FileManager.default.contents(atPath: path) else { return nil }
            let text = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            guard text.utf8.count >= 16 else { throw DeploymentError("\(path) holds no token of at least 16 characters: delete it, and a new one is made at the next start") }
            return ScrapeToken(text)
        }
        if let token = try read() { return (token, false) }
        let text = "dredge-metrics-" + Hex.encode(secureRandomBytes(24))
        do {
            try ServerDeployment.writeExclusive(path, Array((text + "\n").utf8), mode: 0o600)
        } catch {
            // Another node sharing the data directory made it first: its token, once written.
            for _ in 0..<50 {
                if let data = FileManager.default.contents(atPath: path), data.last == 10, let token = try read() { return (token, false) }
                usleep(20_000)
            }
            throw error
        }
        return (ScrapeToken(text), true)
    }

    /// Whether an `Authorization` header carries this token.
    func accepts(_ authorization: String?) -> Bool {
        guard let authorization else { return false }
        let parts = authorization.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return false }
        return SHA256.hash(data: Data(parts[1].utf8)) == digest
    }
}

/// What `GET /metrics` serves and who may read it.
public struct MetricsEndpoint: Sendable {
    public let metrics: ServerMetrics
    /// The token a request must carry; nil on a listener of the metrics' own.
    public let token: ScrapeToken?

    public init(metrics: ServerMetrics, token: ScrapeToken?) {
        self.metrics = metrics
        self.token = token
    }

    /// Prometheus' text format, version 0.0.4.
    static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    func response() async -> Response {
        let body = await metrics.exposition()
        return Response(status: .ok, headers: [.contentType: Self.contentType], body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }

    /// The listener of the metrics' own (``MetricsSettings/listen``): `GET /metrics` only,
    /// plain HTTP, no token.
    public static func listener(metrics: ServerMetrics, host: String, port: Int, logger: Logger, onReady: @escaping @Sendable (Int) -> Void = { _ in })
        -> some ApplicationProtocol
    {
        let router = Router()
        let endpoint = MetricsEndpoint(metrics: metrics, token: nil)
        router.get("metrics") { _, _ in await endpoint.response() }
        return Application(
            router: router, configuration: .init(address: .hostname(host, port: port), serverName: "dredge-metrics"),
            onServerRunning: { channel in
                let bound = channel.localAddress?.port ?? port
                logger.info("metrics listener ready", metadata: ["url": "http://\(host.contains(":") ? "[\(host)]" : host):\(bound)/metrics"])
                onReady(bound)
            },
            logger: logger)
    }
}

extension ServerMetrics {
    /// A swift-metrics factory over this registry: what a library measures through swift-metrics
    /// is exposed beside the server's own figures. `dredge-server run` bootstraps it (once per
    /// process).
    public var swiftMetricsFactory: any MetricsFactory { PrometheusMetricsFactory(registry: registry) }
}

/// Counts and times the admin listener's requests by route (the route's pattern, such as
/// `/v1/pulls/:id`, never the path asked for: bounded), method and status.
struct HTTPMetricsMiddleware<Context: RequestContext>: RouterMiddleware {
    let metrics: ServerMetrics

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let start = ContinuousClock.now
        do {
            let response = try await next(request, context)
            metrics.request(route: context.endpointPath, method: request.method.rawValue, status: response.status.code, took: ContinuousClock.now - start)
            return response
        } catch {
            let status = (error as? any HTTPResponseError)?.status.code ?? 500
            metrics.request(route: context.endpointPath, method: request.method.rawValue, status: status, took: ContinuousClock.now - start)
            throw error
        }
    }
}
