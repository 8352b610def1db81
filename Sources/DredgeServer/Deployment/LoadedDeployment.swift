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

    public init(directory: String) throws {
        self.directory = directory
        func read(_ name: String) throws -> String {
            guard let data = FileManager.default.contents(atPath: directory + "/" + name) else {
                throw DeploymentError("\(directory)/\(name) is missing: run `dredge-server init --data \(directory)` first")
            }
            return String(decoding: data, as: UTF8.self)
        }
        do {
            config = try JSONDecoder().decode(ServerDeployment.Config.self, from: Data(try read("server.json").utf8))
        } catch let error as DeploymentError {
            throw error
        } catch {
            throw DeploymentError("cannot read the deployment configuration in \(directory): \(error)")
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
        tlsConfiguration = tls
    }
}
