import Crypto
import DredgeAdminAPI
import DredgeAdminClient
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing
@testable import DredgeServer

/// Live tails through the real server's connection wing (#53, Protocol § 20): the agent's
/// ``TailManager`` on a real device store, over a real TLS connection, against the listener's
/// delivery and reception, the registry and the files.
@Suite struct LiveTailTests {
    static let liveTail = [WireCapability.keyRotation, WireCapability.liveTail]

    /// The pinned server keys an agent of `server` holds.
    static func keys(_ server: InProcessServer, agentID: String) throws -> PinnedServerKeys {
        let deployment = try LoadedDeployment(directory: server.data)
        return try PinnedServerKeys(
            AgentState.File(
                agentID: agentID, serverHost: "127.0.0.1", serverPort: server.agentPort, servers: nil,
                serverSigningKey: Hex.encode(deployment.signingKey.verifyingKey.rawRepresentation), serverEncryptionKey: Hex.encode(deployment.encryptionKey.publicKey.spki),
                enrolledAt: Date(), keyGeneration: 1))
    }

    static func log(_ store: LogStore, _ context: ContextID, _ messages: [String], uid: String = "u-1", level: LogLevel = .warning) throws {
        for message in messages {
            store.enqueue(LogEntry(timestamp: .now, level: level, type: .app, uid: uid, message: message, metadata: [:], context: context))
        }
        try store.flush()
    }

