import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeStore
import DredgeWire
import Foundation
import Logging

/// A capture's upload, made ready in the agent's outbox (Protocol § 21, *The window*, *The
/// capture's header*, *The payload*): the window's records exported with a manifest that names
/// the trigger and the record that fired it, sealed under a new key wrapped with the server's
/// encryption key, as a feedback's is (``Feedback``), and placed in the ``DeviceOutbox``: it
/// appears whole, survives restarts, and is sent by the ``UploadManager`` like a feedback.
public enum CaptureExport {
    /// Writes `capture` to the outbox of `state`; returns false when it was there already (a
    /// capture written before a restart that did not record it).
    @discardableResult
    public static func write(_ capture: CapturePlanner.Planned, state: AgentState, store: LogStore, now: Timestamp = .now) throws -> Bool {
        let id = capture.captureID
        let root = state.directory + "/uploads"
        if FileManager.default.fileExists(atPath: root + "/" + id) { return false }
        let serverKey = try RSAPublicKey(spki: Hex.decode(state.file.serverEncryptionKey) ?? [])
        try DeviceOutbox.place(id, what: "capture", state: state) { building in
            let matchedAt = Timestamp(microseconds: capture.matchedAtUs)
            var match: JSONValue?
            if !capture.crash {
                // The record that fired it: gone from the store (its retention), the server would refuse the capture.
                guard let row = capture.matchedRow, let record = try matchRecord(row: row, in: store) else {
                    throw AgentError("the record that fired capture \(id) is no longer in the store")
                }
                match = record
            }
            let description = ExportManifest.CaptureDescription(
                triggerID: capture.triggerID, setVersion: capture.setVersion, crash: capture.crash, matchedAt: matchedAt.rfc3339, match: match)
            let zip = building + "/export.zip"
            let manifest = try Exporter.export(
                from: store,
                ExportRequest(
                    uploadID: id, kind: .capture, agentID: state.file.agentID,
                    filter: LogFilter(
                        since: Timestamp(microseconds: capture.sinceUs), until: Timestamp(microseconds: capture.untilUs), uid: capture.uid.isEmpty ? nil : capture.uid),
                    capture: description, createdAt: now),
                to: zip)
            let key = SymmetricKey.uploadKey()
            let upload = try SealedUpload(
                zipPath: zip, uploadID: id, kind: .capture, agentID: state.file.agentID, key: key, wrappedKey: try serverKey.wrapKey(key),
                capture: .with {
                    $0.triggerID = capture.triggerID
                    $0.setVersion = capture.setVersion
                    $0.uid = capture.uid
                    $0.sinceUs = capture.sinceUs
                    $0.untilUs = capture.untilUs
                    $0.matchedAtUs = capture.matchedAtUs
                    $0.crash = capture.crash
                },
                empty: manifest.empty, createdAt: now.microseconds, chunkSize: DeviceOutbox.chunkBytes)
            return (upload, key)
        }
        return true
    }

    /// The record at `row` as a § 13 record object (what the capture's manifest names as the
    /// record that fired it).
    static func matchRecord(row: Int64, in store: LogStore) throws -> JSONValue? {
        guard let record = try store.records(after: row - 1, matching: LogFilter(), limit: 1).first, record.id == row else { return nil }
        var object: [String: JSONValue] = [
            "ts": .string(record.timestamp.rfc3339), "level": .string(record.level.name), "type": .string(record.type.rawValue), "uid": .string(record.uid),
            "message": .string(record.message), "context": .integer(record.context.rawValue),
        ]
        if record.metadataJSON != "{}", let metadata = try? JSONDecoder().decode(JSONValue.self, from: Data(record.metadataJSON.utf8)) {
            object["metadata"] = metadata
        }
        return .object(object)
    }
}

