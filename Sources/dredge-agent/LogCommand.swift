import ArgumentParser
import DredgeDomain
import DredgeLogging
import DredgeStore

struct LogCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "log", abstract: "Write one record into the store and wait until it is durable.")

    @OptionGroup var store: StoreOptions
    @OptionGroup var record: RecordOptions

    @Option(name: .customLong("meta"), help: "Metadata as key=value; repeatable.")
    var metadata: [String] = []

    @Argument(help: "The message.")
    var message: [String]

    func validate() throws {
        for pair in metadata where !pair.contains("=") { throw ValidationError("--meta expects key=value, got '\(pair)'") }
        if message.isEmpty { throw ValidationError("a message is required") }
    }

    func run() async throws {
        let logStore = try store.open(policy: .block)
        let center = try LogCenter(store: logStore, context: .current(app: record.app))
        var fields: LogFields = [:]
        for pair in metadata {
            let parts = pair.split(separator: "=", maxSplits: 1)
            fields[String(parts[0])] = LogField(.string(parts.count > 1 ? String(parts[1]) : ""))
        }
        let logger = center.logger(type: record.logType)
        logger.log(record.logLevel, LogMessage(stringLiteral: message.joined(separator: " ")), metadata: fields, uid: record.uid)
        // Its run ends cleanly (a run left open is a crash to the next one that looks).
        try center.close()
        try logStore.close()
    }
}
