import Crypto
import DredgeAgentCore
@testable import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
import Logging
import Testing
import X509

/// The agent listener's certificate renews itself before it expires, and agents follow
/// without re-enrolling (#56).
@Suite struct CertificateRenewalTests {
    static let twoYears: TimeInterval = 2 * 365 * 86_400

    /// A deployment made `age` ago, with a name of its own.
    static func deployment(made age: TimeInterval, in dir: TempDir) throws -> String {
        var options = ServerDeployment.Options(dataDirectory: dir.file("server"))
        options.names = ["logs.example.com", "10.0.0.7"]
        options.now = Date().addingTimeInterval(-age)
        _ = try ServerDeployment.initialize(options)
        return dir.file("server")
    }

    @Test func aCertificateWithLessThan30DaysLeftIsRenewedByTheSameCAForTheSameNames() throws {
        let dir = TempDir()
        let data = try Self.deployment(made: Self.twoYears - 10 * 86_400, in: dir)
        let before = try ServerCertificate.read(directory: data)
        #expect(before.isDue(at: Date()) && before.left(at: Date()) < 11 * 86_400)
        #expect(before.names == ["localhost", "127.0.0.1", "logs.example.com", "10.0.0.7"])
        let (caBefore, keyBefore) = (contents(data + "/ca.pem"), contents(data + "/server-key.pem"))

        let (after, renewed) = try ServerCertificate.renewIfDue(directory: data)
        #expect(renewed)
        #expect(after.names == before.names && after.fingerprint != before.fingerprint)
        #expect(after.left(at: Date()) > Self.twoYears - 86_400)
        #expect(contents(data + "/ca.pem") == caBefore && contents(data + "/server-key.pem") != keyBefore)
        // Signed by the deployment's CA, for the key beside it.
        let ca = try ServerCertificate.leaf(data + "/ca.pem"), certificate = try ServerCertificate.leaf(data + "/server.pem")
        #expect(ca.publicKey.isValidSignature(certificate.signature, for: certificate))
        #expect(certificate.issuer == ca.subject)
        let key = try P256.Signing.PrivateKey(pemRepresentation: contents(data + "/server-key.pem"))
        #expect(certificate.publicKey == Certificate.PrivateKey(key).publicKey)
        _ = try LoadedDeployment(directory: data)
        var info = stat()
        #expect(stat(data + "/server-key.pem", &info) == 0 && info.st_mode & 0o777 == 0o600)
        #expect(!FileManager.default.fileExists(atPath: data + "/server.pem.next") && !FileManager.default.fileExists(atPath: data + "/server-key.pem.next"))

        // Not again: it has two years now.
        #expect(try ServerCertificate.renewIfDue(directory: data).renewed == false)
        #expect(try ServerCertificate.read(directory: data) == after)
    }

    @Test func aCertificateWithMoreThan30DaysLeftIsLeftAlone() throws {
        let dir = TempDir()
        let data = try Self.deployment(made: Self.twoYears - 40 * 86_400, in: dir)
        let files = InProcessServer.snapshot(data)
        #expect(try ServerCertificate.renewIfDue(directory: data).renewed == false)
        #expect(InProcessServer.snapshot(data).filter { !$0.key.hasSuffix(".lock") } == files)
    }

    /// Cut short between its two renames (the key in place, the certificate not yet): finished
    /// at the next read; cut short before them: the old pair stays.
    @Test func aRenewalCutShortIsFinishedOrForgotten() throws {
        let dir = TempDir()
        let data = try Self.deployment(made: 0, in: dir)
        let old = (certificate: contents(data + "/server.pem"), key: contents(data + "/server-key.pem"))
        let renewed = try ServerCertificate.renew(directory: data)
        // The crash after the key's rename: the new key, the old certificate, the new one aside.
        try FileManager.default.moveItem(atPath: data + "/server.pem", toPath: data + "/server.pem.next")
        try old.certificate.write(toFile: data + "/server.pem", atomically: false, encoding: .utf8)
        #expect(try ServerCertificate.read(directory: data) == renewed)
        let key = try P256.Signing.PrivateKey(pemRepresentation: contents(data + "/server-key.pem"))
        #expect(try ServerCertificate.leaf(data + "/server.pem").publicKey == Certificate.PrivateKey(key).publicKey)

        // The crash before either rename: both `.next` files go, the pair in place stays.
        try old.certificate.write(toFile: data + "/server.pem.next", atomically: false, encoding: .utf8)
        try old.key.write(toFile: data + "/server-key.pem.next", atomically: false, encoding: .utf8)
        _ = try LoadedDeployment(directory: data)
        #expect(try ServerCertificate.read(directory: data) == renewed)
        #expect(!FileManager.default.fileExists(atPath: data + "/server.pem.next") && !FileManager.default.fileExists(atPath: data + "/server-key.pem.next"))
    }

