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
            let at = try #require((object["at"] as? NSNumber)?.doubleValue)
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
        // Two nodes sharing the file take turns: the second finds nothing new.
        #expect(try await shipper(audit).shipToFile(path) == 1)
        #expect(try await shipper(audit).shipToFile(path) == 0)
        let (ids, verdict) = try copy(path)
        #expect(ids == [1, 2, 3, 4])
        #expect(verdict.intact && verdict.entries == 4, "the copy alone recomputes the chain: \(verdict)")
        #expect(verdict == (try await audit.verifyChain()))

        // A crash mid-append left half a line: it is cut off, and what follows it is whole.
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(#"{"id":5,"at":18"#.utf8))
        try handle.close()
        try await audit.record(actor: "bob", action: "token.revoke", detail: "x", at: Date())
        #expect(try await shipper(audit).shipToFile(path) == 1)
        #expect(try copy(path).ids == [1, 2, 3, 4, 5])
    }

    @Test func aFileThatIsNotACopyIsRefusedAndLeftAsItIs() async throws {
        let audit = try log()
        try await audit.record(actor: "alice", action: "search", detail: "q", at: Date())
        let path = dir.file("other.log")
        try Data("some other log line\n".utf8).write(to: URL(fileURLWithPath: path))
        let error = try await #require(throws: DeploymentError.self) { try await shipper(audit).shipToFile(path) }
        #expect(error.description.contains("not an entry"), "\(error)")
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "some other log line\n")
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

        #expect(try await shipper(audit).shipToSyslog(path, after: 1) == 3, "only what follows the cursor")
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
        let missing = try await #require(throws: DeploymentError.self) { try await shipper(audit).shipToSyslog(dir.file("none.sock"), after: 0) }
        #expect(missing.description.contains("cannot send to the syslog socket"))
    }
}
