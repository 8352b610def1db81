import DredgeDomain
import DredgeEnvelope
import DredgeTestSupport
import DredgeWire
import Foundation
import NIOCore
import Testing

let testAgentKey = try! RSAPrivateKey.generate()
let testHost = WireHostInfo.with { $0.hostname = "kitchen-oven-0042"; $0.os = "Linux"; $0.app = "oven-control"; $0.appVersion = "2.4.1" }

/// The agent's and the server's connection machines, run against each other with no sockets:
/// every frame goes through the real encoder and decoder, and the crypto is the real envelope.
struct Loopback {
    var agent: AgentConnectionStateMachine
    var server = ServerConnectionStateMachine()
    var toServer: [ByteBuffer] = []
    var toAgent: [ByteBuffer] = []
    var agentDelivered: [WireFrame] = []
    var serverDelivered: [WireFrame] = []
    var agentClosed: WireProtocolError?? = nil
    var agentPlannedReturn: PlannedReturn?
    var serverClosed: WireProtocolError?? = nil
    var enrolledKeys: [String: RSAPublicKey] = [:]
    var enrollment: WireEnrollResponse?
    let key: RSAPrivateKey

    init(mode: AgentConnectionStateMachine.Mode, key: RSAPrivateKey = testAgentKey, enrolled: Bool = true) {
        agent = AgentConnectionStateMachine(mode: mode)
        self.key = key
        if enrolled { enrolledKeys[key.publicKey.agentID] = key.publicKey }
    }

    mutating func agentActions(_ actions: [AgentConnectionStateMachine.Action]) throws {
        for action in actions {
            switch action {
            case .send(let frame): toServer.append(ByteBuffer(bytes: try FrameEncoder.bytes(of: frame)))
            case .signChallenge(let challenge):
                guard case .authenticate(let id, _) = agent.mode else { continue }
                try agentActions(agent.signed(try AgentAuthentication.sign(challenge: challenge, agentID: id, with: key)))
            case .deliver(let frame): agentDelivered.append(frame)
            case .close(let error): agentClosed = .some(error)
            case .plannedReturn(let planned): agentPlannedReturn = planned
            case .established, .enrolled(_): if case .enrolled(let r) = action { enrollment = r }
            }
        }
    }

    mutating func serverActions(_ actions: [ServerConnectionStateMachine.Action]) throws {
        for action in actions {
            switch action {
            case .send(let frame): toAgent.append(ByteBuffer(bytes: try FrameEncoder.bytes(of: frame)))
            case .verify(let agentID, let signature, let challenge, _):
                if let publicKey = enrolledKeys[agentID], AgentAuthentication.verify(signature: signature, challenge: challenge, publicKey: publicKey) {
                    try serverActions(server.authenticated(agentID))
                } else {
                    try serverActions(server.authenticationFailed("unknown agent or bad signature"))
                }
            case .enroll(let request):
                if request.token == "good-token", let publicKey = try? RSAPublicKey(spki: request.publicKey) {
                    enrolledKeys[publicKey.agentID] = publicKey
                    try serverActions(server.enrolled(.with { $0.agentID = publicKey.agentID; $0.serverSigningKey = Data(repeating: 1, count: 32) }))
                } else {
                    try serverActions(server.enrollmentFailed("bad token"))
                }
            case .deliver(_, let frame): serverDelivered.append(frame)
            case .registered: break
            case .close(let error): serverClosed = .some(error)
            }
        }
    }

    /// Moves bytes both ways until nothing is pending.
    mutating func run() throws {
        while !toServer.isEmpty || !toAgent.isEmpty {
            while var buffer = toServer.first {
                toServer.removeFirst()
                while let frame = try FrameDecoder.decodeFrame(from: &buffer) {
                    try serverActions(server.receive(frame, challenge: secureRandomBytes(32)))
                }
            }
            while var buffer = toAgent.first {
                toAgent.removeFirst()
                while let frame = try FrameDecoder.decodeFrame(from: &buffer) { try agentActions(agent.receive(frame)) }
            }
        }
    }
}

