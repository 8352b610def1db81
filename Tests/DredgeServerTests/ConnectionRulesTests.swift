@testable import DredgeAgentCore
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import FoundationNetworking
import Logging
import NIOCore
import NIOEmbedded
import NIOPosix
import Testing
@testable import DredgeServer
#if canImport(FoundationNetworking)
#endif

/// The listener's connection rules against the real server in this process: deadlines, the
/// small frame limit before authentication, the caps, one connection per agent, and the
/// delivery rules that go with them (redelivery, a poisoned pull failing alone).
@Suite struct ConnectionRulesTests {
    static let waitFor = PullOutcomeTests.waitFor

    /// A TCP connection from `source` (any loopback address) that never says anything.
    static func silentConnection(port: Int, from source: String = "127.0.0.2") async throws -> any Channel {
        try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(to: try SocketAddress(ipAddress: source, port: 0))
            .connect(host: "127.0.0.1", port: port).get()
    }

    /// Runs `body`, or fails with a timeout after `limit` (so a broken rule fails the test
    /// instead of hanging it).
    static func within<R: Sendable>(_ limit: Duration, _ body: @escaping @Sendable () async throws -> R) async throws -> R {
        try await withThrowingTaskGroup(of: R?.self) { group in
            group.addTask { try await body() }
            group.addTask {
                try await Task.sleep(for: limit)
                return nil
            }
            defer { group.cancelAll() }
            guard let first = try await group.next(), let result = first else { throw AgentError("timed out after \(limit)") }
            return result
        }
    }

    /// Reads `link` until the server ends it: true when it was closed with a Goodbye or an
    /// error (the link throws), false when the stream just ended.
    static func closedByServer(_ link: AgentLink, within limit: Duration) async throws -> Bool {
        try await within(limit) {
            do {
                while try await link.next() != nil {}
                return false
            } catch {
                return true
            }
        }
    }

    /// A task that runs `wait` and counts into `ended` once it returns.
    static func waiter(counting ended: PostgresNodesTests.Counter, _ wait: @escaping @Sendable () async -> Void) -> Task<Void, Never> {
        Task {
            await wait()
            ended.increment()
        }
    }

    /// A test waits for the server to end its connections through ``within(_:_:)``: the wait
    /// must end when its task is cancelled, or a connection that never ends hangs the test run
    /// instead of failing the test.
    @Test func aWaitForTheConnectionsToEndEndsWhenCancelled() async throws {
        let set = ConnectionSet()
        let (token, _) = set.insert(ConnectionOutbound(channel: EmbeddedChannel(), session: WireAuthResult()))
        let ended = PostgresNodesTests.Counter()
        let cancelled = Self.waiter(counting: ended) { await set.drainedOrCancelled() }
        cancelled.cancel()
        // Generous: the whole suite runs in parallel on two cores (it took 103 s there once).
        #expect(await ended.reaches(1, within: .seconds(300)), "a cancelled wait for the connections to end went on")
        await cancelled.value

        // Not cancelled: it ends when the last connection does, not before (it is parked, and
        // has not counted, until then).
        let waiting = Self.waiter(counting: ended) { await set.drainedOrCancelled() }
        #expect(try await PullOutcomeTests.waitFor(.seconds(300)) { set.parkedWaiters == 1 }, "the wait was never parked")
        #expect(ended.count == 1)
        set.remove(token)
        #expect(await ended.reaches(2, within: .seconds(300)), "the wait did not end with the last connection")
        await waiting.value
    }

    /// The listener's own shutdown waits for its connections whatever: cancellation (another
    /// service of the group failing) must not stop the thread pools under a connection's cleanup.
    @Test func theShutdownWaitForTheConnectionsIsNotEndedByCancellation() async throws {
        let set = ConnectionSet()
        let (token, _) = set.insert(ConnectionOutbound(channel: EmbeddedChannel(), session: WireAuthResult()))
        let ended = PostgresNodesTests.Counter()
        let waiting = Self.waiter(counting: ended) { await set.drained() }
        waiting.cancel()
        // Parked although cancelled (a wait that cancellation ended would never park).
        #expect(try await PullOutcomeTests.waitFor(.seconds(300)) { set.parkedWaiters == 1 }, "the cancelled shutdown wait did not wait")
        #expect(ended.count == 0, "a cancelled shutdown wait ended while a connection was open")
        set.remove(token)
        #expect(await ended.reaches(1, within: .seconds(300)))
        await waiting.value
    }

