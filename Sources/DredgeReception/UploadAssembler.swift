import Crypto
import DredgeEnvelope
import DredgeWire
import DredgePayload
import Foundation
import SwiftProtobuf
import Synchronization

/// The receiving side of one upload, on disk, so it survives a dropped connection and a
/// restart of the receiver (README § Uploads, resumption).
///
/// Layout of its directory: `header.pb` (the serialized header), `chunks/NNNNNN` (verified
/// ciphertext of chunk N). A chunk is decrypted (verified) before it is written; it is written
/// to a temporary name, fsynced and renamed, and the directory fsynced, before ``accept`` returns,
/// so a chunk acknowledged after `accept` is never lost. Re-sending a held chunk is harmless.
/// Ciphertext is what stays on disk until the upload completes.
///
/// Chunks are written from any threads (``write(index:ciphertext:)`` reads only what never
/// changes); what changes (the chunks held, the stream and how far it got) is under a
/// ``Mutex``, never held while a chunk is read, opened or handed to the stream.
public final class UploadAssembler: Sendable {
    public let directory: String
    public let cipher: ChunkCipher
    public var header: WireUploadHeader { cipher.header }
    private let progress: Mutex<Progress>

    private struct Progress {
        var received: Set<UInt32>
        /// Unpacks the payload while chunks arrive, once ``stream(into:)`` started it.
        var stream: PayloadStream?
        /// Chunks handed to ``stream``, in order: the next one it needs.
        var streamed: UInt32 = 0
    }

    /// The chunks held.
    public var received: Set<UInt32> { progress.withLock { $0.received } }
    /// Unpacks the payload while chunks arrive, once ``stream(into:)`` started it.
    public var stream: PayloadStream? { progress.withLock { $0.stream } }
    /// Chunks handed to ``stream``, in order: the next one it needs.
    public var streamed: UInt32 { progress.withLock { $0.streamed } }
    /// Chunks already held that are read back and handed to the stream with each chunk
    /// committed while the stream is behind (an upload resumed after a reconnect or a restart):
    /// the catch-up runs alongside the chunks still to come instead of before the agent may
    /// send them, and ``catchUp(budget:)`` without a budget does the rest after the last one.
    public static let catchUpPerCommit = 2

    /// Starts an upload, or reopens one with the same header (resume). A different header for
    /// an existing directory is refused.
    public init(directory: String, header: WireUploadHeader, key: SymmetricKey) throws {
        do {
            cipher = try ChunkCipher(key: key, header: header)
        } catch let error as EnvelopeError {
            throw ExportError(.uploadInvalid, error.message)
        }
        self.directory = directory
        let fm = FileManager.default
        let headerPath = directory + "/header.pb"
        let bytes: [UInt8] = try header.serializedBytes()
        if let existing = fm.contents(atPath: headerPath) {
            guard Array(existing) == bytes else { throw ExportError(.uploadInvalid, "upload \(header.uploadID) already exists with another header") }
        } else {
            try fm.createDirectory(atPath: directory + "/chunks", withIntermediateDirectories: true)
            try DurableFile.write(bytes, to: headerPath)
        }
        var received: Set<UInt32> = []
        do {
            try fm.createDirectory(atPath: directory + "/chunks", withIntermediateDirectories: true)
            for name in try fm.contentsOfDirectory(atPath: directory + "/chunks") {
                if let index = UInt32(name), index < header.chunkCount { received.insert(index) }
            }
        } catch {
            throw PayloadExtractor.fileError(error, "reading the chunks of upload \(header.uploadID)")
        }
        progress = Mutex(Progress(received: received))
    }

    /// Reopens an upload from its directory alone (after a restart).
    public convenience init(resuming directory: String, key: SymmetricKey) throws {
        guard let bytes = FileManager.default.contents(atPath: directory + "/header.pb") else {
            throw ExportError(.uploadInvalid, "no upload in \(directory)")
        }
        try self.init(directory: directory, header: try WireUploadHeader(serializedBytes: bytes), key: key)
    }

    public var isComplete: Bool { progress.withLock { $0.received.count } == Int(header.chunkCount) }

