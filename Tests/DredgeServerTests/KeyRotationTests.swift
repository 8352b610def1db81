import DredgeAdminAPI
@testable import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
@testable import DredgeServer
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Logging
import Testing

/// Rotating the server's command-signing and encryption keys (README § Key rotation), with the
/// real agent in this process against ``InProcessServer``: agents connected and returning take
/// the new keys without re-enrolling, an agent of the protocol before capabilities keeps being
/// served with the old ones through the overlap, and after it whoever still pins them is told
/// to enroll again.
@Suite struct KeyRotationTests {
    /// The real agent (``AgentClient``) run from a state it already has.
    final class Running: StoppedAtTheEnd, @unchecked Sendable {
        let client: AgentClient
        let task: Task<Void, Error>

        init(_ state: AgentState, store: String) throws {
            client = try AgentClient(state: state, store: try LogStore(path: store), hostInfo: .with { $0.hostname = "device" }, logger: Logger(label: "test.agent") { _ in SwiftLogNoOpLogHandler() })
            task = Task { [client] in try await client.run() }
        }

        func stop() async throws {
            task.cancel()
            if case .failure(let error) = await task.result, !(error is CancellationError) { throw error }
        }
    }

    static func enroll(_ server: InProcessServer, _ name: String) async throws -> AgentState {
        try await AgentEnrollment.enroll(
            host: "127.0.0.1", port: server.agentPort, caPEM: contents(server.data + "/ca.pem"), token: server.created.enrollmentToken,
            stateDirectory: server.dir.file(name), hostInfo: .with { $0.hostname = name })
    }

    static func store(_ server: InProcessServer, _ name: String) throws -> String {
        let path = server.dir.file(name + ".sqlite")
        try PullEndToEndTests.makeDeviceStore(path)
        return path
    }

    static func pinned(_ state: AgentState) throws -> PinnedServerKeys { try PinnedServerKeys(AgentState.load(from: state.directory).file) }

    static func waitFor(_ condition: () async throws -> Bool) async throws -> Bool { try await PullOutcomeTests.waitFor(.seconds(60), condition) }