@Suite struct ConnectionStateMachineTests {
    @Test func anEnrolledAgentAuthenticatesAndExchangesFrames() throws {
        var net = Loopback(mode: .authenticate(agentID: testAgentKey.publicKey.agentID, host: testHost))
        try net.agentActions(net.agent.start())
        try net.run()
        #expect(net.agent.isReady)
        #expect(net.server.agentID == testAgentKey.publicKey.agentID)
        try net.agentActions(net.agent.heartbeat(activeUIDs: ["u-1"], stats: .with { $0.records = 10 }))
        try net.run()
        #expect(net.serverDelivered.count == 1 && net.serverDelivered[0].heartbeat.activeUids == ["u-1"])
        #expect(!net.serverDelivered[0].heartbeat.hasUsers, "no report: the same as the last")
        // A user report over MAX_REPORTED_USERS goes out cut to it and marked truncated.
        let many = WireUserReport.with { r in r.users = (0...WireLimits.maxReportedUsers).map { i in .with { $0.uid = "u-\(i)"; $0.lastSeenUs = 0 } } }
        try net.agentActions(net.agent.heartbeat(activeUIDs: [], stats: .init(), users: many))
        try net.run()
        let report = net.serverDelivered[1].heartbeat.users
        #expect(net.serverDelivered[1].heartbeat.hasUsers && report.users.count == WireLimits.maxReportedUsers && report.truncated)
        try net.serverActions(net.server.send(.with { $0.pullCommand = .with { $0.commandID = "c1" } }))
        try net.run()
        #expect(net.agentDelivered.map { $0.pullCommand.commandID } == ["c1"])
    }

    /// Either side ends a ready connection with `Goodbye`; the other closes on it, and neither
    /// machine lets another frame out afterwards. A connection lost closes the server's machine
    /// the same way.
    @Test func goodbyeEndsTheConnectionOnBothSidesAndNothingIsSentAfter() throws {
        var net = Loopback(mode: .authenticate(agentID: testAgentKey.publicKey.agentID, host: testHost))
        try net.agentActions(net.agent.start())
        try net.run()
        #expect(net.agent.isReady && net.server.agentID != nil)
        let agentBye = net.agent.goodbye("agent stopping")
        #expect(agentBye.first == .send(.with { $0.goodbye = .with { $0.reason = "agent stopping" } }) && agentBye.last == .close(nil))
        #expect(net.agent.goodbye("again").isEmpty, "said once")
        #expect(net.agent.send(.with { $0.commandAccepted = .with { $0.commandID = "c1" } }).isEmpty)
        #expect(net.agent.heartbeat(activeUIDs: [], stats: .init()).isEmpty)
        try net.agentActions(agentBye)
        try net.run()
        #expect(net.server.agentID == nil, "the server's machine closed on the agent's Goodbye")
        #expect(net.server.send(.with { $0.pullCommand = .with { $0.commandID = "c2" } }).isEmpty)

        var server = ServerConnectionStateMachine()
        let bye = server.goodbye("server shutting down")
        #expect(bye == [.send(.with { $0.goodbye = .with { $0.reason = "server shutting down" } }), .close(nil)], "said before authentication too")
        #expect(server.goodbye("twice").isEmpty && server.fail(.malformed("late")).isEmpty)
        var lost = ServerConnectionStateMachine()
        lost.closed("connection lost")
        #expect(lost.goodbye("too late").isEmpty)
        #expect(lost.receive(.with { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1 } }, challenge: [UInt8](repeating: 1, count: 32)).isEmpty)
    }

