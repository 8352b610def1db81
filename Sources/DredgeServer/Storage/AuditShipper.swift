import DredgeAdminAPI
import DredgeEnvelope
import DredgePayload
import Foundation
import Logging
import ServiceLifecycle

/// Where audit entries are copied outside the database (`server.json`'s `audit`): the copy that
/// shows entries cut from the end of the chain, and survives the database.
public struct AuditShippingSettings: Codable, Sendable, Equatable {
    /// A file each entry is appended to as one JSON line; a relative path is inside the data
    /// directory.
    public var file: String?
    /// A local syslog socket (a Unix datagram socket, `/dev/log`) each entry is also sent to.
    public var syslog: String?

    public init(file: String? = nil, syslog: String? = nil) {
        (self.file, self.syslog) = (file, syslog)
    }
}

/// Copies the audit log's entries, once committed, out of the database (#55): each as one JSON
/// line (``line(_:)``: the entry with its hash, and the time as the stored number, so anyone
/// can recompute the chain from the copy alone) to a file and to the local syslog.
///
/// It tails the log (every `every`, and once more as the server stops) rather than hooking
/// the writers, so every entry is copied whoever wrote it: this node, another node of a
/// cluster, or a `dredge-server` command.
///
/// - The file is its own cursor: under an exclusive `flock`, the shipper reads the last id the
///   file holds and appends what follows. So a restart copies what was written while the
///   server was down, the nodes of a cluster sharing one file take turns without copying an
///   entry twice, and a line cut short by a crash is cut off before the next append. A new
///   file gets the whole log.
/// - Syslog gets the entries written after the server started (severity notice, facility
///   authpriv): each node sends them to its own host's syslog.
public final class AuditShipper: Service, Sendable {
    let audit: any AuditLog
    let file: String?
    let syslog: String?
    let every: Duration
    let logger: Logger

    public init(audit: any AuditLog, settings: AuditShippingSettings, dataDirectory: String, every: Duration = .seconds(2), logger: Logger) {
        self.audit = audit
        self.file = settings.file.map { $0.hasPrefix("/") ? $0 : dataDirectory + "/" + $0 }
        self.syslog = settings.syslog
        self.every = every
        self.logger = logger
    }

    public func run() async throws {
        var sent: Int64?
        // The file and syslog apart: one failing does not hold the other back.
        func pass() async throws {
            var problems: [String] = []
            if let file {
                do { try await shipToFile(file) } catch { problems.append("\(error)") }
            }
            if let syslog {
                do {
                    var cursor: Int64
                    if let sent { cursor = sent } else { cursor = try await latestID() }
                    defer { sent = cursor }
                    try await shipToSyslog(syslog, cursor: &cursor)
                } catch {
                    problems.append("\(error)")
                }
            }
            if !problems.isEmpty { throw DeploymentError(problems.joined(separator: "; ")) }
        }
        do {
            if syslog != nil { sent = try await latestID() }
            try await pass()
        } catch {
            logger.warning("audit shipping failed; trying again", metadata: ["error": "\(error)"])
        }
        await Periodic.run(every: every, reportEvery: .seconds(300), pass) { error in
            self.logger.warning("audit shipping failed; trying again", metadata: ["error": "\(error)"])
        }
        // What was written since the last turn, before the server goes.
        do {
            try await pass()
        } catch {
            logger.warning("audit shipping failed as the server stopped: the file gets the rest at the next start", metadata: ["error": "\(error)"])
        }
    }

    private func latestID() async throws -> Int64 {
        try await audit.audit(AuditQuery(limit: 1)).first?.id ?? 0
    }

    /// Appends to `path` the entries after the last one it holds; how many. The file's last
    /// entry must be this log's (same id, same hash): a file from before a restore, or
    /// another deployment's, is refused (left as it is) rather than continued from the wrong place.
    @discardableResult
    func shipToFile(_ path: String) async throws -> Int {
        let fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw DeploymentError("cannot open the audit file \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        // Another node's turn is short: wait for it without holding a thread.
        var waited = 0
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR, waited < 200 else {
                throw DeploymentError("cannot lock the audit file \(path): \(errno == EWOULDBLOCK ? "another process holds it" : String(cString: strerror(errno)))")
            }
            waited += 1
            try await Task.sleep(for: .milliseconds(50))
        }
        defer { flock(fd, LOCK_UN) }
        var last: Int64 = 0
        if let held = try Self.lastEntry(fd, path: path) {
            let stored = try await audit.chainEntries(after: held.id - 1, limit: 1).first
            guard let stored, stored.id == held.id, stored.hash.map(Hex.encode) == held.hash else {
                throw DeploymentError(
                    "the audit file \(path) ends with entry \(held.id), which is not this audit log's (a file from before a restore, or another deployment's): move it aside, and the server copies the whole log into a new one")
            }
            last = held.id
        }
        var written = 0
        while true {
            let entries = try await audit.chainEntries(after: last, limit: 1_000)
            guard let newest = entries.last else { break }
            var bytes: [UInt8] = []
            for entry in entries { bytes += try Self.line(entry) }
            try bytes.withUnsafeBytes { try DurableFile.writeAll(fd, $0, what: "the audit file \(path)") }
            guard fsync(fd) == 0 else { throw DeploymentError("cannot sync the audit file \(path): \(String(cString: strerror(errno)))") }
            (last, written) = (newest.id, written + entries.count)
        }
        return written
    }

