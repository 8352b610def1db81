@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import Synchronization
import Testing

/// `GET /ready` (#56): what a load balancer asks before sending work. Real checks over a real
/// deployment's database, listener port and file system; no token needed, as for `/health`.
@Suite struct ReadinessTests {
    let admin = try! AdminRouteTests.Fixture()

    /// The answer to `GET /ready` from an admin API with `readiness`.
    func ready(_ readiness: Readiness) async throws -> (status: HTTPResponse.Status, answer: [String: Any]) {
        let logger = Logger(label: "test.ready") { _ in SwiftLogNoOpLogHandler() }
        let a = admin
        let services = AdminServices(
            registry: a.registry, pulls: a.pulls, audit: a.pulls, issuer: a.issuer, feedback: a.feedback, tokens: a.tokens,
            dispatcher: PullDispatcher(pulls: a.pulls, logger: logger), logger: logger)
        let app = try AdminAPI.application(actions: AdminActions(services), port: 0, readiness: readiness)
        return try await app.test(.router) { client in
            try await client.execute(uri: "/ready", method: .get) { response in
                (response.status, try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any] ?? [:])
            }
        }
    }

    /// A check's time where the test needs its own answer: the server's 5 s is too short on a
    /// machine loaded by the other suites (a `SELECT 1` was seen to take longer).
    static let patient: Duration = .seconds(120)

    func persistence() throws -> ServerPersistence { ServerPersistence(try ServerStores(try LoadedDeployment(directory: admin.data))) }

    @Test func aServerWhoseChecksPassIsReady() async throws {
        let port = Mutex<Int?>(nil)
        let stores = try persistence()
        // A new one each time: an answer serves for a second.
        func checks() -> Readiness {
            Readiness(
                [.database(stores), .listening("agent listener") { port.withLock { $0 } }, .disk(admin.data, minimumMegabytes: 1)],
                timeout: Self.patient)
        }
        // The listener not bound yet: not ready, and it says why.
        let early = try await ready(checks())
        #expect(early.status == .serviceUnavailable)
        #expect(early.answer["status"] as? String == "not ready")
        #expect((early.answer["checks"] as? [String: String]) == ["database": "ok", "agent listener": "not listening yet", "disk": "ok"])
        port.withLock { $0 = 7443 }
        let now = try await ready(checks())
        #expect(now.status == .ok && now.answer["status"] as? String == "ready", "\(now.answer)")
    }

    @Test func aFullDiskOrAnUnansweringDatabaseIsNotReady() async throws {
        let full = try await ready(Readiness([.disk(admin.data, minimumMegabytes: Int(Int32.max))], timeout: Self.patient))
        #expect(full.status == .serviceUnavailable)
        let disk = try #require((full.answer["checks"] as? [String: String])?["disk"])
        #expect(disk.contains("MB free in the data directory's file system, under the \(Int32.max) MB required"), "\(disk)")

        // The database closed under the server: its check fails, in words.
        let stores = try ServerStores(try LoadedDeployment(directory: admin.data))
        try stores.database.pool.close()
        let closed = try await ready(Readiness([.database(ServerPersistence(stores))], timeout: Self.patient))
        #expect(closed.status == .serviceUnavailable)
        #expect((closed.answer["checks"] as? [String: String])?["database"]?.hasPrefix("the database does not answer: ") == true, "\(closed.answer)")
    }

    /// A check that never answers counts as failed once its time is up, and does not hold the
    /// answer (nor the other checks) back.
    @Test func aCheckThatHangsFailsInTime() async throws {
        let hung = Readiness.Check("hung") {
            try? await Task.sleep(for: .seconds(3_600))
            return nil
        }
        let answer = try await ready(Readiness([hung, .disk(admin.data, minimumMegabytes: 0)], timeout: .seconds(2)))
        #expect(answer.status == .serviceUnavailable)
        let checks = try #require(answer.answer["checks"] as? [String: String])
        #expect(checks["hung"] == "no answer within 2.0 seconds" && checks.keys.sorted() == ["disk", "hung"], "\(checks)")
    }

    /// Probes that come together share one round of checks: a check that hangs is asked once,
    /// not once per probe.
    @Test func probesShareOneRoundOfChecks() async throws {
        let asked = Mutex(0)
        let hung = Readiness.Check("hung") {
            asked.withLock { $0 += 1 }
            try? await Task.sleep(for: .seconds(3_600))
            return nil
        }
        let readiness = Readiness([hung], timeout: .seconds(30))
        let first = Task { await readiness.evaluate() }
        // The round is under way (its check asked), and runs until the check's 30 s are up.
        while asked.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        let second = await readiness.evaluate()
        #expect(await first.value == second && second.first?.problem == "no answer within 30.0 seconds")
        #expect(asked.withLock { $0 } == 1, "one round for both probes")
    }
}
