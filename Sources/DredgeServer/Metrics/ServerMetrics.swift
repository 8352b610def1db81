import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Logging
import Prometheus
import Synchronization

/// What the server measures, for Prometheus (`GET /metrics`, ``MetricsAccess``): every metric
/// the server exposes is made here, once, with its help text, so that names, labels and types
/// are in one place (docs/monitoring.md lists them, and a test checks that the dashboard and
/// the alert rules in `docs/monitoring/` use only these).
///
/// Two kinds of figures:
/// - **Events**, counted where they happen: connections refused, heartbeats, chunks and bytes
///   received, errors sent to agents, quota refusals, uploads finished, records indexed, the
///   time searches and database calls take.
/// - **States**, read when Prometheus scrapes (``exposition()``): connections open, agents
///   enrolled and online, pull targets and feedback by status, the index's lag, the data
///   directory's free space, the cluster's nodes, the process's memory and files. Each reader
///   (``addSampler(_:)``) has a few seconds; one that fails or hangs leaves its figures as they
///   were and is counted in `dredge_metrics_sample_failures_total`.
///
/// Label values are bounded: causes, statuses, kinds and protocol error codes, never a uid,
/// an agent id or an address. Every known label value is made at start, at zero, so a rate
/// over a series that has not moved yet is 0, not missing.
public final class ServerMetrics: Sendable {
    public let registry: PrometheusCollectorRegistry

    /// Why an agent's connection was refused or closed before it could work.
    public enum Refusal: String, CaseIterable, Sendable {
        /// Too many connections from its address were authenticating (closed before TLS).
        case addressCap = "address_cap"
        /// The server holds as many agents as it may.
        case capacity
        /// An unknown agent or a bad signature.
        case authentication
        /// An agent that was revoked.
        case revoked
        /// The agent pins server keys that are retired: it must enroll again.
        case keysRetired = "keys_retired"
        /// An enrollment with a bad token or key.
        case enrollment
        /// Too many refused enrollments from the address lately.
        case enrollmentThrottled = "enrollment_throttled"
        /// The connection broke the protocol (a malformed or unexpected frame) and was closed.
        case protocolError = "protocol_error"
    }

    public enum UploadKind: String, CaseIterable, Sendable {
        case pull, feedback
        /// What a standing trigger fired on a device (#54).
        case capture
    }

    /// How an upload's last step ended.
    public enum UploadOutcome: String, CaseIterable, Sendable {
        /// Its files are in place.
        case complete
        /// Refused for good (a payload that breaks the rules, a chunk that fails authentication).
        case failed
        /// The server's own trouble; the agent sends it again later.
        case retry
    }

    public enum Quota: String, CaseIterable, Sendable {
        /// Feedback uploads per hour or bytes per day from one agent.
        case feedbackRate = "feedback_rate"
        /// A feedback upload larger than one may unpack to.
        case feedbackSize = "feedback_size"
        /// A capture over its trigger's budget (per device, or from all devices, per day).
        case captureBudget = "capture_budget"
    }

    public enum SearchKind: String, CaseIterable, Sendable {
        /// A page of records.
        case page
        /// The counts over a whole search (``RecordStats``).
        case stats
    }

    public enum DatabaseOperation: String, CaseIterable, Sendable {
        case read, write
    }

    private let refusals: [Refusal: Counter]
    let authentications: Counter
    let heartbeats: Counter
    let heartbeatLag: DurationHistogram
    private let chunks: [UploadKind: Counter]
    private let chunkBytes: [UploadKind: Counter]
    private let finished: [UploadKind: [UploadOutcome: Counter]]
    private let uploadErrors: [String: Counter]
    private let connectionErrors: [String: Counter]
    private let quotas: [Quota: Counter]
    let indexedRecords: Counter
    /// Trigger sets sent to agents, and refused by them (#54).
    let triggerSetsSent: Counter
    let triggerSetRefused: Counter
    private let searches: [SearchKind: DurationHistogram]
    private let database: [DatabaseOperation: DurationHistogram]
    private let databaseErrors: Counter
    /// SQLite's process-wide error count at the last scrape.
    private let sqliteErrorsCounted = Atomic<Int>(0)

