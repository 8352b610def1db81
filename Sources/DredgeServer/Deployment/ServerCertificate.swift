import Crypto
import DredgeEnvelope
import Foundation
import Logging
import NIOSSL
import ServiceLifecycle
import Synchronization
import SwiftASN1
import X509

/// The agent listener's certificate (`server.pem`, `server-key.pem`), signed by the
/// deployment's CA for two years, and its renewal (#56).
///
/// Agents trust the CA (`ca.pem`, pinned at enrollment), not the certificate: a new one with a
/// new key, signed by the same CA for the same names, is one they accept without re-enrolling.
/// So the server renews its certificate itself once it has less than ``renewWithin`` left
/// (30 days): at start, and while it runs (``CertificateRenewal``), which also hands the new one
/// to the listeners for every connection from then on (connections open stay as they are).
/// `dredge-server certificate renew` does it by hand.
///
/// A renewal writes `server-key.pem.next` and `server.pem.next`, then renames the key into
/// place, then the certificate. One cut short between the two renames (a crash) is finished
/// the next time the certificate is read; one cut short before is started again. Nodes of a
/// cluster sharing the data directory renew one at a time (an exclusive lock on
/// `server.pem.lock`), and the others pick up what the first wrote.
public enum ServerCertificate {
    /// A certificate with less than this left is renewed.
    public static let renewWithin: TimeInterval = 30 * 86_400

    public struct Info: Sendable, Equatable {
        public var notBefore: Date
        public var notAfter: Date
        /// The names it holds (DNS names and IP addresses).
        public var names: [String]
        /// `sha256:` + hex of its DER.
        public var fingerprint: String

        public func left(at now: Date) -> TimeInterval { notAfter.timeIntervalSince(now) }
        public func isDue(at now: Date, within: TimeInterval = ServerCertificate.renewWithin) -> Bool { left(at: now) < within }
    }

    /// The certificate in `directory` (an interrupted renewal finished first).
    public static func read(directory: String) throws -> Info {
        try holdingLock(directory) {
            try finishLocked(directory: directory)
            return try info(of: try leaf(directory + "/server.pem"))
        }
    }

    /// The certificate and its key as the agent listener serves them (and the admin API, when
    /// `admin`), read as one pair under the lock: never half of a renewal.
    static func loadPair(directory: String, admin: Bool) throws -> (agent: TLSConfiguration, admin: TLSConfiguration?, info: Info) {
        try holdingLock(directory) {
            try finishLocked(directory: directory)
            let agent = try LoadedDeployment.agentTLSConfiguration(pairIn: directory)
            let adminTLS = try admin ? ServerDeployment.adminTLSConfiguration(ServerDeployment.AdminTLS(certificate: "server.pem", key: "server-key.pem"), directory: directory) : nil
            return (agent, adminTLS, try info(of: try leaf(directory + "/server.pem")))
        }
    }

    /// Renews the certificate if it has less than `within` left; what it is now, and whether
    /// this call renewed it.
    @discardableResult
    public static func renewIfDue(directory: String, now: Date = Date(), within: TimeInterval = renewWithin) throws -> (info: Info, renewed: Bool) {
        let current = try read(directory: directory)
        guard current.isDue(at: now, within: within) else { return (current, false) }
        return try holdingLock(directory) {
            // Another node may have renewed it while this one waited for the lock.
            try finishLocked(directory: directory)
            let again = try info(of: try leaf(directory + "/server.pem"))
            guard again.isDue(at: now, within: within) else { return (again, false) }
            return (try make(directory: directory, now: now), true)
        }
    }

    /// Renews the certificate now, whatever it has left.
    public static func renew(directory: String, now: Date = Date()) throws -> Info {
        try holdingLock(directory) {
            try finishLocked(directory: directory)
            return try make(directory: directory, now: now)
        }
    }

