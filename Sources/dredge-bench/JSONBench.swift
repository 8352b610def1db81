import ArgumentParser
import DredgeAdminAPI
import DredgeDomain
import DredgePayload
import DredgeReception
import DredgeSamples
import DredgeServer
import DredgeStore
import Foundation

/// The JSON the server reads, each reader against Foundation's `JSONSerialization` on the same
/// bytes: `json.lines` (the indexer's record lines), `json.metadata` (the search page's check of
/// a record's metadata), `json.manifest` (a manifest's schema check, which also decodes it).
/// Medians of `--rounds`; `--only NAME` runs one reader once per round, for
/// `valgrind --tool=callgrind` (instruction counts repeat where times do not).
struct JSONBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "json", abstract: "JSON readers: json.lines, json.metadata, json.manifest (each ÷ JSONSerialization on the same bytes).")

    @Option(help: "Sample records whose lines are read.")
    var records = 100_000

    @Option(help: "Rounds (medians are reported).")
    var rounds = 5

    @Option(help: "Run only this reader (lines, metadata or manifest), without the limit: for callgrind.")
    var only: String?

    func run() async throws {
        let (lines, metadata) = try Self.sample(records)
        let block = Array(lines.joined(separator: "\n").utf8) + [0x0A]
        let manifest = try Self.manifest(days: 365)
        note("json: \(lines.count) lines, \(block.count) bytes; \(metadata.count) metadata objects; a manifest of \(manifest.count) bytes")
        switch only {
        case "lines": print("records read: \(readLines(block))")
        case "metadata": print("spliceable: \(checkMetadata(metadata))")
        case "manifest": print("problems: \(checkManifest(manifest))")
        case nil:
            let metadataBytes = Double(metadata.reduce(0) { $0 + $1.utf8.count })
            let figures = [
                try figure("json.lines", bytes: Double(block.count), ours: { _ = readLines(block) }, limit: { try Self.serialization(lines) }),
                try figure("json.metadata", bytes: metadataBytes, ours: { _ = checkMetadata(metadata) }, limit: { try Self.serialization(metadata) }),
                try figure(
                    "json.manifest", bytes: Double(manifest.count) * 20, ours: { for _ in 0..<20 { _ = ManifestSchema.problems(manifest) } },
                    limit: { for _ in 0..<20 { _ = try JSONSerialization.jsonObject(with: Data(manifest)) } }),
            ]
            for figure in figures { print(figure.line) }
        default: throw ValidationError("--only is lines, metadata or manifest")
        }
    }

    func figure(_ name: String, bytes: Double, ours: () throws -> Void, limit: () throws -> Void) throws -> Figure {
        var ourRates: [Double] = [], limitRates: [Double] = []
        for _ in 0..<rounds {
            ourRates.append(bytes / 1e6 / (try seconds(ours)))
            limitRates.append(bytes / 1e6 / (try seconds(limit)))
        }
        let spread = "\(Figure.format(ourRates.min()!))–\(Figure.format(ourRates.max()!))"
        return Figure(name: name, value: median(ourRates), unit: "MB/s", limit: median(limitRates), higherIsBetter: true, extra: "(median of \(rounds), range \(spread); limit: JSONSerialization)")
    }

    /// How many lines read as records. (Not inlined: callgrind counts it with
    /// `--toggle-collect='*JSONBench*readLines*'`, and the others the same way.)
    @inline(never) func readLines(_ block: [UInt8]) -> Int { IndexedLines.count(in: block) }

    @inline(never) func checkMetadata(_ texts: [String]) -> Int {
        var spliceable = 0
        for text in texts where RecordMetadata(indexedText: text).isSpliced { spliceable += 1 }
        return spliceable
    }

    @inline(never) func checkManifest(_ manifest: [UInt8]) -> Int { ManifestSchema.problems(manifest).count }

    static func serialization(_ texts: [String]) throws {
        for text in texts { _ = try JSONSerialization.jsonObject(with: Data(text.utf8)) }
    }

    /// Sample records' lines as a pull's day files hold them, and their metadata objects.
    static func sample(_ count: Int) throws -> (lines: [String], metadata: [String]) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("dredge-bench-json-\(getpid())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (store, context) = try openBenchStore(dir + "/store.sqlite")
        let now = Timestamp.now
        for e in SampleLogs(count: count, uids: (1...40).map { String(format: "u-%04d", $0) }, from: now.subtracting(.seconds(86_400)), to: now, context: context) {
            store.enqueue(e)
        }
        var lines: [String] = []
        try store.flush()
        try store.forEachRecord(matching: .all) { lines.append($0.jsonLine) }
        try store.close()
        let metadata = try lines.compactMap { line -> String? in
            guard let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], let m = object["metadata"] as? [String: Any], !m.isEmpty else { return nil }
            return String(decoding: try JSONSerialization.data(withJSONObject: m, options: [.sortedKeys, .withoutEscapingSlashes]), as: UTF8.self)
        }
        return (lines, metadata)
    }

    /// A pull's manifest with a file per day of a year.
    static func manifest(days: Int) throws -> [UInt8] {
        let start = Timestamp.now.subtracting(.seconds(Int64(days) * 86_400))
        let dayList = (0..<days).map { i -> ExportManifest.Day in
            let first = start.adding(.seconds(Int64(i) * 86_400))
            return ExportManifest.Day(file: first.utcDay + ".jsonl", records: 1000, bytes: 300_000, first: first.rfc3339, last: first.adding(.seconds(3600)).rfc3339)
        }
        return try ExportManifest(
            format: ExportManifest.formatName, uploadID: benchUploadID, kind: "pull", commandID: benchUploadID, agentID: benchAgentID, createdAt: Timestamp.now.rfc3339,
            filter: ExportManifest.FilterDescription(LogFilter(since: start, uid: "u-0001")), recordCount: days * 1000, empty: false, days: dayList, contexts: [:],
            losses: [], feedback: nil
        ).encoded()
    }
}
