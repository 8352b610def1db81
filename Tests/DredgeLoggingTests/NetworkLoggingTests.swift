import DredgeDomain
import DredgeLogging
import DredgeStore
import DredgeTestSupport
import Foundation
import FoundationNetworking
import Hummingbird
import Logging
import Testing

#if canImport(FoundationNetworking)
#endif

/// Real HTTP exchanges with a local server on loopback, logged by the URLSession hook.
@Suite struct NetworkLoggingTests {
    /// A test backend: `/orders` answers with the correlation id it received, a cookie, and a
    /// 40-byte body; `/broken` answers 503.
    static func withBackend(_ body: @Sendable (Int) async throws -> Void) async throws {
        let router = Router()
        router.get("orders") { request, _ -> Response in
            let seen = request.headers[.init("X-Conversation-ID")!] ?? "none"
            return Response(
                status: .ok, headers: [.setCookie: "session=server-secret", .init("X-Seen-Conversation")!: seen],
                body: .init(byteBuffer: ByteBuffer(string: String(repeating: "o", count: 40))))
        }
        router.get("broken") { _, _ -> Response in Response(status: .serviceUnavailable) }
        let port = AsyncStream.makeStream(of: Int.self)
        var quiet = Logger(label: "test-backend")
        quiet.logLevel = .critical
        let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)), onServerRunning: { channel in
            port.continuation.yield(channel.localAddress!.port!)
        }, logger: quiet)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await app.run() }
            var ports = port.stream.makeAsyncIterator()
            let bound = await ports.next()!
            do {
                try await body(bound)
            } catch {
                group.cancelAll()
                throw error
            }
            group.cancelAll()
        }
    }

    static func records(_ center: LogCenter) throws -> [(LogRecord, [String: Any])] {
        try center.flush()
        return try center.store.records(matching: LogFilter(types: [.network])).map {
            ($0, (try JSONSerialization.jsonObject(with: Data($0.metadataJSON.utf8)) as? [String: Any]) ?? [:])
        }
    }

    @Test func anExchangeIsLoggedWithItsCorrelationIdAndSecretsRedacted() async throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"))
        center.setUser("u-42")
        var configuration = NetworkLogger.Configuration()
        configuration.redactedHeaders = ["X-Api-Key"]
        configuration.query = .redact(["token"])
        let logging = NetworkLogger(center: center, configuration: configuration)

        try await Self.withBackend { port in
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/orders?id=42&token=tok-secret")!)
            request.setValue("Bearer bearer-secret", forHTTPHeaderField: "Authorization")
            request.setValue("key-secret", forHTTPHeaderField: "X-Api-Key")
            request.setValue("c=cookie-secret", forHTTPHeaderField: "Cookie")
            request.setValue("dredge-test", forHTTPHeaderField: "X-Client")
            let (data, response) = try await URLSession.shared.data(for: request, logging: logging)
            let http = try #require(response as? HTTPURLResponse)
            #expect(data.count == 40)

            let records = try Self.records(center)
            try #require(records.count == 1)
            let (record, meta) = records[0]
            // The id the backend received is the one in the log: backend teams can find it.
            let seen = try #require(http.value(forHTTPHeaderField: "X-Seen-Conversation"))
            #expect(seen.count == 32 && seen.allSatisfy(\.isHexDigit))
            #expect(meta["correlation_id"] as? String == seen)
            #expect(record.type == .network && record.level == .info && record.uid == "u-42")
            #expect(meta["method"] as? String == "GET")
            #expect(meta["url"] as? String == "http://127.0.0.1:\(port)/orders?id=42&token=REDACTED")
            #expect(meta["status"] as? Int == 200)
            #expect(meta["response_bytes"] as? Int == 40)
            #expect((meta["duration_ms"] as? Double ?? -1) >= 0)
            let sent = try #require(meta["request_headers"] as? [String: String])
            #expect(sent["Authorization"] == "<redacted>" && sent["X-Api-Key"] == "<redacted>" && sent["Cookie"] == "<redacted>")
            #expect(sent["X-Client"] == "dredge-test" && sent.first { $0.key.lowercased() == "x-conversation-id" }?.value == seen)
            let received = try #require(meta["response_headers"] as? [String: String])
            #expect(received.first { $0.key.lowercased() == "set-cookie" }?.value == "<redacted>")
            #expect(meta["response_body"] == nil, "bodies are off by default")
            #expect(record.message.hasPrefix("GET http://127.0.0.1:\(port)/orders?id=42&token=REDACTED → 200 in "))
        }
        try center.close()
        // No secret reached the disk, in the database or its WAL.
        for file in ["logs.sqlite", "logs.sqlite-wal"] {
            let bytes = String(decoding: FileManager.default.contents(atPath: dir.file(file)) ?? Data(), as: UTF8.self)
            for secret in ["tok-secret", "bearer-secret", "key-secret", "cookie-secret", "server-secret"] { #expect(!bytes.contains(secret), "\(secret) in \(file)") }
        }
    }

    @Test func existingIdsAreKeptFailuresAreLoggedBodiesAreOptInAndDisabledMeansNothing() async throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"))
        var configuration = NetworkLogger.Configuration()
        configuration.bodies = ["127.0.0.1": 10]
        let logging = NetworkLogger(center: center, configuration: configuration)

        try await Self.withBackend { port in
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/orders?id=7")!)
            request.setValue("conv-123", forHTTPHeaderField: "X-Conversation-ID")
            let (_, response) = try await URLSession.shared.data(for: request, logging: logging)
            #expect((response as? HTTPURLResponse)?.value(forHTTPHeaderField: "X-Seen-Conversation") == "conv-123")
            _ = try await URLSession.shared.data(for: URLRequest(url: URL(string: "http://127.0.0.1:\(port)/broken")!), logging: logging)

            logging.isEnabled = false
            let (_, quiet) = try await URLSession.shared.data(for: URLRequest(url: URL(string: "http://127.0.0.1:\(port)/orders")!), logging: logging)
            #expect((quiet as? HTTPURLResponse)?.value(forHTTPHeaderField: "X-Seen-Conversation") == "none", "disabled: no header added")
            logging.isEnabled = true
        }
        // Nothing listens on port 9 of loopback: a transport failure.
        await #expect(throws: (any Error).self) {
            _ = try await URLSession.shared.data(for: URLRequest(url: URL(string: "http://127.0.0.1:9/down")!), logging: logging)
        }

        let records = try Self.records(center)
        try #require(records.count == 3)
        #expect(records[0].1["correlation_id"] as? String == "conv-123")
        #expect(records[0].1["url"] as? String == "http://127.0.0.1:\(records[0].1["url"].flatMap { URL(string: $0 as! String)?.port } ?? 0)/orders?id=REDACTED")
        #expect(records[0].1["response_body"] as? String == "oooooooooo…[30 more bytes]")
        #expect(records[1].0.level == .error && records[1].1["status"] as? Int == 503)
        #expect(records[2].0.level == .error && records[2].1["status"] == nil && (records[2].1["error"] as? String)?.isEmpty == false)
        #expect(records[2].0.message.contains("/down → failed"))
    }
}
