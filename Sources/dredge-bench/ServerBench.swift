import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeServer
import DredgeStore
import DredgeWire
import Foundation
import Synchronization

/// `dredge-bench server`: the real `dredge-server` process under three loads.
///
/// - `upload.throughput`: large uploads over loopback TLS, sent by an agent built from the
///   agent library, each against sealing the same chunks and writing each durably (what the
///   server must at least do) just before it, in the same run; medians over the rounds.
/// - `upload.cpu`: the CPU time the server process spends per MB of those uploads (all its
///   threads: TLS, framing, the connection's steps, verifying and writing chunks, status
///   writes, unpacking while they arrive, landing the files), against the CPU time of opening
///   the same chunks (AES-256-GCM) and writing each durably, in this process; medians. CPU
///   time does not count the waits for fsync or for the other core that make the rate move.
/// - `server.idle_connections`: a fleet of authenticated, heartbeating agents held by one
///   server, simulated in other processes (`fleet-child`), with the server's memory per
///   connection.
/// - `server.command_latency`: from a pull made through the admin API (what `dredge pull`
///   does) to the agent receiving the command, while the server holds the fleet.
struct ServerBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "server", abstract: "Upload throughput, idle connections, command latency.")

    @Option(help: "Agents in the simulated fleet (capped by the open-file limit).")
    var agents = 20_000

    @Option(help: "Processes simulating the fleet.")
    var fleetProcesses = 2

    @Option(help: "Approximate size of the upload, MB.")
    var uploadMb = 100

    @Option(help: "Uploads timed, each against the limit measured just before it; the figure is the median of each.")
    var uploadRounds = 3

    @Option(help: "The server's `threads.uploads` (threads verifying and writing chunks); the server's default when not given.")
    var uploadThreads: Int?

    @Option(help: ArgumentHelp("The server's `threads.bulkIdle` (its upload and unpack threads under SCHED_IDLE); the server's default when not given.", valueName: "true|false"))
    var bulkIdle: Bool?

    @Option(help: "Pulls timed for the command latency.")
    var samples = 1000

    @Option(help: "Where the fleet's keys are cached (made by scripts/bench-fleet-keys.py).")
    var keyCache = ".build/bench-fleet-keys"

    @Option(help: ArgumentHelp("Write each command-latency sample here: wall time, ms to the agent, ms to the admin API's answer, the pull's id, and when the request was sent (CLOCK_MONOTONIC, ns).", valueName: "path"))
    var latencyLog: String?

    @Flag(help: "Only the upload.")
    var uploadOnly = false

    @Option(help: ArgumentHelp("Keep the server's state in this PostgreSQL database (a schema of its own) instead of SQLite: the same figures on PostgreSQL.", valueName: "url"))
    var database: String?

    func validate() throws {
        guard samples > 0 else { throw ValidationError("--samples must be at least 1") }
        guard uploadRounds > 0 else { throw ValidationError("--upload-rounds must be at least 1") }
        if let uploadThreads, uploadThreads < 1 { throw ValidationError("--upload-threads must be at least 1") }
    }

    func run() async throws {
        let dir = NSTemporaryDirectory() + "dredge-bench-server-\(getpid())"
        try? FileManager.default.removeItem(atPath: dir)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let created = try await Self.initialize(dir + "/server", database: database, schema: "bench_server_\(getpid())")
        if database != nil { FileHandle.standardError.write(Data("on PostgreSQL: the figures below are the PostgreSQL back end's\n".utf8)) }
        try Self.allowOneAddressFleet(dir + "/server")
        var threads: [String: Any] = [:]
        if let uploadThreads { threads["uploads"] = uploadThreads }
        if let bulkIdle { threads["bulkIdle"] = bulkIdle }
        if !threads.isEmpty { try Self.setConfig("threads", threads, in: dir + "/server") }
        let server = try ServerProcess(data: dir + "/server", log: dir + "/server.log")
        defer { server.stop() }
        let admin = try server.admin(token: created.adminToken)

        for figure in try await upload(dir: dir, server: server, admin: admin, created: created) { print(figure.line) }
        if uploadOnly { return }
        for figure in try await fleet(dir: dir, server: server, admin: admin, created: created) { print(figure.line) }
    }

    // MARK: upload.throughput

    func upload(dir: String, server: ServerProcess, admin: AdminClient, created: ServerDeployment.Created) async throws -> [Figure] {
        let tls = try AgentLink.tlsContext(caPEM: String(contentsOfFile: created.caPath, encoding: .utf8))
        let key = try RSAPrivateKey.generate()
        let agentID = try await AgentEnrollment.register(host: "127.0.0.1", port: server.agentPort, tls: tls, token: created.enrollmentToken, key: key, hostInfo: .with { $0.hostname = "bench-uploader" })
        let storePath = try Self.buildStore(dir: dir, mb: uploadMb)
        let zip = dir + "/upload.zip"

        struct Round: Sendable {
            var rate: Double; var limit: Double; var withUnpack: Double; var bytes: UInt64; var chunks: UInt32; var steal: Double
            /// CPU seconds of the server's `dredge-unpack` and `dredge-uploads` threads over the upload.
            var unpackCPU: Double; var uploadsCPU: Double
            /// CPU seconds of the whole server over the upload, and of opening and writing its chunks here.
            var serverCPU: Double; var limitCPU: Double
        }
        let rounds = try await AgentLink.withConnection(host: "127.0.0.1", port: server.agentPort, tls: tls, agentID: agentID, key: key) { link -> [Round] in
            var rounds: [Round] = []
            for round in 1...uploadRounds {
                // Each round starts quiet: the server has indexed the last round's upload (at
                // its own priority, tens of seconds of work) and what was written is on disk.
                let deadline = ContinuousClock.now + .seconds(600)
                while try await admin.search(RecordSearch(limit: 1)).indexing > 0 {
                    guard ContinuousClock.now < deadline else { throw ValidationError("the server did not finish indexing round \(round - 1)'s upload in 10 minutes") }
                    try await Task.sleep(for: .seconds(1))
                }
                sync()
                _ = try await admin.createPull(PullRequest(uid: nil, agent: agentID, filter: .all))
                var command: WirePullCommand?
                while command == nil, let frame = try await link.next() {
                    if case .pullCommand(let c)? = frame.body { command = c }
                }
                guard let command else { throw ValidationError("no command arrived") }
                let uploadKey = try key.unwrapKey(Array(command.wrappedKey))
                try await link.send(.with { $0.commandAccepted = .with { $0.commandID = command.commandID } })
                // The export is not timed: this measures the upload.
                var configuration = StoreConfiguration()
                configuration.readOnly = true
                let store = try LogStore(path: storePath, configuration: configuration)
                let manifest = try Exporter.export(
                    from: store, ExportRequest(uploadID: command.commandID, kind: .pull, agentID: agentID, commandID: command.commandID, filter: .all), to: zip)
                try store.close()
                let upload = try SealedUpload(
                    zipPath: zip, uploadID: command.commandID, kind: .pull, agentID: agentID, key: uploadKey, empty: manifest.empty,
                    createdAt: Timestamp.now.microseconds)

                // The limit, just before: seal every chunk and write it durably, as the server
                // must, one after another.
                let limitDir = dir + "/limit-\(round)"
                try FileManager.default.createDirectory(atPath: limitDir, withIntermediateDirectories: true)
                let limitSeconds = try seconds {
                    for index in 0..<upload.header.chunkCount {
                        try DurableFile.write(try upload.chunk(index), to: limitDir + "/\(index)")
                    }
                }
                // The CPU limit: open each chunk and write it durably (sealing it first is not counted).
                var limitCPU = 0.0
                for index in 0..<upload.header.chunkCount {
                    let sealed = try upload.chunk(index)
                    limitCPU += try threadCPUSeconds {
                        _ = try upload.cipher.open(sealed, index: index)
                        try DurableFile.write(sealed, to: limitDir + "/open-\(index)")
                    }
                }
                try FileManager.default.removeItem(atPath: limitDir)

                var acked = Set<UInt32>()
                var ackedAt: Int64 = 0
                let cpu = CPUTimes.now()
                let threadsBefore = server.threadCPU()
                let serverBefore = processCPUSeconds(pid: server.process.processIdentifier)
                let start = monotonicNanos()
                let result = try await sendUpload(upload, over: link) { frame in
                    if case .chunkAck(let ack)? = frame.body {
                        acked.insert(ack.index)
                        if acked.count == Int(upload.header.chunkCount) { ackedAt = monotonicNanos() }
                    }
                }
                let end = monotonicNanos()
                let threadsAfter = server.threadCPU()
                let serverCPU = processCPUSeconds(pid: server.process.processIdentifier) - serverBefore
                let steal = CPUTimes.now().stealPercent(since: cpu)
                let used = { (name: String) in (threadsAfter[name] ?? 0) - (threadsBefore[name] ?? 0) }
                guard result?.ok == true else { throw ValidationError("upload round \(round) did not complete") }
                let mb = Double(upload.header.plaintextSize) / 1e6
                rounds.append(Round(
                    rate: mb / (Double(ackedAt - start) / 1e9), limit: mb / limitSeconds, withUnpack: mb / (Double(end - start) / 1e9),
                    bytes: upload.header.plaintextSize, chunks: upload.header.chunkCount, steal: steal,
                    unpackCPU: used("dredge-unpack"), uploadsCPU: used("dredge-uploads"), serverCPU: serverCPU, limitCPU: limitCPU))
                FileHandle.standardError.write(Data(String(format: "upload round %d/%d: %.0f MB/s, limit %.0f MB/s\n", round, uploadRounds, rounds.last?.rate ?? 0, limitSeconds > 0 ? mb / limitSeconds : 0).utf8))
            }
            return rounds
        }
        let mb = Double(rounds[0].bytes) / 1e6
        let cpu = Figure(
            name: "upload.cpu", value: median(rounds.map { $0.serverCPU * 1e3 / mb }), unit: "ms/MB", limit: median(rounds.map { $0.limitCPU * 1e3 / mb }),
            higherIsBetter: false,
            extra: "rounds=" + rounds.map { String(format: "%.2f/%.2f", $0.serverCPU * 1e3 / mb, $0.limitCPU * 1e3 / mb) }.joined(separator: ","))
        let throughput = Figure(
            name: "upload.throughput", value: median(rounds.map(\.rate)), unit: "MB/s", limit: median(rounds.map(\.limit)), higherIsBetter: true,
            extra: String(format: "upload_mb=%.1f chunks=%d with_unpack=%.0f MB/s", mb, rounds[0].chunks, median(rounds.map(\.withUnpack)))
                + " rounds=" + rounds.map { String(format: "%.0f/%.0f", $0.rate, $0.limit) }.joined(separator: ",")
                + " steal_pct=" + rounds.map { String(format: "%.0f", $0.steal) }.joined(separator: ",")
                + " unpack_cpu_s=" + rounds.map { String(format: "%.2f", $0.unpackCPU) }.joined(separator: ",")
                + " uploads_cpu_s=" + rounds.map { String(format: "%.2f", $0.uploadsCPU) }.joined(separator: ","))
        return [throughput, cpu]
    }

    /// A store whose export is large: messages of random base64, which deflate barely shrinks.
    static func buildStore(dir: String, mb: Int) throws -> String {
        let path = dir + "/upload.sqlite"
        let (store, context) = try openBenchStore(path)
        var rng = SystemRandomNumberGenerator()
        let now = Timestamp.now
        let count = mb * 1_000_000 / 1_300
        for i in 0..<count {
            let bytes = (0..<1_000).map { _ in UInt8.random(in: 0...255, using: &rng) }
            store.enqueue(LogEntry(
                timestamp: now.subtracting(.microseconds(Int64(count - i) * 1_000)), level: .info, type: .app, uid: "u-upload",
                message: Data(bytes).base64EncodedString(), context: context))
        }
        try store.close()
        return path
    }

    // MARK: server.idle_connections and server.command_latency

    func fleet(dir: String, server: ServerProcess, admin: AdminClient, created: ServerDeployment.Created) async throws -> [Figure] {
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        // The server needs its own descriptors too (listeners, databases, event loops).
        let count = min(agents, Int(limit.rlim_max) - 150)
        let keys = try Self.fleetKeys(cache: keyCache, count: count)

        let children = try FleetProcess.spawn(agents: count, processes: fleetProcesses, keys: keys, port: server.agentPort, created: created)
        defer { for c in children { c.stop() } }
        FileHandle.standardError.write(Data("enrolling \(count) agents\n".utf8))
        for c in children { try c.waitFor("enrolled", timeout: 1_800) }
        try await Task.sleep(for: .seconds(2))
        let baseline = server.residentKB()
        FileHandle.standardError.write(Data("connecting \(count) agents (server at \(baseline / 1024) MB)\n".utf8))
        for c in children { c.send("connect") }
        for c in children { try c.waitFor("ready", timeout: 1_800) }
        // Every agent heartbeats within one interval (30 s); wait for a full round.
        try await Task.sleep(for: .seconds(35))
        let now = Date()
        let listed = try await admin.agents().filter { $0.connected && $0.lastHeartbeatAt.map { now.timeIntervalSince($0) < 40 } == true }
        let held = listed.count
        let resident = server.residentKB()
        let perConnection = Double(resident - baseline) / Double(max(held, 1))
        let idle = Figure(
            name: "server.idle_connections", value: Double(held), unit: "agents", limit: Double(agents), higherIsBetter: true,
            extra: String(format: "kb_per_conn=%.1f server_rss_mb=%.0f baseline_mb=%.0f fd_limit=%d", perConnection, Double(resident) / 1024, Double(baseline) / 1024, Int(limit.rlim_max)))

        // Pulls through the admin API to random agents of the fleet, one at a time.
        var latencies: [Double] = [], answers: [Double] = []
        let ids = listed.map(\.agentID)
        let cpuBefore = CPUTimes.now()
        var log = ""
        for _ in 0..<samples {
            guard let target = ids.randomElement() else { throw ValidationError("no agent of the fleet is connected") }
            let start = monotonicNanos()
            let pull = try await admin.createPull(PullRequest(uid: nil, agent: target, filter: .all, expiresInSeconds: 60))
            let answered = monotonicNanos()
            var arrived: Int64?
            let deadline = ContinuousClock.now + .seconds(10)
            while arrived == nil && ContinuousClock.now < deadline {
                arrived = children.lazy.compactMap { $0.arrival(of: pull.id) }.first
                if arrived == nil { try await Task.sleep(for: .milliseconds(1)) }
            }
            guard let arrived else { throw ValidationError("pull \(pull.id) never reached agent \(target)") }
            latencies.append(Double(arrived - start) / 1e6)
            answers.append(Double(answered - start) / 1e6)
            log += String(format: "%.6f %.3f %.3f", Date().timeIntervalSince1970, latencies.last ?? 0, answers.last ?? 0) + " \(pull.id) \(start)\n"
            try await Task.sleep(for: .milliseconds(20))
        }
        let steal = CPUTimes.now().stealPercent(since: cpuBefore)
        if let latencyLog { try log.write(toFile: latencyLog, atomically: true, encoding: .utf8) }
        answers.sort()
        latencies.sort()
        let p50 = latencies[latencies.count / 2]
        let p99 = latencies[min(latencies.count - 1, Int(Double(latencies.count) * 0.99))]
        let latency = Figure(
            name: "server.command_latency", value: p99, unit: "ms", limit: 50, higherIsBetter: false,
            extra: String(
                format: "p50=%.1f p99=%.1f post_answered_p50=%.1f post_answered_p99=%.1f agents=%d samples=%d steal_pct=%.1f", p50, p99, answers[answers.count / 2],
                answers[min(answers.count - 1, Int(Double(answers.count) * 0.99))], held, latencies.count, steal))
        return [idle, latency]
    }

    /// A deployment in `data`: on SQLite, or in a schema of its own of the PostgreSQL `database`.
    static func initialize(_ data: String, database: String?, schema: String) async throws -> ServerDeployment.Created {
        guard let database else { return try ServerDeployment.initialize(.init(dataDirectory: data)) }
        let url = database + (database.contains("?") ? "&" : "?") + "schema=" + schema
        var options = ServerDeployment.Options(dataDirectory: data)
        options.database = url
        let db = try await PostgresDatabase(try PostgresDatabase.Location(url: url))
        defer { db.close() }
        return try await ServerDeployment.initialize(options, database: db)
    }

    /// The whole simulated fleet connects from 127.0.0.1: lift the per-address cap on
    /// unauthenticated connections (meant for the open internet) in `server.json`.
    static func allowOneAddressFleet(_ data: String) throws {
        try setConnections(["maxUnauthenticatedPerAddress": 1_000_000], in: data)
    }

    /// Sets the `connections` object (``ConnectionLimits``) of the deployment's `server.json`.
    static func setConnections(_ connections: [String: Any], in data: String) throws {
        try setConfig("connections", connections, in: data)
    }

    /// Sets one top-level key of the deployment's `server.json`.
    static func setConfig(_ key: String, _ value: [String: Any], in data: String) throws {
        let path = data + "/server.json"
        guard var config = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any] else {
            throw ValidationError("\(path) is not a JSON object")
        }
        config[key] = value
        try JSONSerialization.data(withJSONObject: config, options: [.prettyPrinted, .sortedKeys]).write(to: URL(fileURLWithPath: path))
    }

    /// A file of at least `count` fleet keys: one in the cache, else made by
    /// `scripts/bench-fleet-keys.py` (and cached).
    static func fleetKeys(cache: String, count: Int) throws -> String {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: cache)) ?? []  // no cache yet: made below
        let held = names.compactMap { name -> (Int, String)? in
            guard name.hasPrefix("fleet-"), name.hasSuffix(".bin"), let n = Int(name.dropFirst(6).dropLast(4)), n >= count else { return nil }
            return (n, cache + "/" + name)
        }
        if let smallest = held.min(by: { $0.0 < $1.0 }) { return smallest.1 }
        let keys = cache + "/fleet-\(count).bin"
        try FileManager.default.createDirectory(atPath: cache, withIntermediateDirectories: true)
        FileHandle.standardError.write(Data("making \(count) agent keys (cached in \(keys))\n".utf8))
        let python = Process()
        python.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        python.arguments = ["python3", script("bench-fleet-keys.py"), String(count), keys]
        try python.run()
        python.waitUntilExit()
        guard python.terminationStatus == 0 else { throw ValidationError("bench-fleet-keys.py failed") }
        return keys
    }

    /// A script of this repository, found from the current directory.
    static func script(_ name: String) -> String { FileManager.default.currentDirectoryPath + "/scripts/" + name }
}

