import DredgePayload
import DredgeDomain
import Foundation

/// What the server keeps of one device's part of a live tail (#53), in `tails/<tail>/<agent>/`
/// (``DataDirectory/tailFiles(_:agent:)``): `records.jsonl`, the records of the batches held,
/// one JSON object a line in the order the device's store took them (Protocol § 13's lines), and
/// `contexts.jsonl`, each context the records name once, as a one-member object `{"N":{…}}`.
///
/// The registry says how many bytes of `records.jsonl` are held (``TailHold/bytes``): a batch is
/// written after exactly those, so bytes of a batch written but never recorded as held (the
/// server stopped in between) are written over, and no record is kept twice. Blocking: run on a
/// ``ServerWork`` pool.
enum TailFiles {
    static let records = "records.jsonl"
    static let contexts = "contexts.jsonl"

    /// What the contexts file holds: the numbers of its whole lines, and their length (a
    /// line cut short by a crash is written over).
    struct KnownContexts {
        var numbers: Set<Int64>
        var length: Int64
    }

    /// Writes `batch`'s records after the first `held` bytes of the records file, and its
    /// contexts the file lacks, durably (each file fsynced, the directory when made); returns
    /// the records file's new length. `known` caches what the contexts file holds (nil: read it);
    /// it is nil again after a failure.
    static func append(_ batch: TailBatchReader.Batch, after held: Int64, known: inout KnownContexts?, in directory: String) throws -> Int64 {
        let cached = known
        known = nil
        if !FileManager.default.fileExists(atPath: directory) {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            try DataDirectory.sync((directory as NSString).deletingLastPathComponent)
            try DataDirectory.sync(((directory as NSString).deletingLastPathComponent as NSString).deletingLastPathComponent)
        }
        var contexts = try cached ?? knownContexts(in: directory)
        var lines: [UInt8] = []
        for (number, context) in batch.contexts.sorted(by: { $0.key < $1.key }) where !contexts.numbers.contains(number) {
            lines += Array("{\"\(number)\":".utf8)
            lines += oneLine(context)
            lines += Array("}\n".utf8)
            contexts.numbers.insert(number)
        }
        // Contexts first: a record never names a context the files lack.
        if !lines.isEmpty { contexts.length = try write(lines, to: directory + "/" + Self.contexts, after: contexts.length) }
        var records: [UInt8] = []
        for record in batch.records {
            records += oneLine(record)
            records.append(0x0A)
        }
        let length = try write(records, to: directory + "/" + Self.records, after: held)
        known = contexts
        return length
    }

    /// A JSON value on one line: a raw line break in JSON is whitespace between tokens (inside a
    /// string it is escaped), so it becomes a space.
    static func oneLine(_ json: [UInt8]) -> [UInt8] {
        json.map { $0 == 0x0A || $0 == 0x0D ? 0x20 : $0 }
    }

    /// Appends `bytes` to `path` (after its first `held` bytes, cutting what follows them, when
    /// given), fsynced; the file's length after.
    private static func write(_ bytes: [UInt8], to path: String, after held: Int64?) throws -> Int64 {
        let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw DeploymentError("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var end = lseek(fd, 0, SEEK_END)
        guard end >= 0 else { throw DeploymentError("cannot read the length of \(path): \(String(cString: strerror(errno)))") }
        if let held {
            guard Int64(end) >= held else {
                throw DeploymentError("\(path) holds \(end) bytes where \(held) were recorded as held: records are missing from it")
            }
            if Int64(end) > held {
                guard ftruncate(fd, off_t(held)) == 0 else { throw DeploymentError("cannot cut \(path) back to \(held) bytes: \(String(cString: strerror(errno)))") }
                end = off_t(held)
            }
        }
        guard lseek(fd, end, SEEK_SET) == end else { throw DeploymentError("cannot seek in \(path): \(String(cString: strerror(errno)))") }
        try bytes.withUnsafeBytes { try DurableFile.writeAll(fd, $0, what: path) }
        guard fsync(fd) == 0 else { throw DeploymentError("cannot sync \(path): \(String(cString: strerror(errno)))") }
        return Int64(end) + Int64(bytes.count)
    }

    /// What `contexts.jsonl` holds (nothing when it does not exist): the lines `{"N":…}`
    /// that end with a line break.
    static func knownContexts(in directory: String) throws -> KnownContexts {
        let path = directory + "/" + contexts
        guard FileManager.default.fileExists(atPath: path) else { return KnownContexts(numbers: [], length: 0) }
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        var known = KnownContexts(numbers: [], length: 0)
        var start = data.startIndex
        while let end = data[start...].firstIndex(of: 0x0A) {
            let line = data[start..<end]
            let prefix = Array("{\"".utf8)
            if line.starts(with: prefix), let close = line.dropFirst(2).firstIndex(of: 0x22),
                let number = Int64(String(decoding: line[(line.startIndex + 2)..<close], as: UTF8.self))
            {
                known.numbers.insert(number)
            }
            start = end + 1
            known.length = Int64(start - data.startIndex)
        }
        return known
    }

    /// How many of a file's first bytes are whole lines (up to and with its last line break):
    /// what of `contexts.jsonl` may be served while the file is written to, since a line cut
    /// short is written over. Nil when there is no such file. Reads back from the end, 64 KiB
    /// at a time.
    static func wholeLinesLength(of path: String) throws -> Int64? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw DeploymentError("cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var block = [UInt8](repeating: 0, count: 64 * 1024)
        // A writer cuts a line left short back before it writes again: a file that shrinks while
        // it is read is read again, from its new end.
        attempts: for _ in 0..<3 {
            var info = stat()
            guard fstat(fd, &info) == 0 else { throw DeploymentError("cannot read the length of \(path): \(String(cString: strerror(errno)))") }
            var end = Int64(info.st_size)
            while end > 0 {
                let start = max(0, end - Int64(block.count))
                let wanted = Int(end - start)
                let read = block.withUnsafeMutableBytes { pread(fd, $0.baseAddress, wanted, off_t(start)) }
                guard read >= 0 else { throw DeploymentError("cannot read \(path): \(String(cString: strerror(errno)))") }
                guard read == wanted else { continue attempts }
                if let last = block[0..<wanted].lastIndex(of: 0x0A) { return start + Int64(last) + 1 }
                end = start
            }
            return 0
        }
        throw DeploymentError("cannot read \(path): it kept growing shorter as it was read")
    }

    /// The contexts by number, as the index takes them: the first whole line of each number. A
    /// line that does not read as a context is left out (its records are then named by the
    /// device alone).
    static func contexts(in directory: String) throws -> [String: LogContext] {
        let path = directory + "/" + Self.contexts
        guard FileManager.default.fileExists(atPath: path) else { return [:] }
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        var contexts: [String: LogContext] = [:]
        let decoder = JSONDecoder()
        var start = data.startIndex
        while let end = data[start...].firstIndex(of: 0x0A) {
            defer { start = end + 1 }
            let one: [String: LogContext]
            do {
                one = try decoder.decode([String: LogContext].self, from: data[start..<end])
            } catch {
                continue
            }
            for (number, context) in one where contexts[number] == nil { contexts[number] = context }
        }
        return contexts
    }
}
