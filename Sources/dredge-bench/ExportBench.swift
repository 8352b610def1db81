import ArgumentParser
import CDredgeZlib
import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeReception
import DredgeSamples
import DredgeStore
import DredgeWire
import Foundation

struct ExportBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Export figures: export.throughput, export.peak_rss, envelope.seal.")

    @Option(help: "MB of JSON-lines records the export holds.")
    var megabytes = 200

    @Option(help: "Rounds of the throughput measurement (the median is reported).")
    var rounds = 3

    @Option(help: "zlib level for the export and its limit.")
    var level: Int32 = 6

    @Option(help: "Scratch directory (a temporary one by default).")
    var scratch: String?

    func run() async throws {
        let dir = scratch ?? FileManager.default.temporaryDirectory.appendingPathComponent("dredge-bench-export-\(getpid())").path
        try? FileManager.default.removeItem(atPath: dir)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { if scratch == nil { try? FileManager.default.removeItem(atPath: dir) } }

        let storePath = try buildStore(dir: dir)
        print(try throughput(storePath: storePath, dir: dir).line)
        print(try peakRSS(storePath: storePath, dir: dir).line)
        print(try seal().line)
    }

    /// A store whose full export is `megabytes` MB of JSON lines.
    func buildStore(dir: String) throws -> String {
        let path = dir + "/export.sqlite"
        let (store, context) = try openBenchStore(path)
        let now = Timestamp.now
        // About 300 bytes of JSON per sample record.
        let count = megabytes * 1_000_000 / 300
        for e in SampleLogs(count: count, uids: (1...40).map { String(format: "u-%04d", $0) }, from: now.subtracting(.seconds(3 * 86_400)), to: now, context: context) {
            store.enqueue(e)
        }
        try store.close()
        return path
    }

    /// Store → zip → sealed chunks; returns (seconds, JSONL bytes).
    static func exportAndSeal(storePath: String, zipPath: String, level: Int32) throws -> (Double, Int) {
        var configuration = StoreConfiguration()
        configuration.readOnly = true
        let store = try LogStore(path: storePath, configuration: configuration)
        var options = ExportOptions()
        options.compressionLevel = level
        var manifest: ExportManifest?
        let key = SymmetricKey.uploadKey()
        let elapsed = try seconds {
            // Ids of the form the manifest schema requires (32 lowercase hex characters).
            let request = ExportRequest(uploadID: benchUploadID, kind: .pull, agentID: benchAgentID, commandID: benchUploadID, filter: .all)
            manifest = try Exporter.export(from: store, request, to: zipPath, options: options)
            let upload = try SealedUpload(zipPath: zipPath, uploadID: benchUploadID, kind: .pull, agentID: benchAgentID, key: key, empty: false, createdAt: 0)
            var sealed = 0
            for i in 0..<upload.header.chunkCount { sealed += try upload.chunk(i).count }
            precondition(sealed > 0)
        }
        return (elapsed, manifest!.days.reduce(0) { $0 + $1.bytes })
    }

    func throughput(storePath: String, dir: String) throws -> Figure {
        var ours: [Double] = []
        var bytes = 0
        for _ in 0..<rounds {
            let (t, b) = try Self.exportAndSeal(storePath: storePath, zipPath: dir + "/export.zip", level: level)
            ours.append(Double(b) / t / 1e6)
            bytes = b
        }
        // The limit: the same bytes (the export's JSON lines) deflated at the same level on all
        // cores, one contiguous share per core, with nothing else to do.
        let payload = try PayloadExtractor.extract(zip: dir + "/export.zip", into: dir + "/files")
        var text: [UInt8] = []
        text.reserveCapacity(bytes)
        for file in payload.files { text.append(contentsOf: FileManager.default.contents(atPath: file)!) }
        try? FileManager.default.removeItem(atPath: dir + "/files")
        let cores = ProcessInfo.processInfo.activeProcessorCount
        var limit: [Double] = []
        for _ in 0..<rounds {
            let t = text.withUnsafeBufferPointer { buffer -> Double in
                let base = UInt(bitPattern: buffer.baseAddress)
                let share = (buffer.count + cores - 1) / cores
                let total = buffer.count
                return seconds {
                    DispatchQueue.concurrentPerform(iterations: cores) { i in
                        let start = i * share, n = max(0, min(share, total - start))
                        var out = [UInt8](repeating: 0, count: Int(compressBound(uLong(n))))
                        var outLength = uLong(out.count)
                        let rc = compress2(&out, &outLength, UnsafePointer<UInt8>(bitPattern: base + UInt(start)), uLong(n), level)
                        precondition(rc == Z_OK)
                    }
                }
            }
            limit.append(Double(text.count) / t / 1e6)
        }
        note("export: \(bytes / 1_000_000) MB of JSON lines, \(payload.manifest.recordCount) records, zip \(fileSize(dir + "/export.zip") / 1_000_000) MB; limit: zlib level \(level) on \(cores) cores")
        return Figure(name: "export.throughput", value: median(ours), unit: "MB/s", limit: median(limit), higherIsBetter: true, extra: "level=\(level) cores=\(cores)")
    }

    /// Peak RSS of a process that does only the export (and sealing), against the budget.
    func peakRSS(storePath: String, dir: String) throws -> Figure {
        func child(_ arguments: [String]) throws -> Double {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/proc/self/exe")
            process.arguments = arguments
            let output = Pipe()
            process.standardOutput = output
            try process.run()
            let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            guard let mb = Double(text.trimmingCharacters(in: .whitespacesAndNewlines)) else { throw RawSQLite.RawError(message: "child said \(text)") }
            return mb
        }
        let peak = try child(["export-rss-child", "--store", storePath, "--zip", dir + "/rss.zip", "--level", String(level)])
        let idle = try child(["export-rss-child", "--store", storePath, "--zip", dir + "/rss.zip", "--level", String(level), "--open-only"])
        note("export.peak_rss: a process that only opens the store peaks at \(String(format: "%.1f", idle)) MB")
        return Figure(name: "export.peak_rss", value: peak, unit: "MB", limit: 64, higherIsBetter: false, extra: "export_mb=\(megabytes) open_only_mb=\(String(format: "%.1f", idle))")
    }

    /// Chunk sealing against one AES-GCM pass over the same bytes.
    func seal() throws -> Figure {
        let size = 64 << 20
        var data = [UInt8](repeating: 0, count: size)
        var rng = SplitMix64(seed: 3)
        for i in stride(from: 0, to: size, by: 8) { withUnsafeBytes(of: rng.next()) { data.replaceSubrange(i..<min(i + 8, size), with: $0.prefix(size - i)) } }
        let key = SymmetricKey.uploadKey()
        var header = WireUploadHeader()
        header.uploadID = benchUploadID
        header.kind = .pull
        header.noncePrefix = Data(secureRandomBytes(7))
        header.chunkSize = UInt32(WireLimits.defaultChunkBytes)
        header.plaintextSize = UInt64(size)
        header.chunkCount = UInt32((size + WireLimits.defaultChunkBytes - 1) / WireLimits.defaultChunkBytes)
        let cipher = try ChunkCipher(key: key, header: header)
        var ours: [Double] = [], limit: [Double] = []
        let whole = Data(data)
        for _ in 0..<5 {
            ours.append(Double(size) / (try seconds {
                for i in 0..<header.chunkCount {
                    let start = Int(i) * WireLimits.defaultChunkBytes
                    _ = try cipher.seal(data[start..<min(start + WireLimits.defaultChunkBytes, size)], index: i)
                }
            }) / 1e6)
            limit.append(Double(size) / (try seconds { _ = try AES.GCM.seal(whole, using: key) }) / 1e6)
        }
        return Figure(name: "envelope.seal", value: median(ours), unit: "MB/s", limit: median(limit), higherIsBetter: true, extra: "chunk_kib=\(WireLimits.defaultChunkBytes / 1024)")
    }
}

