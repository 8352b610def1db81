import Crypto
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeWire
import Foundation
import Logging
import NIOPosix

/// Whether an upload may begin, and with which key. The header is checked (its agent, its
/// cipher parameters); a pull must be this agent's and still open (one that finished, or
/// failed with a code, is answered its result again); a feedback must be complete, within its
/// limits and within this agent's quotas, and is recorded as begun.
///
/// A pull's key comes from the ``CommandIssuer``, which usually still holds it from making or
/// delivering the command: no RSA private-key operation in the usual case. A feedback's key,
/// wrapped by the agent under the server's key, is unwrapped. Both run on the blocking pool.
struct UploadAdmission: Sendable {
    enum Verdict {
        /// The upload may begin (or go on) with this key.
        case admitted(SymmetricKey)
        /// The frame that answers the header instead: a refusal, or an earlier result.
        case answered(WireFrame)
    }

    let agentID: String
    let services: ConnectionServices
    /// The agent's triggers on this connection: nil unless it agreed to `triggers` (a capture
    /// is then refused).
    let triggers: ConnectionTriggers?

    private var pulls: any PullQueue { services.pulls }
    private var feedback: any FeedbackInbox { services.feedback }
    private var issuer: CommandIssuer { services.issuer }
    private var feedbackLimits: FeedbackLimits { services.feedbackLimits }
    private var paths: DataDirectory { services.paths }
    private var blocking: NIOThreadPool { services.work.uploads }
    private var logger: Logger { services.logger }

    func admit(_ header: WireUploadHeader) async throws -> Verdict {
        guard header.agentID == agentID else {
            return .answered(Self.error(.errorUploadInvalid, header.uploadID, "upload \(header.uploadID) names another agent"))
        }
        do {
            try ChunkCipher.validate(header)
        } catch {
            return .answered(Self.error(.errorUploadInvalid, header.uploadID, "\(error)"))
        }
        // The header's own time, of either kind, is a § 5 time (#49: a feedback header's was begun).
        guard Timestamp.acceptedRange.contains(header.createdAtUs) else {
            return .answered(Self.error(.errorUploadInvalid, header.uploadID, "the header's created_at_us is outside 1970–9999"))
        }
        // A capture (Protocol § 21) is bound into the header of its own kind only: on another
        // kind it would be bound into nothing.
        guard header.kind == .capture || !header.hasCapture else {
            return .answered(Self.error(.errorUploadInvalid, header.uploadID, "only a capture's header carries a capture"))
        }
        switch header.kind {
        case .feedback: return try await admitFeedback(header)
        case .pull: return try await admitPull(header)
        case .capture: return try await admitCapture(header)
        default:
            return .answered(Self.error(.errorUploadInvalid, header.uploadID, "an upload is a pull, a feedback or a capture, not kind \(header.kind.rawValue)"))
        }
    }

    private func admitPull(_ header: WireUploadHeader) async throws -> Verdict {
        let id = header.uploadID
        guard !header.hasFeedback, header.wrappedKey.isEmpty else {
            return .answered(Self.error(.errorUploadInvalid, id, "a pull's header carries no feedback and no wrapped key"))
        }
        guard let pull = try await pulls.pull(id), let target = pull.targets.first(where: { $0.agentID == agentID }),
            let wrapped = try await pulls.wrappedKey(of: id)
        else {
            return .answered(Self.error(.errorUploadInvalid, id, "no pull \(id) for this agent"))
        }
        if target.status == .complete {
            // The same result as the first time: the day files (the stored list also has the
            // manifest) and the records the manifest counts.
            let records = try await blocking.runIfActive { self.finishedRecordCount(id) }
            let days = target.files.filter { ($0 as NSString).lastPathComponent != PayloadLimits.manifestName }.count
            return .answered(.with { $0.uploadResult = .with { $0.uploadID = id; $0.ok = true; $0.files = UInt32(days); $0.records = UInt64(records) } })
        }
        if target.status == .failed, let result = Self.failedResult(id, code: target.errorCode, detail: target.detail) {
            return .answered(result)
        }
        if target.status.isFinal {
            return .answered(Self.error(.errorUploadInvalid, id, "pull \(id) is \(target.status.rawValue) for this agent: \(target.detail)"))
        }
        // Looked up only for an upload that can still be received (an unwrap is the costly part).
        let issuer = self.issuer
        let key = try await blocking.runIfActive { () -> SymmetricKey? in
            do { return try issuer.key(wrapped) } catch { return nil }  // answered below: the pull cannot be received
        }
        guard let key else {
            logger.error("a pull's key does not unwrap", metadata: ["pull.id": "\(id)", "agent.id": "\(agentID)"])
            return .answered(Self.error(.errorUploadInvalid, id, "pull \(id) cannot be received by this server (its key does not unwrap)"))
        }
        return .admitted(key)
    }

