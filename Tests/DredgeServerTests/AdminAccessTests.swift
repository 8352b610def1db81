import DredgeAdminAPI
import DredgeCommandLine
import DredgeTestSupport
import Foundation
import NIOSSL
import Testing
@testable import DredgeServer

/// The admin API's listener rules (HTTPS by default, plain HTTP only on loopback) and the pure
/// parts of downloads: byte ranges and listen addresses.
@Suite struct AdminAccessTests {
    @Test func initGivesTheAdminAPIHTTPSWithACertificateNamingItsAddress() throws {
        let dir = TempDir()
        var options = ServerDeployment.Options(dataDirectory: dir.file("data"))
        options.adminHost = "10.1.2.3"
        options.adminPort = 9443
        let created = try ServerDeployment.initialize(options)
        #expect(created.adminURL == "https://10.1.2.3:9443")
        #expect(created.loginCommand == "dredge login --server https://10.1.2.3:9443 --fingerprint \(created.caFingerprint) --token \(created.adminToken)")
        let loaded = try LoadedDeployment(directory: dir.file("data"))
        #expect(loaded.config.names.contains("10.1.2.3"))
        let tls = try #require(loaded.adminTLSConfiguration)
        #expect(tls.minimumTLSVersion == .tlsv13)
    }

    @Test func plainHTTPIsRefusedOffLoopbackAtInitAndAtStart() throws {
        let dir = TempDir()
        var options = ServerDeployment.Options(dataDirectory: dir.file("data"))
        options.adminHost = "0.0.0.0"
        options.adminPlainHTTP = true
        #expect(throws: DeploymentError.self) { try ServerDeployment.initialize(options) }
        #expect(!FileManager.default.fileExists(atPath: dir.file("data/ca.pem")), "nothing made")

        // A deployment from before HTTPS (no adminTLS) stays plain on loopback…
        options.adminHost = "127.0.0.1"
        _ = try ServerDeployment.initialize(options)
        #expect(try LoadedDeployment(directory: dir.file("data")).adminTLSConfiguration == nil)
        // …and will not start on another address.
        let path = dir.file("data/server.json")
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        config["adminHost"] = "192.168.1.20"
        try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: path))
        #expect(throws: DeploymentError.self) { try LoadedDeployment(directory: dir.file("data")) }
        #expect(throws: DeploymentError.self) { try LoadedDeployment.checkAdmin(host: "::", tls: false) }
        for loopback in ["127.0.0.1", "127.9.8.7", "::1", "localhost"] { #expect(throws: Never.self) { try LoadedDeployment.checkAdmin(host: loopback, tls: false) } }
    }

    @Test func anOperatorCertificateThatDoesNotLoadIsRefusedAtInit() throws {
        let dir = TempDir()
        try "not a certificate".write(toFile: dir.file("cert.pem"), atomically: true, encoding: .utf8)
        var options = ServerDeployment.Options(dataDirectory: dir.file("data"))
        options.adminCertificate = (dir.file("cert.pem"), dir.file("missing-key.pem"))
        #expect(throws: DeploymentError.self) { try ServerDeployment.initialize(options) }
    }

    @Test func byteRangesAreServedAsRFC9110Says() {
        #expect(ByteRange.parse(nil, size: 100) == .whole)
        #expect(ByteRange.parse("bytes=0-9", size: 100) == .partial(0...9))
        #expect(ByteRange.parse("bytes=90-", size: 100) == .partial(90...99))
        #expect(ByteRange.parse("bytes=90-500", size: 100) == .partial(90...99))
        #expect(ByteRange.parse("bytes=-10", size: 100) == .partial(90...99))
        #expect(ByteRange.parse("bytes=-500", size: 100) == .partial(0...99))
        #expect(ByteRange.parse("BYTES = 5-5", size: 100) == .whole, "not the form: ignored")
        #expect(ByteRange.parse("bytes=100-", size: 100) == .unsatisfiable)
        #expect(ByteRange.parse("bytes=-0", size: 100) == .unsatisfiable)
        #expect(ByteRange.parse("bytes=0-", size: 0) == .unsatisfiable)
        // Not served as ranges: the whole file.
        for ignored in ["bytes=0-1,5-6", "items=0-5", "bytes=5-1", "bytes=a-b", "bytes=-", "bytes=99999999999999999999-", "bytes=0x10-"] {
            #expect(ByteRange.parse(ignored, size: 100) == .whole, "\(ignored)")
        }
    }

    @Test func listenAddressesParse() {
        #expect(HostPort("127.0.0.2:8443", defaultPort: 7080) == HostPort(host: "127.0.0.2", port: 8443))
        #expect(HostPort("logs.example.com", defaultPort: 7080) == HostPort(host: "logs.example.com", port: 7080))
        #expect(HostPort("[::1]:0", defaultPort: 7080) == HostPort(host: "::1", port: 0))
        #expect(HostPort("[::]", defaultPort: 7080) == HostPort(host: "::", port: 7080))
        for bad in ["", ":80", "host:", "host:65536", "host:-1", "a:b:c", "[::1", "[::1]x", "ho st:80", "host:8o"] {
            #expect(HostPort(bad, defaultPort: 7080) == nil, "\(bad)")
        }
    }
}
