import ArgumentParser
import DredgeCommandLine
import DredgeDomain
import DredgeLogging
import DredgeStore
import Foundation

struct StoreOptions: ParsableArguments {
    @Option(name: .long, help: "Path of the SQLite log store.")
    var store: String?

    var path: String {
        if let store { return store }
        if let env = ProcessInfo.processInfo.environment["DREDGE_STORE"], !env.isEmpty { return env }
        return FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".local/state/dredge/logs.sqlite").path
    }

    func open(readOnly: Bool = false, policy: OverflowPolicy = .dropNewest) throws -> LogStore {
        var configuration = StoreConfiguration()
        // The store's retention is its app's (recorded in the store): the agent never applies a
        // policy of its own to it.
        configuration.retentionRole = .follower
        configuration.readOnly = readOnly
        configuration.overflowPolicy = policy
        if readOnly && !FileManager.default.fileExists(atPath: path) {
            throw ValidationError("no store at \(path)")
        }
        do {
            return try LogStore(path: path, configuration: configuration)
        } catch let error as StoreError {
            throw fail(error.description)
        }
    }
}

/// Record fields given as flags, shared by `log` and `ingest`.
struct RecordOptions: ParsableArguments {
    @Option(help: "Level: trace, debug, info, notice, warning, error, critical.")
    var level: String = "info"

    @Option(help: "Log type: business, network, player, app, or your own ([a-z0-9._-]).")
    var type: String = "app"

    @Option(help: "The user the records belong to.")
    var uid: String = ""

    @Option(help: "App name stored in the context row.")
    var app: String = "dredge-agent"

    func validate() throws {
        guard LogLevel(name: level) != nil else { throw ValidationError("unknown level '\(level)'") }
        guard LogType(type) != nil else { throw ValidationError("invalid log type '\(type)': use [a-z0-9._-], at most \(LogType.maxLength) bytes") }
    }

    var logLevel: LogLevel { LogLevel(name: level)! }
    var logType: LogType { LogType(type)! }
}

