import Crypto
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeReception
import DredgeWire
import Foundation
import Logging
import NIOPosix
import Synchronization

/// The uploads of one agent connection on the server: one ``UploadReceiverStateMachine`` and
/// one ``UploadAssembler`` (on disk, so they survive reconnects and restarts) per upload, and
/// the pull, feedback or capture statuses they move. It routes each upload frame: a header to
/// ``UploadAdmission``, chunks through the ``ChunkPipeline``, the last step to
/// ``UploadFinisher``, and answers to commands to ``PullOutcomes``.
///
/// Every id that arrives is checked (``WireID``) before it is looked up or becomes part of a
/// path, and paths come from ``DataDirectory`` only. A final status (complete, rejected,
/// failed, expired) is never changed by anything the agent sends afterwards.
///
/// The statuses are read and moved through the async stores; everything that waits on a disk
/// or costs CPU (chunk verification and durable writes, RSA, the last steps of an upload) runs
/// on `blocking`, a ``ServerWork`` pool. One frame is handled at a time (the connection hands
/// over the next only when the last is answered); chunks are written and committed on pool
/// threads meanwhile, so the receivers are under a ``Mutex`` (never held across a wait).
final class ConnectionUploads: Sendable {
    let agentID: String
    let services: ConnectionServices
    let limits: PayloadLimits
    private var paths: DataDirectory { services.paths }
    private var feedbackLimits: FeedbackLimits { services.feedbackLimits }
    private var logger: Logger { services.logger }
    /// Where uploads are unpacked while they arrive; nil: each is unpacked after its last chunk.
    private var unpacking: PayloadStream.Schedule? { services.work.unpacking }
    /// Where the blocking steps run.
    private var blocking: NIOThreadPool { services.work.uploads }
    let statuses: UploadStatuses
    let admission: UploadAdmission
    let finisher: UploadFinisher
    let outcomes: PullOutcomes
    /// Where acknowledgements of chunks written after their frame was handled go.
    let emit: @Sendable ([WireFrame]) -> Void
    /// Chunks between arriving and being committed (ordering and back-pressure).
    private let pipeline = ChunkPipeline<ChunkKey, Result<Data, any Error>>(capacity: ConnectionUploads.maxChunksInFlight)
    /// Status moves recorded in order, off the committing thread, each batch's frames sent once
    /// its moves are recorded.
    private let recordings: SerialRunner<[Recording]>
    /// Landed uploads' chunk directories, removed one after another.
    private let removals: SerialRunner<[(directory: String, uploadID: String)]>
    /// The uploads open on this connection: chunks are committed on pool threads while the
    /// connection reads on.
    private let state = Mutex(State())

    private struct State {
        var receivers: [String: Receiver] = [:]
        /// Per upload, the `chunks_received` last queued for writing (the committer's).
        var recordedCount: [String: Int] = [:]
        /// Uploads begun on this connection that are not pulls: feedback and captures (the steps').
        var deviceUploads: [String: UploadOwner] = [:]
    }

    private typealias Receiver = (machine: UploadReceiverStateMachine, assembler: UploadAssembler)

    private func receiver(_ id: String) -> Receiver? { state.withLock { $0.receivers[id] } }
    private func owner(_ id: String) -> UploadOwner { state.withLock { $0.deviceUploads[id] ?? .pull } }

