import DredgeAdminAPI
import DredgeWire
import Foundation
import Logging
import NIOPosix
import Synchronization

/// How long the server keeps what it received: pulled and feedback files and their index
/// rows. `server.json`'s `results.keepDays` (default 30; 0 keeps them until removed by hand),
/// or `dredge-server run --keep-days`.
public struct ResultsRetention: Codable, Sendable, Equatable {
    public var keepDays: Int

    public static let `default` = ResultsRetention(keepDays: 30)
    /// The longest retention accepted: 100 years.
    public static let maximumDays = 36_500

    public init(keepDays: Int) { self.keepDays = keepDays }

    /// Nil when results are kept until removed by hand.
    public var keep: Duration? { keepDays > 0 ? .seconds(Int64(keepDays) * 86_400) : nil }

    /// Nil when fine; else what is wrong, for the operator.
    public var problem: String? {
        (0...Self.maximumDays).contains(keepDays) ? nil : "keepDays must be between 0 (keep until removed) and \(Self.maximumDays)"
    }

    /// Keys left out of `server.json` keep their defaults.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        keepDays = try c.decodeIfPresent(Int.self, forKey: .keepDays) ?? Self.default.keepDays
    }
}

/// Deletes results: a pull's files (`pulls/<pull>/`, every agent's files and zip), a
/// feedback's (`feedback/<id>/` and its zip), a capture's (`captures/<id>/` and its zip), with their rows in the search index, when an
/// engineer removes them (`dredge rm`, `DELETE /v1/pulls/{id}`) or when they have been kept
/// for the retention. The pull or feedback record stays, marked removed, and each removal is
/// in the audit log.
///
/// The order makes every interruption safe to finish later: the record is marked first (an
/// upload still arriving is then refused, and the indexer told to drop the source), then the
/// index rows go, then the files. ``finishInterruptedRemovals()`` (at start) deletes what a
/// removal cut short by a crash left: files and index rows of a record marked removed, and
/// result directories no record names. Listing, measuring and deleting files run on
/// `blocking`, never on Swift's cooperative pool.
public struct ResultsKeeper: Sendable {
    let paths: DataDirectory
    let pulls: any PullQueue
    let feedback: any FeedbackInbox
    /// The live tails whose held records are kept and removed alike (nil: none).
    let tails: (any TailRegistry)?
    /// The captures (#54), kept and removed as feedback is (nil: none).
    let captures: (any TriggerRegistry)?
    let records: (any RecordIndex)?
    let indexer: Indexer?
    let audit: any AuditLog
    let retention: ResultsRetention
    let logger: Logger
    let blocking: NIOThreadPool
    /// When ``housekeeping(now:)`` last finished removals cut short (at first, when this keeper
    /// was made: the server finishes them at start).
    private let lastRetry: Shared<Date>
    /// The results being removed now: one removal of an id at a time (an engineer's, the
    /// retention's, a retry's), so two never delete the same files at once.
    private let removing: Shared<Set<String>>

    /// At most this many pulls and as many feedback are removed by one retention pass; the
    /// next pass (a minute later) goes on.
    static let batch = 200
    /// How often a removal whose deletion failed (a full or read-only disk, a directory whose
    /// permissions an operator mended) is tried again while the server runs.
    public static let retryInterval: TimeInterval = 3600

    public init(
        paths: DataDirectory, pulls: any PullQueue, feedback: any FeedbackInbox, tails: (any TailRegistry)? = nil, captures: (any TriggerRegistry)? = nil,
        records: (any RecordIndex)?, indexer: Indexer?, audit: any AuditLog, retention: ResultsRetention = .default, logger: Logger, blocking: NIOThreadPool = .singleton
    ) {
        self.tails = tails
        self.captures = captures
        self.paths = paths
        self.pulls = pulls
        self.feedback = feedback
        self.records = records
        self.indexer = indexer
        self.audit = audit
        self.retention = retention
        self.logger = logger
        self.blocking = blocking
        lastRetry = Shared(Date())
        removing = Shared([])
    }

    /// Another removal of the same results is running.
    public struct RemovalInProgress: Error, CustomStringConvertible {
        public let id: String
        public var description: String { "\(id) is being removed now; ask again when that is done" }
    }

