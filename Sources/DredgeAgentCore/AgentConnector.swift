import DredgeDomain
import DredgeWire
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS

/// Opens the agent's TLS connection to the server, trusting only the pinned CA.
enum AgentConnector {
    /// How long a TLS handshake may take before the connection is given up: a node that
    /// accepts connections and then hangs (stopped, overloaded) must not hold the agent.
    static let handshakeTimeout: Duration = .seconds(30)

    static func connect(host: String, port: Int, caPEM: String, handshakeTimeout: Duration = handshakeTimeout) async throws -> NIOAsyncChannel<WireFrame, WireFrame> {
        try await connect(host: host, port: port, context: try tlsContext(caPEM: caPEM), handshakeTimeout: handshakeTimeout)
    }

    /// A client TLS context that trusts only the pinned CA. One can serve many connections.
    static func tlsContext(caPEM: String) throws -> NIOSSLContext {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        tls.certificateVerification = .fullVerification
        do {
            tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(caPEM.utf8)))
        } catch {
            throw AgentError("the pinned CA certificate cannot be read: \(error)")
        }
        return try NIOSSLContext(configuration: tls)
    }

    /// Connects and completes the TLS handshake before returning, so a certificate the pinned
    /// CA does not vouch for is reported as such, not as a write on a channel that closed. A
    /// handshake not done within `handshakeTimeout` closes the connection and throws.
    static func connect(
        host: String, port: Int, context: NIOSSLContext, handshakeTimeout: Duration = handshakeTimeout
    ) async throws -> NIOAsyncChannel<WireFrame, WireFrame> {
        // A name, not an address: IP literals (IPv4, or IPv6 with its hex letters) are never sent as SNI.
        let serverHostname = host.contains(where: { $0.isLetter }) && !host.contains(":") ? host : nil
        let channel: NIOAsyncChannel<WireFrame, WireFrame>
        let waiter: HandshakeWaiter
        do {
            (channel, waiter) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.seconds(10))
                .channelOption(.socketOption(.so_keepalive), value: 1)
                .connect(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let waiter = HandshakeWaiter(promise: channel.eventLoop.makePromise())
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: serverHostname))
                        try channel.pipeline.syncOperations.addHandler(waiter)
                        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder()))
                        try channel.pipeline.syncOperations.addHandler(MessageToByteHandler(FrameEncoder()))
                        return (try NIOAsyncChannel<WireFrame, WireFrame>(wrappingChannelSynchronously: channel), waiter)
                    }
                }
        } catch {
            throw AgentError("cannot connect to \(host):\(port): \(explain(error, address: "\(host):\(port)"))", isUnreachable: true)
        }
        // On the channel's event loop, like the waiter: the first to fulfil the promise wins.
        let timeout = handshakeTimeout.components
        let deadline = channel.channel.eventLoop.scheduleTask(in: .seconds(timeout.seconds) + .nanoseconds(timeout.attoseconds / 1_000_000_000)) {
            waiter.promise.fail(AgentError("the server did not complete the TLS handshake within \(handshakeTimeout)", isUnreachable: true))
            channel.channel.close(promise: nil)
        }
        // Cancelled on the event loop as the handshake ends, before the timer could fire.
        waiter.promise.futureResult.whenComplete { _ in deadline.cancel() }
        do {
            try await waiter.promise.futureResult.get()
        } catch {
            // Closed through the async channel, which must finish its writer; the handshake's
            // error is the one reported, not the close's.
            try? await channel.executeThenClose { _, _ in }
            // A node that hangs is as good as unreachable: another address may do.
            throw AgentError("cannot connect to \(host):\(port): \(explain(error, address: "\(host):\(port)"))", isUnreachable: (error as? AgentError)?.isUnreachable ?? false)
        }
        return channel
    }

    /// A readable reason for a failure to connect or on an open connection: nothing listening,
    /// no such host, TLS; no event-loop internals.
    static func explain(_ error: any Error, address: String = "the server") -> String {
        if let error = error as? NIOConnectionError, error.connectionErrors.isEmpty, error.dnsAError != nil || error.dnsAAAAError != nil {
            return "no host of that name could be found (\(error.host))"
        }
        if let io = socketError(error) as? IOError, let failure = ConnectFailure(errno: io.errnoCode, address: address) { return failure.description }
        if case ChannelError.connectTimeout = error { return "\(address) did not answer in time: is the address right, and does a firewall let it through?" }
        if let error = error as? NIOSSLError {
            if case .handshakeFailed = error { return "TLS handshake failed: the server's certificate is not signed by the pinned CA or does not name this host (\(error))" }
        }
        if let error = error as? BoringSSLError { return "TLS failed: \(error)" }
        return "\(error)"
    }
}

/// The socket error under a failed connect: NIO's connection error wraps one per address tried.
private func socketError(_ error: any Error) -> any Error {
    (error as? NIOConnectionError)?.connectionErrors.first?.error ?? error
}

/// Completes `promise` when the TLS handshake completes, or fails it with the first error (or
/// the connection closing, or never opening) before that; passes every event on.
private final class HandshakeWaiter: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny
    let promise: EventLoopPromise<Void>

    init(promise: EventLoopPromise<Void>) { self.promise = promise }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event { promise.succeed(()) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        promise.fail(error)
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        promise.fail(ChannelError.inputClosed)
        context.fireChannelInactive()
    }

    /// A connection that never became active (refused, timed out) ends here: the promise must
    /// not be left unfulfilled. Fulfilling a promise again does nothing.
    func handlerRemoved(context: ChannelHandlerContext) {
        promise.fail(ChannelError.ioOnClosedChannel)
    }
}