    /// - Parameter triggers: the agent's triggers on this connection (nil: `triggers` not agreed,
    ///   and captures are refused).
    init(
        agentID: String, services: ConnectionServices, triggers: ConnectionTriggers? = nil, limits: PayloadLimits = PayloadLimits(),
        emit: @escaping @Sendable ([WireFrame]) -> Void
    ) {
        self.agentID = agentID
        self.services = services
        self.emit = emit
        self.limits = limits
        let statuses = UploadStatuses(agentID: agentID, pulls: services.pulls, feedback: services.feedback, captures: services.triggers)
        self.statuses = statuses
        let (logger, blocking) = (services.logger, services.work.uploads)
        recordings = SerialRunner(empty: []) { batch in
            for recording in batch {
                for (id, owner, move) in recording.moves {
                    do {
                        try await statuses.move(id, owner, to: move.status, detail: move.detail, chunksReceived: move.chunksReceived, failedWith: move.failedWith)
                    } catch {
                        logger.error("could not record an upload's progress", metadata: ["upload.id": "\(id)", "error": "\(error)"])
                    }
                }
                if !recording.frames.isEmpty { emit(recording.frames) }
            }
            return .next
        }
        removals = SerialRunner(empty: []) { batch in
            for (directory, uploadID) in batch {
                do {
                    try await blocking.runIfActive { try FileManager.default.removeItem(atPath: directory) }
                } catch {
                    logger.warning("could not remove a finished upload's chunks", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
                }
            }
            return .next
        }
        admission = UploadAdmission(agentID: agentID, services: services, triggers: triggers)
        finisher = UploadFinisher(agentID: agentID, services: services, statuses: statuses, limits: limits)
        outcomes = PullOutcomes(agentID: agentID, pulls: services.pulls, logger: services.logger)
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
            try await outcomes.accepted(m)
            return []
        case .commandRejected(let m)?:
            try await outcomes.rejected(m)
            return []
        case .error(let e)?:
            guard WireID.isValid(e.uploadID), owner(e.uploadID) == .pull else { return [] }
            try await outcomes.failedOnAgent(e)
            return []
        case .uploadBegin(let m)?:
            return try await begin(m.header)
        case .uploadChunk(let chunk)?:
            return try await receive(chunk)
        case .uploadComplete(let m)?:
            // No chunk is in flight (settled above): the step owns the receiver until it puts
            // it back.
            guard var entry = receiver(m.uploadID) else { return [error(.errorUploadUnknown, m.uploadID, "no upload \(m.uploadID) begun on this connection")] }
            var out: [WireFrame] = []
            for action in entry.machine.complete() {
                switch action {
                case .send(let f): out.append(f)
                case .assemble:
                    let finished = await finisher.finish(m.uploadID, entry.assembler, owner(m.uploadID))
                    if let chunks = finished.landedChunks { removeAfterResult(chunks, uploadID: m.uploadID) }
                    for case .send(let f) in entry.machine.assembled(finished.result) { out.append(f) }
                default: break
                }
            }
            let done = entry
            state.withLock { $0.receivers[m.uploadID] = done }
            return out
        case .uploadStatusQuery(let m)?:
            if let entry = receiver(m.uploadID) { return [entry.machine.status()] }
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
        switch try await statuses.recorded(uploadID) {
        case .complete?: status.state = .complete
        case .failed?: status.state = .failed
        case .open?:
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
        var status: UploadStage
        var detail = ""
        var chunksReceived: Int?
        var failedWith: WireErrorCode?
    }

    /// Status moves to record in order, then frames to send.
    private struct Recording: Sendable {
        var moves: [(id: String, owner: UploadOwner, move: Progress)]
        var frames: [WireFrame]
    }

    /// A chunk goes to the `blocking` pool to be verified and written durably, and the next
    /// frame is read at once: up to ``maxChunksInFlight`` chunks of this connection are written
    /// at the same time, since most of a durable write is waiting for fsync. Each chunk is
    /// committed (held, streamed, acknowledged) in the order it arrived once it is written,
    /// by whichever pool thread finishes it (``ChunkPipeline``); its acknowledgement goes out
    /// through ``emit``. Answers that need no write (a chunk held already, a bad index) are
    /// returned at once.
    private func receive(_ chunk: WireUploadChunk) async throws -> [WireFrame] {
        guard receiver(chunk.uploadID) != nil else {
            return [error(.errorUploadUnknown, chunk.uploadID, "no upload \(chunk.uploadID) begun on this connection")]
        }
        services.metrics.chunkReceived(owner(chunk.uploadID).metricsKind, bytes: chunk.ciphertext.count)
        // The node's ingress cap: this connection reads on once its turn has come (its chunk and the frame around it).
        if let ingress = services.ingress { await ingress.admit(agent: agentID, bytes: chunk.ciphertext.count + 48) }
        await pipeline.room()
        var out: [WireFrame] = []
        var failed: Progress?
        let started = state.withLock { state -> (ChunkKey, Data, UploadAssembler)? in
            guard var entry = state.receivers[chunk.uploadID] else { return nil }
            var started: (ChunkKey, Data, UploadAssembler)?
            let wasReceiving = entry.machine.state == .receiving
            for action in entry.machine.chunk(chunk) {
                switch action {
                case .send(let f): out.append(f)
                case .store(let index, let ciphertext):
                    // A chunk sent again while its first copy is being written is answered once.
                    let key = ChunkKey(uploadID: chunk.uploadID, index: index)
                    guard pipeline.admit(key) else { continue }
                    started = (key, ciphertext, entry.assembler)
                case .assemble: break
                }
            }
            // Recorded when this chunk ended the upload, not for every chunk sent after it.
            if wasReceiving, case .finished(let result) = entry.machine.state, !result.ok, result.error == .errorChunkInvalid {
                failed = Progress(status: .failed, detail: result.detail, failedWith: .errorChunkInvalid)
            }
            state.receivers[chunk.uploadID] = entry
            return started
        }
        if let (key, ciphertext, assembler) = started {
            // Set before any chunk is written, cleared only after `settled()`.
            let streaming = assembler.stream != nil
            blocking.submit { state in
                var outcome: Result<Data, any Error> =
                    state == .active
                    ? Result { try assembler.write(index: key.index, ciphertext: ciphertext) }
                    : .failure(ExportError(.io, "the server is stopping"))
                // Without a stream the plaintext is not needed once written.
                if !streaming, case .success = outcome { outcome = .success(Data()) }
                self.pipeline.written(key, outcome) { self.commit($0) }
            }
        }
        if let failed {
            record([(chunk.uploadID, failed)])
        }
        // Answers given at once (a chunk past the upload's end, which ends it; a chunk held
        // already) wait for the status moves before them: the agent never hears of an end that
        // is not recorded yet (see ``commit(_:)``).
        if !out.isEmpty { await recordings.idle() }
        return out
    }

    /// Chunks written at once per connection, at most: the agent's window. Each holds its
    /// ciphertext until written, then its plaintext until committed when the upload streams
    /// (at most 2 MiB a chunk at the largest chunk size).
    static let maxChunksInFlight = 8

    private struct ChunkKey: Hashable, Sendable {
        var uploadID: String
        var index: UInt32
    }

    /// Waits until every chunk that arrived is committed and its status recorded: every other
    /// upload frame sees the chunks before it.
    func settled() async {
        await pipeline.idle()
        await recordings.idle()
        await removals.idle()
    }

    /// Removes a landed upload's chunks while its result goes out, after the removals asked
    /// before. Removing an 80 MB upload's 300 chunk files took 45 ms, two thirds of the time
    /// between its last chunk and its result. ``settled()`` waits for it, so the connection's
    /// next upload frame, and its end (and so the server's shutdown), come after it.
    private func removeAfterResult(_ directory: String, uploadID: String) {
        removals.ask { $0.append((directory, uploadID)) }
    }

    /// Chunks whose writes are done, in arrival order (on the one committing pool thread): each
    /// through its upload's machine and assembler; then their acknowledgements go out and their
    /// status moves are recorded.
    private func commit(_ batch: [(key: ChunkKey, outcome: Result<Data, any Error>)]) {
        var frames: [WireFrame] = []
        var moves: [(String, Progress)] = []
        for (key, outcome) in batch { commit(key, outcome, frames: &frames, moves: &moves) }
        if moves.contains(where: { $0.1.status == .failed }) {
            // A refusal that ends an upload goes out once it is recorded: an agent that
            // hears it and begins the upload again, on any connection, is answered the
            // stored result, and whoever asks after the agent heard it sees `failed`.
            record(moves, thenSend: frames)
        } else {
            if !frames.isEmpty { emit(frames) }
            if !moves.isEmpty { record(moves) }
        }
    }

    /// One written (or refused) chunk through its upload's machine and assembler.
    private func commit(_ key: ChunkKey, _ outcome: Result<Data, any Error>, frames: inout [WireFrame], moves: inout [(String, Progress)]) {
        let id = key.uploadID
        let index = key.index
        guard let assembler = receiver(id)?.assembler else { return }
        let next: [UploadReceiverStateMachine.Action]
        switch outcome {
        case .success(let plaintext):
            // An upload that ended meanwhile (a chunk that failed authentication) takes no more.
            guard receiver(id)?.machine.state == .receiving else { return }
            assembler.commit(index: index, plaintext: plaintext)
            let held = assembler.received.count
            let total = Int(assembler.header.chunkCount)
            let (stored, due) = state.withLock { state in
                let stored = state.receivers[id]?.machine.stored(index) ?? []
                let due = held == total || held - (state.recordedCount[id] ?? 0) >= Self.chunksPerStatusWrite
                if due { state.recordedCount[id] = held }
                return (stored, due)
            }
            next = stored
            if due { moves.append((id, Progress(status: .uploading, chunksReceived: held))) }
        case .failure(let error):
            if let e = error as? ExportError {
                logger.warning("chunk refused", metadata: ["upload.id": "\(id)", "index": "\(index)", "error": "\(e)"])
            }
            let (code, move) = Self.refusal(of: error, index: index)
            next = state.withLock { $0.receivers[id]?.machine.rejected(index, code) ?? [] }
            // A chunk refused after its upload ended answers nothing and records nothing.
            if !next.isEmpty { moves.append((id, move)) }
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
        // Which kind each upload is, read here: `deviceUploads` changes only in a step that
        // waits for the recordings first (``settled()``).
        let recording = state.withLock { state in
            Recording(moves: moves.map { ($0.0, state.deviceUploads[$0.0] ?? .pull, $0.1) }, frames: frames)
        }
        recordings.ask { $0.append(recording) }
    }

    /// An upload header: admitted (``UploadAdmission``), its assembler opened over the chunks
    /// already on disk, and its status recorded uploading; or the frame that answers it instead.
    private func begin(_ header: WireUploadHeader) async throws -> [WireFrame] {
        let key: SymmetricKey
        switch try await admission.admit(header) {
        case .answered(let frame): return [frame]
        case .admitted(let admitted): key = admitted
        }
        let owner = UploadOwner(header.kind)
        if owner != .pull { state.withLock { $0.deviceUploads[header.uploadID] = owner } }
        if receiver(header.uploadID) == nil, let refused = try await blocking.runIfActive({ self.open(header, key: key) }) {
            return [refused]
        }
        guard let entry = receiver(header.uploadID) else { return [] }
        try await statuses.move(
            header.uploadID, owner, to: .uploading, chunksReceived: entry.assembler.received.count,
            chunkCount: Int(header.chunkCount), bytes: Int64(clamping: header.plaintextSize))
        let actions = state.withLock { $0.receivers[header.uploadID]?.machine.begin(header) ?? [] }
        return actions.compactMap { if case .send(let f) = $0 { return f } else { return nil } }
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
        startStreaming(assembler, UploadOwner(header.kind))
        let receiver = (UploadReceiverStateMachine(header: header, received: assembler.received), assembler)
        state.withLock { $0.receivers[header.uploadID] = receiver }
        return nil
    }

    /// Starts unpacking an upload while it arrives, in a directory of this connection's own
    /// inside the upload's (what an earlier connection left there is removed). Without it the
    /// upload is unpacked after its last chunk, as it is when streaming fails.
    ///
    /// An upload resumed after a reconnect or a restart streams too: the chunks it holds are
    /// read back a few with each chunk that arrives (``UploadAssembler/catchUp(budget:)``), not
    /// while the agent waits for Ready, and what is left after the last chunk by the finisher.
    private func startStreaming(_ assembler: UploadAssembler, _ owner: UploadOwner) {
        guard let unpacking else { return }
        let fm = FileManager.default
        do {
            for name in try fm.contentsOfDirectory(atPath: assembler.directory) where name.hasPrefix("stream-") {
                try fm.removeItem(atPath: try paths.inside(assembler.directory + "/" + name))
            }
            let name = "stream-" + Hex.encode(secureRandomBytes(8))
            let stream = try PayloadStream(
                staging: try paths.inside(assembler.directory + "/" + name), zipPath: try paths.inside(assembler.directory + "/" + name + ".zip"),
                limits: owner == .pull ? limits : feedbackLimits.payloadLimits(within: limits), schedule: unpacking)
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
        let receivers = state.withLock { state in
            defer { state.receivers.removeAll() }
            return state.receivers
        }
        for (_, entry) in receivers {
            entry.assembler.stream?.discard()
            entry.assembler.endStream()
        }
    }

    private func error(_ code: WireErrorCode, _ uploadID: String, _ detail: String) -> WireFrame {
        UploadAdmission.error(code, uploadID, detail)
    }

    /// An agent's free text, cut to a size fit for a status line.
    static func bounded(_ text: String) -> String { text.utf8.count <= 1024 ? text : String(decoding: text.utf8.prefix(1024), as: UTF8.self) + "…" }
}
