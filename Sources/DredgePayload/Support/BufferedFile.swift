import CDredgeSystem
import Foundation

/// A write-only file with a 1 MiB buffer for small pieces (pieces of 64 KiB or more go straight
/// to the kernel), positioned writes for patching headers, and fsync on close.
///
/// Write-behind: every ``writeBehindBytes`` flushed, the kernel is asked to start writing them
/// back (`sync_file_range`, as RocksDB's `bytes_per_sync` and PostgreSQL's `*_flush_after` do),
/// so the disk works while the file is still being written and the fsync in ``close()`` waits
/// only for the tail. Without it, the fsync of an 80 MB upload's zip took 46 ms after the last
/// chunk, all of it on the upload's critical path.
package final class BufferedFile {
    /// How much is flushed between two writeback requests.
    package static let writeBehindBytes: UInt64 = 4 << 20

    private var fd: Int32
    private var buffer: [UInt8] = []
    package private(set) var offset: UInt64 = 0
    /// Bytes handed to the kernel so far, and where the next writeback request starts.
    private var flushed: UInt64 = 0
    private var writebackFrom: UInt64 = 0
    private var writeBehind = true
    private let path: String

    package init(creating path: String) throws {
        self.path = path
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw DurableFile.failure("cannot create \(path)") }
        buffer.reserveCapacity(1 << 20)
    }

    deinit { if fd >= 0 { _ = closeDescriptor(fd) } }

    package func write(_ bytes: some ContiguousBytes) throws {
        try bytes.withUnsafeBytes { try write($0) }
    }

    package func write(_ bytes: UnsafeRawBufferPointer) throws {
        // A large piece (a chunk of a zip, a piece an inflater produced) goes to the kernel as
        // it is, after what is buffered: copying it into the buffer first was one more pass
        // over every byte on the thread that unpacks an upload.
        if bytes.count >= Self.directBytes {
            try flush()
            try DurableFile.writeAll(fd, bytes, what: "writing \(path)")
            handedOver(bytes.count)
            offset += UInt64(bytes.count)
            return
        }
        buffer.append(contentsOf: bytes)
        offset += UInt64(bytes.count)
        if buffer.count >= 1 << 20 { try flush() }
    }

    /// Pieces at least this large skip the buffer.
    static let directBytes = 64 << 10

    package func flush() throws {
        guard !buffer.isEmpty else { return }
        try buffer.withUnsafeBytes { try DurableFile.writeAll(fd, $0, what: "writing \(path)") }
        let count = buffer.count
        buffer.removeAll(keepingCapacity: true)
        handedOver(count)
    }

    /// `count` more bytes are with the kernel: every ``writeBehindBytes`` of them, it is asked
    /// to start writing them back.
    private func handedOver(_ count: Int) {
        flushed += UInt64(count)
        if writeBehind && flushed - writebackFrom >= Self.writeBehindBytes {
            // A hint only: when it fails (a file system without it), close()'s fsync still
            // writes everything, so the failure changes nothing but timing; it is not asked again.
            writeBehind = dredge_start_writeback(fd, Int64(writebackFrom), Int64(flushed - writebackFrom)) == 0
            writebackFrom = flushed
        }
    }

    /// Overwrites bytes already written at `position`.
    package func patch(_ bytes: [UInt8], at position: UInt64) throws {
        try flush()
        let n = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(position)) }
        guard n == bytes.count else { throw DurableFile.failure("patching \(path)") }
    }

    /// Closes the file without writing what is buffered or syncing it (it is about to be
    /// removed); nothing may be written after. Closing twice does nothing.
    package func abandon() {
        buffer.removeAll()
        guard fd >= 0 else { return }
        _ = closeDescriptor(fd)  // abandoned: nothing of it is kept
        fd = -1
    }

    /// Flushes, fsyncs and closes the file; nothing may be written after.
    package func close() throws {
        try flush()
        guard fsync(fd) == 0 else { throw DurableFile.failure("fsync \(path)") }
        let closed = closeDescriptor(fd)
        fd = -1
        guard closed == 0 else { throw DurableFile.failure("closing \(path)") }
    }
}

/// The C library's `close` (inside ``BufferedFile`` the name is its own method), on every
/// platform Foundation brings it to.
private func closeDescriptor(_ fd: Int32) -> Int32 { close(fd) }
