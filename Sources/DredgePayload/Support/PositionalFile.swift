import CDredgeSystem
import Foundation

/// A write-only file that several threads write at once, each at its own offset (the zip of an
/// upload being received: each chunk's writer puts the chunk's plaintext where it belongs), and
/// that is fsynced when closed.
///
/// `pwrite(2)` needs no lock between writers; the lock here only keeps ``close()`` and
/// ``abandon()`` from releasing the descriptor while a write is in progress, so a write that
/// comes too late fails instead of landing in whatever file the number was given to next.
package final class PositionalFile: @unchecked Sendable {  // `fd` and `writers` under `condition`
    package let path: String
    private let condition = NSCondition()
    private var fd: Int32
    private var writers = 0

    /// Creates (or empties) the file at `path`.
    package init(creating path: String) throws {
        self.path = path
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw DurableFile.failure("cannot create \(path)") }
    }

    deinit { if fd >= 0 { Glibc.close(fd) } }

    /// Writes `bytes` at `offset`, at most ``DurableFile/maxWriteBytes`` per call, and asks the
    /// kernel to start writing them back (a hint, as ``BufferedFile``'s write-behind), so the
    /// fsync in ``close()`` waits only for the last ones. Safe from any thread. A full disk is
    /// ``ExportError/Code/diskFull``; a write after ``close()`` or ``abandon()`` is `.io`.
    package func write(_ bytes: some ContiguousBytes, at offset: UInt64) throws {
        let fd: Int32 = condition.withLock {
            guard self.fd >= 0 else { return -1 }
            writers += 1
            return self.fd
        }
        guard fd >= 0 else { throw ExportError(.io, "writing \(path): the file is closed") }
        defer {
            condition.withLock {
                writers -= 1
                if writers == 0 { condition.broadcast() }
            }
        }
        try bytes.withUnsafeBytes { buffer in
            guard let base = buffer.baseAddress else { return }
            var done = 0
            while done < buffer.count {
                let n = pwrite(fd, base + done, min(buffer.count - done, DurableFile.maxWriteBytes), off_t(offset) + off_t(done))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { throw DurableFile.failure("writing \(path)") }
                done += n
            }
            // A hint only: when it fails, the fsync in close() still writes everything.
            _ = dredge_start_writeback(fd, Int64(offset), Int64(buffer.count))
        }
    }

    /// Waits for the writes in progress, then fsyncs and closes the file; nothing may be written after.
    package func close() throws {
        guard let fd = release() else { throw ExportError(.io, "closing \(path): closed already") }
        guard fsync(fd) == 0 else {
            let error = DurableFile.failure("fsync \(path)")
            Glibc.close(fd)
            throw error
        }
        guard Glibc.close(fd) == 0 else { throw DurableFile.failure("closing \(path)") }
    }

    /// Waits for the writes in progress and closes the file without syncing it (it is about to
    /// be removed). Closing twice does nothing.
    package func abandon() {
        if let fd = release() { Glibc.close(fd) }
    }

    /// Takes the descriptor away from later writes once the writes in progress are done; nil
    /// if it was taken already.
    private func release() -> Int32? {
        condition.lock()
        defer { condition.unlock() }
        while writers > 0 { condition.wait() }
        guard fd >= 0 else { return nil }
        defer { fd = -1 }
        return fd
    }
}
