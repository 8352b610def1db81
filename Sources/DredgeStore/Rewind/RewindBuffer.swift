import DredgeDomain
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// At file scope `open` and `close` are the system's (inside the type they are its own).
private func openFile(_ path: String, _ flags: Int32, _ mode: mode_t = 0) -> Int32 { open(path, flags, mode) }
private func closeFile(_ fd: Int32) { _ = close(fd) }

/// The rewind buffer (#54): the device's flight recorder. The last records an app logged below
/// the level it stores (debug, trace), kept in a fixed-size file beside the store and not in
/// it, so that when something goes wrong (a trigger's match, a crash, a feedback, an engineer's
/// pull with `--rewind`) the minutes *before* it can be frozen into the store, verbose.
///
/// The file is memory-mapped (`MAP_SHARED`): a record is in the kernel's page cache as soon as
/// the log call returns, so it survives the process being killed (SIGKILL, SIGSEGV, the OOM
/// killer), though not the machine losing power. Its space is written out when it is made, so a
/// full disk is found then (and the app logs on without one), never as a fault in a log call.
/// It is owner-only: 0600, in a directory the process's user owns with mode 0700 (made so, or
/// put so), so no one who could not read the store reads it; a ring another user owns is never
/// read.
///
/// Read from a file, nothing is trusted: `head`, `tail` and each length are checked before they
/// are used, a record whose checksum or form does not hold ends the reading, and a header that
/// does not hold empties the ring rather than trapping.
///
/// Layout (little-endian): a 64-byte header — magic `DREDGRWD`, version (u32), the data
/// region's size (u64 at 16), `head` and `tail` (u64 at 24 and 32: logical offsets, only ever
/// growing, of the oldest record and just past the newest), the writer's pid (u64 at 40) —
/// then the data region, a ring. A record is its payload's length (u32), the payload's FNV-1a
/// (u32), and the payload (``RewindRecord``), split across the ring's end where it falls.
/// A write moves `head` past the records it overwrites *before* writing, and `tail` past the
/// new record *after*: a process killed at any point leaves `head…tail` whole records.
public final class RewindBuffer: Sendable {
    public let path: String
    /// The data region's size, bytes.
    public let capacity: Int

    private struct Mapping: @unchecked Sendable {
        var base: UnsafeMutableRawPointer
        var length: Int
        var fd: Int32
        var closed = false
        /// Records the ring did not take (larger than a quarter of it).
        var tooLarge = 0
        /// Reused by every append (under the lock): a call allocates nothing once they are grown.
        var payload: [UInt8] = []
        var json = JSONWriter(reservingCapacity: 256)
    }
    private let mapping: Mutex<Mapping>
    /// Held by a freeze from its snapshot to its discard: two freezes never store the same records.
    let freezing = NSLock()

    static let magic: [UInt8] = Array("DREDGRWD".utf8)
    static let version: UInt32 = 1
    static let headerSize = 64
    /// The smallest and largest ring a configuration may ask for.
    public static let minimumCapacity = 64 * 1024
    public static let maximumCapacity = 64 * 1024 * 1024

    public struct Failure: Error, CustomStringConvertible {
        public enum Kind: Sendable {
            /// The file is not a ring (damaged, cut short, another format): nothing to read in it.
            case damaged
            /// Another user's file, or in another user's directory: left alone.
            case foreign
            /// It could not be read or made now (no memory, no descriptors, a full disk).
            case unavailable
        }
        public let kind: Kind
        public let description: String

        init(_ kind: Kind = .unavailable, description: String) {
            self.kind = kind
            self.description = description
        }
    }

