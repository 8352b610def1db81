import ArgumentParser
import DredgeDomain
import DredgeLogging
import DredgeStore
import Foundation

struct IngestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ingest",
        abstract: "Write records from standard input, one per line, until end of input.",
        discussion: """
            Plain lines become messages with the --type and --uid given, at the level the line states \
            (a syslog <PRI>, a JSON "level", level=…, or a word such as ERROR, WARN, [info], fatal:), \
            else at --level (--no-detect-level: always --level). With --json, each line \
            is an object {"ts", "level", "type", "uid", "message", "metadata"}; only "message" is required, \
            "ts" is RFC 3339 or microseconds since the epoch. A line that cannot be read is reported on \
            stderr with its number and skipped; the exit status is then 65. Nothing read before is lost: \
            ingest waits for the store (it never drops) and flushes before it exits.
            """)

    @OptionGroup var store: StoreOptions
    @OptionGroup var record: RecordOptions

    @Flag(help: "Read JSON objects instead of plain lines.")
    var json = false

    @Flag(inversion: .prefixedNo, help: "Take a plain line's level from the line when it states one.")
    var detectLevel = true

    struct Line: Decodable {
        var ts: TimeValue?
        var level: String?
        var type: String?
        var uid: String?
        var message: String
        var metadata: LogMetadata?
    }

    enum TimeValue: Decodable {
        case text(String)
        case micros(Int64)
        init(from decoder: any Decoder) throws {
            let c = try decoder.singleValueContainer()
            if let m = try? c.decode(Int64.self) { self = .micros(m) } else { self = .text(try c.decode(String.self)) }
        }
    }

    func run() async throws {
        let logStore = try store.open(policy: .block)
        let center = try LogCenter(store: logStore, context: .current(app: record.app))
        let decoder = JSONDecoder()
        var accepted = 0, rejected = 0, number = 0
        while let text = readLine(strippingNewline: true) {
            number += 1
            if text.isEmpty { continue }
            do {
                let entry = try json ? parseJSON(text, decoder: decoder, center: center) : plain(text, center: center)
                logStore.enqueue(entry)
                accepted += 1
            } catch {
                rejected += 1
                FileHandle.standardError.write(Data("line \(number): \(error)\n".utf8))
            }
        }
        try center.close()
        try logStore.close()
        FileHandle.standardError.write(Data("ingested \(accepted) records\(rejected > 0 ? ", rejected \(rejected)" : "")\n".utf8))
        if rejected > 0 { throw ExitCode(65) }
    }

    private func plain(_ text: String, center: LogCenter) -> LogEntry {
        let level = detectLevel ? LogLevel.detected(inLine: text) ?? record.logLevel : record.logLevel
        return LogEntry(level: level, type: record.logType, uid: record.uid, message: text, context: center.context)
    }

    struct LineError: Error, CustomStringConvertible {
        var description: String
    }

    private func parseJSON(_ text: String, decoder: JSONDecoder, center: LogCenter) throws -> LogEntry {
        let line: Line
        do {
            line = try decoder.decode(Line.self, from: Data(text.utf8))
        } catch {
            throw LineError(description: "not a JSON record with a \"message\" string")
        }
        var ts = Timestamp.now
        switch line.ts {
        case .micros(let m)?: ts = Timestamp(microseconds: m)
        case .text(let s)?:
            guard let parsed = Timestamp(rfc3339: s) else { throw LineError(description: "bad ts '\(s)': expected RFC 3339") }
            ts = parsed
        case nil: break
        }
        var level = record.logLevel
        if let name = line.level {
            guard let parsed = LogLevel(name: name) else { throw LineError(description: "unknown level '\(name)'") }
            level = parsed
        }
        var type = record.logType
        if let name = line.type {
            guard let parsed = LogType(name) else { throw LineError(description: "invalid type '\(name)'") }
            type = parsed
        }
        return LogEntry(
            timestamp: ts, level: level, type: type, uid: line.uid ?? record.uid, message: line.message,
            metadata: line.metadata ?? [:], context: center.context)
    }
}
