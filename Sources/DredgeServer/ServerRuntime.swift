import Foundation
import Logging
import ServiceLifecycle

/// `dredge-server run`: loads the deployment, opens the registry, and runs the listeners in
/// one service group that stops gracefully on SIGTERM and SIGINT.
public enum ServerRuntime {
    public static func run(dataDirectory: String, agentPort: Int? = nil, heartbeatSeconds: UInt32? = nil, logger: Logger) async throws {
        let deployment = try LoadedDeployment(directory: dataDirectory)
        let registry = try AgentRegistry(path: dataDirectory + "/server.sqlite")
        try registry.resetPresence()
        let pulls = try PullStore(path: dataDirectory + "/pulls.sqlite", encryptionKey: deployment.encryptionKey)
        let listener = AgentListener(deployment: deployment, registry: registry, pulls: pulls, logger: logger, port: agentPort, heartbeatSeconds: heartbeatSeconds)
        let group = ServiceGroup(services: [listener], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
        logger.info("dredge-server stopped")
    }
}
