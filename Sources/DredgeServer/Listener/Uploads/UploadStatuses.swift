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

/// What the server recorded of an upload's owner (its pull target, or its feedback).
enum RecordedUpload: Sendable, Equatable {
    case open, complete, failed
}

/// The status of what an upload belongs to: the pull, for this agent, or the feedback. The
/// stores ignore a change to a status that is already final.
struct UploadStatuses: Sendable {
    let agentID: String
    let pulls: any PullQueue
    let feedback: any FeedbackInbox

    /// Moves the status; returns whether it applied.
    @discardableResult
    func move(
        _ uploadID: String, isFeedback: Bool, to stage: UploadStage, detail: String = "", chunksReceived: Int? = nil, chunkCount: Int? = nil,
        bytes: Int64? = nil, records: Int? = nil, files: [String]? = nil, failedWith code: WireErrorCode? = nil
    ) async throws -> Bool {
        let errorCode = code.map(\.rawValue)
        if isFeedback {
            return try await feedback.update(
                uploadID, status: stage.feedbackStatus, detail: detail, chunksReceived: chunksReceived, records: records, files: files, errorCode: errorCode)
        } else {
            return try await pulls.move(
                uploadID, agent: agentID, stage.pullMove, detail: detail, chunksReceived: chunksReceived, chunkCount: chunkCount, bytes: bytes, files: files,
                errorCode: errorCode)
        }
    }

    /// What is recorded for an upload of this agent: its pull target's status, or its
    /// feedback's; nil when there is none (never begun, or not this agent's).
    func recorded(_ uploadID: String) async throws -> RecordedUpload? {
        if let target = try await pulls.pull(uploadID)?.targets.first(where: { $0.agentID == agentID }) {
            return target.status == .complete ? .complete : target.status.isFinal ? .failed : .open
        }
        if let record = try await feedback.feedback(uploadID), record.agentID == agentID {
            return record.status == .complete ? .complete : record.status.isFinal ? .failed : .open
        }
        return nil
    }
}
