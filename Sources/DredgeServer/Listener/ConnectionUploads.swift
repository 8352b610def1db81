import Crypto
import DredgeAdminAPI
import DredgeEnvelope
import DredgeExport
import DredgeStore
import DredgeWire
import Foundation
import Logging

/// The uploads of one agent connection on the server: one ``UploadReceiverStateMachine`` and
/// one ``UploadAssembler`` (on disk, so they survive reconnects and restarts) per upload, and
/// the pull or feedback statuses they move.
final class ConnectionUploads {
    let agentID: String
    let pulls: PullStore
    let feedback: FeedbackStore
    let encryptionKey: RSAPrivateKey
    let dataDirectory: String
    let limits: PayloadLimits
    let logger: Logger
    private var receivers: [String: (machine: UploadReceiverStateMachine, assembler: UploadAssembler)] = [:]
    /// Uploads begun on this connection that are feedback, not pulls.
    private var feedbackUploads: Set<String> = []

    init(
        agentID: String, pulls: PullStore, feedback: FeedbackStore, encryptionKey: RSAPrivateKey, dataDirectory: String,
        limits: PayloadLimits = PayloadLimits(), logger: Logger
    ) {
        self.agentID = agentID
        self.pulls = pulls
        self.feedback = feedback
        self.encryptionKey = encryptionKey
        self.dataDirectory = dataDirectory
        self.limits = limits
        self.logger = logger
    }

    /// Moves the status of the pull (for this agent) or the feedback an upload belongs to.
    private func progress(_ uploadID: String, _ status: PullStatus, detail: String = "", chunksReceived: Int? = nil, chunkCount: Int? = nil, bytes: Int64? = nil, records: Int? = nil, files: [String]? = nil) throws {
        if feedbackUploads.contains(uploadID) {
            try feedback.update(uploadID, status: status, detail: detail, chunksReceived: chunksReceived, records: records, files: files)
        } else {
            try pulls.update(uploadID, agent: agentID, status: status, detail: detail, chunksReceived: chunksReceived, chunkCount: chunkCount, bytes: bytes, files: files)
        }
    }

    /// Handles an upload frame; returns the frames to send back.
    func handle(_ frame: WireFrame) throws -> [WireFrame] {
        switch frame.body {
        case .commandAccepted(let m)?:
            try pulls.update(m.commandID, agent: agentID, status: .exporting)
            return []
        case .commandRejected(let m)?:
            try pulls.update(m.commandID, agent: agentID, status: .rejected, detail: "\(m.reason): \(m.detail)")
            logger.notice("pull rejected by agent", metadata: ["pull.id": "\(m.commandID)", "agent.id": "\(agentID)", "reason": "\(m.reason)"])
            return []
        case .uploadBegin(let m)?:
            return try begin(m.header)
        case .uploadChunk(let chunk)?:
            guard var entry = receivers[chunk.uploadID] else { return [error(.errorUploadUnknown, chunk.uploadID, "no upload \(chunk.uploadID) begun on this connection")] }
            var out: [WireFrame] = []
            var refused = false
            for action in entry.machine.chunk(chunk) {
                switch action {
                case .send(let f): out.append(f)
                case .store(let index, let ciphertext):
                    let next: [UploadReceiverStateMachine.Action]
                    do {
                        try entry.assembler.accept(index: index, ciphertext: ciphertext)
                        next = entry.machine.stored(index)
                    } catch let e as ExportError {
                        logger.warning("chunk refused", metadata: ["upload.id": "\(chunk.uploadID)", "index": "\(index)", "error": "\(e)"])
                        next = entry.machine.rejected(index, e.code == .chunkAuthFailed ? .errorChunkAuthFailed : .errorInternal)
                        if e.code == .chunkAuthFailed {
                            refused = true
                            try progress(chunk.uploadID, .failed, detail: "chunk \(index) failed authentication")
                        }
                    }
                    for case .send(let f) in next { out.append(f) }
                case .assemble: break
                }
            }
            receivers[chunk.uploadID] = entry
            if !refused {
                try progress(chunk.uploadID, .uploading, chunksReceived: entry.assembler.received.count)
            }
            return out
        case .uploadComplete(let m)?:
            guard var entry = receivers[m.uploadID] else { return [error(.errorUploadUnknown, m.uploadID, "no upload \(m.uploadID) begun on this connection")] }
            var out: [WireFrame] = []
            for action in entry.machine.complete() {
                switch action {
                case .send(let f): out.append(f)
                case .assemble:
                    let result = finish(m.uploadID, entry.assembler)
                    for case .send(let f) in entry.machine.assembled(result) { out.append(f) }
                default: break
                }
            }
            receivers[m.uploadID] = entry
            return out
        case .uploadStatusQuery(let m)?:
            if let entry = receivers[m.uploadID] { return [entry.machine.status()] }
            return [.with { $0.uploadStatus = .with { $0.uploadID = m.uploadID; $0.state = .unknown } }]
        default:
            return []
        }
    }

