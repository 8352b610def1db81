@testable import DredgeServer
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeTestSupport
import DredgeWire
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import Synchronization
import Testing

/// `GET /metrics` (#56): what the server measures, who may read it, and the readings taken at
/// a scrape. The figures moving during a real pull are in ``MetricsEndToEndTests``; a real
/// Prometheus scraping the server, the dashboard's queries and the alert rules in
/// Tests/monitoring/check.py.
@Suite struct MetricsTests {
    let dir = TempDir()

    /// The samples of a scrape: `name{labels}` (labels as the server wrote them) to value.
    static func samples(_ text: String) -> [String: Double] {
        var samples: [String: Double] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            samples[String(line[..<space])] = value
        }
        return samples
    }

    /// The families a scrape declares (`# TYPE name kind`), with their kind.
    static func families(_ text: String) -> [String: String] {
        var families: [String: String] = [:]
        for line in text.split(separator: "\n") where line.hasPrefix("# TYPE ") {
            let parts = line.split(separator: " ")
            if parts.count == 4 { families[String(parts[2])] = String(parts[3]) }
        }
        return families
    }

    /// The value of the sample named `name` whose labels include every one of `labels`
    /// (`key="value"`), summed over those that match.
    static func value(_ samples: [String: Double], _ name: String, _ labels: String...) -> Double? {
        let matching = samples.filter { key, _ in
            let (sampleName, rest) = key.firstIndex(of: "{").map { (String(key[..<$0]), String(key[$0...])) } ?? (key, "")
            return sampleName == name && labels.allSatisfy { rest.contains($0) }
        }
        return matching.isEmpty ? nil : matching.values.reduce(0, +)
    }

    @Test func everyFamilyIsThereFromTheStartWithItsHelpAndKnownLabelsAtZero() async throws {
        let metrics = ServerMetrics()
        let text = String(decoding: await metrics.exposition(), as: UTF8.self)
        let families = Self.families(text)
        let expected: [String: String] = [
            "dredge_build_info": "gauge", "process_start_time_seconds": "gauge", "process_resident_memory_bytes": "gauge", "process_open_fds": "gauge",
            "dredge_agent_connections_refused_total": "counter", "dredge_agent_authentications_total": "counter", "dredge_agent_heartbeats_total": "counter",
            "dredge_agent_heartbeat_lag_seconds": "histogram", "dredge_agent_connections": "gauge", "dredge_agents_enrolled": "gauge",
            "dredge_agents_online": "gauge", "dredge_upload_chunks_total": "counter", "dredge_upload_bytes_total": "counter",
            "dredge_uploads_finished_total": "counter", "dredge_upload_errors_total": "counter", "dredge_connection_errors_total": "counter",
            "dredge_quota_refusals_total": "counter", "dredge_pull_targets": "gauge", "dredge_feedback": "gauge", "dredge_index_records_total": "counter",
            "dredge_index_backlog_sources": "gauge", "dredge_index_lag_records": "gauge", "dredge_index_lag_seconds": "gauge",
            "dredge_search_duration_seconds": "histogram", "dredge_database_duration_seconds": "histogram", "dredge_database_errors_total": "counter",
            "dredge_data_directory_free_bytes": "gauge", "dredge_data_directory_size_bytes": "gauge", "dredge_cluster_nodes": "gauge",
            "dredge_cluster_lease_held": "gauge", "dredge_metrics_sample_failures_total": "counter", "dredge_tls_certificate_expiry_timestamp_seconds": "gauge",
            "dredge_server_key_generation": "gauge", "dredge_server_keys_retire_timestamp_seconds": "gauge", "dredge_agents_on_retiring_keys": "gauge",
            "dredge_trigger_sets_sent_total": "counter", "dredge_trigger_sets_refused_total": "counter",
        ]
        #expect(families == expected)
        for name in expected.keys { #expect(text.contains("# HELP \(name) "), "\(name) has no help") }
        // Counters end in _total (Prometheus' convention), and every known label value is a series at 0.
        for (name, kind) in families where kind == "counter" { #expect(name.hasSuffix("_total")) }
        let samples = Self.samples(text)
        for cause in ServerMetrics.Refusal.allCases { #expect(samples["dredge_agent_connections_refused_total{cause=\"\(cause.rawValue)\"}"] == 0) }
        for status in PullStatus.allCases { #expect(samples["dredge_pull_targets{status=\"\(status.rawValue)\"}"] == 0) }
        #expect(Self.value(samples, "dredge_uploads_finished_total", "kind=\"feedback\"", "outcome=\"retry\"") == 0)
        #expect(samples["dredge_build_info{version=\"\(DredgeVersion.current)\"}"] == 1)
        // Read at the scrape, on Linux.
        #expect((samples["process_resident_memory_bytes"] ?? 0) > 1_000_000)
        #expect((samples["process_open_fds"] ?? 0) > 2)
    }

    /// The error codes are named as Protocol/dredge.proto names them, without `ERROR_`, and a
    /// code from a later protocol is `unknown`, never a label value of its own.
    @Test func errorCodesAreLabelledByTheirNamesInTheProtocol() throws {
        let proto = try String(contentsOf: Self.repository.appendingPathComponent("Protocol/dredge.proto"), encoding: .utf8)
        let names = Set(proto.matches(of: /ERROR_([A-Z_]+) = \d+;/).map { $0.1.lowercased() })
        #expect(names.count == WireErrorCode.allCases.count)
        #expect(Set(WireErrorCode.allCases.map(ServerMetrics.name(of:))) == names)
        #expect(ServerMetrics.name(of: .UNRECOGNIZED(99)) == "unknown")
        let metrics = ServerMetrics()
        metrics.errorSent(.errorChunkAuthFailed, aboutUpload: true)
        metrics.errorSent(.UNRECOGNIZED(99), aboutUpload: false)
        metrics.errorSent(.errorAuthFailed, aboutUpload: false)
        let samples = Self.samples(metrics.registry.emitToString())
        #expect(samples["dredge_upload_errors_total{code=\"chunk_auth_failed\"}"] == 1)
        #expect(samples["dredge_connection_errors_total{code=\"unknown\"}"] == 1)
        #expect(samples["dredge_connection_errors_total{code=\"auth_failed\"}"] == 1)
        #expect(samples["dredge_upload_errors_total{code=\"auth_failed\"}"] == 0)
    }

    static var repository: URL { URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent() }

    /// A heartbeat on time has no lag; one late by 3 s of a 5 s interval is 3 s late; the first
    /// after authenticating is counted but has nothing to be late against.
    @Test func heartbeatLagIsHowLateEachCameAfterTheInterval() {
        let metrics = ServerMetrics()
        metrics.heartbeat(gap: nil, interval: .seconds(5))
        metrics.heartbeat(gap: .seconds(4), interval: .seconds(5))
        metrics.heartbeat(gap: .seconds(8), interval: .seconds(5))
        let samples = Self.samples(metrics.registry.emitToString())
        #expect(samples["dredge_agent_heartbeats_total"] == 3)
        #expect(samples["dredge_agent_heartbeat_lag_seconds_count"] == 2)
        #expect(samples["dredge_agent_heartbeat_lag_seconds_bucket{le=\"0.1\"}"] == 1)
        #expect(samples["dredge_agent_heartbeat_lag_seconds_bucket{le=\"2.0\"}"] == 1)
        #expect(samples["dredge_agent_heartbeat_lag_seconds_bucket{le=\"5.0\"}"] == 2)
        #expect(samples["dredge_agent_heartbeat_lag_seconds_sum"] == 3)
    }

    /// A reading that hangs (even one that ignores cancellation, as a database or a file
    /// system that does not answer) or fails does not hold the scrape: its figures stay as they
    /// were, the others are read, each is counted as a failure, and the one still hanging is
    /// not started again. Scrapes within a second share one reading. The reading's age is told
    /// by a clock the test moves, so a loaded machine cannot age it.
    @Test func aReadingThatHangsOrFailsLeavesItsFiguresAndIsCounted() async throws {
        let start = ContinuousClock.now, elapsed = Mutex(Duration.zero)
        let metrics = ServerMetrics(sampleTimeout: .seconds(1), now: { start + elapsed.withLock { $0 } })
        metrics.agentsEnrolled.set(to: 7)
        let released = Mutex(false), started = Mutex(0), reads = Mutex(0)
        let gate = DispatchSemaphore(value: 0)
        metrics.addSampler(.init("hangs") {
            started.withLock { $0 += 1 }
            // Blocks a thread, deaf to cancellation, until the test lets it go.
            await withCheckedContinuation { continuation in
                DispatchQueue.global().async {
                    _ = gate.wait(timeout: .now() + 120)
                    continuation.resume()
                }
            }
            released.withLock { $0 = true }
            metrics.agentsEnrolled.set(to: 1)
        })
        metrics.addSampler(.init("fails") { throw MetricsError("no database") })
        metrics.addSampler(.init("works") {
            reads.withLock { $0 += 1 }
            metrics.clusterNodes.set(to: 3)
        })
        let first = Self.samples(String(decoding: await metrics.exposition(), as: UTF8.self))
        #expect(!released.withLock { $0 }, "the scrape returned while the reading still hung")
        #expect(first["dredge_agents_enrolled"] == 7 && first["dredge_cluster_nodes"] == 3)
        #expect(first["dredge_metrics_sample_failures_total"] == 2)
        // Within the second: the same reading.
        _ = await metrics.exposition()
        #expect(reads.withLock { $0 } == 1)
        // A second later: read again, but the hanging one is not started a second time.
        elapsed.withLock { $0 = .milliseconds(1100) }
        let second = Self.samples(String(decoding: await metrics.exposition(), as: UTF8.self))
        #expect(reads.withLock { $0 } == 2 && started.withLock { $0 } == 1)
        #expect(second["dredge_metrics_sample_failures_total"] == 4)
        gate.signal()
    }

    /// The counts a scrape reads from the database, on each back end: agents enrolled and
    /// online, pull targets and feedback by status.
    @Test(arguments: ServerBackend.all) func theDatabaseCountsReadBackOnEachBackEnd(_ backend: ServerBackend) async throws {
        let data = dir.file("server")
        _ = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
        let deployment = try LoadedDeployment(directory: data)
        let persistence =
            switch backend {
            case .sqlite: ServerPersistence(try ServerStores(deployment))
            case .postgres: ServerPersistence(try await TestPostgres.database(for: dir), deployment: deployment)
            }
        #expect(try await persistence.counts() == ServerPersistence.Counts())
        let keys = AgentDirectoryConformanceTests.keys
        let a = try await persistence.registry.enroll(publicKey: keys[0].publicKey, host: AgentDirectoryConformanceTests.host, now: Date())
        let b = try await persistence.registry.enroll(publicKey: keys[1].publicKey, host: AgentDirectoryConformanceTests.host, now: Date())
        try await persistence.node?.join()
        _ = try await persistence.registry.connected(a, from: "127.0.0.1", host: AgentDirectoryConformanceTests.host, now: Date())
        let pull = try PullQueueConformanceTests.newPull(targets: [a, b], at: .now)
        try await persistence.pulls.create(pull)
        #expect(try await persistence.pulls.markDelivered(pull.id, agent: a, at: Date()))
        try await persistence.feedback.begin(
            id: String(repeating: "f", count: 32), agentID: a, uid: "u-1", text: "it broke", createdAt: .now, chunkCount: 1, bytes: 10, at: Date())

        let counts = try await persistence.counts()
        #expect(counts.agentsEnrolled == 2 && counts.agentsOnline == 1)
        #expect(counts.pullTargets == [.queued: 1, .delivered: 1])
        #expect(counts.feedback == [.uploading: 1])

        // The reading's time is not what is checked here (a test run loads the machine): only
        // that it read every count without a failure.
        let metrics = ServerMetrics(sampleTimeout: .seconds(120))
        metrics.addSampler(persistence.sampler(into: metrics))
        let samples = Self.samples(String(decoding: await metrics.exposition(), as: UTF8.self))
        #expect(samples["dredge_agents_enrolled"] == 2 && samples["dredge_agents_online"] == 1)
        #expect(samples["dredge_pull_targets{status=\"delivered\"}"] == 1 && samples["dredge_pull_targets{status=\"complete\"}"] == 0)
        #expect(samples["dredge_feedback{status=\"uploading\"}"] == 1)
        #expect(samples["dredge_cluster_nodes"] == 1 && samples["dredge_cluster_lease_held"] == 1)
        #expect(samples["dredge_metrics_sample_failures_total"] == 0)
        // The database's own calls were timed once the meter was attached.
        persistence.sqlite?.meter.attach(metrics)
        persistence.postgres?.meter.attach(metrics)
        _ = try await persistence.counts()
        let timed = Self.samples(metrics.registry.emitToString())
        #expect((Self.value(timed, "dredge_database_duration_seconds_count", "operation=\"read\"") ?? 0) >= 1)
    }

    /// The index's lag: what landed and is not searchable yet (its records, when known, and how
    /// long the oldest has waited), back to nothing once it is indexed.
    @Test func theIndexLagIsWhatLandedAndIsNotSearchableYet() async throws {
        let paths = DataDirectory(dir.path)
        let index = try SQLiteRecordIndex(directory: dir.path)
        let source = RecordIndexConformanceTests.pull1
        try RecordSearchTests.land(paths, source, days: ["2027-01-15.jsonl": (1...3).map { RecordIndexConformanceTests.line($0, "record \($0)") }])
        let metrics = ServerMetrics(reuse: .zero)
        let indexer = Indexer(index: index, registry: nil, paths: paths, logger: Logger(label: "test"), metrics: metrics)
        indexer.landed(source, records: 3)
        let start = ContinuousClock.now
        let waiting = indexer.lag(now: start + .seconds(30))
        #expect(waiting.sources == 1 && waiting.records == 3)
        #expect(waiting.oldest >= .seconds(30) && waiting.oldest < .seconds(600))

        metrics.addSampler(indexer.lagSampler(into: metrics))
        let before = Self.samples(String(decoding: await metrics.exposition(), as: UTF8.self))
        #expect(before["dredge_index_backlog_sources"] == 1 && before["dredge_index_lag_records"] == 3)

        let run = Task { try await indexer.run() }
        defer { run.cancel() }
        for _ in 0..<6000 where indexer.lag().sources > 0 { try await Task.sleep(for: .milliseconds(20)) }
        #expect(indexer.lag().sources == 0 && indexer.lag().records == 0 && indexer.lag().oldest == .zero)
        let after = Self.samples(String(decoding: await metrics.exposition(), as: UTF8.self))
        #expect(after["dredge_index_backlog_sources"] == 0 && after["dredge_index_lag_records"] == 0 && after["dredge_index_lag_seconds"] == 0)
        #expect(after["dredge_index_records_total"] == 3)
    }

    /// The scrape token: made once, private to the server's user, kept; a file that holds no
    /// token is refused with what to do; the header must carry it exactly.
    @Test func theScrapeTokenIsMadeOnceAndPrivate() throws {
        let (token, created) = try ScrapeToken.loadOrCreate(directory: dir.path)
        #expect(created)
        let path = dir.file(ScrapeToken.fileName)
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o600)
        let text = contents(path).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(text.hasPrefix("dredge-metrics-") && text.count == "dredge-metrics-".count + 48)
        let (again, createdAgain) = try ScrapeToken.loadOrCreate(directory: dir.path)
        #expect(!createdAgain)
        #expect(token.accepts("Bearer \(text)") && again.accepts("bearer \(text)"))
        #expect(!token.accepts(nil) && !token.accepts(text) && !token.accepts("Bearer \(text)x") && !token.accepts("Basic \(text)"))

        try "short\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect { try ScrapeToken.loadOrCreate(directory: dir.path) } throws: { "\($0)".contains("delete it, and a new one is made") }
    }

    @Test func theMetricsListenAddressIsCheckedWhenServerJSONIsRead() throws {
        func decode(_ json: String) throws -> MetricsSettings { try JSONDecoder().decode(MetricsSettings.self, from: Data(json.utf8)) }
        #expect(try decode(#"{}"#).address == nil)
        #expect(try decode(#"{"listen": "0.0.0.0:9464"}"#).address! == ("0.0.0.0", 9464))
        #expect(try decode(#"{"listen": "[::1]:9464"}"#).address! == ("::1", 9464))
        for bad in ["9464", "host:", "host:70000", ":9464", "a b:1"] {
            #expect { try decode(#"{"listen": "\#(bad)"}"#) } throws: { "\($0)".contains("is not HOST:PORT") }
        }
    }

    /// On the admin listener, only the scrape token reads the metrics: not an admin token, not
    /// nothing (each refusal audited as a refused admin token is); the answer is Prometheus'
    /// text format.
    @Test func onlyTheScrapeTokenReadsTheMetrics() async throws {
        let a = try AdminRouteTests.Fixture()
        let logger = Logger(label: "test.metrics") { _ in SwiftLogNoOpLogHandler() }
        let services = AdminServices(
            registry: a.registry, pulls: a.pulls, audit: a.pulls, issuer: a.issuer, feedback: a.feedback, tokens: a.tokens,
            dispatcher: PullDispatcher(pulls: a.pulls, logger: logger), logger: logger)
        let metrics = ServerMetrics()
        let scrape = "dredge-metrics-" + String(repeating: "ab", count: 24)
        let app = try AdminAPI.application(
            actions: AdminActions(services), port: 0, metrics: MetricsEndpoint(metrics: metrics, token: ScrapeToken(scrape)))
        try await app.test(.router) { client in
            for header in [nil, "Bearer \(a.created.adminToken)", "Bearer \(scrape)0"] {
                try await client.execute(uri: "/metrics", method: .get, headers: header.map { [.authorization: $0] } ?? [:]) { response in
                    #expect(response.status == .unauthorized)
                    #expect(String(buffer: response.body).contains("scrape token"))
                }
            }
            try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(scrape)"]) { response in
                #expect(response.status == .ok)
                #expect(response.headers[.contentType] == "text/plain; version=0.0.4; charset=utf-8")
                #expect(String(buffer: response.body).contains("# TYPE dredge_agents_enrolled gauge"))
            }
        }
        let refusals = try await a.pulls.audit(limit: 10).filter { $0.action == AuditAction.authFailed.rawValue }
        #expect(!refusals.isEmpty && refusals.allSatisfy { $0.detail.contains("GET /metrics") })
    }
}
