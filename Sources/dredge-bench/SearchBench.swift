import ArgumentParser
import Crypto
import DredgeAdminAPI
import DredgeDomain
import DredgeExport
import DredgePayload
import DredgeReception
import DredgeSamples
import DredgeServer
import DredgeStore
import Foundation
import GRDBSQLite
import Logging

/// The engineer's side: `index.overhead` (unpacking a pull with indexing ÷ without) and
/// `search.latency` (`dredge logs`-shaped searches over a large index ÷ the same SQL run
/// through SQLite's C API on the same file).
struct SearchBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "search", abstract: "Search figures: index.overhead, index.rate, search.latency (p50 and p99 per query shape), pull.to_readable.")

    @Option(help: "MB of JSON-lines records in the pull unpacked for index.overhead.")
    var megabytes = 200

    @Option(help: "Records in the index searched for search.latency.")
    var records = 10_000_000

    @Option(help: "Runs of each query shape (p50 and p99 are reported).")
    var runs = 100

    @Option(help: "Scratch directory (a temporary one by default).")
    var scratch: String?

    @Flag(help: "Only index.overhead.")
    var overheadOnly = false

    @Flag(help: "Only search.latency.")
    var latencyOnly = false

    @Flag(help: "Only pull.to_readable (real dredge-server, dredge-agent and dredge processes, built beside this one).")
    var readableOnly = false

    @Flag(help: "With --scratch: search the index a previous run left there, if it holds --records records.")
    var reuse = false

    static let uids = (1...40).map { String(format: "u-%04d", $0) }
    static let pullID = String(repeating: "1", count: 32)
    static let agentID = String(repeating: "a", count: 32)

    func run() async throws {
        let dir = scratch ?? FileManager.default.temporaryDirectory.appendingPathComponent("dredge-bench-search-\(getpid())").path
        if !(reuse && scratch != nil) { try? FileManager.default.removeItem(atPath: dir) }
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { if scratch == nil { try? FileManager.default.removeItem(atPath: dir) } }
        let all = !overheadOnly && !latencyOnly && !readableOnly
        if all || overheadOnly {
            for figure in try await overhead(dir: dir) { print(figure.line) }
        }
        if all || readableOnly {
            print(try await toReadable(dir: dir).line)
        }
        if all || latencyOnly {
            for figure in try await latency(dir: dir) { print(figure.line) }
        }
    }

    /// A store of `count` sample records over the last three days, 40 users.
    func buildStore(_ path: String, count: Int) throws {
        let (store, context) = try openBenchStore(path)
        let now = Timestamp.now
        for e in SampleLogs(count: count, uids: Self.uids, from: now.subtracting(.seconds(3 * 86_400)), to: now, context: context) { store.enqueue(e) }
        try store.close()
    }

    // MARK: index.overhead

    /// The pull's zip unpacked into a data directory (the server's last step of an upload),
    /// then the same plus indexing it; three rounds, medians.
    func overhead(dir: String) async throws -> [Figure] {
        let storePath = dir + "/overhead.sqlite"
        try buildStore(storePath, count: megabytes * 1_000_000 / 300)
        let zip = dir + "/pull.zip"
        var configuration = StoreConfiguration()
        configuration.readOnly = true
        let store = try LogStore(path: storePath, configuration: configuration)
        let manifest = try Exporter.export(from: store, ExportRequest(uploadID: Self.pullID, kind: .pull, agentID: Self.agentID, commandID: Self.pullID, filter: .all), to: zip)
        try store.close()
        let bytes = manifest.days.reduce(0) { $0 + $1.bytes }
        note("index.overhead: a pull of \(manifest.recordCount) records, \(bytes / 1_000_000) MB of JSON lines")
        var without: [Double] = [], with: [Double] = [], indexing: [Double] = []
        for round in 0..<3 {
            let data = dir + "/data-\(round)"
            try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
            let paths = DataDirectory(data)
            let destination = try paths.pullFiles(Self.pullID, agent: Self.agentID)
            try FileManager.default.createDirectory(atPath: try paths.pull(Self.pullID), withIntermediateDirectories: true)
            let unpack = try seconds { _ = try PayloadExtractor.extract(zip: zip, into: destination) }
            let index = try SQLiteRecordIndex(directory: data)
            let indexer = Indexer(index: index, registry: nil, paths: paths, logger: Logger(label: "bench"))
            let start = monotonicNanos()
            let count = try await indexer.index(IndexedSource(kind: .pull, id: Self.pullID, agentID: Self.agentID))
            let indexed = Double(monotonicNanos() - start) / 1e9
            guard count.records == manifest.recordCount, count.unreadable == 0 else { throw ValidationError("indexed \(count), expected \(manifest.recordCount) records") }
            without.append(unpack)
            with.append(unpack + indexed)
            indexing.append(indexed)
            note(String(format: "round %d: unpack %.2f s, index %.2f s", round, unpack, indexed))
            try FileManager.default.removeItem(atPath: data)
        }
        let mb = Double(bytes) / 1e6
        return [
            Figure(name: "index.overhead", value: mb / median(with), unit: "MB/s", limit: mb / median(without), higherIsBetter: true, extra: "(unpack with indexing ÷ unpack alone)"),
            Figure(
                name: "index.rate", value: Double(manifest.recordCount) / median(indexing), unit: "records/s", limit: Double(manifest.recordCount) / median(indexing),
                higherIsBetter: true, extra: String(format: "(%.1f MB/s of JSON lines; informative)", mb / median(indexing))),
        ]
    }

    // MARK: pull.to_readable

    /// `dredge pull --wait` for one user's day, then `dredge logs --pull` until it prints a
    /// record: the time from the pull to the first record read, against the time to the files
    /// on disk (what `--wait` waits for), on loopback with real processes. Five rounds, medians.
    func toReadable(dir: String) async throws -> Figure {
        let data = dir + "/readable-server"
        let created = try ServerDeployment.initialize(.init(dataDirectory: data))
        let server = try ServerProcess(data: data, log: dir + "/readable-server.log", heartbeatSeconds: 1)
        defer { server.stop() }
        let storePath = dir + "/readable-device.sqlite"
        try buildStore(storePath, count: 200_000)
        func run(_ tool: String, _ arguments: [String]) throws -> (Int32, String) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: sibling(tool))
            process.arguments = arguments
            let pipe = Pipe()
            process.standardOutput = pipe
            process.standardError = FileHandle.nullDevice
            try process.run()
            let output = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: output, as: UTF8.self))
        }
        let state = dir + "/readable-agent"
        let (enrolled, enrollOutput) = try run("dredge-agent", [
            "enroll", "--state", state, "--server", "127.0.0.1:\(server.agentPort)", "--ca", created.caPath, "--token", created.enrollmentToken,
        ])
        guard enrolled == 0 else { throw ValidationError("dredge-agent enroll failed: \(enrollOutput)") }
        let agent = Process()
        agent.executableURL = URL(fileURLWithPath: sibling("dredge-agent"))
        agent.arguments = ["run", "--state", state, "--store", storePath]
        agent.standardOutput = FileHandle.nullDevice
        agent.standardError = FileHandle.nullDevice
        try agent.run()
        defer {
            agent.terminate()
            agent.waitUntilExit()
        }
        let admin = try server.admin(token: created.adminToken)
        for _ in 0..<600 {
            if try await admin.agents().contains(where: { $0.connected && $0.activeUIDs.contains("u-0007") }) { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        let credentials = server.credentials(token: created.adminToken)
        let day = Timestamp(microseconds: (Timestamp.now.epochDay - 1) * 86_400_000_000)
        var toFiles: [Double] = [], toReadable: [Double] = []
        for round in 0..<5 {
            let uid = Self.uids[round + 6]
            let start = monotonicNanos()
            let (status, output) = try run("dredge", ["pull", "--uid", uid, "--since", day.rfc3339, "--until", day.adding(.seconds(86_400)).rfc3339, "--wait", "--json"] + credentials)
            let filesAt = monotonicNanos()
            guard status == 0, let json = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any], let id = json["id"] as? String else {
                throw ValidationError("dredge pull failed (\(status)): \(output.prefix(500))")
            }
            var first = ""
            while first.isEmpty {
                first = try run("dredge", ["logs", "--pull", id, "--limit", "1", "--format", "jsonl"] + credentials).1
                guard monotonicNanos() - start < 60_000_000_000 else { throw ValidationError("the pull's records were not readable within a minute") }
            }
            let readableAt = monotonicNanos()
            toFiles.append(Double(filesAt - start) / 1e6)
            toReadable.append(Double(readableAt - start) / 1e6)
            note(String(format: "round %d: files in %.0f ms, first record read in %.0f ms", round, toFiles.last!, toReadable.last!))
        }
        return Figure(
            name: "pull.to_readable", value: median(toReadable), unit: "ms", limit: median(toFiles), higherIsBetter: false,
            extra: "(from dredge pull to the first record dredge logs prints ÷ to the files on disk; goal < 500 ms)")
    }

    // MARK: search.latency

    func latency(dir: String) async throws -> [Figure] {
        let data = dir + "/latency"
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        let index = try SQLiteRecordIndex(directory: data)
        let perSource = 1_000_000
        var built = 0, sourceNumber = 0
        if reuse, try await index.indexedSources().count * perSource >= records {
            built = records
            note("search.latency: searching the index left in \(data)")
        }
        let buildStart = monotonicNanos()
        while built < records {
            let count = min(perSource, records - built)
            let storePath = dir + "/latency-store.sqlite"
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: storePath + suffix) }
            try buildStore(storePath, count: count)
            var configuration = StoreConfiguration()
            configuration.readOnly = true
            let store = try LogStore(path: storePath, configuration: configuration)
            let source = IndexedSource(kind: .pull, id: String(format: "%032x", sourceNumber), agentID: Self.agentID)
            try await index.begin(source, contexts: ["1": .current(app: "bench")], landedAt: Date())
            var block: [UInt8] = []
            block.reserveCapacity(Indexer.blockBytes + 4096)
            var blocks: [[UInt8]] = []
            try store.forEachRecord(matching: .all) { record in
                block.append(contentsOf: record.jsonLine.utf8)
                block.append(0x0A)
                if block.count >= Indexer.blockBytes {
                    blocks.append(block)
                    block.removeAll(keepingCapacity: true)
                }
            }
            if !block.isEmpty { blocks.append(block) }
            try store.close()
            for b in blocks { _ = try await index.add(source, lines: b) }
            try await index.finish(source)
            built += count
            sourceNumber += 1
            note("search.latency: \(built) records indexed")
        }
        note(String(format: "search.latency: index of %d records built in %.0f s, %.1f GB", records, Double(monotonicNanos() - buildStart) / 1e9, Double(fileSize(index.path)) / 1e9))

        // The days the records span, for day-bounded queries.
        let now = Timestamp.now
        let dayStarts = (0..<3).map { Timestamp(microseconds: (now.epochDay - Int64($0)) * 86_400_000_000) }
        var rng = SystemRandomNumberGenerator()
        let shapes: [(String, () -> RecordSearch)] = [
            ("uid_day_level", {
                let day = dayStarts.randomElement(using: &rng)!
                return RecordSearch(uid: Self.uids.randomElement(using: &rng)!, since: day, until: day.adding(.seconds(86_400)), levels: ["warning", "error", "critical"])
            }),
            ("uid_text", { RecordSearch(uid: Self.uids.randomElement(using: &rng)!, text: ["payment declined", "decoder stalled", "timeout", "out of memory"].randomElement(using: &rng)!) }),
            ("metadata", {
                RecordSearch(metadata: [[MetadataMatch(key: "http.status", value: "503"), MetadataMatch(key: "event", value: "checkout.failed"), MetadataMatch(key: "cdn", value: "edge-ams-2")].randomElement(using: &rng)!])
            }),
        ]
        let raw = try RawSQLite(path: index.path)
        var figures: [Figure] = []
        for (name, make) in shapes {
            var ours: [Double] = [], limit: [Double] = []
            var found = 0
            for run in 0..<(runs + 5) {
                let search = make()
                let query = try SQLRecordQuery(search)
                // Alternate which goes first, so neither always finds the other's pages cached.
                var a = 0.0, b = 0.0
                func measureOurs() async throws {
                    let start = monotonicNanos()
                    found += try await index.search(search).records.count
                    a = Double(monotonicNanos() - start) / 1e6
                }
                func measureRaw() throws {
                    let start = monotonicNanos()
                    _ = try raw.rows(query)
                    b = Double(monotonicNanos() - start) / 1e6
                }
                if run % 2 == 0 {
                    try await measureOurs()
                    try measureRaw()
                } else {
                    try measureRaw()
                    try await measureOurs()
                }
                if run >= 5 {  // the first runs warm the cache
                    ours.append(a)
                    limit.append(b)
                }
            }
            func percentile(_ values: [Double], _ p: Double) -> Double { values.sorted()[min(values.count - 1, Int(Double(values.count) * p))] }
            note("search.latency.\(name): \(found / (runs + 5)) records per page on average")
            figures.append(Figure(name: "search.latency.\(name).p50", value: percentile(ours, 0.5), unit: "ms", limit: percentile(limit, 0.5), higherIsBetter: false))
            figures.append(Figure(name: "search.latency.\(name).p99", value: percentile(ours, 0.99), unit: "ms", limit: percentile(limit, 0.99), higherIsBetter: false, extra: "(goal < 100 ms)"))
        }
        // Writing a page's JSON, as the search route answers it: by hand with the metadata
        // spliced in as the index holds it, against Foundation's encoder on the same page.
        let page = try await index.search(RecordSearch(metadata: [MetadataMatch(key: "http.status", value: "503")]))
        var written: [Double] = [], encoded: [Double] = []
        var bytes = 0
        for _ in 0..<25 {
            var start = monotonicNanos()
            bytes = try page.jsonBytes().count
            written.append(Double(monotonicNanos() - start) / 1e6)
            start = monotonicNanos()
            let generic = try JSONEncoder.adminAPI.encode(page)
            encoded.append(Double(monotonicNanos() - start) / 1e6)
            guard try JSONDecoder.adminAPI.decode(RecordPage.self, from: Data(generic)) == JSONDecoder.adminAPI.decode(RecordPage.self, from: Data(page.jsonBytes())) else {
                throw ValidationError("the page's hand-written JSON does not read back as the encoder's")
            }
        }
        note("search.page_json: a page of \(page.records.count) records, \(bytes) bytes")
        figures.append(
            Figure(
                name: "search.page_json", value: written.sorted()[written.count / 2], unit: "ms", limit: encoded.sorted()[encoded.count / 2], higherIsBetter: false,
                extra: "(median; limit: JSONEncoder on the same page)"))
        return figures
    }
}

