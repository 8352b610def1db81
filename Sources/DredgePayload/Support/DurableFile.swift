import Foundation

/// Writes that survive a crash or a power cut at any moment: the bytes go to a temporary file
/// beside the target, which is fsynced, renamed over the target, and the directory fsynced, so
/// the target holds either the old content or the whole new one. The one helper the agent's
/// state files and the server's chunks, headers and token file all use.
public enum DurableFile {
    /// Replaces `path` with `bytes`, created with `mode`. A full disk is ``ExportError/Code/diskFull``,
    /// any other failure ``ExportError/Code/io``; the temporary file is removed either way.
    public static func write(_ bytes: some Collection<UInt8>, to path: String, mode: mode_t = 0o600) throws {
        let directory = (path as NSString).deletingLastPathComponent
        let temporary = path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw failure("cannot create \(temporary)") }
        do {
            // Where they are when they lie in one piece (an array, `Data`), else copied once.
            let wrote: Void? = try bytes.withContiguousStorageIfAvailable { try writeAll(fd, UnsafeRawBufferPointer($0), what: "writing \(path)") }
            if wrote == nil { try Array(bytes).withUnsafeBytes { try writeAll(fd, $0, what: "writing \(path)") } }
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        guard fsync(fd) == 0 else {
            let error = failure("fsync \(path)")
            close(fd)
            unlink(temporary)
            throw error
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let error = failure("rename \(path)")
            unlink(temporary)
            throw error
        }
        try syncDirectory(directory.isEmpty ? "." : directory)
    }

    /// The most one `write(2)` call is given. A kernel built without involuntary preemption in
    /// kernel code (`PREEMPT_NONE`, the default of many server kernels) lets a thread copying
    /// into the page cache keep its CPU until the call returns; with large folios one call of
    /// 1 MiB held a CPU for up to 11 ms, and the event loops that woke meanwhile waited
    /// (docs/benchmarks.md). Each return to user space is a point where they take the CPU.
    package static let maxWriteBytes = 64 << 10

    /// Writes all of `bytes` to `fd` at its offset, at most ``maxWriteBytes`` per call,
    /// retrying on `EINTR`. Throws ``failure(_:)`` for `what`.
    package static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, what: @autoclosure () -> String) throws {
        guard let base = bytes.baseAddress else { return }
        var done = 0
        while done < bytes.count {
            let n = Foundation.write(fd, base + done, min(bytes.count - done, maxWriteBytes))
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw failure(what()) }
            done += n
        }
    }

    /// fsyncs a directory, so the names created, renamed or removed in it are durable.
    public static func syncDirectory(_ directory: String) throws {
        let dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { throw failure("cannot open \(directory)") }
        defer { close(dfd) }
        guard fsync(dfd) == 0 else { throw failure("fsync \(directory)") }
    }

    /// The failure `errno` says, doing `what`: a full disk (or quota) is ``ExportError/Code/diskFull``,
    /// anything else ``ExportError/Code/io``. Shared with ``BufferedFile``.
    static func failure(_ what: String) -> ExportError {
        let code = errno
        return ExportError(code == ENOSPC || code == EDQUOT ? .diskFull : .io, "\(what): \(String(cString: strerror(code)))")
    }
}