    /// Capabilities (Protocol § 4): the server agrees to those it knows, in the order listed,
    /// once each; what one adds is sent only when it is agreed, so an agent that lists none gets
    /// the enrollment answer and heartbeat acks of the base protocol, byte for byte.
    @Test func whatACapabilityAddsIsSentOnlyWhenItIsAgreed() throws {
        let challenge = [UInt8](repeating: 1, count: 32)
        let response = WireEnrollResponse.with { $0.agentID = "a"; $0.keyGeneration = 2 }
        let announced = WireFrame.with { $0.heartbeatAck = .with { $0.seq = 1; $0.keyAnnouncements = [.with { $0.generation = 2 }] } }
        for listed in [[], ["no-such-thing"], ["no-such-thing", "key-rotation", "key-rotation"]] {
            var server = ServerConnectionStateMachine()
            let hello = server.receive(.with { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1; $0.capabilities = listed } }, challenge: challenge)
            guard case .send(let ack)? = hello.first else { Issue.record("no HelloAck"); continue }
            let agreed = listed.contains("key-rotation")
            #expect(ack.helloAck.capabilities == (agreed ? ["key-rotation"] : []))
            #expect(server.capabilities == ack.helloAck.capabilities)
            var enrolling = server
            _ = enrolling.receive(.with { $0.enrollRequest = .with { $0.token = "t" } }, challenge: challenge)
            guard case .send(let sent)? = enrolling.enrolled(response).first else { Issue.record("no EnrollResponse"); continue }
            #expect(sent.enrollResponse.keyGeneration == (agreed ? 2 : 0), "\(listed)")
            if !agreed {
                #expect(try sent.serializedBytes() as [UInt8] == (try WireFrame.with { $0.enrollResponse = .with { $0.agentID = "a" } }.serializedBytes()) as [UInt8])
            }
            _ = server.receive(.with { $0.authResponse = .with { $0.agentID = "a"; $0.keyGeneration = 3 } }, challenge: challenge)
            #expect(server.claimedKeyGeneration == (agreed ? 3 : nil))
            _ = server.authenticated("a")
            guard case .send(let acked)? = server.send(announced).first else { Issue.record("nothing sent"); continue }
            #expect(acked.heartbeatAck.keyAnnouncements.count == (agreed ? 1 : 0))
        }
    }

    /// Live tail (Protocol § 20): its frames pass both machines only where `live-tail` is
    /// agreed; where it is not (the agent did not list it, or this server does not know it)
    /// neither side sends them, and one that arrives is an unexpected message, as any frame
    /// the state does not allow.
    @Test func liveTailFramesFlowOnlyWhereTheCapabilityIsAgreed() throws {
        let id = testAgentKey.publicKey.agentID
        let tail = "5d1e7a3c9b0f2e4d6c8a1b3e5f7d9c0a"
        let command = WireFrame.with { $0.tailCommand = .with { $0.tailID = tail; $0.target = .with { $0.uid = "u-1" } } }
        let batch = WireFrame.with { $0.tailBatch = .with { $0.tailID = tail; $0.seq = 1; $0.ciphertext = Data(repeating: 1, count: 16) } }
        for (listed, known) in [([WireCapability.liveTail], [WireCapability.keyRotation, WireCapability.liveTail]), ([], [WireCapability.liveTail]), ([WireCapability.liveTail], WireCapability.known)] {
            let agreed = listed.contains(WireCapability.liveTail) && known.contains(WireCapability.liveTail)
            var net = Loopback(mode: .authenticate(agentID: id, host: testHost))
            net.agent = AgentConnectionStateMachine(mode: .authenticate(agentID: id, host: testHost), capabilities: listed)
            net.server = ServerConnectionStateMachine(known: known)
            try net.agentActions(net.agent.start())
            try net.run()
            #expect(net.agent.isReady && net.agent.agreed.contains(WireCapability.liveTail) == agreed, "\(listed) \(known)")
            // Each side sends them only when agreed.
            #expect(net.server.send(command).isEmpty == !agreed)
            #expect(net.agent.send(batch).isEmpty == !agreed)
            #expect(net.server.send(.with { $0.heartbeatAck = .with { $0.seq = 1 } }).count == 1, "the rest is unchanged")
            if agreed {
                try net.serverActions(net.server.send(command))
                try net.agentActions(net.agent.send(batch))
                try net.agentActions(net.agent.send(.with { $0.tailAccepted = .with { $0.tailID = tail } }))
                try net.serverActions(net.server.send(.with { $0.tailAck = .with { $0.tailID = tail; $0.seq = 1 } }))
                try net.serverActions(net.server.send(.with { $0.tailStop = .with { $0.tailID = tail } }))
                try net.run()
                #expect(net.agentDelivered.map { String(String(describing: $0.body!).prefix(while: { $0 != "(" })) } == ["tailCommand", "tailAck", "tailStop"])
                #expect(net.serverDelivered.filter { $0.tailBatch.seq == 1 || $0.tailAccepted.tailID == tail }.count == 2)
                #expect(net.agentClosed == nil && net.serverClosed == nil)
            } else {
                // A peer that sends one anyway breaks the protocol.
                var server = net.server
                #expect(server.receive(batch, challenge: []).contains { if case .close(let error?) = $0 { error.code == .errorUnexpectedMessage } else { false } })
                var agent = net.agent
                #expect(agent.receive(command).contains { if case .close(let error?) = $0 { error.code == .errorUnexpectedMessage } else { false } })
            }
        }
    }

    /// A server's planned restart (Protocol § 6): its Goodbye says when it expects to be back
    /// and how often to try meanwhile; the agent's machine hands that on before it closes. A
    /// plain Goodbye hands nothing on, and the agent backs off as before.
    @Test func aPlannedRestartsGoodbyeSaysWhenTheServerIsBack() throws {
        var net = Loopback(mode: .authenticate(agentID: testAgentKey.publicKey.agentID, host: testHost))
        try net.agentActions(net.agent.start())
        try net.run()
        let planned = PlannedReturn(backWithin: .seconds(60), retryEvery: .seconds(3))
        let bye = net.server.goodbye("server shutting down", returning: planned)
        #expect(bye.first == .send(.with { $0.goodbye = .with { $0.reason = "server shutting down"; $0.backWithinMs = 60_000; $0.retryEveryMs = 3_000 } }))
        try net.serverActions(bye)
        try net.run()
        #expect(net.agentPlannedReturn == planned)
        #expect(net.agentClosed == .some(nil), "then closed, with no error")

        var plain = Loopback(mode: .authenticate(agentID: testAgentKey.publicKey.agentID, host: testHost))
        try plain.agentActions(plain.agent.start())
        try plain.run()
        try plain.serverActions(plain.server.goodbye("replaced by a newer connection of the same agent"))
        try plain.run()
        #expect(plain.agentPlannedReturn == nil && plain.agentClosed == .some(nil))
    }

    /// The protocol's bounds: a window over MAX_RESTART_WINDOW counts as 10 minutes, an interval
    /// of 0 as 2 s, one under 1 s as 1 s and one over 60 s as 60 s; `back_within_ms` 0 is no plan.
    @Test func aPlannedReturnKeepsToTheProtocolsBounds() {
        func goodbye(_ back: UInt32, _ every: UInt32) -> WireGoodbye { .with { $0.backWithinMs = back; $0.retryEveryMs = every } }
        #expect(PlannedReturn(goodbye(0, 2_000)) == nil)
        #expect(PlannedReturn(goodbye(60_000, 0)) == PlannedReturn(backWithin: .seconds(60), retryEvery: .seconds(2)))
        #expect(PlannedReturn(goodbye(UInt32.max, 10))?.backWithin == .seconds(600))
        #expect(PlannedReturn(goodbye(5_000, 10))?.retryEvery == .seconds(1))
        #expect(PlannedReturn(goodbye(5_000, 3_600_000))?.retryEvery == .seconds(60))
        #expect(PlannedReturn(goodbye(5_000, 1_500))?.window == .milliseconds(6_500))
        // The Swift server's interval grows with the agents it says goodbye to.
        #expect(PlannedReturn.retryInterval(agents: 0) == .seconds(2))
        #expect(PlannedReturn.retryInterval(agents: 499) == .seconds(2))
        #expect(PlannedReturn.retryInterval(agents: 10_000) == .seconds(22))
        #expect(PlannedReturn.retryInterval(agents: 1_000_000) == .seconds(60))
    }

    /// After the server's Goodbye (or a lost connection) an authenticated agent's frames that
    /// were already on their way are still delivered (a chunk in flight is stored), but
    /// nothing more is sent, not even an answer to a frame out of place.
    @Test func framesInFlightAfterTheServersGoodbyeAreStillDelivered() throws {
        for end in ["goodbye", "lost"] {
            var net = Loopback(mode: .authenticate(agentID: testAgentKey.publicKey.agentID, host: testHost))
            try net.agentActions(net.agent.start())
            try net.run()
            let id = try #require(net.server.agentID)
            if end == "goodbye" {
                #expect(net.server.goodbye("server shutting down").count == 2)
            } else {
                net.server.closed("connection lost")
            }
            #expect(net.server.state == .leaving(agentID: id))
            let chunk = WireFrame.with { $0.uploadChunk = .with { $0.uploadID = "u"; $0.index = 0 } }
            #expect(net.server.receive(chunk, challenge: []) == [.deliver(agentID: id, chunk)], "\(end)")
            #expect(net.server.send(.with { $0.chunkAck = .with { $0.uploadID = "u" } }).isEmpty, "\(end)")
            #expect(net.server.goodbye("again").isEmpty)
            #expect(net.server.receive(.with { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1 } }, challenge: []).isEmpty, "out of place: not answered")
            #expect(net.server.receive(.with { $0.goodbye = .with { $0.reason = "bye" } }, challenge: []) == [.close(nil)])
            #expect(net.server.receive(chunk, challenge: []).isEmpty, "closed at last")
        }
    }

    @Test func aDeviceIsDescribedByItsNewestContextWithinTheProtocolsBounds() {
        let process = WireHostInfo.with { $0.hostname = "box"; $0.os = "Linux 6" }
        // No record yet: the process's own host name and OS, and no app.
        #expect(WireHostInfo.describing(nil, fallback: process) == process)
        let context = LogContext(host: "till-7", os: "", app: "checkout", appVersion: "3.2.1", process: "p", extra: ["lane": "4", "store": "berlin"])
        let described = WireHostInfo.describing(context, fallback: process)
        #expect(described.hostname == "till-7" && described.os == "Linux 6" && described.app == "checkout" && described.appVersion == "3.2.1")
        #expect(described.extra == ["lane": "4", "store": "berlin"])
        // What the operator set wins.
        let set = WireHostInfo.with { $0.app = "pos"; $0.extra = ["lane": "5"] }
        let overridden = WireHostInfo.describing(context, fallback: process, overrides: set)
        #expect(overridden.app == "pos" && overridden.appVersion == "3.2.1" && overridden.extra == ["lane": "5", "store": "berlin"])
        // Bounds: a value is cut at a whole character, control characters go.
        let long = LogContext(host: String(repeating: "€", count: 100), os: "", app: "a\u{1B}[2Jb", appVersion: "", process: "p")
        let bounded = WireHostInfo.describing(long, fallback: process)
        #expect(bounded.hostname == String(repeating: "€", count: 85) && bounded.app == "a\u{FFFD}[2Jb")
    }

    @Test func aBadSignatureOrUnknownAgentIsRefusedWithAuthFailed() throws {
        let impostor = try RSAPrivateKey.generate()
        // Claims the enrolled agent's id but holds another key.
        var net = Loopback(mode: .authenticate(agentID: testAgentKey.publicKey.agentID, host: testHost), key: impostor)
        net.enrolledKeys = [testAgentKey.publicKey.agentID: testAgentKey.publicKey]
        try net.agentActions(net.agent.start())
        try net.run()
        #expect(!net.agent.isReady && net.server.agentID == nil)
        #expect(net.agentClosed??.code == .errorAuthFailed)
        // Nothing is delivered after the failure, whatever the agent sends.
        try net.agentActions(net.agent.heartbeat(activeUIDs: [], stats: .init()))
        try net.run()
        #expect(net.serverDelivered.isEmpty)
    }

    @Test func enrollmentRegistersTheKeyThenTheAgentAuthenticates() throws {
        let key = try RSAPrivateKey.generate()
        var net = Loopback(mode: .enroll(token: "good-token", publicKey: key.publicKey.spki, host: testHost), key: key, enrolled: false)
        try net.agentActions(net.agent.start())
        try net.run()
        #expect(net.enrollment?.agentID == key.publicKey.agentID)
        #expect(net.serverClosed != nil)
        var again = Loopback(mode: .authenticate(agentID: key.publicKey.agentID, host: testHost), key: key, enrolled: false)
        again.enrolledKeys = net.enrolledKeys
        try again.agentActions(again.agent.start())
        try again.run()
        #expect(again.agent.isReady)

        var refused = Loopback(mode: .enroll(token: "stolen", publicKey: key.publicKey.spki, host: testHost), key: key, enrolled: false)
        try refused.agentActions(refused.agent.start())
        try refused.run()
        #expect(refused.agentClosed??.code == .errorEnrollmentRefused)
        #expect(refused.enrolledKeys.isEmpty)
    }

    @Test func messagesOutOfOrderAndUnknownVersionsCloseTheConnection() throws {
        var server = ServerConnectionStateMachine()
        let early = server.receive(.with { $0.heartbeat = .init() }, challenge: [])
        #expect(early.contains { if case .close(let e) = $0 { return e?.code == .errorUnexpectedMessage } else { return false } })
        #expect(server.receive(.with { $0.hello = .init() }, challenge: []).isEmpty, "closed stays closed")

        var server2 = ServerConnectionStateMachine()
        let future = server2.receive(.with { $0.hello = .with { $0.minVersion = 2; $0.maxVersion = 3 } }, challenge: [])
        #expect(future.contains { if case .close(let e) = $0 { return e?.code == .errorVersionUnsupported } else { return false } })

        var agent = AgentConnectionStateMachine(mode: .authenticate(agentID: "a", host: testHost))
        _ = agent.start()
        let pushed = agent.receive(.with { $0.pullCommand = .init() })
        #expect(pushed.contains { if case .close(let e) = $0 { return e?.code == .errorUnexpectedMessage } else { return false } })
        #expect(!agent.isReady)
    }
}