    /// Sends the entries after `cursor` to the syslog socket at `path`, moving `cursor` past
    /// each one sent. An entry too long for a datagram goes with its detail left out (the
    /// file and the database hold it). A syslog that does not take datagrams now (its queue
    /// full) is an error: the rest go at the next turn.
    func shipToSyslog(_ path: String, cursor: inout Int64) async throws {
        let prefix = Array("<\(Self.syslogPriority)>dredge-server: ".utf8)
        while true {
            let entries = try await audit.chainEntries(after: cursor, limit: 1_000)
            guard !entries.isEmpty else { return }
            for entry in entries {
                do {
                    try Self.sendDatagram(prefix + Self.line(entry).dropLast(), to: path)
                } catch let error as DatagramTooLong {
                    var short = entry
                    short.detail = "(\(entry.detail.utf8.count) bytes: too long for syslog; in audit.file and the database)"
                    do {
                        try Self.sendDatagram(prefix + Self.line(short).dropLast(), to: path)
                    } catch is DatagramTooLong {
                        throw DeploymentError("entry \(entry.id) is too long for the syslog socket \(path) even without its detail (\(error.bytes) bytes)")
                    }
                }
                cursor = entry.id
            }
        }
    }

    struct DatagramTooLong: Error { var bytes: Int }

    /// authpriv (10) × 8 + notice (5).
    static let syslogPriority = 85

    /// One entry as the copy holds it: a JSON object on one line, newline-terminated.
    static func line(_ entry: AuditChain.Stored) throws -> [UInt8] {
        func json(_ text: String) throws -> String {
            String(decoding: try JSONSerialization.data(withJSONObject: text, options: [.fragmentsAllowed, .withoutEscapingSlashes]), as: UTF8.self)
        }
        // The time as Swift writes a double (the shortest text that reads back as the same
        // bits): the hash covers those bits. Keys in order: the same entry is the same line.
        let time = Date.ISO8601FormatStyle(includingFractionalSeconds: true).format(Date(timeIntervalSince1970: entry.at))
        let fields = [
            "\"action\":\(try json(entry.action))", "\"actor\":\(try json(entry.actor))", "\"at\":\(entry.at.isFinite ? entry.at.description : "null")",
            "\"detail\":\(try json(entry.detail))", "\"hash\":\(entry.hash.map { "\"\(Hex.encode($0))\"" } ?? "null")", "\"id\":\(entry.id)", "\"time\":\"\(time)\"",
        ]
        return Array(("{" + fields.joined(separator: ",") + "}\n").utf8)
    }

    /// How every line of the copy begins (``line(_:)``: keys in order).
    static let linePrefix = Array(#"{"action":"#.utf8)

    /// The id and hash of the copy's last whole line (nil for an empty file). A last line cut
    /// short (no newline: a crash mid-append) is cut off, but only once the file reads as a
    /// copy: its last whole line an entry, the cut part the start of one. Anything else is
    /// refused and nothing is written.
    static func lastEntry(_ fd: Int32, path: String) throws -> (id: Int64, hash: String?)? {
        let size = lseek(fd, 0, SEEK_END)
        guard size > 0 else { return nil }
        func notACopy() -> DeploymentError {
            DeploymentError("the audit file \(path) is not a copy of the audit log (its last line is not an entry): give audit.file a file of its own")
        }
        var start = size
        var tail: [UInt8] = []
        // Read backwards in blocks until the last whole line is in hand.
        while true {
            let from = max(0, start - 65_536)
            var block = [UInt8](repeating: 0, count: Int(start - from))
            let count = block.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, from) }
            guard count == block.count else { throw DeploymentError("cannot read the audit file \(path): \(String(cString: strerror(errno)))") }
            tail = block + tail
            start = from
            guard let lastNewline = tail.lastIndex(of: 0x0A) else {
                if start > 0 {
                    guard tail.count < 16 << 20 else { throw notACopy() }
                    continue
                }
                // No newline at all: a first line cut short, or not a copy.
                guard tail.starts(with: linePrefix) else { throw notACopy() }
                guard ftruncate(fd, 0) == 0 else { throw DeploymentError("cannot cut the partial line of the audit file \(path): \(String(cString: strerror(errno)))") }
                return nil
            }
            let body = tail[..<lastNewline]
            let lineStart = body.lastIndex(of: 0x0A).map { $0 + 1 } ?? body.startIndex
            // The whole line may begin before this block: read on.
            if lineStart == body.startIndex, start > 0 {
                guard tail.count < 16 << 20 else { throw notACopy() }
                continue
            }
            let line = Data(body[lineStart...])
            guard line.starts(with: linePrefix), let object = try? JSONSerialization.jsonObject(with: line) as? [String: Any],
                let id = (object["id"] as? NSNumber)?.int64Value
            else { throw notACopy() }
            let partial = tail[(lastNewline + 1)...]
            if !partial.isEmpty {
                guard partial.starts(with: linePrefix.prefix(partial.count)) || partial.starts(with: linePrefix) else { throw notACopy() }
                guard ftruncate(fd, size - off_t(partial.count)) == 0 else {
                    throw DeploymentError("cannot cut the partial last line of the audit file \(path): \(String(cString: strerror(errno)))")
                }
            }
            return (id, object["hash"] as? String)
        }
    }

    static func sendDatagram(_ bytes: [UInt8], to path: String) throws {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { throw DeploymentError("cannot make a socket for syslog: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let name = Array(path.utf8)
        guard name.count < MemoryLayout.size(ofValue: address.sun_path) else { throw DeploymentError("the syslog socket path \(path) is too long") }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: name)
        }
        // Never waits: a syslog daemon that stalls must not hold a thread (or the server's stop).
        let sent = bytes.withUnsafeBytes { buffer in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT), $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
        }
        if sent < 0, errno == EMSGSIZE { throw DatagramTooLong(bytes: bytes.count) }
        guard sent == bytes.count else { throw DeploymentError("cannot send to the syslog socket \(path): \(String(cString: strerror(errno)))") }
    }
}