    /// Runs `body` as the one removal of `id`; throws ``RemovalInProgress`` when another runs.
    func exclusively<T>(_ id: String, _ body: () async throws -> T) async throws -> T {
        guard removing.value.withLock({ $0.insert(id).inserted }) else { throw RemovalInProgress(id: id) }
        defer { _ = removing.value.withLock { $0.remove(id) } }
        return try await body()
    }

    /// The server's once-a-minute pass: ``applyRetention(now:)``, and once every
    /// ``retryInterval`` the removals whose deletion did not finish are tried again
    /// (``finishInterruptedRemovals(now:atStart:)``).
    public func housekeeping(now: Date = Date()) async throws {
        try await applyRetention(now: now)
        let due = lastRetry.value.withLock { last in
            guard now.timeIntervalSince(last) >= Self.retryInterval else { return false }
            last = now
            return true
        }
        if due { try await finishInterruptedRemovals(now: now, atStart: false) }
    }

    // MARK: Removing

    /// Removes a pull's results; nil for an unknown pull. Removing one removed before deletes
    /// only what is still there (a late upload's files) and keeps the first removal.
    public func removePull(_ id: String, by actor: String, reason: String = "", now: Date = Date()) async throws -> RemovalReport? {
        try await exclusively(id) { try await removingPull(id, by: actor, reason: reason, now: now) }
    }

    private func removingPull(_ id: String, by actor: String, reason: String, now: Date) async throws -> RemovalReport? {
        guard let record = try await pulls.pull(id) else { return nil }
        guard let mark = try await pulls.markRemoved(id, by: actor, reason: reason, at: now) else { return nil }
        let directory = try paths.pull(id), doomed = try files(ofPull: id)
        let agents = Set(record.targets.map(\.agentID)).union(try await blocking.runIfActive { try Self.agentDirectories(in: directory) })
        let sources = agents.sorted().map { IndexedSource(kind: .pull, id: id, agentID: $0) }
        return try await finish(.pull, id, mark, by: actor, reason: reason, now: now) {
            let unindexed = try await unindex(sources)
            let freed = try await blocking.runIfActive { try Self.delete(doomed) }
            return (unindexed, freed)
        }
    }

    /// Removes a pull's or a feedback's results (``removePull(_:by:reason:now:)``,
    /// ``removeFeedback(_:by:reason:now:)``); nil when there is no such `kind`.
    public func remove(_ kind: RemovalReport.Kind, _ id: String, by actor: String, reason: String = "", now: Date = Date()) async throws -> RemovalReport? {
        switch kind {
        case .pull: try await removePull(id, by: actor, reason: reason, now: now)
        case .feedback: try await removeFeedback(id, by: actor, reason: reason, now: now)
        case .tail: try await removeTail(id, by: actor, reason: reason, now: now)
        case .capture: try await removeCapture(id, by: actor, reason: reason, now: now)
        }
    }

    /// Removes a capture's results (#54): its files, its zip and its index rows. Nil for an
    /// unknown capture.
    public func removeCapture(_ id: String, by actor: String, reason: String = "", now: Date = Date()) async throws -> RemovalReport? {
        guard let captures else { return nil }
        return try await exclusively(id) {
            guard let record = try await captures.capture(id) else { return nil }
            guard let mark = try await captures.markCaptureRemoved(id, by: actor, reason: reason, at: now) else { return nil }
            let doomed = try files(ofCapture: id)
            return try await finish(.capture, id, mark, by: actor, reason: reason, now: now) {
                let unindexed = try await unindex([IndexedSource(kind: .capture, id: id, agentID: record.agentID)])
                let freed = try await blocking.runIfActive { try Self.delete(doomed) }
                return (unindexed, freed)
            }
        }
    }

    /// Removes what a live tail held (#53): every device's records file and contexts, and
    /// their index rows; a tail still running is stopped first. Nil for an unknown tail.
    public func removeTail(_ id: String, by actor: String, reason: String = "", now: Date = Date()) async throws -> RemovalReport? {
        guard let tails else { return nil }
        return try await exclusively(id) {
            guard let record = try await tails.tail(id) else { return nil }
            guard let mark = try await tails.markRemoved(id, by: actor, reason: reason, at: now) else { return nil }
            let directory = try paths.tail(id)
            let agents = Set(record.parts.map(\.agentID)).union(try await blocking.runIfActive { try Self.agentDirectories(in: directory) })
            let sources = agents.sorted().map { IndexedSource(kind: .tail, id: id, agentID: $0) }
            return try await finish(.tail, id, mark, by: actor, reason: reason, now: now) {
                let unindexed = try await unindex(sources)
                let freed = try await blocking.runIfActive { try Self.delete([directory]) }
                return (unindexed, freed)
            }
        }
    }