    /// A feedback upload's key, after checking the header and this agent's quotas; a new one is
    /// recorded as begun.
    private func admitFeedback(_ header: WireUploadHeader) async throws -> Verdict {
        let id = header.uploadID
        let f = header.feedback
        guard header.hasFeedback, f.feedbackID == id, UserID.isValid(f.uid), FeedbackText.isValid(f.text) else {
            return .answered(Self.error(.errorUploadInvalid, id, "feedback header incomplete or over its limits"))
        }
        guard Timestamp.acceptedRange.contains(f.createdAtUs) else {
            return .answered(Self.error(.errorUploadInvalid, id, "feedback created_at_us is outside 1970–9999"))
        }
        let keys = issuer.keys
        let wrapped = Array(header.wrappedKey)
        let key = try await blocking.runIfActive { () -> SymmetricKey? in
            do { return try keys.unwrapKey(wrapped) } catch { return nil }  // refused below
        }
        guard let key else {
            return .answered(Self.error(.errorUploadInvalid, id, "the feedback key does not unwrap with this server's key"))
        }
        if let existing = try await feedback.feedback(id) {
            guard existing.agentID == agentID else { return .answered(Self.error(.errorUploadInvalid, id, "feedback \(id) belongs to another agent")) }
            if existing.status == .complete {
                return .answered(.with {
                    $0.uploadResult = .with { $0.uploadID = id; $0.ok = true; $0.files = UInt32(max(0, existing.files.count - 1)); $0.records = UInt64(existing.records) }
                })
            }
            if existing.status.isFinal {
                // Feedback failed before codes were kept: its payload was refused.
                return .answered(
                    Self.failedResult(id, code: existing.errorCode ?? WireErrorCode.errorPayloadInvalid.rawValue, detail: existing.detail)
                        ?? Self.error(.errorUploadInvalid, id, existing.detail))
            }
        } else {
            // Too large ever to be accepted: refused for good, not "later".
            guard header.plaintextSize <= UInt64(clamping: feedbackLimits.maxUnpackedBytes) else {
                services.metrics.quotaRefused(.feedbackSize)
                return .answered(Self.error(.errorUploadInvalid, id, "a feedback upload may be at most \(feedbackLimits.maxUnpackedBytes) bytes"))
            }
            let now = Date()
            let lastHour = try await feedback.usage(agentID: agentID, since: now.addingTimeInterval(-3600))
            let lastDay = try await feedback.usage(agentID: agentID, since: now.addingTimeInterval(-86_400))
            guard lastHour.count < feedbackLimits.perHour, lastDay.bytes + Int64(clamping: header.plaintextSize) <= feedbackLimits.bytesPerDay else {
                services.metrics.quotaRefused(.feedbackRate)
                logger.notice("feedback quota exceeded", metadata: ["agent.id": "\(agentID)", "last_hour": "\(lastHour.count)", "last_day_bytes": "\(lastDay.bytes)"])
                return .answered(Self.error(
                    .errorLimitExceeded, id,
                    "feedback quota: at most \(feedbackLimits.perHour) per hour and \(feedbackLimits.bytesPerDay) bytes per day from one agent; try later"))
            }
            try await feedback.begin(
                id: id, agentID: agentID, uid: f.uid, text: f.text, createdAt: Timestamp(microseconds: f.createdAtUs), chunkCount: Int(header.chunkCount),
                bytes: Int64(clamping: header.plaintextSize), at: now)
            logger.info("feedback upload begun", metadata: ["feedback.id": "\(id)", "agent.id": "\(agentID)", "uid": "\(f.uid)"])
        }
        return .admitted(key)
    }

