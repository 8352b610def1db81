import DredgeDomain
import DredgeLogging
import DredgeStore
import DredgeTestSupport
import Foundation
import FoundationNetworking
import Testing

#if canImport(FoundationNetworking)
#endif

/// An app logs its HTTP exchanges; an engineer pulls them with `--type network`.
@Suite struct NetworkPullTests {
    @Test func networkRecordsArePulledWithTypeNetwork() async throws {
        // Plain HTTP on loopback: the app's requests go through URLSession, which cannot pin a CA on Linux.
        let d = try AgentServerEndToEndTests.Deployment(adminTLS: false)
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)

        // The app: real requests to a real HTTP server (the admin API is one), logged.
        let store = d.dir.file("app.sqlite")
        let center = try LogCenter(path: store)
        center.setUser("u-net")
        let network = NetworkLogger(center: center)
        for path in ["/health", "/health", "/v1/agents?page=2"] {
            _ = try await URLSession.shared.data(for: URLRequest(url: URL(string: admin + path)!), logging: network)
        }
        _ = try? await URLSession.shared.data(for: URLRequest(url: URL(string: "http://127.0.0.1:9/down")!), logging: network)
        center.logger(type: .app).info("checkout opened")
        try await center.flush()
        try center.close()

        #expect(try d.enroll(state: d.dir.file("agent"), port: port).0 == 0)
        let agent = try d.runAgent(state: d.dir.file("agent"), store: store)
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["activeUIDs"] as? [String]) == ["u-net"] } })

        let (status, output) = try d.dredge(["pull", "--uid", "u-net", "--type", "network", "--wait", "--timeout", "120"], server: admin)
        #expect(status == 0, "\(output)")
        let files = try d.pulledFiles(output, server: admin)
        let lines = files.flatMap { contents($0).split(separator: "\n") }
        #expect(lines.count == 4, "\(lines)")
        #expect(lines.allSatisfy { $0.contains(#""type":"network""#) && $0.contains(#""correlation_id":""#) })
        #expect(lines.contains { $0.contains(#""status":401"#) && $0.contains("page=REDACTED") && $0.contains(#""level":"warning""#) })
        #expect(lines.contains { $0.contains(#""level":"error""#) && $0.contains("/down") })
        #expect(!lines.contains { $0.contains("checkout opened") })
    }
}
