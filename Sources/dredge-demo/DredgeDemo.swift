import ArgumentParser
import DredgeLogging
import DredgeSamples
import DredgeStore
import Foundation

/// The README's main job, at this stage of the product: fill a store with a realistic
/// multi-day, multi-user log set through the real client API, then answer a support question
/// with a filtered query, and check the answer against what was logged.
@main
struct DredgeDemo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dredge-demo",
        abstract: "Write a realistic log set into a store and print a filtered query of it.")

    @Option(help: "Directory for the demo store (recreated).")
    var dir: String = "demo-output"

    @Option(help: "Records to generate.")
    var records: Int = 60_000

    @Option(help: "Days of history.")
    var days: Int = 4

    func run() async throws {
        let path = (dir as NSString).appendingPathComponent("device-logs.sqlite")
        try? FileManager.default.removeItem(atPath: dir)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)

        // A device keeping a week of logs; the app runs as several users over `days` days.
        var configuration = StoreConfiguration()
        configuration.retention.maxAge = .seconds(7 * 86_400)
        configuration.overflowPolicy = .block
        let center = try LogCenter(
            path: path, configuration: configuration,
            context: LogContext(host: "kitchen-oven-0042", os: "Debian 12 (Linux 6.1)", app: "oven-control", appVersion: "2.4.1", process: "oven-control[812]"))
        let uids = ["u-1001", "u-1002", "u-1003", "u-1004", "u-1005"]
        let now = Timestamp.now
        let start = now.subtracting(.seconds(Int64(days) * 86_400))
        print("Writing \(records) records for \(uids.count) users over \(days) days into \(path)")
        var written: [LogEntry] = []
        written.reserveCapacity(records + 8)
        for entry in SampleLogs(count: records, uids: uids, from: start, to: now.subtracting(.seconds(60)), context: center.context) {
            center.store.enqueue(entry)
            written.append(entry)
        }

        // And a few live records through the app-facing logger, with privacy annotations.
        center.setUser("u-1002")
        let log = center.logger(type: .business)
        let email = "maria.rossi@example.com"
        log.notice("feedback submitted by \(email, privacy: .hashed): \"the oven didn't turn off\"", metadata: ["card": .private("4111 1111 1111 1111"), "screen": "program"])
        log.error("program stop command timed out after 3 retries", metadata: ["program": "pizza-250C", "retries": 3])
        center.setUser(nil)
        try await center.flush()

        let stats = try center.store.statistics()
        print("Store: \(stats.recordCount) records, \(stats.bytesOnDisk / 1024) KiB on disk, oldest \(stats.oldest?.rfc3339 ?? "-")")

        // The support question: "user u-1002's warnings and errors of the last two days".
        let filter = LogFilter(since: now.subtracting(.seconds(2 * 86_400)), uid: "u-1002", levels: [.warning, .error, .critical])
        print("\nQuery: uid=u-1002, last 2 days, level warning and above")
        var matched: [LogRecord] = []
        try center.store.forEachRecord(matching: filter) { matched.append($0) }
        for record in matched.prefix(12) { print("  " + Self.line(record)) }
        if matched.count > 12 { print("  … \(matched.count - 12) more") }
        for record in matched.suffix(2) where matched.count > 12 { print("  " + Self.line(record)) }

        // Check: exactly what was logged that matches, nothing else.
        let expectedGenerated = written.filter { e in
            e.uid == "u-1002" && e.timestamp >= filter.since! && e.level >= .warning
        }.count
        let expected = expectedGenerated + 1  // the live error; the notice is below warning
        let jsonl = (dir as NSString).appendingPathComponent("u-1002-last-2-days.jsonl")
        var out = JSONWriter()
        for record in matched { record.writeJSON(into: &out); out.writeRaw("\n") }
        try Data(out.bytes).write(to: URL(fileURLWithPath: jsonl))
        print("\n\(matched.count) records matched (expected \(expected)); written to \(jsonl)")
        try center.close()
        guard matched.count == expected, matched.map(\.timestamp) == matched.map(\.timestamp).sorted() else {
            FileHandle.standardError.write(Data("demo: the query returned \(matched.count) records, expected \(expected)\n".utf8))
            throw ExitCode.failure
        }
        print("OK")
    }

    static func line(_ r: LogRecord) -> String {
        "\(r.timestamp.rfc3339) \(r.level.name.uppercased()) \(r.type) \(r.message)"
    }
}
