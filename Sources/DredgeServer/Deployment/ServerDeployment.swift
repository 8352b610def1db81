import Crypto
import DredgeAdminAPI
import DredgeEnvelope
import Foundation
import NIOSSL
import SwiftASN1
import X509

/// Everything a server deployment needs, made once by `dredge-server init --data DIR`:
///
/// | file | what | mode |
/// |---|---|---|
/// | `ca.pem`, `ca-key.pem` | the deployment's CA (P-256, 10 years); agents pin `ca.pem` | 0600 |
/// | `server.pem`, `server-key.pem` | the agent listener's TLS certificate (P-256, 2 years), signed by the CA | 0600 |
/// | `signing-key` | Ed25519 key that signs pull commands (hex) | 0600 |
/// | `encryption-key.pem` | RSA-3072 key that unwraps feedback upload keys | 0600 |
/// | `dredge.sqlite` | the server's database (``ServerDatabase``): agents, pulls, feedback, the audit log, and the names and SHA-256 of the admin and enrollment tokens (the tokens themselves are shown once) | 0600 |
/// | `server.json` | listen addresses, the admin API's TLS and the names in the certificate, the database's URL | 0600 |
///
/// The directory is 0700; `dredge-server` runs with umask 077, so whatever it writes later
/// (databases and their logs, chunks, pulled and feedback files) is 0600, directories 0700.
///
/// Existing files are never overwritten: `initialize` refuses a directory that already holds
/// any of them.
public enum ServerDeployment {
    public struct Options: Sendable {
        public var dataDirectory: String
        /// Address the agent listener binds.
        public var listenHost = "127.0.0.1"
        public var agentPort = 7443
        /// Address the admin API binds; a specific address or name goes into the certificate.
        public var adminHost = "127.0.0.1"
        public var adminPort = 7080
        /// Plain HTTP for the admin API instead of HTTPS: refused unless `adminHost` is loopback.
        public var adminPlainHTTP = false
        /// An operator's certificate chain and key (PEM files) for the admin API instead of the
        /// deployment's `server.pem`; stored as given (make them absolute).
        public var adminCertificate: (chain: String, key: String)?
        /// Names agents use to reach the server; they go into the certificate. `localhost` and
        /// `127.0.0.1` are always included.
        public var names: [String] = []
        /// A PostgreSQL database (`postgres://…`) instead of SQLite in the data directory:
        /// recorded in `server.json`; made with ``initialize(_:database:)``.
        public var database: String?
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
        /// Where engineers reach the admin API: `https://NAME:PORT` (or `http://` on loopback).
        public var adminURL: String
        /// The admin API uses the operator's certificate, not one the deployment CA signed.
        public var operatorCertificate = false

        public init(
            caPath: String, caFingerprint: String, agentAddress: String, enrollmentToken: String, adminToken: String, adminURL: String, operatorCertificate: Bool = false
        ) {
            self.caPath = caPath
            self.caFingerprint = caFingerprint
            self.agentAddress = agentAddress
            self.enrollmentToken = enrollmentToken
            self.adminToken = adminToken
            self.adminURL = adminURL
            self.operatorCertificate = operatorCertificate
        }

        /// The line an engineer pastes to log in: the CA pinned by its fingerprint (the
        /// deployment's CA signs the admin certificate unless the operator gave one).
        public var loginCommand: String {
            adminURL.hasPrefix("https://") && !operatorCertificate
                ? "dredge login --server \(adminURL) --fingerprint \(caFingerprint) --token \(adminToken)"
                : "dredge login --server \(adminURL) --token \(adminToken)"
        }
    }

    /// The admin API's certificate and key (PEM files; relative paths are inside the data
    /// directory). Absent in `server.json`: plain HTTP, which is allowed only on loopback.
    public struct AdminTLS: Codable, Sendable, Equatable {
        public var certificate: String
        public var key: String
        public init(certificate: String, key: String) {
            self.certificate = certificate
            self.key = key
        }
    }