    // States, set by the samplers.
    let connectionsAuthenticated: Gauge
    let connectionsAuthenticating: Gauge
    let agentsEnrolled: Gauge
    let agentsOnline: Gauge
    let pullTargets: [PullStatus: Gauge]
    let feedback: [FeedbackStatus: Gauge]
    let indexBacklog: Gauge
    let indexLagRecords: Gauge
    let indexLagSeconds: Gauge
    let diskFree: Gauge
    /// When the agent listener's certificate expires (``CertificateRenewal``).
    let certificateExpiry: Gauge
    /// The current generation of the server's keys, and agents that pin an earlier one.
    let keyGeneration: Gauge
    let agentsOnRetiringKeys: Gauge
    /// When the oldest generation still live but not current retires (0: none).
    let keysRetire: Gauge
    let diskSize: Gauge
    let clusterNodes: Gauge
    let leaseHeld: Gauge
    let residentMemory: Gauge
    let openFiles: Gauge
    private let sampleFailures: Counter

    private let samplers = Mutex<[Sampler]>([])
    /// The reading under way or last finished, and when it finished (nil: still running).
    private let latestSample = Mutex<(task: Task<Void, Never>, finished: ContinuousClock.Instant?)?>(nil)
    /// Samplers still running (one that outlived its time included).
    private let inFlight = Mutex<Set<String>>([])
    /// How long one sampler may take before its figures are left as they were.
    let sampleTimeout: Duration
    /// How long a reading serves scrapes that come after it.
    let reuse: Duration
    /// The clock that says how old a reading is (a test moves it by hand).
    private let now: @Sendable () -> ContinuousClock.Instant

    public struct Sampler: Sendable {
        public let name: String
        public let run: @Sendable () async throws -> Void

        public init(_ name: String, run: @escaping @Sendable () async throws -> Void) {
            self.name = name
            self.run = run
        }
    }