/// The export alone, in a process of its own, so its peak RSS is the export's.
struct ExportRSSChild: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "export-rss-child", shouldDisplay: false)

    @Option var store: String
    @Option var zip: String
    @Option var level: Int32 = 6
    @Flag var openOnly = false

    func run() async throws {
        if openOnly {
            var configuration = StoreConfiguration()
            configuration.readOnly = true
            _ = try LogStore(path: store, configuration: configuration).count(matching: LogFilter(uid: "nobody"))
        } else {
            _ = try ExportBench.exportAndSeal(storePath: store, zipPath: zip, level: level)
        }
        // VmHWM, the peak resident set of this process image. (getrusage's ru_maxrss survives
        // execve on Linux and would report the parent's peak.)
        let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") } ?? "VmHWM: 0 kB"
        let kilobytes = Double(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
        print(String(format: "%.1f", kilobytes / 1024))
    }
}

/// A store for building benchmark data: the queue blocks rather than drops, and retention keeps
/// everything, so the store holds exactly what was written.
func openBenchStore(_ path: String) throws -> (LogStore, ContextID) {
    var configuration = StoreConfiguration()
    configuration.overflowPolicy = .block
    configuration.retention = RetentionPolicy(maxAge: .seconds(365 * 86_400), maxBytes: 100_000_000_000)
    let store = try LogStore(path: path, configuration: configuration)
    return (store, try store.register(.current(app: "bench")))
}

/// The ids of the export benchmark's pull, of the form the wire and the manifest schema require.
let benchUploadID = String(repeating: "b", count: 32)
let benchAgentID = String(repeating: "a", count: 32)