    /// A capture's key, after checking its header against the trigger it names (Protocol § 21,
    /// *The capture's header*) and its budgets; a new one is recorded as begun. One recorded
    /// before (a resumption) is never refused for its budget again.
    private func admitCapture(_ header: WireUploadHeader) async throws -> Verdict {
        let id = header.uploadID
        func invalid(_ why: String) -> Verdict { .answered(Self.error(.errorUploadInvalid, id, why)) }
        guard let triggers else { return invalid("a capture needs the capability triggers agreed on the connection") }
        let registry = triggers.registry
        guard header.hasCapture, !header.hasFeedback else { return invalid("a capture's header carries a capture and no feedback") }
        let c = header.capture
        let times = [c.sinceUs, c.untilUs, c.matchedAtUs]
        guard WireID.isValid(c.triggerID), c.uid.isEmpty || UserID.isValid(c.uid), c.setVersion > 0, times.allSatisfy(Timestamp.acceptedRange.contains) else {
            return invalid("the capture's trigger id, uid, set version or times are not of their § 5 form")
        }
        guard c.sinceUs < c.untilUs, (c.sinceUs..<c.untilUs).contains(c.matchedAtUs) else {
            return invalid("the capture's window is empty, or its match is outside it")
        }
        let keys = issuer.keys
        let wrapped = Array(header.wrappedKey)
        let key = try await blocking.runIfActive { () -> SymmetricKey? in
            do { return try keys.unwrapKey(wrapped) } catch { return nil }  // refused below
        }
        guard let key else { return invalid("the capture's key does not unwrap with this server's key") }
        if let existing = try await registry.capture(id) { return resumed(existing, header, key: key) }
        // Its id is its own: never one of this server's pulls or feedback.
        let pull = try await pulls.pull(id)
        let feedbackOfID = try await feedback.feedback(id)
        if pull != nil || feedbackOfID != nil { return invalid("upload \(id) is not a capture") }
        // Too large ever to be accepted: refused for good.
        guard header.plaintextSize <= UInt64(clamping: feedbackLimits.maxUnpackedBytes) else {
            services.metrics.quotaRefused(.captureBudget)
            return invalid("a capture upload may be at most \(feedbackLimits.maxUnpackedBytes) bytes")
        }
        // The trigger as it stands: one of this agent's, and the capture within its terms.
        guard let trigger = try await registry.trigger(c.triggerID), trigger.removed == nil,
            trigger.reachesDevice(TriggerAudience(agentID: agentID, host: triggers.host, uids: []))
        else { return invalid("trigger \(c.triggerID) is not one this server holds for this agent") }
        let d = trigger.definition
        if c.crash && !d.crash { return invalid("trigger \(c.triggerID) is not a crash trigger") }
        if !c.crash && d.match == nil { return invalid("trigger \(c.triggerID) fires on crashes only") }
        if let uid = d.uid, c.uid != uid { return invalid("trigger \(c.triggerID) watches another user") }
        if !c.uid.isEmpty, !(try await services.registry.uids(of: agentID)).contains(c.uid) {
            return invalid("the capture's uid is not one this agent holds (a heartbeat names it first)")
        }
        let longest = Int64(d.beforeSeconds + d.afterSeconds) * 1_000_000 + 1
        guard c.untilUs - c.sinceUs <= longest else { return invalid("the capture's window is longer than trigger \(c.triggerID)'s") }
        let skew = WireLimits.clockSkewMicroseconds
        let end = min(trigger.disabled.map { Timestamp($0.at).microseconds } ?? .max, trigger.expiresAt.microseconds)
        guard c.matchedAtUs >= Timestamp(trigger.createdAt).microseconds - skew, c.matchedAtUs <= end + skew else {
            return invalid("the capture's match is outside trigger \(c.triggerID)'s life")
        }
        let capture = NewCapture(
            id: id, agentID: agentID, triggerID: c.triggerID, setVersion: c.setVersion, uid: c.uid, since: Timestamp(microseconds: c.sinceUs),
            until: Timestamp(microseconds: c.untilUs), matchedAt: Timestamp(microseconds: c.matchedAtUs), crash: c.crash, chunkCount: Int(header.chunkCount),
            bytes: Int64(clamping: header.plaintextSize), at: Date())
        let budgets = CaptureBudgets(perDevicePerDay: d.perDevicePerDay, perDay: d.perDay, bytesPerDevicePerDay: feedbackLimits.bytesPerDay)
        switch try await registry.beginCapture(capture, budgets: budgets) {
        case .begun:
            logger.info("capture upload begun", metadata: ["capture.id": "\(id)", "agent.id": "\(agentID)", "trigger.id": "\(c.triggerID)"])
            return .admitted(key)
        case .existing(let existing):
            return resumed(existing, header, key: key)
        case .overBudget(let why):
            services.metrics.quotaRefused(.captureBudget)
            logger.notice("capture refused: budget spent", metadata: ["capture.id": "\(id)", "agent.id": "\(agentID)", "trigger.id": "\(c.triggerID)"])
            return .answered(Self.error(.errorBudgetSpent, id, why))
        case .overlaps(let why):
            return invalid(why)
        }
    }