    /// Deletes what `work` deletes, then records the removal in the audit log: a new removal
    /// always (saying so when the deletion did not finish, and then throwing its error), an
    /// earlier one again only when files were left to delete.
    private func finish(
        _ kind: RemovalReport.Kind, _ id: String, _ mark: RemovalMark, by actor: String, reason: String, now: Date,
        _ work: () async throws -> (unindexed: Int, freed: Int64)
    ) async throws -> RemovalReport {
        var done = (unindexed: 0, freed: Int64(0))
        var failure: (any Error)?
        do { done = try await work() } catch { failure = error }
        let report = RemovalReport(kind: kind, id: id, removal: mark.removal, newlyRemoved: mark.isNew, freedBytes: done.freed, unindexedSources: done.unindexed)
        if mark.isNew || done.freed > 0 {
            let detail = Self.describe(report, reason: reason) + (failure.map { "; not finished (the server tries again within the hour, and at its next start): \($0)" } ?? "")
            let action: AuditAction = switch kind {
            case .pull: .pullRemove
            case .feedback: .feedbackRemove
            case .tail: .tailRemove
            case .capture: .captureRemove
            }
            try await audit.record(actor: actor, action, detail: detail, at: now)
        }
        if let failure { throw failure }
        return report
    }

    /// Removes a feedback's results; nil for an unknown feedback.
    public func removeFeedback(_ id: String, by actor: String, reason: String = "", now: Date = Date()) async throws -> RemovalReport? {
        try await exclusively(id) { try await removingFeedback(id, by: actor, reason: reason, now: now) }
    }

    private func removingFeedback(_ id: String, by actor: String, reason: String, now: Date) async throws -> RemovalReport? {
        guard let record = try await feedback.feedback(id) else { return nil }
        guard let mark = try await feedback.markRemoved(id, by: actor, reason: reason, at: now) else { return nil }
        let doomed = try files(ofFeedback: id)
        return try await finish(.feedback, id, mark, by: actor, reason: reason, now: now) {
            let unindexed = try await unindex([IndexedSource(kind: .feedback, id: id, agentID: record.agentID)])
            let freed = try await blocking.runIfActive { try Self.delete(doomed) }
            return (unindexed, freed)
        }
    }

    /// Takes sources out of the index (and out of the indexer's queue); returns how many
    /// were indexed.
    private func unindex(_ sources: [IndexedSource]) async throws -> Int {
        guard let records else { return 0 }
        var indexed = 0
        for source in sources {
            indexer?.forget(source)
            if try await records.isIndexed(source) { indexed += 1 }
            try await records.remove(source)
        }
        return indexed
    }

    static func describe(_ report: RemovalReport, reason: String) -> String {
        "\(report.kind.rawValue) \(report.id): \(report.freedBytes) bytes deleted, \(report.unindexedSources) indexed source(s) removed"
            + (report.newlyRemoved ? "" : " (removed before, on \(report.removal.at); files left after it)")
            + (reason.isEmpty ? "" : " reason=\(reason.debugDescription)")
    }

    // MARK: Retention

    /// What ``applyRetention(now:)`` removed.
    public struct RetentionPass: Sendable, Equatable {
        public var pulls: [String] = []
        public var feedback: [String] = []
        public var tails: [String] = []
        public var captures: [String] = []
        public var freedBytes: Int64 = 0
    }

