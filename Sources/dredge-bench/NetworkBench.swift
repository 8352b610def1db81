import ArgumentParser
import DredgeDomain
import DredgeLogging
import DredgeStore
import Foundation
import Hummingbird
import Logging

#if canImport(FoundationNetworking)
import FoundationNetworking  // URLSession on Linux
#endif

/// `dredge-bench network`: what logging every HTTP exchange costs the app. Requests/s through
/// URLSession to a local Hummingbird server, with ``NetworkLogger`` (every exchange a `network`
/// record in a real store) ÷ without, in alternating rounds of the same run.
struct NetworkBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "network", abstract: "network.overhead: request rate with network logging ÷ without.")

    @Option(help: "Requests per round.")
    var requests = 1_000

    @Option(help: "Rounds of each kind (alternating).")
    var rounds = 7

    func run() async throws {
        let dir = NSTemporaryDirectory() + "dredge-bench-network-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let center = try LogCenter(path: dir + "/logs.sqlite")
        center.setUser("u-bench")
        var configuration = NetworkLogger.Configuration()
        configuration.query = .redactAll
        let logging = NetworkLogger(center: center, configuration: configuration)

        let router = Router()
        router.get("api/orders") { _, _ -> Response in
            Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: #"{"orders":[1,2,3],"next":null}"#)))
        }
        var quiet = Logger(label: "bench-backend")
        quiet.logLevel = .critical
        let ports = AsyncStream.makeStream(of: Int.self)
        let app = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { ports.continuation.yield($0.localAddress!.port!) }, logger: quiet)

        let session = URLSession(configuration: .ephemeral)
        let (with, without) = try await withThrowingTaskGroup(of: Void.self) { group -> (Double, Double) in
            group.addTask { try await app.run() }
            var iterator = ports.stream.makeAsyncIterator()
            let port = await iterator.next()!
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/api/orders?customer=c-1029&token=t0k")!)
            request.setValue("Bearer secret", forHTTPHeaderField: "Authorization")

            func round(_ logger: NetworkLogger?) async throws -> Double {
                let start = monotonicNanos()
                for _ in 0..<requests { _ = try await session.data(for: request, logging: logger) }
                return Double(requests) / (Double(monotonicNanos() - start) / 1e9)
            }
            _ = try await round(nil)  // warm up the connection and both paths
            _ = try await round(logging)
            var with: [Double] = [], without: [Double] = []
            for _ in 0..<rounds {
                without.append(try await round(nil))
                with.append(try await round(logging))
            }
            group.cancelAll()
            return (median(with), median(without))
        }
        try await center.flush()
        let logged = try center.store.count(matching: LogFilter(types: [.network]))
        try center.close()
        print(Figure(
            name: "network.overhead", value: with, unit: "requests/s", limit: without, higherIsBetter: true,
            extra: "records=\(logged) requests_per_round=\(requests) rounds=\(rounds)").line)
    }
}