    private func begin(_ header: WireUploadHeader) throws -> [WireFrame] {
        guard header.agentID == agentID else {
            return [error(.errorUploadInvalid, header.uploadID, "upload \(header.uploadID) names another agent")]
        }
        let key: SymmetricKey
        switch header.kind {
        case .feedback:
            switch try admitFeedback(header) {
            case .failure(let refusal): return [refusal.frame]
            case .success(let k): key = k
            }
        default:
            guard let pull = try pulls.pull(header.uploadID), pull.targets.contains(where: { $0.agentID == agentID }),
                let k = try pulls.key(of: header.uploadID)
            else {
                return [error(.errorUploadInvalid, header.uploadID, "no pull \(header.uploadID) for this agent")]
            }
            if let target = pull.targets.first(where: { $0.agentID == agentID }), target.status == .complete {
                return [.with { $0.uploadResult = .with { $0.uploadID = header.uploadID; $0.ok = true; $0.files = UInt32(target.files.count) } }]
            }
            key = k
        }
        if receivers[header.uploadID] == nil {
            let assembler: UploadAssembler
            do {
                assembler = try UploadAssembler(directory: "\(dataDirectory)/uploads/\(header.uploadID)-\(agentID)", header: header, key: key)
            } catch let e as ExportError {
                return [error(.errorUploadInvalid, header.uploadID, e.message)]
            }
            receivers[header.uploadID] = (UploadReceiverStateMachine(header: header, received: assembler.received), assembler)
        }
        try progress(header.uploadID, .uploading, chunksReceived: receivers[header.uploadID]!.assembler.received.count, chunkCount: Int(header.chunkCount), bytes: Int64(header.plaintextSize))
        var entry = receivers[header.uploadID]!
        let actions = entry.machine.begin(header)
        receivers[header.uploadID] = entry
        return actions.compactMap { if case .send(let f) = $0 { return f } else { return nil } }
    }

    /// A feedback upload's key (unwrapped with the server's encryption key), after checking the
    /// header; or the frame that refuses it, or answers it if it was already received.
    private func admitFeedback(_ header: WireUploadHeader) throws -> Result<SymmetricKey, FeedbackRefusal> {
        let id = header.uploadID
        let f = header.feedback
        guard header.hasFeedback, f.feedbackID == id, !f.uid.isEmpty, f.uid.utf8.count <= 256, !f.text.isEmpty, f.text.utf8.count <= 16 * 1024 else {
            return .failure(FeedbackRefusal(error(.errorUploadInvalid, id, "feedback header incomplete or over its limits")))
        }
        let key: SymmetricKey
        do {
            key = try encryptionKey.unwrapKey(header.wrappedKey)
        } catch {
            return .failure(FeedbackRefusal(self.error(.errorUploadInvalid, id, "the feedback key does not unwrap with this server's key")))
        }
        if let existing = try feedback.feedback(id) {
            guard existing.agentID == agentID else { return .failure(FeedbackRefusal(error(.errorUploadInvalid, id, "feedback \(id) belongs to another agent"))) }
            if existing.status == .complete {
                return .failure(FeedbackRefusal(.with { $0.uploadResult = .with { $0.uploadID = id; $0.ok = true; $0.files = UInt32(max(0, existing.files.count - 1)); $0.records = UInt64(existing.records) } }))
            }
        } else {
            try feedback.begin(id: id, agentID: agentID, uid: f.uid, text: f.text, createdAt: Timestamp(microseconds: f.createdAtUs), chunkCount: Int(header.chunkCount), bytes: Int64(header.plaintextSize))
            logger.info("feedback upload begun", metadata: ["feedback.id": "\(id)", "agent.id": "\(agentID)", "uid": "\(f.uid)"])
        }
        feedbackUploads.insert(id)
        return .success(key)
    }

