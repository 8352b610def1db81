import DredgeAdminAPI
import Foundation
import Logging

/// Removes upload state nothing will finish: `uploads/<upload>-<agent>/` whose pull target or
/// feedback has reached a final status (or never existed), entries of any other name, and (at
/// start only) the `*.partial` staging directories an interrupted unpacking left. Finished
/// results (`pulls/`, `feedback/`) are never touched.
struct UploadJanitor: Sendable {
    let paths: DataDirectory
    let pulls: any PullQueue
    let feedback: any FeedbackInbox
    let logger: Logger

    /// What the server runs about once a minute: pulls and feedback that will not finish are
    /// ended, then their upload state removed.
    func housekeeping(listeningSince: Date) -> @Sendable () async throws -> Void {
        let janitor = self
        return {
            try await janitor.pulls.expireStalled(now: Date(), listeningSince: listeningSince, deadlines: PullStore.Deadlines())
            try await janitor.feedback.failAbandoned(now: Date(), after: .seconds(7 * 86_400))
            try await janitor.sweep()
        }
    }

    /// Returns the paths removed.
    @discardableResult
    func sweep(atStart: Bool = false) async throws -> [String] {
        var removed: [String] = []
        let fm = FileManager.default
        for name in (try? fm.contentsOfDirectory(atPath: paths.uploads)) ?? [] {
            let path = try paths.inside(paths.uploads + "/" + name)
            if let (upload, agent) = DataDirectory.parseUploadName(name), try await !isFinished(upload: upload, agent: agent) { continue }
            try fm.removeItem(atPath: path)
            removed.append(path)
        }
        if atStart {
            for parent in [paths.feedback] + ((try? fm.contentsOfDirectory(atPath: paths.pulls)) ?? []).map({ paths.pulls + "/" + $0 }) {
                for name in (try? fm.contentsOfDirectory(atPath: parent)) ?? [] where name.hasSuffix(".partial") {
                    let path = try paths.inside(parent + "/" + name)
                    try fm.removeItem(atPath: path)
                    removed.append(path)
                }
            }
        }
        if !removed.isEmpty { logger.info("removed abandoned upload state", metadata: ["count": "\(removed.count)"]) }
        return removed
    }

    /// True when nothing will ever complete this upload: its pull target or feedback is final,
    /// or there is neither.
    private func isFinished(upload: String, agent: String) async throws -> Bool {
        if let pull = try await pulls.pull(upload), let target = pull.targets.first(where: { $0.agentID == agent }) {
            return target.status.isFinal
        }
        if let record = try await feedback.feedback(upload), record.agentID == agent {
            return record.status.isFinal
        }
        return true
    }
}
