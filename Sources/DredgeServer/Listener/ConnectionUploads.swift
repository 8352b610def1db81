import Crypto
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeWire
import Foundation
import Logging
import NIOPosix

/// What the server accepts from one agent's feedback uploads (configurable in `server.json`,
/// `"feedback": {…}`): how many per hour, how many bytes (as uploaded) per day, and how large
/// one may unpack. Pulls are asked for by engineers and keep the general payload limits.
public struct FeedbackLimits: Codable, Sendable, Equatable {
    /// Feedback uploads one agent may begin per hour. Default 12.
    public var perHour: Int
    /// Bytes of feedback uploads (zips, as declared in their headers) one agent may begin per
    /// 24 hours. Default 64 MiB.
    public var bytesPerDay: Int64
    /// Bytes one feedback upload may unpack to (its files together). Default 32 MiB.
    public var maxUnpackedBytes: Int64

    public init(perHour: Int = 12, bytesPerDay: Int64 = 64 << 20, maxUnpackedBytes: Int64 = 32 << 20) {
        self.perHour = perHour
        self.bytesPerDay = bytesPerDay
        self.maxUnpackedBytes = maxUnpackedBytes
    }

    public static let `default` = FeedbackLimits()

    /// Keys left out of `server.json` keep their defaults.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = FeedbackLimits()
        perHour = try c.decodeIfPresent(Int.self, forKey: .perHour) ?? d.perHour
        bytesPerDay = try c.decodeIfPresent(Int64.self, forKey: .bytesPerDay) ?? d.bytesPerDay
        maxUnpackedBytes = try c.decodeIfPresent(Int64.self, forKey: .maxUnpackedBytes) ?? d.maxUnpackedBytes
    }
}

/// The uploads of one agent connection on the server: one ``UploadReceiverStateMachine`` and
/// one ``UploadAssembler`` (on disk, so they survive reconnects and restarts) per upload, and
/// the pull or feedback statuses they move.
///
/// Every id that arrives is checked (``WireID``) before it is looked up or becomes part of a
/// path, and paths come from ``DataDirectory`` only. A final status (complete, rejected,
/// failed, expired) is never changed by anything the agent sends afterwards.
///
/// The statuses are read and moved through the async stores; everything that waits on a disk
/// or costs CPU (chunk verification and durable writes, RSA unwrapping, the last steps of an
/// upload) runs on `blocking`, a ``ServerWork`` pool. One frame is handled at a time (the
/// connection hands over the next only when the last is answered), hence `@unchecked Sendable`.
final class ConnectionUploads: @unchecked Sendable {
    let agentID: String
    let pulls: any PullQueue
    let feedback: any FeedbackInbox
    let encryptionKey: RSAPrivateKey
    let paths: DataDirectory
    let limits: PayloadLimits
    let feedbackLimits: FeedbackLimits
    let logger: Logger
    /// Where uploads are unpacked while they arrive; nil: each is unpacked after its last chunk.
    let unpacking: PayloadStream.Schedule?
    /// Where the blocking steps run.
    let blocking: NIOThreadPool
    /// Under ``chunks`` while chunks are in flight; otherwise touched by one step at a time.
    private var receivers: [String: (machine: UploadReceiverStateMachine, assembler: UploadAssembler)] = [:]
    /// Guards ``receivers``, the machines in it and the chunk pipeline below: chunk writes
    /// finish on pool threads while the connection reads on.
    private let chunks = NSLock()
    private var slots: [ChunkSlot] = []
    private var inFlight: Set<ChunkKey> = []
    private var committing = false
    private var roomWaiters: [CheckedContinuation<Void, Never>] = []
    private var idleWaiters: [CheckedContinuation<Void, Never>] = []
    /// The last status write queued; each waits for the one before it.
    private var recording: Task<Void, Never>?
    /// Finished uploads' chunk directories being removed, one after another.
    private var removing: Task<Void, Never>?
    /// Per upload, the `chunks_received` last queued for writing (touched by the committer only).
    private var recordedCount: [String: Int] = [:]
    /// Where acknowledgements of chunks written after their frame was handled go.
    let emit: @Sendable ([WireFrame]) -> Void
    /// Uploads begun on this connection that are feedback, not pulls.
    private var feedbackUploads: Set<String> = []
    /// Told of each upload whose files are in place and recorded complete (the ``Indexer``).
    let landed: @Sendable (IndexedSource) -> Void

    init(
        agentID: String, pulls: any PullQueue, feedback: any FeedbackInbox, encryptionKey: RSAPrivateKey, paths: DataDirectory,
        limits: PayloadLimits = PayloadLimits(), feedbackLimits: FeedbackLimits = .default, blocking: NIOThreadPool, unpacking: PayloadStream.Schedule? = nil,
        logger: Logger, landed: @escaping @Sendable (IndexedSource) -> Void = { _ in }, emit: @escaping @Sendable ([WireFrame]) -> Void
    ) {
        self.emit = emit
        self.landed = landed
        self.unpacking = unpacking
        self.blocking = blocking
        self.agentID = agentID
        self.pulls = pulls
        self.feedback = feedback
        self.encryptionKey = encryptionKey
        self.paths = paths
        self.limits = limits
        self.feedbackLimits = feedbackLimits
        self.logger = logger
    }