/// Resident memory of a process, KiB.
func processResidentKB(pid: Int32) -> Int {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
    else { return 0 }
    return Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
}

/// CPU seconds (user and system) process `pid` has used so far, all its threads, those that
/// ended too; 0 where `/proc` is not there.
func processCPUSeconds(pid: Int32) -> Double {
    // "pid (name) state …": fields after the name; utime and stime are the 12th and 13th.
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return 0 }  // not Linux
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// The CPU time the calling thread spends in `body`, seconds.
func threadCPUSeconds(_ body: () throws -> Void) rethrows -> Double {
    var start = timespec(), end = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start)
    try body()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end)
    return Double(end.tv_sec - start.tv_sec) + Double(end.tv_nsec - start.tv_nsec) / 1e9
}

/// The executable next to this one.
func sibling(_ name: String) -> String {
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent(name).path
}

/// A `dredge-server run` child with ports chosen by the system.
final class ServerProcess: Sendable {
    let process = Process()
    let agentPort: Int
    /// `https://127.0.0.1:PORT`
    let adminAddress: String
    /// The deployment's CA, which signs the admin API's certificate.
    let caPath: String

    init(data: String, log: String, heartbeatSeconds: Int? = nil) throws {
        FileManager.default.createFile(atPath: log, contents: nil)
        process.executableURL = URL(fileURLWithPath: sibling("dredge-server"))
        process.arguments = ["run", "--data", data, "--agent-port", "0", "--admin-port", "0"] + (heartbeatSeconds.map { ["--heartbeat-seconds", String($0)] } ?? [])
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        var agent: Int?, admin: String?
        for _ in 0..<300 where agent == nil || admin == nil {
            usleep(100_000)
            let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            for line in text.split(separator: "\n") {
                if line.contains("agent listener ready"), let range = line.range(of: #"127\.0\.0\.1:\d+"#, options: .regularExpression) {
                    agent = Int(line[range].split(separator: ":")[1])
                }
                if line.contains("admin API ready"), let range = line.range(of: #"url=https?://[0-9.]+:\d+"#, options: .regularExpression) {
                    admin = String(line[range].dropFirst("url=".count))
                }
            }
        }
        guard let agent, let admin else { process.terminate(); throw ValidationError("dredge-server did not start; see \(log)") }
        agentPort = agent
        adminAddress = admin
        caPath = data + "/ca.pem"
    }