    /// Reassemble, decrypt, unpack with limits into `pulls/<pull>/<agent>/` or `feedback/<id>/`.
    private func finish(_ uploadID: String, _ assembler: UploadAssembler) -> WireUploadResult {
        let zip = assembler.directory + "/payload.zip"
        let isFeedback = feedbackUploads.contains(uploadID)
        let parent = isFeedback ? "\(dataDirectory)/feedback" : "\(dataDirectory)/pulls/\(uploadID)"
        let destination = isFeedback ? "\(parent)/\(uploadID)" : "\(parent)/\(agentID)"
        let what = isFeedback ? "feedback" : "pull"
        do {
            try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true)
            try assembler.assemble(to: zip)
            let payload = try PayloadExtractor.extract(zip: zip, into: destination, limits: limits)
            guard payload.manifest.uploadID == uploadID, payload.manifest.kind == (isFeedback ? "feedback" : "pull") else {
                try? FileManager.default.removeItem(atPath: destination)
                throw ExportError(.payloadInvalid, "the manifest describes another upload (\(payload.manifest.kind) \(payload.manifest.uploadID))")
            }
            try? FileManager.default.copyItem(atPath: zip, toPath: destination + (isFeedback ? ".zip" : "/../\(agentID).zip"))
            try? FileManager.default.removeItem(atPath: assembler.directory)
            let files = (payload.files.map { ($0 as NSString).lastPathComponent } + ["manifest.json"]).map { destination + "/" + $0 }
            try Data(try payload.manifest.encoded()).write(to: URL(fileURLWithPath: destination + "/manifest.json"))
            try progress(uploadID, .complete, detail: "\(payload.manifest.recordCount) records", records: payload.manifest.recordCount, files: files)
            logger.info("\(what) complete", metadata: ["upload.id": "\(uploadID)", "agent.id": "\(agentID)", "records": "\(payload.manifest.recordCount)"])
            return .with { $0.uploadID = uploadID; $0.ok = true; $0.files = UInt32(payload.files.count); $0.records = UInt64(payload.manifest.recordCount) }
        } catch {
            let code: WireErrorCode = (error as? ExportError)?.code == .payloadInvalid ? .errorPayloadInvalid : .errorInternal
            try? progress(uploadID, .failed, detail: "\(error)")
            logger.error("\(what) failed", metadata: ["upload.id": "\(uploadID)", "agent.id": "\(agentID)", "error": "\(error)"])
            return .with { $0.uploadID = uploadID; $0.ok = false; $0.error = code; $0.detail = "\(error)" }
        }
    }

    private func error(_ code: WireErrorCode, _ uploadID: String, _ detail: String) -> WireFrame {
        .with { $0.error = .with { $0.code = code; $0.detail = detail; $0.fatal = false; $0.uploadID = uploadID } }
    }
}

/// The frame that ends a feedback upload's begin early: a refusal, or the earlier result.
struct FeedbackRefusal: Error {
    let frame: WireFrame
    init(_ frame: WireFrame) { self.frame = frame }
}