    /// Runs the agent's side of its tails on `link` as the agent does: every tail frame to the
    /// manager as it arrives, a pass every 50 ms, until `done`; then says goodbye.
    static func run(
        _ manager: TailManager, on link: AgentLink, keys: PinnedServerKeys, heartbeat: [String]? = nil, until done: @escaping @Sendable () async throws -> Bool
    ) async throws {
        let start = ContinuousClock.now
        @Sendable func clock() -> Double { Double((ContinuousClock.now - start).components.attoseconds) / 1e18 + Double((ContinuousClock.now - start).components.seconds) }
        try await manager.connected { frame in try await link.send(frame) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                while let frame = try await link.next() {
                    switch frame.body {
                    case .tailCommand?, .tailAck?, .tailStop?: try await manager.receive(frame, serverKeys: keys, clock: clock())
                    default: break
                    }
                }
            }
            if let heartbeat { try await link.heartbeat(activeUIDs: heartbeat) }
            let deadline = ContinuousClock.now + .seconds(120)
            var lastHeartbeat = ContinuousClock.now
            while try await !done() {
                guard ContinuousClock.now < deadline else { throw AgentError("the tail did not get there in 2 minutes") }
                try await manager.step(clock: clock())
                // Heartbeats as the agent sends them: a connection silent too long is closed.
                if ContinuousClock.now - lastHeartbeat >= .milliseconds(500) {
                    try await link.heartbeat(activeUIDs: heartbeat ?? [])
                    lastHeartbeat = .now
                }
                try await Task.sleep(for: TailManager.pollInterval)
            }
            link.goodbye("done")
            try await group.waitForAll()
        }
        await manager.disconnected()
    }

    static func part(_ server: InProcessServer, _ tailID: String, _ agentID: String) async throws -> TailPart? {
        try await server.tails.tail(tailID)?.parts.first { $0.agentID == agentID }
    }

    /// The messages `records.jsonl` holds, in order.
    static func messages(_ server: InProcessServer, _ tailID: String, _ agentID: String) throws -> [String] {
        let directory = try DataDirectory(server.data).tailFiles(tailID, agent: agentID)
        let data = try Data(contentsOf: URL(fileURLWithPath: directory + "/" + TailFiles.records))
        return try data.split(separator: 0x0A).map { line in
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line)) as? [String: Any])
            return try #require(object["message"] as? String)
        }
    }

    /// An agent that offers `live-tail` and holds the tail's user gets the tail once it reports
    /// the user; the records it then logs that match reach the server's files in order, each
    /// once, across a new connection (the agent accepts again and goes on after what the server
    /// holds); records of another user, below the filter's levels, or logged before the tail are
    /// not sent.
    @Test func anAgentStreamsItsUsersNewRecordsAcrossConnections() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent(hostname: "kitchen")
            let store = try LogStore(path: server.dir.file("device.sqlite"))
            let context = try store.register(LogContext(host: "kitchen", os: "Linux", app: "oven", appVersion: "2.4.1", process: "ovend"))
            try Self.log(store, context, ["before-1", "before-2"])
            let tail = server.issuer.newTail(
                uid: "u-1", agents: nil, filter: LogFilter(levels: [.warning, .error]), lifetime: .seconds(600), recordsPerSecond: 1_000, bytesPerSecond: 1 << 20,
                verbose: false, verboseTypes: [], requestedBy: "alice", reason: "T-1")
            try await server.tails.create(tail)
            let manager = TailManager(store: store, agentID: agent.agentID, agentKey: agent.key)
            let keys = try Self.keys(server, agentID: agent.agentID)

            try await agent.connect(capabilities: Self.liveTail) { link in
                try await Self.run(manager, on: link, keys: keys, heartbeat: ["u-1"]) {
                    guard let part = try await Self.part(server, tail.id, agent.agentID), part.status == .running else { return false }
                    if await manager.running.isEmpty { return false }
                    if try store.lastRowID() < 5 {
                        try Self.log(store, context, ["w3", "w4"])
                        try Self.log(store, context, ["other user"], uid: "u-2")
                        try Self.log(store, context, ["quiet"], level: .info)
                        try Self.log(store, context, ["w5"])
                    }
                    return part.records == 3
                }
            }
            #expect(try Self.messages(server, tail.id, agent.agentID) == ["w3", "w4", "w5"])

            // Away: what it logs meanwhile is sent once it is back, after what the server holds.
            try Self.log(store, context, ["w6", "w7"])
            try await agent.connect(capabilities: Self.liveTail) { link in
                try await Self.run(manager, on: link, keys: keys) { try await Self.part(server, tail.id, agent.agentID)?.records == 5 }
            }
            #expect(try Self.messages(server, tail.id, agent.agentID) == ["w3", "w4", "w5", "w6", "w7"])
            let part = try #require(try await Self.part(server, tail.id, agent.agentID))
            #expect(part.status == .running && part.dropped == 0 && part.heldSeq >= 2 && part.startCursor == 2)
            let directory = try DataDirectory(server.data).tailFiles(tail.id, agent: agent.agentID)
            #expect(try TailFiles.knownContexts(in: directory).numbers == [context.rawValue])

            // Stopped, what it held is searchable as a source of its own, named by the device;
            // bytes past what was recorded as held (a batch cut short by a crash) are not.
            let unheld = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/" + TailFiles.records))
            try unheld.seekToEnd()
            try unheld.write(contentsOf: Data(#"{"ts":"2026-11-30T10:00:00.000000Z","level":"warning","type":"app","uid":"u-1","message":"not held","metadata":{},"context":1}"#.utf8 + [0x0A]))
            try unheld.close()
            _ = try await server.admin.stopTail(tail.id, reason: "done")
            var found: [FoundRecord] = []
            for _ in 0..<600 {
                found = try await server.admin.search(RecordSearch(uid: "u-1", limit: 100)).records
                if found.count >= 5 { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(found.map(\.message) == ["w3", "w4", "w5", "w6", "w7"])
            #expect(found.allSatisfy { $0.sourceKind == "tail" && $0.sourceID == tail.id && $0.host == "kitchen" && $0.app == "oven" })
        }
    }

    /// Another enrolled agent cannot take part in a tail that is not its own: accepting it,
    /// or sending batches into it, gets a `TailStop`, and the tail's own part is unchanged.
    @Test func anotherAgentCannotJoinOrFeedATail() async throws {
        try await withStopping(InProcessServer()) { server in
            let owner = try await server.enrollAgent(hostname: "owner")
            let intruder = try await server.enrollAgent(hostname: "intruder")
            let tail = server.issuer.newTail(
                uid: "u-1", agents: [owner.agentID], filter: LogFilter(), lifetime: .seconds(600), recordsPerSecond: 1_000, bytesPerSecond: 1 << 20,
                verbose: false, verboseTypes: [], requestedBy: "alice", reason: "")
            try await server.tails.create(tail)
            // The owner's part exists (delivered).
            try await owner.connect(capabilities: Self.liveTail) { link in
                try await link.heartbeat(activeUIDs: ["u-1"])
                while let frame = try await link.next() { if case .tailCommand? = frame.body { break } }
            }
            let before = try #require(try await Self.part(server, tail.id, owner.agentID))
            try await intruder.connect(capabilities: Self.liveTail) { link in
                try await link.heartbeat(activeUIDs: ["u-1"])
                try await link.send(.with { $0.tailAccepted = .with { $0.tailID = tail.id; $0.startCursor = 0 } })
                try await link.send(.with {
                    $0.tailBatch = .with { $0.tailID = tail.id; $0.seq = 1; $0.cursor = 1; $0.nonce = Data(count: 12); $0.ciphertext = Data(count: 64) }
                })
                var stops = 0
                while stops < 2, let frame = try await link.next() {
                    if case .tailCommand? = frame.body { Issue.record("the intruder was sent the tail") }
                    if case .tailStop(let stop)? = frame.body, stop.tailID == tail.id { stops += 1 }
                }
                #expect(stops == 2)
            }
            #expect(try await server.tails.tail(tail.id)?.parts.map(\.agentID) == [owner.agentID])
            #expect(try await Self.part(server, tail.id, owner.agentID) == before)
        }
    }

    /// Through the admin API: a tail is started (audited), a watcher gets the device's records
    /// named by its host and app, in order; the engineer stops it, the watcher's stream ends
    /// with the reason, and the device stops running it (told by the server).
    @Test func anEngineerStartsWatchesAndStopsATailThroughTheAPI() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent(hostname: "kitchen")
            let store = try LogStore(path: server.dir.file("device.sqlite"))
            let context = try store.register(LogContext(host: "kitchen", os: "Linux", app: "oven", appVersion: "2.4.1", process: "ovend"))
            let manager = TailManager(store: store, agentID: agent.agentID, agentKey: agent.key)
            let keys = try Self.keys(server, agentID: agent.agentID)
            // The agent reports its user first, so the tail finds it.
            try await agent.connect(capabilities: Self.liveTail) { link in _ = try await LinkAgent.heartbeatAcked(["u-1"], over: link) }
            let tail = try await server.admin.createTail(TailRequest(uid: "u-1", filter: LogFilter(levels: [.warning]), durationSeconds: 600, reason: "T-9"))
            #expect(tail.uid == "u-1" && tail.requestedBy == "admin" && tail.reason == "T-9" && tail.agents == nil)
            #expect(try await server.admin.tails().map(\.id) == [tail.id])

            let seen = Seen()
            let watching = Task {
                try await server.admin.watchTail(tail.id) { event in await seen.add(event) }
            }
            // Watching from its first line (the devices) on: what is held from then is shown.
            while await seen.events == 0 { try await Task.sleep(for: .milliseconds(20)) }
            try await agent.connect(capabilities: Self.liveTail) { link in
                try await Self.run(manager, on: link, keys: keys, heartbeat: ["u-1"]) {
                    // Once stopped: done when the device heard of it.
                    if await seen.stopped { return await manager.running.isEmpty }
                    guard await !manager.running.isEmpty else { return false }
                    if try store.lastRowID() == 0 { try Self.log(store, context, ["a", "b", "c"]) }
                    guard await seen.messages.count == 3 else { return false }
                    // Stopped by the engineer: the device is told, and stops.
                    if await seen.stopped == false {
                        await seen.markStopped()
                        let stopped = try await server.admin.stopTail(tail.id, reason: "seen enough")
                        #expect(stopped.stopped?.reason == "seen enough" && stopped.stopped?.by == "admin")
                    }
                    return await manager.running.isEmpty
                }
            }
            try await watching.value
            #expect(await seen.messages == ["a", "b", "c"])
            #expect(await seen.hosts == ["kitchen"])
            #expect(await seen.apps == ["oven"])
            #expect(await seen.end == "seen enough")
            let audit = try await server.pulls.audit(limit: 20)
            #expect(audit.contains { $0.action == "tail" && $0.detail.contains("reason \"T-9\"") })
            #expect(audit.contains { $0.action == "tail.stop" && $0.detail.contains("1 device(s): \(agent.agentID) (ended, 3 records, 0 left out)") })
            // Stopped once: a second stop is a conflict, and a watcher now gets the end at once.
            await #expect(throws: AdminClientError.self) { try await server.admin.stopTail(tail.id) }
            let late = Seen()
            try await server.admin.watchTail(tail.id) { await late.add($0) }
            #expect(await late.end == "seen enough")
        }
    }

    /// Bad requests are refused with the reason, and nothing is stored.
    @Test func badTailRequestsAreRefused() async throws {
        try await withStopping(InProcessServer()) { server in
            for bad in [
                TailRequest(uid: ""), TailRequest(uid: "u-1", durationSeconds: 3_601), TailRequest(uid: "u-1", durationSeconds: 0),
                TailRequest(uid: "u-1", recordsPerSecond: 0), TailRequest(uid: "u-1", bytesPerSecond: 10), TailRequest(uid: "u-1", filter: LogFilter(uid: "u-2")),
                TailRequest(uid: "u-1", verboseTypes: ["Not A Type"]), TailRequest(uid: "u-1", agent: "../x"), TailRequest(uid: "u-1", reason: "a\nb"),
                TailRequest(uid: "u-1", host: "nowhere"),
            ] {
                await #expect(throws: AdminClientError.self, "\(bad)") { try await server.admin.createTail(bad) }
            }
            #expect(try await server.admin.tails().isEmpty)
            #expect(try await server.pulls.audit(limit: 10).allSatisfy { $0.action != "tail" })
            // Caps: five open per engineer.
            for _ in 0..<AdminActions.maxOpenTailsPerCaller { _ = try await server.admin.createTail(TailRequest(uid: "u-1")) }
            await #expect(throws: AdminClientError.self) { try await server.admin.createTail(TailRequest(uid: "u-1")) }
            #expect(try await server.admin.tails().count == AdminActions.maxOpenTailsPerCaller)
        }
    }

    /// Revoking an engineer's token stops the tails they started (Protocol § 20, Stopping), by
    /// the server, audited, and their watchers end with the reason.
    @Test func revokingATokenStopsItsTails() async throws {
        try await withStopping(InProcessServer()) { server in
            let created = try await server.admin.createToken(TokenRequest(name: "ines", kind: .admin, role: .investigator))
            let ines = try AdminClient(server: server.adminURL, token: created.token)
            let tail = try await ines.createTail(TailRequest(uid: "u-1", reason: "T-2"))
            let other = try await server.admin.createTail(TailRequest(uid: "u-1"))
            let seen = Seen()
            let watching = Task { try await server.admin.watchTail(tail.id) { await seen.add($0) } }
            // The watcher is subscribed once its first line (the devices) is in.
            while await seen.events == 0 { try await Task.sleep(for: .milliseconds(20)) }
            try await server.admin.revokeToken(kind: .admin, name: "ines")
            try await watching.value
            #expect(await seen.end == "the token of ines was revoked")
            let stopped = try await server.admin.tail(tail.id)
            #expect(stopped.stopped?.by == "server" && stopped.stopped?.reason == "the token of ines was revoked")
            #expect(try await server.admin.tail(other.id).stopped == nil, "another engineer's tail runs on")
            #expect(try await server.pulls.audit(limit: 10).contains { $0.action == "tail.stop" && $0.actor == "server" && $0.detail.contains(tail.id) })
        }
    }

    /// A watcher is shown what another node of a cluster stored (the nodes share the data
    /// directory and the registry): here a device whose batches no connection of this server
    /// took. Only what is recorded as held is shown, each record once, with its device's app.
    @Test func aWatcherSeesWhatAnotherNodeStored() async throws {
        try await withStopping(InProcessServer()) { server in
            let tail = try await server.admin.createTail(TailRequest(uid: "u-1"))
            let agent = String(repeating: "ab", count: 16)
            // "The other node": the part delivered, accepted, and batches held, by the registry and files alone.
            _ = try await server.tails.deliver(tail.id, agent: agent, wrappedKey: try server.issuer.newTailKey(), at: Date())
            _ = try await server.tails.accepted(tail.id, agent: agent, startCursor: 0, at: Date())
            let directory = try DataDirectory(server.data).tailFiles(tail.id, agent: agent)
            var known: TailFiles.KnownContexts?
            var held: Int64 = 0
            func hold(_ seq: UInt64, _ messages: [String], level: String = "warning") async throws {
                let records = messages.map { Array(#"{"ts":"2026-11-30T10:00:00.000000Z","level":"\#(level)","type":"app","uid":"u-1","message":"\#($0)","metadata":{"k":"v \"q\""},"context":3}"#.utf8) }
                let batch = TailBatchReader.Batch(records: records, contexts: [3: Array(#"{"app":"till","appVersion":"1.0","host":"far","os":"Linux","process":"tilld"}"#.utf8)], times: records.map { _ in 0 })
                held = try TailFiles.append(batch, after: held, known: &known, in: directory)
                #expect(try await server.tails.held(tail.id, agent: agent, seq: seq, cursor: seq, records: messages.count, dropped: 0, bytes: held, at: Date()))
            }
            let seen = Seen()
            let watching = Task { try await server.admin.watchTail(tail.id) { await seen.add($0) } }
            while await seen.events == 0 { try await Task.sleep(for: .milliseconds(20)) }
            try await hold(1, ["x1", "x2"])
            // One the indexer's scanner does not read as a record (a level it does not know): shown all the same.
            try await hold(2, ["x3"], level: "loud")
            // Written but never recorded as held: not shown.
            var unheld: TailFiles.KnownContexts? = known
            _ = try TailFiles.append(
                TailBatchReader.Batch(records: [Array(#"{"ts":"2026-11-30T10:00:00.000000Z","level":"warning","type":"app","uid":"u-1","message":"unheld","metadata":{},"context":3}"#.utf8)], contexts: [:], times: [0]),
                after: held, known: &unheld, in: directory)
            for _ in 0..<400 where await seen.messages.count < 3 { try await Task.sleep(for: .milliseconds(25)) }
            _ = try await server.admin.stopTail(tail.id)
            try await watching.value
            #expect(await seen.messages == ["x1", "x2", "x3"])
            // Each record whole, as the device sent it (spliced into the stream as stored, or decoded).
            #expect(await seen.metadata == Array(repeating: JSONValue.object(["k": .string(#"v "q""#)]), count: 3))
            #expect(await seen.apps == ["till"])
        }
    }
}

/// What a watcher was sent.
actor Seen {
    var events = 0
    var messages: [String] = []
    var metadata: [JSONValue] = []
    var hosts: Set<String> = []
    var apps: Set<String> = []
    var end: String?
    var stopped = false

    func add(_ event: TailEvent) {
        events += 1
        switch event.kind {
        case .record:
            if case .object(let members)? = event.record, case .string(let message)? = members["message"] {
                messages.append(message)
                metadata.append(members["metadata"] ?? .null)
            }
            if let host = event.host { hosts.insert(host) }
            if let app = event.app { apps.insert(app) }
        case .end: end = event.reason
        default: break
        }
    }

    func markStopped() { stopped = true }
}