    /// Agent A runs through the rotation, agent B is offline during it and comes back, and a
    /// link agent that lists no capabilities (one built to the protocol before them) stays
    /// connected throughout. A and B pin generation 2 (in their files and in the server's
    /// records), their pulls are signed with it and their feedback sealed for it, and both
    /// complete; the old agent is never sent an announcement and its commands still verify
    /// under the key it enrolled with, as long as the overlap lasts.
    @Test func agentsTakeTheNewKeysAndAnOldAgentIsServedThroughTheOverlap() async throws {
        try await withStopping(InProcessServer()) { server in
            let stateA = try await Self.enroll(server, "agent-a")
            let stateB = try await Self.enroll(server, "agent-b")
            let old = try await server.enrollAgent(hostname: "old")
            let capable = try await server.enrollAgent(hostname: "capable")
            let generation1 = try #require(server.issuer.keys.generation(1))
            #expect(try await server.registry.keyGeneration(of: stateA.file.agentID) == 1)

            let storeA = try Self.store(server, "device-a"), storeB = try Self.store(server, "device-b")
            try await withStopping(try Running(stateA, store: storeA)) { a in
                #expect(try await Self.waitFor { try await server.admin.agents().first(where: { $0.agentID == stateA.file.agentID })?.connected == true })
                try await old.connect(capabilities: []) { link in
                    // The old agent heartbeats meanwhile, as it would (acks read further down).
                    let beating = Task {
                        while !Task.isCancelled {
                            try await link.heartbeat(activeUIDs: ["u-1"])
                            try await Task.sleep(for: .seconds(1))
                        }
                    }
                    defer { beating.cancel() }
                    // The rotation, as `dredge-server keys rotate` makes it; the server picks it up.
                    let next = try ServerKeyRing.rotate(directory: server.data, overlap: .seconds(3_600))
                    #expect(next.number == 2)
                    #expect(try await Self.waitFor { server.issuer.keys.current.number == 2 })

                    // A takes it at its next heartbeat, and says so at the one after.
                    #expect(try await Self.waitFor { try Self.pinned(stateA).generation == 2 })
                    #expect(try await Self.waitFor { try await server.registry.keyGeneration(of: stateA.file.agentID) == 2 })
                    let pinnedA = try Self.pinned(stateA)
                    #expect(pinnedA.signing.rawRepresentation == next.signingKey.verifyingKey.rawRepresentation)
                    #expect(pinnedA.encryption == next.encryptionKey.publicKey)

                    // A's pull completes.
                    let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: stateA.file.agentID, filter: LogFilter(uid: "u-1")))
                    #expect(try await Self.waitFor { try await server.admin.pull(pull.id).targets.first?.status == .complete })
                    // What a capable agent is sent, seen on the wire: the announcement, signed by
                    // generation 1's key; once it says it pins generation 2, commands signed with
                    // generation 2's key alone.
                    try await capable.connect(keyGeneration: 1) { (wire: AgentLink) async throws -> Void in
                        try await wire.heartbeat(activeUIDs: ["u-1"])
                        var announced: [WireKeyAnnouncement] = []
                        while let frame = try await wire.next() {
                            if case .heartbeatAck(let ack)? = frame.body {
                                announced = ack.keyAnnouncements
                                break
                            }
                        }
                        #expect(announced.map(\.generation) == [2])
                        #expect(announced.first.map { generation1.signingKey.verifyingKey.isValid($0) } == true)
                        wire.pinned(2)
                        #expect(try await LinkAgent.heartbeatAcked(["u-1"], over: wire))
                        #expect(try await server.registry.keyGeneration(of: capable.agentID) == 2)
                        _ = try await server.admin.createPull(PullRequest(uid: nil, agent: capable.agentID, filter: LogFilter(uid: "u-1")))
                        let command = try await LinkAgent.acceptNextPull(over: wire)
                        #expect(next.signingKey.verifyingKey.isValid(command))
                        #expect(!generation1.signingKey.verifyingKey.isValid(command))
                    }
                    // Feedback made now is sealed for generation 2's key alone (made from a copy
                    // of A's state, so that A does not send it meanwhile).
                    let copy = server.dir.file("agent-a-copy")
                    try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
                    for name in ["agent.json", "agent-key.pem", "ca.pem"] {
                        try FileManager.default.copyItem(atPath: stateA.directory + "/" + name, toPath: copy + "/" + name)
                    }
                    let sealed = try Feedback.submit(uid: "u-1", text: "sealed", state: try AgentState.load(from: copy), store: try LogStore(path: storeA))
                    let header = try WireUploadHeader(serializedBytes: try Data(contentsOf: URL(fileURLWithPath: copy + "/uploads/" + sealed + "/header.pb")))
                    #expect(throws: Never.self) { try next.encryptionKey.unwrapKey(Array(header.wrappedKey)) }
                    #expect(throws: (any Error).self) { try generation1.encryptionKey.unwrapKey(Array(header.wrappedKey)) }
                    // A's own feedback opens.
                    let feedback = try await a.client.submitFeedback(uid: "u-1", text: "after the rotation")
                    // (Not listed until its upload begins.)
                    #expect(try await Self.waitFor { (try? await server.admin.feedback(feedback))?.status == .complete })

                    // The old agent: nothing announced, its commands signed with the key it has.
                    let oldPull = try await server.admin.createPull(PullRequest(uid: nil, agent: old.agentID, filter: LogFilter(uid: "u-1")))
                    var announced = 0
                    var received: WirePullCommand?
                    try await link.heartbeat(activeUIDs: ["u-1"])
                    while received == nil, let frame = try await link.next() {
                        switch frame.body {
                        case .heartbeatAck(let ack)?: announced += ack.keyAnnouncements.count
                        case .pullCommand(let command)?: received = command
                        default: break
                        }
                    }
                    let oldCommand = try #require(received)
                    #expect(oldCommand.commandID == oldPull.id)
                    #expect(generation1.signingKey.verifyingKey.isValid(oldCommand))
                    #expect(announced == 0)
                    #expect(try await server.registry.keyGeneration(of: old.agentID) == 1)
                }
            }

