import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL

/// A TCP proxy on loopback that cuts every connection after a random number of bytes from the
/// client, so the connection breaks at arbitrary points of a TLS stream — mid-frame, mid-chunk,
/// with acks in flight. Counts the bytes it forwarded from clients.
final class CuttingProxy: @unchecked Sendable {
    let channel: any Channel
    let cuts = NIOLockedValueBox(0)
    /// Bytes forwarded from clients to the server, over every connection.
    let forwarded = NIOLockedValueBox(0)
    var port: Int { channel.localAddress!.port! }

    /// - Parameter cutAfter: where in each connection's bytes from the client to cut it; nil
    ///   never cuts (a proxy that only counts).
    init(targetPort: Int, cutAfter: ClosedRange<Int>?) throws {
        let (cutsBox, forwardedBox) = (cuts, forwarded)
        channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { inbound in
                let budget = cutAfter.map { Int.random(in: $0) }
                return ClientBootstrap(group: inbound.eventLoop)
                    .connect(host: "127.0.0.1", port: targetPort)
                    .flatMap { outbound in
                        // With nothing listening on the target port (the server killed, not
                        // back yet), a connect whose ephemeral source port happens to be that
                        // port connects the socket to itself (TCP simultaneous open) and holds
                        // the port, and the restarted server cannot bind it. Dropped at once.
                        if outbound.localAddress?.port == targetPort {
                            outbound.close(promise: nil)
                            return inbound.eventLoop.makeFailedFuture(SelfConnected())
                        }
                        let toServer = Forward(peer: outbound, budget: budget, cuts: cutsBox, forwarded: forwardedBox)
                        let toClient = Forward(peer: inbound, budget: nil, cuts: cutsBox, forwarded: nil)
                        return inbound.pipeline.addHandler(toServer).flatMap { outbound.pipeline.addHandler(toClient) }
                    }
            }
            .bind(host: "127.0.0.1", port: 0).wait()
    }

    deinit { try? channel.close().wait() }

    /// Copies bytes to `peer`, counting them in `forwarded`; after `budget` bytes closes both sides.
    final class Forward: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let peer: any Channel
        var budget: Int?
        let cuts: NIOLockedValueBox<Int>
        let forwarded: NIOLockedValueBox<Int>?

        init(peer: any Channel, budget: Int?, cuts: NIOLockedValueBox<Int>, forwarded: NIOLockedValueBox<Int>?) {
            self.peer = peer
            self.budget = budget
            self.cuts = cuts
            self.forwarded = forwarded
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var bytes = unwrapInboundIn(data)
            if let remaining = budget {
                if bytes.readableBytes >= remaining {
                    let part = bytes.readSlice(length: remaining)!
                    forwarded?.withLockedValue { $0 += part.readableBytes }
                    peer.writeAndFlush(part).whenComplete { [peer] _ in peer.close(promise: nil) }
                    cuts.withLockedValue { $0 += 1 }
                    context.close(promise: nil)
                    budget = 0
                    return
                }
                budget = remaining - bytes.readableBytes
            }
            forwarded?.withLockedValue { $0 += bytes.readableBytes }
            peer.writeAndFlush(bytes, promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            peer.close(promise: nil)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}

/// A TCP proxy on loopback that forwards both ways for `forwardFor`, then keeps every
/// connection open but drops whatever the server sends: a server that hangs, seen from the
/// agent. Counts the connections it accepted.
final class StallingProxy: @unchecked Sendable {
    let channel: any Channel
    let connections = NIOLockedValueBox(0)
    var port: Int { channel.localAddress!.port! }

    init(targetPort: Int, forwardFor: TimeAmount) throws {
        let count = connections
        channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { inbound in
                count.withLockedValue { $0 += 1 }
                let stallAt = NIODeadline.now() + forwardFor
                return ClientBootstrap(group: inbound.eventLoop)
                    .connect(host: "127.0.0.1", port: targetPort)
                    .flatMap { outbound in
                        inbound.pipeline.addHandler(Stall(peer: outbound, stallAt: nil)).flatMap {
                            outbound.pipeline.addHandler(Stall(peer: inbound, stallAt: stallAt))
                        }
                    }
            }
            .bind(host: "127.0.0.1", port: 0).wait()
    }

    deinit { try? channel.close().wait() }

    final class Stall: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let peer: any Channel
        let stallAt: NIODeadline?

        init(peer: any Channel, stallAt: NIODeadline?) {
            self.peer = peer
            self.stallAt = stallAt
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            if let stallAt, NIODeadline.now() >= stallAt { return }
            peer.writeAndFlush(unwrapInboundIn(data), promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) { peer.close(promise: nil) }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
    }
}

/// A TLS server on loopback with a deployment's certificate that completes the handshake and
/// then answers nothing: a node that accepts connections and hangs before authenticating them,
/// seen from the agent. Counts the connections it accepted.
final class SilentTLSServer: @unchecked Sendable {
    let channel: any Channel
    let connections = NIOLockedValueBox(0)
    var port: Int { channel.localAddress!.port! }

    /// - Parameter data: the deployment's data directory (`server.pem`, `server-key.pem`).
    init(data: String) throws {
        let tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(data + "/server.pem").map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: data + "/server-key.pem", format: .pem)))
        let context = try NIOSSLContext(configuration: tls)
        let count = connections
        channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { child in
                count.withLockedValue { $0 += 1 }
                return child.eventLoop.makeCompletedFuture {
                    try child.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    try child.pipeline.syncOperations.addHandler(Swallow())
                }
            }
            .bind(host: "127.0.0.1", port: 0).wait()
    }

    deinit { try? channel.close().wait() }

    /// Reads and drops whatever the client sends.
    final class Swallow: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
    }
}

/// The proxy's connection to the server reached itself (see ``CuttingProxy``).
struct SelfConnected: Error {}
