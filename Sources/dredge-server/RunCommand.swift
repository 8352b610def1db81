import ArgumentParser
import DredgeCommandLine
import DredgeServer
import DredgeStore
import Foundation
import Logging

struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run", abstract: "Run the server: the agent listener (TLS). Stops gracefully on SIGTERM or SIGINT.")

    @Option(help: "The data directory made by `dredge-server init`.")
    var data: String

    @Option(help: "Override the agent port from server.json.")
    var agentPort: Int?

    @Option(help: "Heartbeat interval agents are told to use, in seconds.")
    var heartbeatSeconds: UInt32?

    @Option(help: "Log level: trace, debug, info, notice, warning, error.")
    var logLevel = "info"

    func run() async throws {
        LoggingSystem.bootstrap { StreamLogHandler.standardError(label: $0) }
        var logger = Logger(label: "dredge.server")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        do {
            try await ServerRuntime.run(dataDirectory: data, agentPort: agentPort, heartbeatSeconds: heartbeatSeconds, logger: logger)
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
    }
}

struct AgentsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "agents", abstract: "List enrolled agents and their presence, from the data directory.")

    @Option(help: "The data directory.")
    var data: String

    @Flag(help: "JSON output.")
    var json = false

    func run() async throws {
        let agents = try AgentRegistry(path: data + "/server.sqlite").agents()
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

    @Option(help: "Minutes until the pull expires if not delivered.")
    var expiresIn = 60

    func run() async throws {
        let uid = selection.uid
        guard uid != nil || agent != nil else { throw ValidationError("give --uid, --agent, or both") }
        let filter = try selection.filter()
        let deployment = try LoadedDeployment(directory: data)
        let registry = try AgentRegistry(path: data + "/server.sqlite")
        let agents = try registry.agents().filter { a in
            if let agent, a.agentID != agent { return false }
            if let uid, agent == nil, !a.activeUIDs.contains(uid) { return false }
            return true
        }.map(\.agentID)
        guard !agents.isEmpty else {
            throw fail(agent != nil ? "no enrolled agent \(agent!)" : "no agent has reported uid \(uid!)")
        }
        let pulls = try PullStore(path: data + "/pulls.sqlite", encryptionKey: deployment.encryptionKey)
        let id = try pulls.create(uid: uid ?? "", agentID: agent ?? "", filter: filter, agents: agents, lifetime: .seconds(Int64(expiresIn) * 60), requestedBy: "local-operator")
        print(id)
    }
}

struct PullsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "pulls", abstract: "List pulls and their status per agent.")

    @Option(help: "The data directory.")
    var data: String

    @Flag(help: "JSON output.")
    var json = false

    func run() async throws {
        let deployment = try LoadedDeployment(directory: data)
        let pulls = try PullStore(path: data + "/pulls.sqlite", encryptionKey: deployment.encryptionKey).pulls()
        if json { return try printJSON(pulls) }
        for p in pulls {
            for t in p.targets {
                print("\(p.id)  uid=\(p.uid.isEmpty ? "-" : p.uid)  agent=\(t.agentID)  \(t.status.rawValue)  \(t.chunksReceived)/\(t.chunkCount) chunks  \(t.detail)")
            }
        }
    }
}

