import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Logging
import ServiceLifecycle

/// `dredge-server run`: loads the deployment, opens the registry and the pull queue, and runs
/// the agent listener, the admin API, the delivery sweep and the indexer in one service group that stops
/// gracefully on SIGTERM and SIGINT.
public enum ServerRuntime {
    public struct Options: Sendable {
        public var dataDirectory: String
        public var agentPort: Int?
        public var adminPort: Int?
        /// Overrides `server.json`'s admin address (plain HTTP still only on loopback).
        public var adminHost: String?
        public var heartbeatSeconds: UInt32?
        /// Overrides `server.json`'s `results.keepDays` (0: keep until removed).
        public var keepDays: Int?
        /// How long a web console session lasts, 1 to 10,080 minutes (default ``ConsoleSessions/defaultLifetime``).
        public var consoleSessionMinutes: Int?
        /// A PostgreSQL database (`postgres://…`) instead of `server.json`'s `database` (or,
        /// when neither names one, SQLite in the data directory).
        public var database: String?
        /// Where the server counts what it does (`GET /metrics`); one of its own when nil. The
        /// `dredge-server` command makes it first, to bootstrap swift-metrics with it.
        public var metrics: ServerMetrics?

        public init(
            dataDirectory: String, agentPort: Int? = nil, adminPort: Int? = nil, adminHost: String? = nil, heartbeatSeconds: UInt32? = nil, keepDays: Int? = nil
        ) {
            self.dataDirectory = dataDirectory
            self.agentPort = agentPort
            self.adminPort = adminPort
            self.adminHost = adminHost
            self.heartbeatSeconds = heartbeatSeconds
            self.keepDays = keepDays
        }
    }