    /// Moves the status of the pull (for this agent) or the feedback an upload belongs to.
    /// The stores ignore a change to a status that is already final; returns whether it applied.
    @discardableResult
    private func progress(
        _ uploadID: String, _ status: PullStatus, detail: String = "", chunksReceived: Int? = nil, chunkCount: Int? = nil, bytes: Int64? = nil,
        records: Int? = nil, files: [String]? = nil, failedWith code: WireErrorCode? = nil
    ) async throws -> Bool {
        let errorCode = code.map(\.rawValue)
        if feedbackUploads.contains(uploadID) {
            return try await feedback.update(uploadID, status: status, detail: detail, chunksReceived: chunksReceived, records: records, files: files, errorCode: errorCode)
        } else {
            return try await pulls.update(
                uploadID, agent: agentID, status: status, detail: detail, chunksReceived: chunksReceived, chunkCount: chunkCount, bytes: bytes, files: files,
                errorCode: errorCode)
        }
    }

    /// The result a failed upload was answered with, answered again when the agent begins it
    /// once more (on any connection); nil when it failed without one (before this server kept
    /// codes), and then the caller refuses the upload instead.
    static func failedResult(_ uploadID: String, code: Int?, detail: String) -> WireFrame? {
        guard let code, let error = WireErrorCode(rawValue: code) else { return nil }
        return .with { $0.uploadResult = .with { $0.uploadID = uploadID; $0.ok = false; $0.error = error; $0.detail = detail } }
    }

    /// The upload (or command) id a frame of the upload layer names; nil for other frames.
    static func uploadID(of frame: WireFrame) -> String? {
        switch frame.body {
        case .commandAccepted(let m)?: m.commandID
        case .commandRejected(let m)?: m.commandID
        case .uploadBegin(let m)?: m.header.uploadID
        case .uploadChunk(let m)?: m.uploadID
        case .uploadComplete(let m)?: m.uploadID
        case .uploadStatusQuery(let m)?: m.uploadID
        case .error(let m)?: m.uploadID
        default: nil
        }
    }

    /// Handles an upload frame; returns the frames to send back.
    func handle(_ frame: WireFrame) async throws -> [WireFrame] {
        // Every id is checked once, here, before anything looks it up. (An agent's own error
        // report with a malformed id is ignored below rather than answered.)
        let isReport = if case .error? = frame.body { true } else { false }
        if !isReport, let named = Self.uploadID(of: frame), !WireID.isValid(named) {
            return [error(.errorUploadInvalid, named, "the id \(WireID.echo(named).debugDescription) is not 32 lowercase hex characters")]
        }
        // Every other upload frame sees the chunks before it committed.
        if case .uploadChunk? = frame.body {} else { await settled() }
        switch frame.body {
        case .commandAccepted(let m)?:
            // Only a delivered pull moves on: an answer repeated for a redelivered command
            // never takes an uploading one back.
            try await pulls.update(m.commandID, agent: agentID, status: .exporting, from: [.queued, .delivered])
            return []
        case .commandRejected(let m)?:
            // Likewise: a rejection after the agent accepted (and began uploading) changes nothing.
            let id = m.commandID
            if try await pulls.update(id, agent: agentID, status: .rejected, detail: "\(m.reason): \(Self.bounded(m.detail))", from: [.queued, .delivered]) {
                logger.notice("pull rejected by agent", metadata: ["pull.id": "\(id)", "agent.id": "\(agentID)", "reason": "\(m.reason)"])
            }
            return []
        case .error(let e)?:
            // The agent could not carry out an accepted command (its export failed, say).
            guard WireID.isValid(e.uploadID), !feedbackUploads.contains(e.uploadID) else { return [] }
            try await pulls.update(e.uploadID, agent: agentID, status: .failed, detail: "the agent could not finish it: \(Self.bounded(e.detail))")
            logger.notice("pull failed on the agent", metadata: ["pull.id": "\(e.uploadID)", "agent.id": "\(agentID)", "code": "\(e.code)"])
            return []
        case .uploadBegin(let m)?:
            return try await begin(m.header)
        case .uploadChunk(let chunk)?:
            return try await receive(chunk)
        case .uploadComplete(let m)?:
            guard var entry = receivers[m.uploadID] else { return [error(.errorUploadUnknown, m.uploadID, "no upload \(m.uploadID) begun on this connection")] }
            var out: [WireFrame] = []
            for action in entry.machine.complete() {
                switch action {
                case .send(let f): out.append(f)
                case .assemble:
                    let result = await finish(m.uploadID, entry.assembler)
                    for case .send(let f) in entry.machine.assembled(result) { out.append(f) }
                default: break
                }
            }
            receivers[m.uploadID] = entry
            return out
        case .uploadStatusQuery(let m)?:
            if let entry = receivers[m.uploadID] { return [entry.machine.status()] }
            return [try await storedStatus(m.uploadID)]
        default:
            return []
        }
    }

    /// The status of an upload this agent did not begin on this connection, from what the
    /// server stored: complete or failed by the pull's (or feedback's) final status, receiving
    /// with the chunks on disk, or unknown (never begun, or not this agent's).
    private func storedStatus(_ uploadID: String) async throws -> WireFrame {
        var status = WireUploadStatus.with { $0.uploadID = uploadID; $0.state = .unknown }
        let recorded: PullStatus?
        if let target = try await pulls.pull(uploadID)?.targets.first(where: { $0.agentID == agentID }) {
            recorded = target.status
        } else if let record = try await feedback.feedback(uploadID), record.agentID == agentID {
            recorded = record.status
        } else {
            recorded = nil
        }
        switch recorded {
        case .complete?: status.state = .complete
        case let s? where s.isFinal: status.state = .failed
        case .some:
            let directory = try paths.upload(uploadID, agent: agentID)
            let held = try await blocking.runIfActive { () throws -> [UInt8]? in
                guard let held = try UploadAssembler.stored(in: directory) else { return nil }
                return ChunkBitmap.encode(held.received, count: held.header.chunkCount)
            }
            if let held {
                status.state = .receiving
                status.received = Data(held)
            }
        case nil: break
        }
        return .with { $0.uploadStatus = status }
    }

