import ArgumentParser
import DredgeServer
import DredgeWire
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS

/// `dredge-bench unauthenticated`: `server.unauthenticated_connections`, the real
/// `dredge-server`'s memory per connection that finished TLS and never authenticated, in two
/// states: silent after the handshake, and holding the largest partial frame a connection may
/// send before it authenticates (a length prefix announcing ``WireLimits/maxPreAuthFrameBytes``
/// and all but the last byte of the body, which the server must buffer). The limit is the
/// goal, 64 KB a connection; the worst of the two states is the figure. The handshake
/// deadline is lifted for the run (`connections.handshakeSeconds` 600) so that the server holds
/// them while they are measured; the test suite proves the deadline closes them.
struct UnauthenticatedBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unauthenticated", abstract: "Memory per unauthenticated connection, silent and holding a partial frame.")

    @Option(help: "Unauthenticated connections held.")
    var connections = 1_000

    @Flag(help: ArgumentHelp("Shape the TLS records against the server: the frame's first 16,384 bytes in one record, 3 more in a second, then a record of 16,000 bytes whose last byte is never sent (the server holds the frame and that record)."))
    var shaped = false

    @Option(help: "Seconds each state is held after it is measured (to look at the server meanwhile).")
    var holdSeconds = 0

    @Option(help: "Body bytes of the partial frame each connection sends (default: all but one byte of the largest).")
    var partialBytes = WireLimits.maxPreAuthFrameBytes - 1

    func validate() throws {
        guard connections > 0 && connections <= 4_000 else { throw ValidationError("--connections must be in 1...4000") }
        guard partialBytes >= 0 && partialBytes < WireLimits.maxPreAuthFrameBytes else {
            throw ValidationError("--partial-bytes must be in 0..<\(WireLimits.maxPreAuthFrameBytes)")
        }
    }

    func run() async throws {
        ServerRuntime.raiseOpenFileLimit()
        let dir = NSTemporaryDirectory() + "dredge-bench-unauthenticated-\(getpid())"
        try? FileManager.default.removeItem(atPath: dir)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let created = try ServerDeployment.initialize(.init(dataDirectory: dir + "/server"))
        try Self.holdUnauthenticated(dir + "/server", count: connections + 64)
        let server = try ServerProcess(data: dir + "/server", log: dir + "/server.log")
        defer { server.stop() }
        let tls = try NIOSSLContext(configuration: {
            var c = TLSConfiguration.makeClientConfiguration()
            c.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(String(contentsOfFile: created.caPath, encoding: .utf8).utf8)))
            return c
        }())
        let group = MultiThreadedEventLoopGroup.singleton

        // Warm up: the server's first handshakes and buffers, opened and closed, before the baseline.
        let warm = try await Self.open(64, port: server.agentPort, tls: tls, group: group)
        for c in warm { try await c.close().get() }
        try await Task.sleep(for: .seconds(2))
        let baseline = server.residentKB()

        let held = try await Self.open(connections, port: server.agentPort, tls: tls, group: group)
        try await Task.sleep(for: .seconds(2))
        let silent = server.residentKB()
        FileHandle.standardError.write(Data("holding \(held.count) silent connections (server pid \(server.process.processIdentifier))\n".utf8))
        try await Task.sleep(for: .seconds(holdSeconds))

        for channel in held {
            if shaped {
                // One full record (the prefix and 16,380 bytes of the frame), a small one (3 more:
                // the frame lacks one byte), then a record the server can never decrypt, as it
                // lacks its last byte.
                var first = channel.allocator.buffer(capacity: 16_384)
                first.writeInteger(UInt32(WireLimits.maxPreAuthFrameBytes))
                first.writeRepeatingByte(0x0A, count: 16_380)
                var second = channel.allocator.buffer(capacity: 3)
                second.writeRepeatingByte(0x0A, count: 3)
                var third = channel.allocator.buffer(capacity: 16_000)
                third.writeRepeatingByte(0x0A, count: 16_000)
                try await channel.eventLoop.submit { [first, second, third] in
                    channel.writeAndFlush(first, promise: nil)
                    channel.writeAndFlush(second, promise: nil)
                    try channel.pipeline.syncOperations.handler(type: Withholder.self).armed = true
                    channel.writeAndFlush(third, promise: nil)
                }.get()
            } else {
                // A length prefix announcing the largest pre-authentication frame, and all of its body but one byte.
                var buffer = channel.allocator.buffer(capacity: 4 + partialBytes)
                buffer.writeInteger(UInt32(WireLimits.maxPreAuthFrameBytes))
                buffer.writeRepeatingByte(0x0A, count: partialBytes)
                channel.writeAndFlush(buffer, promise: nil)
            }
        }
        try await Task.sleep(for: .seconds(3))
        let partial = server.residentKB()
        FileHandle.standardError.write(Data("holding \(held.count) connections with a partial frame\n".utf8))
        try await Task.sleep(for: .seconds(holdSeconds))
        let open = held.filter(\.isActive).count
        for c in held { c.close(promise: nil) }
        guard open == held.count else { throw ValidationError("the server closed \(held.count - open) of the \(held.count) connections while they were measured") }

        let silentKB = Double(silent - baseline) / Double(held.count)
        let partialKB = Double(partial - baseline) / Double(held.count)
        print(Figure(
            name: "server.unauthenticated_connections", value: max(silentKB, partialKB), unit: "KB/conn", limit: 64, higherIsBetter: false,
            extra: String(
                format: "kb_silent=%.1f kb_partial_frame=%.1f partial_frame_bytes=%d shaped=%@ connections=%d baseline_mb=%.0f",
                silentKB, partialKB, shaped ? 16_387 : 4 + partialBytes, shaped ? "yes" : "no", held.count, Double(baseline) / 1024)).line)
    }

    /// Lets one address hold `count` unauthenticated connections for ten minutes.
    static func holdUnauthenticated(_ data: String, count: Int) throws {
        try ServerBench.setConnections(["maxUnauthenticated": count, "maxUnauthenticatedPerAddress": count, "handshakeSeconds": 600], in: data)
    }

    /// `count` connections that completed TLS (64 handshakes at a time) and said nothing.
    static func open(_ count: Int, port: Int, tls: NIOSSLContext, group: any EventLoopGroup) async throws -> [any Channel] {
        var channels: [any Channel] = []
        while channels.count < count {
            let batch = try await withThrowingTaskGroup(of: (any Channel).self) { tasks in
                for _ in 0..<min(64, count - channels.count) {
                    tasks.addTask {
                        let handshaken = group.any().makePromise(of: Void.self)
                        let channel = try await ClientBootstrap(group: group)
                            .connectTimeout(.seconds(10))
                            .channelInitializer { channel in
                                channel.eventLoop.makeCompletedFuture {
                                    try channel.pipeline.syncOperations.addHandler(Withholder())
                                    try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: nil))
                                    try channel.pipeline.syncOperations.addHandler(HandshakeDone(promise: handshaken))
                                }
                            }
                            .connect(host: "127.0.0.1", port: port).get()
                        channel.closeFuture.whenComplete { _ in handshaken.fail(ChannelError.inputClosed) }
                        try await handshaken.futureResult.get()
                        return channel
                    }
                }
                var batch: [any Channel] = []
                for try await c in tasks { batch.append(c) }
                return batch
            }
            channels += batch
        }
        return channels
    }
}

/// Between TLS and the socket: once armed, sends the next write without its last byte (and
/// nothing after it).
private final class Withholder: ChannelOutboundHandler {
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    var armed = false
    private var withholding = false

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard armed || withholding else { return context.write(data, promise: promise) }
        if armed {
            armed = false
            withholding = true
            var buffer = unwrapOutboundIn(data)
            if let sent = buffer.readSlice(length: max(0, buffer.readableBytes - 1)) { context.write(wrapOutboundOut(sent), promise: promise) }
        } else {
            promise?.succeed()
        }
    }
}

/// Fulfils its promise when the TLS handshake completes.
private final class HandshakeDone: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let promise: EventLoopPromise<Void>

    init(promise: EventLoopPromise<Void>) { self.promise = promise }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted = event { promise.succeed() }
        context.fireUserInboundEventTriggered(event)
    }
}
