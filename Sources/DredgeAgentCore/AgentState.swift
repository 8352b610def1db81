import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeWire
import Foundation

/// What an agent keeps after enrollment, in its state directory:
///
/// | file | what | mode |
/// |---|---|---|
/// | `agent-key.pem` | the agent's RSA key (its identity; unwraps command keys) | 0600 |
/// | `ca.pem` | the pinned CA: the only root the agent trusts for the server | 0644 |
/// | `agent.json` | agent id, server address, the server's signing and encryption keys | 0600 |
public struct AgentState: Sendable {
    public struct File: Codable, Sendable, Equatable {
        public var agentID: String
        /// The first server address (the one enrolled with).
        public var serverHost: String
        public var serverPort: Int
        /// Every address of the server's nodes, in the order they are tried; absent in a state
        /// enrolled with one address (then `serverHost:serverPort` alone).
        public var servers: [ServerAddress]?
        /// Ed25519 public key that signs pull commands, hex.
        public var serverSigningKey: String
        /// RSA SPKI DER that wraps feedback keys, hex.
        public var serverEncryptionKey: String
        public var enrolledAt: Date
        /// The generation of the two keys above (README § Key rotation); absent: 1.
        public var keyGeneration: Int?
        /// Signing keys of earlier generations still accepted until they retire.
        public var previousSigningKeys: [PreviousKey]?

        public struct PreviousKey: Codable, Sendable, Equatable {
            public var generation: Int
            /// Ed25519 public key, hex.
            public var signingKey: String
            public var retiresAt: Date
        }

        public init(
            agentID: String, serverHost: String, serverPort: Int, servers: [ServerAddress]?, serverSigningKey: String, serverEncryptionKey: String, enrolledAt: Date,
            keyGeneration: Int? = nil, previousSigningKeys: [PreviousKey]? = nil
        ) {
            self.agentID = agentID
            self.serverHost = serverHost
            self.serverPort = serverPort
            self.servers = servers
            self.serverSigningKey = serverSigningKey
            self.serverEncryptionKey = serverEncryptionKey
            self.enrolledAt = enrolledAt
            self.keyGeneration = keyGeneration
            self.previousSigningKeys = previousSigningKeys
        }
    }

    public var directory: String
    public var file: File
    /// The addresses the agent connects to, in order (``File/servers``, else the one it enrolled with).
    public var addresses: [ServerAddress] {
        if let servers = file.servers, !servers.isEmpty { return servers }
        return [ServerAddress(host: file.serverHost, port: file.serverPort)]
    }
    public var key: RSAPrivateKey
    public var caPEM: String

    public static func load(from directory: String) throws -> AgentState {
        func read(_ name: String) throws -> Data {
            guard let data = FileManager.default.contents(atPath: directory + "/" + name) else {
                throw AgentError("\(directory)/\(name) is missing: enroll this agent first (`dredge-agent enroll`)")
            }
            return data
        }
        let file: File
        do {
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .iso8601
            file = try decoder.decode(File.self, from: try read("agent.json"))
        } catch let error as AgentError {
            throw error
        } catch {
            throw AgentError("\(directory)/agent.json is damaged: \(error)")
        }
        return AgentState(
            directory: directory, file: file, key: try RSAPrivateKey(pemRepresentation: String(decoding: try read("agent-key.pem"), as: UTF8.self)),
            caPEM: String(decoding: try read("ca.pem"), as: UTF8.self))
    }

    public static func isEnrolled(_ directory: String) -> Bool { FileManager.default.fileExists(atPath: directory + "/agent.json") }

    func save() throws {
        let fm = FileManager.default
        try fm.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try Self.write(Array(key.pemRepresentation.utf8), to: directory + "/agent-key.pem", mode: 0o600)
        try Self.write(Array(caPEM.utf8), to: directory + "/ca.pem", mode: 0o644)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        // agent.json last: its presence means the enrollment is complete.
        try saveFile()
    }

    /// Replaces `agent.json` alone (durably): the server keys it pins changed.
    func saveFile() throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        try Self.write(Array(try encoder.encode(file)) + [10], to: directory + "/agent.json", mode: 0o600)
    }

    /// Durably (``DurableFile``): a crash leaves the old content or the new, never a torn file.
    static func write(_ bytes: [UInt8], to path: String, mode: Int) throws {
        try DurableFile.write(bytes, to: path, mode: mode_t(mode))
    }
}

/// A server node's agent address: `HOST:PORT` (`[IPv6]:PORT`). A host name that resolves to
/// several addresses is tried at each of them (the connection takes the first that answers).
public struct ServerAddress: Codable, Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

public struct AgentError: Error, CustomStringConvertible, Sendable {
    public var description: String
    /// The code of the server's `Error` frame this comes from, if any.
    public var serverError: WireErrorCode?
    /// No connection could be opened (refused, timed out, no route): another address may do.
    public var isUnreachable: Bool
    public init(_ description: String, serverError: WireErrorCode? = nil, isUnreachable: Bool = false) {
        self.description = description
        self.serverError = serverError
        self.isUnreachable = isUnreachable
    }
}
