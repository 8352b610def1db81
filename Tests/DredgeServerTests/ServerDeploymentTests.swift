import DredgeEnvelope
import DredgeAdminAPI
@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Testing
import X509

@Suite struct ServerDeploymentTests {
    @Test func initCreatesACompleteDeploymentWithPrivateSecrets() async throws {
        let dir = TempDir()
        var options = ServerDeployment.Options(dataDirectory: dir.file("data"))
        options.names = ["logs.example.com", "10.1.2.3"]
        let created = try ServerDeployment.initialize(options)
        let fm = FileManager.default
        for file in ServerDeployment.files {
            let attributes = try fm.attributesOfItem(atPath: dir.file("data/\(file)"))
            let mode = (attributes[.posixPermissions] as! NSNumber).intValue
            // Certificates too: everything the server writes is its user's alone (#49).
            #expect(mode == 0o600, "\(file) has mode \(String(mode, radix: 8))")
        }
        #expect(created.agentAddress == "logs.example.com:7443")
        #expect(created.enrollmentToken.hasPrefix("dredge_enr_") && created.adminToken.hasPrefix("dredge_adm_"))

        // The server certificate chains to the CA and names the server.
        let ca = try Certificate(pemEncoded: contents(dir.file("data/ca.pem")))
        let server = try Certificate(pemEncoded: contents(dir.file("data/server.pem")))
        #expect(ServerDeployment.fingerprint(of: ca) == created.caFingerprint)
        for name in ["localhost", "logs.example.com"] {
            var verifier = Verifier(rootCertificates: CertificateStore([ca])) {
                RFC5280Policy(validationTime: Date())
                ServerIdentityPolicy(serverHostname: name, serverIP: nil)
            }
            let result = await verifier.validate(leaf: server, intermediates: CertificateStore())
            guard case .validCertificate = result else { Issue.record("\(name): \(result)"); continue }
        }
        var wrongName = Verifier(rootCertificates: CertificateStore([ca])) {
            RFC5280Policy(validationTime: Date())
            ServerIdentityPolicy(serverHostname: "evil.example.net", serverIP: nil)
        }
        if case .validCertificate = await wrongName.validate(leaf: server, intermediates: CertificateStore()) { Issue.record("accepted a name not in the certificate") }

        // Keys load back; the database holds token hashes only.
        _ = try ServerSigningKey(rawRepresentation: Hex.decode(contents(dir.file("data/signing-key")).trimmingCharacters(in: .whitespacesAndNewlines))!)
        _ = try RSAPrivateKey(pemRepresentation: contents(dir.file("data/encryption-key.pem")))
        let tokens = SQLiteTokenVault(try ServerDatabase(directory: dir.file("data")))
        #expect(try await tokens.admin(for: created.adminToken, now: Date())?.name == "admin")
        #expect(try await tokens.admin(for: created.enrollmentToken, now: Date())?.name == nil)
        #expect(try await tokens.acceptsEnrollment(created.enrollmentToken))
        #expect(try await !tokens.acceptsEnrollment(created.adminToken))
        #expect(try await !tokens.acceptsEnrollment("guess"))
        let bytes = try Data(contentsOf: URL(fileURLWithPath: dir.file("data/dredge.sqlite")))
        #expect(bytes.range(of: Data(created.adminToken.utf8)) == nil && bytes.range(of: Data(created.enrollmentToken.utf8)) == nil)
        #expect(try FileManager.default.attributesOfItem(atPath: dir.file("data/dredge.sqlite"))[.posixPermissions] as? Int == 0o600)
    }

    @Test func initRefusesToOverwriteAnExistingDeployment() throws {
        let dir = TempDir()
        let options = ServerDeployment.Options(dataDirectory: dir.file("data"))
        _ = try ServerDeployment.initialize(options)
        let before = ServerDeployment.files.map { contents(dir.file("data/\($0)")) }
        #expect(throws: DeploymentError.self) { try ServerDeployment.initialize(options) }
        #expect(ServerDeployment.files.map { contents(dir.file("data/\($0)")) } == before)
        // Even one leftover file is enough to refuse.
        let other = dir.file("other")
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        FileManager.default.createFile(atPath: other + "/signing-key", contents: Data("keep me".utf8))
        #expect(throws: DeploymentError.self) { try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: other)) }
        #expect(contents(other + "/signing-key") == "keep me")
        #expect(try FileManager.default.contentsOfDirectory(atPath: other) == ["signing-key"])
    }

