import ArgumentParser
import DredgeDomain
import DredgeCommandLine
import DredgeServer
import Foundation

@main
struct DredgeServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dredge-server",
        abstract: "The Dredge command server.",
        version: DredgeVersion.current,
        subcommands: [InitCommand.self, RunCommand.self, AgentsCommand.self, PullCommand.self, PullsCommand.self])
}

struct InitCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create a deployment in a data directory: CA, server certificate, keys and tokens.",
        discussion: "Refuses to overwrite an existing deployment. Prints what agents need to enroll and the admin token, once.")

    @Option(help: "The data directory (created if missing).")
    var data: String

    @Option(help: "Address the agent listener binds.")
    var listen = "127.0.0.1"

    @Option(help: "Port of the agent listener (TLS).")
    var agentPort = 7443

    @Option(help: "Port of the admin API (loopback only).")
    var adminPort = 7080

    @Option(name: .customLong("name"), help: "A host name or IPv4 address agents use to reach the server; repeatable. Goes into the certificate.")
    var names: [String] = []

    func validate() throws {
        guard (1...65_535).contains(agentPort), (1...65_535).contains(adminPort), agentPort != adminPort else {
            throw ValidationError("ports must be distinct and within 1...65535")
        }
    }

    func run() async throws {
        var options = ServerDeployment.Options(dataDirectory: data)
        options.listenHost = listen
        options.agentPort = agentPort
        options.adminPort = adminPort
        options.names = names
        let created: ServerDeployment.Created
        do {
            created = try ServerDeployment.initialize(options)
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
        print("""
            Created a Dredge deployment in \(data).

            What an agent needs to enroll:
              server:          \(created.agentAddress)
              CA certificate:  \(created.caPath)
              CA fingerprint:  \(created.caFingerprint)
              enrollment token: \(created.enrollmentToken)

            Admin token for engineers (shown once; only its hash is stored):
              \(created.adminToken)
            """)
    }
}