@Suite struct UploadStateMachineTests {
    func header(chunks: UInt32) -> WireUploadHeader {
        .with {
            $0.uploadID = "up-1"; $0.kind = .pull; $0.agentID = "a"; $0.noncePrefix = Data(count: 7); $0.chunkSize = 4_096
            $0.plaintextSize = UInt64(chunks) * 4_096; $0.chunkCount = chunks
        }
    }

    /// A sender and a receiver over a connection that is cut at random moments, many times.
    /// Frames in flight when it is cut are lost, and now and then a chunk frame arrives twice.
    /// The upload still completes, the window is never exceeded, no chunk the agent has seen
    /// acknowledged (by an ack or a bitmap) is sent again, and no chunk is stored twice.
    @Test(arguments: [1, 2, 3, 4, 5, 6, 7, 8])
    func completesAcrossRandomDisconnectsWithoutResendingAcknowledgedChunks(seed: UInt64) throws {
        var rng = SeededRandom(seed)
        let h = header(chunks: 97)
        var sender = UploadSenderStateMachine(header: h, window: 8)
        var receiver = UploadReceiverStateMachine(header: h)
        var toServer: [WireFrame] = []
        var toAgent: [WireFrame] = []
        // What the test itself saw, not the machines' own bookkeeping: chunks stored by the
        // "disk", and chunks the agent was told the server holds.
        var storeCount: [UInt32: Int] = [:]
        var seenAcknowledged = Set<UInt32>()
        var duplicates = 0
        var disconnects = 0
        var result: WireUploadResult?

        func agent(_ actions: [UploadSenderStateMachine.Action]) {
            for a in actions {
                switch a {
                case .send(let f): toServer.append(f)
                case .sendChunk(let i):
                    #expect(!seenAcknowledged.contains(i), "chunk \(i) sent again after the agent saw it acknowledged")
                    toServer.append(.with { $0.uploadChunk = .with { $0.uploadID = "up-1"; $0.index = i; $0.ciphertext = Data([UInt8(i % 256)]) } })
                case .finished(let r): result = r
                case .retryLater(let r): Issue.record("unexpected retry: \(r)")
                }
            }
            #expect(sender.inFlight.count <= sender.window)
        }
        func server(_ actions: [UploadReceiverStateMachine.Action]) {
            for a in actions {
                switch a {
                case .send(let f): toAgent.append(f)
                case .store(let index, _):
                    storeCount[index, default: 0] += 1
                    server(receiver.stored(index))
                case .assemble: server(receiver.assembled(.with { $0.uploadID = "up-1"; $0.ok = true; $0.files = 3 }))
                }
            }
        }

        agent(sender.resume())
        var steps = 0
        while result == nil {
            steps += 1
            #expect(steps < 100_000)
            if steps >= 100_000 { break }
            if rng.next() % 23 == 0 {
                // Cut: whatever is on the wire is lost, both sides notice, the agent reconnects.
                toServer.removeAll()
                toAgent.removeAll()
                sender.connectionLost()
                disconnects += 1
                agent(sender.resume())
                continue
            }
            // Deliver one frame, in either direction.
            if !toServer.isEmpty && (toAgent.isEmpty || rng.next() % 2 == 0) {
                let f = toServer.removeFirst()
                switch f.body {
                case .uploadBegin(let b)?: server(receiver.begin(b.header))
                case .uploadChunk(let c)?:
                    server(receiver.chunk(c))
                    if rng.next() % 7 == 0 {
                        // The same chunk again (a duplicate on the wire): acked, never stored again.
                        duplicates += 1
                        server(receiver.chunk(c))
                    }
                case .uploadComplete?: server(receiver.complete())
                default: Issue.record("unexpected \(f)")
                }
            } else if !toAgent.isEmpty {
                let f = toAgent.removeFirst()
                switch f.body {
                case .chunkAck(let a)?: seenAcknowledged.insert(a.index)
                case .uploadReady(let r)?: seenAcknowledged = ChunkBitmap.decode(r.received, count: h.chunkCount)
                default: break
                }
                agent(sender.receive(f))
            } else {
                // Both idle without a result: the sender must have something pending.
                Issue.record("stalled in \(sender.state)")
                break
            }
        }
        #expect(result?.ok == true)
        #expect(receiver.received.count == 97)
        #expect(storeCount.count == 97 && storeCount.values.allSatisfy { $0 == 1 }, "every chunk stored exactly once")
        #expect(duplicates > 0, "the test did send duplicates")
        #expect(disconnects > 3, "the test did cut the connection")
        // A chunk is sent more than once only when its ack (or it) was lost in a cut.
        let resent = sender.sendCount.values.filter { $0 > 1 }.count
        #expect(resent <= disconnects * sender.window)
    }

