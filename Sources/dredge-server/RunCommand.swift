import ArgumentParser
import DredgeAdminAPI
import DredgeCommandLine
import DredgeDomain
import DredgeServer
import Foundation
import Logging
import Metrics

struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run", abstract: "Run the server: the agent listener (TLS) and the admin API with the console (HTTPS; plain HTTP only on loopback, if init made it so). Stops gracefully on SIGTERM or SIGINT.")

    @Option(help: "The data directory made by `dredge-server init`.")
    var data: String

    @Option(help: "Override the agent port from server.json.")
    var agentPort: Int?

    @Option(help: "Override the admin API port from server.json (0: any free port, printed in the log).")
    var adminPort: Int?

    @Option(help: ArgumentHelp("Override the admin API's address from server.json: HOST or HOST:PORT (plain HTTP only on loopback).", valueName: "host[:port]"))
    var adminListen: String?

    @Option(help: "Heartbeat interval agents are told to use, in seconds.")
    var heartbeatSeconds: UInt32?

    @Option(help: "Days pulled and feedback files (and their index rows) are kept before they are deleted; 0 keeps them until `dredge rm`. Overrides server.json's results.keepDays (default 30).")
    var keepDays: Int?

    @Option(help: "How long a web console session lasts, in minutes (1 to 10080; default 480, 8 hours).")
    var consoleSessionMinutes: Int?

    @Option(help: ArgumentHelp("A PostgreSQL database for the server's state instead of server.json's (or SQLite in the data directory): postgres://USER@HOST[:PORT]/DATABASE[?sslmode=require]. The password is best given in PGPASSWORD or a password file (PGPASSFILE, ~/.pgpass).", valueName: "url"))
    var database: String?

    @Option(help: "Log level: trace, debug, info, notice, warning, error.")
    var logLevel = "info"

    func validate() throws {
        if let keepDays, let problem = ResultsRetention(keepDays: keepDays).problem { throw ValidationError("--keep-days: \(problem)") }
        if let consoleSessionMinutes, !(1...10_080).contains(consoleSessionMinutes) {
            throw ValidationError("--console-session-minutes: \(consoleSessionMinutes) is not 1 to 10080 (a week)")
        }
    }

    func run() async throws {
        LoggingSystem.bootstrap { StreamLogHandler.standardError(label: $0) }
        var logger = Logger(label: "dredge.server")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        var adminHost: String?, port = adminPort
        if let adminListen {
            guard let address = HostPort(adminListen, defaultPort: adminPort ?? -1) else {
                throw ValidationError("--admin-listen: '\(adminListen)' is not HOST, HOST:PORT or [IPv6]:PORT")
            }
            adminHost = address.host
            if address.port >= 0 { port = address.port }
        }
        do {
            var options = ServerRuntime.Options(
                dataDirectory: data, agentPort: agentPort, adminPort: port, adminHost: adminHost, heartbeatSeconds: heartbeatSeconds, keepDays: keepDays)
            options.consoleSessionMinutes = consoleSessionMinutes
            options.database = database
            // What libraries measure through swift-metrics goes to the server's own registry.
            let metrics = ServerMetrics()
            MetricsSystem.bootstrap(metrics.swiftMetricsFactory)
            options.metrics = metrics
            try await ServerRuntime.run(options, logger: logger)
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
    }
}

struct AgentsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "agents", abstract: "List enrolled agents and their presence, from the data directory.")

    @Option(help: "The data directory.")
    var data: String

    @Option(help: ArgumentHelp("The PostgreSQL database, when not server.json's.", valueName: "url"))
    var database: String?

    @Flag(help: "JSON output.")
    var json = false

    func run() async throws {
        let agents = try await ServerPersistence.open(try LoadedDeployment(directory: data), database: database).registry.agents()
        if json { return try printJSON(agents) }
        for a in agents {
            print("\(a.agentID)  \(a.connected ? "online " : "offline")  \(a.hostname)  \(a.app) \(a.appVersion)  uids=\(a.activeUIDs.joined(separator: ","))  records=\(a.storeRecords)")
        }
    }
}

/// Queues a pull from the server host itself (the admin API and the `dredge` command line are
/// the engineers' way; this is the operator's, recorded in the audit log as `local-operator`).
struct PullCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pull", abstract: "Queue a pull for the agents that have a uid (or one agent); the running server delivers it.")

    @Option(help: "The data directory.")
    var data: String

    @OptionGroup var selection: FilterOptions

    @Option(help: "Only this agent.")
    var agent: String?

    @Option(help: ArgumentHelp("The PostgreSQL database, when not server.json's.", valueName: "url"))
    var database: String?

    @Option(help: "Minutes the pull may wait for an offline agent before it expires (a delivered pull that then goes quiet expires 15 minutes later).")
    var expiresIn = 60

    @Option(help: "Why (a ticket, say): kept with the pull and in the audit log; required where pulls are approved (approvals.required).")
    var reason: String?

    func validate() throws {
        guard (1...7 * 24 * 60).contains(expiresIn) else { throw ValidationError("--expires-in must be between 1 and \(7 * 24 * 60) minutes") }
    }

    func run() async throws {
        let filter = try selection.filter()
        let deployment = try LoadedDeployment(directory: data)
        let approval = deployment.config.approvals?.isRequired ?? false
        if approval, (reason ?? "").trimmingCharacters(in: .whitespaces).isEmpty {
            throw fail("this deployment requires a reason with each pull (--reason), for the person who approves it")
        }
        let stores = try await ServerPersistence.open(deployment, database: database)
        do {
            let pull = try await stores.pulls.create(
                PullRequest(uid: selection.uid, agent: agent, filter: filter, expiresInSeconds: expiresIn * 60, reason: reason), registry: stores.registry,
                issuer: stores.issuer, requestedBy: "local-operator", approvalRequired: approval, logger: Logger(label: "dredge.server"))
            print(pull.id)
            if approval { FileHandle.standardError.write(Data("awaiting approval: an investigator or admin approves it with dredge approve \(pull.id)\n".utf8)) }
            if pull.targets.isEmpty {
                FileHandle.standardError.write(Data("no agent holds uid \(pull.uid) yet; the pull waits for one until it expires\n".utf8))
            }
        } catch let error as PullRequestError {
            throw fail(error.description)
        }
    }
}

struct PullsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "pulls", abstract: "List pulls and their status per agent.")

    @Option(help: "The data directory.")
    var data: String

    @Option(help: ArgumentHelp("The PostgreSQL database, when not server.json's.", valueName: "url"))
    var database: String?

    @Flag(help: "JSON output.")
    var json = false

    func run() async throws {
        let pulls = try await ServerPersistence.open(try LoadedDeployment(directory: data), database: database).pulls.pulls()
        if json { return try printJSON(pulls) }
        for p in pulls {
            if p.targets.isEmpty {
                print("\(p.id)  uid=\(p.uid)  agent=-  \(p.isFinished ? "expired: no agent held the uid" : "waiting for an agent that holds the uid")")
            }
            for t in p.targets {
                print("\(p.id)  uid=\(p.uid.isEmpty ? "-" : p.uid)  agent=\(t.agentID)  \(t.status.rawValue)  \(t.chunksReceived)/\(t.chunkCount) chunks  \(t.detail)")
            }
        }
    }
}

