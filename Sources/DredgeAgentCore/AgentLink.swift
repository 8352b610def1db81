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
/// One task reads (``next()``); any task may send or heartbeat.
public final class AgentLink: @unchecked Sendable {
    public let agentID: String
    /// What the server said when it accepted the agent (heartbeat interval, window, chunk size).
    public let session: WireAuthResult
    private let lock = NSLock()
    private var machine: AgentConnectionStateMachine
    private var inbound: NIOAsyncChannelInboundStream<WireFrame>.AsyncIterator
    private let outbound: NIOAsyncChannelOutboundWriter<WireFrame>

    init(agentID: String, session: WireAuthResult, machine: AgentConnectionStateMachine, inbound: NIOAsyncChannelInboundStream<WireFrame>.AsyncIterator, outbound: NIOAsyncChannelOutboundWriter<WireFrame>) {
        self.agentID = agentID
        self.session = session
        self.machine = machine
        self.inbound = inbound
        self.outbound = outbound
    }

    /// A TLS context trusting only `caPEM`; share one between many links.
    public static func tlsContext(caPEM: String) throws -> NIOSSLContext { try AgentConnector.tlsContext(caPEM: caPEM) }

    /// Connects, authenticates as `agentID` with `key`, runs `body` with the link, then closes.
    public static func withConnection<R: Sendable>(
        host: String, port: Int, tls: NIOSSLContext, agentID: String, key: RSAPrivateKey, hostInfo: WireHostInfo = WireHostInfo(),
        _ body: (AgentLink) async throws -> R
    ) async throws -> R {
        let channel = try await AgentConnector.connect(host: host, port: port, context: tls)
        return try await channel.executeThenClose { inbound, outbound in
            var machine = AgentConnectionStateMachine(mode: .authenticate(agentID: agentID, host: hostInfo), software: "dredge-agent/0.1")
            var iterator = inbound.makeAsyncIterator()
            var actions = machine.start()
            var session: WireAuthResult?
            while session == nil {
                for action in actions {
                    switch action {
                    case .send(let frame): try await outbound.write(frame)
                    case .established(let result): session = result
                    case .close(let error): throw AgentError("authentication failed: \(error?.description ?? "closed")")
                    case .signChallenge, .enrolled, .deliver: break
                    }
                }
                if session != nil { break }
                if let challenge = actions.lazy.compactMap({ if case .signChallenge(let c) = $0 { c } else { nil } }).first {
                    actions = machine.signed(try AgentAuthentication.sign(challenge: challenge, agentID: agentID, with: key))
                    continue
                }
                guard let frame = try await iterator.next() else { throw AgentError("the server closed the connection during authentication") }
                actions = machine.receive(frame)
            }
            return try await body(AgentLink(agentID: agentID, session: session!, machine: machine, inbound: iterator, outbound: outbound))
        }
    }

    /// The next frame for the agent (heartbeat acks, commands, upload replies); nil when the
    /// server closed. A protocol error from the server is thrown.
    public func next() async throws -> WireFrame? {
        while let frame = try await inbound.next() {
            for action in lock.withLock({ machine.receive(frame) }) {
                switch action {
                case .deliver(let frame): return frame
                case .send(let reply): try await outbound.write(reply)
                case .close(let error): throw AgentError("the server closed the connection: \(error?.description ?? "goodbye")")
                case .signChallenge, .established, .enrolled: break
                }
            }
        }
        return nil
    }

    public func heartbeat(activeUIDs: [String], stats: WireStoreStats = WireStoreStats()) async throws {
        for case .send(let frame) in lock.withLock({ machine.heartbeat(activeUIDs: activeUIDs, stats: stats) }) { try await outbound.write(frame) }
    }

    /// Sends any frame as is, valid or not.
    public func send(_ frame: WireFrame) async throws { try await outbound.write(frame) }
}

extension AgentEnrollment {
    /// Enrolls an existing key without saving any state: returns the id the server assigned.
    public static func register(host: String, port: Int, tls: NIOSSLContext, token: String, key: RSAPrivateKey, hostInfo: WireHostInfo) async throws -> String {
        try await request(host: host, port: port, tls: tls, token: token, key: key, hostInfo: hostInfo).agentID
    }
}
