import DredgeEnvelope
import Foundation
import NIOSSL

/// A deployment read back from its data directory, as `dredge-server run` uses it.
public struct LoadedDeployment: Sendable {
    public var directory: String
    public var config: ServerDeployment.Config
    /// The command-signing and encryption keys, by generation (``ServerKeyRing``).
    public var keys: KeyRing
    /// The current generation's signing key.
    public var signingKey: ServerSigningKey { keys.current.signingKey }
    /// The current generation's encryption key.
    public var encryptionKey: RSAPrivateKey { keys.current.encryptionKey }
    public var tlsConfiguration: TLSConfiguration
    /// The admin API's TLS (1.3 only); nil for plain HTTP, which only a loopback address gets.
    public var adminTLSConfiguration: TLSConfiguration?
    /// Keys of `server.json` set by an environment variable (``ServerConfiguration``).
    public var fromEnvironment: [String]
    /// Keys in `server.json` no release reads: ignored (a misspelling, most likely).
    public var unknownKeys: [String]

    /// - Parameter environment: where `DREDGE_…` overrides of `server.json`'s keys are read.
    public init(directory: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws {
        self.directory = directory
        func read(_ name: String) throws -> String {
            guard let data = FileManager.default.contents(atPath: directory + "/" + name) else {
                throw DeploymentError("\(directory)/\(name) is missing: run `dredge-server init --data \(directory)` first")
            }
            return String(decoding: data, as: UTF8.self)
        }
        do {
            let reading = try ServerConfiguration.read(Data(try read("server.json").utf8), environment: environment)
            (config, fromEnvironment, unknownKeys) = (reading.config, reading.fromEnvironment, reading.unknownKeys)
        } catch let error as DeploymentError {
            throw error.description.hasPrefix("server.json") ? DeploymentError("\(directory)/\(error.description)") : error
        }
        keys = try KeyRing(directory: directory)
        tlsConfiguration = try Self.agentTLSConfiguration(directory: directory)
        adminTLSConfiguration = try config.adminTLS.map { try ServerDeployment.adminTLSConfiguration($0, directory: directory) }
        try Self.checkAdmin(host: config.adminHost ?? "127.0.0.1", tls: adminTLSConfiguration != nil)
    }

    /// The agent listener's TLS: `server.pem` and `server-key.pem` (an interrupted renewal
    /// finished first), TLS 1.2 and 1.3 with ``agentCipherSuites``.
    public static func agentTLSConfiguration(directory: String) throws -> TLSConfiguration {
        try ServerCertificate.loadPair(directory: directory, admin: false).agent
    }

    /// The same from the files as they are (the caller holds the certificate's lock).
    static func agentTLSConfiguration(pairIn directory: String) throws -> TLSConfiguration {
        func read(_ name: String) throws -> [UInt8] {
            guard let data = FileManager.default.contents(atPath: directory + "/" + name) else {
                throw DeploymentError("\(directory)/\(name) is missing: run `dredge-server init --data \(directory)` first")
            }
            return Array(data)
        }
        let chain = try NIOSSLCertificate.fromPEMBytes(try read("server.pem"))
        let key = try NIOSSLPrivateKey(bytes: try read("server-key.pem"), format: .pem)
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        tls.minimumTLSVersion = .tlsv12
        tls.cipherSuiteValues = Self.agentCipherSuites
        return tls
    }

    /// `server.json` as the server reads it (with its environment overrides).
    public static func readConfig(directory: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> ServerDeployment.Config {
        guard let data = FileManager.default.contents(atPath: directory + "/server.json") else {
            throw DeploymentError("\(directory)/server.json is missing: run `dredge-server init --data \(directory)` first")
        }
        do {
            return try ServerConfiguration.read(data, environment: environment).config
        } catch let error as DeploymentError {
            throw error.description.hasPrefix("server.json") ? DeploymentError("\(directory)/\(error.description)") : error
        }
    }

    /// What the agent port offers under TLS 1.2 (Protocol/README.md § Transport): ephemeral
    /// ECDH with an AEAD cipher only, no CBC. TLS 1.3's suites are all AEAD and not configurable.
    public static let agentCipherSuites: [NIOTLSCipher] = [
        .TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, .TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, .TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        .TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, .TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, .TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ]

    /// Plain HTTP only on loopback: bearer tokens never cross a network in the clear.
    public static func checkAdmin(host: String, tls: Bool) throws {
        guard tls || ServerDeployment.isLoopback(host) else {
            throw DeploymentError("the admin API on \(host) would speak plain HTTP, which is allowed only on loopback: give server.json an adminTLS certificate and key")
        }
    }
}