    public init(
        sampleTimeout: Duration = .seconds(5), reuse: Duration = .seconds(1),
        now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.sampleTimeout = sampleTimeout
        self.reuse = reuse
        self.now = now
        let r = PrometheusCollectorRegistry()
        registry = r

        r.gauge(name: "dredge_build_info", labels: [("version", DredgeVersion.current)], help: "The server's version, as a label; always 1.").set(to: 1)
        r.gauge(name: "process_start_time_seconds", help: "When the process started, in seconds since 1970.").set(Date().timeIntervalSince1970)
        residentMemory = r.gauge(name: "process_resident_memory_bytes", help: "Resident memory of the server process, in bytes.")
        openFiles = r.gauge(name: "process_open_fds", help: "File descriptors the server process has open.")

        refusals = Dictionary(uniqueKeysWithValues: Refusal.allCases.map { cause in
            (cause, r.counter(
                name: "dredge_agent_connections_refused_total", labels: [("cause", cause.rawValue)],
                help: "Agent connections refused or closed before they could work, by cause."))
        })
        authentications = r.counter(name: "dredge_agent_authentications_total", help: "Agent connections that authenticated.")
        heartbeats = r.counter(name: "dredge_agent_heartbeats_total", help: "Heartbeats received from agents.")
        heartbeatLag = r.durationHistogram(
            name: "dredge_agent_heartbeat_lag_seconds",
            buckets: [.milliseconds(100), .milliseconds(500), .seconds(1), .seconds(2), .seconds(5), .seconds(10), .seconds(30), .seconds(60), .seconds(120)],
            help: "How late each heartbeat arrived after the interval the agent was told (0 when on time).")
        connectionsAuthenticated = r.gauge(
            name: "dredge_agent_connections", labels: [("state", "authenticated")], help: "Agent connections open on this node, by state.")
        connectionsAuthenticating = r.gauge(
            name: "dredge_agent_connections", labels: [("state", "authenticating")], help: "Agent connections open on this node, by state.")
        agentsEnrolled = r.gauge(name: "dredge_agents_enrolled", help: "Agents enrolled in the deployment (and not revoked).")
        agentsOnline = r.gauge(name: "dredge_agents_online", help: "Agents connected to the deployment (to any node of a cluster).")

        chunks = Dictionary(uniqueKeysWithValues: UploadKind.allCases.map { kind in
            (kind, r.counter(name: "dredge_upload_chunks_total", labels: [("kind", kind.rawValue)], help: "Upload chunks received, by kind of upload."))
        })
        chunkBytes = Dictionary(uniqueKeysWithValues: UploadKind.allCases.map { kind in
            (kind, r.counter(
                name: "dredge_upload_bytes_total", labels: [("kind", kind.rawValue)], help: "Bytes of upload chunks received (sealed, as sent), by kind of upload."))
        })
        finished = Dictionary(uniqueKeysWithValues: UploadKind.allCases.map { kind in
            (kind, Dictionary(uniqueKeysWithValues: UploadOutcome.allCases.map { outcome in
                (outcome, r.counter(
                    name: "dredge_uploads_finished_total", labels: [("kind", kind.rawValue), ("outcome", outcome.rawValue)],
                    help: "Uploads whose last chunk arrived, by kind and by how unpacking them ended."))
            }))
        })
        uploadErrors = Dictionary(uniqueKeysWithValues: Self.errorCodes.map { code in
            (code, r.counter(
                name: "dredge_upload_errors_total", labels: [("code", code)], help: "Errors the server sent agents about an upload or a chunk, by protocol error code."))
        })
        connectionErrors = Dictionary(uniqueKeysWithValues: Self.errorCodes.map { code in
            (code, r.counter(
                name: "dredge_connection_errors_total", labels: [("code", code)], help: "Errors the server sent agents about their connection, by protocol error code."))
        })
        quotas = Dictionary(uniqueKeysWithValues: Quota.allCases.map { quota in
            (quota, r.counter(name: "dredge_quota_refusals_total", labels: [("quota", quota.rawValue)], help: "Uploads refused for a quota, by quota."))
        })
        pullTargets = Dictionary(uniqueKeysWithValues: PullStatus.allCases.map { status in
            (status, r.gauge(name: "dredge_pull_targets", labels: [("status", status.rawValue)], help: "Pulls' agents (one pull asks one or more), by status."))
        })
        feedback = Dictionary(uniqueKeysWithValues: FeedbackStatus.allCases.map { status in
            (status, r.gauge(name: "dredge_feedback", labels: [("status", status.rawValue)], help: "Feedback uploads recorded (their files removed or not), by status."))
        })

        indexedRecords = r.counter(name: "dredge_index_records_total", help: "Records added to the search index.")
        triggerSetsSent = r.counter(name: "dredge_trigger_sets_sent_total", help: "Trigger sets sent to agents (on connecting, and when their triggers changed).")
        triggerSetRefused = r.counter(name: "dredge_trigger_sets_refused_total", help: "Trigger sets agents refused (they kept the set they held).")
        indexBacklog = r.gauge(name: "dredge_index_backlog_sources", help: "Landed pulls and feedback not yet searchable in full (waiting, being indexed, or to be retried).")
        indexLagRecords = r.gauge(name: "dredge_index_lag_records", help: "Records landed and not yet searchable (of the sources whose count is known).")
        indexLagSeconds = r.gauge(name: "dredge_index_lag_seconds", help: "How long the oldest source not yet searchable has waited, in seconds (0 when none waits).")
        searches = Dictionary(uniqueKeysWithValues: SearchKind.allCases.map { kind in
            (kind, r.durationHistogram(
                name: "dredge_search_duration_seconds", labels: [("kind", kind.rawValue)],
                buckets: [.milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(5), .seconds(10)],
                help: "How long searches took, by kind (a page of records, or the counts over a search)."))
        })
        database = Dictionary(uniqueKeysWithValues: DatabaseOperation.allCases.map { operation in
            (operation, r.durationHistogram(
                name: "dredge_database_duration_seconds", labels: [("operation", operation.rawValue)],
                buckets: [.microseconds(500), .milliseconds(1), .milliseconds(2.5), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(5)],
                help: "How long the server's database calls took: each transaction on PostgreSQL, each statement on SQLite."))
        })
        databaseErrors = r.counter(
            name: "dredge_database_errors_total", help: "Database calls that failed (PostgreSQL), or errors SQLite logged.")
        diskFree = r.gauge(name: "dredge_data_directory_free_bytes", help: "Bytes free to the server in the data directory's file system.")
        certificateExpiry = r.gauge(
            name: "dredge_tls_certificate_expiry_timestamp_seconds",
            help: "When the agent listener's certificate expires (Unix time); the server renews it 30 days before.")
        keyGeneration = r.gauge(name: "dredge_server_key_generation", help: "The current generation of the server's command-signing and encryption keys.")
        agentsOnRetiringKeys = r.gauge(
            name: "dredge_agents_on_retiring_keys",
            help: "Enrolled agents (not revoked) that pin an earlier generation of the server's keys than the current one: refused once it retires.")
        keysRetire = r.gauge(
            name: "dredge_server_keys_retire_timestamp_seconds",
            help: "When the oldest generation of the server's keys still in use but not current retires (Unix time); 0 when there is none.")
        diskSize = r.gauge(name: "dredge_data_directory_size_bytes", help: "Size of the data directory's file system, in bytes.")
        clusterNodes = r.gauge(name: "dredge_cluster_nodes", help: "Nodes of the cluster whose lease is current (1 on SQLite).")
        leaseHeld = r.gauge(name: "dredge_cluster_lease_held", help: "1 while this node's lease is current in the database, else 0 (always 1 on SQLite).")
        sampleFailures = r.counter(name: "dredge_metrics_sample_failures_total", help: "Readings for a scrape that failed or took too long (their figures were left as they were).")
        addSampler(Sampler("process") { [residentMemory, openFiles] in
            if let rss = Self.residentBytes() { residentMemory.set(Double(rss)) }
            if let open = Self.openFileCount() { openFiles.set(Double(open)) }
        })
    }