    /// A status an upload step moves, recorded once the step is done.
    private struct Progress: Sendable {
        var status: PullStatus
        var detail = ""
        var chunksReceived: Int?
        var failedWith: WireErrorCode?
    }

    /// A chunk goes to the `blocking` pool to be verified and written durably, and the next
    /// frame is read at once: up to ``maxChunksInFlight`` chunks of this connection are written
    /// at the same time, since most of a durable write is waiting for fsync. Each chunk is
    /// committed (held, streamed, acknowledged) in the order it arrived once it is written,
    /// by whichever pool thread finishes it; its acknowledgement goes out through ``emit``.
    /// Answers that need no write (a chunk held already, a bad index) are returned at once.
    private func receive(_ chunk: WireUploadChunk) async throws -> [WireFrame] {
        guard chunks.withLock({ receivers[chunk.uploadID] != nil }) else {
            return [error(.errorUploadUnknown, chunk.uploadID, "no upload \(chunk.uploadID) begun on this connection")]
        }
        await roomForChunk()
        var out: [WireFrame] = []
        var failed: Progress?
        let started: (ChunkSlot, UploadAssembler)? = chunks.withLock {
            guard var entry = receivers[chunk.uploadID] else { return nil }
            var started: (ChunkSlot, UploadAssembler)?
            let wasReceiving = entry.machine.state == .receiving
            for action in entry.machine.chunk(chunk) {
                switch action {
                case .send(let f): out.append(f)
                case .store(let index, let ciphertext):
                    // A chunk sent again while its first copy is being written is answered once.
                    guard inFlight.insert(ChunkKey(uploadID: chunk.uploadID, index: index)).inserted else { continue }
                    let slot = ChunkSlot(uploadID: chunk.uploadID, index: index, ciphertext: ciphertext)
                    slots.append(slot)
                    started = (slot, entry.assembler)
                case .assemble: break
                }
            }
            // Recorded when this chunk ended the upload, not for every chunk sent after it.
            if wasReceiving, case .finished(let result) = entry.machine.state, !result.ok, result.error == .errorChunkInvalid {
                failed = Progress(status: .failed, detail: result.detail, failedWith: .errorChunkInvalid)
            }
            receivers[chunk.uploadID] = entry
            return started
        }
        if let (slot, assembler) = started {
            nonisolated(unsafe) let assembler = assembler  // `write` reads only what never changes
            // Set before any chunk is written, cleared only after `settled()`.
            let streaming = assembler.stream != nil
            blocking.submit { state in
                var outcome: Result<Data, any Error> =
                    state == .active
                    ? Result { try assembler.write(index: slot.index, ciphertext: slot.ciphertext) }
                    : .failure(ExportError(.io, "the server is stopping"))
                slot.ciphertext = Data()  // written: only the plaintext may still be needed, by the stream
                if !streaming, case .success = outcome { outcome = .success(Data()) }
                self.written(slot, outcome)
            }
        }
        if let failed {
            record([(chunk.uploadID, failed)])
        }
        // Answers given at once (a chunk past the upload's end, which ends it; a chunk held
        // already) wait for the status moves before them: the agent never hears of an end that
        // is not recorded yet (see ``written(_:_:)``).
        if !out.isEmpty { await lastOf { $0.recording } }
        return out
    }

    /// Chunks written at once per connection, at most: the agent's window. Each holds its
    /// ciphertext until written, then its plaintext until committed when the upload streams
    /// (at most 2 MiB a chunk at the largest chunk size).
    static let maxChunksInFlight = 8

    private struct ChunkKey: Hashable {
        var uploadID: String
        var index: UInt32
    }

    /// A chunk between arriving and being committed.
    private final class ChunkSlot: @unchecked Sendable {  // `outcome` under `chunks`; `ciphertext` by its writer only
        let uploadID: String
        let index: UInt32
        var ciphertext: Data
        var outcome: Result<Data, any Error>?
        init(uploadID: String, index: UInt32, ciphertext: Data) {
            self.uploadID = uploadID
            self.index = index
            self.ciphertext = ciphertext
        }
    }