    /// A new key and certificate for the names in `server.json` (those the old one held when
    /// it has none), signed by the CA, swapped in.
    private static func make(directory: String, now: Date) throws -> Info {
        let fm = FileManager.default
        guard let caKeyPEM = fm.contents(atPath: directory + "/ca-key.pem") else {
            throw DeploymentError("\(directory)/ca-key.pem is missing: only the CA's key signs a new certificate")
        }
        let caKey: P256.Signing.PrivateKey
        do {
            caKey = try P256.Signing.PrivateKey(pemRepresentation: String(decoding: caKeyPEM, as: UTF8.self))
        } catch {
            throw DeploymentError("\(directory)/ca-key.pem is not the CA's P-256 key: \(error)")
        }
        let ca = try leaf(directory + "/ca.pem")
        guard ca.publicKey == Certificate.PrivateKey(caKey).publicKey else {
            throw DeploymentError("\(directory)/ca-key.pem is not the key of ca.pem")
        }
        let old = try leaf(directory + "/server.pem")
        let configured = try LoadedDeployment.readConfig(directory: directory).names
        let names = configured.isEmpty ? try info(of: old).names : configured
        let key = P256.Signing.PrivateKey()
        let certificate = try ServerDeployment.makeServerCertificate(key: key, names: names, ca: ca, caKey: caKey, now: now)
        let (keyPath, certificatePath) = (directory + "/server-key.pem", directory + "/server.pem")
        try ServerDeployment.writeExclusive(keyPath + ".next", Array(key.pemRepresentation.utf8), mode: 0o600)
        try ServerDeployment.writeExclusive(certificatePath + ".next", Array(try certificate.serializeAsPEM().pemString.utf8), mode: 0o600)
        try syncDirectory(directory)
        try rename(keyPath + ".next", to: keyPath)
        try rename(certificatePath + ".next", to: certificatePath)
        return try info(of: certificate)
    }

    /// A renewal cut short: both `.next` files there (nothing swapped yet: they go, the
    /// certificate's first, so a crash meanwhile never leaves it alone), or the certificate's
    /// alone (the key is in place: the certificate follows). Called holding the lock (so a
    /// renewal running meanwhile, another node's, is waited for, not taken for a crash).
    static func finishLocked(directory: String) throws {
        let fm = FileManager.default
        let (keyPath, certificatePath) = (directory + "/server-key.pem", directory + "/server.pem")
        guard fm.fileExists(atPath: certificatePath + ".next") else {
            if fm.fileExists(atPath: keyPath + ".next") { try fm.removeItem(atPath: keyPath + ".next") }
            return
        }
        if fm.fileExists(atPath: keyPath + ".next") {
            try fm.removeItem(atPath: certificatePath + ".next")
            try syncDirectory(directory)
            try fm.removeItem(atPath: keyPath + ".next")
        } else {
            try rename(certificatePath + ".next", to: certificatePath)
        }
    }

    private static func rename(_ from: String, to: String) throws {
        guard Foundation.rename(from, to) == 0 else { throw DeploymentError("cannot rename \(from) to \(to): \(String(cString: strerror(errno)))") }
        // The directory's entry; the file itself was synced when written.
        try syncDirectory((to as NSString).deletingLastPathComponent)
    }

    private static func syncDirectory(_ directory: String) throws { try DataDirectory.sync(directory) }

    /// Runs `body` holding `server.pem.lock` exclusively: renewals, and every read of the pair
    /// (the listeners', a backup's), one at a time across the nodes sharing the directory.
    /// Another `lock` (`keyring.lock`) serves the key ring's rotations the same way.
    /// Not reentrant: `body` must not take it again. The server makes the file (0600, as all it
    /// writes) at its start. Where it cannot be opened, `body` runs without it: a directory
    /// that cannot be written (a read-only copy being backed up, where nobody renews), or a
    /// file another user made (a command run as root before the server ever started): a
    /// renewal must not fail for good for want of a lock.
    static func holdingLock<T>(_ directory: String, lock: String = "server.pem.lock", _ body: () throws -> T) throws -> T {
        let path = directory + "/" + lock
        let fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0o600)
        if fd < 0 && (errno == EROFS || errno == EACCES) { return try body() }
        guard fd >= 0 else { throw DeploymentError("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        while flock(fd, LOCK_EX) != 0 {
            guard errno == EINTR else { throw DeploymentError("cannot lock \(path): \(String(cString: strerror(errno)))") }
        }
        defer { flock(fd, LOCK_UN) }
        return try body()
    }

    /// The first certificate of a PEM file.
    static func leaf(_ path: String) throws -> Certificate {
        guard let data = FileManager.default.contents(atPath: path) else { throw DeploymentError("\(path) is missing") }
        do {
            let pem = String(decoding: data, as: UTF8.self)
            guard let first = try PEMDocument.parseMultiple(pemString: pem).first else { throw DeploymentError("\(path) holds no certificate") }
            return try Certificate(pemDocument: first)
        } catch let error as DeploymentError {
            throw error
        } catch {
            throw DeploymentError("\(path) is not a certificate: \(error)")
        }
    }

