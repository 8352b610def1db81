import Crypto
import DredgeAdminAPI
import DredgeEnvelope
import Foundation
import SwiftASN1
import X509

/// Everything a server deployment needs, made once by `dredge-server init --data DIR`:
///
/// | file | what | mode |
/// |---|---|---|
/// | `ca.pem`, `ca-key.pem` | the deployment's CA (P-256, 10 years); agents pin `ca.pem` | 0644, 0600 |
/// | `server.pem`, `server-key.pem` | the agent listener's TLS certificate (P-256, 2 years), signed by the CA | 0644, 0600 |
/// | `signing-key` | Ed25519 key that signs pull commands (hex) | 0600 |
/// | `encryption-key.pem` | RSA-3072 key that unwraps feedback upload keys | 0600 |
/// | `dredge.sqlite` | the server's database (``ServerDatabase``): agents, pulls, feedback, the audit log, and the names and SHA-256 of the admin and enrollment tokens (the tokens themselves are shown once) | 0600 |
/// | `server.json` | listen addresses and the names in the certificate | 0644 |
///
/// Existing files are never overwritten: `initialize` refuses a directory that already holds
/// any of them.
public enum ServerDeployment {
    public struct Options: Sendable {
        public var dataDirectory: String
        /// Address the agent listener binds (and the admin API, which is always loopback).
        public var listenHost = "127.0.0.1"
        public var agentPort = 7443
        public var adminPort = 7080
        /// Names agents use to reach the server; they go into the certificate. `localhost` and
        /// `127.0.0.1` are always included.
        public var names: [String] = []
        public var now = Date()

        public init(dataDirectory: String) { self.dataDirectory = dataDirectory }
    }

    /// What `init` prints: what an agent needs to enroll, and the admin token, shown once.
    public struct Created: Sendable {
        public var caPath: String
        /// `sha256:` + hex of the CA certificate's DER.
        public var caFingerprint: String
        public var agentAddress: String
        public var enrollmentToken: String
        public var adminToken: String
    }

    public struct Config: Codable, Sendable, Equatable {
        public var listenHost: String
        public var agentPort: Int
        public var adminPort: Int
        public var names: [String]
        /// Per-agent feedback quotas; the defaults when absent.
        public var feedback: FeedbackLimits?
        /// Deadlines and caps of agent connections; the defaults when absent.
        public var connections: ConnectionLimits?
        /// Threads for the listener's blocking work; the defaults when absent.
        public var threads: WorkThreads?
    }

