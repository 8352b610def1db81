import Crypto
import DredgeAdminAPI
import DredgeAdminClient
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Logging
import NIOSSL
import ServiceLifecycle
import Synchronization
@testable import DredgeServer

/// The real server (agent listener, admin API, delivery) in this process, on loopback ports
/// chosen by the system, with its log captured. For tests that act as a hostile agent through
/// the real wire protocol and watch what the server stores. A test runs it in
/// ``withStopping(_:_:)``, which stops it and waits for it before the test ends.
final class InProcessServer: StoppedAtTheEnd, @unchecked Sendable {
    let dir = TempDir()
    let created: ServerDeployment.Created
    let registry: SQLiteAgentDirectory
    let pulls: SQLitePullQueue
    let issuer: CommandIssuer
    let feedback: SQLiteFeedbackInbox
    let tails: SQLiteTailRegistry
    /// The standing triggers and their captures (#54).
    let triggers: (any TriggerRegistry)?
    let listener: AgentListener
    let records: SQLiteRecordIndex
    let indexer: Indexer
    let logs = LogCapture()
    let agentPort: Int
    let admin: AdminClient
    let adminURL: String
    /// The listeners' TLS, as a running server's ``CertificateRenewal`` replaces it.
    let agentTLS: ReloadableTLS
    let adminTLS: ReloadableTLS?
    private let group: ServiceGroup
    private let task: Task<Void, Error>

    let data: String