    @Test func connectionsThatNeverAuthenticateAreClosedAtTheDeadline() async throws {
        try await withStopping(InProcessServer(connectionLimits: ConnectionLimits(handshakeSeconds: 1, missedHeartbeats: 30))) { server in
            // One says nothing at all, one finishes TLS and says nothing, one sends half a frame.
            let silent = try await Self.silentConnection(port: server.agentPort)
            let tls = try await AgentConnector.connect(host: "127.0.0.1", port: server.agentPort, caPEM: contents(server.data + "/ca.pem"))
            let partial = try await AgentConnector.connect(host: "127.0.0.1", port: server.agentPort, caPEM: contents(server.data + "/ca.pem"))
            var raw = ByteBuffer()
            raw.writeInteger(UInt32(1_000))
            raw.writeBytes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
            let prefix = raw
            // Below the frame codec: raw bytes inside the TLS stream.
            do {
                try await partial.channel.pipeline.context(handlerType: MessageToByteHandler<FrameEncoder>.self).flatMap { context in
                    context.writeAndFlush(NIOAny(prefix))
                }.get()
            } catch {
                // A loaded machine can take longer than the 1 s deadline to get here: the server has
                // closed the connection already, which is what this test asserts below.
            }
            for channel in [silent, tls.channel, partial.channel] {
                #expect(try await Self.waitFor(.seconds(30)) { !channel.isActive })
            }
            #expect(try await Self.waitFor(.seconds(60)) { server.listener.gate.counts.unauthenticated == 0 })
        }
    }

