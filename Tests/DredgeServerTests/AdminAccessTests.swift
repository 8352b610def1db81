import AsyncHTTPClient
import DredgeCommandLine
import DredgeTestSupport
import Foundation
import NIOSSL
import Testing
@testable import DredgeAdminAPI
@testable import DredgeAdminClient
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

    /// The running server, not only its configuration: a client that stops at TLS 1.2 gets no
    /// answer; the same client allowed TLS 1.3 gets one.
    @Test func theRunningAdminAPIRefusesTLS12() async throws {
        let d = try AgentServerEndToEndTests.Deployment()
        let (server, _) = try d.startServer()
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        func health(upTo version: TLSVersion) async throws -> Result<UInt, any Error> {
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(d.data + "/ca.pem"))
            tls.maximumTLSVersion = version
            let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: HTTPClient.Configuration(tlsConfiguration: tls))
            let result: Result<UInt, any Error>
            do {
                let response = try await client.execute(HTTPClientRequest(url: admin + "/health"), timeout: .seconds(30))
                result = .success(response.status.code)
            } catch {
                result = .failure(error)
            }
            try await client.shutdown()
            return result
        }
        let modern = try await health(upTo: .tlsv13)
        #expect((try? modern.get()) == 200, "\(modern)")
        let old = try await health(upTo: .tlsv12)
        #expect((try? old.get()) == nil, "a TLS 1.2 client must not be answered: \(old)")
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

    /// A port nothing listens on is said in words, without the event loop's (#50).
    @Test func aClosedPortIsSaidInWords() async throws {
        // A port that was free a moment ago: bound, then closed.
        let socket = try ServerSocketProbe()
        let port = socket.port
        socket.close()
        let client = try AdminClient(server: "http://127.0.0.1:\(port)", token: "t")
        do {
            try await client.health()
            Issue.record("nothing listens there")
        } catch let error as AdminClientError {
            #expect("\(error)".contains("nothing listens on 127.0.0.1:\(port) (connection refused)") && !"\(error)".contains("errno"), "\(error)")
        }
    }

    /// Binds a TCP socket on loopback to a port the system picks.
    struct ServerSocketProbe {
        let fd: Int32
        let port: Int

        init() throws {
            let fd = Foundation.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = 0
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Foundation.bind(fd, $0, length) } }
            guard bound == 0 else { throw POSIXError(.EADDRINUSE) }
            _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
            self.fd = fd
            port = Int(UInt16(bigEndian: address.sin_port))
        }

        func close() { _ = Foundation.close(fd) }
    }

    @Test func loopbackIsReadStrictly() {
        for loopback in ["127.0.0.1", "127.255.0.9", "localhost", "LOCALHOST", "::1", "[::1]"] { #expect(HostAddress.isLoopback(loopback), "\(loopback)") }
        // Spellings a resolver reads as another address, and names that only start like loopback.
        for other in ["0127.0.0.1", "127.1", "127.0.0.1.evil.example", "127.0.0.01", "0x7f.0.0.1", "10.0.0.1", "::", "0.0.0.0", "127.0.0.256", " 127.0.0.1"] {
            #expect(!HostAddress.isLoopback(other), "\(other)")
        }
    }

    @Test func theServerRefusesToStartPlainHTTPOffLoopbackEvenWhenTheCommandLineMovesIt() throws {
        let dir = TempDir()
        var options = ServerDeployment.Options(dataDirectory: dir.file("data"))
        options.adminPlainHTTP = true
        _ = try ServerDeployment.initialize(options)
        let (status, output) = try ManagedProcess.run("dredge-server", ["run", "--data", dir.file("data"), "--agent-port", "0", "--admin-listen", "0.0.0.0:0"])
        #expect(status != 0 && output.contains("allowed only on loopback"), "\(output)")
    }

    @Test func theClientSendsNoTokenInTheClearOffLoopback() throws {
        #expect(throws: AdminClientError.plainHTTP("http://10.0.0.1:7080")) { try AdminClient(server: "http://10.0.0.1:7080", token: "t") }
        #expect(throws: AdminClientError.plainHTTP("http://0127.0.0.1:7080")) { try AdminClient(server: "http://0127.0.0.1:7080", token: "t") }
        #expect(try AdminClient(server: "10.0.0.1:7080", token: "t").baseURL.scheme == "https", "a bare address means https")
        #expect(try AdminClient(server: "http://127.0.0.1:7080", token: "t").baseURL.scheme == "http")
    }

    @Test func onlyTheCertificateTheFingerprintNamesIsPinned() throws {
        let dir = TempDir()
        let real = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: dir.file("real")))
        _ = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: dir.file("attacker")))
        let realPEM = try contents(dir.file("real/ca.pem")), attackerPEM = try contents(dir.file("attacker/ca.pem"))
        let expected = String(real.caFingerprint.dropFirst("sha256:".count))
        // The real CA with the attacker's after it: only the real one comes back.
        let pinned = try #require(AdminClient.verifiedCA(realPEM + attackerPEM, sha256Hex: expected))
        #expect(pinned.components(separatedBy: "BEGIN CERTIFICATE").count == 2)
        #expect(try NIOSSLCertificate.fromPEMBytes(Array(pinned.utf8)) == NIOSSLCertificate.fromPEMBytes(Array(realPEM.utf8)))
        #expect(AdminClient.verifiedCA(attackerPEM + realPEM, sha256Hex: expected) == nil)
        #expect(AdminClient.verifiedCA("junk", sha256Hex: expected) == nil)
    }

    @Test func namesAServerListsAreUsedAsPathsOnlyWhenSafe() {
        for safe in ["2026-11-20.jsonl", "manifest.json", "0123456789abcdef0123456789abcdef.zip"] { #expect(AdminClient.isSafeName(safe), "\(safe)") }
        for unsafe in ["..", ".", ".bashrc", "a/b", "", "x\u{0}y", "ü.jsonl", String(repeating: "a", count: 256)] { #expect(!AdminClient.isSafeName(unsafe), "\(unsafe)") }
    }

    @Test func withTheOperatorsCertificateTheLoginLineHasNoFingerprint() throws {
        let dir = TempDir()
        // Any valid chain and key stand for the operator's: another deployment's.
        _ = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: dir.file("company")))
        var options = ServerDeployment.Options(dataDirectory: dir.file("data"))
        options.adminCertificate = (dir.file("company/server.pem"), dir.file("company/server-key.pem"))
        let created = try ServerDeployment.initialize(options)
        #expect(created.loginCommand == "dredge login --server https://127.0.0.1:7080 --token \(created.adminToken)")
        #expect(try LoadedDeployment(directory: dir.file("data")).config.adminTLS == .init(certificate: dir.file("company/server.pem"), key: dir.file("company/server-key.pem")))
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
