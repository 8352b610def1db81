import Foundation

/// A write-only file with a 1 MiB buffer, positioned writes for patching headers, and fsync on
/// close.
package final class BufferedFile {
    private var fd: Int32
    private var buffer: [UInt8] = []
    package private(set) var offset: UInt64 = 0
    private let path: String

    package init(creating path: String) throws {
        self.path = path
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw ExportError(.io, "cannot create \(path): \(String(cString: strerror(errno)))") }
        buffer.reserveCapacity(1 << 20)
    }

    deinit { if fd >= 0 { Glibc.close(fd) } }

    package func write(_ bytes: [UInt8]) throws {
        buffer.append(contentsOf: bytes)
        offset += UInt64(bytes.count)
        if buffer.count >= 1 << 20 { try flush() }
    }

    package func flush() throws {
        var done = 0
        while done < buffer.count {
            let n = buffer[done...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { throw ExportError(errno == ENOSPC ? .diskFull : .io, "writing \(path): \(String(cString: strerror(errno)))") }
            done += n
        }
        buffer.removeAll(keepingCapacity: true)
    }

    /// Overwrites bytes already written at `position`.
    package func patch(_ bytes: [UInt8], at position: UInt64) throws {
        try flush()
        let n = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(position)) }
        guard n == bytes.count else { throw ExportError(.io, "patching \(path): \(String(cString: strerror(errno)))") }
    }

    /// Flushes, fsyncs and closes the file; nothing may be written after.
    package func close() throws {
        try flush()
        guard fsync(fd) == 0 else { throw ExportError(.io, "fsync \(path): \(String(cString: strerror(errno)))") }
        Glibc.close(fd)
        fd = -1
    }
}
