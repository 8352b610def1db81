import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeStore
import DredgeWire
import Foundation

/// Feedback uploads: a user's report ("the oven didn't turn off") with the logs that explain it,
/// sent without anyone asking.
///
/// `submit` records the feedback in the store (type `feedback`), exports the last `days` of the
/// uid's records, seals the zip under a key made here and wrapped under the server's encryption
/// key, and leaves it in the agent's outbox: `STATE/uploads/<id>/` with the header, the zip
/// and the key wrapped under the agent's own key. The directory appears whole (it is built
/// beside and renamed), survives restarts, and is removed only when the server has confirmed
/// the upload; the server answers an upload id it already completed with its result, so a
/// feedback is never stored twice.
public enum Feedback {
    public static let logType: LogType = "feedback"
    public static let defaultDays = 3
    /// The longest feedback text accepted, in bytes.
    public static let maxTextBytes = DomainLimits.feedbackTextBytes

    /// Prepares a feedback upload in the outbox; returns its id. A running agent sends it when
    /// connected (at once if it is this process's ``AgentClient``; within seconds otherwise).
    @discardableResult
    public static func submit(uid: String, text: String, days: Int = defaultDays, state: AgentState, store: LogStore, now: Timestamp = .now) throws -> String {
        if let problem = UserID.problem(uid) { throw AgentError("feedback needs a valid uid: \(problem)") }
        if let problem = FeedbackText.problem(text) { throw AgentError(problem) }
        guard (1...30).contains(days) else { throw AgentError("feedback covers 1 to 30 days") }
        let serverKey = try RSAPublicKey(spki: Hex.decode(state.file.serverEncryptionKey) ?? [])
        let id = Hex.encode(secureRandomBytes(16))

        // The feedback itself goes into the store, so it is in the export and stays on the device.
        // Under the device's own context (its newest record's), so the feedback does not rename
        // the device to the agent when the agent next describes it to the server.
        let context = try store.register(try store.newestContext() ?? .current(app: "dredge-agent"))
        store.enqueue(LogEntry(timestamp: now, level: .info, type: logType, uid: uid, message: text, metadata: ["feedback_id": .string(id)], context: context))
        try store.flush()

        try DeviceOutbox.place(id, what: "feedback", state: state) { building in
            let description = ExportManifest.FeedbackDescription(feedbackID: id, uid: uid, text: text, createdAt: now.rfc3339)
            let zip = building + "/export.zip"
            let manifest = try Exporter.export(
                from: store,
                ExportRequest(
                    uploadID: id, kind: .feedback, agentID: state.file.agentID,
                    filter: LogFilter(since: now.subtracting(.seconds(Int64(days) * 86_400)), until: now.adding(.seconds(1)), uid: uid),
                    feedback: description, createdAt: now),
                to: zip)
            let key = SymmetricKey.uploadKey()
            let upload = try SealedUpload(
                zipPath: zip, uploadID: id, kind: .feedback, agentID: state.file.agentID, key: key,
                wrappedKey: try serverKey.wrapKey(key),
                feedback: .with { $0.feedbackID = id; $0.uid = uid; $0.text = text; $0.createdAtUs = now.microseconds },
                empty: manifest.empty, createdAt: now.microseconds, chunkSize: DeviceOutbox.chunkBytes)
            return (upload, key)
        }
        return id
    }

    /// The feedback uploads (and captures) waiting in the outbox of a state directory.
    public static func pending(stateDirectory: String) -> [String] {
        let root = stateDirectory + "/uploads"
        return ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).filter {
            !$0.hasPrefix(".") && FileManager.default.fileExists(atPath: root + "/" + $0 + "/feedback-key.bin")
        }.sorted()
    }
}

/// The outbox of the uploads a device makes by itself (feedback, captures): `STATE/uploads/<id>/`
/// with the header, the zip and the upload's key wrapped under the agent's own key, which
/// ``UploadManager`` sends (it picks up each directory holding `feedback-key.bin`).
enum DeviceOutbox {
    /// The chunk size of a device's own uploads: smaller than a pull's (§ 11's default), so that
    /// an upload paced by the device's policy (``UploadPolicy/maxBytesPerSecond``) goes out
    /// evenly (a second of a 64 KiB/s cap at a time).
    static let chunkBytes = 65_536

    /// Builds upload `id` in `.<id>.partial` beside the outbox (`build` exports and seals into
    /// the directory it is given: the zip as `export.zip`) and moves it in whole, durably; on
    /// failure nothing is left. `what` names it in the error.
    static func place(_ id: String, what: String, state: AgentState, build: (_ directory: String) throws -> (SealedUpload, SymmetricKey)) throws {
        let root = state.directory + "/uploads"
        let building = root + "/.\(id).partial"
        try? FileManager.default.removeItem(atPath: building)  // a build a crash cut short: made again below
        try FileManager.default.createDirectory(atPath: building, withIntermediateDirectories: true)
        do {
            let (upload, key) = try build(building)
            try AgentState.write(try upload.header.serializedBytes(), to: building + "/header.pb", mode: 0o600)
            try AgentState.write(try state.key.publicKey.wrapKey(key), to: building + "/feedback-key.bin", mode: 0o600)
            guard rename(building, root + "/" + id) == 0 else { throw AgentError("cannot move the \(what) into the outbox: \(String(cString: strerror(errno)))") }
            try DurableFile.syncDirectory(root)
        } catch {
            try? FileManager.default.removeItem(atPath: building)
            throw error
        }
    }
}
