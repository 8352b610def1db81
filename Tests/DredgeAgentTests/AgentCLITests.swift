import DredgeDomain
import DredgeStore
import DredgeTestSupport
import Foundation
import Testing

/// `dredge-agent` as a user runs it: a real process, stdin, stdout, stderr and exit status.
@Suite struct AgentCLITests {
    struct Result {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    func run(_ arguments: [String], stdin: String = "", store: String) throws -> Result {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: builtProduct("dredge-agent"))
        process.arguments = arguments + ["--store", store]
        let input = Pipe(), output = Pipe(), errors = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        input.fileHandleForWriting.write(Data(stdin.utf8))
        try input.fileHandleForWriting.close()
        let out = output.fileHandleForReading.readDataToEndOfFile()
        let err = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(status: process.terminationStatus, stdout: String(decoding: out, as: UTF8.self), stderr: String(decoding: err, as: UTF8.self))
    }

    @Test func ingestThenQueryReturnsTheLinesInOrder() throws {
        let dir = TempDir()
        let store = dir.file("logs.sqlite")
        let ingest = try run(["ingest", "--uid", "u-7", "--type", "system", "--level", "warning"], stdin: "disk 91% full\n\nfan speed high\n", store: store)
        #expect(ingest.status == 0, "\(ingest.stderr)")
        #expect(ingest.stderr.contains("ingested 2 records"))
        let query = try run(["query", "--format", "jsonl", "--uid", "u-7"], store: store)
        #expect(query.status == 0)
        let lines = query.stdout.split(separator: "\n").map { try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any] }
        #expect(lines.map { $0["message"] as? String } == ["disk 91% full", "fan speed high"])
        #expect(lines.allSatisfy { $0["level"] as? String == "warning" && $0["type"] as? String == "system" && $0["uid"] as? String == "u-7" })
        #expect(try run(["query", "--uid", "someone-else"], store: store).stdout.isEmpty)
        #expect(try run(["query", "--grep", "FAN", "--level", "warning+"], store: store).stdout.contains("fan speed high"))
    }

    @Test func plainLinesKeepTheLevelTheyState() throws {
        let dir = TempDir()
        let store = dir.file("logs.sqlite")
        let text = "2026-11-22 09:00:00 ERROR payment failed\n<12>disk almost full\nlevel=debug tick\njust a line\n"
        #expect(try run(["ingest", "--level", "notice"], stdin: text, store: store).status == 0)
        let query = try run(["query", "--format", "jsonl"], store: store)
        let levels = query.stdout.split(separator: "\n").map { (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["level"] as? String }
        #expect(levels == ["error", "warning", "debug", "notice"], "\(query.stdout)")
        let plain = dir.file("plain.sqlite")
        #expect(try run(["ingest", "--level", "info", "--no-detect-level"], stdin: "ERROR but not detected\n", store: plain).status == 0)
        #expect(try run(["query", "--format", "jsonl"], store: plain).stdout.contains(#""level":"info""#))
    }

    /// A mistyped store path used to start an empty store, and every pull then "succeeded" with
    /// 0 records.
    @Test func runRefusesAStorePathThatDoesNotExistUnlessAskedToCreateIt() throws {
        let dir = TempDir()
        let missing = dir.file("mistyped/logs.sqlite")
        let refused = try run(["run", "--state", dir.file("state")], store: missing)
        #expect(refused.status != 0)
        #expect(refused.stderr.contains(missing) && refused.stderr.contains("--create"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: missing))
        // With --create the store check passes (this agent has no enrollment, which is the next error).
        let created = try run(["run", "--create", "--state", dir.file("state")], store: missing)
        #expect(created.status != 0 && !created.stderr.contains("--create"), "\(created.stderr)")
    }

    @Test func badJSONLinesAreReportedSkippedAndTheRestKept() throws {
        let dir = TempDir()
        let store = dir.file("logs.sqlite")
        let lines = [
            #"{"message":"ok 1","ts":"2026-11-21T08:00:00Z","level":"error","type":"network","uid":"u","metadata":{"status":502}}"#,
            #"{"message": 12}"#,
            "not json at all",
            #"{"message":"bad level","level":"loud"}"#,
            #"{"message":"bad ts","ts":"yesterday"}"#,
            #"{"message":"ok 2","ts":1795000000000000}"#,
        ]
        let ingest = try run(["ingest", "--json"], stdin: lines.joined(separator: "\n") + "\n", store: store)
        #expect(ingest.status == 65)
        for n in 2...5 { #expect(ingest.stderr.contains("line \(n):"), "\(ingest.stderr)") }
        #expect(ingest.stderr.contains("ingested 2 records, rejected 4"))
        let query = try run(["query", "--format", "jsonl", "--since", "2026-01-01"], store: store)
        #expect(query.stdout.contains(#""message":"ok 1""#) && query.stdout.contains(#""metadata":{"status":502}"#))
        #expect(query.stdout.contains(#""message":"ok 2""#))
    }

    @Test func badFlagsExitWithUsageErrors() throws {
        let dir = TempDir()
        let store = dir.file("logs.sqlite")
        _ = try run(["log", "hello"], store: store)
        for arguments in [
            ["query", "--level", "loud"], ["query", "--since", "the day before"], ["query", "--type", "Not A Type"],
            ["query", "--since", "2026-11-21", "--until", "2026-11-20"], ["log", "--type", "BAD", "x"],
            ["log", "--level", "x", "y"], ["log", "--meta", "novalue", "m"], ["query", "--format", "xml"], ["frobnicate"],
            // Values that once trapped (overflowing day arithmetic) or matched another user.
            ["query", "--since", "99999999d"], ["query", "--until", "9223372036854775807s"], ["query", "--since", "0000-01-01"],
            ["query", "--uid", "u1\nx"], ["query", "--uid", "u1\u{7}x"],
        ] {
            let result = try run(arguments, store: store)
            #expect(result.status == 64, "\(arguments): \(result.stderr)")
            #expect(result.stderr.contains("Error:") || result.stderr.contains("error:"), "\(arguments)")
        }
        // Nothing above wrote anything: only the one record.
        #expect(try run(["query"], store: store).stdout.split(separator: "\n").count == 1)
    }

    /// #50 defect 1: an app keeps 7 days; the agent opening its store (here `log`, which runs a
    /// retention pass at open as `run` does) applied its own 3-day default and deleted the app's
    /// older records. Now the store's own policy applies, and `stats` shows it.
    @Test func theAgentAppliesTheStoresOwnRetentionNotItsDefault() throws {
        let dir = TempDir()
        let store = dir.file("app.sqlite")
        var app = StoreConfiguration()
        app.retention.maxAge = .seconds(7 * 86_400)
        let appStore = try LogStore(path: store, configuration: app)
        let context = try appStore.register(LogContext(host: "h1", os: "Linux", app: "oven-control", appVersion: "2", process: "oven[1]"))
        let now = Timestamp.now.microseconds
        for age in [1, 3, 5] {
            appStore.enqueue(LogEntry(timestamp: Timestamp(microseconds: now - Int64(age) * 86_400_000_000), level: .info, type: .app, uid: "u-5", message: "\(age) days ago", context: context))
        }
        try appStore.close()

        let log = try run(["log", "--uid", "u-5", "the agent was here"], store: store)
        #expect(log.status == 0, "\(log.stderr)")
        let stats = try run(["stats"], store: store)
        #expect(stats.stdout.contains("records:  4") && stats.stdout.contains("losses:   none"), "\(stats.stdout)")
        #expect(stats.stdout.contains("retention: 7 days, 200000000 bytes (set "), "\(stats.stdout)")
        let query = try run(["query", "--uid", "u-5", "--format", "jsonl"], store: store)
        #expect(query.stdout.contains("5 days ago"))
    }

    /// #50: `dredge-demo generate --app` names the app its records say wrote them.
    @Test func generatedLogsNameTheAppAsked() throws {
        let dir = TempDir()
        let (status, output) = try ManagedProcess.run(
            "dredge-demo", ["generate", "--store", dir.file("logs.sqlite"), "--uids", "u-1", "--records", "20", "--app", "checkout", "--app-version", "9.1"])
        #expect(status == 0, "\(output)")
        var config = StoreConfiguration()
        config.readOnly = true
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
        let records = try store.records(matching: .all)
        let contexts = try store.contexts(Set(records.map(\.context)))
        #expect(records.count == 20 && contexts.values.map { "\($0.app) \($0.appVersion) \($0.process)" } == ["checkout 9.1 checkout[812]"])
    }

    /// #50: a mistyped command is named back with the one meant, exit status 64; a word close
    /// to none (or to two alike) gets ArgumentParser's own error.
    @Test func aMistypedCommandIsToldTheOneMeant() throws {
        func run(_ executable: String, _ arguments: [String]) throws -> (Int32, String) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: builtProduct(executable))
            process.arguments = arguments
            let errors = Pipe()
            process.standardError = errors
            process.standardOutput = FileHandle.nullDevice
            try process.run()
            let text = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            return (process.terminationStatus, text)
        }
        for (executable, arguments, said) in [
            ("dredge-agent", ["qeury", "--uid", "u-1"], "dredge-agent: 'qeury' is not a command; did you mean 'query'?"),
            ("dredge", ["pul"], "dredge: 'pul' is not a command; did you mean 'pull'?"),
            ("dredge", ["tokens", "crate", "--name", "x"], "dredge tokens: 'crate' is not a command; did you mean 'create'?"),
            ("dredge-server", ["rn"], "dredge-server: 'rn' is not a command; did you mean 'run'?"),
        ] {
            let (status, stderr) = try run(executable, arguments)
            #expect(status == 64 && stderr.hasPrefix(said), "\(executable) \(arguments): \(status) \(stderr)")
        }
        let (status, stderr) = try run("dredge", ["xyz"])
        #expect(status != 0 && !stderr.contains("did you mean") && stderr.contains("xyz"))
    }

    @Test func aStoreThatIsNotSQLiteIsReportedAndLeftAlone() throws {
        let dir = TempDir()
        let store = dir.file("logs.sqlite")
        let garbage = Data("this is a text file, not a database\n".utf8)
        try garbage.write(to: URL(fileURLWithPath: store))
        for arguments in [["query"], ["log", "hello"], ["stats"]] {
            let result = try run(arguments, store: store)
            #expect(result.status == 1, "\(arguments)")
            #expect(result.stderr.contains("notADatabase"), "\(arguments): \(result.stderr)")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: store)) == garbage)
        let missing = try run(["query"], store: dir.file("nothing-here.sqlite"))
        #expect(missing.status == 64 && missing.stderr.contains("no store at"))
    }
}
