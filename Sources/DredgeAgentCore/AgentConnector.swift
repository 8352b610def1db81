import DredgeWire
import Foundation
import NIOCore
import NIOPosix
import NIOSSL

/// Opens the agent's TLS connection to the server, trusting only the pinned CA.
enum AgentConnector {
    static func connect(host: String, port: Int, caPEM: String) async throws -> NIOAsyncChannel<WireFrame, WireFrame> {
        try await connect(host: host, port: port, context: try tlsContext(caPEM: caPEM))
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

    static func connect(host: String, port: Int, context: NIOSSLContext) async throws -> NIOAsyncChannel<WireFrame, WireFrame> {
        let serverHostname = host.contains(where: { $0.isLetter }) ? host : nil
        do {
            return try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.seconds(10))
                .channelOption(.socketOption(.so_keepalive), value: 1)
                .connect(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: serverHostname))
                        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder()))
                        try channel.pipeline.syncOperations.addHandler(MessageToByteHandler(FrameEncoder()))
                        return try NIOAsyncChannel<WireFrame, WireFrame>(wrappingChannelSynchronously: channel)
                    }
                }
        } catch {
            throw AgentError("cannot connect to \(host):\(port): \(error)")
        }
    }

    /// A readable reason for a failure on an open connection (TLS errors mostly).
    static func explain(_ error: any Error) -> String {
        if let error = error as? NIOSSLError {
            if case .handshakeFailed = error { return "TLS handshake failed: the server's certificate is not signed by the pinned CA or does not name this host (\(error))" }
        }
        if let error = error as? BoringSSLError { return "TLS failed: \(error)" }
        return "\(error)"
    }
}
