import DredgeEnvelope
import DredgeWire
import Foundation
import NIOCore
import NIOSSL

/// `dredge-agent enroll`: makes the agent's RSA key, enrolls it with a token over a connection
/// that trusts only the given CA, checks the id the server assigns is the one the key derives,
/// and saves the state. Refuses if the state directory already holds an enrolled agent.
public enum AgentEnrollment {
    public static func enroll(host: String, port: Int, caPEM: String, token: String, stateDirectory: String, hostInfo: WireHostInfo) async throws -> AgentState {
        try await enroll(servers: [ServerAddress(host: host, port: port)], caPEM: caPEM, token: token, stateDirectory: stateDirectory, hostInfo: hostInfo)
    }

    /// Enrolls through the first of `servers` that can be reached (the nodes of one server
    /// share its enrollment), and keeps them all for ``AgentClient`` to connect to, in order.
    /// One whose TLS handshake does not end within `handshakeTimeout` (a node that hangs)
    /// counts as unreachable.
    public static func enroll(
        servers: [ServerAddress], caPEM: String, token: String, stateDirectory: String, hostInfo: WireHostInfo, handshakeTimeout: Duration = .seconds(30)
    ) async throws -> AgentState {
        guard let first = servers.first else { throw AgentError("no server address to enroll with") }
        guard !AgentState.isEnrolled(stateDirectory) else {
            throw AgentError("\(stateDirectory) already holds an enrolled agent; remove it to enroll again")
        }
        let key = try RSAPrivateKey.generate()
        let tls = try AgentConnector.tlsContext(caPEM: caPEM)
        var response: WireEnrollResponse?
        var unreachable: [String] = []
        for server in servers {
            do {
                response = try await request(host: server.host, port: server.port, tls: tls, token: token, key: key, hostInfo: hostInfo, handshakeTimeout: handshakeTimeout)
                break
            } catch let error as AgentError where error.isUnreachable {
                // Another node may answer; the server's own refusal (a bad token) is final.
                unreachable.append(error.description)
            }
        }
        guard let response else { throw AgentError(unreachable.joined(separator: "; ")) }
        guard response.agentID == key.publicKey.agentID else {
            throw AgentError("the server assigned id \(response.agentID), but this key derives \(key.publicKey.agentID)")
        }
        _ = try CommandVerifier(rawRepresentation: response.serverSigningKey)
        _ = try RSAPublicKey(spki: response.serverEncryptionKey)
        let state = AgentState(
            directory: stateDirectory,
            file: .init(
                agentID: response.agentID, serverHost: first.host, serverPort: first.port, servers: servers.count > 1 ? servers : nil,
                serverSigningKey: Hex.encode(response.serverSigningKey), serverEncryptionKey: Hex.encode(response.serverEncryptionKey), enrolledAt: Date(),
                // Named only when the server agreed to key rotation; else not known (said as 0).
                keyGeneration: response.keyGeneration > 0 ? Int(response.keyGeneration) : nil),
            key: key, caPEM: caPEM)
        try state.save()
        return state
    }

    /// One enrollment exchange over a fresh connection: the server's answer, or an error that
    /// says why there is none.
    static func request(
        host: String, port: Int, tls: NIOSSLContext, token: String, key: RSAPrivateKey, hostInfo: WireHostInfo, handshakeTimeout: Duration = AgentConnector.handshakeTimeout
    ) async throws -> WireEnrollResponse {
        let channel = try await AgentConnector.connect(host: host, port: port, context: tls, handshakeTimeout: handshakeTimeout)
        var response: WireEnrollResponse?
        var failure: WireProtocolError?
        do {
            try await channel.executeThenClose { inbound, outbound in
                let connection = AgentConnection(
                    mode: .enroll(token: token, publicKey: key.publicKey.spki, host: hostInfo), key: nil, channel: channel.channel, writer: outbound)
                var frames = inbound.makeAsyncIterator()
                switch try await connection.handshake(&frames) {
                case .enrolled(let r): response = r
                case .closed(let error): failure = error
                case .established, .deliver, .plannedReturn: break
                }
            }
        } catch {
            throw AgentError("enrollment failed: \(AgentConnector.explain(error))")
        }
        guard let response else {
            if let failure, failure.code == .errorEnrollmentRefused {
                throw AgentError("enrollment refused by the server: \(failure.message)", serverError: failure.code)
            }
            throw AgentError("enrollment failed: \(failure?.description ?? "the server closed the connection")", serverError: failure?.code)
        }
        return response
    }
}
