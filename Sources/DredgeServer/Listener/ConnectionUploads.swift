import DredgeExport
import DredgeStore
import DredgeWire
import Foundation
import Logging

/// The uploads of one agent connection on the server: one ``UploadReceiverStateMachine`` and
/// one ``UploadAssembler`` (on disk, so they survive reconnects and restarts) per upload, and
/// the pull statuses they move.
final class ConnectionUploads {
    let agentID: String
    let pulls: PullStore
    let dataDirectory: String
    let limits: PayloadLimits
    let logger: Logger
    private var receivers: [String: (machine: UploadReceiverStateMachine, assembler: UploadAssembler)] = [:]

    init(agentID: String, pulls: PullStore, dataDirectory: String, limits: PayloadLimits = PayloadLimits(), logger: Logger) {
        self.agentID = agentID
        self.pulls = pulls
        self.dataDirectory = dataDirectory
        self.limits = limits
        self.logger = logger
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
                            try pulls.update(chunk.uploadID, agent: agentID, status: .failed, detail: "chunk \(index) failed authentication")
                        }
                    }
                    for case .send(let f) in next { out.append(f) }
                case .assemble: break
                }
            }
            receivers[chunk.uploadID] = entry
            if !refused {
                try pulls.update(chunk.uploadID, agent: agentID, status: .uploading, chunksReceived: entry.assembler.received.count)
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
        guard header.agentID == agentID, let pull = try pulls.pull(header.uploadID), pull.targets.contains(where: { $0.agentID == agentID }),
            let key = try pulls.key(of: header.uploadID)
        else {
            return [error(.errorUploadInvalid, header.uploadID, "no pull \(header.uploadID) for this agent")]
        }
        if let target = pull.targets.first(where: { $0.agentID == agentID }), target.status == .complete {
            return [.with { $0.uploadResult = .with { $0.uploadID = header.uploadID; $0.ok = true; $0.files = UInt32(target.files.count) } }]
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
        try pulls.update(header.uploadID, agent: agentID, status: .uploading, chunksReceived: receivers[header.uploadID]!.assembler.received.count, chunkCount: Int(header.chunkCount), bytes: Int64(header.plaintextSize))
        var entry = receivers[header.uploadID]!
        let actions = entry.machine.begin(header)
        receivers[header.uploadID] = entry
        return actions.compactMap { if case .send(let f) = $0 { return f } else { return nil } }
    }

    /// Reassemble, decrypt, unpack with limits into `pulls/<pull>/<agent>/`.
    private func finish(_ uploadID: String, _ assembler: UploadAssembler) -> WireUploadResult {
        let zip = assembler.directory + "/payload.zip"
        let destination = "\(dataDirectory)/pulls/\(uploadID)/\(agentID)"
        do {
            try FileManager.default.createDirectory(atPath: "\(dataDirectory)/pulls/\(uploadID)", withIntermediateDirectories: true)
            try assembler.assemble(to: zip)
            let payload = try PayloadExtractor.extract(zip: zip, into: destination, limits: limits)
            try? FileManager.default.copyItem(atPath: zip, toPath: destination + "/../\(agentID).zip")
            try? FileManager.default.removeItem(atPath: assembler.directory)
            let files = (payload.files.map { ($0 as NSString).lastPathComponent } + ["manifest.json"]).map { destination + "/" + $0 }
            try Data(try payload.manifest.encoded()).write(to: URL(fileURLWithPath: destination + "/manifest.json"))
            try pulls.update(uploadID, agent: agentID, status: .complete, detail: "\(payload.manifest.recordCount) records", files: files)
            logger.info("pull complete", metadata: ["pull.id": "\(uploadID)", "agent.id": "\(agentID)", "records": "\(payload.manifest.recordCount)"])
            return .with { $0.uploadID = uploadID; $0.ok = true; $0.files = UInt32(payload.files.count); $0.records = UInt64(payload.manifest.recordCount) }
        } catch {
            let code: WireErrorCode = (error as? ExportError)?.code == .payloadInvalid ? .errorPayloadInvalid : .errorInternal
            try? pulls.update(uploadID, agent: agentID, status: .failed, detail: "\(error)")
            logger.error("pull failed", metadata: ["pull.id": "\(uploadID)", "agent.id": "\(agentID)", "error": "\(error)"])
            return .with { $0.uploadID = uploadID; $0.ok = false; $0.error = code; $0.detail = "\(error)" }
        }
    }

    private func error(_ code: WireErrorCode, _ uploadID: String, _ detail: String) -> WireFrame {
        .with { $0.error = .with { $0.code = code; $0.detail = detail; $0.fatal = false; $0.uploadID = uploadID } }
    }
}