extension RawSQLite {
    /// Runs a search's statements through the C API (the scan-first one, then the main one
    /// when that did not fill the page, as the index does) and reads every column of every row:
    /// the same work as the index's search, without GRDB or the records' decoding.
    func rows(_ query: SQLRecordQuery) throws -> Int {
        if let scan = query.scanFirst {
            let count = try rows(sql: scan.sql, bindings: scan.bindings)
            if count > query.limit { return count }
        }
        return try rows(sql: query.sql, bindings: query.bindings)
    }

    func rows(sql: String, bindings: [SQLRecordQuery.Binding]) throws -> Int {
        let statement = try prepare(sql)
        defer { sqlite3_finalize(statement) }
        for (i, binding) in bindings.enumerated() {
            switch binding {
            case .integer(let v): sqlite3_bind_int64(statement, Int32(i + 1), v)
            case .text(let t): sqlite3_bind_text(statement, Int32(i + 1), t, -1, unsafeBitCast(-1, to: sqlite3_destructor_type.self))
            }
        }
        var count = 0
        var bytes = 0
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else { throw RawError(message: String(cString: sqlite3_errmsg(db))) }
            for column in 0..<sqlite3_column_count(statement) {
                if sqlite3_column_type(statement, column) == SQLITE_INTEGER {
                    bytes &+= Int(sqlite3_column_int64(statement, column))
                } else if let text = sqlite3_column_text(statement, column) {
                    bytes &+= Int(text.pointee)
                }
            }
            count += 1
        }
        return count
    }
}