    /// Waits while ``maxChunksInFlight`` chunks are being written (the connection's next
    /// frames wait meanwhile, and a few more stop its reading, which holds the agent back
    /// through TCP).
    private func roomForChunk() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = chunks.withLock { () -> Bool in
                if slots.count < Self.maxChunksInFlight { return true }
                roomWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Waits until every chunk that arrived is committed and its status recorded: every other
    /// upload frame sees the chunks before it.
    func settled() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = chunks.withLock { () -> Bool in
                if slots.isEmpty && !committing { return true }
                idleWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
        await lastOf { $0.recording }
        await lastOf { $0.removing }
    }

    /// Waits for the chain of tasks `chain` names (each waits for the one before it) until its
    /// last one is done, including any added meanwhile.
    private func lastOf(_ chain: (ConnectionUploads) -> Task<Void, Never>?) async {
        while let task = chunks.withLock({ chain(self) }) {
            await task.value
            if chunks.withLock({ chain(self) == task }) { break }
        }
    }

    /// Removes a landed upload's chunks while its result goes out, after the removals asked
    /// before. Removing an 80 MB upload's 300 chunk files took 45 ms, two thirds of the time
    /// between its last chunk and its result. ``settled()`` waits for it, so the connection's
    /// next upload frame, and its end (and so the server's shutdown), come after it.
    private func removeAfterResult(_ directory: String, uploadID: String) {
        chunks.withLock {
            let previous = removing
            removing = Task { [blocking, logger] in
                await previous?.value
                do {
                    try await blocking.runIfActive { try FileManager.default.removeItem(atPath: directory) }
                } catch {
                    logger.warning("could not remove a finished upload's chunks", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
                }
            }
        }
    }

    /// A chunk's write finished (on a pool thread): commits, in arrival order, every chunk at
    /// the front that is written. One thread commits at a time; the others leave their chunk
    /// to it.
    private func written(_ slot: ChunkSlot, _ outcome: Result<Data, any Error>) {
        var mine = chunks.withLock { () -> Bool in
            slot.outcome = outcome
            if committing { return false }
            committing = true
            return true
        }
        while mine {
            let ready: [ChunkSlot] = chunks.withLock {
                var ready: [ChunkSlot] = []
                while let first = slots.first, first.outcome != nil { ready.append(slots.removeFirst()) }
                return ready
            }
            var frames: [WireFrame] = []
            var moves: [(String, Progress)] = []
            for slot in ready { commit(slot, frames: &frames, moves: &moves) }
            if moves.contains(where: { $0.1.status == .failed }) {
                // A refusal that ends an upload goes out once it is recorded: an agent that
                // hears it and begins the upload again, on any connection, is answered the
                // stored result, and whoever asks after the agent heard it sees `failed`.
                record(moves, thenSend: frames)
            } else {
                if !frames.isEmpty { emit(frames) }
                if !moves.isEmpty { record(moves) }
            }
            let wake: (room: [CheckedContinuation<Void, Never>], idle: [CheckedContinuation<Void, Never>]) = chunks.withLock {
                for slot in ready { inFlight.remove(ChunkKey(uploadID: slot.uploadID, index: slot.index)) }
                if let first = slots.first, first.outcome != nil {
                    mine = true
                } else {
                    mine = false
                    committing = false
                }
                let room = slots.count < Self.maxChunksInFlight ? roomWaiters : []
                if !room.isEmpty { roomWaiters = [] }
                let idle = slots.isEmpty && !committing ? idleWaiters : []
                if !idle.isEmpty { idleWaiters = [] }
                return (room, idle)
            }
            for c in wake.room { c.resume() }
            for c in wake.idle { c.resume() }
        }
    }

    /// One written (or refused) chunk through its upload's machine and assembler.
    private func commit(_ slot: ChunkSlot, frames: inout [WireFrame], moves: inout [(String, Progress)]) {
        let id = slot.uploadID
        let index = slot.index
        guard let assembler = chunks.withLock({ receivers[id]?.assembler }) else { return }
        let next: [UploadReceiverStateMachine.Action]
        switch slot.outcome {
        case .success(let plaintext)?:
            // An upload that ended meanwhile (a chunk that failed authentication) takes no more.
            guard chunks.withLock({ receivers[id]?.machine.state == .receiving }) else { return }
            assembler.commit(index: index, plaintext: plaintext)
            next = chunks.withLock { receivers[id]?.machine.stored(index) ?? [] }
            let held = assembler.received.count
            let total = Int(assembler.header.chunkCount)
            if held == total || held - (recordedCount[id] ?? 0) >= Self.chunksPerStatusWrite {
                recordedCount[id] = held
                moves.append((id, Progress(status: .uploading, chunksReceived: held)))
            }
        case .failure(let error)?:
            if let e = error as? ExportError {
                logger.warning("chunk refused", metadata: ["upload.id": "\(id)", "index": "\(index)", "error": "\(e)"])
            }
            let (code, move) = Self.refusal(of: error, index: index)
            next = chunks.withLock { receivers[id]?.machine.rejected(index, code) ?? [] }
            // A chunk refused after its upload ended answers nothing and records nothing.
            if !next.isEmpty { moves.append((id, move)) }
        case nil:
            return
        }
        for case .send(let f) in next { frames.append(f) }
    }

    /// What a chunk whose write failed with `error` answers the agent, and the status recorded.
    private static func refusal(of error: any Error, index: UInt32) -> (WireErrorCode, Progress) {
        guard let e = error as? ExportError else {
            // `write` throws only ExportError; anything else is the server's own trouble too.
            return (.errorInternal, Progress(status: .uploading, detail: "the server could not store chunk \(index) (\(error)); the agent will retry"))
        }
        switch e.code {
        case .chunkAuthFailed:
            return (.errorChunkAuthFailed, Progress(status: .failed, detail: "chunk \(index) failed authentication", failedWith: .errorChunkAuthFailed))
        case .uploadInvalid:
            return (.errorChunkInvalid, Progress(status: .failed, detail: "chunk \(index) is invalid: \(e.message)", failedWith: .errorChunkInvalid))
        default:
            // The server's own trouble (a full disk): the agent keeps its export and sends the
            // chunk again later; the status stays open, with the reason.
            return (.errorInternal, Progress(status: .uploading, detail: "the server could not store chunk \(index) (\(e.code)); the agent will retry"))
        }
    }

    /// Chunks held between two writes of an upload's progress (`chunks_received`): one write
    /// per chunk cost as much as the chunk's own durable write. The last chunk is always written.
    static let chunksPerStatusWrite = 16

    /// Records status moves in order, after the ones recorded before, off the committing thread;
    /// then sends `frames`, if any.
    private func record(_ moves: [(String, Progress)], thenSend frames: [WireFrame] = []) {
        chunks.withLock {
            let previous = recording
            recording = Task { [emit] in
                await previous?.value
                for (id, move) in moves {
                    do {
                        try await progress(id, move.status, detail: move.detail, chunksReceived: move.chunksReceived, failedWith: move.failedWith)
                    } catch {
                        logger.error("could not record an upload's progress", metadata: ["upload.id": "\(id)", "error": "\(error)"])
                    }
                }
                if !frames.isEmpty { emit(frames) }
            }
        }
    }

    private func begin(_ header: WireUploadHeader) async throws -> [WireFrame] {
        guard header.agentID == agentID else {
            return [error(.errorUploadInvalid, header.uploadID, "upload \(header.uploadID) names another agent")]
        }
        do {
            try ChunkCipher.validate(header)
        } catch {
            return [self.error(.errorUploadInvalid, header.uploadID, "\(error)")]
        }
        let key: SymmetricKey
        switch header.kind {
        case .feedback:
            switch try await admitFeedback(header) {
            case .failure(let refusal): return [refusal.frame]
            case .success(let k): key = k
            }
        case .pull:
            guard !header.hasFeedback, header.wrappedKey.isEmpty else {
                return [error(.errorUploadInvalid, header.uploadID, "a pull's header carries no feedback and no wrapped key")]
            }
            guard let pull = try await pulls.pull(header.uploadID), let target = pull.targets.first(where: { $0.agentID == agentID }),
                let wrapped = try await pulls.wrappedKey(of: header.uploadID)
            else {
                return [error(.errorUploadInvalid, header.uploadID, "no pull \(header.uploadID) for this agent")]
            }
            if target.status == .complete {
                // The same result as the first time: the day files (the stored list also has the
                // manifest) and the records the manifest counts.
                let id = header.uploadID
                let records = try await blocking.runIfActive { self.finishedRecordCount(id) }
                let days = target.files.filter { ($0 as NSString).lastPathComponent != PayloadLimits.manifestName }.count
                return [.with { $0.uploadResult = .with { $0.uploadID = id; $0.ok = true; $0.files = UInt32(days); $0.records = UInt64(records) } }]
            }
            if target.status == .failed, let result = Self.failedResult(header.uploadID, code: target.errorCode, detail: target.detail) {
                return [result]
            }
            if target.status.isFinal {
                return [error(.errorUploadInvalid, header.uploadID, "pull \(header.uploadID) is \(target.status.rawValue) for this agent: \(target.detail)")]
            }
            // Unwrapped only for an upload that can still be received (RSA is the costly part).
            guard let unwrapped = try await unwrap(wrapped) else {
                logger.error("a pull's key does not unwrap", metadata: ["pull.id": "\(header.uploadID)", "agent.id": "\(agentID)"])
                return [self.error(.errorUploadInvalid, header.uploadID, "pull \(header.uploadID) cannot be received by this server (its key does not unwrap)")]
            }
            key = unwrapped
        default:
            return [error(.errorUploadInvalid, header.uploadID, "an upload is a pull or a feedback, not kind \(header.kind.rawValue)")]
        }
        if receivers[header.uploadID] == nil, let refused = try await blocking.runIfActive({ self.open(header, key: key) }) {
            return [refused]
        }
        guard var entry = receivers[header.uploadID] else { return [] }
        try await progress(
            header.uploadID, .uploading, chunksReceived: entry.assembler.received.count, chunkCount: Int(header.chunkCount), bytes: Int64(clamping: header.plaintextSize))
        let actions = entry.machine.begin(header)
        receivers[header.uploadID] = entry
        return actions.compactMap { if case .send(let f) = $0 { return f } else { return nil } }
    }

    /// The record count in a finished pull's stored manifest (blocking); 0, logged, when it
    /// does not read (the files were removed by hand, say).
    private func finishedRecordCount(_ uploadID: String) -> Int {
        do {
            let path = try paths.pullFiles(uploadID, agent: agentID) + "/" + PayloadLimits.manifestName
            return try JSONDecoder().decode(ExportManifest.self, from: Data(contentsOf: URL(fileURLWithPath: path))).recordCount
        } catch {
            logger.warning("a finished pull's manifest does not read", metadata: ["pull.id": "\(uploadID)", "agent.id": "\(agentID)", "error": "\(error)"])
            return 0
        }
    }

    /// Opens an upload's assembler over the chunks already on disk and starts unpacking it while
    /// it arrives (blocking); the frame that refuses it, or nil.
    private func open(_ header: WireUploadHeader, key: SymmetricKey) -> WireFrame? {
        let assembler: UploadAssembler
        do {
            assembler = try UploadAssembler(directory: try paths.upload(header.uploadID, agent: agentID), header: header, key: key)
        } catch let e as ExportError where e.code == .uploadInvalid {
            return error(.errorUploadInvalid, header.uploadID, e.message)
        } catch {
            return self.error(.errorInternal, header.uploadID, "the server cannot keep this upload now (\(error)); try later")
        }
        startStreaming(assembler, isFeedback: header.kind == .feedback)
        receivers[header.uploadID] = (UploadReceiverStateMachine(header: header, received: assembler.received), assembler)
        return nil
    }

    /// An upload's key, unwrapped with the server's encryption key on the blocking pool (an RSA
    /// private-key operation); nil when it does not unwrap.
    private func unwrap(_ wrapped: [UInt8]) async throws -> SymmetricKey? {
        let encryptionKey = self.encryptionKey
        return try await blocking.runIfActive { () -> SymmetricKey? in
            do { return try encryptionKey.unwrapKey(wrapped) } catch { return nil }
        }
    }

    /// A feedback upload's key (unwrapped with the server's encryption key), after checking the
    /// header and this agent's quotas; or the frame that refuses it, or answers it if it was
    /// already received.
    private func admitFeedback(_ header: WireUploadHeader) async throws -> Result<SymmetricKey, Refusal> {
        let id = header.uploadID
        let f = header.feedback
        guard header.hasFeedback, f.feedbackID == id, UserID.isValid(f.uid), FeedbackText.isValid(f.text) else {
            return .failure(Refusal(error(.errorUploadInvalid, id, "feedback header incomplete or over its limits")))
        }
        guard Timestamp.acceptedRange.contains(f.createdAtUs) else {
            return .failure(Refusal(error(.errorUploadInvalid, id, "feedback created_at_us is outside 1970–9999")))
        }
        guard let key = try await unwrap(Array(header.wrappedKey)) else {
            return .failure(Refusal(self.error(.errorUploadInvalid, id, "the feedback key does not unwrap with this server's key")))
        }
        if let existing = try await feedback.feedback(id) {
            guard existing.agentID == agentID else { return .failure(Refusal(error(.errorUploadInvalid, id, "feedback \(id) belongs to another agent"))) }
            if existing.status == .complete {
                return .failure(Refusal(.with { $0.uploadResult = .with { $0.uploadID = id; $0.ok = true; $0.files = UInt32(max(0, existing.files.count - 1)); $0.records = UInt64(existing.records) } }))
            }
            if existing.status.isFinal {
                // Feedback failed before codes were kept: its payload was refused.
                return .failure(Refusal(
                    Self.failedResult(id, code: existing.errorCode ?? WireErrorCode.errorPayloadInvalid.rawValue, detail: existing.detail)
                        ?? error(.errorUploadInvalid, id, existing.detail)))
            }
        } else {
            // Too large ever to be accepted: refused for good, not "later".
            guard header.plaintextSize <= UInt64(clamping: feedbackLimits.maxUnpackedBytes) else {
                return .failure(Refusal(error(.errorUploadInvalid, id, "a feedback upload may be at most \(feedbackLimits.maxUnpackedBytes) bytes")))
            }
            let now = Date()
            let lastHour = try await feedback.usage(agentID: agentID, since: now.addingTimeInterval(-3600))
            let lastDay = try await feedback.usage(agentID: agentID, since: now.addingTimeInterval(-86_400))
            guard lastHour.count < feedbackLimits.perHour, lastDay.bytes + Int64(clamping: header.plaintextSize) <= feedbackLimits.bytesPerDay else {
                logger.notice("feedback quota exceeded", metadata: ["agent.id": "\(agentID)", "last_hour": "\(lastHour.count)", "last_day_bytes": "\(lastDay.bytes)"])
                return .failure(Refusal(error(
                    .errorLimitExceeded, id,
                    "feedback quota: at most \(feedbackLimits.perHour) per hour and \(feedbackLimits.bytesPerDay) bytes per day from one agent; try later")))
            }
            try await feedback.begin(
                id: id, agentID: agentID, uid: f.uid, text: f.text, createdAt: Timestamp(microseconds: f.createdAtUs), chunkCount: Int(header.chunkCount),
                bytes: Int64(clamping: header.plaintextSize), at: now)
            logger.info("feedback upload begun", metadata: ["feedback.id": "\(id)", "agent.id": "\(agentID)", "uid": "\(f.uid)"])
        }
        feedbackUploads.insert(id)
        return .success(key)
    }

    /// Starts unpacking an upload while it arrives, in a directory of this connection's own
    /// inside the upload's (what an earlier connection left there is removed). Without it the
    /// upload is unpacked after its last chunk, as it is when streaming fails.
    ///
    /// An upload resumed after a reconnect or a restart streams too: the chunks it holds are
    /// read back a few with each chunk that arrives (``UploadAssembler/catchUp(budget:)``), not
    /// while the agent waits for Ready, and what is left after the last chunk in ``unpack``.
    private func startStreaming(_ assembler: UploadAssembler, isFeedback: Bool) {
        guard let unpacking else { return }
        let fm = FileManager.default
        do {
            for name in try fm.contentsOfDirectory(atPath: assembler.directory) where name.hasPrefix("stream-") {
                try fm.removeItem(atPath: try paths.inside(assembler.directory + "/" + name))
            }
            let name = "stream-" + Hex.encode(secureRandomBytes(8))
            let stream = try PayloadStream(
                staging: try paths.inside(assembler.directory + "/" + name), zipPath: try paths.inside(assembler.directory + "/" + name + ".zip"),
                limits: isFeedback ? feedbackPayloadLimits : limits, schedule: unpacking)
            assembler.stream(into: stream)
        } catch {
            logger.warning("cannot unpack an upload while it arrives; it is unpacked after its last chunk", metadata: [
                "upload.id": "\(assembler.header.uploadID)", "error": "\(error)",
            ])
        }
    }

    /// The connection ended: uploads being unpacked while they arrived stop, and what they
    /// staged is removed (the chunks stay, for the agent to finish the upload later).
    /// Call after ``settled()``.
    func closed() {
        for (_, entry) in receivers {
            entry.assembler.stream?.discard()
            entry.assembler.endStream()
        }
        receivers.removeAll()
    }

    /// Reassemble, decrypt, unpack with limits into `pulls/<pull>/<agent>/` or `feedback/<id>/`.
    /// A failure of the server's own (disk, I/O) leaves the upload open for the agent to finish
    /// later; a payload that breaks the rules fails it for good.
    private func finish(_ uploadID: String, _ assembler: UploadAssembler) async -> WireUploadResult {
        let isFeedback = feedbackUploads.contains(uploadID)
        let what = isFeedback ? "feedback" : "pull"
        do {
            // What the manifest must say was selected (Protocol § Payload).
            var selection: ExportManifest.FilterDescription?
            if !isFeedback {
                guard let pull = try await pulls.pull(uploadID), let target = pull.targets.first(where: { $0.agentID == agentID }) else {
                    throw ExportError(.uploadInvalid, "no pull \(uploadID) for this agent")
                }
                if target.status.isFinal {
                    throw ExportError(.uploadInvalid, "pull \(uploadID) is already \(target.status.rawValue): \(target.detail)")
                }
                guard let filter = pull.filter else { throw ExportError(.uploadInvalid, "pull \(uploadID)'s stored filter does not read back") }
                selection = ExportManifest.FilterDescription(filter.bounded(toTarget: pull.uid))
            }
            let destination = isFeedback ? try paths.feedbackFiles(uploadID) : try paths.pullFiles(uploadID, agent: agentID)
            let selected = selection
            // The assembler belongs to this connection's one step at a time, like everything here.
            nonisolated(unsafe) let assembler = assembler
            let payload = try await blocking.runIfActive {
                try self.unpack(uploadID, assembler, into: destination, isFeedback: isFeedback, selection: selected)
            }
            let files = (payload.files.map { ($0 as NSString).lastPathComponent } + [PayloadLimits.manifestName]).map { destination + "/" + $0 }
            guard try await progress(uploadID, .complete, detail: "\(payload.manifest.recordCount) records", records: payload.manifest.recordCount, files: files) else {
                // Ended meanwhile (expired by the deadline sweep, removed by an engineer): the
                // agent must not believe it arrived, and the files just put in place go.
                // (Unless another connection of this agent landed the same upload meanwhile.)
                let placed = [destination, isFeedback ? try paths.feedbackZip(uploadID) : try paths.pullZip(uploadID, agent: agentID)]
                do {
                    let now =
                        isFeedback
                        ? try await feedback.feedback(uploadID)?.status
                        : try await pulls.pull(uploadID)?.targets.first(where: { $0.agentID == agentID })?.status
                    if now != .complete { _ = try await blocking.runIfActive { try ResultsKeeper.delete(placed) } }
                } catch {
                    logger.error("could not delete the files of an upload that ended before it landed", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
                }
                throw ExportError(.uploadInvalid, "\(what) \(uploadID) ended before its upload finished")
            }
            landed(IndexedSource(kind: isFeedback ? .feedback : .pull, id: uploadID, agentID: agentID))
            removeAfterResult(try paths.inside(assembler.directory), uploadID: uploadID)
            logger.info("\(what) complete", metadata: ["upload.id": "\(uploadID)", "agent.id": "\(agentID)", "records": "\(payload.manifest.recordCount)"])
            return .with { $0.uploadID = uploadID; $0.ok = true; $0.files = UInt32(payload.files.count); $0.records = UInt64(payload.manifest.recordCount) }
        } catch {
            let final: (WireErrorCode, String)? =
                switch (error as? ExportError)?.code {
                case .payloadInvalid?: (.errorPayloadInvalid, "\(error)")
                case .uploadInvalid?, .chunkAuthFailed?, .exists?: (.errorUploadInvalid, "\(error)")
                default: nil
                }
            if let (code, detail) = final {
                do { try await progress(uploadID, .failed, detail: detail, failedWith: code) } catch { logger.error("could not record a failed upload", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"]) }
                logger.error("\(what) failed", metadata: ["upload.id": "\(uploadID)", "agent.id": "\(agentID)", "error": "\(error)"])
                return .with { $0.uploadID = uploadID; $0.ok = false; $0.error = code; $0.detail = detail }
            }
            do { try await progress(uploadID, .uploading, detail: "the server could not unpack it (\(error)); the agent will retry") } catch { logger.error("could not record an upload's trouble", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"]) }
            logger.error("\(what) could not be unpacked; left for the agent to retry", metadata: ["upload.id": "\(uploadID)", "agent.id": "\(agentID)", "error": "\(error)"])
            return .with { $0.uploadID = uploadID; $0.ok = false; $0.error = .errorInternal; $0.detail = "the server could not store the upload now; try later" }
        }
    }

    /// An upload's files in place (blocking): what streaming unpacked, checked and moved; else
    /// the whole zip reassembled and unpacked; else (unpacked before a restart) adopted. The zip
    /// is kept beside the files.
    private func unpack(
        _ uploadID: String, _ assembler: UploadAssembler, into destination: String, isFeedback: Bool, selection: ExportManifest.FilterDescription?
    ) throws -> ExtractedPayload {
        let zipCopy = isFeedback ? try paths.feedbackZip(uploadID) : try paths.pullZip(uploadID, agent: agentID)
        try FileManager.default.createDirectory(atPath: (destination as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let check = { (manifest: ExportManifest) throws in
            guard manifest.uploadID == uploadID, manifest.kind == (isFeedback ? "feedback" : "pull"), manifest.agentID == self.agentID else {
                throw ExportError(.payloadInvalid, "the manifest describes another upload (\(manifest.kind) \(manifest.uploadID) of agent \(manifest.agentID))")
            }
            let header = assembler.header
            guard manifest.empty == header.empty else {
                throw ExportError(.payloadInvalid, "the header says empty=\(header.empty) but the manifest says empty=\(manifest.empty)")
            }
            if isFeedback {
                guard let described = manifest.feedback, described.feedbackID == header.feedback.feedbackID, described.uid == header.feedback.uid,
                    described.text == header.feedback.text, described.createdAt == Timestamp(microseconds: header.feedback.createdAtUs).rfc3339
                else { throw ExportError(.payloadInvalid, "the manifest's feedback differs from the upload header's") }
                let f = manifest.filter
                guard f.uid == header.feedback.uid, f.since != nil, f.until != nil, (f.types ?? []).isEmpty, (f.levels ?? []).isEmpty, (f.text ?? "").isEmpty else {
                    throw ExportError(.payloadInvalid, "a feedback's manifest selects its uid in a time range and nothing else")
                }
            } else {
                guard manifest.commandID == uploadID else {
                    throw ExportError(.payloadInvalid, "the manifest names command \(manifest.commandID ?? "none"), not \(uploadID)")
                }
                if let selection, !manifest.filter.selectsTheSame(as: selection) {
                    throw ExportError(.payloadInvalid, "the manifest's filter is not the pull's (\(Self.describe(manifest.filter)) instead of \(Self.describe(selection)))")
                }
            }
        }
        var zip = ""
        var payload: ExtractedPayload?
        do {
            // Unpacked while it arrived: what is left is the held chunks a resumed upload's
            // stream has not caught up with yet, checking the manifest and moving the files
            // into place. If that did not work out, the whole zip is unpacked below, which decides.
            assembler.catchUp()
            if assembler.streamedEverything, let stream = assembler.stream {
                defer { assembler.endStream() }
                do {
                    payload = try stream.finish(into: destination, check: check)
                    zip = stream.zipPath
                } catch let error as ExportError where error.code == .exists {
                    zip = stream.zipPath
                    throw error
                } catch {
                    logger.notice("unpacking while receiving did not finish; unpacking the whole zip", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
                    stream.discard()
                }
            } else if let stream = assembler.stream {
                logger.notice("unpacking while receiving stopped; unpacking the whole zip", metadata: ["upload.id": "\(uploadID)", "error": "\(stream.failure.map { "\($0)" } ?? "")"])
                stream.discard()
                assembler.endStream()
            }
            if payload == nil {
                // A name of this connection's own: an older connection of the same agent
                // may still be finishing the same upload.
                zip = try paths.inside(assembler.directory + "/payload-" + Hex.encode(secureRandomBytes(4)) + ".zip")
                try assembler.assemble(to: zip)
                payload = try PayloadExtractor.extract(zip: zip, into: destination, limits: isFeedback ? feedbackPayloadLimits : limits, check: check)
            }
        } catch let error as ExportError where error.code == .exists {
            // Unpacked before, and the server stopped before recording it: adopt it if it is
            // this upload's; never replace it.
            payload = try adopt(destination, uploadID: uploadID, isFeedback: isFeedback, error: error)
        }
        guard let payload else { throw ExportError(.io, "no payload") }
        do {
            if !zip.isEmpty && FileManager.default.fileExists(atPath: zip) {
                if FileManager.default.fileExists(atPath: zipCopy) { try FileManager.default.removeItem(atPath: zipCopy) }
                try FileManager.default.moveItem(atPath: zip, toPath: zipCopy)
            }
        } catch {
            logger.warning("could not keep the zip beside the files", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
        }
        return payload
    }

    private static func describe(_ f: ExportManifest.FilterDescription) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return bounded((try? encoder.encode(f)).map { String(decoding: $0, as: UTF8.self) } ?? "?")  // only for the detail text
    }

    private var feedbackPayloadLimits: PayloadLimits {
        var l = limits
        l.maxTotalBytes = min(l.maxTotalBytes, feedbackLimits.maxUnpackedBytes)
        return l
    }

    /// A destination that already exists is this upload's finished result only if its manifest
    /// says so (same upload, kind and agent); anything else is refused and left alone.
    private func adopt(_ destination: String, uploadID: String, isFeedback: Bool, error: ExportError) throws -> ExtractedPayload {
        guard let bytes = FileManager.default.contents(atPath: destination + "/" + PayloadLimits.manifestName),
            let manifest = try? JSONDecoder().decode(ExportManifest.self, from: bytes),
            manifest.uploadID == uploadID, manifest.agentID == agentID, manifest.kind == (isFeedback ? "feedback" : "pull")
        else { throw error }
        return ExtractedPayload(manifest: manifest, files: manifest.days.map { destination + "/" + $0.file }.sorted(), directory: destination)
    }

    private func error(_ code: WireErrorCode, _ uploadID: String, _ detail: String) -> WireFrame {
        .with { $0.error = .with { $0.code = code; $0.detail = detail; $0.fatal = false; $0.uploadID = WireID.echo(uploadID) } }
    }

    /// An agent's free text, cut to a size fit for a status line.
    static func bounded(_ text: String) -> String { text.utf8.count <= 1024 ? text : String(decoding: text.utf8.prefix(1024), as: UTF8.self) + "…" }
}

/// The frame that ends handling of an upload frame early: a refusal, or an earlier result.
struct Refusal: Error {
    let frame: WireFrame
    init(_ frame: WireFrame) { self.frame = frame }
}
