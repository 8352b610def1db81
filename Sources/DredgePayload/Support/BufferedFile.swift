import CDredgeSystem
import Foundation

/// A write-only file with a 1 MiB buffer, positioned writes for patching headers, and fsync on
/// close.
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

    deinit { if fd >= 0 { Glibc.close(fd) } }

    package func write(_ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try write($0) }
    }

    package func write(_ bytes: UnsafeRawBufferPointer) throws {
        buffer.append(contentsOf: bytes)
        offset += UInt64(bytes.count)
        if buffer.count >= 1 << 20 { try flush() }
    }

    package func flush() throws {
        var done = 0
        while done < buffer.count {
            let n = buffer[done...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { throw DurableFile.failure("writing \(path)") }
            done += n
        }
        flushed += UInt64(buffer.count)
        buffer.removeAll(keepingCapacity: true)
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

    /// Flushes, fsyncs and closes the file; nothing may be written after.
    package func close() throws {
        try flush()
        guard fsync(fd) == 0 else { throw DurableFile.failure("fsync \(path)") }
        let closed = Glibc.close(fd)
        fd = -1
        guard closed == 0 else { throw DurableFile.failure("closing \(path)") }
    }
}
