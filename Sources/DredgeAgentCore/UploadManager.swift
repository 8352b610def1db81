import Crypto
import DredgeEnvelope
import DredgeExport
import DredgeStore
import DredgeWire
import Foundation
import Logging
import NIOCore
import SwiftProtobuf

/// The agent's pulls and uploads, across connections: admits commands (``PullAdmission``),
/// exports off the connection's path, and drives one ``UploadSenderStateMachine`` per upload,
/// resuming them on every new connection. Nothing here blocks the connection: heartbeats and
/// new commands keep flowing while exports and uploads run.
actor UploadManager {
    struct Active {
        var sender: UploadSenderStateMachine
        var upload: SealedUpload
    }

    private var admission: PullAdmission
    private var uploads: [String: Active] = [:]
    /// Feedback the server failed to take on its side; retried on the next connection.
    private var parked: Set<String> = []
    private var outbound: NIOAsyncChannelOutboundWriter<WireFrame>?
    private let store: LogStore?
    private let state: AgentState
    private let logger: Logger

    init(state: AgentState, store: LogStore?, logger: Logger) throws {
        self.state = state
        self.store = store
        self.logger = logger
        let seenPath = state.directory + "/seen-commands.json"
        let seen = FileManager.default.contents(atPath: seenPath).flatMap { try? JSONDecoder().decode([String: Int64].self, from: $0) } ?? [:]
        admission = PullAdmission(
            agentID: state.file.agentID,
            serverKey: try CommandVerifier(rawRepresentation: Hex.decode(state.file.serverSigningKey) ?? []),
            agentKey: state.key, seen: seen)
    }

    /// Picks up the uploads a previous run left unfinished (`uploads/<id>/`): the accepted
    /// command is kept there (its key wrapped under this agent's key), and, once exported, the
    /// zip and the upload header. Unexported ones are exported again.
    func recover() {
        let root = state.directory + "/uploads"
        for id in ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).sorted() where !id.hasPrefix(".") {
            let dir = root + "/" + id
            if FileManager.default.fileExists(atPath: dir + "/feedback-key.bin") {
                adoptFeedback(id)
                continue
            }
            guard let bytes = FileManager.default.contents(atPath: dir + "/command.pb"),
                let command = try? WirePullCommand(serializedBytes: bytes),
                let key = try? state.key.unwrapKey(command.wrappedKey),
                let filter = try? LogFilter(wire: command.filter)
            else {
                logger.warning("dropping an unreadable unfinished upload", metadata: ["upload.id": "\(id)"])
                try? FileManager.default.removeItem(atPath: dir)
                continue
            }
            if let headerBytes = FileManager.default.contents(atPath: dir + "/header.pb"),
                let header = try? WireUploadHeader(serializedBytes: headerBytes),
                let upload = try? SealedUpload(zipPath: dir + "/export.zip", header: header, key: key)
            {
                logger.info("resuming upload", metadata: ["upload.id": "\(id)"])
                uploads[id] = Active(sender: UploadSenderStateMachine(header: header), upload: upload)
            } else {
                logger.info("exporting again", metadata: ["upload.id": "\(id)"])
                export(PullAdmission.Accepted(commandID: command.commandID, filter: filter, key: key, expiresAt: Timestamp(microseconds: command.expiresAtUs)))
            }
        }
    }

    /// Picks up feedback uploads that appeared in the outbox (from ``Feedback/submit`` in this
    /// process or another, such as `dredge-agent feedback`) and starts them if connected.
    func rescanOutbox() async throws {
        for id in Feedback.pending(stateDirectory: state.directory) where uploads[id] == nil && !parked.contains(id) {
            adoptFeedback(id)
            if uploads[id] != nil, outbound != nil { try await perform(id, uploads[id]!.sender.resume()) }
        }
    }

    private func adoptFeedback(_ id: String) {
        let dir = state.directory + "/uploads/" + id
        guard let headerBytes = FileManager.default.contents(atPath: dir + "/header.pb"),
            let header = try? WireUploadHeader(serializedBytes: headerBytes),
            let wrapped = FileManager.default.contents(atPath: dir + "/feedback-key.bin"),
            let key = try? state.key.unwrapKey(wrapped),
            let upload = try? SealedUpload(zipPath: dir + "/export.zip", header: header, key: key)
        else {
            logger.warning("dropping an unreadable feedback upload", metadata: ["upload.id": "\(id)"])
            try? FileManager.default.removeItem(atPath: dir)
            return
        }
        logger.info("feedback upload queued", metadata: ["upload.id": "\(id)"])
        uploads[id] = Active(sender: UploadSenderStateMachine(header: header), upload: upload)
    }

    /// A connection is ready: send through it, and resume every unfinished upload.
    func connected(_ writer: NIOAsyncChannelOutboundWriter<WireFrame>) async throws {
        outbound = writer
        parked.removeAll()
        for id in Feedback.pending(stateDirectory: state.directory) where uploads[id] == nil { adoptFeedback(id) }
        for id in uploads.keys.sorted() {
            try await perform(id, uploads[id]!.sender.resume())
        }
    }

    func disconnected() {
        outbound = nil
        for id in uploads.keys { uploads[id]!.sender.connectionLost() }
    }

    /// A frame for the command and upload layer.
    func receive(_ frame: WireFrame) async throws {
        switch frame.body {
        case .pullCommand(let command)?:
            try await admit(command)
        case .uploadReady(let m)?: try await route(m.uploadID, frame)
        case .chunkAck(let m)?: try await route(m.uploadID, frame)
        case .uploadStatus(let m)?: try await route(m.uploadID, frame)
        case .uploadResult(let m)?: try await route(m.uploadID, frame)
        case .error(let e)? where !e.uploadID.isEmpty: try await route(e.uploadID, frame)
        default: break
        }
    }

    private func admit(_ command: WirePullCommand) async throws {
        let decision = admission.admit(command)
        saveSeen()
        try await outbound?.write(decision.frame(commandID: command.commandID))
        guard case .accept(let accepted) = decision else {
            if case .reject(let reason, let detail) = decision {
                logger.notice("pull command rejected", metadata: ["command.id": "\(command.commandID)", "reason": "\(reason)", "detail": "\(detail)"])
            }
            return
        }
        logger.info("pull command accepted", metadata: ["command.id": "\(accepted.commandID)"])
        // Keep the command until the upload ends, so a restart can finish it.
        let directory = state.directory + "/uploads/" + accepted.commandID
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try AgentState.write(try command.serializedBytes(), to: directory + "/command.pb", mode: 0o600)
        export(accepted)
    }

    private func export(_ accepted: PullAdmission.Accepted) {
        guard let store else { return }
        let directory = state.directory + "/uploads/" + accepted.commandID
        let agentID = state.file.agentID
        // Export off the connection's path.
        Task.detached { [logger] in
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                let zip = directory + "/export.zip"
                let manifest = try Exporter.export(
                    from: store, ExportRequest(uploadID: accepted.commandID, kind: .pull, agentID: agentID, commandID: accepted.commandID, filter: accepted.filter),
                    to: zip)
                let upload = try SealedUpload(
                    zipPath: zip, uploadID: accepted.commandID, kind: .pull, agentID: agentID, key: accepted.key, empty: manifest.empty,
                    createdAt: Timestamp.now.microseconds)
                try AgentState.write(try upload.header.serializedBytes(), to: directory + "/header.pb", mode: 0o600)
                logger.info("export ready", metadata: ["upload.id": "\(accepted.commandID)", "records": "\(manifest.recordCount)", "chunks": "\(upload.header.chunkCount)"])
                try await self.start(upload)
            } catch {
                logger.error("export failed", metadata: ["upload.id": "\(accepted.commandID)", "error": "\(error)"])
            }
        }
    }

    private func start(_ upload: SealedUpload) async throws {
        let id = upload.header.uploadID
        uploads[id] = Active(sender: UploadSenderStateMachine(header: upload.header), upload: upload)
        if outbound != nil { try await perform(id, uploads[id]!.sender.resume()) }
    }

    private func route(_ uploadID: String, _ frame: WireFrame) async throws {
        guard uploads[uploadID] != nil else { return }
        try await perform(uploadID, uploads[uploadID]!.sender.receive(frame))
    }

    private func perform(_ uploadID: String, _ actions: [UploadSenderStateMachine.Action]) async throws {
        guard let active = uploads[uploadID] else { return }
        for action in actions {
            switch action {
            case .send(let frame):
                try await outbound?.write(frame)
            case .sendChunk(let index):
                let sealed = try active.upload.chunk(index)
                try await outbound?.write(.with { $0.uploadChunk = .with { $0.uploadID = uploadID; $0.index = index; $0.ciphertext = Data(sealed) } })
            case .finished(let result):
                uploads[uploadID] = nil
                let directory = state.directory + "/uploads/" + uploadID
                // Feedback exists nowhere else: if the server failed on its side (its disk, say),
                // keep it and try again on the next connection. A payload it refused stays refused.
                let refused: Set<WireErrorCode> = [.errorPayloadInvalid, .errorChunkAuthFailed, .errorUploadInvalid]
                if !result.ok, !refused.contains(result.error), FileManager.default.fileExists(atPath: directory + "/feedback-key.bin") {
                    parked.insert(uploadID)
                    logger.warning("feedback upload failed on the server; kept for the next connection", metadata: ["upload.id": "\(uploadID)", "error": "\(result.error)", "detail": "\(result.detail)"])
                    continue
                }
                try? FileManager.default.removeItem(atPath: directory)
                if result.ok {
                    logger.info("upload complete", metadata: ["upload.id": "\(uploadID)", "files": "\(result.files)", "records": "\(result.records)"])
                } else {
                    logger.error("upload failed", metadata: ["upload.id": "\(uploadID)", "error": "\(result.error)", "detail": "\(result.detail)"])
                }
            }
        }
    }

    private func saveSeen() {
        guard let data = try? JSONEncoder().encode(admission.seen) else { return }
        try? AgentState.write(Array(data), to: state.directory + "/seen-commands.json", mode: 0o600)
    }
}