            // What a scrape says meanwhile: B and the old agent are behind, and when they will be cut off.
            let metrics = ServerMetrics()
            metrics.addSampler(ServerPersistence(try ServerStores(try LoadedDeployment(directory: server.data))).sampler(into: metrics))
            let samples = MetricsTests.samples(String(decoding: await metrics.exposition(), as: UTF8.self))
            #expect(samples["dredge_server_key_generation"] == 2)
            #expect(samples["dredge_agents_on_retiring_keys"] == 2)  // B and the old agent
            let retires = try #require(samples["dredge_server_keys_retire_timestamp_seconds"])
            #expect(abs(retires - Date().addingTimeInterval(3_600).timeIntervalSince1970) < 300)

            // B was offline through all of it: it comes back and takes the new keys.
            #expect(try Self.pinned(stateB).generation == 1)
            try await withStopping(try Running(stateB, store: storeB)) { b in
                #expect(try await Self.waitFor { try Self.pinned(stateB).generation == 2 })
                #expect(try await Self.waitFor { try await server.registry.keyGeneration(of: stateB.file.agentID) == 2 })
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: stateB.file.agentID, filter: LogFilter(uid: "u-1")))
                #expect(try await Self.waitFor { try await server.admin.pull(pull.id).targets.first?.status == .complete })
                _ = b
            }
            #expect(try await server.registry.keyGenerations() == [1: 1, 2: 3])
        }
    }

    /// After the overlap: an agent that pins the retired generation (an old one, and a capable
    /// one that was offline throughout) is refused with `ERROR_KEYS_RETIRED`, which says to
    /// enroll again; a new enrollment gets the current keys and works. The retired private keys
    /// are forgotten, and the current ones are in `signing-key` and `encryption-key.pem`.
    @Test func afterTheOverlapAgentsOnRetiredKeysAreToldToEnrollAgain() async throws {
        try await withStopping(InProcessServer()) { server in
            let old = try await server.enrollAgent(hostname: "old")
            let capable = try await server.enrollAgent(hostname: "capable")
            // A rotation two hours ago with an hour's overlap: generation 1 retired an hour ago.
            let next = try ServerKeyRing.rotate(directory: server.data, overlap: .seconds(3_600), now: Date().addingTimeInterval(-7_200))
            #expect(try await Self.waitFor { server.issuer.keys.current.number == 2 })

            for (agent, capabilities, said) in [(old, [String](), 0), (capable, AgentLink.capabilities, 1), (capable, AgentLink.capabilities, 0)] {
                let error = await #expect(throws: AgentError.self) {
                    try await agent.connect(capabilities: capabilities, keyGeneration: said) { _ in }
                }
                #expect(error?.description.contains("errorKeysRetired") == true, "\(String(describing: error))")
                #expect(error?.description.contains("enroll it again") == true, "\(String(describing: error))")
            }
            let samples = MetricsTests.samples(String(decoding: await server.listener.metrics.exposition(), as: UTF8.self))
            #expect(samples["dredge_agent_connections_refused_total{cause=\"keys_retired\"}"] == 3)

            // Re-enrolled (a new key), the device works again.
            let again = try await server.enrollAgent(hostname: "old")
            #expect(try await server.registry.keyGeneration(of: again.agentID) == 2)
            try await again.connect(capabilities: []) { link in
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: again.agentID, filter: LogFilter(uid: "u-1")))
                var received: WirePullCommand?
                while received == nil, let frame = try await link.next() {
                    if case .pullCommand(let command)? = frame.body { received = command }
                }
                #expect(received?.commandID == pull.id)
                #expect(received.map { next.signingKey.verifyingKey.isValid($0) } == true)
            }

            // The server's look forgot generation 1's private keys.
            #expect(try await Self.waitFor { try ServerKeyRing.read(directory: server.data).map(\.number) == [2] })
            let onDisk = try LoadedDeployment(directory: server.data)
            #expect(onDisk.signingKey.rawRepresentation == next.signingKey.rawRepresentation)
            #expect(onDisk.keys.all.count == 1)
        }
    }

    /// An agent whose state came from a release that kept no generation, enrolled after a
    /// rotation (so it holds generation 2's keys), then upgraded: it says none, the server uses
    /// what it recorded, and the next rotation's announcement (signed by generation 2's key) is
    /// the one it takes.
    @Test func anAgentThatKeptNoGenerationTakesTheNextAnnouncementItsKeyVerifies() async throws {
        try await withStopping(InProcessServer()) { server in
            try ServerKeyRing.rotate(directory: server.data, overlap: .seconds(3_600))
            #expect(try await Self.waitFor { server.issuer.keys.current.number == 2 })
            var state = try await Self.enroll(server, "upgraded")
            #expect(try Self.pinned(state).generation == 2)
            #expect(try await server.registry.keyGeneration(of: state.file.agentID) == 2)
            // What an agent of the earlier release would have written: no generation.
            state.file.keyGeneration = nil
            try state.saveFile()
            #expect(try !Self.pinned(state).isGenerationKnown)

            try ServerKeyRing.rotate(directory: server.data, overlap: .seconds(3_600))
            #expect(try await Self.waitFor { server.issuer.keys.current.number == 3 })
            try await withStopping(try Running(state, store: try Self.store(server, "upgraded"))) { _ in
                #expect(try await Self.waitFor { try Self.pinned(state).generation == 3 })
                #expect(try Self.pinned(state).isGenerationKnown)
                #expect(try await Self.waitFor { try await server.registry.keyGeneration(of: state.file.agentID) == 3 })
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: state.file.agentID, filter: LogFilter(uid: "u-1")))
                #expect(try await Self.waitFor { try await server.admin.pull(pull.id).targets.first?.status == .complete })
            }
        }
    }

    /// A connected agent whose generation retires while it is connected is told at its next
    /// heartbeat and closed; one that says a generation the server does not have keeps what it
    /// had and is served on.
    @Test func anAgentConnectedWhenItsKeysRetireIsClosedAndABogusGenerationIsIgnored() async throws {
        try await withStopping(InProcessServer()) { server in
            let old = try await server.enrollAgent(hostname: "old")
            let capable = try await server.enrollAgent(hostname: "capable")
            try await capable.connect(keyGeneration: 1) { (link: AgentLink) async throws -> Void in
                link.pinned(99)
                #expect(try await LinkAgent.heartbeatAcked([], over: link))
                #expect(try await LinkAgent.heartbeatAcked([], over: link))
                #expect(try await server.registry.keyGeneration(of: capable.agentID) == 1)
            }
            try await old.connect(capabilities: []) { link in
                #expect(try await LinkAgent.heartbeatAcked([], over: link))
                // Generation 1 retires two seconds from now.
                try ServerKeyRing.rotate(directory: server.data, overlap: .seconds(2))
                #expect(try await Self.waitFor { server.issuer.keys.current.number == 2 })
                var error: (any Error)?
                do {
                    // A heartbeat every half second (for at most a minute) until the server closes.
                    for _ in 0..<120 {
                        try await link.heartbeat(activeUIDs: [])
                        guard try await link.next() != nil else { break }
                        try await Task.sleep(for: .milliseconds(500))
                    }
                } catch let closed {
                    error = closed
                }
                #expect("\(String(describing: error))".contains("errorKeysRetired"), "\(String(describing: error))")
            }
        }
    }

    /// A second rotation with a shorter overlap (after a leak) retires every older generation
    /// with it: the ring stays whole as they retire, and an agent two generations behind takes
    /// both announcements and accepts the oldest key no longer than the newest says.
    @Test func aShorterSecondOverlapRetiresTheOlderKeysWithIt() throws {
        let dir = TempDir()
        let data = dir.file("server")
        _ = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
        let t0 = Date(timeIntervalSince1970: 1_800_000_000)
        let first = try #require(try ServerKeyRing.read(directory: data).first)
        try ServerKeyRing.rotate(directory: data, overlap: .seconds(30 * 86_400), now: t0)
        try ServerKeyRing.rotate(directory: data, overlap: .seconds(86_400), now: t0.addingTimeInterval(86_400))
        let ring = try ServerKeyRing.read(directory: data)
        #expect(ring.map(\.number) == [1, 2, 3])
        #expect(ring[0].retiresAt == t0.addingTimeInterval(2 * 86_400), "generation 1 retires with generation 2, not 28 days later")
        #expect(ring[1].retiresAt == t0.addingTimeInterval(2 * 86_400))

        // An agent of generation 1, a day and a half in: it takes both.
        let file = AgentState.File(
            agentID: "a", serverHost: "h", serverPort: 1, servers: nil, serverSigningKey: Hex.encode(first.signingKey.verifyingKey.rawRepresentation),
            serverEncryptionKey: Hex.encode(first.encryptionKey.publicKey.spki), enrolledAt: t0, keyGeneration: 1)
        let keys = try PinnedServerKeys(file).adopting(ring.compactMap(\.announcement), now: Timestamp(t0.addingTimeInterval(1.5 * 86_400)))
        #expect(keys.generation == 3)
        #expect(keys.previous.map { $0.retiresAtUs } == [Timestamp(t0.addingTimeInterval(2 * 86_400)).microseconds, Timestamp(t0.addingTimeInterval(2 * 86_400)).microseconds])

        // Three days in, both retired: the server forgets them, and the ring reads whole.
        #expect(try ServerKeyRing.dropRetired(directory: data, now: t0.addingTimeInterval(3 * 86_400)) == 2)
        #expect(try ServerKeyRing.read(directory: data).map(\.number) == [3])
        #expect(throws: DeploymentError.self) { try ServerKeyRing.rotate(directory: data, overlap: .seconds(3_651 * 86_400)) }
    }

    /// A key ring that is damaged is refused with its path, and the server's keys stay as they
    /// were read; a rotation on a damaged ring writes nothing.
    @Test func aDamagedKeyRingIsRefusedAndNothingIsLost() async throws {
        let dir = TempDir()
        let data = dir.file("server")
        _ = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
        let keys = try KeyRing(directory: data)
        try ServerKeyRing.rotate(directory: data)
        #expect(try keys.reloadIfChanged())
        let good = try Data(contentsOf: URL(fileURLWithPath: data + "/keyring.json"))
        for damage in [Data("{".utf8), Data(#"{"format":2,"generations":[]}"#.utf8), Data(#"{"format":1,"generations":[]}"#.utf8)] {
            try damage.write(to: URL(fileURLWithPath: data + "/keyring.json"))
            let error = #expect(throws: DeploymentError.self) { try keys.reloadIfChanged() }
            #expect(error?.description.contains("keyring.json") == true, "\(String(describing: error))")
            #expect(keys.current.number == 2, "the keys read before are kept")
            #expect(throws: DeploymentError.self) { try ServerKeyRing.rotate(directory: data) }
            #expect(try Data(contentsOf: URL(fileURLWithPath: data + "/keyring.json")) == damage, "a rotation on a damaged ring wrote")
        }
        try good.write(to: URL(fileURLWithPath: data + "/keyring.json"))
        #expect(try ServerKeyRing.rotate(directory: data).number == 3)
    }
}
