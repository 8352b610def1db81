import DredgeServer
import DredgeTestSupport
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Testing

/// The agent port's TLS: under TLS 1.2 only ECDHE suites with an AEAD cipher are offered, so a
/// client that offers only CBC suites cannot connect, and one that offers AES-GCM can.
@Suite struct AgentPortTLSTests {
    /// Completes the handshake to the in-process server's agent port with `ciphers` under TLS
    /// 1.2 at most; nil if it completed, else the error that ended it.
    static func handshake(_ server: InProcessServer, ciphers: [NIOTLSCipher]) async throws -> (any Error)? {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(server.data + "/ca.pem"))
        tls.certificateVerification = .noHostnameVerification
        tls.maximumTLSVersion = .tlsv12
        tls.cipherSuiteValues = ciphers
        let context = try NIOSSLContext(configuration: tls)
        let group = MultiThreadedEventLoopGroup.singleton
        let done = group.any().makePromise(of: Void.self)
        let channel = try await ClientBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: nil))
                    try channel.pipeline.syncOperations.addHandler(HandshakeWatcher(done: done))
                }
            }
            .connect(host: "127.0.0.1", port: server.agentPort).get()
        channel.closeFuture.whenComplete { _ in done.fail(ChannelError.ioOnClosedChannel) }
        defer { channel.close(promise: nil) }
        do {
            try await done.futureResult.get()
            return nil
        } catch {
            return error
        }
    }

    @Test func cbcSuitesAreRefusedAndAEADOnesAccepted() async throws {
        try await withStopping(InProcessServer()) { server in
            let cbc = try await Self.handshake(server, ciphers: [.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, .TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, .TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA, .TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA])
            #expect(cbc != nil, "a TLS 1.2 handshake with CBC suites only completed")
            let gcm = try await Self.handshake(server, ciphers: [.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, .TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256])
            #expect(gcm == nil, "a TLS 1.2 handshake with AES-GCM failed: \(String(describing: gcm))")
        }
    }
}

/// Fulfils `done` when the TLS handshake completes, and fails it with the pipeline's error.
private final class HandshakeWatcher: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let done: EventLoopPromise<Void>

    init(done: EventLoopPromise<Void>) { self.done = done }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted = event { done.succeed() }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        done.fail(error)
        context.close(promise: nil)
    }
}
