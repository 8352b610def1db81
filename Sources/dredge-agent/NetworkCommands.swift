import ArgumentParser
import DredgeAgentCore
import DredgeCommandLine
import DredgeDomain
import DredgeStore
import DredgeWire
import Foundation
import Logging
import ServiceLifecycle

struct AgentStateOptions: ParsableArguments {
    @Option(help: "The agent's state directory: key, pinned CA, enrollment, queued uploads (default: $DREDGE_AGENT_STATE, else ~/.local/state/dredge/agent).")
    var state: String?

    var path: String {
        if let state { return state }
        if let env = ProcessInfo.processInfo.environment["DREDGE_AGENT_STATE"], !env.isEmpty { return env }
        return FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".local/state/dredge/agent").path
    }
}

/// The process's own host name and OS: what the agent says of its host when its store has no
/// record to take the device's context from.
func processHostInfo() -> WireHostInfo {
    let info = ProcessInfo.processInfo
    return .with {
        $0.hostname = info.hostName
        $0.os = info.operatingSystemVersionString
    }
}

/// How the operator names the device, over what the store's newest record says.
struct HostDescriptionOptions: ParsableArguments {
    @Option(help: "The app name reported to the server (default: the app of the store's newest record).")
    var app: String?

    @Option(help: "The app version reported to the server (default: that of the store's newest record).")
    var appVersion: String?

    @Option(name: .customLong("label"), help: "A label KEY=VALUE reported to the server (repeatable), over the store's context.")
    var labels: [String] = []

    func validate() throws {
        for label in labels {
            guard let eq = label.firstIndex(of: "="), eq != label.startIndex else { throw ValidationError("--label must be KEY=VALUE, not '\(label)'") }
        }
    }

    var overrides: WireHostInfo {
        .with { info in
            info.app = app ?? ""
            info.appVersion = appVersion ?? ""
            for label in labels {
                guard let eq = label.firstIndex(of: "=") else { continue }
                info.extra[String(label[..<eq])] = String(label[label.index(after: eq)...])
            }
        }
    }
}

/// The addresses `--server` gives (each HOST:PORT or [IPv6]:PORT, repeated or comma-separated), in order.
func serverAddresses(_ values: [String]) throws -> [ServerAddress] {
    var all: [ServerAddress] = []
    for part in values.flatMap({ $0.split(separator: ",", omittingEmptySubsequences: false) }).map({ $0.trimmingCharacters(in: .whitespaces) }) {
        // No default port: 0 stands for "none given", which the agent cannot dial.
        guard let parsed = HostPort(part, defaultPort: 0), parsed.port > 0 else {
            throw ValidationError("--server: '\(part)' is not HOST:PORT ([IPv6]:PORT)")
        }
        let address = ServerAddress(host: parsed.host, port: parsed.port)
        if !all.contains(address) { all.append(address) }
    }
    guard !all.isEmpty else { throw ValidationError("--server needs an address") }
    return all
}

struct EnrollCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "enroll", abstract: "Enroll this agent with a server: make its key, register it with a token, pin the CA.")

    @OptionGroup var agentState: AgentStateOptions

    @Option(help: ArgumentHelp(
        "The server's agent address, HOST:PORT, as `dredge-server init` printed it. A cluster's nodes: repeat it, or separate them with commas; they are tried in order.",
        valueName: "host:port"))
    var server: [String]

    @Option(help: "The server's CA certificate (PEM file), as `dredge-server init` made it.")
    var ca: String

    @Option(help: "The enrollment token.")
    var token: String

    @OptionGroup var describing: HostDescriptionOptions

    func validate() throws { _ = try serverAddresses(server) }

    func run() async throws {
        let servers = try serverAddresses(server)
        guard let caPEM = FileManager.default.contents(atPath: ca).map({ String(decoding: $0, as: UTF8.self) }) else {
            throw fail("cannot read the CA certificate \(ca)")
        }
        do {
            let state = try await AgentEnrollment.enroll(
                servers: servers, caPEM: caPEM, token: token, stateDirectory: agentState.path,
                hostInfo: WireHostInfo.describing(nil, fallback: processHostInfo(), overrides: describing.overrides))
            print("enrolled as agent \(state.file.agentID); state in \(state.directory)")
        } catch let error as AgentError {
            throw fail(error.description)
        }
    }
}

struct RunAgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run", abstract: "Stay connected to the server: authenticate, heartbeat, reconnect. Stops on SIGTERM or SIGINT.")

    @OptionGroup var agentState: AgentStateOptions
    @OptionGroup var store: StoreOptions

    @OptionGroup var describing: HostDescriptionOptions

    @Option(help: "Log level: trace, debug, info, notice, warning, error.")
    var logLevel = "info"

    @Option(help: "The longest wait, in seconds, between attempts to reconnect (1 to 3600). An agent the server refused for good (revoked, unknown, its keys retired) waits 15 minutes whatever this says, once every server address has refused it.")
    var reconnectMaxSeconds = 60

    @Option(help: "Exports run at once (1 to 16); a pull beyond them is answered REJECT_BUSY.")
    var maxExports = 2

    @Option(help: ArgumentHelp(
        "Connect to these server addresses (HOST:PORT, repeated or comma-separated), in order, instead of the ones enrolled with.", valueName: "host:port"))
    var server: [String] = []

    @Flag(help: "Create an empty store when there is none at the store path (without it, a missing store is an error: a mistyped path would answer every pull with 0 records).")
    var create = false

    func validate() throws {
        guard (1...3600).contains(reconnectMaxSeconds) else { throw ValidationError("--reconnect-max-seconds must be 1 to 3600") }
        guard (1...16).contains(maxExports) else { throw ValidationError("--max-exports must be 1 to 16") }
        if !server.isEmpty { _ = try serverAddresses(server) }
    }

    func run() async throws {
        LoggingSystem.bootstrap { StreamLogHandler.standardError(label: $0) }
        var logger = Logger(label: "dredge.agent")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        guard create || FileManager.default.fileExists(atPath: store.path) else {
            throw fail("no store at \(store.path): the app logs there, so check the path (or pass --create to start an empty one)")
        }
        let state: AgentState
        do {
            state = try AgentState.load(from: agentState.path)
        } catch let error as AgentError {
            throw fail(error.description)
        }
        let logStore = try store.open(readOnly: false)
        let client = try AgentClient(
            state: state, store: logStore, hostInfo: processHostInfo(), hostOverrides: describing.overrides, logger: logger, maxReconnectDelay: .seconds(reconnectMaxSeconds),
            maxExports: maxExports, servers: server.isEmpty ? nil : try serverAddresses(server))
        let group = ServiceGroup(services: [client], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
        try logStore.close()
        logger.info("dredge-agent stopped")
    }
}
