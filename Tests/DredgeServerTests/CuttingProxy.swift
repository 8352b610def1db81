import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A TCP proxy on loopback that cuts every connection after a random number of bytes from the
/// client, so the connection breaks at arbitrary points of a TLS stream — mid-frame, mid-chunk,
/// with acks in flight.
final class CuttingProxy: @unchecked Sendable {
    let channel: any Channel
    let cuts = NIOLockedValueBox(0)
    var port: Int { channel.localAddress!.port! }

    init(targetPort: Int, cutAfter: ClosedRange<Int>) throws {
        let cutsBox = cuts
        channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { inbound in
                let budget = Int.random(in: cutAfter)
                return ClientBootstrap(group: inbound.eventLoop)
                    .connect(host: "127.0.0.1", port: targetPort)
                    .flatMap { outbound in
                        let toServer = Forward(peer: outbound, budget: budget, cuts: cutsBox)
                        let toClient = Forward(peer: inbound, budget: nil, cuts: cutsBox)
                        return inbound.pipeline.addHandler(toServer).flatMap { outbound.pipeline.addHandler(toClient) }
                    }
            }
            .bind(host: "127.0.0.1", port: 0).wait()
    }

    deinit { try? channel.close().wait() }

    /// Copies bytes to `peer`; after `budget` bytes closes both sides.
    final class Forward: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let peer: any Channel
        var budget: Int?
        let cuts: NIOLockedValueBox<Int>

        init(peer: any Channel, budget: Int?, cuts: NIOLockedValueBox<Int>) {
            self.peer = peer
            self.budget = budget
            self.cuts = cuts
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var bytes = unwrapInboundIn(data)
            if let remaining = budget {
                if bytes.readableBytes >= remaining {
                    let part = bytes.readSlice(length: remaining)!
                    peer.writeAndFlush(part).whenComplete { [peer] _ in peer.close(promise: nil) }
                    cuts.withLockedValue { $0 += 1 }
                    context.close(promise: nil)
                    budget = 0
                    return
                }
                budget = remaining - bytes.readableBytes
            }
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