    // MARK: Events

    public func refused(_ cause: Refusal) { refusals[cause]?.increment() }

    /// A heartbeat arrived `gap` after the one before it on its connection (nil: the first);
    /// the agent was told to send one every `interval`.
    func heartbeat(gap: Duration?, interval: Duration) {
        heartbeats.increment()
        guard let gap else { return }
        heartbeatLag.record(max(gap - interval, .zero))
    }

    func chunkReceived(_ kind: UploadKind, bytes: Int) {
        chunks[kind]?.increment()
        chunkBytes[kind]?.increment(by: Int64(bytes))
    }

    func uploadFinished(_ kind: UploadKind, _ outcome: UploadOutcome) { finished[kind]?[outcome]?.increment() }

    /// An `Error` frame sent to an agent: about an upload when it names one.
    func errorSent(_ code: WireErrorCode, aboutUpload: Bool) {
        let name = Self.name(of: code)
        (aboutUpload ? uploadErrors : connectionErrors)[name]?.increment()
    }

    func quotaRefused(_ quota: Quota) { quotas[quota]?.increment() }

    func indexed(records: Int) { if records > 0 { indexedRecords.increment(by: Int64(records)) } }

    func searched(_ kind: SearchKind, took duration: Duration) { searches[kind]?.record(duration) }

    /// What the databases report their calls through (``DatabaseMeter``).
    public func databaseCall(_ operation: DatabaseOperation, took duration: Duration, failed: Bool) {
        database[operation]?.record(duration)
        if failed { databaseErrors.increment() }
    }

    /// SQLite's error log has counted `total` errors in this process so far.
    func sqliteErrorsSeen(_ total: Int) {
        let before = sqliteErrorsCounted.exchange(total, ordering: .relaxed)
        if total > before { databaseErrors.increment(by: Int64(total - before)) }
    }

    /// An admin API request answered `status` after `took`; `route` is the pattern it matched
    /// (nil, or Hummingbird's `NotFound`: none, counted as `unmatched`). Methods outside HTTP's
    /// usual ones are `other`.
    func request(route: String?, method: String, status: Int, took duration: Duration) {
        let route = route.flatMap { $0 == "NotFound" ? nil : $0 } ?? "unmatched"
        let method = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"].contains(method) ? method : "other"
        registry.counter(
            name: "dredge_http_requests_total", labels: [("route", route), ("method", method), ("code", String(status))],
            help: "Admin API requests, by route, method and status code."
        ).increment()
        registry.durationHistogram(
            name: "dredge_http_request_duration_seconds", labels: [("route", route), ("method", method)], buckets: Self.httpBuckets,
            help: "How long the admin API took to answer, by route and method (until the answer's headers)."
        ).record(duration)
    }

    static let httpBuckets: [Duration] = [
        .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
        .seconds(2.5), .seconds(5), .seconds(10),
    ]

    // MARK: Scraping

    /// A reader of states, run at every scrape.
    public func addSampler(_ sampler: Sampler) { samplers.withLock { $0.append(sampler) } }

    /// Every metric in Prometheus' text format (version 0.0.4), the states read first.
    public func exposition() async -> [UInt8] {
        await sample()
        return registry.emitToBuffer()
    }