    /// What an upload directory holds, read without the key: its header and the chunks stored
    /// (for a status answer about an upload not open on this connection). Nil if there is none.
    /// A header that does not parse is as if absent (the upload begins again); a chunk
    /// directory that cannot be read is an error (`.io`), not "no chunks".
    public static func stored(in directory: String) throws -> (header: WireUploadHeader, received: Set<UInt32>)? {
        guard let bytes = FileManager.default.contents(atPath: directory + "/header.pb"),
            let header = try? WireUploadHeader(serializedBytes: bytes)  // unreadable: as if absent
        else { return nil }
        let chunks = directory + "/chunks"
        guard FileManager.default.fileExists(atPath: chunks) else { return (header, []) }
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: chunks)
        } catch {
            throw PayloadExtractor.fileError(error, "reading the chunks of upload \(header.uploadID)")
        }
        return (header, Set(names.compactMap { UInt32($0) }.filter { $0 < header.chunkCount }))
    }

    /// Starts unpacking while chunks arrive. Nothing is read now: the chunks already held (an
    /// upload resumed) are read back from the first, ``catchUpPerCommit`` with each chunk
    /// committed, and each next chunk goes straight to the stream once the stream reaches it.
    public func stream(into stream: PayloadStream) {
        let previous = progress.withLock { p in
            defer {
                p.stream = stream
                p.streamed = 0
            }
            return p.stream
        }
        previous?.discard()
    }

    /// Lets go of the stream (after its last use), so what it holds is freed.
    public func endStream() { progress.withLock { $0.stream = nil } }

    /// Whether the stream was handed every chunk and has not failed (so far).
    public var streamedEverything: Bool {
        let (stream, streamed) = progress.withLock { ($0.stream, $0.streamed) }
        return stream != nil && streamed == header.chunkCount && stream?.failure == nil
    }

    /// Reads back held chunks from the next one the stream needs, in order, and hands them to
    /// it: at most `budget` of them, and only while they are held. One call at a time (as
    /// ``commit(index:plaintext:)``). A chunk that no longer reads or opens stops the stream
    /// (the upload is then unpacked from the whole zip, which decides).
    public func catchUp(budget: Int = .max) {
        var left = budget
        while left > 0 {
            // The next chunk the stream needs, if it is held (`commit` and this, one call at a
            // time, move `streamed` on; `stream(into:)` starts it over).
            let next = progress.withLock { p -> (PayloadStream, UInt32)? in
                guard let stream = p.stream, p.streamed < header.chunkCount, p.received.contains(p.streamed) else { return nil }
                return (stream, p.streamed)
            }
            guard let (stream, index) = next, stream.failure == nil else { return }
            do {
                guard let sealed = FileManager.default.contents(atPath: chunkPath(index)) else { throw ExportError(.io, "chunk \(index) vanished") }
                stream.append(try cipher.open(sealed, index: index))
                handedOn(index, to: stream)
                left -= 1
            } catch {
                stream.fail(error)
            }
        }
    }

    /// The bitmap of held chunks as the wire carries it (README § Uploads).
    public var receivedBitmap: [UInt8] { ChunkBitmap.encode(received, count: header.chunkCount) }

    /// Verifies chunk `index` and stores it durably. Throws `.chunkAuthFailed` for a chunk that
    /// does not authenticate and `.uploadInvalid` for a bad index or size; nothing is stored then.
    public func accept(index: UInt32, ciphertext: some DataProtocol) throws {
        if progress.withLock({ $0.received.contains(index) }) {
            _ = try verify(index: index, ciphertext: ciphertext)
            return
        }
        commit(index: index, plaintext: try write(index: index, ciphertext: ciphertext))
    }

    /// The first half of ``accept(index:ciphertext:)``: verifies chunk `index` and writes it
    /// durably; returns its plaintext for ``commit(index:plaintext:)``. It reads only what
    /// never changes (the key, the directory), so several chunks may be written at once, from
    /// any threads, as long as no two write the same index at the same time.
    public func write(index: UInt32, ciphertext: some DataProtocol) throws -> Data {
        let plaintext = try verify(index: index, ciphertext: ciphertext)
        try DurableFile.write(ciphertext, to: chunkPath(index))
        return plaintext
    }

    /// The second half: records chunk `index`, written by ``write(index:ciphertext:)``, as held
    /// and hands it to the stream. One call at a time.
    public func commit(index: UInt32, plaintext: Data) {
        guard index < header.chunkCount else { return }
        let streamNow = progress.withLock { p -> PayloadStream?? in
            guard p.received.insert(index).inserted else { return .none }
            return .some(index == p.streamed ? p.stream : nil)
        }
        guard let streamNow else { return }
        if let stream = streamNow, stream.failure == nil {
            stream.append(plaintext)
            handedOn(index, to: stream)
        }
        catchUp(budget: Self.catchUpPerCommit)
    }

    /// Chunk `index` went to `stream`: the next it needs is the one after, unless the stream was
    /// replaced or ended meanwhile.
    private func handedOn(_ index: UInt32, to stream: PayloadStream) {
        progress.withLock { p in
            if p.stream === stream && p.streamed == index { p.streamed = index + 1 }
        }
    }

    private func verify(index: UInt32, ciphertext: some DataProtocol) throws -> Data {
        do {
            return try cipher.open(ciphertext, index: index)
        } catch let error as EnvelopeError {
            throw ExportError(error.code == .chunkAuthFailed ? .chunkAuthFailed : .uploadInvalid, error.message)
        }
    }

    /// Decrypts every chunk in order into `zipPath` (fsynced). Throws `.incomplete` if chunks
    /// are missing.
    public func assemble(to zipPath: String) throws {
        let held = progress.withLock { $0.received.count }
        guard held == Int(header.chunkCount) else {
            throw ExportError(.incomplete, "\(Int(header.chunkCount) - held) of \(header.chunkCount) chunks missing")
        }
        let file = try BufferedFile(creating: zipPath)
        for index in 0..<header.chunkCount {
            guard let sealed = FileManager.default.contents(atPath: chunkPath(index)) else { throw ExportError(.io, "chunk \(index) vanished") }
            do {
                try file.write(try cipher.open(sealed, index: index))
            } catch let error as EnvelopeError {
                throw ExportError(.chunkAuthFailed, "stored chunk \(index): \(error.message)")
            }
        }
        try file.close()
    }

    private func chunkPath(_ index: UInt32) -> String { directory + "/chunks/" + String(format: "%06u", index) }
}