    /// Checks (or makes) the directory rings go in: a directory this process's user owns, mode
    /// 0700 (put so when it was not).
    static func checkDirectory(_ directory: String) throws {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw Failure(description: "cannot make \(directory): \(error.localizedDescription)")
        }
        var info = stat()
        guard lstat(directory, &info) == 0 else { throw Failure(description: "cannot look at \(directory): \(String(cString: strerror(errno)))") }
        guard info.st_mode & S_IFMT == S_IFDIR else { throw Failure(.foreign, description: "\(directory) is not a directory") }
        guard info.st_uid == geteuid() else { throw Failure(.foreign, description: "\(directory) belongs to another user") }
        if info.st_mode & 0o077 != 0, chmod(directory, 0o700) != 0 {
            throw Failure(description: "cannot make \(directory) private (0700): \(String(cString: strerror(errno)))")
        }
    }

    /// Makes a new, empty ring at `path` (replacing a file there) of `capacity` bytes.
    public static func create(at path: String, capacity: Int) throws -> RewindBuffer {
        guard (minimumCapacity...maximumCapacity).contains(capacity) else {
            throw Failure(description: "a rewind buffer holds \(minimumCapacity) to \(maximumCapacity) bytes, not \(capacity)")
        }
        try checkDirectory((path as NSString).deletingLastPathComponent)
        let fd = openFile(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw Failure(description: "cannot make \(path): \(String(cString: strerror(errno)))") }
        let length = headerSize + capacity
        // Written out, not just sized: a sparse file's first write into a page the disk has no
        // room for would be a SIGBUS inside a log call.
        let zeros = [UInt8](repeating: 0, count: 1 << 20)
        var written = 0
        while written < length {
            let count = zeros.withUnsafeBytes { pwrite(fd, $0.baseAddress, min(zeros.count, length - written), off_t(written)) }
            guard count > 0 else {
                let problem = String(cString: strerror(errno))
                closeFile(fd)
                _ = unlink(path)
                throw Failure(description: "cannot write \(path)'s \(length) bytes: \(problem)")
            }
            written += count
        }
        let buffer = try RewindBuffer(path: path, fd: fd, length: length)
        buffer.mapping.withLock { m in
            m.base.copyMemory(from: magic, byteCount: magic.count)
            m.base.storeBytes(of: version.littleEndian, toByteOffset: 8, as: UInt32.self)
            m.base.storeBytes(of: UInt64(capacity).littleEndian, toByteOffset: 16, as: UInt64.self)
            m.base.storeBytes(of: UInt64(0), toByteOffset: 24, as: UInt64.self)
            m.base.storeBytes(of: UInt64(0), toByteOffset: 32, as: UInt64.self)
            m.base.storeBytes(of: UInt64(getpid()).littleEndian, toByteOffset: 40, as: UInt64.self)
        }
        return buffer
    }

    /// Opens a ring a process left (to read and freeze it); nil when there is no file.
    public static func open(at path: String) throws -> RewindBuffer? {
        let fd = openFile(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            let kind: Failure.Kind = errno == ELOOP || errno == EACCES || errno == EPERM ? .foreign : .unavailable
            throw Failure(kind, description: "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            closeFile(fd)
            throw Failure(description: "cannot read the size of \(path): \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & S_IFMT == S_IFREG, info.st_uid == geteuid() else {
            closeFile(fd)
            throw Failure(.foreign, description: "\(path) is not a file of this user's")
        }
        let length = Int(info.st_size)
        guard length >= headerSize + minimumCapacity, length <= headerSize + maximumCapacity else {
            closeFile(fd)
            throw Failure(.damaged, description: "\(path) is not a rewind buffer (\(length) bytes)")
        }
        let buffer = try RewindBuffer(path: path, fd: fd, length: length)
        let problem = buffer.mapping.withLock { m -> String? in
            guard Array(UnsafeRawBufferPointer(start: m.base, count: magic.count)) == magic else { return "it does not start as one" }
            let version = UInt32(littleEndian: m.base.loadUnaligned(fromByteOffset: 8, as: UInt32.self))
            guard version == Self.version else { return "version \(version), not \(Self.version)" }
            let capacity = UInt64(littleEndian: m.base.loadUnaligned(fromByteOffset: 16, as: UInt64.self))
            guard capacity == UInt64(length - headerSize) else { return "its size says \(capacity) bytes where the file holds \(length - headerSize)" }
            return nil
        }
        if let problem {
            try buffer.close()
            throw Failure(.damaged, description: "\(path) is not a rewind buffer: \(problem)")
        }
        return buffer
    }

    private init(path: String, fd: Int32, length: Int) throws {
        guard let base = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), base != MAP_FAILED else {
            let problem = String(cString: strerror(errno))
            closeFile(fd)
            throw Failure(description: "cannot map \(path): \(problem)")
        }
        self.path = path
        self.capacity = length - Self.headerSize
        mapping = Mutex(Mapping(base: base, length: length, fd: fd))
    }

    deinit {
        mapping.withLock { m in
            guard !m.closed else { return }
            munmap(m.base, m.length)
            closeFile(m.fd)
        }
    }

    /// Unmaps the file (what was written stays in it). Later appends are ignored.
    public func close() throws {
        mapping.withLock { m in
            guard !m.closed else { return }
            m.closed = true
            munmap(m.base, m.length)
            closeFile(m.fd)
        }
    }

    /// Adds one record, dropping the oldest ones it needs the room of. A record larger than a
    /// quarter of the ring is not kept (counted in ``tooLarge``). Never waits for the disk.
    @discardableResult
    public func append(_ record: RewindRecord) -> Bool {
        mapping.withLock { m in
            m.payload.removeAll(keepingCapacity: true)
            var encoder = RewindRecord.Encoder(bytes: m.payload)
            m.payload = []
            record.encode(into: &encoder)
            m.payload = encoder.bytes
            return Self.put(&m, capacity)
        }
    }

    /// Adds an entry as its record (its metadata encoded as the store encodes it), building
    /// the record's bytes in buffers kept for it: what a log call below its level does.
    @discardableResult
    public func append(_ entry: LogEntry) -> Bool {
        mapping.withLock { m in
            guard !m.closed else { return false }
            m.json.reset()
            // Unsorted: it is decoded and stored canonically when frozen.
            if entry.metadata.isEmpty { m.json.writeRaw("{}") } else { m.json.writeObjectUnordered(entry.metadata) }
            var encoder = RewindRecord.Encoder(bytes: m.payload)
            m.payload = []
            encoder.bytes.removeAll(keepingCapacity: true)
            encoder.integer(entry.timestamp.microseconds)
            encoder.integer(UInt8(entry.level.rawValue))
            encoder.text(entry.type.rawValue)
            encoder.text(entry.uid)
            encoder.text(entry.message)
            encoder.integer(UInt32(m.json.bytes.count))
            encoder.bytes.append(contentsOf: m.json.bytes)
            m.payload = encoder.bytes
            return Self.put(&m, capacity)
        }
    }

    /// Writes `m.payload` as the newest record.
    private static func put(_ m: inout Mapping, _ capacity: Int) -> Bool {
        do {
            guard !m.closed else { return false }
            let payload = m.payload
            let size = 8 + payload.count
            guard size <= capacity / 4 else {
                m.tooLarge += 1
                return false
            }
            let data = m.base + Self.headerSize
            var head = Self.load(m.base, 24), tail = Self.load(m.base, 32)
            // A header that does not hold (written over by something else) empties the ring.
            if head > tail || tail - head > UInt64(capacity) || tail > UInt64.max / 2 {
                (head, tail) = (0, 0)
                Self.store(m.base, 32, 0)
                Self.store(m.base, 24, 0)
            }
            // Room first: the oldest records go, and `head` says so before they are written over.
            if tail - head + UInt64(size) > UInt64(capacity) {
                while tail - head + UInt64(size) > UInt64(capacity) {
                    let length = UInt64(Self.read32(data, capacity, at: head))
                    // A length that does not hold: everything before the new record goes.
                    guard length <= UInt64(capacity / 4), tail - head >= 8 + length else {
                        head = tail
                        break
                    }
                    head += 8 + length
                }
                Self.store(m.base, 24, head)
            }
            let header = UInt64(UInt32(payload.count)) | UInt64(Self.fnv1a(payload)) << 32
            withUnsafeBytes(of: header.littleEndian) { Self.write($0, into: data, capacity, at: tail) }
            payload.withUnsafeBytes { Self.write($0, into: data, capacity, at: tail + 8) }
            // Then the record counts.
            tail += UInt64(size)
            Self.store(m.base, 32, tail)
            return true
        }
    }

    /// Records the ring did not take (larger than a quarter of it).
    public var tooLarge: Int { mapping.withLock { $0.tooLarge } }

    /// The records it holds, oldest first, and where the newest ends (for ``discard(through:)``).
    /// A record that does not read back (the file was damaged) ends the reading: what came
    /// before it is returned.
    public func snapshot() -> (records: [RewindRecord], end: UInt64) {
        var records: [RewindRecord] = []
        let end = forEachRecord { records.append($0) }
        return (records, end)
    }

    /// Calls `body` with each record it holds, oldest first, without gathering them (a ring of
    /// small records holds many); returns where the last one read ends. Appends wait meanwhile.
    @discardableResult
    public func forEachRecord(_ body: (RewindRecord) throws -> Void) rethrows -> UInt64 {
        try mapping.withLock { m in
            guard !m.closed else { return 0 }
            return try Self.scan(m.base, capacity, body)
        }
    }

    /// The records it holds, oldest first.
    public func records() -> [RewindRecord] { snapshot().records }

    /// Lets go of the records before `end` (a ``snapshot()``'s): what was frozen is not frozen
    /// again. Records added since stay.
    public func discard(through end: UInt64) {
        mapping.withLock { m in
            guard !m.closed else { return }
            let head = Self.load(m.base, 24), tail = Self.load(m.base, 32)
            if end > head && end <= tail { Self.store(m.base, 24, end) }
        }
    }

    /// Reads `head…tail`, checking every value before using it (no arithmetic on what the file
    /// says can overflow: `at` never passes `tail`, a length is at most a quarter of the ring).
    private static func scan(_ base: UnsafeMutableRawPointer, _ capacity: Int, _ body: (RewindRecord) throws -> Void) rethrows -> UInt64 {
        let data = base + headerSize
        let head = load(base, 24), tail = load(base, 32)
        guard head <= tail, tail - head <= UInt64(capacity) else { return head }
        var at = head
        while tail - at >= 8 {
            let length = UInt64(read32(data, capacity, at: at))
            let sum = read32(data, capacity, at: at + 4)
            guard length <= UInt64(capacity / 4), tail - at - 8 >= length else { break }
            let payload = read(data, capacity, at: at + 8, count: Int(length))
            guard fnv1a(payload) == sum, let record = RewindRecord(decoding: payload) else { break }
            try body(record)
            at += 8 + length
        }
        return at
    }

    // MARK: The ring's bytes

    private static func load(_ base: UnsafeMutableRawPointer, _ offset: Int) -> UInt64 {
        UInt64(littleEndian: base.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
    }

    private static func store(_ base: UnsafeMutableRawPointer, _ offset: Int, _ value: UInt64) {
        base.storeBytes(of: value.littleEndian, toByteOffset: offset, as: UInt64.self)
    }

    private static func write(_ source: UnsafeRawBufferPointer, into data: UnsafeMutableRawPointer, _ capacity: Int, at logical: UInt64) {
        guard let base = source.baseAddress, source.count > 0 else { return }
        let start = Int(logical % UInt64(capacity))
        let first = min(source.count, capacity - start)
        (data + start).copyMemory(from: base, byteCount: first)
        if first < source.count { data.copyMemory(from: base + first, byteCount: source.count - first) }
    }

    private static func read(_ data: UnsafeMutableRawPointer, _ capacity: Int, at logical: UInt64, count: Int) -> [UInt8] {
        let start = Int(logical % UInt64(capacity))
        let first = min(count, capacity - start)
        var bytes = [UInt8](repeating: 0, count: count)
        bytes.withUnsafeMutableBytes { target in
            guard let base = target.baseAddress else { return }
            base.copyMemory(from: data + start, byteCount: first)
            if first < count { (base + first).copyMemory(from: data, byteCount: count - first) }
        }
        return bytes
    }

    private static func read32(_ data: UnsafeMutableRawPointer, _ capacity: Int, at logical: UInt64) -> UInt32 {
        var value: UInt32 = 0
        for i in 0..<4 { value |= UInt32(data.load(fromByteOffset: Int((logical + UInt64(i)) % UInt64(capacity)), as: UInt8.self)) << (8 * i) }
        return value
    }

    static func fnv1a(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBufferPointer { buffer in
            var hash: UInt32 = 0x811C_9DC5
            for byte in buffer {
                hash ^= UInt32(byte)
                hash = hash &* 0x0100_0193
            }
            return hash
        }
    }
}