    /// - Parameter dataDirectory: where the data directory goes (a small tmpfs, say); in the
    ///   test's temporary directory by default.
    /// - Parameter connectionLimits: by default the server's, but 100 missed heartbeats instead
    ///   of 3, so links that send no heartbeats are not closed during a test, and a 120 s
    ///   handshake deadline instead of 10 s, since the synchronous child-process tests can hold
    ///   the test process's few cooperative threads (where this server runs) for seconds.
    /// - Parameter wrapPulls: wraps the pull queue the agent listener uses (to hold its writes,
    ///   say); the admin API and the test use the queue itself.
    /// - Parameter wrapRegistry: the same for the agent directory.
    /// - Parameter existing: runs on the deployment already in `dataDirectory` (restored from a
    ///   backup, say), made with these tokens, instead of a new one.
    init(
        feedbackLimits: FeedbackLimits? = nil, dataDirectory: String? = nil, connectionLimits: ConnectionLimits = ConnectionLimits(handshakeSeconds: 120, missedHeartbeats: 100),
        heartbeatSeconds: UInt32 = 1, tokens wrapTokens: (@Sendable (any TokenVault) -> any TokenVault)? = nil,
        listenerPulls wrapPulls: (@Sendable (any PullQueue) -> any PullQueue)? = nil,
        listenerRegistry wrapRegistry: (@Sendable (any AgentDirectory) -> any AgentDirectory)? = nil,
        adminLimits: AdminConnectionLimits = .default, adminTLS: Bool = false, existing: ServerDeployment.Created? = nil
    ) async throws {
        let data = dataDirectory ?? dir.file("server")
        self.data = data
        created = try existing ?? ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
        let deployment = try LoadedDeployment(directory: data)
        let stores = try ServerStores(deployment)
        (registry, pulls, issuer, feedback, records) = (stores.registry, stores.pulls, stores.issuer, stores.feedback, stores.records)
        tails = stores.tails
        triggers = stores.triggers
        let tailHub = TailHub()
        let tokens = wrapTokens?(stores.tokens) ?? stores.tokens
        let logger = Logger(label: "test.server") { [logs] _ in logs }
        let janitor = UploadJanitor(paths: DataDirectory(data), pulls: pulls, feedback: feedback, captures: stores.triggers, logger: logger)
        let dispatcher = PullDispatcher(pulls: pulls, sweepInterval: .milliseconds(200), logger: logger, housekeeping: janitor.housekeeping(listeningSince: Date()))
        let indexer = Indexer(index: records, registry: registry, tails: stores.tails, paths: DataDirectory(data), logger: logger)
        tailHub.whenStopped { id, _, agents in
            for agent in agents { indexer.landed(IndexedSource(kind: .tail, id: id, agentID: agent)) }
        }
        self.indexer = indexer
        agentTLS = try ReloadableTLS(deployment.tlsConfiguration)
        self.adminTLS = try adminTLS ? deployment.adminTLSConfiguration.map { try ReloadableTLS($0) } : nil
        listener = AgentListener(
            deployment: deployment, registry: wrapRegistry?(registry) ?? registry, pulls: wrapPulls?(pulls) ?? pulls, feedback: feedback, tokens: tokens, tails: stores.tails,
            tailHub: tailHub, triggers: stores.triggers, dispatcher: dispatcher, logger: logger,
            host: "127.0.0.1", port: 0, heartbeatSeconds: heartbeatSeconds, feedbackLimits: feedbackLimits, connectionLimits: connectionLimits,
            issuer: issuer, landed: { indexer.landed($0, records: $1) }, tls: agentTLS)
        let adminPort = Mutex<Int?>(nil)
        let services = AdminServices(
            registry: registry, pulls: pulls, audit: pulls, issuer: issuer, feedback: feedback, tokens: tokens, tails: stores.tails, triggers: stores.triggers,
            tailHub: tailHub, dispatcher: dispatcher, records: records,
            indexer: indexer, files: PullFiles(paths: DataDirectory(data), pulls: pulls, feedback: feedback, captures: stores.triggers), logger: logger)
        let app = try AdminAPI.application(
            actions: AdminActions(services), port: 0, tls: adminTLS ? deployment.adminTLSConfiguration : nil, connectionLimits: adminLimits,
            reloadableTLS: self.adminTLS, onReady: { port in adminPort.withLock { $0 = port } })
        // The key ring is looked at every 200 ms here (every 10 s in the server).
        group = ServiceGroup(services: [dispatcher, indexer, listener, app, KeyRingRefresh(keys: deployment.keys, every: .milliseconds(200), logger: logger)], logger: logger)
        let task = Task { [group] in try await group.run() }
        self.task = task
        do {
            var agentPort: Int?, admin: Int?
            for _ in 0..<3000 where agentPort == nil || admin == nil {
                try await Task.sleep(for: .milliseconds(20))
                agentPort = listener.boundPort
                admin = adminPort.withLock { $0 }
            }
            guard let agentPort, let admin else { throw DeploymentError("the in-process server did not start") }
            self.agentPort = agentPort
            adminURL = "\(adminTLS ? "https" : "http")://127.0.0.1:\(admin)"
            let caPEM = String(decoding: try Data(contentsOf: URL(fileURLWithPath: data + "/ca.pem")), as: UTF8.self)
            self.admin = try AdminClient(server: adminURL, token: created.adminToken, trust: adminTLS ? .pinned(caPEM: caPEM) : .system)
        } catch {
            // Started and not handed to the test: stopped here, or it would run on unseen.
            await group.triggerGracefulShutdown()
            _ = await task.result
            throw error
        }
    }

    /// Shuts the server down and returns once every service has ended; throws what a service
    /// failed with.
    func stop() async throws {
        await group.triggerGracefulShutdown()
        try await task.value
    }

    /// Waits until the server has ended every connection it accepted
    /// (``AgentListener/connectionsEnded()``); throws after `limit` instead of hanging the test.
    func connectionsEnded(within limit: Duration = .seconds(300)) async throws {
        try await ConnectionRulesTests.within(limit) { [listener] in await listener.connectionsEnded() }
    }

    /// A device's store in this server's directory with the end-to-end tests' records
    /// (`PullEndToEndTests.makeDeviceStore`); its path.
    func deviceStore() throws -> String {
        let store = dir.file("device.sqlite")
        try PullEndToEndTests.makeDeviceStore(store)
        return store
    }

