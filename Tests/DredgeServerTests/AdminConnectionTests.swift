import DredgeAdminAPI
import DredgeTestSupport
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization
import Testing
@testable import DredgeServer

/// The admin listener's own deadlines and caps (#49: it had none of the agent port's, so idle,
/// trickling and piled-up connections were held for ever, and at the open-file limit they took
/// the agent port and `/health` down with them). Through the real admin API on loopback, with
/// raw TCP and TLS clients; each wait for a close is an event (the channel's close), bounded so
/// a broken rule fails instead of hanging.
@Suite struct AdminConnectionTests {
    /// Short deadlines for a head or a body, so the test sees them pass; the wait for a first
    /// byte and the handshake longer, so a loaded machine (the whole suite runs at once on two
    /// cores) does not end a connection in the phase before the one a test means.
    static let quick = AdminConnectionLimits(handshakeSeconds: 10, headerSeconds: 1, bodySeconds: 1, idleSeconds: 10)
    /// Room for a loaded machine past the longest deadline.
    static let generous: Duration = .seconds(90)

    /// The bytes a client channel received.
    final class Received: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let bytes = Mutex<[UInt8]>([])
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            bytes.withLock { $0 += buffer.readableBytesView }
        }
        var text: String { String(decoding: bytes.withLock { $0 }, as: UTF8.self) }
    }

    /// Sends, from the connection's own event loop as soon as it is connected, `prefix` at
    /// once and then `trickle` a byte every 200 ms until the connection closes: the bytes keep
    /// their pace however long the test's own tasks wait for a thread on a loaded machine.
    final class Sender: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        typealias InboundOut = ByteBuffer
        let prefix: String
        private let remaining: Mutex<ArraySlice<UInt8>>
        private let repeating = Mutex<RepeatedTask?>(nil)
        init(prefix: String, trickle: String) {
            self.prefix = prefix
            remaining = Mutex(Array(trickle.utf8)[...])
        }
        func channelActive(context: ChannelHandlerContext) {
            let channel = context.channel
            if !prefix.isEmpty { channel.writeAndFlush(ByteBuffer(string: prefix), promise: nil) }
            repeating.withLock {
                $0 = channel.eventLoop.scheduleRepeatedTask(initialDelay: .zero, delay: .milliseconds(200)) { [self] task in
                    guard channel.isActive, let byte = remaining.withLock({ $0.popFirst() }) else { return task.cancel() }
                    channel.writeAndFlush(ByteBuffer(bytes: [byte]), promise: nil)
                }
            }
            context.fireChannelActive()
        }
        func channelInactive(context: ChannelHandlerContext) {
            repeating.withLock { $0?.cancel() }
            context.fireChannelInactive()
        }
    }

    /// A TCP connection from `source` to `port`, keeping what it receives; `sending`: what it
    /// sends by itself once connected (``Sender``).
    static func connect(
        _ port: Int, from source: String = "127.0.0.2", tls: NIOSSLContext? = nil, sending: (prefix: String, trickle: String)? = nil
    ) async throws -> (channel: any Channel, received: Received) {
        let received = Received()
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls { try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: nil)) }
                    try channel.pipeline.syncOperations.addHandler(received)
                    if let sending { try channel.pipeline.syncOperations.addHandler(Sender(prefix: sending.prefix, trickle: sending.trickle)) }
                }
            }
            .bind(to: try SocketAddress(ipAddress: source, port: 0))
            .connect(host: "127.0.0.1", port: port).get()
        return (channel, received)
    }

    struct StillOpen: Error, CustomStringConvertible {
        var description: String
    }

    /// Returns once the server has closed `channel`; throws after `limit`. (Polled: waiting on
    /// the close future cannot be cancelled, so a connection never closed would hang the test.)
    static func closedByServer(_ channel: any Channel, within limit: Duration = generous) async throws {
        let deadline = ContinuousClock.now + limit
        while channel.isActive {
            guard ContinuousClock.now < deadline else { throw StillOpen(description: "\(channel.remoteAddress.map { "\($0)" } ?? "?") still open after \(limit)") }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Whether the server logged `message` with these metadata values.
    static func logged(_ server: InProcessServer, _ message: String, _ metadata: [String: String] = [:]) -> Bool {
        server.logs.records.contains { record in
            record.message == message && metadata.allSatisfy { key, value in record.metadata[key].map { "\($0)" } == value }
        }
    }

    @Test func idleAndTricklingConnectionsAreClosedAtTheirDeadlines() async throws {
        try await withStopping(InProcessServer(adminLimits: Self.quick)) { server in
            let port = try #require(URL(string: server.adminURL)?.port)
            // Silent from the start.
            let (silent, _) = try await Self.connect(port, from: "127.0.0.2")
            // A head that never ends, a byte every 200 ms from the moment it connects: each byte
            // arrives well inside any idle timer, the head's deadline still passes.
            let (header, _) = try await Self.connect(
                port, from: "127.0.0.3", sending: ("", "GET /health HTTP/1.1\r\nHost: dredge\r\nX-Slow: " + String(repeating: "a", count: 200)))
            // A whole head, then a body that trickles.
            let (body, _) = try await Self.connect(
                port, from: "127.0.0.4",
                sending: ("POST /v1/tokens HTTP/1.1\r\nHost: dredge\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n", String(repeating: " ", count: 500)))
            // A request answered, then nothing more on the kept-alive connection.
            let (kept, keptReceived) = try await Self.connect(port, from: "127.0.0.5")
            try await kept.writeAndFlush(ByteBuffer(string: "GET /health HTTP/1.1\r\nHost: dredge\r\n\r\n"))

            for channel in [silent, header, body, kept] { try await Self.closedByServer(channel) }
            #expect(keptReceived.text.hasPrefix("HTTP/1.1 200"), "\(keptReceived.text)")
            #expect(keptReceived.text.contains("\"ok\""), "\(keptReceived.text)")
            // Each closed by the deadline of the phase it was in, logged with its address.
            for (address, phase) in [("127.0.0.2", "idle"), ("127.0.0.3", "head"), ("127.0.0.4", "body"), ("127.0.0.5", "idle")] {
                #expect(Self.logged(server, "admin connection closed at its deadline", ["remote": address, "phase": phase]), "\(address) \(phase)")
            }
            // The listener still serves.
            #expect(try await server.admin.agents().isEmpty)
        }
    }

    @Test func aTLSConnectionIsClosedIfItsHandshakeOrItsFirstRequestDoesNotCome() async throws {
        try await withStopping(InProcessServer(adminLimits: Self.quick, adminTLS: true)) { server in
            let port = try #require(URL(string: server.adminURL)?.port)
            // TCP only: TLS never starts.
            let (plain, _) = try await Self.connect(port, from: "127.0.0.2")
            // TLS done, then silence.
            var configuration = TLSConfiguration.makeClientConfiguration()
            configuration.trustRoots = .file(server.data + "/ca.pem")
            configuration.certificateVerification = .noHostnameVerification
            let (secure, _) = try await Self.connect(port, from: "127.0.0.3", tls: try NIOSSLContext(configuration: configuration))
            for channel in [plain, secure] { try await Self.closedByServer(channel) }
            #expect(Self.logged(server, "admin connection closed at its deadline", ["remote": "127.0.0.2", "phase": "handshake"]))
            #expect(Self.logged(server, "admin connection closed at its deadline", ["remote": "127.0.0.3", "phase": "idle"]))
            // A real client still gets its answer over TLS.
            #expect(try await server.admin.agents().isEmpty)
        }
    }

    /// A few requests sent ahead of their answers are answered in order; more than
    /// ``AdminConnectionWatch/maxPipelined`` (thousands, never read, would hold the connection
    /// busy for ever) close the connection.
    @Test func pipelinedRequestsAreAnsweredUpToALimit() async throws {
        let limits = AdminConnectionLimits(handshakeSeconds: 60, headerSeconds: 60, bodySeconds: 60, idleSeconds: 60)
        try await withStopping(InProcessServer(adminLimits: limits)) { server in
            let port = try #require(URL(string: server.adminURL)?.port)
            let request = "GET /health HTTP/1.1\r\nHost: dredge\r\n\r\n"
            let (polite, received) = try await Self.connect(port, from: "127.0.0.2")
            try await polite.writeAndFlush(ByteBuffer(string: String(repeating: request, count: 3)))
            #expect(try await PullOutcomeTests.waitFor { received.text.components(separatedBy: "HTTP/1.1 200").count == 4 }, "\(received.text)")
            #expect(polite.isActive)
            let (greedy, _) = try await Self.connect(port, from: "127.0.0.3")
            try await greedy.writeAndFlush(ByteBuffer(string: String(repeating: request, count: AdminConnectionWatch.maxPipelined + 4)))
            try await Self.closedByServer(greedy)
            #expect(Self.logged(server, "admin connection closed at its deadline", ["remote": "127.0.0.3", "phase": "pipelined"]))
            try await polite.close()
        }
    }

    @Test func theAdminListenerCapsItsConnectionsAndMakesRoomForANewOne() async throws {
        let limits = AdminConnectionLimits(handshakeSeconds: 600, headerSeconds: 600, bodySeconds: 600, idleSeconds: 600, maxConnections: 4, maxPerAddress: 2)
        try await withStopping(InProcessServer(adminLimits: limits)) { server in
            let port = try #require(URL(string: server.adminURL)?.port)
            // Each connection answered once before the next opens: each is admitted on its own
            // event loop, and a connection is only known admitted once it has been answered.
            func answered(from source: String) async throws -> any Channel {
                let (channel, received) = try await Self.connect(port, from: source)
                try await channel.writeAndFlush(ByteBuffer(string: "GET /health HTTP/1.1\r\nHost: dredge\r\n\r\n"))
                #expect(try await PullOutcomeTests.waitFor(Self.generous) { received.text.contains("HTTP/1.1 200") })
                return channel
            }
            let first = try await answered(from: "127.0.0.2")
            let second = try await answered(from: "127.0.0.2")
            // Over the per-address cap: closed at once.
            let third = try await Self.connect(port, from: "127.0.0.2").channel
            try await Self.closedByServer(third)
            #expect(Self.logged(server, "admin connection refused", ["remote": "127.0.0.2", "reason": "2 connections from 127.0.0.2 are open"]))
            let fourth = try await answered(from: "127.0.0.3")
            let fifth = try await answered(from: "127.0.0.3")
            // Full (4 held, all idle): an engineer's request still gets through, in the place
            // of the oldest idle connection, which is closed: one of the first two (each
            // connection is admitted on its own event loop, so which of two opened back to back
            // the server saw first is not fixed).
            #expect(try await server.admin.agents().isEmpty)
            #expect(try await PullOutcomeTests.waitFor(Self.generous) { !first.isActive || !second.isActive })
            #expect(Self.logged(server, "closing the oldest idle admin connection to make room", ["remote": "127.0.0.1"]))
            #expect([first, second].filter(\.isActive).count == 1)
            for channel in [fourth, fifth] { #expect(channel.isActive) }
            for channel in [first, second, fourth, fifth] where channel.isActive { try await channel.close() }
        }
    }

    /// The two listeners' caps together stay inside the open-file limit, leaving room for the
    /// databases and uploads; an admin cap raised above its default comes out of the agents'.
    @Test func theListenersCapsShareTheOpenFileLimit() throws {
        let admin = AdminConnectionLimits.default.maxConnections
        let caps = ConnectionLimits().caps(openFiles: 1024, adminConnections: admin)
        #expect(caps.authenticated + caps.unauthenticated + admin <= 1024 - 128)
        let raised = ConnectionLimits().caps(openFiles: 1024, adminConnections: 264)
        #expect(raised.authenticated + raised.unauthenticated + 264 == caps.authenticated + caps.unauthenticated + admin)
        // server.json: keys left out keep their defaults; a limit that cannot work is refused with its reason.
        let decoded = try JSONDecoder().decode(AdminConnectionLimits.self, from: Data(#"{"idleSeconds": 5}"#.utf8))
        #expect(decoded == AdminConnectionLimits(idleSeconds: 5))
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(AdminConnectionLimits.self, from: Data(#"{"maxPerAddress": 0}"#.utf8)) }
        #expect(AdminConnectionLimits(maxConnections: 4, maxPerAddress: 5).problem == "maxPerAddress must be 1 to maxConnections")
        #expect(AdminConnectionLimits(headerSeconds: 0).problem == "headerSeconds must be in (0, 3600]")
    }
}
