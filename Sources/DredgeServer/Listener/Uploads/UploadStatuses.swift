import DredgeAdminAPI
import DredgeDomain
import DredgeWire

/// Where an upload step leaves what the upload belongs to.
enum UploadStage: Sendable {
    case uploading, complete, failed

    /// The pull target's move (``PullTargetLife``).
    var pullMove: PullTargetLife.Move {
        switch self {
        case .uploading: PullTargetLife.upload
        case .complete: PullTargetLife.complete
        case .failed: PullTargetLife.fail
        }
    }

    var feedbackStatus: FeedbackStatus {
        switch self {
        case .uploading: .uploading
        case .complete: .complete
        case .failed: .failed
        }
    }
}

/// What an upload belongs to: a pull (the agent's part of it), a feedback, or a capture (#54).
/// A pull is asked for by an engineer; a feedback and a capture are sent by the device itself,
/// sealed to the server's key.
enum UploadOwner: Sendable, Equatable {
    case pull, feedback, capture

    init(_ kind: WireUploadKind) {
        self = switch kind {
        case .feedback: .feedback
        case .capture: .capture
        default: .pull
        }
    }

    /// Its name in logs, manifests (`kind`) and metrics.
    var name: String {
        switch self {
        case .pull: "pull"
        case .feedback: "feedback"
        case .capture: "capture"
        }
    }

    /// What the index calls its records' source.
    var indexedKind: IndexedSource.Kind {
        switch self {
        case .pull: .pull
        case .feedback: .feedback
        case .capture: .capture
        }
    }

    var metricsKind: ServerMetrics.UploadKind {
        switch self {
        case .pull: .pull
        case .feedback: .feedback
        case .capture: .capture
        }
    }
}

/// What the server recorded of an upload's owner (its pull target, or its feedback).
enum RecordedUpload: Sendable, Equatable {
    case open, complete, failed
}

/// The status of what an upload belongs to: the pull, for this agent, the feedback or the
/// capture. The stores ignore a change to a status that is already final.
struct UploadStatuses: Sendable {
    let agentID: String
    let pulls: any PullQueue
    let feedback: any FeedbackInbox
    let captures: (any TriggerRegistry)?

    /// Moves the status; returns whether it applied.
    @discardableResult
    func move(
        _ uploadID: String, _ owner: UploadOwner, to stage: UploadStage, detail: String = "", chunksReceived: Int? = nil, chunkCount: Int? = nil,
        bytes: Int64? = nil, records: Int? = nil, files: [String]? = nil, failedWith code: WireErrorCode? = nil
    ) async throws -> Bool {
        let errorCode = code.map(\.rawValue)
        switch owner {
        case .feedback:
            return try await feedback.update(
                uploadID, status: stage.feedbackStatus, detail: detail, chunksReceived: chunksReceived, records: records, files: files, errorCode: errorCode)
        case .capture:
            guard let captures else { return false }
            return try await captures.updateCapture(
                uploadID, status: stage.feedbackStatus, detail: detail, chunksReceived: chunksReceived, records: records, files: files, errorCode: errorCode)
        case .pull:
            return try await pulls.move(
                uploadID, agent: agentID, stage.pullMove, detail: detail, chunksReceived: chunksReceived, chunkCount: chunkCount, bytes: bytes, files: files,
                errorCode: errorCode)
        }
    }

    /// What is recorded for an upload of this agent: its pull target's status, its feedback's or
    /// its capture's; nil when there is none (never begun, or not this agent's).
    func recorded(_ uploadID: String) async throws -> RecordedUpload? {
        if let target = try await pulls.pull(uploadID)?.targets.first(where: { $0.agentID == agentID }) {
            return target.status == .complete ? .complete : target.status.isFinal ? .failed : .open
        }
        if let record = try await feedback.feedback(uploadID), record.agentID == agentID {
            return record.status == .complete ? .complete : record.status.isFinal ? .failed : .open
        }
        if let record = try await captures?.capture(uploadID), record.agentID == agentID {
            return record.status == .complete ? .complete : record.status.isFinal ? .failed : .open
        }
        return nil
    }
}