    /// An agent made of ``AgentLink``, enrolled with a fresh key.
    /// Described, as a real agent describes itself, by its store's context (`deviceStore()`'s
    /// is host `oven-7`, app `oven` 1 on Linux), at enrollment and on each connection.
    func enrollAgent(hostname: String = "probe", app: String = "oven") async throws -> LinkAgent {
        let tls = try AgentLink.tlsContext(caPEM: contents(data + "/ca.pem"))
        let key = try RSAPrivateKey.generate()
        let hostInfo = WireHostInfo.with {
            $0.hostname = hostname
            $0.app = app
            $0.appVersion = "1"
            $0.os = "Linux"
        }
        let id = try await AgentEnrollment.register(host: "127.0.0.1", port: agentPort, tls: tls, token: created.enrollmentToken, key: key, hostInfo: hostInfo)
        return LinkAgent(server: self, tls: tls, key: key, agentID: id, hostInfo: hostInfo)
    }

    /// Every file under `path` with its size and a digest of its bytes: compared before and
    /// after an attack to show nothing changed.
    /// SQLite files are left out: they change with every status update.
    static func snapshot(_ path: String) -> [String: String] {
        var result: [String: String] = [:]
        guard let walker = FileManager.default.enumerator(atPath: path) else { return result }
        while let relative = walker.nextObject() as? String {
            if [".sqlite", ".sqlite-wal", ".sqlite-shm"].contains(where: relative.hasSuffix) { continue }
            let full = path + "/" + relative
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: full, isDirectory: &isDirectory) else { continue }
            if isDirectory.boolValue {
                result[relative] = "dir"
            } else if let bytes = FileManager.default.contents(atPath: full) {
                result[relative] = "\(bytes.count):" + SHA256.hash(data: bytes).map { String(format: "%02x", $0) }.joined()
            }
        }
        return result
    }
}

/// An enrolled agent that speaks the wire protocol frame by frame.
struct LinkAgent: Sendable {
    let server: InProcessServer
    let tls: NIOSSLContext
    let key: RSAPrivateKey
    let agentID: String
    var hostInfo = WireHostInfo()

    /// `capabilities`: none for an agent of the protocol before capabilities.
    func connect<R: Sendable>(capabilities: [String] = AgentLink.capabilities, keyGeneration: Int = 0, _ body: (AgentLink) async throws -> R) async throws -> R {
        try await AgentLink.withConnection(
            host: "127.0.0.1", port: server.agentPort, tls: tls, agentID: agentID, key: key, hostInfo: hostInfo, capabilities: capabilities, keyGeneration: keyGeneration, body)
    }

    /// A real export of `store`'s records as a feedback upload with this id, sealed for the
    /// server; `rewrite` (a forger's) may replace the zip before it is sealed.
    func feedbackUpload(
        id: String, uid: String = "u-1", text: String = "it broke", store: String, dir: TempDir, rewrite: (String) throws -> String = { $0 }
    ) throws -> SealedUpload {
        let s = try LogStore(path: store)
        defer { try? s.close() }
        let now = Timestamp.now
        let zip = dir.file("feedback-\(UUID().uuidString).zip")
        let manifest = try Exporter.export(
            from: s,
            ExportRequest(
                uploadID: id, kind: .feedback, agentID: agentID, filter: LogFilter(since: now.subtracting(.seconds(3 * 86_400)), until: now.adding(.seconds(1)), uid: uid),
                feedback: ExportManifest.FeedbackDescription(feedbackID: id, uid: uid, text: text, createdAt: now.rfc3339), createdAt: now),
            to: zip)
        let uploadKey = SymmetricKey.uploadKey()
        let serverKey = try LoadedDeployment(directory: server.data).encryptionKey.publicKey
        return try SealedUpload(
            zipPath: try rewrite(zip), uploadID: id, kind: .feedback, agentID: agentID, key: uploadKey, wrappedKey: try serverKey.wrapKey(uploadKey),
            feedback: .with { $0.feedbackID = id; $0.uid = uid; $0.text = text; $0.createdAtUs = now.microseconds },
            empty: manifest.empty, createdAt: now.microseconds)
    }