    /// Removes the results kept past the retention (at most ``batch`` pulls and as many
    /// feedback per pass): pulls finished and unchanged since `now - keep`, feedback received
    /// before it. Nothing when results are kept until removed by hand.
    @discardableResult
    public func applyRetention(now: Date = Date()) async throws -> RetentionPass {
        guard let keep = retention.keep else { return RetentionPass() }
        let cutoff = now.addingTimeInterval(-Double(keep.components.seconds))
        let reason = "kept \(retention.keepDays) day(s)"
        var pass = RetentionPass()
        // One that fails is logged and the pass goes on (it is marked removed: what is left of
        // it is deleted when removals are tried again); one being removed by hand now is left to that.
        let due = [
            (RemovalReport.Kind.pull, try await pulls.removable(keptUntil: cutoff, limit: Self.batch)),
            (.feedback, try await feedback.removable(receivedUntil: cutoff, limit: Self.batch)),
            (.tail, try await tails?.removable(keptUntil: cutoff, limit: Self.batch) ?? []),
            (.capture, try await captures?.removableCaptures(receivedUntil: cutoff, limit: Self.batch) ?? []),
        ]
        for (kind, ids) in due {
            for id in ids {
                do {
                    guard let report = try await remove(kind, id, by: Removal.retention, reason: reason, now: now) else { continue }
                    switch kind {
                    case .pull: pass.pulls.append(id)
                    case .feedback: pass.feedback.append(id)
                    case .tail: pass.tails.append(id)
                    case .capture: pass.captures.append(id)
                    }
                    pass.freedBytes += report.freedBytes
                } catch is RemovalInProgress {
                    continue
                } catch {
                    logger.error("could not remove results kept past the retention", metadata: ["\(kind.rawValue).id": "\(id)", "error": "\(error)"])
                }
            }
        }
        if !pass.pulls.isEmpty || !pass.feedback.isEmpty || !pass.tails.isEmpty || !pass.captures.isEmpty {
            logger.info("removed results kept past the retention", metadata: [
                "pulls": "\(pass.pulls.count)", "feedback": "\(pass.feedback.count)", "tails": "\(pass.tails.count)", "captures": "\(pass.captures.count)", "bytes": "\(pass.freedBytes)", "keep.days": "\(retention.keepDays)",
            ])
        }
        return pass
    }

    // MARK: Interrupted removals

    /// At start, before the indexer catches up: finishes removals a crash cut short. Every
    /// `pulls/<pull>/` and `feedback/<id>/` (and zip) whose record is marked removed is deleted
    /// with its index rows. Results no record names (a database restored from an older backup,
    /// say) are left as they are, and logged at start: they may be all that is left of them. One
    /// that cannot be finished is logged and tried again (``housekeeping(now:)``, every
    /// ``retryInterval``; and at the next start). Returns the ids finished.
    @discardableResult
    public func finishInterruptedRemovals(now: Date = Date(), atStart: Bool = true) async throws -> [String] {
        let paths = self.paths
        let (pullIDs, feedbackIDs, tailIDs, captureIDs) = try await blocking.runIfActive { () throws -> ([String], [String], [String], [String]) in
            let pulls = try DataDirectory.entries(of: paths.pulls).filter { WireID.isValid($0) }
            func idsWithZips(_ directory: String) throws -> [String] {
                Set(try DataDirectory.entries(of: directory).compactMap { name -> String? in
                    let id = name.hasSuffix(".zip") ? String(name.dropLast(4)) : name
                    return WireID.isValid(id) ? id : nil
                }).sorted()
            }
            let tails = try DataDirectory.entries(of: paths.tails).filter { WireID.isValid($0) }
            return (pulls, try idsWithZips(paths.feedback), tails.sorted(), try idsWithZips(paths.captures))
        }
        var finished: [String] = []
        for (kind, ids) in [
            (RemovalReport.Kind.pull, pullIDs), (.feedback, feedbackIDs), (.tail, tails == nil ? [] : tailIDs), (.capture, captures == nil ? [] : captureIDs),
        ] {
            for id in ids {
                do {
                    // Nil: no record; .some(nil): a record not removed.
                    let removal: Removal?? =
                        switch kind {
                        case .pull: try await pulls.pull(id).map { $0.removed }
                        case .feedback: try await feedback.feedback(id).map { $0.removed }
                        case .tail: try await tails?.tail(id).map { $0.removed }
                        case .capture: try await captures?.capture(id).map { $0.removed }
                        }
                    guard let removal else {
                        if atStart {
                            logger.warning("results that no record names are kept; delete them by hand if they are not wanted", metadata: ["\(kind.rawValue).id": "\(id)"])
                        }
                        continue
                    }
                    guard let removal else { continue }
                    let report = try await remove(kind, id, by: removal.by, reason: removal.reason, now: now)
                    logger.notice("finished a removal cut short", metadata: ["\(kind.rawValue).id": "\(id)", "bytes": "\(report?.freedBytes ?? 0)"])
                    finished.append(id)
                } catch is RemovalInProgress {
                    continue  // an engineer's removal of it is running: it finishes it
                } catch {
                    logger.error("could not finish a removal cut short; tried again later", metadata: ["\(kind.rawValue).id": "\(id)", "error": "\(error)"])
                }
            }
        }
        return finished
    }

