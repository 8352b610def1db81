import ArgumentParser
import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeServer
import DredgeStore
import DredgeWire
import CDredgeSystem
import Foundation
import NIOSSL

/// `dredge-bench heartbeat`: `server.heartbeat_under_upload`, the real `dredge-server` holding
/// a fleet of idle agents (`fleet-child` processes timing every heartbeat's round trip) while
/// a few agents upload large pulls at once. The limit is the same fleet's p99 round trip in
/// the same run with no upload: the run alternates windows with no upload and with uploads
/// (`--rounds`), each idle window just before its uploads, and pools each kind, so a machine
/// whose speed drifts (a shared host) weighs on both alike. Also `server.idle_connections`
/// for that fleet (the server's memory per authenticated connection).
struct HeartbeatBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "heartbeat", abstract: "Heartbeat round trips of an idle fleet while large uploads run.")

    @Option(help: "Idle agents in the fleet.")
    var agents = 2_000

    @Option(help: "Agents uploading at once.")
    var uploaders = 4

    @Option(help: "Approximate size of each upload, MB.")
    var uploadMb = 80

    @Option(help: "Heartbeat interval the server asks for, seconds.")
    var heartbeatSeconds = 2

    @Option(help: "Seconds of round trips measured with no upload, in all (split evenly over the rounds).")
    var idleSeconds = 20

    @Option(help: "Rounds of an idle window followed by the uploads.")
    var rounds = 4

    @Option(help: "Where the fleet's keys are cached (made by scripts/bench-fleet-keys.py).")
    var keyCache = ".build/bench-fleet-keys"

    @Option(help: "Nice value (0-19) of this process while its agents upload: they stand in for agents on other machines, whose sealing and TLS would not run on the server's CPU. 0 lets them compete with the server as equals.")
    var uploadersNice = 19

    @Flag(inversion: .prefixedNo, help: "Move this process's threads to SCHED_IDLE while its agents upload (as well as nicing them): the server's threads that wake take the CPU from them at once.")
    var uploadersIdle = true

    @Option(help: ArgumentHelp("The server's `threads.bulkIdle` (its upload and unpack threads under SCHED_IDLE); the server's default when not given.", valueName: "true|false"))
    var bulkIdle: Bool?

    @Option(help: "The server's `threads.uploads` (threads verifying and writing chunks); the server's default when not given.")
    var uploadThreads: Int?

    @Option(help: ArgumentHelp("Write every heartbeat's round trip here, a line each: the window (idle or upload, and its round), when it was sent and its round trip (CLOCK_MONOTONIC ns, ms); and a line per window with its start and end.", valueName: "path"))
    var rttLog: String?

    func validate() throws {
        guard rounds > 0, uploaders > 0, idleSeconds > 0 else { throw ValidationError("--rounds, --uploaders and --idle-seconds must be at least 1") }
        if let uploadThreads, uploadThreads < 1 { throw ValidationError("--upload-threads must be at least 1") }
    }

    func run() async throws {
        let dir = NSTemporaryDirectory() + "dredge-bench-heartbeat-\(getpid())"
        try? FileManager.default.removeItem(atPath: dir)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let created = try ServerDeployment.initialize(.init(dataDirectory: dir + "/server"))
        try ServerBench.allowOneAddressFleet(dir + "/server")
        var threads: [String: Any] = [:]
        if let bulkIdle { threads["bulkIdle"] = bulkIdle }
        if let uploadThreads { threads["uploads"] = uploadThreads }
        if !threads.isEmpty { try ServerBench.setConfig("threads", threads, in: dir + "/server") }
        let server = try ServerProcess(data: dir + "/server", log: dir + "/server.log", heartbeatSeconds: heartbeatSeconds)
        defer { server.stop() }
        let admin = try server.admin(token: created.adminToken)
        ServerRuntime.raiseOpenFileLimit()

        // The uploads' zips first (not timed): one store, one export per uploader.
        let tls = try AgentLink.tlsContext(caPEM: String(contentsOfFile: created.caPath, encoding: .utf8))
        var uploaderKeys: [(String, RSAPrivateKey)] = []
        for i in 0..<uploaders {
            let key = try RSAPrivateKey.generate()
            let id = try await AgentEnrollment.register(host: "127.0.0.1", port: server.agentPort, tls: tls, token: created.enrollmentToken, key: key, hostInfo: .with { $0.hostname = "bench-uploader-\(i)" })
            uploaderKeys.append((id, key))
        }
        let storePath = try ServerBench.buildStore(dir: dir, mb: uploadMb)
        var readOnly = StoreConfiguration()
        readOnly.readOnly = true
        let store = try LogStore(path: storePath, configuration: readOnly)
        // A pull for each uploader and round, its zip named after it: an uploader takes the
        // first command it is sent on connecting (its oldest pull not done) and uploads that zip.
        for _ in 0..<rounds {
            for (id, _) in uploaderKeys {
                let pull = try await admin.createPull(PullRequest(uid: nil, agent: id, filter: .all))
                _ = try Exporter.export(from: store, ExportRequest(uploadID: pull.id, kind: .pull, agentID: id, commandID: pull.id, filter: .all), to: dir + "/\(pull.id).zip")
            }
        }
        try store.close()

        // The fleet.
        let keys = try ServerBench.fleetKeys(cache: keyCache, count: agents)
        let children = try FleetProcess.spawn(agents: agents, processes: 2, keys: keys, port: server.agentPort, created: created, extra: ["--measure-heartbeats"])
        defer { for c in children { c.stop() } }
        FileHandle.standardError.write(Data("enrolling \(agents) agents\n".utf8))
        for c in children { try c.waitFor("enrolled", timeout: 1_800) }
        try await Task.sleep(for: .seconds(2))
        let baseline = server.residentKB()
        for c in children { c.send("connect") }
        for c in children { try c.waitFor("ready", timeout: 1_800) }
        try await Task.sleep(for: .seconds(Double(heartbeatSeconds * 3)))
        let held = try await admin.agents().filter(\.connected).count
        let perConnection = Double(server.residentKB() - baseline) / Double(max(held, 1))

        let rttLog = try self.rttLog.map { path -> FileHandle in
            guard FileManager.default.createFile(atPath: path, contents: nil) else { throw ValidationError("cannot create \(path)") }
            return try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        }
        func roundTrips(_ window: String, during body: () async throws -> Void) async throws -> [Double] {
            for c in children { c.send("reset") }
            let start = monotonicNanos()
            try await body()
            let end = monotonicNanos()
            for c in children { c.send("report") }
            var all: [Double] = []
            var text = "window \(window) \(start) \(end)\n"
            for c in children {
                // `SENT_NS:MS` per heartbeat.
                for sample in try c.line("rtt", timeout: 60).dropFirst(4).split(separator: ",") {
                    let parts = sample.split(separator: ":")
                    guard parts.count == 2, let ms = Double(parts[1]) else { continue }
                    all.append(ms)
                    if rttLog != nil { text += "\(window) \(parts[0]) \(parts[1])\n" }
                }
            }
            rttLog?.write(Data(text.utf8))
            return all.sorted()
        }
        func p99(_ sorted: [Double]) -> Double { sorted.isEmpty ? .nan : sorted[min(sorted.count - 1, Int(Double(sorted.count) * 0.99))] }

        var idle: [Double] = [], busy: [Double] = [], uploadSeconds: [Double] = []
        // Each round's p99 with no upload and under upload: how much the figure moves between rounds.
        var roundP99s: [(idle: Double, upload: Double)] = []
        // The uploaders stand in for other machines: every thread of this process at their nice
        // value from here on.
        Self.niceEveryThread(uploadersNice, idle: uploadersIdle)
        var indexWaits: [Double] = []
        // The share of CPU time the host took from this machine in each window.
        var idleSteal: [Double] = [], busySteal: [Double] = []
        for round in 1...rounds {
            // The idle window is idle: the server has indexed what the last round uploaded
            // (reading every record into the search index, at the server's own priority), and
            // what was written is on disk.
            let waitStart = monotonicNanos(), deadline = ContinuousClock.now + .seconds(600)
            while try await admin.search(RecordSearch(limit: 1)).indexing > 0 {
                guard ContinuousClock.now < deadline else { throw ValidationError("the server did not finish indexing round \(round - 1)'s uploads in 10 minutes") }
                try await Task.sleep(for: .seconds(1))
            }
            indexWaits.append(Double(monotonicNanos() - waitStart) / 1e9)
            sync()
            try await Task.sleep(for: .seconds(1))
            FileHandle.standardError.write(Data("round \(round)/\(rounds): \(Double(idleSeconds) / Double(rounds)) s with no upload, then \(uploaders) agents upload \(uploadMb) MB each\n".utf8))
            var cpu = CPUTimes.now()
            let idleRound = try await roundTrips("idle\(round)") { try await Task.sleep(for: .seconds(Double(idleSeconds) / Double(rounds))) }
            idle += idleRound
            idleSteal.append(CPUTimes.now().stealPercent(since: cpu))
            cpu = CPUTimes.now()
            defer { busySteal.append(CPUTimes.now().stealPercent(since: cpu)) }
            let busyRound = try await roundTrips("upload\(round)") {
                let start = monotonicNanos()
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for (id, key) in uploaderKeys {
                        group.addTask { try await Self.upload(zips: dir, agentID: id, key: key, port: server.agentPort, tls: tls) }
                    }
                    try await group.waitForAll()
                }
                uploadSeconds.append(Double(monotonicNanos() - start) / 1e9)
            }
            busy += busyRound
            roundP99s.append((p99(idleRound), p99(busyRound)))
        }
        idle.sort()
        busy.sort()
        let figure = Figure(
            name: "server.heartbeat_under_upload", value: p99(busy), unit: "ms", limit: p99(idle), higherIsBetter: false,
            extra: String(
                format: "slowdown=%.2f p50_idle=%.2f p50_upload=%.2f samples_idle=%d samples_upload=%d agents=%d uploads=%dx%dx%d MB",
                p99(busy) / p99(idle), idle.isEmpty ? .nan : idle[idle.count / 2], busy.isEmpty ? .nan : busy[busy.count / 2], idle.count, busy.count, held,
                rounds, uploaders, uploadMb)
                + " round_p99_ms=" + roundP99s.map { String(format: "%.2f/%.2f", $0.upload, $0.idle) }.joined(separator: ",")
                + " upload_s=" + uploadSeconds.map { String(format: "%.1f", $0) }.joined(separator: ",")
                + " indexed_after_s=" + indexWaits.dropFirst().map { String(format: "%.1f", $0) }.joined(separator: ",") + " steal_pct_idle=" + idleSteal.map { String(format: "%.0f", $0) }.joined(separator: ",")
                + " steal_pct_upload=" + busySteal.map { String(format: "%.0f", $0) }.joined(separator: ",")
                + " uploaders_nice=\(uploadersNice) uploaders_idle=\(uploadersIdle) bulk_idle=\(bulkIdle.map { "\($0)" } ?? "default")"
                + " upload_threads=\(uploadThreads.map { "\($0)" } ?? "default")")
        print(figure.line)
        print(Figure(
            name: "server.idle_connections", value: perConnection, unit: "KB/conn", limit: 32, higherIsBetter: false,
            extra: String(format: "agents=%d baseline_mb=%.0f", held, Double(baseline) / 1024)).line)
    }

    /// Sets the nice value (and with `idle` the `SCHED_IDLE` policy) of every thread of this
    /// process (Linux keeps both per thread; threads made later inherit their creator's).
    /// Lowering priority needs no privilege.
    static func niceEveryThread(_ nice: Int, idle: Bool) {
        #if os(Linux)
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []  // a benchmark setting; none found, none changed
        for task in tasks {
            guard let tid = id_t(task) else { continue }
            _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), tid, Int32(max(0, min(19, nice))))
            if idle { _ = dredge_set_idle_policy(Int32(tid)) }
        }
        #endif
    }

    /// One agent's upload of a pull: connects, takes the first command, accepts it and sends
    /// every chunk of its zip (`zips/<pull id>.zip`) until the server's result.
    static func upload(zips: String, agentID: String, key: RSAPrivateKey, port: Int, tls: NIOSSLContext) async throws {
        try await AgentLink.withConnection(host: "127.0.0.1", port: port, tls: tls, agentID: agentID, key: key) { link in
            var command: WirePullCommand?
            while command == nil, let frame = try await link.next() {
                if case .pullCommand(let c)? = frame.body { command = c }
            }
            guard let command else { throw ValidationError("no command arrived") }
            try await link.send(.with { $0.commandAccepted = .with { $0.commandID = command.commandID } })
            let upload = try SealedUpload(
                zipPath: zips + "/\(command.commandID).zip", uploadID: command.commandID, kind: .pull, agentID: agentID, key: try key.unwrapKey(Array(command.wrappedKey)), empty: false,
                createdAt: Timestamp.now.microseconds)
            let result = try await sendUpload(upload, over: link)
            guard result?.ok == true else { throw ValidationError("upload of \(agentID) ended: \(String(describing: result))") }
        }
    }
}
