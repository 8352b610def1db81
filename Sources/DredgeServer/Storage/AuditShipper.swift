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
        func pass() async throws {
            if let file { try await shipToFile(file) }
            if let syslog {
                let from: Int64
                if let sent { from = sent } else { from = try await latestID() }
                sent = try await shipToSyslog(syslog, after: from)
            }
        }
        do {
            sent = try await latestID()
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

    /// Appends to `path` the entries after the last one it holds; how many.
    @discardableResult
    func shipToFile(_ path: String) async throws -> Int {
        let fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw DeploymentError("cannot open the audit file \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard flock(fd, LOCK_EX) == 0 else { throw DeploymentError("cannot lock the audit file \(path): \(String(cString: strerror(errno)))") }
        defer { flock(fd, LOCK_UN) }
        var last = try Self.lastID(fd, path: path)
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

    /// Sends the entries after `after` to the syslog socket at `path`; the last id sent.
    func shipToSyslog(_ path: String, after: Int64) async throws -> Int64 {
        var last = after
        while true {
            let entries = try await audit.chainEntries(after: last, limit: 1_000)
            guard !entries.isEmpty else { return last }
            for entry in entries {
                try Self.sendDatagram(Array("<\(Self.syslogPriority)>dredge-server: ".utf8) + Self.line(entry).dropLast(), to: path)
                last = entry.id
            }
        }
    }

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

    /// The id of the last whole line of the file `fd` (0 when it holds none). A last line cut
    /// short (no newline: a crash mid-append) is cut off first.
    static func lastID(_ fd: Int32, path: String) throws -> Int64 {
        let size = lseek(fd, 0, SEEK_END)
        guard size > 0 else { return 0 }
        var end = size
        var tail: [UInt8] = []
        // Read backwards in blocks until the last whole line is in hand.
        while true {
            let start = max(0, end - 65_536)
            var block = [UInt8](repeating: 0, count: Int(end - start))
            let count = block.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, start) }
            guard count == block.count else { throw DeploymentError("cannot read the audit file \(path): \(String(cString: strerror(errno)))") }
            tail = block + tail
            end = start
            let lines = tail.split(separator: 0x0A, omittingEmptySubsequences: false)
            // Whole lines: every piece but the last, which follows the final newline.
            let whole = lines.dropLast()
            if let line = whole.last(where: { !$0.isEmpty }), start == 0 || whole.count >= 2 {
                let partial = lines.last ?? []
                if !partial.isEmpty {
                    guard ftruncate(fd, size - off_t(partial.count)) == 0 else {
                        throw DeploymentError("cannot cut the partial last line of the audit file \(path): \(String(cString: strerror(errno)))")
                    }
                }
                guard let object = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any], let id = (object["id"] as? NSNumber)?.int64Value else {
                    throw DeploymentError("the audit file \(path) ends with a line that is not an entry: move it aside (the server starts a new copy)")
                }
                return id
            }
            if start == 0 {
                // No newline anywhere: one partial line, cut off.
                guard ftruncate(fd, 0) == 0 else { throw DeploymentError("cannot cut the partial line of the audit file \(path): \(String(cString: strerror(errno)))") }
                return 0
            }
            guard tail.count < 16 << 20 else { throw DeploymentError("the audit file \(path)'s last line is longer than 16 MiB: not an audit copy") }
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
        let sent = bytes.withUnsafeBytes { buffer in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, buffer.baseAddress, buffer.count, 0, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
        }
        guard sent == bytes.count else { throw DeploymentError("cannot send to the syslog socket \(path): \(String(cString: strerror(errno)))") }
    }
}
