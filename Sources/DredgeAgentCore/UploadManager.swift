import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
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
        /// An engineer marked the pull urgent: the upload policy lets it by when it says so.
        var urgent = false
    }

    private var admission: PullAdmission
    private var uploads: [String: Active] = [:]
    /// The delay before the next retry of an upload the server could not take now.
    private var retryDelays: [String: Duration] = [:]
    private var retryTasks: [String: Task<Void, Never>] = [:]
    /// The connection while it is ready; frames go out through its machine.
    private var outbound: AgentConnection?
    private let store: LogStore?
    /// The agent's state; its file changes when the server's keys roll over.
    private var state: AgentState
    private let logger: Logger
    /// Where exports run, a bounded number at a time.
    let exports: ExportExecutor
    /// Told of each capture the server refused over a budget (`ERROR_BUDGET_SPENT`), with its
    /// trigger (``TriggerAgent/budgetSpent(_:now:)``).
    private var budgetSpent: (@Sendable (String) async -> Void)?
    /// The device's upload policy and what it holds back (``Politeness``).
    var politeness: Politeness

    func whenBudgetSpent(_ hook: @escaping @Sendable (String) async -> Void) { budgetSpent = hook }

    /// The first retry's delay; it doubles up to ``maxRetryDelay``.
    let firstRetryDelay: Duration
    static let maxRetryDelay: Duration = .seconds(300)
    /// Exports of one command started (across restarts) before it is given up as failing.
    static let maxExportAttempts = 3

    /// Exports run at once by default; a command beyond them is answered `REJECT_BUSY`.
    static let defaultMaxExports = 2

    init(
        state: AgentState, store: LogStore?, logger: Logger, firstRetryDelay: Duration = .seconds(5), maxExports: Int = UploadManager.defaultMaxExports,
        heldPullKeepAlive: Duration = WireLimits.pullQuietPeriod / 3
    ) throws {
        self.heldPullKeepAlive = heldPullKeepAlive
        self.state = state
        self.exports = ExportExecutor(capacity: maxExports)
        self.store = store
        self.logger = logger
        self.firstRetryDelay = firstRetryDelay
        politeness = Politeness(stateDirectory: state.directory, logger: logger)
        let seen = Self.loadSeen(state.directory + "/seen-commands.json", logger: logger)
        admission = PullAdmission(
            agentID: state.file.agentID,
            serverKeys: try PinnedServerKeys(state.file),
            agentKey: state.key, seen: seen)
    }

    /// The agent's state as it is now (the server keys it pins included).
    var currentState: AgentState { state }

    /// The server keys the agent pins now (what a tail command is checked against, as a pull's).
    func pinnedServerKeys() throws -> PinnedServerKeys { try admission.serverKeys ?? PinnedServerKeys(state.file) }

    /// The generation of the server's keys the agent says it pins (0: not known, README § Key rotation).
    var keyGeneration: Int { admission.serverKeys?.said ?? 0 }

    /// Takes the server's announcements of new keys (README § Key rotation): checked, written
    /// to `agent.json`, and used for commands and feedback from now on. Returns the generation
    /// pinned now. Throws (taking nothing) when one does not hold up, or the file cannot be
    /// written.
    @discardableResult
    func adoptKeys(_ announcements: [WireKeyAnnouncement], now: Timestamp = .now) throws -> Int {
        let current = try admission.serverKeys ?? PinnedServerKeys(state.file)
        let next = try current.adopting(announcements, now: now)
        guard next.generation != current.generation || next.isGenerationKnown != current.isGenerationKnown || next.previous.map({ $0.retiresAtUs }) != current.previous.map({ $0.retiresAtUs })
        else { return current.said }
        var file = state.file
        next.write(into: &file)
        var updated = state
        updated.file = file
        try updated.saveFile()
        state = updated
        admission.serverKeys = next
        if next.generation != current.generation {
            logger.notice("pinned the server's new keys", metadata: ["generation": "\(next.generation)", "was": "\(current.said)"])
        }
        return next.said
    }

    /// Picks up the uploads a previous run left unfinished (`uploads/<id>/`): the accepted
    /// command is kept there (its key wrapped under this agent's key), and, once exported, the
    /// zip and the upload header. Each saved command is checked again first: one that no longer
    /// admits (invalid, or expired before its export was made), or whose export was started
    /// ``maxExportAttempts`` times without finishing (it crashed the agent, say), is reported
    /// to the server as failed and never run again.
    func recover() {
        let root = state.directory + "/uploads"
        for id in ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).sorted() where !id.hasPrefix(".") {
            let dir = root + "/" + id
            guard WireID.isValid(id) else {
                logger.warning("removing an unfinished upload with a malformed name", metadata: ["name": "\(id.prefix(80))"])
                removeDirectory(dir)
                continue
            }
            if FileManager.default.fileExists(atPath: dir + "/" + Self.failureFile) { continue }  // reported on the next connection
            if FileManager.default.fileExists(atPath: dir + "/feedback-key.bin") {
                adoptFeedback(id)
                continue
            }
            guard let bytes = FileManager.default.contents(atPath: dir + "/command.pb"),
                let command = try? WirePullCommand(serializedBytes: bytes), command.commandID == id,
                let key = try? state.key.unwrapKey(command.wrappedKey)
            else {
                recordFailure(id, "the saved command could not be read again")
                continue
            }
            let filter: LogFilter
            do {
                guard Timestamp.acceptedRange.contains(command.expiresAtUs) else { throw AgentError("expires_at_us is outside 1970–9999") }
                filter = try PullAdmission.filter(of: command)
            } catch {
                recordFailure(id, "the saved command is invalid: \(error)")
                continue
            }
            if let headerBytes = FileManager.default.contents(atPath: dir + "/header.pb"),
                let header = try? WireUploadHeader(serializedBytes: headerBytes),
                let upload = try? SealedUpload(zipPath: dir + "/export.zip", header: header, key: key)
            {
                logger.info("resuming upload", metadata: ["upload.id": "\(id)"])
                uploads[id] = Active(sender: UploadSenderStateMachine(header: header), upload: upload, urgent: command.urgent)
                continue
            }
            if Timestamp.now.microseconds >= command.expiresAtUs {
                recordFailure(id, "the command expired before its export finished")
                continue
            }
            logger.info("exporting again", metadata: ["upload.id": "\(id)"])
            exports.reserveAnyway()
            export(PullAdmission.Accepted(commandID: command.commandID, filter: filter, key: key, expiresAt: Timestamp(microseconds: command.expiresAtUs), urgent: command.urgent))
        }
    }

    /// The file in `uploads/<id>/` that says the command failed here and why, until the server
    /// has been told.
    static let failureFile = "failed.txt"

    /// Gives up an accepted command: drops its export, keeps the reason until the server is
    /// told (now if connected, else on the next connection).
    private func recordFailure(_ id: String, _ reason: String) {
        logger.error("pull failed on this agent", metadata: ["upload.id": "\(id)", "reason": "\(reason)"])
        uploads[id] = nil
        // A redelivery of the command gets the failure again, not a second export.
        admission.rememberFailure(id, String(reason.prefix(1024)), until: Timestamp.now.adding(.seconds(86_400)).microseconds)
        saveSeen()
        let (dir, logger) = (state.directory + "/uploads/" + id, logger)
        // On the steps thread, after the seen commands saved above; ``reportFailures()`` waits
        // for it.
        exports.step {
            do {
                try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
                for name in (try FileManager.default.contentsOfDirectory(atPath: dir)) where name != Self.failureFile {
                    try FileManager.default.removeItem(atPath: dir + "/" + name)
                }
                try AgentState.write(Array(reason.utf8.prefix(1024)), to: dir + "/" + Self.failureFile, mode: 0o600)
            } catch {
                logger.error("could not record a failed pull; dropping it", metadata: ["upload.id": "\(id)", "error": "\(error)"])
                Self.removeDirectory(dir, logger: logger)
            }
        }
    }

    /// Tells the server about every command that failed here, then forgets them.
    private func reportFailures() async throws {
        let root = state.directory + "/uploads"
        let failures: [(id: String, reason: String)]
        do {
            // Read on the steps thread, after the failures recorded before it and never beside
            // one being written; the directories are removed there too, in turn.
            failures = try await exports.blocking { Self.recordedFailures(in: root) }
        } catch {
            return  // the agent is stopping: the next start reports them
        }
        for (id, reason) in failures {
            guard let outbound else { return }
            try await outbound.send(PullAdmission.Decision.failure(id, reason))
            let (dir, logger) = (root + "/" + id, logger)
            exports.step { Self.removeDirectory(dir, logger: logger) }
        }
    }

    /// The commands that failed here and why (`failed.txt` in their directories), by id.
    private static func recordedFailures(in root: String) -> [(id: String, reason: String)] {
        let ids = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).sorted().filter { WireID.isValid($0) }  // no uploads yet: none
        return ids.compactMap { id in
            FileManager.default.contents(atPath: root + "/" + id + "/" + failureFile).map { (id, String(decoding: $0, as: UTF8.self)) }
        }
    }

    private func removeDirectory(_ dir: String) { Self.removeDirectory(dir, logger: logger) }

    private static func removeDirectory(_ dir: String, logger: Logger) {
        do { try FileManager.default.removeItem(atPath: dir) } catch { logger.warning("could not remove \(dir)", metadata: ["error": "\(error)"]) }
    }

    /// Picks up feedback uploads and captures that appeared in the outbox (from ``Feedback/submit`` in this
    /// process or another, such as `dredge-agent feedback`) and starts them if connected.
    func rescanOutbox() async throws {
        for id in Feedback.pending(stateDirectory: state.directory) where uploads[id] == nil {
            adoptFeedback(id)
            if outbound != nil { try await drive(id) { $0.resume() } }
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
            removeDirectory(dir)
            return
        }
        logger.info("feedback upload queued", metadata: ["upload.id": "\(id)"])
        uploads[id] = Active(sender: UploadSenderStateMachine(header: header), upload: upload)
    }

    /// A connection is ready: send through it, and resume every unfinished upload.
    func connected(_ connection: AgentConnection) async throws {
        outbound = connection
        try await reportFailures()
        for id in Feedback.pending(stateDirectory: state.directory) where uploads[id] == nil { adoptFeedback(id) }
        for id in uploads.keys.sorted() {
            try await drive(id) { $0.resume() }
        }
        logger.info("uploads resumed on the new connection", metadata: ["uploads": "\(uploads.count)"])
    }

    func disconnected() {
        outbound = nil
        for id in uploads.keys { uploads[id]?.sender.connectionLost() }
        paced.removeAll()
        pacing?.cancel()
        pacing = nil
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

    /// Answers a pull command and, when accepted, starts its export.
    ///
    /// A command the agent already knows (the server redelivers one whose answer it never got)
    /// is answered as the first time and not run again: its upload, if still going, resumes
    /// on its own; if it failed here, the failure is reported again.
    private func admit(_ command: WirePullCommand) async throws {
        let id = command.commandID
        let directory = state.directory + "/uploads/" + id
        let known = uploads[id] != nil || FileManager.default.fileExists(atPath: directory)
        // A place for its export is taken before the command is accepted; none free: REJECT_BUSY.
        let reserved = !known && exports.reserve()
        // The checks (a signature, an RSA unwrap) run on the export executor's steps thread,
        // on a copy of the admission; what it comes to is remembered here. (The connection
        // hands over its next frame only once this one is answered.)
        let busy = !known && !reserved
        let trial = admission
        var (decision, evaluated): (PullAdmission.Decision, PullAdmission)
        do {
            (decision, evaluated) = try await exports.blocking {
                var admission = trial
                let decision = admission.admit(command, busy: busy)
                return (decision, admission)
            }
        } catch {
            if reserved { exports.release() }
            throw error
        }
        admission.remember(id, from: evaluated, before: trial)
        if case .accept = decision, known {
            // Known here although not remembered (the agent stopped between keeping the command
            // and saving its memory): the same command, already under way.
            decision = .repeated(PullAdmission.Remembered(expiresAtUs: command.expiresAtUs, answer: .accepted))
        }
        if reserved {
            // The place stays taken only by a command accepted now.
            if case .accept = decision {} else { exports.release() }
        }
        switch decision {
        case .accept(let accepted):
            // Keep the command before answering, so a restart can finish what was accepted
            // (durable writes, on the steps thread).
            do {
                try await exports.blocking {
                    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                    try AgentState.write(try command.serializedBytes(), to: directory + "/command.pb", mode: 0o600)
                }
            } catch {
                await saveSeenOffActor()
                exports.release()
                try await outbound?.send(decision.frame(commandID: id))
                await exportFailed(id, "cannot keep the accepted command: \(error)")
                return
            }
            await saveSeenOffActor()
            do {
                try await outbound?.send(decision.frame(commandID: id))
            } catch {
                // The command is kept: export it anyway (its place is taken), and the next
                // connection answers a redelivery and resumes the upload.
                export(accepted)
                throw error
            }
            logger.info("pull command accepted", metadata: ["command.id": "\(id)"])
            export(accepted)
        case .reject(let reason, let detail):
            await saveSeenOffActor()
            try await outbound?.send(decision.frame(commandID: id))
            logger.notice("pull command rejected", metadata: ["command.id": "\(WireID.echo(id))", "reason": "\(reason)", "detail": "\(detail)"])
        case .repeated:
            logger.info("pull command received again; answering as before", metadata: ["command.id": "\(id)"])
            try await outbound?.send(decision.frame(commandID: id))
        }
    }

    /// Exports an accepted command on ``exports``, in the place reserved for it.
    private func export(_ accepted: PullAdmission.Accepted) {
        let directory = state.directory + "/uploads/" + accepted.commandID
        guard let store else {
            exports.release()
            recordFailure(accepted.commandID, "this agent has no store")
            return
        }
        let agentID = state.file.agentID
        // Export on the export threads, off the connection's path; then back here to upload.
        exports.run { [logger] run in
            guard run else {
                // The agent is stopping: the command stays saved, and the next start exports it.
                logger.notice("export not started: the agent is stopping", metadata: ["upload.id": "\(accepted.commandID)"])
                return
            }
            // The reason to give the command up is the failure's description.
            let outcome: Result<SealedUpload, AgentError>
            if let refusal = Self.countAttempt(in: directory) {
                outcome = .failure(AgentError(refusal))
            } else {
                do {
                    let zip = directory + "/export.zip"
                    let manifest = try Exporter.export(
                        from: store, ExportRequest(uploadID: accepted.commandID, kind: .pull, agentID: agentID, commandID: accepted.commandID, filter: accepted.filter),
                        to: zip)
                    let upload = try SealedUpload(
                        zipPath: zip, uploadID: accepted.commandID, kind: .pull, agentID: agentID, key: accepted.key, empty: manifest.empty,
                        createdAt: Timestamp.now.microseconds)
                    try AgentState.write(try upload.header.serializedBytes(), to: directory + "/header.pb", mode: 0o600)
                    logger.info("export ready", metadata: ["upload.id": "\(accepted.commandID)", "records": "\(manifest.recordCount)", "chunks": "\(upload.header.chunkCount)"])
                    outcome = .success(upload)
                } catch {
                    logger.error("export failed", metadata: ["upload.id": "\(accepted.commandID)", "error": "\(error)"])
                    outcome = .failure(AgentError("export failed: \(error)"))
                }
            }
            Task {
                switch outcome {
                case .success(let upload):
                    do {
                        try await self.start(upload, urgent: accepted.urgent)
                    } catch {
                        // The connection went away: the upload is kept and the next connection resumes it.
                        logger.warning("upload not started now; the next connection resumes it", metadata: ["upload.id": "\(accepted.commandID)", "error": "\(error)"])
                    }
                case .failure(let reason):
                    await self.exportFailed(accepted.commandID, reason.description)
                }
            }
        }
    }

    /// Counts an export attempt in `directory` before it is made (on the export thread): an
    /// export that takes the agent down with it is tried a bounded number of times, not on
    /// every start for ever. The reason to give up instead, or nil.
    private static func countAttempt(in directory: String) -> String? {
        let attemptsPath = directory + "/attempts"
        let attempts = (FileManager.default.contents(atPath: attemptsPath).flatMap { Int(String(decoding: $0, as: UTF8.self)) } ?? 0) + 1
        guard attempts <= maxExportAttempts else { return "the export was started \(maxExportAttempts) times and never finished" }
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try AgentState.write(Array(String(attempts).utf8), to: attemptsPath, mode: 0o600)
        } catch {
            return "cannot prepare the export: \(error)"
        }
        return nil
    }

    private func exportFailed(_ id: String, _ reason: String) async {
        recordFailure(id, reason)
        do { try await reportFailures() } catch { logger.warning("could not report a failed pull now; will on the next connection", metadata: ["upload.id": "\(id)"]) }
    }

    private func start(_ upload: SealedUpload, urgent: Bool) async throws {
        let id = upload.header.uploadID
        uploads[id] = Active(sender: UploadSenderStateMachine(header: upload.header), upload: upload, urgent: urgent)
        if outbound != nil { try await drive(id) { $0.resume() } }
    }

    private func route(_ uploadID: String, _ frame: WireFrame) async throws {
        try await drive(uploadID) { $0.receive(frame) }
    }

    /// Steps the sender of `uploadID`, if it still exists, and carries out what it says.
    private func drive(_ uploadID: String, _ step: (inout UploadSenderStateMachine) -> [UploadSenderStateMachine.Action]) async throws {
        guard var active = uploads[uploadID] else { return }
        let actions = step(&active.sender)
        uploads[uploadID] = active
        try await perform(uploadID, actions)
    }

    private func perform(_ uploadID: String, _ actions: [UploadSenderStateMachine.Action]) async throws {
        guard let active = uploads[uploadID] else { return }
        // The connection these actions were decided for: never carry them over to the next one.
        let writer = outbound
        // The policy as its files say now (another process may have changed them): two stats.
        politeness.refresh()
        for action in actions {
            switch action {
            case .send(let frame) where Self.isBegin(frame) && politeness.governs(active) && active.upload.header.kind != .pull:
                // A device's own upload is begun only once the policy lets it go (beginning
                // opens its lifetime on the server). A pull's beginning goes at once: it is
                // what keeps the pull alive on the server while its chunks wait (§ 10, Deadlines).
                if let writer { queuePolite(.begin, of: uploadID, on: writer) }
            case .send(let frame):
                try await writer?.send(frame)
            case .sendChunk(let index) where politeness.governs(active):
                if let writer { queuePolite(.chunk(index), of: uploadID, on: writer) }
            case .sendChunk(let index):
                // Sealed on the steps thread (AES-GCM over up to 2 MiB), not on the actor.
                let upload = active.upload
                let sealed = try await exports.blocking { try upload.chunk(index) }
                try await writer?.send(.with { $0.uploadChunk = .with { $0.uploadID = uploadID; $0.index = index; $0.ciphertext = Data(sealed) } })
                // Counted toward the day although the policy let it by (urgent, or no policy).
                saveUsage(politeness.spent(Self.frameBytes(.chunk(index), of: upload), now: .now))
            case .finished(let result):
                uploads[uploadID] = nil
                retryDelays[uploadID] = nil
                retryTasks.removeValue(forKey: uploadID)?.cancel()
                removeDirectory(state.directory + "/uploads/" + uploadID)
                if result.ok {
                    logger.info("upload complete", metadata: ["upload.id": "\(uploadID)", "files": "\(result.files)", "records": "\(result.records)"])
                } else if result.error == .errorBudgetSpent, active.upload.header.kind == .capture {
                    // Final, and nothing kept: the capture is dropped, and its trigger quiet for a while.
                    logger.notice("capture refused: the server's budget is spent", metadata: ["upload.id": "\(uploadID)", "detail": "\(result.detail)"])
                    await budgetSpent?(active.upload.header.capture.triggerID)
                } else {
                    logger.error("upload failed", metadata: ["upload.id": "\(uploadID)", "error": "\(result.error)", "detail": "\(result.detail)"])
                }
            case .retryLater(let result):
                // The server cannot take it now (its disk, a quota): keep everything, try again
                // after a growing delay, or on the next connection, whichever comes first.
                // The delay grows once per attempt: the other chunks of the same window, refused
                // with this one, wait for the retry already set (#49: each doubled it, so a
                // full disk for 15 s sent the delay to its 300 s ceiling at once).
                if retryTasks[uploadID] != nil {
                    logger.debug("the server cannot take this chunk either; the retry is already set", metadata: ["upload.id": "\(uploadID)"])
                    continue
                }
                let delay = retryDelays[uploadID] ?? firstRetryDelay
                retryDelays[uploadID] = min(delay * 2, Self.maxRetryDelay)
                logger.warning("the server cannot take the upload now; will retry", metadata: ["upload.id": "\(uploadID)", "error": "\(result.error)", "detail": "\(result.detail)", "in": "\(delay)"])
                let jittered = delay * Double.random(in: 0.75...1.25)
                retryTasks[uploadID]?.cancel()
                retryTasks[uploadID] = Task { [weak self] in
                    do { try await Task.sleep(for: jittered) } catch { return }  // cancelled: a newer retry replaces this one
                    await self?.retry(uploadID)
                }
            }
        }
    }

    // MARK: Polite uploads

    /// A frame of an upload the device's policy governs, waiting for the policy to let it go.
    enum PoliteFrame: Equatable {
        case begin
        case chunk(UInt32)
    }

    private struct Queued {
        /// Its own number: a frame is taken out of the queue by it, never by its place (the
        /// queue changes while the pacer waits).
        var id: UInt64
        var uploadID: String
        var frame: PoliteFrame
        /// The connection it was decided for: dropped if that one is gone.
        var writer: AgentConnection
    }

    /// Governed frames in the order they were decided (one upload after another's chunks).
    private var paced: [Queued] = []
    private var pacing: Task<Void, Never>?
    private var nextQueued: UInt64 = 0
    /// Per held pull, when the server last heard of it from the pacer (``keepHeldPullsAlive()``).
    private var heldPullHeard: [String: ContinuousClock.Instant] = [:]
    /// How often a pull whose chunks the policy holds is begun again, so the server hears of it
    /// (it ends a pull nothing is heard of for PULL_QUIET_PERIOD after its expiry, § 10).
    let heldPullKeepAlive: Duration

    private static func isBegin(_ frame: WireFrame) -> Bool {
        if case .uploadBegin? = frame.body { return true }
        return false
    }

    private func queuePolite(_ frame: PoliteFrame, of uploadID: String, on writer: AgentConnection) {
        guard !paced.contains(where: { $0.uploadID == uploadID && $0.frame == frame && $0.writer === writer }) else { return }
        nextQueued += 1
        paced.append(Queued(id: nextQueued, uploadID: uploadID, frame: frame, writer: writer))
        if pacing == nil { pacing = Task { await self.pace() } }
    }

    /// The policy (or the network) changed: look again now rather than at the next second.
    /// (A held frame is looked at again within ``holdPollInterval``; the pacer is never
    /// cancelled for it: a frame it was sending would be lost to its upload.)
    func policyChanged() {
        politeness.refresh()
        if pacing == nil && !paced.isEmpty { pacing = Task { await self.pace() } }
    }

    /// What the upload policy says of a live tail now (``TailManager/follow(_:counting:)``).
    func tailPoliteness(urgent: Bool) -> TailManager.TailPoliteness {
        politeness.refresh()
        guard politeness.gate.governs(urgent: urgent) else { return TailManager.TailPoliteness() }
        // A tail is live: the day's budget holds it once spent (a batch is small, not a chunk).
        let hold = politeness.hold(bytes: 1, urgent: urgent, now: .now)
        return TailManager.TailPoliteness(hold: hold.map { "\($0)" }, bytesPerSecond: politeness.gate.policy?.maxBytesPerSecond)
    }

    /// Counts bytes sent outside uploads (a live tail's batches) toward the day.
    func countSent(_ bytes: UInt64) {
        saveUsage(politeness.spent(bytes, now: .now))
    }

    /// What the upload policy does now.
    func policyStatus() -> UploadPolicyStatus {
        politeness.refresh()
        return politeness.status(waiting: paced.count)
    }

    /// How long a held frame waits before the files are read again.
    static let holdPollInterval: Duration = .seconds(1)

    /// Sends the queued frames, each when the policy lets it: held (a metered network, the
    /// day's budget spent, a policy that cannot be read) it looks again every second; under
    /// the cap each frame waits for its slot. A frame whose upload ended, or whose connection
    /// is gone, is dropped (the next connection resumes the upload and queues it again).
    private func pace() async {
        while !Task.isCancelled, let head = paced.first {
            guard let active = uploads[head.uploadID], head.writer === outbound, Self.stillWanted(head.frame, by: active.sender) else {
                dequeue(head)
                continue
            }
            politeness.refresh()
            let urgent = active.upload.header.kind == .pull && active.urgent
            let bytes = Self.frameBytes(head.frame, of: active.upload)
            if politeness.governs(active), let hold = politeness.hold(bytes: bytes, urgent: urgent, now: .now) {
                politeness.say(hold)
                await keepHeldPullsAlive()
                do { try await Task.sleep(for: Self.holdPollInterval) } catch { break }
                continue
            }
            politeness.say(nil)
            let now = MonotonicClock.seconds()
            let due = politeness.governs(active) ? politeness.reserve(bytes: bytes, urgent: urgent, monotonic: now) : now
            if due > now {
                do { try await Task.sleep(for: .seconds(due - now)) } catch { break }
                // Looked at again after the wait: the upload, the connection or the policy may have changed.
                guard let again = uploads[head.uploadID], head.writer === outbound, Self.stillWanted(head.frame, by: again.sender) else {
                    dequeue(head)
                    continue
                }
                politeness.refresh()
                if politeness.governs(again), politeness.hold(bytes: bytes, urgent: urgent, now: .now) != nil { continue }
            }
            dequeue(head)
            do {
                switch head.frame {
                case .begin:
                    try await head.writer.send(.with { $0.uploadBegin = .with { $0.header = active.upload.header } })
                case .chunk(let index):
                    let upload = active.upload
                    let sealed = try await exports.blocking { try upload.chunk(index) }
                    try await head.writer.send(.with { $0.uploadChunk = .with { $0.uploadID = head.uploadID; $0.index = index; $0.ciphertext = Data(sealed) } })
                }
                saveUsage(politeness.spent(bytes, now: .now))
            } catch {
                if head.writer === outbound, let still = uploads[head.uploadID], Self.stillWanted(head.frame, by: still.sender) {
                    // Not sent, and still wanted on this connection (a seal that failed, say):
                    // first again after a pause, never dropped while its upload waits for it.
                    logger.warning("a paced frame could not be sent; trying again", metadata: ["upload.id": "\(head.uploadID)", "error": "\(error)"])
                    paced.insert(head, at: 0)
                    do { try await Task.sleep(for: Self.holdPollInterval) } catch { break }
                } else {
                    // The connection is going: the next one resumes the upload and queues it again.
                    logger.debug("a paced frame was not sent", metadata: ["upload.id": "\(head.uploadID)", "error": "\(error)"])
                }
            }
        }
        saveUsage(politeness.spent(0, now: .now, force: true))
        heldPullHeard.removeAll()
        if !Task.isCancelled { pacing = nil }
    }

    private func dequeue(_ queued: Queued) { paced.removeAll { $0.id == queued.id } }

    /// Begins again, every ``heldPullKeepAlive``, each pull whose chunks wait for the policy:
    /// the server hears of it (as of any retried upload, § 10, Deadlines), so a pull held past
    /// its expiry stays open until PULL_EXPIRY_GRACE instead of ending quiet after 15 minutes.
    /// Its chunks already acknowledged are not sent again (the server's bitmap says which).
    private func keepHeldPullsAlive() async {
        let held = Set(paced.filter { uploads[$0.uploadID]?.upload.header.kind == .pull }.map(\.uploadID))
        for id in held.sorted() {
            guard let last = heldPullHeard[id] else {
                heldPullHeard[id] = .now
                continue
            }
            guard ContinuousClock.now - last >= heldPullKeepAlive, outbound != nil else { continue }
            heldPullHeard[id] = .now
            logger.debug("a held pull begun again so the server hears of it", metadata: ["upload.id": "\(id)"])
            do { try await drive(id) { $0.resume() } } catch { logger.debug("a held pull could not be begun again", metadata: ["upload.id": "\(id)", "error": "\(error)"]) }
        }
    }

    private func saveUsage(_ usage: DailyUsage?) {
        guard let usage else { return }
        let (directory, logger) = (state.directory, logger)
        exports.step { Politeness.writeUsage(usage, stateDirectory: directory, logger: logger) }
    }

    /// Whether the sender still waits for `frame` (it was not acknowledged, lost with a
    /// connection, or the upload begun again since).
    private static func stillWanted(_ frame: PoliteFrame, by sender: UploadSenderStateMachine) -> Bool {
        switch frame {
        case .begin: sender.state == .beginning
        case .chunk(let index): sender.state == .sending && sender.inFlight.contains(index)
        }
    }

    /// What a frame counts against the policy: a chunk's sealed bytes and its frame, as they
    /// cross the link (``PoliteGate/wireBytes(payload:)``); a beginning as nothing (it is the
    /// size of a heartbeat).
    private static func frameBytes(_ frame: PoliteFrame, of upload: SealedUpload) -> UInt64 {
        switch frame {
        case .begin: 0
        case .chunk(let index): PoliteGate.wireBytes(payload: UInt64(upload.cipher.plaintextSize(ofChunk: index) + WireLimits.tagBytes + 48))
        }
    }

    /// Resumes an upload waiting after ``UploadSenderStateMachine/Action/retryLater(_:)``,
    /// if still waiting and connected.
    private func retry(_ uploadID: String) async {
        retryTasks[uploadID] = nil
        guard outbound != nil, uploads[uploadID]?.sender.state == .suspended else { return }
        logger.info("retrying an upload the server could not take", metadata: ["upload.id": "\(uploadID)"])
        do {
            try await drive(uploadID) { $0.resume() }
        } catch {
            logger.warning("retrying an upload failed; the next connection resumes it", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
        }
    }

    /// ``saveSeen()``, and returns once the write is done. The write is handed to the steps
    /// thread here, on the actor, before the wait: saves are written in the order asked.
    private func saveSeenOffActor() async {
        let seen = admission.seen
        let (path, logger) = (state.directory + "/seen-commands.json", logger)
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            exports.step {
                Self.writeSeen(seen, to: path, logger: logger)
                done.resume()
            }
        }
    }

    /// ``saveSeenOffActor()`` without waiting for the write (from code that cannot wait); in
    /// the same order as the others, on the same thread.
    private func saveSeen() {
        let seen = admission.seen
        let (path, logger) = (state.directory + "/seen-commands.json", logger)
        exports.step { Self.writeSeen(seen, to: path, logger: logger) }
    }

    /// Writes the memory of seen commands durably. A failure is logged: the commands are still
    /// answered, but after a restart one delivered again would be run again.
    private static func writeSeen(_ seen: [String: PullAdmission.Remembered], to path: String, logger: Logger) {
        do {
            try AgentState.write(Array(try JSONEncoder().encode(seen)), to: path, mode: 0o600)
        } catch {
            logger.error("cannot save the memory of seen commands", metadata: ["error": "\(error)"])
        }
    }

    /// The saved memory of seen commands; empty, with an error logged, when it is unreadable.
    static func loadSeen(_ path: String, logger: Logger) -> [String: PullAdmission.Remembered] {
        guard let data = FileManager.default.contents(atPath: path) else { return [:] }
        do {
            return try JSONDecoder().decode([String: PullAdmission.Remembered].self, from: data)
        } catch {
            logger.error("the memory of seen commands is unreadable; starting without it", metadata: ["path": "\(path)", "error": "\(error)"])
            return [:]
        }
    }
}