    static func info(of certificate: Certificate) throws -> Info {
        var names: [String] = []
        for name in try certificate.extensions.subjectAlternativeNames ?? SubjectAlternativeNames([]) {
            switch name {
            case .dnsName(let dns): names.append(dns)
            case .ipAddress(let octets):
                let bytes = Array(octets.bytes)
                if bytes.count == 4 {
                    names.append(bytes.map(String.init).joined(separator: "."))
                } else if bytes.count == 16 {
                    names.append(stride(from: 0, to: 16, by: 2).map { String(UInt16(bytes[$0]) << 8 | UInt16(bytes[$0 + 1]), radix: 16) }.joined(separator: ":"))
                }
            default: break
            }
        }
        return Info(notBefore: certificate.notValidBefore, notAfter: certificate.notValidAfter, names: names, fingerprint: ServerDeployment.fingerprint(of: certificate))
    }
}

/// A TLS context the listeners hand each new connection, replaced when the certificate is
/// renewed: connections already open keep the one they began with.
public final class ReloadableTLS: Sendable {
    private let current: Mutex<NIOSSLContext>

    public init(_ configuration: TLSConfiguration) throws {
        current = Mutex(try NIOSSLContext(configuration: configuration))
    }

    public var context: NIOSSLContext { current.withLock { $0 } }

    public func replace(with configuration: TLSConfiguration) throws {
        let next = try NIOSSLContext(configuration: configuration)
        current.withLock { $0 = next }
    }
}

/// Renews the agent listener's certificate while the server runs (``ServerCertificate``), and
/// hands a new one to the listeners, whoever wrote it (this node, another node of the cluster,
/// `dredge-server certificate renew`): it looks every `every` (an hour).
public final class CertificateRenewal: Service, Sendable {
    let directory: String
    let agentTLS: ReloadableTLS
    /// The admin API's, when it serves the same certificate (the deployment's default).
    let adminTLS: ReloadableTLS?
    let every: Duration
    let within: TimeInterval
    let now: @Sendable () -> Date
    let logger: Logger
    let metrics: ServerMetrics?
    /// The fingerprint of the certificate the listeners have.
    private let served: Mutex<String>

    public init(
        directory: String, agentTLS: ReloadableTLS, adminTLS: ReloadableTLS?, every: Duration = .seconds(3600), within: TimeInterval = ServerCertificate.renewWithin,
        now: @escaping @Sendable () -> Date = { Date() }, metrics: ServerMetrics? = nil, logger: Logger
    ) throws {
        self.directory = directory
        self.agentTLS = agentTLS
        self.adminTLS = adminTLS
        self.every = every
        self.within = within
        self.now = now
        self.metrics = metrics
        self.logger = logger
        // What the listeners serve from now on, whatever changed since they were made.
        let pair = try ServerCertificate.loadPair(directory: directory, admin: adminTLS != nil)
        try agentTLS.replace(with: pair.agent)
        if let adminTLS, let admin = pair.admin { try adminTLS.replace(with: admin) }
        served = Mutex(pair.info.fingerprint)
        metrics?.certificateExpiry.set(pair.info.notAfter.timeIntervalSince1970)
    }

    /// What one look did.
    public enum Outcome: Sendable, Equatable {
        case unchanged
        /// Renewed here, and handed to the listeners.
        case renewed(ServerCertificate.Info)
        /// Written by someone else, handed to the listeners.
        case reloaded(ServerCertificate.Info)
    }

    /// One look: renews the certificate when due, and hands it to the listeners when it is not
    /// the one they have.
    @discardableResult
    public func check() throws -> Outcome {
        let renewed = try ServerCertificate.renewIfDue(directory: directory, now: now(), within: within).renewed
        let pair = try ServerCertificate.loadPair(directory: directory, admin: adminTLS != nil)
        let info = pair.info
        guard served.withLock({ $0 }) != info.fingerprint else { return .unchanged }
        try agentTLS.replace(with: pair.agent)
        if let adminTLS, let admin = pair.admin { try adminTLS.replace(with: admin) }
        served.withLock { $0 = info.fingerprint }
        // The certificate served, once it is.
        metrics?.certificateExpiry.set(info.notAfter.timeIntervalSince1970)
        let metadata: Logger.Metadata = [
            "not.after": "\(info.notAfter)", "fingerprint": "\(info.fingerprint)", "admin": "\(adminTLS != nil ? "too" : "its own certificate")",
        ]
        if renewed {
            logger.notice("renewed the agent listener's certificate; new connections get it", metadata: metadata)
            return .renewed(info)
        }
        logger.notice("the agent listener's certificate changed on disk; new connections get it", metadata: metadata)
        return .reloaded(info)
    }

    public func run() async throws {
        await Periodic.run(every: every, reportEvery: .seconds(3600), { try check() }) { error in
            logger.error("cannot renew or reload the agent listener's certificate", metadata: ["error": "\(error)"])
        }
    }
}
