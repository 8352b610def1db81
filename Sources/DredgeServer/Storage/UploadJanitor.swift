import DredgeAdminAPI
import DredgeWire
import Foundation
import Logging
import NIOPosix

/// Removes upload state nothing will finish: `uploads/<upload>-<agent>/` whose pull target or
/// feedback or capture has reached a final status (or never existed), entries of any other name, and (at
/// start only) the `*.partial` staging directories an interrupted unpacking left. Finished
/// results (`pulls/`, `feedback/`) are never touched. On a data directory shared by the nodes
/// of a cluster, staging is removed at start only once it is an hour old: another node may be
/// unpacking into it now.
///
/// Listing and removing (an abandoned upload may hold 2 GiB of chunk files) run on `blocking`,
/// never on Swift's cooperative pool, whose threads serve every agent's heartbeats.
struct UploadJanitor: Sendable {
    let paths: DataDirectory
    let pulls: any PullQueue
    let feedback: any FeedbackInbox
    /// The captures (#54), kept by the trigger registry; nil: a server without one.
    let captures: (any TriggerRegistry)?
    let logger: Logger
    let blocking: NIOThreadPool

    init(
        paths: DataDirectory, pulls: any PullQueue, feedback: any FeedbackInbox, captures: (any TriggerRegistry)? = nil, logger: Logger,
        blocking: NIOThreadPool = .singleton
    ) {
        self.captures = captures
        self.paths = paths
        self.pulls = pulls
        self.feedback = feedback
        self.logger = logger
        self.blocking = blocking
    }

    /// What the server runs about once a minute: pulls, feedback and captures that will not finish are
    /// ended, then their upload state removed.
    func housekeeping(listeningSince: Date) -> @Sendable () async throws -> Void {
        let janitor = self
        return {
            try await janitor.pulls.expireStalled(now: Date(), listeningSince: listeningSince, deadlines: PullTargetLife.Deadlines())
            try await janitor.feedback.failAbandoned(now: Date(), after: WireLimits.feedbackLifetime)
            try await janitor.captures?.failAbandonedCaptures(now: Date(), after: WireLimits.captureLifetime)
            try await janitor.sweep()
        }
    }

    /// Returns the paths removed. `shared`: other nodes use the data directory too.
    @discardableResult
    func sweep(atStart: Bool = false, shared: Bool = false) async throws -> [String] {
        let paths = self.paths
        var doomed: [String] = []
        for name in try await blocking.runIfActive({ try DataDirectory.entries(of: paths.uploads) }) {
            if let (upload, agent) = DataDirectory.parseUploadName(name), try await !isFinished(upload: upload, agent: agent) { continue }
            doomed.append(try paths.inside(paths.uploads + "/" + name))
        }
        let remove = doomed
        let removed = try await blocking.runIfActive { () throws -> [String] in
            var removed: [String] = []
            for path in remove {
                // Gone already: removed by another node of a cluster sharing the directory.
                guard FileManager.default.fileExists(atPath: path) else { continue }
                do {
                    try FileManager.default.removeItem(atPath: path)
                } catch where !FileManager.default.fileExists(atPath: path) {
                    continue
                }
                removed.append(path)
            }
            if atStart {
                let parents = [paths.feedback, paths.captures] + (try DataDirectory.entries(of: paths.pulls)).map { paths.pulls + "/" + $0 }
                for parent in parents {
                    for name in try DataDirectory.entries(of: parent) where name.hasSuffix(".partial") {
                        let path = try paths.inside(parent + "/" + name)
                        // Renamed into place or removed by another node meanwhile: nothing to do.
                        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path) else { continue }
                        if shared, let modified = attributes[.modificationDate] as? Date, Date().timeIntervalSince(modified) < 3600 { continue }
                        do {
                            try FileManager.default.removeItem(atPath: path)
                        } catch where !FileManager.default.fileExists(atPath: path) {
                            continue
                        }
                        removed.append(path)
                    }
                }
            }
            return removed
        }
        if !removed.isEmpty { logger.info("removed abandoned upload state", metadata: ["count": "\(removed.count)"]) }
        return removed
    }

    /// True when nothing will ever complete this upload: its pull target, feedback or capture is
    /// final, or there is none.
    private func isFinished(upload: String, agent: String) async throws -> Bool {
        if let pull = try await pulls.pull(upload), let target = pull.targets.first(where: { $0.agentID == agent }) {
            return target.status.isFinal
        }
        if let record = try await feedback.feedback(upload), record.agentID == agent {
            return record.status.isFinal
        }
        if let record = try await captures?.capture(upload), record.agentID == agent {
            return record.status.isFinal
        }
        return true
    }
}
