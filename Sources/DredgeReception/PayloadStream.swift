import DredgePayload
import Foundation

/// Unpacks an upload while its chunks arrive, so its files are ready shortly after the last
/// chunk: the receiver hands over each chunk's plaintext in order (``append(_:)``), which
/// writes it to the zip kept beside the files, and a worker reads the zip front to back
/// (``ZipStreamReader``), inflating the day files into a staging directory under the payload
/// rules. ``finish(into:check:)`` then checks the manifest and moves the files into place.
///
/// The work runs on the executor given as `schedule` (the server's bounded pool), one batch at
/// a time per stream, never on the caller's thread; at most ``maxPendingBytes`` wait for it,
/// beyond which ``append(_:)`` waits. `schedule` must not run its work on the threads that call
/// ``append(_:)`` or ``finish(into:check:)``, which wait for that work.
///
/// Streaming is a shortcut, not a judge: when it fails (``failure``: a zip it does not read
/// front to back, a payload it refuses, a file it cannot write), the receiver unpacks the
/// finished zip with ``PayloadExtractor``, which decides.
public final class PayloadStream: @unchecked Sendable {  // shared state under `condition`; the reader only on the one running drain
    /// Runs `work` on the receiver's pool; `work(false)` when the pool will not run it.
    public typealias Schedule = @Sendable (_ work: @escaping @Sendable (_ run: Bool) -> Void) -> Void

    /// Small, because it is what is left to unpack when the last chunk arrives: with 8 MiB an
    /// 80 MB upload still had 6–78 ms of unpacking to do after its last chunk, with 2 MiB
    /// 4–14 ms, and the upload was no slower (docs/benchmarks.md).
    public static let maxPendingBytes = 2 << 20

    public let staging: String
    public let zipPath: String
    private let schedule: Schedule
    private let condition = NSCondition()
    private var pending: [Data] = []
    private var pendingBytes = 0
    private var draining = false
    /// ``append(_:)`` is writing the zip: finish and discard wait for it as for the worker.
    private var writing = false
    private var failed: (any Error)?
    /// Written by ``append(_:)`` (one call at a time, with ``writing`` set), closed by finish
    /// or discard, which wait for the write in progress.
    private let zip: BufferedFile
    // Touched only by the running drain, or by finish/discard once no drain runs.
    private let staged: PayloadStaging
    private let reader: ZipStreamReader

    /// Starts a stream that stages into `staging` (a new directory; anything there is removed
    /// first) and writes the zip to `zipPath`.
    public init(staging: String, zipPath: String, limits: PayloadLimits = PayloadLimits(), schedule: @escaping Schedule) throws {
        self.staging = staging
        self.zipPath = zipPath
        self.schedule = schedule
        let fm = FileManager.default
        do {
            if fm.fileExists(atPath: staging) { try fm.removeItem(atPath: staging) }
            try fm.createDirectory(atPath: staging, withIntermediateDirectories: true)
        } catch {
            throw PayloadExtractor.fileError(error, "preparing \(staging)")
        }
        zip = try BufferedFile(creating: zipPath)
        staged = PayloadStaging(directory: staging, limits: limits)
        reader = ZipStreamReader(staging: staged)
    }

    /// Why streaming stopped, if it did.
    public var failure: (any Error)? { condition.withLock { failed } }

    /// The next bytes of the zip, in order; one call at a time. Writes them to the zip on the
    /// caller's thread (the receiver's, which commits chunks in order), so the worker, the one
    /// thread unpacking this upload, only inflates. Waits while ``maxPendingBytes`` are
    /// already waiting. A zip that cannot be written stops the stream (the receiver then
    /// unpacks the upload from its chunks); it is not the caller's failure.
    public func append(_ plaintext: Data) {
        let go = condition.withLock {
            guard failed == nil else { return false }
            writing = true
            return true
        }
        guard go else { return }
        var refused: (any Error)?
        do {
            try zip.write(plaintext)
        } catch {
            refused = error
        }
        condition.lock()
        writing = false
        if let refused, failed == nil { failed = refused }
        condition.broadcast()
        while pendingBytes >= Self.maxPendingBytes && failed == nil && draining { condition.wait() }
        guard failed == nil else {
            condition.unlock()
            return
        }
        pending.append(plaintext)
        pendingBytes += plaintext.count
        let start = !draining
        draining = true
        condition.unlock()
        // Outside the lock: a stopped pool answers at once, on this thread.
        if start { schedule { run in self.drain(run) } }
    }

    private func drain(_ run: Bool) {
        while true {
            let next: Data? = condition.withLock {
                if !run && failed == nil { failed = ExportError(.io, "the server stopped unpacking uploads") }
                guard failed == nil, !pending.isEmpty else {
                    pending.removeAll()
                    pendingBytes = 0
                    draining = false
                    condition.broadcast()
                    return nil
                }
                let bytes = pending.removeFirst()
                pendingBytes -= bytes.count
                condition.broadcast()
                return bytes
            }
            guard let next else { return }
            do {
                try next.withUnsafeBytes { try reader.read($0) }
            } catch {
                condition.withLock { failed = error }
            }
        }
    }

    /// Stops feeding: marks the stream failed with `error` and waits for the running drain and
    /// a zip write in progress.
    public func fail(_ error: any Error) {
        condition.withLock { if failed == nil { failed = error } }
        waitIdle()
    }

    private func waitIdle() {
        condition.lock()
        while draining || writing { condition.wait() }
        condition.unlock()
    }

    /// After the last chunk: waits for the work in flight, then checks the manifest against
    /// the files (and passes it to `check`, which may refuse it by throwing) and moves the
    /// staging directory to `directory` (never replacing one: `.exists`). The zip, complete and
    /// fsynced, stays at ``zipPath``. Throws ``failure`` if streaming had stopped. Call after
    /// the last ``append(_:)`` returned.
    public func finish(into directory: String, check: (ExportManifest) throws -> Void) throws -> ExtractedPayload {
        waitIdle()
        defer { reader.release() }
        if let failed = failure { throw failed }
        try reader.finish()
        try zip.close()
        let (manifest, files) = try staged.finish()
        try check(manifest)
        return try PayloadStaging.publish(staging, manifest: manifest, files: files, to: directory)
    }

    /// Removes what the stream wrote (after a failure, or when the upload is abandoned).
    public func discard() {
        fail(ExportError(.io, "discarded"))
        zip.abandon()
        staged.abandon()
        reader.release()
        for path in [staging, zipPath] where FileManager.default.fileExists(atPath: path) {
            try? FileManager.default.removeItem(atPath: path)  // scratch space of our own; what remains is removed with the upload
        }
    }
}
