import DredgeAdminAPI
@testable import DredgeServer
import DredgeEnvelope
import DredgeTestSupport
import Foundation
import Logging
import Testing

/// The audit log's copy outside the database (#55): a file of JSON lines that is its own
/// cursor (no entry twice, whoever appends, and a line cut short is cut off), from which the
/// chain verifies alone; and datagrams to a syslog socket.
@Suite struct AuditShipperTests {
    let dir = TempDir()

    func log() throws -> SQLitePullQueue { SQLitePullQueue(try ServerDatabase(directory: dir.path)) }

    func shipper(_ audit: any AuditLog, file: String? = nil, syslog: String? = nil) -> AuditShipper {
        AuditShipper(audit: audit, settings: AuditShippingSettings(file: file, syslog: syslog), dataDirectory: dir.path, logger: Logger(label: "test"))
    }

    /// The file's lines, read as entries, and whether they verify as a chain on their own.
    func copy(_ path: String) throws -> (ids: [Int64], verdict: AuditVerification) {
        let lines = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        var verifier = AuditChain.Verifier()
        var ids: [Int64] = []
        for line in lines {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            let id = try #require((object["id"] as? NSNumber)?.int64Value)
            let hex = try #require(object["hash"] as? String)
            let hash = try #require(Hex.decode(hex))
            // The time as written (Foundation's JSON reader may round a long mantissa; Swift's
            // Double(String), like Python's float, reads the shortest form back exactly).
            let at = try #require(line.firstMatch(of: /"at":([-0-9.e+]+)/).flatMap { Double(String($0.1)) })
            let (actor, action, detail) = (object["actor"] as? String, object["action"] as? String, object["detail"] as? String)
            ids.append(id)
            verifier.feed([AuditChain.Stored(id: id, at: at, actor: try #require(actor), action: try #require(action), detail: try #require(detail), hash: hash)])
        }
        return (ids, verifier.verdict)
    }

    @Test func theFileCopiesEachEntryOnceAndVerifiesAlone() async throws {
        let audit = try log()
        for n in 1...3 { try await audit.record(actor: "alice", action: "search", detail: "q=\(n) \"quoted\"/", at: Date(timeIntervalSince1970: 1_800_000_000.1 * Double(n))) }
        let path = dir.file("audit.jsonl")
        #expect(try await shipper(audit, file: "audit.jsonl").shipToFile(path) == 3, "a relative path is in the data directory")
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o600)
        try await audit.record(actor: "bob", action: "token.create", detail: "x", at: Date())
        // Two nodes sharing the file: each finds what the other copied, and copies only the rest.
        async let first = shipper(audit).shipToFile(path)
        async let second = shipper(audit).shipToFile(path)
        #expect(try await first + second == 1)
        #expect(try await shipper(audit).shipToFile(path) == 0)
        let (ids, verdict) = try copy(path)
        #expect(ids == [1, 2, 3, 4])
        #expect(verdict.intact && verdict.entries == 4, "the copy alone recomputes the chain: \(verdict)")
        #expect(verdict == (try await audit.verifyChain()))

        // A crash mid-append left half a line: it is cut off, and what follows it is whole.
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(#"{"action":"token.rev"#.utf8))
        try handle.close()
        try await audit.record(actor: "bob", action: "token.revoke", detail: "x", at: Date())
        #expect(try await shipper(audit).shipToFile(path) == 1)
        #expect(try copy(path).ids == [1, 2, 3, 4, 5])
    }

    /// A file that is not this log's copy is refused and left byte for byte: another log,
    /// one without a final newline (server.json, a key), a copy of another history (a file
    /// from before a restore, another deployment's).
    @Test func aFileThatIsNotThisLogsCopyIsRefusedAndLeftAsItIs() async throws {
        let audit = try log()
        try await audit.record(actor: "alice", action: "search", detail: "q", at: Date())
        for (name, text) in [("other.log", "some other log line\n"), ("server.json", "{\n  \"agentPort\": 7443\n}"), ("key", "-----BEGIN KEY-----")] {
            let path = dir.file(name)
            try Data(text.utf8).write(to: URL(fileURLWithPath: path))
            let error = try await #require(throws: DeploymentError.self) { try await shipper(audit).shipToFile(path) }
            #expect(error.description.contains("not a copy of the audit log"), "\(error)")
            #expect(try String(contentsOfFile: path, encoding: .utf8) == text, "\(name) untouched")
        }
        // Another history: the same shape, but its last entry is not this log's.
        let elsewhere = TempDir()
        let other = SQLitePullQueue(try ServerDatabase(directory: elsewhere.path))
        try await other.record(actor: "mallory", action: "search", detail: "q", at: Date())
        let path = dir.file("foreign.jsonl")
        #expect(try await shipper(other).shipToFile(path) == 1)
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        let foreign = try await #require(throws: DeploymentError.self) { try await shipper(audit).shipToFile(path) }
        #expect(foreign.description.contains("not this audit log's"), "\(foreign)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
    }

    /// Lines longer than the block the file is read back by (64 KiB) are found whole.
    @Test func longEntriesAreReadBackWhole() async throws {
        let audit = try log()
        let long = String(repeating: "x", count: 150_000)
        try await audit.record(actor: "alice", action: "search", detail: long, at: Date())
        try await audit.record(actor: "alice", action: "search", detail: long + "y", at: Date())
        let path = dir.file("audit.jsonl")
        #expect(try await shipper(audit).shipToFile(path) == 2)
        try await audit.record(actor: "alice", action: "search", detail: "short", at: Date())
        #expect(try await shipper(audit).shipToFile(path) == 1)
        let (ids, verdict) = try copy(path)
        #expect(try await audit.verifyChain().intact)
        #expect(ids == [1, 2, 3] && verdict.intact, "\(verdict)")
    }

    @Test func syslogGetsOneDatagramPerEntry() async throws {
        let audit = try log()
        for n in 1...3 { try await audit.record(actor: "alice", action: "search", detail: "q=\(n)", at: Date()) }
        let path = dir.file("log.sock")
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        try #require(fd >= 0)
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        try #require(bound == 0)

        var cursor: Int64 = 1
        try await shipper(audit).shipToSyslog(path, cursor: &cursor)
        #expect(cursor == 3, "only what follows the cursor")
        var received: [String] = []
        for _ in 0..<2 {
            var buffer = [UInt8](repeating: 0, count: 65_536)
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            try #require(n > 0)
            received.append(String(decoding: buffer[0..<n], as: UTF8.self))
        }
        #expect(received.allSatisfy { $0.hasPrefix("<85>dredge-server: {") && $0.hasSuffix("}") }, "\(received)")
        #expect(received[0].contains(#""detail":"q=2""#) && received[1].contains(#""id":3"#), "\(received)")
        // No socket there: a clear error (the shipper retries at its next turn).
        var from: Int64 = 0
        let missing = try await #require(throws: DeploymentError.self) { try await shipper(audit).shipToSyslog(dir.file("none.sock"), cursor: &from) }
        #expect(from == 0, "nothing sent, nothing passed")
        #expect(missing.description.contains("cannot send to the syslog socket"))
    }
}