    @Test func receiverRefusesBadIndexesIncompleteUploadsAndForeignHeaders() {
        let h = header(chunks: 3)
        var receiver = UploadReceiverStateMachine(header: h)
        func errorCode(_ actions: [UploadReceiverStateMachine.Action]) -> WireErrorCode? {
            for case .send(let f) in actions { if case .error(let e)? = f.body { return e.code } }
            return nil
        }
        #expect(errorCode(receiver.chunk(.with { $0.uploadID = "up-1"; $0.index = 3 })) == .errorChunkInvalid)
        // An index out of range fails the upload (§ Uploads).
        #expect(receiver.status().uploadStatus.state == .failed)
        receiver = UploadReceiverStateMachine(header: h)
        #expect(errorCode(receiver.complete()) == .errorUploadIncomplete)
        var other = h
        other.chunkCount = 2
        #expect(errorCode(receiver.begin(other)) == .errorUploadInvalid)
        // A chunk that fails verification fails the upload.
        _ = receiver.chunk(.with { $0.uploadID = "up-1"; $0.index = 0 })
        let failed = receiver.rejected(0, .errorChunkAuthFailed)
        #expect(failed.contains { if case .send(let f) = $0 { return f.uploadResult.error == .errorChunkAuthFailed && !f.uploadResult.ok } else { return false } })
        #expect(receiver.status().uploadStatus.state == .failed)
        // Beginning again after the end only repeats the result.
        #expect(receiver.begin(h).count == 1)
    }

