import DredgeEnvelope
import DredgeWire
import Foundation
import NIOCore
import NIOSSL

/// One authenticated agent connection without the rest of the agent (no store, no uploads):
/// connect with the pinned CA, authenticate with the agent's key, then hand the open link to
/// the caller. For tools that act as many agents at once (the benchmarks' simulated fleet)
/// and for tests that need an agent to misbehave on purpose. ``AgentClient`` is the agent.
///
/// The handshake, heartbeats and what the server's frames call for go through the
/// connection's machine (``AgentConnection``); ``send(_:)`` does not, on purpose: it writes any
/// frame as it is, valid or not. One task reads (``next()``); any task may send or heartbeat.
public final class AgentLink: @unchecked Sendable {  // `inbound` is the one reading task's (`next()`)
    public let agentID: String
    /// What the server said when it accepted the agent (heartbeat interval, window, chunk size).
    public let session: WireAuthResult
    private let connection: AgentConnection
    private var inbound: NIOAsyncChannelInboundStream<WireFrame>.AsyncIterator
    private let outbound: NIOAsyncChannelOutboundWriter<WireFrame>

    init(agentID: String, session: WireAuthResult, connection: AgentConnection, inbound: NIOAsyncChannelInboundStream<WireFrame>.AsyncIterator, outbound: NIOAsyncChannelOutboundWriter<WireFrame>) {
        self.agentID = agentID
        self.session = session
        self.connection = connection
        self.inbound = inbound
        self.outbound = outbound
    }

    /// What the Swift agent says it can do (README § 4, Capabilities).
    public static let capabilities = [WireCapability.keyRotation]

    /// A TLS context trusting only `caPEM`; share one between many links.
    public static func tlsContext(caPEM: String) throws -> NIOSSLContext { try AgentConnector.tlsContext(caPEM: caPEM) }

    /// Connects, authenticates as `agentID` with `key`, runs `body` with the link, then closes.
    /// `capabilities`: what it says it can do in `Hello` (none: an agent of the protocol before
    /// capabilities); `keyGeneration`: the server keys it says it pins (0: it does not say).
    public static func withConnection<R: Sendable>(
        host: String, port: Int, tls: NIOSSLContext, agentID: String, key: RSAPrivateKey, hostInfo: WireHostInfo = WireHostInfo(),
        capabilities: [String] = AgentLink.capabilities, keyGeneration: Int = 0,
        _ body: (AgentLink) async throws -> R
    ) async throws -> R {
        let channel = try await AgentConnector.connect(host: host, port: port, context: tls)
        return try await channel.executeThenClose { inbound, outbound in
            let connection = AgentConnection(
                mode: .authenticate(agentID: agentID, host: hostInfo), key: key, channel: channel.channel, writer: outbound, capabilities: capabilities,
                keyGeneration: keyGeneration)
            var iterator = inbound.makeAsyncIterator()
            switch try await connection.handshake(&iterator) {
            case .established(let session):
                return try await body(AgentLink(agentID: agentID, session: session, connection: connection, inbound: iterator, outbound: outbound))
            case .closed(let error):
                throw AgentError("authentication failed: \(error?.description ?? "closed")")
            case .enrolled, .deliver, .plannedReturn:
                throw AgentError("authentication failed: the server answered out of turn")
            }
        }
    }

    /// The next frame for the agent (heartbeat acks, commands, upload replies); nil when the
    /// server closed. A protocol error from the server, or its `Goodbye`, is thrown.
    public func next() async throws -> WireFrame? {
        var planned: PlannedReturn?
        while let frame = try await inbound.next() {
            for event in try await connection.receive(frame) {
                switch event {
                case .deliver(let frame): return frame
                case .plannedReturn(let said): planned = said
                case .closed(let error):
                    let back = planned.map { " (\($0))" } ?? ""
                    throw AgentError("the server closed the connection: \(error?.description ?? "goodbye")\(back)")
                case .established, .enrolled: break
                }
            }
        }
        return nil
    }

    /// Says from the next heartbeat that the agent pins `generation` of the server's keys.
    public func pinned(_ generation: Int) { connection.pinned(generation) }

    public func heartbeat(activeUIDs: [String], stats: WireStoreStats = WireStoreStats()) async throws {
        try await connection.heartbeat(activeUIDs: activeUIDs, stats: stats)
    }

    /// Sends any frame as is, valid or not: past the connection's machine, on purpose.
    public func send(_ frame: WireFrame) async throws { try await outbound.write(frame) }

    /// Says `Goodbye` and closes, as the agent does when it stops.
    public func goodbye(_ reason: String) { connection.goodbye(reason) }
}

extension AgentEnrollment {
    /// Enrolls an existing key without saving any state: returns the id the server assigned.
    public static func register(host: String, port: Int, tls: NIOSSLContext, token: String, key: RSAPrivateKey, hostInfo: WireHostInfo) async throws -> String {
        try await request(host: host, port: port, tls: tls, token: token, key: key, hostInfo: hostInfo).agentID
    }
}