    public struct Config: Codable, Sendable, Equatable {
        public var listenHost: String
        public var agentPort: Int
        public var adminPort: Int
        /// The admin API's address; `127.0.0.1` when absent.
        public var adminHost: String?
        /// The admin API's TLS; plain HTTP (loopback only) when absent, as in deployments made
        /// before the admin API spoke HTTPS.
        public var adminTLS: AdminTLS?
        public var names: [String]
        /// Per-agent feedback quotas; the defaults when absent.
        public var feedback: FeedbackLimits?
        /// Deadlines and caps of agent connections; the defaults when absent.
        public var connections: ConnectionLimits?
        /// Deadlines and caps of admin API connections; the defaults when absent.
        public var adminConnections: AdminConnectionLimits?
        /// Threads for the listener's blocking work; the defaults when absent.
        public var threads: WorkThreads?
        /// How long pulled and feedback files are kept; 30 days when absent.
        public var results: ResultsRetention?
        /// When `GET /ready` says the server is not ready; the defaults when absent.
        public var readiness: ReadinessLimits?
        /// The PostgreSQL database the server's state is in (`postgres://user@host:port/db`,
        /// the password better in `PGPASSWORD`); SQLite in the data directory when absent.
        public var database: String?
        /// Where Prometheus scrapes `GET /metrics` besides the admin listener; the defaults when absent.
        public var metrics: MetricsSettings?
        /// Where audit entries are copied outside the database; nowhere when absent.
        public var audit: AuditShippingSettings?
        /// Whether pulls wait for a second person's approval; not when absent.
        public var approvals: ApprovalSettings?
        /// The identity provider the console signs people in with; tokens only when absent.
        public var sso: SingleSignOnSettings?
    }

    /// What `initialize` makes.
    public static let files = ["ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "signing-key", "encryption-key.pem", "server.json", ServerDatabase.fileName]

    /// Makes a deployment whose state is in SQLite in the data directory (`dredge.sqlite`).
    public static func initialize(_ options: Options) throws -> Created {
        guard options.database == nil else { throw DeploymentError("a deployment on PostgreSQL is made with initialize(_:database:)") }
        return try make(options, database: nil, databaseFiles: [ServerDatabase.fileName, ServerDatabase.fileName + "-wal", ServerDatabase.fileName + "-shm"]) { dir in
            let tokens = SQLiteTokenVault(try ServerDatabase(directory: dir))
            return (
                admin: try tokens.createWhileInitializing(name: "admin", kind: .admin, now: options.now).token,
                enrollment: try tokens.createWhileInitializing(name: "default", kind: .enrollment, now: options.now).token
            )
        }
    }

    /// Makes a deployment whose state is in a PostgreSQL database (`options.database`, recorded
    /// in `server.json`), for one node or the first of a cluster (the others share its data
    /// directory). The database must hold no tokens yet: it would be another deployment's.
    public static func initialize(_ options: Options, database: PostgresDatabase) async throws -> Created {
        guard let url = options.database else { throw DeploymentError("options.database names no PostgreSQL database") }
        let vault = PostgresTokenVault(database)
        guard try await vault.list().isEmpty else {
            throw DeploymentError(
                "the database \(database.location) already holds tokens: it is another deployment's (the nodes of a cluster share one data directory: run init once)")
        }
        let admin = try NewToken(name: "admin", kind: .admin, now: options.now)
        let enrollment = try NewToken(name: "default", kind: .enrollment, now: options.now)
        let created = try make(options, database: url, databaseFiles: []) { _ in (admin.created.token, enrollment.created.token) }
        do {
            try await vault.insert([admin, enrollment])
        } catch {
            let failure = error
            for name in files where FileManager.default.fileExists(atPath: options.dataDirectory + "/" + name) {
                do { try FileManager.default.removeItem(atPath: options.dataDirectory + "/" + name) } catch {
                    throw DeploymentError("\(failure); and removing the half-made \(name) failed: \(error)")
                }
            }
            throw failure
        }
        return created
    }

    /// The files, then the first tokens (by `tokens`, given the directory); a failure part-way
    /// removes what was written.
    private static func make(
        _ options: Options, database: String?, databaseFiles: [String], tokens makeTokens: (String) throws -> (admin: String, enrollment: String)
    ) throws -> Created {
        let fm = FileManager.default
        let dir = options.dataDirectory
        try fm.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let existing = (files + ServerDatabase.legacyFiles).filter { fm.fileExists(atPath: dir + "/" + $0) }
        guard existing.isEmpty else {
            throw DeploymentError("\(dir) already holds a deployment (\(existing.joined(separator: ", "))); refusing to overwrite it")
        }

        if options.adminPlainHTTP && !isLoopback(options.adminHost) {
            throw DeploymentError("plain HTTP is allowed only on loopback: the admin API on \(options.adminHost) speaks HTTPS (drop --admin-plain-http)")
        }
        var adminTLS: AdminTLS? = options.adminPlainHTTP ? nil : AdminTLS(certificate: "server.pem", key: "server-key.pem")
        if let operatorCertificate = options.adminCertificate, !options.adminPlainHTTP {
            adminTLS = AdminTLS(certificate: operatorCertificate.chain, key: operatorCertificate.key)
            _ = try adminTLSConfiguration(adminTLS!, directory: dir)
        }
        var names = ["localhost", "127.0.0.1"]
        for name in options.names where !names.contains(name) { names.append(name) }
        // Engineers reach the admin API by its address: the certificate names it.
        if !isWildcard(options.adminHost) && !names.contains(options.adminHost) { names.append(options.adminHost) }
        let caKey = P256.Signing.PrivateKey()
        let ca = try makeCA(key: caKey, now: options.now)
        let serverKey = P256.Signing.PrivateKey()
        let server = try makeServerCertificate(key: serverKey, names: names, ca: ca, caKey: caKey, now: options.now)
        let signing = ServerSigningKey.generate()
        let encryption = try RSAPrivateKey.generate()
        let config = Config(
            listenHost: options.listenHost, agentPort: options.agentPort, adminPort: options.adminPort, adminHost: options.adminHost, adminTLS: adminTLS, names: names,
            database: database)

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
            // Public, but in the server's directory as everything else it writes: readable by it alone.
            try write("ca.pem", Array(try ca.serializeAsPEM().pemString.utf8), mode: 0o600)
            try write("server.pem", Array(try server.serializeAsPEM().pemString.utf8), mode: 0o600)
            // It may hold the database's password.
            try write("server.json", try encode(config), mode: 0o600)
            written += databaseFiles
            (adminToken, enrollmentToken) = try makeTokens(dir)
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
            enrollmentToken: enrollmentToken, adminToken: adminToken,
            adminURL: adminURL(host: options.adminHost, port: options.adminPort, tls: adminTLS != nil, names: names),
            operatorCertificate: options.adminCertificate != nil && adminTLS != nil)
    }