    /// Reads every state, side by side, each within ``sampleTimeout``. One reading at a time,
    /// whoever scrapes: scrapes that come together share it, and a reading serves for a second,
    /// so however often `/metrics` is asked, the database is read at most once a second.
    func sample() async {
        let task = latestSample.withLock { latest -> Task<Void, Never> in
            if let latest, latest.finished.map({ now() - $0 < reuse }) ?? true { return latest.task }
            let task = Task {
                await self.runSamplers()
                let finished = self.now()
                self.latestSample.withLock { $0?.finished = finished }
            }
            latest = (task, nil)
            return task
        }
        await task.value
    }

    private func runSamplers() async {
        let samplers = samplers.withLock { $0 }
        let failures = await withTaskGroup(of: Bool.self) { group in
            for sampler in samplers {
                group.addTask { await self.run(sampler) }
            }
            var failures = 0
            for await ok in group where !ok { failures += 1 }
            return failures
        }
        if failures > 0 { sampleFailures.increment(by: Int64(failures)) }
    }

    /// True when the sampler finished within ``sampleTimeout`` without throwing. One that takes
    /// longer is left running on its own (a database or a file system that hangs ignores
    /// cancellation), never waited for, and not started again until it ends.
    private func run(_ sampler: Sampler) async -> Bool {
        guard inFlight.withLock({ $0.insert(sampler.name).inserted }) else { return false }
        let outcome = FirstAnswer<Bool>()
        let limit = sampleTimeout
        return await withCheckedContinuation { continuation in
            outcome.set(continuation)
            let work = Task {
                let ok: Bool
                do {
                    try await sampler.run()
                    ok = true
                } catch {
                    ok = false
                }
                self.inFlight.withLock { _ = $0.remove(sampler.name) }
                outcome.finish(ok)
            }
            Task {
                try? await Task.sleep(for: limit)  // only the wait is cut short if cancelled
                if outcome.finish(false) { work.cancel() }
            }
        }
    }

    // MARK: Names

    /// Protocol error codes as label values: `ERROR_CHUNK_INVALID` is `chunk_invalid`.
    static let errorCodes: [String] = WireErrorCode.allCases.map(name(of:)) + ["unknown"]

    static func name(of code: WireErrorCode) -> String {
        guard case .UNRECOGNIZED = code else {
            let camel = String(describing: code).dropFirst("error".count)
            var snake = ""
            for character in camel {
                if character.isUppercase, !snake.isEmpty { snake.append("_") }
                snake.append(contentsOf: character.lowercased())
            }
            return snake
        }
        return "unknown"
    }

    // MARK: The process

    /// Resident memory from `/proc/self/statm` (Linux), nil elsewhere.
    static func residentBytes() -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return nil }  // not Linux: no figure
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return nil }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    /// Entries of `/proc/self/fd` (Linux), nil elsewhere.
    static func openFileCount() -> Int? {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return nil }  // not Linux: no figure
        return entries.count
    }
}

extension ServerMetrics {
    /// The data directory's file system: free and total bytes (``FileSystemSpace``).
    public static func diskSampler(_ directory: String, into metrics: ServerMetrics) -> Sampler {
        Sampler("disk") { [diskFree = metrics.diskFree, diskSize = metrics.diskSize] in
            guard let reading = await FileSystemSpace.read(directory) else { throw MetricsError("cannot read the free space of \(directory)") }
            diskFree.set(Double(reading.free))
            diskSize.set(Double(reading.size))
        }
    }
}

struct MetricsError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The registry's makers under the names this file uses: each metric named whole, with its help.
extension PrometheusCollectorRegistry {
    fileprivate func counter(name: String, labels: [(String, String)] = [], help: String) -> Counter {
        makeCounter(descriptor: Self.descriptor(name, help), labels: labels)
    }

    fileprivate func gauge(name: String, labels: [(String, String)] = [], help: String) -> Gauge {
        makeGauge(descriptor: Self.descriptor(name, help), labels: labels)
    }

    fileprivate func durationHistogram(name: String, labels: [(String, String)] = [], buckets: [Duration], help: String) -> DurationHistogram {
        makeDurationHistogram(descriptor: Self.descriptor(name, help), labels: labels, buckets: buckets)
    }

    private static func descriptor(_ name: String, _ help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: name, unitName: "", helpText: help)
    }
}