    @Test func aLargeFrameBeforeAuthenticationIsRefused() async throws {
        try await withStopping(InProcessServer()) { server in
            let channel = try await AgentConnector.connect(host: "127.0.0.1", port: server.agentPort, caPEM: contents(server.data + "/ca.pem"))
            let answer = try await channel.executeThenClose { inbound, outbound in
                try await outbound.write(.with {
                    $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1; $0.software = String(repeating: "x", count: WireLimits.maxPreAuthFrameBytes + 1) }
                })
                var frames = inbound.makeAsyncIterator()
                return try await frames.next()
            }
            #expect(answer?.error.code == .errorFrameTooLarge)
            #expect(answer?.error.fatal == true)
        }
    }

    /// The largest frames allowed before authentication, across TLS records cut anyhow (a full
    /// record then a few bytes, a few bytes then the rest), through the server's real pipeline
    /// (records paced one at a time, frames gathered): each is answered.
    @Test func theLargestPreAuthenticationFramesAcrossTLSRecordsAreAnswered() async throws {
        try await withStopping(InProcessServer()) { server in
            for cut in [[16_384, 3], [3, 16_384], [9_000, 2, 5_000]] {
                let channel = try await AgentConnector.connect(host: "127.0.0.1", port: server.agentPort, caPEM: contents(server.data + "/ca.pem"))
                // A Hello whose body is exactly the limit.
                var software = WireLimits.maxPreAuthFrameBytes - 16
                var hello = WireFrame()
                while true {
                    hello = .with { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1; $0.software = String(repeating: "s", count: software) } }
                    let size = (try hello.serializedBytes() as [UInt8]).count
                    if size == WireLimits.maxPreAuthFrameBytes { break }
                    software += WireLimits.maxPreAuthFrameBytes - size
                }
                let bytes = try FrameEncoder.bytes(of: hello)
                var pieces: [ByteBuffer] = []
                var offset = 0
                for length in cut + [bytes.count] {
                    let end = min(offset + length, bytes.count)
                    if end > offset { pieces.append(ByteBuffer(bytes: bytes[offset..<end])) }
                    offset = end
                }
                // Below the frame codec: each piece its own write, so its own TLS record(s).
                try await channel.channel.pipeline.context(handlerType: MessageToByteHandler<FrameEncoder>.self).flatMap { context in
                    for piece in pieces { context.writeAndFlush(NIOAny(piece), promise: nil) }
                    return context.eventLoop.makeSucceededVoidFuture()
                }.get()
                let answer = try await channel.executeThenClose { inbound, _ in
                    var frames = inbound.makeAsyncIterator()
                    return try await frames.next()
                }
                guard case .helloAck? = answer?.body else {
                    Issue.record("cut \(cut): expected HelloAck, got \(String(describing: answer))")
                    continue
                }
            }
        }
    }

    /// The slow-loris case: one address holds as many unauthenticated connections as it may;
    /// more from it are closed at once, and an enrolled agent from elsewhere still connects
    /// and is pulled, and the admin API answers.
    @Test func oneAddressCannotCrowdOutAgentsOrTheAdminAPI() async throws {
        try await withStopping(InProcessServer(connectionLimits: ConnectionLimits(handshakeSeconds: 60, missedHeartbeats: 30, maxUnauthenticatedPerAddress: 4))) { server in
            let agent = try await server.enrollAgent()
            var held: [any Channel] = []
            for _ in 0..<4 { held.append(try await Self.silentConnection(port: server.agentPort)) }
            #expect(try await Self.waitFor(.seconds(60)) { server.listener.gate.counts.unauthenticated == 4 })
            let extra = try await Self.silentConnection(port: server.agentPort)
            #expect(try await Self.waitFor(.seconds(60)) { !extra.isActive }, "over the address's cap, closed well before the 60 s deadline")
            let allHeld = held.allSatisfy { $0.isActive }
            #expect(allHeld)

            let started = ContinuousClock.now
            let (_, health) = try await URLSession.shared.data(from: try #require(URL(string: server.adminURL + "/health")))
            #expect((health as? HTTPURLResponse)?.statusCode == 200)
            let pulled = try await agent.connect { link in
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: .all))
                let command = try await LinkAgent.acceptNextPull(over: link)
                return command.commandID == pull.id
            }
            #expect(pulled)
            print("slow-loris: admin answered and an enrolled agent was pulled in \(ContinuousClock.now - started) with the address at its cap")
            for channel in held { try await channel.close() }
        }
    }

    /// A second connection of the same agent replaces the first: the first is told goodbye,
    /// its closing does not mark the agent offline, and commands go through the second.
    @Test func aNewConnectionOfAnAgentReplacesTheOld() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent()
            try await agent.connect { first in
                try await agent.connect { second in
                    // The first is told goodbye (its link reports the server's close as an error).
                    let firstEnded = try await Self.closedByServer(first, within: .seconds(120))
                    #expect(firstEnded)
                    #expect(try await Self.waitFor(.seconds(60)) {
                        server.listener.agentConnections.count == 1 && server.listener.gate.counts.authenticated == 1
                    })
                    // The old connection's end was processed; the agent is still shown connected.
                    #expect(try await server.admin.agents().first?.connected == true)
                    let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: .all))
                    let command = try await Self.within(.seconds(120)) { try await LinkAgent.acceptNextPull(over: second) }
                    #expect(command.commandID == pull.id)
                }
            }
            #expect(try await Self.waitFor(.seconds(60)) { try await server.admin.agents().first?.connected == false })
        }
    }

    /// Closed by the silence rule alone: the handshake deadline is far off, and the link is
    /// told goodbye well before it.
    @Test func anAuthenticatedAgentThatGoesSilentIsClosed() async throws {
        try await withStopping(InProcessServer(connectionLimits: ConnectionLimits(handshakeSeconds: 120, missedHeartbeats: 2))) { server in
            let agent = try await server.enrollAgent()
            let ended = try await agent.connect { link in
                try await Self.closedByServer(link, within: .seconds(60))
            }
            #expect(ended)
        }
    }

    @Test func aKeyThatIsAlreadyEnrolledCannotBeEnrolledAgain() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent(hostname: "original")
            await #expect(throws: AgentError.self) {
                _ = try await AgentEnrollment.register(
                    host: "127.0.0.1", port: server.agentPort, tls: agent.tls, token: server.created.enrollmentToken, key: agent.key,
                    hostInfo: .with { $0.hostname = "renamed" })
            }
            #expect(try await server.admin.agents().map(\.hostname) == ["original"])
        }
    }

    /// A command delivered but never answered (the agent went away first) is delivered again
    /// when the agent reconnects.
    @Test func anUnansweredCommandIsDeliveredAgainOnReconnect() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent()
            func nextCommand(_ link: AgentLink) async throws -> WirePullCommand {
                try await Self.within(.seconds(120)) {
                    while let frame = try await link.next() {
                        if case .pullCommand(let command)? = frame.body { return command }
                    }
                    throw AgentError("closed")
                }
            }
            let pull = try await agent.connect { link in
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: .all))
                #expect(try await nextCommand(link).commandID == pull.id)
                return pull
            }
            #expect(try await server.pulls.pull(pull.id)?.targets.first?.status == .delivered)
            try await agent.connect { link in
                let again = try await nextCommand(link)
                #expect(again.commandID == pull.id)
                try await link.send(.with { $0.commandAccepted = .with { $0.commandID = again.commandID; $0.uploadID = again.commandID } })
                #expect(try await Self.waitFor(.seconds(60)) { try await server.pulls.pull(pull.id)?.targets.first?.status == .exporting })
            }
        }
    }

    /// A pull handed to the connection as it is queued (``FreshPull``) is sent once, also when
    /// a read of the agent's due pulls finds it too, or its wake comes twice.
    @Test func aFreshPullIsSentOnceHoweverItIsWoken() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent()
            let dispatcher = server.listener.dispatcher
            let received = try await agent.connect { link in
                try await Self.within(.seconds(120)) {
                    var ids: [String] = []
                    func until(_ id: String) async throws {
                        while let frame = try await link.next() {
                            if case .pullCommand(let command)? = frame.body { ids.append(command.commandID) }
                            if ids.contains(id) { return }
                        }
                        throw AgentError("closed")
                    }
                    // Through the admin API: the connection's delivery is running.
                    let first = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: .all))
                    try await until(first.id)
                    var queued: [String] = []
                    for round in 0..<4 {
                        let pull = try server.issuer.newPull(
                            uid: "", agentID: agent.agentID, filter: .all, targets: [agent.agentID], lifetime: .seconds(60), requestedBy: "test")
                        try await server.pulls.create(pull)
                        queued.append(pull.id)
                        let fresh = FreshPull(StoredPull(pull))
                        // Delivered by a read, or by its own wake; then woken as fresh again.
                        dispatcher.wake([agent.agentID], with: round.isMultiple(of: 2) ? nil : fresh)
                        guard try await Self.waitFor(.seconds(60), { try await server.pulls.pull(pull.id)?.targets.first?.status == .delivered }) else {
                            throw AgentError("pull \(pull.id) was not delivered")
                        }
                        dispatcher.wake([agent.agentID], with: fresh)
                        dispatcher.wake([agent.agentID], with: fresh)
                    }
                    // Woken after every wake above, so delivered after whatever they sent.
                    let last = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: .all))
                    try await until(last.id)
                    return (queued: queued, ids: ids, first: first.id, last: last.id)
                }
            }
            #expect(received.ids.count == 6)
            #expect(Set(received.ids) == Set(received.queued + [received.first, received.last]))
        }
    }

    /// A pull whose stored row cannot be read back is failed with the reason, on its own: the
    /// agent's other pulls are delivered, and the bad one is never sent as "everything".
    @Test func aPoisonedPullFailsAloneAndIsNeverSent() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent()
            let bad = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: LogFilter(uid: "u-1")))
            // Its key does not unwrap: found only once the command is being made (and the pull
            // already marked delivered).
            let badKey = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: LogFilter(uid: "u-2")))
            let good = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: .all))
            try await server.pulls.db.write { try $0.execute(sql: "UPDATE pull SET filter = '{\"uid\": 7' WHERE id = ?", arguments: [bad.id]) }
            try await server.pulls.db.write { try $0.execute(sql: "UPDATE pull SET wrapped_key = x'00' WHERE id = ?", arguments: [badKey.id]) }
            let received = try await agent.connect { link in
                try await Self.within(.seconds(120)) {
                    var ids: [String] = []
                    while let frame = try await link.next() {
                        if case .pullCommand(let command)? = frame.body { ids.append(command.commandID) }
                        if ids.contains(good.id) { break }
                    }
                    return ids
                }
            }
            #expect(received == [good.id])
            let target = try #require(try await server.pulls.pull(bad.id)?.targets.first)
            #expect(target.status == .failed)
            #expect(try await server.pulls.pull(badKey.id)?.targets.first?.status == .failed)
            #expect(try await server.pulls.pull(bad.id)?.filter == nil)
            #expect(try await server.pulls.pull(good.id)?.filter == .all)
            #expect(server.logs.records.contains { $0.level == .error && $0.metadata["pull.id"] == "\(bad.id)" })
        }
    }

    /// The agent's side: a server that stops answering (here a proxy that swallows whatever
    /// the server sends after a few seconds) is given up after three missed heartbeat acks,
    /// and the agent connects again.
    @Test func theAgentReconnectsWhenTheServerStopsAnswering() async throws {
        try await withStopping(InProcessServer()) { server in
            let proxy = try StallingProxy(targetPort: server.agentPort, forwardFor: .seconds(3))
            let dir = server.dir.file("agent")
            var state = try await AgentEnrollment.enroll(
                host: "127.0.0.1", port: server.agentPort, caPEM: contents(server.data + "/ca.pem"), token: server.created.enrollmentToken,
                stateDirectory: dir, hostInfo: .with { $0.hostname = "device" })
            state.file.serverPort = proxy.port
            let client = try AgentClient(state: state, store: nil, hostInfo: .with { $0.hostname = "device" }, logger: Logger(label: "test.agent") { _ in SwiftLogNoOpLogHandler() })
            try await withBackground({ try await client.run() }) { () async throws in
                // Generous: should the stall begin before authentication on a loaded machine, the
                // server's handshake deadline (120 s here) ends that connection instead.
                #expect(try await Self.waitFor(.seconds(300)) { proxy.connections.withLockedValue { $0 } >= 2 })
            }
        }
    }

    /// A node that takes the connection and then hangs — before the TLS handshake completes,
    /// or after it and before authenticating — is given up after the agent's deadline, and the
    /// next address is tried: a hung node of a cluster does not keep its agents from the others.
    @Test func theAgentMovesOnFromANodeThatHangsBeforeTheConnectionIsReady() async throws {
        try await withStopping(InProcessServer()) { server in
            let noHandshake = try StallingProxy(targetPort: server.agentPort, forwardFor: .zero)
            let noAuthentication = try SilentTLSServer(data: server.data)
            // Enrollment, too, goes on to the next address.
            let state = try await AgentEnrollment.enroll(
                servers: [noHandshake.port, server.agentPort].map { ServerAddress(host: "127.0.0.1", port: $0) }, caPEM: contents(server.data + "/ca.pem"),
                token: server.created.enrollmentToken, stateDirectory: server.dir.file("agent"), hostInfo: .with { $0.hostname = "device" }, handshakeTimeout: .seconds(3))
            #expect(noHandshake.connections.withLockedValue { $0 } == 1)
            let client = try AgentClient(
                state: state, store: nil, hostInfo: .with { $0.hostname = "device" }, logger: Logger(label: "test.agent") { _ in SwiftLogNoOpLogHandler() },
                servers: [noHandshake.port, noAuthentication.port, server.agentPort].map { ServerAddress(host: "127.0.0.1", port: $0) }, readyTimeout: .seconds(3))
            try await withBackground({ try await client.run() }) { () async throws in
                #expect(try await Self.waitFor(.seconds(120)) { try await server.registry.agents().first?.connected == true })
            }
        }
    }
}