    /// `https://NAME:PORT`: the admin host, or for a wildcard address the first name given
    /// with `--name` (else `localhost`).
    static func adminURL(host: String, port: Int, tls: Bool, names: [String]) -> String {
        let name = isWildcard(host) ? (names.count > 2 ? names[2] : "localhost") : host
        return "\(tls ? "https" : "http")://\(name.contains(":") ? "[\(name)]" : name):\(port)"
    }

    /// Loopback: 127.0.0.0/8, `::1` and `localhost` (``HostAddress/isLoopback(_:)``).
    public static func isLoopback(_ host: String) -> Bool { HostAddress.isLoopback(host) }

    static func isWildcard(_ host: String) -> Bool { host == "0.0.0.0" || host == "::" }

    /// The admin API's server TLS: TLS 1.3 only.
    static func adminTLSConfiguration(_ tls: AdminTLS, directory: String) throws -> TLSConfiguration {
        func path(_ p: String) -> String { p.hasPrefix("/") ? p : directory + "/" + p }
        let chain: [NIOSSLCertificate], key: NIOSSLPrivateKey
        do {
            chain = try NIOSSLCertificate.fromPEMFile(path(tls.certificate))
            key = try NIOSSLPrivateKey(file: path(tls.key), format: .pem)
        } catch {
            throw DeploymentError("cannot load the admin API's certificate (\(path(tls.certificate))) and key (\(path(tls.key))): \(error)")
        }
        guard !chain.isEmpty else { throw DeploymentError("\(path(tls.certificate)) holds no certificate") }
        var configuration = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        configuration.minimumTLSVersion = .tlsv13
        return configuration
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
            if let ip = IPv6Address(name) { return .ipAddress(ASN1OctetString(contentBytes: ArraySlice(ip.bytes))) }
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

/// A dotted-quad IPv4 address, in its canonical spelling only.
struct IPv4Address {
    var bytes: [UInt8]
    init?(_ text: String) {
        guard let bytes = HostAddress.ipv4(text) else { return nil }
        self.bytes = bytes
    }
}

/// An IPv6 address (`inet_pton`), for the certificate's IP entries.
struct IPv6Address {
    var bytes: [UInt8]
    init?(_ text: String) {
        var address = in6_addr()
        guard text.contains(":"), inet_pton(AF_INET6, text, &address) == 1 else { return nil }
        bytes = withUnsafeBytes(of: &address) { Array($0) }
    }
}