    public static func run(_ options: Options, logger: Logger) async throws {
        logger.info("dredge-server starting", metadata: ["version": "\(DredgeVersion.current)", "data": "\(options.dataDirectory)"])
        // Before any SQLite database opens (SQLite's error log can be set only then).
        DatabaseMeter.installSQLiteErrorLog()
        let metrics = options.metrics ?? ServerMetrics()
        let openFiles = raiseOpenFileLimit()
        logger.info("open file limit", metadata: ["limit": "\(openFiles)"])
        // Absolute, so the file paths the admin API reports work from anywhere.
        let dir = URL(fileURLWithPath: options.dataDirectory).standardizedFileURL.path
        renewCertificateIfDue(dir, logger: logger)
        let deployment = try LoadedDeployment(directory: dir)
        for key in deployment.unknownKeys {
            logger.warning("server.json has a key no release reads; it is ignored", metadata: ["key": "\(key)", "check": "dredge-server config check --data \(dir)"])
        }
        for path in deployment.fromEnvironment {
            logger.notice("configuration from the environment", metadata: ["key": "\(path)", "variable": "\(ServerConfiguration.key(path)?.environmentName ?? "?")"])
        }
        // One server per data directory on SQLite, held until this returns (a cluster's nodes
        // on PostgreSQL share theirs).
        let lock = (options.database ?? deployment.config.database) == nil ? try DataDirectoryLock.acquire(dir) : nil
        defer { withExtendedLifetime(lock) {} }
        tightenModes(dir, logger: logger)
        let adminHost = options.adminHost ?? deployment.config.adminHost ?? "127.0.0.1"
        try LoadedDeployment.checkAdmin(host: adminHost, tls: deployment.adminTLSConfiguration != nil)
        // A node's lease (PostgreSQL): three of the heartbeat intervals its agents are told.
        let heartbeat = Int64(max(1, options.heartbeatSeconds ?? WireLimits.defaultHeartbeatSeconds))
        let stores = try await ServerPersistence.open(deployment, database: options.database, lease: .seconds(3 * heartbeat), logger: logger)
        logger.info("state", metadata: ["database": "\(stores.location)"])
        stores.sqlite?.meter.attach(metrics)
        stores.postgres?.meter.attach(metrics)
        if !stores.imported.isEmpty {
            logger.notice("imported the files of an earlier release into the database", metadata: [
                "files": "\(stores.imported.joined(separator: ", "))", "database": "\(stores.location)",
            ])
        }
        for problem in stores.importProblems { logger.warning("after the import", metadata: ["problem": "\(problem)"]) }
        // The audit log's hash chain, checked whole at every start (#55). A break is reported,
        // not fatal: stopping would hand whoever edited the log a way to stop the server.
        let chain: AuditChain.Verdict
        do {
            chain = try await stores.pulls.verifyChain()
        } catch {
            chain = AuditChain.Verdict(broken: "the audit log could not be read: \(error)")
        }
        if let broken = chain.broken {
            logger.error("audit log chain broken: an entry was edited, removed or moved outside the server", metadata: [
                "entry": "\(chain.brokenAt ?? 0)", "why": "\(broken)", "intact.entries": "\(chain.entries)",
            ])
        } else {
            logger.info("audit log chain intact", metadata: ["entries": "\(chain.entries)", "last.id": "\(chain.lastID ?? 0)", "last.hash": "\(chain.lastHash ?? "-")"])
        }
        let (registry, pulls, feedback, tokens) = (stores.registry, stores.pulls, stores.feedback, stores.tokens)
        try await registry.resetPresence()
        let retention = options.keepDays.map(ResultsRetention.init(keepDays:)) ?? deployment.config.results ?? .default
        if let problem = retention.problem { throw DeploymentError("results retention: \(problem)") }
        let janitor = UploadJanitor(paths: DataDirectory(dir), pulls: pulls, feedback: feedback, captures: stores.triggers, logger: logger)
        try await janitor.sweep(atStart: true, shared: stores.node != nil)
        // In a cluster, what a dead node left unindexed is looked for every five minutes.
        let indexer = Indexer(index: stores.records, registry: stores.registry, tails: stores.tails, paths: DataDirectory(dir), logger: logger, catchUpEvery: stores.node == nil ? nil : .seconds(300), metrics: metrics)
        let results = ResultsKeeper(
            paths: DataDirectory(dir), pulls: pulls, feedback: feedback, tails: stores.tails, captures: stores.triggers, records: stores.records, indexer: indexer, audit: pulls,
            retention: retention, logger: logger)
        // Before the indexer catches up: it must not index what a cut-short removal left.
        try await results.finishInterruptedRemovals()
        logger.info("results retention", metadata: ["keep.days": "\(retention.keepDays == 0 ? "until removed" : String(retention.keepDays))"])
        let uploads = janitor.housekeeping(listeningSince: Date())
        // On PostgreSQL, revocations are also looked for at each sweep (a notification may be missed).
        let revokedAmong: (@Sendable ([String]) async throws -> [String])? = stores.node == nil ? nil : { @Sendable ids in try await registry.revoked(among: ids) }
        let tailHub = TailHub()
        let tails = stores.tails
        let dispatcher = PullDispatcher(pulls: pulls, logger: logger, notices: stores.notices, revokedAmong: revokedAmong) {
            try await uploads()
            try await results.housekeeping()
            try await TailHub.stopExpired(tails, hub: tailHub)
        }
        // What a stopped tail held is indexed, each device's part a source (on every node that
        // hears of the stop; the index lets one of them do it).
        tailHub.whenStopped { id, _, agents in
            for agent in agents { indexer.landed(IndexedSource(kind: .tail, id: id, agentID: agent)) }
        }
        // A tail another node stopped: the devices connected here stop, the watchers here end.
        dispatcher.whenTailStopped { [logger] id in
            Task {
                do {
                    guard let tail = try await tails.tail(id), let stopped = tail.stopped else { return }
                    tailHub.stopped(id, reason: stopped.reason, agents: tail.parts.map(\.agentID))
                } catch {
                    logger.error("cannot read a tail another node stopped", metadata: ["tail.id": "\(id)", "error": "\(error)"])
                }
            }
        }
        // The listeners' TLS, replaced for new connections when the certificate is renewed
        // (the admin API's too when it serves the same certificate, the deployment's default).
        let agentTLS = try ReloadableTLS(deployment.tlsConfiguration)
        let adminTLS = try deployment.adminTLSConfiguration.map { try ReloadableTLS($0) }
        let adminServesServerCertificate = deployment.config.adminTLS.map { tls in
            [tls.certificate, tls.key].map { URL(fileURLWithPath: $0.hasPrefix("/") ? $0 : dir + "/" + $0).standardizedFileURL.path }
                == [dir + "/server.pem", dir + "/server-key.pem"]
        } ?? false
        let renewal = try CertificateRenewal(
            directory: dir, agentTLS: agentTLS, adminTLS: adminServesServerCertificate ? adminTLS : nil, metrics: metrics, logger: logger)
        let listener = AgentListener(
            deployment: deployment, registry: registry, pulls: pulls, feedback: feedback, tokens: tokens, tails: stores.tails, tailHub: tailHub, triggers: stores.triggers, dispatcher: dispatcher, logger: logger,
            port: options.agentPort, heartbeatSeconds: options.heartbeatSeconds, issuer: stores.issuer, landed: { indexer.landed($0, records: $1) },
            metrics: metrics, tls: agentTLS)
        let adminServices = AdminServices(
            registry: registry, pulls: pulls, audit: pulls, issuer: stores.issuer, feedback: feedback, tokens: tokens, tails: stores.tails, triggers: stores.triggers, tailHub: tailHub,
            dispatcher: dispatcher, records: stores.records, indexer: indexer, files: PullFiles(paths: DataDirectory(dir), pulls: pulls, feedback: feedback, captures: stores.triggers), results: results,
            metrics: metrics, approvals: deployment.config.approvals ?? ApprovalSettings(), logger: logger)
        let adminPort = options.adminPort ?? deployment.config.adminPort
        for sampler in [
            listener.connectionSampler, indexer.lagSampler(into: metrics), ServerMetrics.diskSampler(dir, into: metrics), stores.sampler(into: metrics),
        ] { metrics.addSampler(sampler) }
        let (scrapeToken, madeToken) = try ScrapeToken.loadOrCreate(directory: dir)
        if madeToken {
            logger.notice("made the token Prometheus reads GET /metrics with", metadata: ["file": "\(dir)/\(ScrapeToken.fileName)"])
        }
        let application = try AdminAPI.application(
            actions: AdminActions(adminServices),
            consoleSessions: ConsoleSessions(
                vault: tokens, lifetime: options.consoleSessionMinutes.map { TimeInterval(min(max($0, 1), 10_080)) * 60 } ?? ConsoleSessions.defaultLifetime),
            host: adminHost, port: adminPort, tls: deployment.adminTLSConfiguration,
            caPEM: String(decoding: try Data(contentsOf: URL(fileURLWithPath: dir + "/ca.pem")), as: UTF8.self),
            connectionLimits: deployment.config.adminConnections ?? .default,
            readiness: Readiness([
                .database(stores), .listening("agent listener") { listener.boundPort },
                .disk(dir, minimumMegabytes: (deployment.config.readiness ?? .default).minFreeDiskMegabytes),
            ]),
            metrics: MetricsEndpoint(metrics: metrics, token: scrapeToken), reloadableTLS: adminTLS,
            singleSignOn: try deployment.config.sso.flatMap { $0.isConfigured ? try SingleSignOn(settings: $0, directory: dir) : nil })
        let admin = ListeningService(base: application, listener: "the admin API", host: adminHost, port: adminPort)
        // On PostgreSQL the node's lease is renewed beside the rest (its agents' presence and index claims).
        // On SQLite the write-ahead log is checkpointed off the writer.
        let checkpointer = try stores.sqlite.map { try WALCheckpointer($0, logger: logger) }
        // A listener of the metrics' own, when server.json asks for one.
        let metricsListener: [any Service] = (deployment.config.metrics ?? .default).address.map { address in
            [ListeningService(
                base: MetricsEndpoint.listener(metrics: metrics, host: address.host, port: address.port, logger: logger), listener: "the metrics listener",
                host: address.host, port: address.port)]
        } ?? []
        let services: [any Service] =
            (stores.node.map { [$0] } ?? []) + (checkpointer.map { [$0] } ?? []) + [dispatcher, indexer, listener, admin, renewal, KeyRingRefresh(keys: deployment.keys, logger: logger)] + metricsListener
            + (deployment.config.audit.map { [AuditShipper(audit: pulls, settings: $0, dataDirectory: dir, logger: logger)] } ?? [])
        if let node = stores.node { logger.info("cluster node", metadata: ["node": "\(node.id)", "name": "\(node.name)", "lease": "\(node.duration)"]) }
        let group = ServiceGroup(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
        logger.info("dredge-server stopped")
    }

    /// Renews the agent listener's certificate before the listeners load it when it has less
    /// than 30 days left (``ServerCertificate``). A renewal that fails is logged and the
    /// server starts with the certificate it has: ``CertificateRenewal`` tries again hourly.
    static func renewCertificateIfDue(_ dir: String, logger: Logger) {
        do {
            let (info, renewed) = try ServerCertificate.renewIfDue(directory: dir)
            let metadata: Logger.Metadata = ["not.after": "\(info.notAfter)", "days.left": "\(Int(info.left(at: Date()) / 86_400))", "fingerprint": "\(info.fingerprint)"]
            if renewed {
                logger.notice("renewed the agent listener's certificate", metadata: metadata)
            } else {
                logger.info("agent listener certificate", metadata: metadata)
            }
        } catch {
            logger.error("cannot renew the agent listener's certificate; starting with the one there", metadata: ["error": "\(error)"])
        }
    }

    /// The soft limit on open files now (-1 if unknown): what the agent listener sizes its
    /// connection caps by.
    public static func openFileLimit() -> Int { openFiles(raise: false) }

    /// A deployment made before everything was written for the server's user alone (#49):
    /// its files that others may read (server.json, the certificates) become 0600, its
    /// directory 0700. Logged; one that cannot be changed is logged and left.
    static func tightenModes(_ dir: String, logger: Logger) {
        for (path, mode) in [(dir, mode_t(0o700))] + ServerDeployment.files.map({ (dir + "/" + $0, mode_t(0o600)) }) {
            var info = stat()
            guard stat(path, &info) == 0, info.st_mode & 0o077 != 0 else { continue }
            if chmod(path, mode) == 0 {
                logger.notice("made private", metadata: ["path": "\(path)", "was": "\(String(info.st_mode & 0o777, radix: 8))"])
            } else {
                logger.warning("could not make private", metadata: ["path": "\(path)", "error": "\(String(cString: strerror(errno)))"])
            }
        }
    }

    /// Every agent connection is a file descriptor: raise the soft limit to the hard one, as
    /// far as the system allows. Returns the limit in effect.
    @discardableResult
    public static func raiseOpenFileLimit() -> Int { openFiles(raise: true) }

    private static func openFiles(raise: Bool) -> Int {
        var limit = rlimit()
        #if os(Linux)
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        #else
        let resource = RLIMIT_NOFILE
        #endif
        guard getrlimit(resource, &limit) == 0 else { return -1 }
        if raise && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(resource, &limit)
            _ = getrlimit(resource, &limit)
        }
        return Int(clamping: limit.rlim_cur)
    }
}
