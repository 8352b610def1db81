import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Logging

/// What an agent's answers to pull commands do to the pull's status for that agent: accepted
/// (exporting), rejected with its reason, or failed on the agent after it accepted. An answer
/// moves only a pull that was not answered yet, so an answer repeated for a redelivered command
/// never takes a pull that is uploading, or has ended, back.
struct PullOutcomes: Sendable {
    let agentID: String
    let pulls: any PullQueue
    let logger: Logger

    func accepted(_ answer: WireCommandAccepted) async throws {
        try await pulls.update(answer.commandID, agent: agentID, status: .exporting, from: [.queued, .delivered])
    }

    /// A rejection after the agent accepted (and began uploading) changes nothing.
    func rejected(_ answer: WireCommandRejected) async throws {
        let id = answer.commandID
        if try await pulls.update(id, agent: agentID, status: .rejected, detail: "\(answer.reason): \(ConnectionUploads.bounded(answer.detail))", from: [.queued, .delivered]) {
            logger.notice("pull rejected by agent", metadata: ["pull.id": "\(id)", "agent.id": "\(agentID)", "reason": "\(answer.reason)"])
        }
    }

    /// The agent could not carry out an accepted command (its export failed, say).
    func failedOnAgent(_ report: WireError) async throws {
        try await pulls.update(report.uploadID, agent: agentID, status: .failed, detail: "the agent could not finish it: \(ConnectionUploads.bounded(report.detail))")
        logger.notice("pull failed on the agent", metadata: ["pull.id": "\(report.uploadID)", "agent.id": "\(agentID)", "code": "\(report.code)"])
    }
}