/// The agent's standing triggers (#54, Protocol § 21): the set it holds (``HeldTriggers``,
/// durable), what the server sends (``receive(_:serverKeys:now:)``), and the matching of what
/// its store takes (``step(now:heartbeatAt:)``, off every app's logging path), which says which
/// captures are due: the caller exports each (``CaptureExport``, off this actor) and says so
/// (``exported(_:)``).
///
/// What is saved: the set and the planner at each change; how far matching has read, at most
/// every ``cursorSaveInterval`` (read again after a crash, a record inside a window already
/// made makes no second capture).
public actor TriggerAgent {
    private var held: HeldTriggers
    private let directory: String
    private let agentID: String
    private let store: LogStore
    private let logger: Logger
    /// When the cursor was last saved.
    private var cursorSaved = ContinuousClock.now
    /// When the runs were last looked at for crashes.
    private var crashesLooked = ContinuousClock.now
    /// How many times the runs were looked at for crashes (for tests: an event to wait on).
    public private(set) var crashLooks = 0

    public static let cursorSaveInterval: Duration = .seconds(60)
    /// How long a capture waits after the apps were asked to freeze their rewind buffers (they
    /// look about once a second).
    public static let freezeWait: Duration = .milliseconds(1_500)
    /// How often the runs of the store's apps are looked at for unclean ends.
    public static let crashInterval: Duration = .seconds(2)

    /// Crash captures (Protocol § 21, *Crashes*): the runs of the store's apps that ended
    /// uncleanly (their process gone without closing its run: killed, crashed) are marked so
    /// (their rewind buffers frozen into the store, as the app's next run would), and each one
    /// not looked at before fires each crash trigger held since before it ended whose scope
    /// holds its last record (its uid, its context's app and version): a capture of the
    /// minutes before that record.
    private func lookForCrashes(_ next: inout HeldTriggers, now: Timestamp) throws {
        let crashRules = next.rules.filter(\.crash)
        guard let version = next.version, !crashRules.isEmpty else { return }
        defer { crashLooks += 1 }
        // Runs whose buffer this agent cannot read (an app of another user) are left for the
        // app's next run to mark, with what its buffer holds; found marked then.
        let ends = try store.markUncleanEnds(now: now, onlyReadable: true)
        for problem in ends.problems { logger.debug("looking for crashed runs", metadata: ["problem": "\(problem)"]) }
        // Only runs that ended while a crash trigger was held.
        let since = Timestamp(microseconds: crashRules.compactMap { next.heldAtUs[$0.id] }.min() ?? now.microseconds)
        let runs = try store.uncleanRuns(endedSince: since)
        let seen = next.runsSeen ?? []
        for run in runs where !seen.contains(run.id) {
            guard let endedAt = run.endedAt, let last = try lastRecord(of: run, at: endedAt) else { continue }
            let context = try store.contexts([run.context])[run.context]
            for rule in crashRules
            where endedAt.microseconds >= (next.heldAtUs[rule.id] ?? .max) && rule.fires(onCrashOf: last.uid, app: context?.app ?? "", appVersion: context?.appVersion ?? "")
            {
                if let planned = next.planner.consider(
                    rule, setVersion: version, firedAtUs: endedAt.microseconds, uid: last.uid, row: nil, crash: true, now: now, newID: { Hex.encode(secureRandomBytes(16)) })
                {
                    logger.info("a run ended uncleanly: crash capture", metadata: ["run": "\(run.id)", "pid": "\(run.pid)", "capture.id": "\(planned.captureID)"])
                }
            }
        }
        // Remembered while they are listed (ended since the oldest crash trigger was held).
        next.runsSeen = Set(runs.map(\.id))
    }

    /// A run's last record: of its context, at the time it ended.
    private func lastRecord(of run: StoreRun, at endedAt: Timestamp) throws -> LogRecord? {
        try store.records(matching: LogFilter(since: endedAt, until: endedAt.adding(.microseconds(1)))).last { $0.context == run.context }
    }

    /// Reads what the agent held (none when the file does not read: said, and the server sends
    /// the set again on the next connection). A capture pending in the file whose upload is in
    /// the outbox already (written before a stop that did not record it) is pending no more.
    public init(state: AgentState, store: LogStore, logger: Logger) {
        directory = state.directory
        agentID = state.file.agentID
        self.store = store
        self.logger = logger
        var loaded: HeldTriggers
        do {
            loaded = try HeldTriggers.load(from: state.directory)
        } catch {
            logger.error("the held triggers do not read; starting with none", metadata: ["error": "\(error)"])
            loaded = HeldTriggers()
        }
        let written = loaded.planner.pending.filter { FileManager.default.fileExists(atPath: state.directory + "/uploads/" + $0.captureID) }
        for capture in written { loaded.planner.finished(capture.captureID) }
        if !written.isEmpty {
            do { try loaded.save(in: state.directory) } catch { logger.warning("cannot save the held triggers", metadata: ["error": "\(error)"]) }
        }
        held = loaded
    }

    /// The triggers of the set held now, in its order (empty: none).
    public var holding: [String] { held.rules.map(\.id) }

    /// How far matching has read the store (its row id).
    public var cursor: Int64 { held.cursor }

    /// Captures of `triggerID` this device made in the last day (its budget's count).
    public func madeToday(_ triggerID: String, now: Timestamp = .now) -> Int { held.planner.madeToday(triggerID, now: now) }

    /// Captures planned and not in the outbox yet.
    public var pending: [CapturePlanner.Planned] { held.planner.pending }

    /// Whether a set with triggers is held (matching then runs often).
    public var isMatching: Bool { !held.rules.isEmpty }

    /// A set from the server: checked (``TriggerSetAdmission``), held durably when admitted, and
    /// answered. A set that cannot be saved is refused (`REJECT_INVALID`, the reason said): the
    /// agent keeps the one it held.
    public func receive(_ set: WireTriggerSet, serverKeys: PinnedServerKeys, now: Timestamp = .now) -> WireFrame {
        let decision = TriggerSetAdmission.admit(set, agentID: agentID, serverKeys: serverKeys, heldIssuedAtUs: held.issuedAtUs, now: now)
        guard case .hold(let rules) = decision else {
            if case .reject(let reason, let detail) = decision {
                logger.warning("trigger set refused", metadata: ["version": "\(set.version)", "reason": "\(reason)", "detail": "\(detail)"])
            }
            return decision.ack(for: set)
        }
        var next = held
        do {
            next.hold(set, rules: rules, storeEnd: try store.lastRowID(), now: now)
            try next.save(in: directory)
        } catch {
            logger.error("cannot keep the trigger set; keeping the one held", metadata: ["error": "\(error)"])
            return TriggerSetAdmission.Decision.reject(.rejectInvalid, "the agent cannot keep the set now: \(error)").ack(for: set)
        }
        held = next
        cursorSaved = .now
        logger.info("trigger set held", metadata: ["version": "\(set.version)", "triggers": "\(rules.count)"])
        return decision.ack(for: set)
    }

    /// Matches what the store took since the last step, and returns the captures due: their
    /// window closed, and a heartbeat sent after it and after they were planned named their
    /// user to the server (`heartbeatAt`: when the last heartbeat that read the store was
    /// made; nil before any). Saves what changed.
    public func step(now: Timestamp = .now, heartbeatAt: Timestamp?) throws -> [CapturePlanner.Planned] {
        var next = held
        // A store made anew (its rows numbered from 1 again): matching starts over from its end.
        let end = try store.lastRowID()
        if end < next.cursor {
            logger.warning("the store is new; matching starts from its end", metadata: ["cursor": "\(next.cursor)", "end": "\(end)"])
            next.restart(at: end)
        }
        // At most a few batches a step: a backlog is caught up over the next steps.
        var planned = 0
        for _ in 0..<8 {
            let cursor = next.cursor
            planned += try TriggerMatcher.step(&next, store: store, now: now) { Hex.encode(secureRandomBytes(16)) }.count
            if next.cursor == cursor { break }
        }
        if ContinuousClock.now - crashesLooked >= Self.crashInterval {
            crashesLooked = .now
            do {
                try lookForCrashes(&next, now: now)
            } catch {
                // Looked at again at the next interval; the matching above stands.
                logger.warning("cannot look for crashed runs now", metadata: ["error": "\(error)"])
            }
        }
        // A capture of a record whose window closed: the apps freeze their rewind buffers
        // (§ 21, Rewind) and it waits ``freezeWait`` for them, so it holds the debug records
        // of its whole window. (Asked at the match too: a small buffer may not hold the window
        // by the time it closes.)
        let closed = next.planner.due(now: now).filter { !$0.crash && $0.freezeAskedAtUs == nil }
        if !closed.isEmpty { next.planner.askedFreeze(Set(closed.map(\.captureID)), now: now) }
        try keep(next)
        if planned > 0 || !closed.isEmpty {
            do { try store.requestRewindFreeze() } catch { logger.warning("cannot ask the apps to freeze their rewind buffers", metadata: ["error": "\(error)"]) }
        }
        guard let heartbeatAt else { return [] }
        let frozenBy = now.microseconds - Int64(Self.freezeWait.components.seconds) * 1_000_000 - Self.freezeWait.components.attoseconds / 1_000_000_000_000
        return next.planner.due(now: now).filter { capture in
            heartbeatAt.microseconds > max(capture.untilUs, capture.plannedAtUs ?? 0)
                && (capture.crash || (capture.freezeAskedAtUs.map { $0 <= frozenBy } ?? false))
        }
    }

    /// A capture is in the outbox, or given up: no longer pending (it stays counted).
    public func exported(_ captureID: String) throws {
        var next = held
        next.planner.finished(captureID)
        try keep(next)
    }

    /// The server answered `ERROR_BUDGET_SPENT` for a capture of `triggerID`: quiet for an hour.
    public func budgetSpent(_ triggerID: String, now: Timestamp = .now) {
        var next = held
        next.planner.budgetSpent(triggerID, now: now)
        do {
            try keep(next)
        } catch {
            logger.warning("cannot save the triggers' quiet hour", metadata: ["error": "\(error)"])
        }
        logger.notice("the server's budget for a trigger is spent; no capture of it for an hour", metadata: ["trigger.id": "\(triggerID)"])
    }

    /// Holds `next` and saves it: at once when more than the cursor changed, else at most
    /// every ``cursorSaveInterval`` (and never with no set held). Held in memory even when the
    /// save fails: matching the same records again would plan their captures twice.
    private func keep(_ next: HeldTriggers) throws {
        var same = next
        same.cursor = held.cursor
        let onlyCursor = same == held
        guard next != held else { return }
        held = next
        if onlyCursor && (next.set == nil || ContinuousClock.now - cursorSaved < Self.cursorSaveInterval) { return }
        try next.save(in: directory)
        cursorSaved = .now
    }
}
