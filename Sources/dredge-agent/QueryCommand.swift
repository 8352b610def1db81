import ArgumentParser
import DredgeCommandLine
import DredgeDomain
import DredgeStore
import Foundation

struct QueryCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "query", abstract: "Print the records matching a filter, oldest first.")

    enum Format: String, ExpressibleByArgument, CaseIterable {
        case text, jsonl
    }

    @OptionGroup var store: StoreOptions
    @OptionGroup var filter: FilterOptions

    @Option(help: "Output format: text or jsonl.")
    var format: Format = .text

    @Option(help: "Print at most this many records.")
    var limit: Int?

    @Flag(help: "Print SQLite's query plan instead of the records.")
    var explain = false

    func run() async throws {
        let logStore = try store.open(readOnly: true)
        let selection = try filter.filter()
        if explain {
            for line in try logStore.queryPlan(for: selection) { print(line) }
            return
        }
        var printed = 0
        var out = JSONWriter(reservingCapacity: 64 * 1024)
        struct Done: Error {}
        do {
            try logStore.forEachRecord(matching: selection) { record in
                if let limit, printed >= limit { throw Done() }
                switch format {
                case .jsonl: record.writeJSON(into: &out)
                case .text: out.writeRaw(QueryCommand.text(record))
                }
                out.writeRaw("\n")
                printed += 1
                if out.bytes.count > 60 * 1024 { flush(&out) }
            }
        } catch is Done {}
        flush(&out)
        for loss in try logStore.losses(since: selection.since, until: selection.until) {
            FileHandle.standardError.write(Data("note: \(loss.count) records from \(loss.first) to \(loss.last) are missing (\(loss.reason))\n".utf8))
        }
    }

    private func flush(_ out: inout JSONWriter) {
        FileHandle.standardOutput.write(Data(out.bytes))
        out.reset()
    }

    static func text(_ r: LogRecord) -> String {
        let level = r.level.name.uppercased().padding(toLength: 8, withPad: " ", startingAt: 0)
        let meta = r.metadataJSON == "{}" ? "" : " " + r.metadataJSON
        return "\(r.timestamp.rfc3339) \(level) \(r.type) [\(r.uid.isEmpty ? "-" : r.uid)] \(r.message)\(meta)"
    }
}
