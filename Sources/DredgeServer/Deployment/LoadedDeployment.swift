import DredgeEnvelope
import Foundation
import NIOSSL

/// A deployment read back from its data directory, as `dredge-server run` uses it.
public struct LoadedDeployment: Sendable {
    public var directory: String
    public var config: ServerDeployment.Config
    public var signingKey: ServerSigningKey
    public var encryptionKey: RSAPrivateKey
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
        guard let seed = Hex.decode(try read("signing-key").trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw DeploymentError("\(directory)/signing-key is not hex")
        }
        signingKey = try ServerSigningKey(rawRepresentation: seed)
        encryptionKey = try RSAPrivateKey(pemRepresentation: try read("encryption-key.pem"))
        let chain = try NIOSSLCertificate.fromPEMBytes(Array(try read("server.pem").utf8))
        let key = try NIOSSLPrivateKey(bytes: Array(try read("server-key.pem").utf8), format: .pem)
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        tls.minimumTLSVersion = .tlsv12
        tls.cipherSuiteValues = Self.agentCipherSuites
        tlsConfiguration = tls
        adminTLSConfiguration = try config.adminTLS.map { try ServerDeployment.adminTLSConfiguration($0, directory: directory) }
        try Self.checkAdmin(host: config.adminHost ?? "127.0.0.1", tls: adminTLSConfiguration != nil)
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
