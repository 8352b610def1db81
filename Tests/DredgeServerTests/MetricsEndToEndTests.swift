import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `GET /metrics` on the real `dredge-server`, scraped while a real agent uploads a pull (#56):
/// the counters move, the states follow, and only the scrape token reads them on the admin
/// listener. On SQLite only: the readings on PostgreSQL are tested in process
/// (``MetricsTests``), and one run of the processes proves the wiring.
@Suite struct MetricsEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    /// A GET with an optional bearer token: the status and the body.
    static func get(_ url: String, token: String? = nil) async throws -> (Int, String) {
        var request = URLRequest(url: URL(string: url)!)
        if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        let (data, response) = try await URLSession.shared.data(for: request)
        return ((response as! HTTPURLResponse).statusCode, String(decoding: data, as: UTF8.self))
    }

    static func scrape(_ url: String, token: String? = nil) async throws -> [String: Double] {
        let (status, body) = try await get(url, token: token)
        try #require(status == 200, "\(body)")
        return MetricsTests.samples(body)
    }

    @Test func aScrapeDuringAPullSeesTheCountersMove() async throws {
        let d = try Deployment(adminTLS: false)
        // A listener of the metrics' own too, on a port the system picks.
        let path = d.data + "/server.json"
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        config["metrics"] = ["listen": "127.0.0.1:0"]
        try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: path))
        let (server, port) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        var ownListener: String?
        _ = try ManagedProcess.waitFor {
            let line = server.output.split(separator: "\n").first { $0.contains("metrics listener ready") }
            ownListener = line?.firstMatch(of: /url=(http:\/\/127\.0\.0\.1:\d+\/metrics)/).map { String($0.1) }
            return ownListener != nil
        }
        let unguarded = try #require(ownListener, "\(server.output)")

        // The token the server made at its first start, for its user alone.
        let tokenPath = d.data + "/" + ScrapeToken.fileName
        var info = stat()
        #expect(stat(tokenPath, &info) == 0 && info.st_mode & 0o777 == 0o600)
        let token = contents(tokenPath).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(server.output.contains("made the token Prometheus reads GET /metrics with"))
        // Not without it, not with an admin token.
        #expect(try await Self.get(admin + "/metrics").0 == 401)
        #expect(try await Self.get(admin + "/metrics", token: d.created.adminToken).0 == 401)

        let before = try await Self.scrape(admin + "/metrics", token: token)
        #expect(before["dredge_agents_enrolled"] == 0 && before["dredge_agent_connections{state=\"authenticated\"}"] == 0)
        #expect(MetricsTests.value(before, "dredge_upload_chunks_total") == 0)

        let agent = try d.runDevice(port: port, waitingFor: "u-2").agent
        defer { agent.stop() }
        let (status, id) = try d.pull(["--uid", "u-2", "--since", "2d"])
        try #require(status == 0, "\(id)")
        // Scraped while it runs, until the upload landed and was indexed.
        var scrapes = 0
        var landed: [String: Double] = [:]
        for _ in 0..<1200 {
            landed = try await Self.scrape(admin + "/metrics", token: token)
            scrapes += 1
            if MetricsTests.value(landed, "dredge_uploads_finished_total", #"kind="pull""#, #"outcome="complete""#) == 1,
                (landed["dredge_index_records_total"] ?? 0) > 0, landed["dredge_index_backlog_sources"] == 0,
                // States are read at most once a second: the status moves a reading later.
                landed["dredge_pull_targets{status=\"complete\"}"] == 1
            {
                break
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(MetricsTests.value(landed, "dredge_uploads_finished_total", #"kind="pull""#, #"outcome="complete""#) == 1, "after \(scrapes) scrapes:\n\(landed)")
        #expect((MetricsTests.value(landed, "dredge_upload_chunks_total", #"kind="pull""#) ?? 0) >= 1)
        #expect((MetricsTests.value(landed, "dredge_upload_bytes_total", #"kind="pull""#) ?? 0) > 1000)
        #expect(MetricsTests.value(landed, "dredge_upload_chunks_total", #"kind="feedback""#) == 0)
        #expect((landed["dredge_index_records_total"] ?? 0) > 0 && landed["dredge_index_lag_records"] == 0)
        #expect((landed["dredge_agent_authentications_total"] ?? 0) >= 1)
        #expect(landed["dredge_agent_connections{state=\"authenticated\"}"] == 1)
        #expect(landed["dredge_agents_enrolled"] == 1 && landed["dredge_agents_online"] == 1)
        #expect(landed["dredge_pull_targets{status=\"complete\"}"] == 1 && landed["dredge_pull_targets{status=\"queued\"}"] == 0)
        #expect(MetricsTests.value(landed, "dredge_upload_errors_total") == 0)
        #expect((MetricsTests.value(landed, "dredge_database_duration_seconds_count", #"operation="write""#) ?? 0)
            > (MetricsTests.value(before, "dredge_database_duration_seconds_count", #"operation="write""#) ?? 0))
        #expect((landed["dredge_data_directory_free_bytes"] ?? 0) > 0 && landed["dredge_cluster_lease_held"] == 1)
        // Heartbeats every second (the test's interval): counted, each timed against the interval.
        let heartbeats = try await Self.scrape(admin + "/metrics", token: token)
        #expect((heartbeats["dredge_agent_heartbeats_total"] ?? 0) >= 1)
        #expect((heartbeats["dredge_agent_heartbeat_lag_seconds_count"] ?? 0) >= 1)

        // A search is timed, and the admin API's requests are counted by route.
        var request = URLRequest(url: URL(string: admin + "/v1/records/search")!)
        request.httpMethod = "POST"
        request.setValue("Bearer \(d.created.adminToken)", forHTTPHeaderField: "Authorization")
        request.httpBody = Data(#"{"uid": "u-2"}"#.utf8)
        let (page, response) = try await URLSession.shared.data(for: request)
        #expect((response as! HTTPURLResponse).statusCode == 200, "\(String(decoding: page, as: UTF8.self))")
        let searched = try await Self.scrape(admin + "/metrics", token: token)
        #expect(MetricsTests.value(searched, "dredge_search_duration_seconds_count", #"kind="page""#) == 1)
        #expect(MetricsTests.value(searched, "dredge_http_requests_total", #"route="/v1/records/search""#, #"method="POST""#, #"code="200""#) == 1)
        #expect(MetricsTests.value(searched, "dredge_http_requests_total", #"route="/metrics""#, #"code="401""#) == 2)
        #expect((MetricsTests.value(searched, "dredge_http_request_duration_seconds_count", #"route="/v1/records/search""#) ?? 0) == 1)

        // The listener of the metrics' own needs no token and serves the same registry.
        let own = try await Self.scrape(unguarded)
        #expect(own["dredge_agents_enrolled"] == 1 && MetricsTests.value(own, "dredge_search_duration_seconds_count", #"kind="page""#) == 1)
    }
}