    /// An admin client that trusts the deployment's CA only.
    func admin(token: String) throws -> AdminClient {
        try AdminClient(server: adminAddress, token: token, trust: .pinned(caPEM: String(contentsOfFile: caPath, encoding: .utf8)))
    }

    /// `dredge`'s flags for this server.
    func credentials(token: String) -> [String] { ["--server", adminAddress, "--token", token, "--ca", caPath] }

    func residentKB() -> Int { processResidentKB(pid: process.processIdentifier) }

    /// CPU seconds (user and system) each thread name of the server has used so far, summed
    /// over its threads of that name; empty where `/proc` is not there.
    func threadCPU() -> [String: Double] {
        let tasks = "/proc/\(process.processIdentifier)/task"
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        var used: [String: Double] = [:]
        for tid in (try? FileManager.default.contentsOfDirectory(atPath: tasks)) ?? [] {  // not Linux: no figure
            // "tid (name) state … utime stime …": the name may hold spaces and parentheses.
            guard let stat = try? String(contentsOfFile: "\(tasks)/\(tid)/stat", encoding: .utf8),  // a thread that ended meanwhile
                let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")")
            else { continue }
            let name = String(stat[stat.index(after: open)..<close])
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { continue }
            used[name, default: 0] += (user + system) / ticks
        }
        return used
    }

    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }
}