    /// After `ERROR_UPLOAD_INCOMPLETE` the server's bitmap is the truth: a chunk it once
    /// acknowledged and has lost is sent again, and only that one.
    @Test func afterUploadIncompleteTheServersBitmapIsTheTruth() {
        let h = header(chunks: 4)
        var sender = UploadSenderStateMachine(header: h, window: 4)
        _ = sender.resume()
        #expect(sender.receive(.with { $0.uploadReady = .with { $0.uploadID = "up-1"; $0.received = Data() } }).count == 4)
        for i: UInt32 in 0..<3 { #expect(sender.receive(.with { $0.chunkAck = .with { $0.uploadID = "up-1"; $0.index = i } }).isEmpty) }
        let complete = sender.receive(.with { $0.chunkAck = .with { $0.uploadID = "up-1"; $0.index = 3 } })
        #expect(complete == [.send(.with { $0.uploadComplete = .with { $0.uploadID = "up-1" } })])
        let again = sender.receive(.with { $0.error = .with { $0.code = .errorUploadIncomplete; $0.uploadID = "up-1" } })
        #expect(again == [.send(.with { $0.uploadBegin = .with { $0.header = h } })])
        let missing = sender.receive(.with { $0.uploadReady = .with { $0.uploadID = "up-1"; $0.received = Data(ChunkBitmap.encode([0, 1, 3], count: 4)) } })
        #expect(missing == [.sendChunk(2)])
        #expect(sender.receive(.with { $0.chunkAck = .with { $0.uploadID = "up-1"; $0.index = 2 } }) == complete)
    }

    /// A server that keeps answering `ERROR_UPLOAD_INCOMPLETE` while its bitmap says it holds
    /// everything does not make the agent loop: the upload fails after three answers.
    @Test func anUploadIncompleteLoopEnds() {
        let h = header(chunks: 2)
        let full = Data(ChunkBitmap.encode([0, 1], count: 2))
        var sender = UploadSenderStateMachine(header: h, window: 4)
        _ = sender.resume()
        var ends: [UploadSenderStateMachine.Action] = []
        for _ in 0..<UploadSenderStateMachine.maxIncompleteWithoutProgress {
            let actions = sender.receive(.with { $0.uploadReady = .with { $0.uploadID = "up-1"; $0.received = full } })
            #expect(actions == [.send(.with { $0.uploadComplete = .with { $0.uploadID = "up-1" } })])
            ends = sender.receive(.with { $0.error = .with { $0.code = .errorUploadIncomplete; $0.uploadID = "up-1" } })
        }
        guard case .finished(let result)? = ends.first else { Issue.record("still looping: \(ends)"); return }
        #expect(!result.ok && result.error == .errorUploadIncomplete)
        #expect(sender.resume().isEmpty)
    }

    @Test func aResumedSenderSkipsWhatTheServerHolds() {
        let h = header(chunks: 10)
        var sender = UploadSenderStateMachine(header: h, window: 4)
        _ = sender.resume()
        let actions = sender.receive(.with { $0.uploadReady = .with { $0.uploadID = "up-1"; $0.received = Data(ChunkBitmap.encode([0, 1, 2, 5], count: 10)) } })
        #expect(actions == [.sendChunk(3), .sendChunk(4), .sendChunk(6), .sendChunk(7)])
        // An upload the server already finished ends at once.
        var done = UploadSenderStateMachine(header: h)
        _ = done.resume()
        let end = done.receive(.with { $0.uploadResult = .with { $0.uploadID = "up-1"; $0.ok = true } })
        #expect(end.count == 1 && done.resume().isEmpty)
    }

    /// The server's own trouble (a full disk) is "not now": the sender keeps the upload and,
    /// resumed later, sends only what is missing; the receiver keeps every chunk it held.
    @Test func aServerFaultIsRetriedNotTheEndOfTheUpload() {
        let h = header(chunks: 4)
        var sender = UploadSenderStateMachine(header: h, window: 4)
        _ = sender.resume()
        _ = sender.receive(.with { $0.uploadReady = .with { $0.uploadID = "up-1"; $0.received = Data() } })
        _ = sender.receive(.with { $0.chunkAck = .with { $0.uploadID = "up-1"; $0.index = 0 } })
        let disk = sender.receive(.with { $0.error = .with { $0.code = .errorInternal; $0.uploadID = "up-1"; $0.detail = "disk full" } })
        #expect(disk.count == 1)
        guard case .retryLater(let r)? = disk.first else { Issue.record("not retried: \(disk)"); return }
        #expect(r.error == .errorInternal)
        #expect(sender.state == .suspended)
        // Later: begin again; the server holds 0 and 1; only 2 and 3 go.
        #expect(sender.resume().count == 1)
        let rest = sender.receive(.with { $0.uploadReady = .with { $0.uploadID = "up-1"; $0.received = Data(ChunkBitmap.encode([0, 1], count: 4)) } })
        #expect(rest == [.sendChunk(2), .sendChunk(3)])
        // A quota or an internal failure in the result is retried too; a refusal is final.
        var quota = UploadSenderStateMachine(header: h)
        _ = quota.resume()
        guard case .retryLater? = quota.receive(.with { $0.uploadResult = .with { $0.uploadID = "up-1"; $0.ok = false; $0.error = .errorLimitExceeded } }).first else {
            Issue.record("a quota ended the upload"); return
        }
        var refused = UploadSenderStateMachine(header: h)
        _ = refused.resume()
        guard case .finished? = refused.receive(.with { $0.error = .with { $0.code = .errorChunkInvalid; $0.uploadID = "up-1" } }).first else {
            Issue.record("an invalid chunk did not end the upload"); return
        }

        var receiver = UploadReceiverStateMachine(header: h, received: [0, 1, 2, 3])
        #expect(receiver.complete() == [.assemble])
        _ = receiver.assembled(.with { $0.uploadID = "up-1"; $0.ok = false; $0.error = .errorInternal })
        #expect(receiver.state == .receiving)
        #expect(receiver.complete() == [.assemble])
    }

    /// A chunk of the wrong size ends the upload with ERROR_CHUNK_INVALID (not an internal
    /// error the agent would retry for ever).
    @Test func aWrongSizeChunkEndsTheUploadAsInvalid() {
        var receiver = UploadReceiverStateMachine(header: header(chunks: 3))
        _ = receiver.chunk(.with { $0.uploadID = "up-1"; $0.index = 1; $0.ciphertext = Data(count: 5) })
        let actions = receiver.rejected(1, .errorChunkInvalid)
        #expect(actions.contains { if case .send(let f) = $0 { return f.error.code == .errorChunkInvalid } else { return false } })
        #expect(receiver.status().uploadStatus.state == .failed)
        var stored = UploadReceiverStateMachine(header: header(chunks: 3))
        _ = stored.chunk(.with { $0.uploadID = "up-1"; $0.index = 1 })
        _ = stored.rejected(1, .errorInternal)
        #expect(stored.state == .receiving)
    }
}

@Suite struct WireIDTests {
    @Test func onlyThirtyTwoLowercaseHexCharactersAreIds() {
        #expect(WireID.isValid("0123456789abcdef0123456789abcdef"))
        for bad in ["", ".", "..", "../pulls", "../../x", "/etc/passwd", "0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0", "0123456789abcdef0123456789abcdeg", String(repeating: "a", count: 100_000), "0123456789abcdef0123456789abcd\u{0}f"]
        {
            #expect(!WireID.isValid(bad), "\(bad.prefix(40).debugDescription)")
        }
        #expect(WireID.echo(String(repeating: "a", count: 100_000)) == "")
        #expect(WireID.echo("../pulls") == "../pulls")
    }
}

@Suite struct UnexpectedMessageDetailTests {
    /// The detail of ERROR_UNEXPECTED_MESSAGE names the state, never its contents (the
    /// challenge, once).
    @Test func theDetailNamesTheStateWithoutItsContents() {
        var server = ServerConnectionStateMachine()
        let challenge = [UInt8](repeating: 0xAB, count: 32)
        _ = server.receive(.with { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1 } }, challenge: challenge)
        let actions = server.receive(.with { $0.heartbeat = .with { $0.seq = 1 } }, challenge: challenge)
        let detail = actions.compactMap { if case .send(let f) = $0, case .error(let e)? = f.body { return e.detail } else { return nil } }.first
        #expect(detail != nil)
        #expect(detail?.contains("171") == false, "\(detail ?? "")")  // 0xAB
        #expect(detail?.contains("awaitingCredentials") == true, "\(detail ?? "")")
    }
}
