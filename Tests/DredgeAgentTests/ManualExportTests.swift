import DredgeEnvelope
import DredgeTestSupport
import Foundation
import Testing

/// `dredge-agent export` and `dredge open-export` as a developer at the device runs them.
@Suite struct ManualExportTests {
    struct Device {
        let dir = TempDir()
        var state: String { dir.file("state") }
        var store: String { dir.file("logs.sqlite") }

        init() throws {
            let (status, output) = try ManagedProcess.run("dredge-demo", ["generate", "--store", dir.file("logs.sqlite"), "--uids", "u-1,u-2", "--records", "3000", "--seed", "5"])
            #expect(status == 0, "\(output)")
            try FileManager.default.createDirectory(atPath: dir.file("state"), withIntermediateDirectories: true)
        }

        func configure(_ json: String) throws { try json.write(toFile: state + "/config.json", atomically: true, encoding: .utf8) }

        func export(_ arguments: [String]) throws -> (status: Int32, output: String) {
            try ManagedProcess.run("dredge-agent", ["export", "--state", state, "--store", store] + arguments)
        }
    }

    /// The entries of a zip and their contents, read by Python's zipfile (an independent reader).
    func unzip(_ path: String) throws -> [String: String] {
        let script = "import json,sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); print(json.dumps({n: z.read(n).decode() for n in z.namelist()}))"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", script, path]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (try JSONSerialization.jsonObject(with: data) as? [String: String]) ?? [:]
    }

    @Test func disabledUnlessTheConfigurationAllowsIt() throws {
        let d = try Device()
        let out = d.dir.file("export.zip")
        let refused = try d.export(["--uid", "u-1", "--out", out])
        #expect(refused.status == 1 && refused.output.contains("manual export is disabled"), "\(refused.output)")
        #expect(!FileManager.default.fileExists(atPath: out))

        try d.configure(#"{"allowManualExport": false}"#)
        #expect(try d.export(["--uid", "u-1", "--out", out]).status == 1)
        try d.configure("not json")
        let broken = try d.export(["--uid", "u-1", "--out", out])
        #expect(broken.status == 1 && broken.output.contains("config.json is not valid"), "\(broken.output)")

        try d.configure(#"{"allowManualExport": true, "manualExportRequiresEncryption": true}"#)
        let plain = try d.export(["--uid", "u-1", "--out", out])
        #expect(plain.status == 1 && plain.output.contains("only sealed"), "\(plain.output)")
        #expect(!FileManager.default.fileExists(atPath: out))
    }

    @Test func aPlainExportIsTheZipAPullWouldUpload() throws {
        let d = try Device()
        try d.configure(#"{"allowManualExport": true}"#)
        let out = d.dir.file("export.zip")
        let (status, output) = try d.export(["--uid", "u-2", "--level", "warning+", "--out", out])
        #expect(status == 0, "\(output)")
        let entries = try unzip(out)
        #expect(entries["manifest.json"]?.contains(#""kind":"export""#) == true, "\(entries.keys)")
        let days = entries.keys.filter { $0.hasSuffix(".jsonl") }
        #expect(!days.isEmpty)
        let lines = days.flatMap { entries[$0]!.split(separator: "\n") }
        #expect(!lines.isEmpty && lines.allSatisfy { $0.contains(#""uid":"u-2""#) && ($0.contains(#""level":"warning""#) || $0.contains(#""level":"error""#) || $0.contains(#""level":"critical""#)) })

        // An existing file is never overwritten.
        let again = try d.export(["--uid", "u-2", "--out", out])
        #expect(again.status == 1 && again.output.contains("not overwriting"))
    }

    @Test func aSealedExportOpensOnlyWithItsKeyAndOnlyWhole() throws {
        let d = try Device()
        try d.configure(#"{"allowManualExport": true, "manualExportRequiresEncryption": true}"#)
        let recipient = try RSAPrivateKey.generate()
        try recipient.pemRepresentation.write(toFile: d.dir.file("engineer.pem"), atomically: true, encoding: .utf8)
        try recipient.publicKey.pemRepresentation.write(toFile: d.dir.file("engineer.pub"), atomically: true, encoding: .utf8)
        let sealed = d.dir.file("export.sealed")
        let (status, output) = try d.export(["--uid", "u-1", "--since", "2d", "--out", sealed, "--encrypt-to", d.dir.file("engineer.pub")])
        #expect(status == 0, "\(output)")
        let bytes = try #require(FileManager.default.contents(atPath: sealed))
        #expect(bytes.prefix(8) == Data("DRDGEXP1".utf8))
        #expect(!String(decoding: bytes, as: UTF8.self).contains(#""uid":"u-1""#), "the records are not readable in the file")

        // The engineer opens it.
        let opened = try ManagedProcess.run("dredge", ["open-export", sealed, "--key", d.dir.file("engineer.pem"), "--out", d.dir.file("opened")])
        #expect(opened.status == 0, "\(opened.output)")
        let files = try FileManager.default.contentsOfDirectory(atPath: d.dir.file("opened"))
        #expect(files.contains("manifest.json") && files.contains { $0.hasSuffix(".jsonl") })
        for file in files where file.hasSuffix(".jsonl") {
            #expect(contents(d.dir.file("opened/" + file)).split(separator: "\n").allSatisfy { $0.contains(#""uid":"u-1""#) })
        }

        // Another key, a changed byte, a cut file: refused, and nothing unpacked.
        let other = try RSAPrivateKey.generate()
        try other.pemRepresentation.write(toFile: d.dir.file("other.pem"), atomically: true, encoding: .utf8)
        var tampered = bytes
        tampered[tampered.count - 40] ^= 0x01
        try tampered.write(to: URL(fileURLWithPath: d.dir.file("tampered.sealed")))
        try bytes.prefix(bytes.count - 100).write(to: URL(fileURLWithPath: d.dir.file("cut.sealed")))
        let cases: [(String, String, String)] = [
            (sealed, "other.pem", "not sealed to this key"),
            (d.dir.file("tampered.sealed"), "engineer.pem", "does not authenticate"),
            (d.dir.file("cut.sealed"), "engineer.pem", "truncated"),
            (d.dir.file("engineer.pub"), "engineer.pem", "not a sealed Dredge export"),
        ]
        for (index, (file, key, message)) in cases.enumerated() {
            let target = d.dir.file("refused-\(index)")
            let result = try ManagedProcess.run("dredge", ["open-export", file, "--key", d.dir.file(key), "--out", target])
            #expect(result.status == 1 && result.output.contains(message), "\(message): \(result.output)")
            #expect(!FileManager.default.fileExists(atPath: target))
        }
    }
}

func contents(_ path: String) -> String { String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self) }