/// A `dredge-bench fleet-child`: lines out (`enrolled`, `ready`, `pull ID NANOS`), lines in.
final class FleetProcess: Sendable {
    let process = Process()
    let input = Pipe()
    let output = Pipe()
    /// What the child said: lines, and the arrival times of pulls.
    private let heard = Mutex((lines: [String](), arrivals: [String: Int64]()))

    init(arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: sibling("dredge-bench"))
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        let handle = output.fileHandleForReading
        Thread.detachNewThread { [self] in
            var pending = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: 10) {
                    let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                    pending.removeSubrange(pending.startIndex...newline)
                    heard.withLock {
                        let parts = line.split(separator: " ")
                        if parts.count == 3, parts[0] == "pull", let at = Int64(parts[2]) {
                            $0.arrivals[String(parts[1])] = at
                        } else {
                            $0.lines.append(line)
                        }
                    }
                }
            }
        }
    }

    /// `agents` simulated agents (keys from the start of `keys`), shared among `processes`
    /// children.
    static func spawn(agents: Int, processes: Int, keys: String, port: Int, created: ServerDeployment.Created, extra: [String] = []) throws -> [FleetProcess] {
        try spawn(agents: agents, processes: processes, keys: keys, ports: [port], created: created, extra: extra)
    }

    /// Child `p` connects to `ports[p % ports.count]` (the nodes of a cluster, one child each).
    static func spawn(agents: Int, processes: Int, keys: String, ports: [Int], created: ServerDeployment.Created, extra: [String] = []) throws -> [FleetProcess] {
        var children: [FleetProcess] = []
        let share = (agents + processes - 1) / processes
        for p in 0..<processes {
            let from = p * share
            let n = min(share, agents - from)
            guard n > 0 else { break }
            do {
                children.append(try FleetProcess(arguments: [
                    "fleet-child", "--keys", keys, "--from", String(from), "--count", String(n), "--port", String(ports[p % ports.count]),
                    "--ca", created.caPath, "--token", created.enrollmentToken,
                ] + extra))
            } catch {
                for c in children { c.stop() }
                throw error
            }
        }
        return children
    }

    func arrival(of pullID: String) -> Int64? { heard.withLock { $0.arrivals[pullID] } }

    /// The last line that starts with `prefix`, once one came (waits up to `timeout` s).
    func line(_ prefix: String, timeout: Int) throws -> String {
        try waitFor(prefix, timeout: timeout)
        return heard.withLock { heard in
            let found = heard.lines.last { $0.hasPrefix(prefix) } ?? ""
            heard.lines.removeAll { $0.hasPrefix(prefix) }
            return found
        }
    }

    func waitFor(_ prefix: String, timeout: Int) throws {
        for _ in 0..<(timeout * 10) {
            if heard.withLock({ heard in heard.lines.contains { $0.hasPrefix(prefix) } }) { return }
            if !process.isRunning { break }
            usleep(100_000)
        }
        throw ValidationError("fleet child never said '\(prefix)': \(heard.withLock { $0.lines.suffix(5) })")
    }

    func send(_ line: String) { input.fileHandleForWriting.write(Data((line + "\n").utf8)) }

    func stop() {
        try? input.fileHandleForWriting.close()
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
    }
}