    @Test func theCommandLinePrintsWhatAnAgentNeeds() throws {
        let dir = TempDir()
        func run(_ extra: [String] = [], data: String = "data") throws -> (Int32, String, String) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: builtProduct("dredge-server"))
            process.arguments = ["init", "--data", dir.file(data), "--name", "logs.example.com"] + extra
            let out = Pipe(), err = Pipe()
            process.standardOutput = out
            process.standardError = err
            try process.run()
            let o = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            let e = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            return (process.terminationStatus, o, e)
        }
        let (status, output, _) = try run()
        #expect(status == 0)
        for expected in ["server:          logs.example.com:7443", "CA fingerprint:  sha256:", "enrollment token: dredge_enr_", "dredge_adm_"] {
            #expect(output.contains(expected), "\(expected)")
        }
        let (again, _, errors) = try run()
        #expect(again == 1)
        #expect(errors.contains("refusing to overwrite"))
        // --listen takes a port as --admin-listen does (#50: it was kept whole as a host name,
        // and `run` then failed with the event loop's error).
        let (withPort, said, _) = try run(["--listen", "127.0.0.1:17443"], data: "other")
        #expect(withPort == 0 && said.contains("logs.example.com:17443"), "\(said)")
        let config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dir.file("other/server.json")))) as? [String: Any])
        #expect(config["listenHost"] as? String == "127.0.0.1" && config["agentPort"] as? Int == 17443, "\(config)")
        let (bad, _, badErrors) = try run(["--listen", "127.0.0.1:notaport"], data: "third")
        #expect(bad == 64 && badErrors.contains("--listen: '127.0.0.1:notaport' is not HOST, HOST:PORT"), "\(badErrors)")
    }

    /// #49: the database's password need not be in server.json or on a command line: it comes
    /// from the URL, else `PGPASSWORD`, else a password file in libpq's form (`PGPASSFILE`, else
    /// `~/.pgpass`), which must be private (a readable one is not used, as by libpq, and said why).
    @Test func theDatabasePasswordComesFromTheURLTheEnvironmentOrAPrivatePasswordFile() throws {
        let dir = TempDir()
        let file = dir.file("pgpass")
        try """
            # comment
            db.example:5432:other:dredge:wrong-database
            db.example:5432:dredge:someone:wrong-user
            *:5432:dredge:dredge:first\\:colon\\\\slash
            db.example:*:*:*:later
            """.write(toFile: file, atomically: true, encoding: .utf8)
        chmod(file, 0o600)
        let url = "postgres://dredge@db.example/dredge"
        typealias Location = PostgresDatabase.Location
        #expect(try Location(url: url, environment: ["PGPASSFILE": file]).password == "first:colon\\slash")
        #expect(try Location(url: "postgres://dredge@db.example:6000/dredge", environment: ["PGPASSFILE": file]).password == "later")
        #expect(try Location(url: "postgres://nobody@elsewhere/x", environment: ["PGPASSFILE": file]).password == nil)
        #expect(try Location(url: url, environment: ["PGPASSFILE": file, "PGPASSWORD": "env"]).password == "env")
        #expect(try Location(url: "postgres://dredge:inline@db.example/dredge", environment: ["PGPASSFILE": file]).password == "inline")
        // ~/.pgpass when PGPASSFILE is not set; none at all is no error.
        try FileManager.default.createDirectory(atPath: dir.file("home"), withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: file, toPath: dir.file("home/.pgpass"))
        #expect(try Location(url: url, environment: ["HOME": dir.file("home")]).password == "first:colon\\slash")
        #expect(try Location(url: url, environment: ["HOME": dir.file("nowhere")]).password == nil)
        // As libpq: a file others may read is not used, and the server says why; a missing one is none.
        chmod(file, 0o644)
        let open = try Location(url: url, environment: ["PGPASSFILE": file])
        #expect(open.password == nil && open.passwordFileProblem?.contains("chmod 600") == true)
        #expect(try Location(url: url, environment: ["PGPASSFILE": dir.file("missing")]).password == nil)
    }
}

func contents(_ path: String) -> String { String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self) }