    /// A real export of `store`'s records in `[since, until)` (of `uid`, or every user's) as a
    /// capture of `trigger`, sealed for the server; `describe` may change its manifest's capture
    /// and `header` its header's (a forger's).
    func captureUpload(
        id: String = Hex.encode(secureRandomBytes(16)), trigger: String, setVersion: UInt64 = 1, uid: String = "", since: Timestamp, until: Timestamp,
        matchedAt: Timestamp, crash: Bool = false, match: JSONValue?, store: String, dir: TempDir,
        describe: (inout ExportManifest.CaptureDescription) -> Void = { _ in }, header: (inout WireCapture) -> Void = { _ in }
    ) throws -> SealedUpload {
        let s = try LogStore(path: store)
        defer { try? s.close() }
        let zip = dir.file("capture-\(UUID().uuidString).zip")
        var description = ExportManifest.CaptureDescription(triggerID: trigger, setVersion: setVersion, crash: crash, matchedAt: matchedAt.rfc3339, match: match)
        describe(&description)
        let manifest = try Exporter.export(
            from: s,
            ExportRequest(
                uploadID: id, kind: .capture, agentID: agentID, filter: LogFilter(since: since, until: until, uid: uid.isEmpty ? nil : uid), capture: description),
            to: zip)
        var capture = WireCapture.with {
            $0.triggerID = trigger
            $0.setVersion = setVersion
            $0.uid = uid
            $0.sinceUs = since.microseconds
            $0.untilUs = until.microseconds
            $0.matchedAtUs = matchedAt.microseconds
            $0.crash = crash
        }
        header(&capture)
        let uploadKey = SymmetricKey.uploadKey()
        let serverKey = try LoadedDeployment(directory: server.data).encryptionKey.publicKey
        return try SealedUpload(
            zipPath: zip, uploadID: id, kind: .capture, agentID: agentID, key: uploadKey, wrappedKey: try serverKey.wrapKey(uploadKey), capture: capture,
            empty: manifest.empty, createdAt: Timestamp.now.microseconds)
    }

    /// A real export for a pull command, sealed with the command's key; `rewrite` (a forger's)
    /// may replace the zip before it is sealed.
    func pullUpload(
        _ command: WirePullCommand, store: String, dir: TempDir, chunkSize: Int = WireLimits.defaultChunkBytes, rewrite: (String) throws -> String = { $0 }
    ) throws -> SealedUpload {
        let s = try LogStore(path: store)
        defer { try? s.close() }
        let zip = dir.file("pull-\(UUID().uuidString).zip")
        let manifest = try Exporter.export(
            from: s, ExportRequest(uploadID: command.commandID, kind: .pull, agentID: agentID, commandID: command.commandID,
                filter: try LogFilter(wire: command.filter).bounded(toTarget: command.target.uid)),
            to: zip)
        return try SealedUpload(
            zipPath: try rewrite(zip), uploadID: command.commandID, kind: .pull, agentID: agentID, key: try key.unwrapKey(Array(command.wrappedKey)),
            empty: manifest.empty, createdAt: Timestamp.now.microseconds, chunkSize: chunkSize)
    }

    /// Sends a heartbeat and reads until its ack: the server has then committed its uids, so
    /// a pull by uid made after sees this agent (a pull made before the ack may not).
    static func heartbeatAcked(_ uids: [String], over link: AgentLink) async throws -> Bool {
        try await link.heartbeat(activeUIDs: uids)
        while let frame = try await link.next() {
            if case .heartbeatAck? = frame.body { return true }
        }
        return false
    }