    @Test func withoutTheCAsKeyNothingIsRenewedAndTheErrorSaysWhy() throws {
        let dir = TempDir()
        let data = try Self.deployment(made: Self.twoYears - 86_400, in: dir)
        try FileManager.default.moveItem(atPath: data + "/ca-key.pem", toPath: dir.file("ca-key.pem"))
        let before = InProcessServer.snapshot(data)
        let error = try #require(throws: DeploymentError.self) { try ServerCertificate.renewIfDue(directory: data) }
        #expect(error.description.contains("ca-key.pem is missing"))
        #expect(InProcessServer.snapshot(data).filter { !$0.key.hasSuffix(".lock") } == before)
    }

    /// The certificate a TLS server on `port` presents, as its fingerprint (`sha256:` + hex),
    /// read by Python's ssl module (no verification: only the certificate is wanted).
    static func presented(port: Int) throws -> String {
        let script = #"ssl, hashlib, sys = __import__("ssl"), __import__("hashlib"), __import__("sys"); "#
            + #"print("sha256:" + hashlib.sha256(ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", int(sys.argv[1]))))).hexdigest())"#
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", script, String(port)]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A running server renewed by hand (`dredge-server certificate renew`) and by itself: each
    /// new certificate goes to new connections of both listeners; an agent connected before
    /// stays connected, and agents connect after it with the CA they enrolled with.
    @Test func aRunningServerHandsTheNewCertificateToNewConnections() async throws {
        try await withStopping(InProcessServer(adminTLS: true)) { server in
            let agent = try await server.enrollAgent()
            let adminPort = try #require(URL(string: server.adminURL)?.port)
            let logger = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }
            let original = try ServerCertificate.read(directory: server.data)
            #expect(try Self.presented(port: server.agentPort) == original.fingerprint)
            let renewal = try CertificateRenewal(directory: server.data, agentTLS: server.agentTLS, adminTLS: server.adminTLS, logger: logger)
            #expect(try renewal.check() == .unchanged)

            try await agent.connect { link in
                #expect(try await LinkAgent.heartbeatAcked(["u-1"], over: link))
                // Renewed by the command line: the next look hands it on.
                let byHand = try ServerCertificate.renew(directory: server.data)
                #expect(try Self.presented(port: server.agentPort) == original.fingerprint, "not before the next look")
                #expect(try renewal.check() == .reloaded(byHand))
                #expect(try Self.presented(port: server.agentPort) == byHand.fingerprint)
                #expect(try Self.presented(port: adminPort) == byHand.fingerprint)
                // The connection made before goes on as it was.
                #expect(try await LinkAgent.heartbeatAcked(["u-1"], over: link))
            }
            // A new connection, trusting the CA alone, as the agent enrolled.
            try await agent.connect { link in
                let acked = try await LinkAgent.heartbeatAcked(["u-1"], over: link)
                #expect(acked)
            }
            #expect(try await server.admin.agents().count == 1)

            // Due (as a renewal three years ahead sees it): renewed and handed on by the service.
            let due = try CertificateRenewal(
                directory: server.data, agentTLS: server.agentTLS, adminTLS: server.adminTLS, within: 3 * 365 * 86_400, logger: logger)
            guard case .renewed(let renewed) = try due.check() else { throw DeploymentError("not renewed") }
            #expect(try Self.presented(port: server.agentPort) == renewed.fingerprint)
            try await agent.connect { link in
                let acked = try await LinkAgent.heartbeatAcked(["u-1"], over: link)
                #expect(acked)
            }
        }
    }
}
