import DredgeAdminAPI
import DredgeDomain
import DredgeWire

/// The status of what an upload belongs to: the pull, for this agent, or the feedback. The
/// stores ignore a change to a status that is already final.
struct UploadStatuses: Sendable {
    let agentID: String
    let pulls: any PullQueue
    let feedback: any FeedbackInbox

    /// Moves the status; returns whether it applied.
    @discardableResult
    func move(
        _ uploadID: String, isFeedback: Bool, to status: PullStatus, detail: String = "", chunksReceived: Int? = nil, chunkCount: Int? = nil,
        bytes: Int64? = nil, records: Int? = nil, files: [String]? = nil, failedWith code: WireErrorCode? = nil
    ) async throws -> Bool {
        let errorCode = code.map(\.rawValue)
        if isFeedback {
            return try await feedback.update(uploadID, status: status, detail: detail, chunksReceived: chunksReceived, records: records, files: files, errorCode: errorCode)
        } else {
            return try await pulls.update(
                uploadID, agent: agentID, status: status, detail: detail, chunksReceived: chunksReceived, chunkCount: chunkCount, bytes: bytes, files: files,
                errorCode: errorCode)
        }
    }

    /// The status recorded for an upload of this agent: its pull target's, or its feedback's;
    /// nil when there is none (never begun, or not this agent's).
    func recorded(_ uploadID: String) async throws -> PullStatus? {
        if let target = try await pulls.pull(uploadID)?.targets.first(where: { $0.agentID == agentID }) { return target.status }
        if let record = try await feedback.feedback(uploadID), record.agentID == agentID { return record.status }
        return nil
    }
}