    /// What `initialize` makes.
    public static let files = ["ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "signing-key", "encryption-key.pem", "server.json", ServerDatabase.fileName]

    public static func initialize(_ options: Options) throws -> Created {
        let fm = FileManager.default
        let dir = options.dataDirectory
        try fm.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let existing = (files + ServerDatabase.legacyFiles).filter { fm.fileExists(atPath: dir + "/" + $0) }
        guard existing.isEmpty else {
            throw DeploymentError("\(dir) already holds a deployment (\(existing.joined(separator: ", "))); refusing to overwrite it")
        }

        var names = ["localhost", "127.0.0.1"]
        for name in options.names where !names.contains(name) { names.append(name) }
        let caKey = P256.Signing.PrivateKey()
        let ca = try makeCA(key: caKey, now: options.now)
        let serverKey = P256.Signing.PrivateKey()
        let server = try makeServerCertificate(key: serverKey, names: names, ca: ca, caKey: caKey, now: options.now)
        let signing = ServerSigningKey.generate()
        let encryption = try RSAPrivateKey.generate()
        let config = Config(listenHost: options.listenHost, agentPort: options.agentPort, adminPort: options.adminPort, names: names)

        // Secrets first, each created exclusively; a failure part-way leaves no usable half.
        var written: [String] = []
        let adminToken: String, enrollmentToken: String
        do {
            func write(_ name: String, _ bytes: [UInt8], mode: Int) throws {
                try writeExclusive(dir + "/" + name, bytes, mode: mode)
                written.append(name)
            }
            try write("ca-key.pem", Array(caKey.pemRepresentation.utf8), mode: 0o600)
            try write("server-key.pem", Array(serverKey.pemRepresentation.utf8), mode: 0o600)
            try write("signing-key", Array((Hex.encode(signing.rawRepresentation) + "\n").utf8), mode: 0o600)
            try write("encryption-key.pem", Array(encryption.pemRepresentation.utf8), mode: 0o600)
            try write("ca.pem", Array(try ca.serializeAsPEM().pemString.utf8), mode: 0o644)
            try write("server.pem", Array(try server.serializeAsPEM().pemString.utf8), mode: 0o644)
            try write("server.json", try encode(config), mode: 0o644)
            written += [ServerDatabase.fileName, ServerDatabase.fileName + "-wal", ServerDatabase.fileName + "-shm"]
            let tokens = TokenStore(try ServerDatabase(directory: dir))
            adminToken = try tokens.createWhileInitializing(name: "admin", kind: .admin, now: options.now).token
            enrollmentToken = try tokens.createWhileInitializing(name: "default", kind: .enrollment, now: options.now).token
        } catch {
            let failure = error
            for name in written where fm.fileExists(atPath: dir + "/" + name) {
                do { try fm.removeItem(atPath: dir + "/" + name) } catch { throw DeploymentError("\(failure); and removing the half-made \(name) failed: \(error)") }
            }
            throw error
        }
        return Created(
            caPath: dir + "/ca.pem", caFingerprint: fingerprint(of: ca),
            agentAddress: "\(names.count > 2 ? names[2] : options.listenHost):\(options.agentPort)",
            enrollmentToken: enrollmentToken, adminToken: adminToken)
    }

    /// `sha256:` + lowercase hex of the certificate's DER.
    public static func fingerprint(of certificate: Certificate) -> String {
        var serializer = DER.Serializer()
        try? serializer.serialize(certificate)
        return "sha256:" + Hex.encode(SHA256.hash(data: serializer.serializedBytes))
    }

    static func makeCA(key: P256.Signing.PrivateKey, now: Date) throws -> Certificate {
        let name = try DistinguishedName {
            OrganizationName("Dredge")
            CommonName("Dredge deployment CA")
        }
        let privateKey = Certificate.PrivateKey(key)
        return try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: privateKey.publicKey,
            notValidBefore: now.addingTimeInterval(-300), notValidAfter: now.addingTimeInterval(10 * 365 * 86_400),
            issuer: name, subject: name, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: privateKey.publicKey)
            },
            issuerPrivateKey: privateKey)
    }

    static func makeServerCertificate(key: P256.Signing.PrivateKey, names: [String], ca: Certificate, caKey: P256.Signing.PrivateKey, now: Date) throws -> Certificate {
        let subject = try DistinguishedName {
            OrganizationName("Dredge")
            CommonName(names.count > 2 ? names[2] : "dredge-server")
        }
        let sans: [GeneralName] = names.map { name in
            if let ip = IPv4Address(name) { return .ipAddress(ASN1OctetString(contentBytes: ArraySlice(ip.bytes))) }
            return .dnsName(name)
        }
        let publicKey = Certificate.PrivateKey(key).publicKey
        return try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: publicKey,
            notValidBefore: now.addingTimeInterval(-300), notValidAfter: now.addingTimeInterval(2 * 365 * 86_400),
            issuer: ca.subject, subject: subject, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames(sans)
                SubjectKeyIdentifier(hash: publicKey)
                AuthorityKeyIdentifier(keyIdentifier: try ca.extensions.subjectKeyIdentifier?.keyIdentifier)
            },
            issuerPrivateKey: Certificate.PrivateKey(caKey))
    }

    static func encode(_ value: some Encodable) throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return Array(try encoder.encode(value)) + [10]
    }

    /// Creates `path` with `mode`, failing if it exists, and fsyncs it.
    static func writeExclusive(_ path: String, _ bytes: [UInt8], mode: Int) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode_t(mode))
        guard fd >= 0 else { throw DeploymentError("cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var done = 0
        while done < bytes.count {
            let n = bytes[done...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { throw DeploymentError("writing \(path): \(String(cString: strerror(errno)))") }
            done += n
        }
        guard fsync(fd) == 0 else { throw DeploymentError("fsync \(path): \(String(cString: strerror(errno)))") }
    }
}

public struct DeploymentError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// A dotted-quad IPv4 address.
struct IPv4Address {
    var bytes: [UInt8]
    init?(_ text: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var bytes: [UInt8] = []
        for part in parts {
            guard let value = UInt8(part) else { return nil }
            bytes.append(value)
        }
        self.bytes = bytes
    }
}
