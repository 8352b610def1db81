import ArgumentParser
import DredgeDomain
import DredgeLogging
import DredgePayload
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
        abstract: "Demo helpers: a local store demo, realistic device logs, and checking a pull's files.",
        version: DredgeVersion.current,
        subcommands: [LocalDemo.self, Generate.self, Verify.self],
        defaultSubcommand: LocalDemo.self)
}

/// A device's store filled with realistic logs, as the full demo's agents use.
struct Generate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "generate", abstract: "Write realistic logs for some users over some days into a store.")

    @Option(help: "The store.") var store: String
    @Option(help: "Comma-separated uids.") var uids: String
    @Option(help: "Records.") var records = 40_000
    @Option(help: "Days of history (at most 3, the store's default retention).") var days = 3
    @Option(help: "Random seed.") var seed: UInt64 = 42
    @Option(help: "Host name in the context row.") var host = "device"
    @Option(help: "App name in the context row (what a record says wrote it).") var app = "oven-control"
    @Option(help: "That app's version.") var appVersion = "2.4.1"

    func run() async throws {
        var configuration = StoreConfiguration()
        configuration.overflowPolicy = .block
        let logStore = try LogStore(path: store, configuration: configuration)
        let context = try logStore.register(LogContext(host: host, os: "Debian 12", app: app, appVersion: appVersion, process: "\(app)[812]"))
        let now = Timestamp.now
        let span = Int64(min(days, 3)) * 86_400 - 600
        for e in SampleLogs(count: records, uids: uids.split(separator: ",").map(String.init), from: now.subtracting(.seconds(span)), to: now, context: context, seed: seed) {
            logStore.enqueue(e)
        }
        try logStore.close()
        print("\(records) records for \(uids) in \(store)")
    }
}

/// Checks that a pull's per-day files are exactly what the device's store selects for the
/// pull's filter (read back from the manifest).
struct Verify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "verify", abstract: "Compare a pull's files with the device's store.")

    @Option(help: "The device's store.") var store: String
    @Option(help: "The pull's directory for that device (pulls/<pull>/<agent>).") var dir: String

    func run() async throws {
        let manifestData = try Data(contentsOf: URL(fileURLWithPath: dir + "/manifest.json"))
        let manifest = try JSONDecoder().decode(DemoManifest.self, from: manifestData)
        let filter = try manifest.filter.logFilter()
        var configuration = StoreConfiguration()
        configuration.readOnly = true
        let logStore = try LogStore(path: store, configuration: configuration)
        var expected: [String: String] = [:]
        try logStore.forEachRecord(matching: filter) { expected[$0.timestamp.utcDay + ".jsonl", default: ""] += $0.jsonLine + "\n" }
        let files = try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".jsonl") }.sorted()
        var records = 0
        guard files == expected.keys.sorted() else {
            FileHandle.standardError.write(Data("verify: files \(files) but the store selects days \(expected.keys.sorted())\n".utf8))
            throw ExitCode.failure
        }
        for file in files {
            let text = String(decoding: try Data(contentsOf: URL(fileURLWithPath: dir + "/" + file)), as: UTF8.self)
            guard text == expected[file] else {
                FileHandle.standardError.write(Data("verify: \(file) differs from what the store selects\n".utf8))
                throw ExitCode.failure
            }
            records += text.split(separator: "\n").count
        }
        print("verified: \(files.count) files, \(records) records, exactly what the filter selects on the device")
    }

    /// Only the part of the manifest the check needs.
    struct DemoManifest: Decodable {
        var filter: ExportManifest.FilterDescription
    }
}

struct LocalDemo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "local",
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