    // MARK: Disk use

    /// What a pull's results are on disk: its directory (every agent's files and zip, and
    /// the whole-pull zip).
    func files(ofPull id: String) throws -> [String] { [try paths.pull(id)] }

    /// What a feedback's results are on disk: its files and its zip.
    func files(ofFeedback id: String) throws -> [String] { [try paths.feedbackFiles(id), try paths.feedbackZip(id)] }

    /// What a capture's results are on disk: its files and its zip.
    func files(ofCapture id: String) throws -> [String] { [try paths.captureFiles(id), try paths.captureZip(id)] }

    /// Bytes a capture's files and zip take on disk.
    public func diskUse(capture id: String) async throws -> Int64 {
        let files = try files(ofCapture: id)
        return try await blocking.runIfActive { try Self.size(files) }
    }

    /// Bytes a pull's files take on disk (0 once removed).
    public func diskUse(pull id: String) async throws -> Int64 {
        let files = try files(ofPull: id)
        return try await blocking.runIfActive { try Self.size(files) }
    }

    /// Bytes a feedback's files and zip take on disk.
    public func diskUse(feedback id: String) async throws -> Int64 {
        let files = try files(ofFeedback: id)
        return try await blocking.runIfActive { try Self.size(files) }
    }

    /// Fills in ``PullRecord/diskBytes``.
    public func measured(_ pulls: [PullRecord]) async throws -> [PullRecord] {
        try await measured(pulls, files: { try files(ofPull: $0.id) }, set: { $0.diskBytes = $1 })
    }

    /// Fills in ``FeedbackRecord/diskBytes``.
    public func measured(_ feedback: [FeedbackRecord]) async throws -> [FeedbackRecord] {
        try await measured(feedback, files: { try files(ofFeedback: $0.id) }, set: { $0.diskBytes = $1 })
    }

    private func measured<Record>(_ records: [Record], files: (Record) throws -> [String], set: (inout Record, Int64) -> Void) async throws -> [Record] {
        let paths = try records.map(files)
        let sizes = try await blocking.runIfActive { try paths.map { try Self.size($0) } }
        return zip(records, sizes).map { record, size in
            var record = record
            set(&record, size)
            return record
        }
    }

    // MARK: Files (blocking)

    /// A path's `lstat`; nil when nothing is there (a parent that is not a directory holds
    /// nothing either). Any other failure throws, saying what was being `done`.
    private static func info(_ path: String, _ doing: String) throws -> stat? {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            if errno == ENOENT || errno == ENOTDIR { return nil }
            throw DataDirectory.PathError(description: "cannot \(doing) \(path): \(String(cString: strerror(errno)))")
        }
        return info
    }

    /// The bytes under each path (a file, or a directory walked without following links);
    /// a missing path is 0.
    static func size(_ paths: [String]) throws -> Int64 {
        var total: Int64 = 0
        for path in paths {
            guard let info = try info(path, "measure") else { continue }
            guard (info.st_mode & S_IFMT) == S_IFDIR else {
                total += Int64(info.st_size)
                continue
            }
            let names: [String]
            do {
                names = try FileManager.default.contentsOfDirectory(atPath: path)
            } catch CocoaError.fileReadNoSuchFile, CocoaError.fileNoSuchFile {
                continue  // deleted while it was measured
            }
            total += try size(names.map { path + "/" + $0 })
        }
        return total
    }

    /// Deletes each path (missing ones are no error); returns the bytes they held.
    static func delete(_ paths: [String]) throws -> Int64 {
        var freed: Int64 = 0
        for path in paths where try info(path, "delete") != nil {
            freed += try size([path])
            try FileManager.default.removeItem(atPath: path)
        }
        return freed
    }

    /// The agent directories (and zips) of a pull's directory, as agent ids.
    static func agentDirectories(in directory: String) throws -> Set<String> {
        Set(try DataDirectory.entries(of: directory).compactMap { name -> String? in
            let base = name.hasSuffix(".zip") ? String(name.dropLast(4)) : name.hasSuffix(".partial") ? String(name.dropLast(8)) : name
            return WireID.isValid(base) ? base : nil
        })
    }
}

/// A value every copy of a struct shares, under a lock.
final class Shared<Value: Sendable>: Sendable {
    let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
}
