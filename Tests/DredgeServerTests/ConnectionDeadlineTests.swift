@testable import DredgeServer
import DredgeWire
import NIOCore
import NIOEmbedded
import Synchronization
import Testing

/// The connection deadlines on an embedded channel, whose clock the test moves: no sleeps.
@Suite struct ConnectionDeadlineTests {
    /// The reasons the handler asked the connection to say goodbye with.
    final class Goodbyes: Sendable {
        let said = Mutex<[String]>([])
    }

    func channel(handshake: Int64 = 10, missed: Int = 3) throws -> (EmbeddedChannel, FrameSizeLimit, Goodbyes) {
        let limit = FrameSizeLimit(WireLimits.maxPreAuthFrameBytes)
        let goodbyes = Goodbyes()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(ConnectionDeadlineHandler(
            handshake: .seconds(handshake), missedHeartbeats: missed, frameLimit: limit, goodbye: { reason in goodbyes.said.withLock { $0.append(reason) } }))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, limit, goodbyes)
    }

    /// What the connection's driver announces once the machine authenticated the agent.
    static func authenticate(_ channel: EmbeddedChannel) {
        channel.pipeline.triggerUserOutboundEvent(AgentConnectionEvent.authenticated(heartbeatSeconds: 30), promise: nil)
    }

    static let authResult = WireFrame.with { $0.authResult = .with { $0.agentID = String(repeating: "a", count: 32); $0.heartbeatIntervalS = 30 } }
    static let heartbeat = WireFrame.with { $0.heartbeat = .with { $0.seq = 1 } }

    @Test func aConnectionThatDoesNotAuthenticateInTimeIsClosed() throws {
        let (channel, _, _) = try channel()
        // Frames that are not an authentication do not extend the deadline.
        channel.embeddedEventLoop.advanceTime(by: .seconds(9))
        try channel.writeInbound(WireFrame.with { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1 } })
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
    }

    @Test func authenticationLiftsTheHandshakeDeadlineAndTheFrameLimit() throws {
        let (channel, limit, _) = try channel()
        #expect(limit.bytes == WireLimits.maxPreAuthFrameBytes)
        channel.embeddedEventLoop.advanceTime(by: .seconds(5))
        Self.authenticate(channel)
        #expect(limit.bytes == WireLimits.maxFrameBytes)
        channel.embeddedEventLoop.advanceTime(by: .seconds(60))
        #expect(channel.isActive, "past the handshake deadline, but authenticated")
        _ = try channel.finish(acceptAlreadyClosed: true)
    }

    /// Authentication is the machine's to decide and the driver's to announce: an `AuthResult`
    /// frame passing by (one the handler once watched for) changes nothing.
    @Test func anAuthResultPassingByIsNotTakenForAnAuthentication() throws {
        let (channel, limit, _) = try channel()
        try channel.writeOutbound(Self.authResult)
        #expect(try channel.readOutbound(as: WireFrame.self) == Self.authResult)
        #expect(limit.bytes == WireLimits.maxPreAuthFrameBytes)
        channel.embeddedEventLoop.advanceTime(by: .seconds(10))
        #expect(!channel.isActive, "still under the handshake deadline")
    }

    @Test func anAuthenticatedAgentSilentForThreeIntervalsIsToldAndClosed() throws {
        let (channel, _, goodbyes) = try channel()
        Self.authenticate(channel)
        // Heartbeats keep it open well past 90 s in all.
        for _ in 0..<5 {
            channel.embeddedEventLoop.advanceTime(by: .seconds(80))
            try channel.writeInbound(Self.heartbeat)
            #expect(channel.isActive)
        }
        channel.embeddedEventLoop.advanceTime(by: .seconds(89))
        #expect(channel.isActive)
        #expect(goodbyes.said.withLock { $0 }.isEmpty)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        // Told why through the connection's machine; closed anyway if that never happens.
        #expect(goodbyes.said.withLock { $0 } == ["nothing received for 90 s"])
        channel.embeddedEventLoop.advanceTime(by: .seconds(5))
        #expect(!channel.isActive)
    }
}

/// The connection caps, as the gate counts them.
@Suite struct ConnectionGateTests {
    static func channel() -> EmbeddedChannel { EmbeddedChannel() }

    @Test func perAddressCapRefusesAndTheGlobalCapEvictsTheOldest() throws {
        let gate = ConnectionGate(caps: .init(authenticated: 2, unauthenticated: 3, unauthenticatedPerAddress: 2))
        var tokens: [Int] = []
        for address in ["10.0.0.1", "10.0.0.1"] {
            guard case .admitted(let token, nil) = gate.admit(address: address, channel: Self.channel()) else {
                Issue.record("refused under the cap")
                return
            }
            tokens.append(token)
        }
        guard case .refused = gate.admit(address: "10.0.0.1", channel: Self.channel()) else {
            Issue.record("a third from one address was admitted")
            return
        }
        let oldest = tokens[0]
        guard case .admitted(let third, nil) = gate.admit(address: "10.0.0.2", channel: Self.channel()) else {
            Issue.record("another address was refused")
            return
        }
        // The unauthenticated pool is full: the next takes the oldest one's place.
        guard case .admitted(let fourth, let evicted) = gate.admit(address: "10.0.0.3", channel: Self.channel()) else {
            Issue.record("a new address was refused when it could evict")
            return
        }
        #expect(evicted != nil)
        #expect(!gate.authenticate(oldest), "the evicted connection cannot authenticate")
        #expect(gate.authenticate(third))
        #expect(gate.authenticate(fourth))
        #expect(gate.counts.authenticated == 2)
        // The agents' pool is full: a third agent is refused, and a released place is reusable.
        guard case .admitted(let fifth, _) = gate.admit(address: "10.0.0.4", channel: Self.channel()) else {
            Issue.record("refused")
            return
        }
        #expect(!gate.authenticate(fifth))
        gate.release(third)
        #expect(gate.authenticate(fifth))
    }

    @Test func capsLeaveRoomForAgentsAndTheAdminAPI() {
        let caps = ConnectionLimits().caps(openFiles: 1024)
        #expect(caps.authenticated + caps.unauthenticated == 1024 - ConnectionLimits.reservedFileDescriptors)
        #expect(caps.unauthenticated < caps.authenticated)
        #expect(ConnectionLimits(maxConnections: 10, maxUnauthenticated: 10).problem != nil)
        // A large process keeps at most 1,024 places for connections still authenticating, so
        // almost all of its file descriptors can hold agents (a quarter held back 5,000 of 20,000).
        let large = ConnectionLimits().caps(openFiles: 20_000)
        #expect(large.unauthenticated == 1_024)
        #expect(large.authenticated == 20_000 - ConnectionLimits.reservedFileDescriptors - 1_024)
        #expect(ConnectionLimits(maxUnauthenticated: 5_000).caps(openFiles: 20_000).unauthenticated == 5_000)
    }
}
