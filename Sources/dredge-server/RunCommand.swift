import ArgumentParser
import DredgeServer
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
            FileHandle.standardError.write(Data("error: \(error)\n".utf8))
            throw ExitCode.failure
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
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            encoder.dateEncodingStrategy = .iso8601
            print(String(decoding: try encoder.encode(agents), as: UTF8.self))
            return
        }
        for a in agents {
            print("\(a.agentID)  \(a.connected ? "online " : "offline")  \(a.hostname)  \(a.app) \(a.appVersion)  uids=\(a.activeUIDs.joined(separator: ","))  records=\(a.storeRecords)")
        }
    }
}