    /// A capture begun before: answered its result if it ended, else resumed, when the header
    /// is the one it began with (it was checked then; another would pass no check).
    private func resumed(_ existing: CaptureRecord, _ header: WireUploadHeader, key: SymmetricKey) -> Verdict {
        let id = existing.id
        guard existing.agentID == agentID else { return .answered(Self.error(.errorUploadInvalid, id, "capture \(id) belongs to another agent")) }
        let c = header.capture
        guard existing.triggerID == c.triggerID, existing.setVersion == c.setVersion, existing.uid == c.uid, existing.since.microseconds == c.sinceUs,
            existing.until.microseconds == c.untilUs, existing.matchedAt.microseconds == c.matchedAtUs, existing.crash == c.crash,
            existing.chunkCount == Int(header.chunkCount), existing.bytes == Int64(clamping: header.plaintextSize)
        else { return .answered(Self.error(.errorUploadInvalid, id, "capture \(id) was begun with another header")) }
        if existing.status == .complete {
            return .answered(.with {
                $0.uploadResult = .with { $0.uploadID = id; $0.ok = true; $0.files = UInt32(max(0, existing.files.count - 1)); $0.records = UInt64(existing.records) }
            })
        }
        if existing.status.isFinal {
            return .answered(
                Self.failedResult(id, code: existing.errorCode ?? WireErrorCode.errorPayloadInvalid.rawValue, detail: existing.detail)
                    ?? Self.error(.errorUploadInvalid, id, existing.detail))
        }
        return .admitted(key)
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

    /// The result a failed upload was answered with, answered again when the agent begins it
    /// once more (on any connection); nil when it failed without one (before this server kept
    /// codes), and then the caller refuses the upload instead.
    static func failedResult(_ uploadID: String, code: Int?, detail: String) -> WireFrame? {
        guard let code, let error = WireErrorCode(rawValue: code) else { return nil }
        return .with { $0.uploadResult = .with { $0.uploadID = uploadID; $0.ok = false; $0.error = error; $0.detail = detail } }
    }

    /// A non-fatal error about one upload.
    static func error(_ code: WireErrorCode, _ uploadID: String, _ detail: String) -> WireFrame {
        .with { $0.error = .with { $0.code = code; $0.detail = detail; $0.fatal = false; $0.uploadID = WireID.echo(uploadID) } }
    }
}