    /// Waits for the next pull command on `link` and accepts it.
    static func acceptNextPull(over link: AgentLink) async throws -> WirePullCommand {
        while let frame = try await link.next() {
            guard case .pullCommand(let command)? = frame.body else { continue }
            try await link.send(.with { $0.commandAccepted = .with { $0.commandID = command.commandID; $0.uploadID = command.commandID } })
            return command
        }
        throw AgentError("the server closed the connection before sending a pull")
    }

    /// Sends a whole upload through the sender state machine; returns how it ended.
    static func send(_ upload: SealedUpload, over link: AgentLink) async throws -> UploadOutcome {
        var sender = UploadSenderStateMachine(header: upload.header, window: Int(link.session.window))
        func perform(_ actions: [UploadSenderStateMachine.Action]) async throws -> UploadOutcome? {
            for action in actions {
                switch action {
                case .send(let frame): try await link.send(frame)
                case .sendChunk(let index):
                    let sealed = try upload.chunk(index)
                    try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = upload.header.uploadID; $0.index = index; $0.ciphertext = Data(sealed) } })
                case .finished(let result): return .finished(result)
                case .retryLater(let result): return .retryLater(result)
                }
            }
            return nil
        }
        if let outcome = try await perform(sender.resume()) { return outcome }
        while let frame = try await link.next() {
            if let outcome = try await perform(sender.receive(frame)) { return outcome }
        }
        throw AgentError("the server closed the connection during the upload")
    }

    /// The next frame that concerns `uploadID` (an error, a result, an ack), skipping others.
    static func answer(to uploadID: String, over link: AgentLink) async throws -> WireFrame? {
        while let frame = try await link.next() {
            switch frame.body {
            case .error(let e)? where e.uploadID == uploadID || uploadID.isEmpty || e.uploadID.isEmpty: return frame
            case .uploadResult(let r)? where r.uploadID == uploadID: return frame
            case .uploadReady(let r)? where r.uploadID == uploadID: return frame
            case .chunkAck(let r)? where r.uploadID == uploadID: return frame
            default: continue
            }
        }
        return nil
    }
}

enum UploadOutcome: Equatable {
    case finished(WireUploadResult)
    case retryLater(WireUploadResult)

    var result: WireUploadResult {
        switch self {
        case .finished(let r), .retryLater(let r): r
        }
    }
}

/// Log records kept in memory, to check what the server logged (its metadata, never wording).
final class LogCapture: LogHandler, @unchecked Sendable {
    struct Record {
        var level: Logger.Level
        var message: String
        var metadata: Logger.Metadata
    }

    private let lock = NSLock()
    private var stored: [Record] = []
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    var records: [Record] { lock.withLock { stored } }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
        lock.withLock { stored.append(Record(level: level, message: "\(message)", metadata: self.metadata.merging(metadata ?? [:]) { $1 })) }
    }
}

extension InProcessServer {
    /// Queues a pull straight in the queue (what the admin API does after resolving targets).
    @discardableResult
    func queuePull(uid: String = "", agentID: String, filter: LogFilter = .all, agents: [String]? = nil, lifetime: Duration = .seconds(3600)) async throws -> String {
        let pull = try issuer.newPull(uid: uid, agentID: agentID, filter: filter, targets: agents ?? [agentID], lifetime: lifetime, requestedBy: "t")
        try await pulls.create(pull)
        return pull.id
    }
}

/// Services run in one `ServiceGroup` for a test, in ``withStopping(_:_:)``: stopped
/// by a graceful shutdown, and a service that fails or does not end then fails the test.
final class RunningServices: StoppedAtTheEnd {
    private let group: ServiceGroup
    private let task: Task<Void, Error>

    init(_ services: [any Service]) {
        let group = ServiceGroup(services: services, logger: Logger(label: "test.services"))
        self.group = group
        task = Task { try await group.run() }
    }

    func stop() async throws {
        await group.triggerGracefulShutdown()
        try await task.value
    }
}
