import DredgeAdminAPI
import DredgeDomain
import DredgePayload
import DredgeWire
import Foundation
import Logging
import NIOPosix
import ServiceLifecycle
import Synchronization

/// Makes every landed pull and feedback searchable: the listener reports each upload it
/// completes (``landed(_:)``), and the indexer reads its files (the manifest's contexts, then
/// each day file in blocks of whole lines) into the ``RecordIndex``, one source at a time, in
/// the order they landed. Records are searchable block by block, while the rest of the source
/// is still being read.
///
/// At start it indexes what landed while it was not running: every `pulls/<pull>/<agent>/`
/// and `feedback/<id>/` that the index does not list as finished (a source cut short by a
/// crash is indexed again from the start). In a cluster it looks again every few minutes
/// (`catchUpEvery`), so what a dead node left unindexed is taken over by a live one. Files are read on `blocking`, never on Swift's
/// cooperative pool. A source that cannot be indexed (unreadable manifest, a failing index)
/// is logged and tried again later (after a minute, doubling up to an hour), and at the next
/// start; meanwhile searches count it as still indexing. So is a source another node of a
/// cluster is indexing (``IndexedElsewhere``), looked at again every minute: by then it is
/// done, or free again once that node's lease ended. The
/// files are never changed.
public final class Indexer: Service, Sendable {
    public static let blockBytes = 4 << 20

    let index: any RecordIndex
    /// Where each source's device is looked up (nil: sources are named by their contexts).
    let registry: (any AgentDirectory)?
    /// Where a tail's uid and what is held of each part are read (nil: tails are not indexed).
    let tails: (any TailRegistry)?
    let paths: DataDirectory
    let logger: Logger
    let blocking: NIOThreadPool
    private let queue: (stream: AsyncStream<IndexedSource>, continuation: AsyncStream<IndexedSource>.Continuation)
    /// Sources reported and not yet finished (or failed), and the one being indexed.
    private let waiting = Mutex<(all: Set<IndexedSource>, current: IndexedSource?)>(([], nil))
    /// How long after a failure a source is tried again: doubling from a minute to an hour.
    private let failures = Mutex<[IndexedSource: Int]>([:])
    let retryBase: Duration
    /// How often what landed is looked over again while running (nil: at start only). In a
    /// cluster, what a dead node left unindexed is picked up by the nodes still running.
    let catchUpEvery: Duration?
    /// Where indexed records are counted (`GET /metrics`).
    let metrics: ServerMetrics?
    /// Each source not yet searchable in full: when it was first reported, and its records when
    /// known (from its upload, or its manifest once begun); and the records of the source being
    /// indexed that are in already. For the index's lag.
    private let lagBook = Mutex<(sources: [IndexedSource: (since: ContinuousClock.Instant, records: Int?)], current: (IndexedSource, Int)?)>(([:], nil))

    /// - Parameter registry: names each source's records by the device its agent is registered
    ///   as, never by what its payload claims; nil only where no agent is registered (tools and
    ///   tests that index files alone).
    public init(
        index: any RecordIndex, registry: (any AgentDirectory)?, tails: (any TailRegistry)? = nil, paths: DataDirectory, logger: Logger,
        blocking: NIOThreadPool = .singleton, retryBase: Duration = .seconds(60), catchUpEvery: Duration? = nil, metrics: ServerMetrics? = nil
    ) {
        self.tails = tails
        self.metrics = metrics
        self.index = index
        self.registry = registry
        self.retryBase = retryBase
        self.catchUpEvery = catchUpEvery
        self.paths = paths
        self.logger = logger
        self.blocking = blocking
        queue = AsyncStream.makeStream(of: IndexedSource.self)
    }

    /// A pull's files from one agent, or a feedback's, are in place: index them soon.
    /// A source already waiting (or being indexed) is not queued twice.
    /// `records`: how many it holds, when the caller knows (the upload's manifest said).
    public func landed(_ source: IndexedSource, records: Int? = nil) {
        lagBook.withLock { book in
            let since = book.sources[source]?.since ?? .now
            book.sources[source] = (since, records ?? book.sources[source]?.records)
        }
        guard waiting.withLock({ $0.all.insert(source).inserted }) else { return }
        queue.continuation.yield(source)
    }

    /// How far behind the index is: sources not yet searchable in full, their records not yet
    /// in (of those whose count is known), and how long the oldest has waited.
    public func lag(now: ContinuousClock.Instant = .now) -> (sources: Int, records: Int, oldest: Duration) {
        lagBook.withLock { book in
            let records = book.sources.values.reduce(0) { $0 + ($1.records ?? 0) } - (book.current?.1 ?? 0)
            let oldest = book.sources.values.map(\.since).min().map { now - $0 } ?? .zero
            return (book.sources.count, max(records, 0), oldest)
        }
    }

    /// Reads the index's lag into `metrics` at each scrape.
    public func lagSampler(into metrics: ServerMetrics) -> ServerMetrics.Sampler {
        ServerMetrics.Sampler("index lag") { [weak self] in
            guard let lag = self?.lag() else { return }
            metrics.indexBacklog.set(Double(lag.sources))
            metrics.indexLagRecords.set(Double(lag.records))
            metrics.indexLagSeconds.set(Double(lag.oldest.components.seconds) + Double(lag.oldest.components.attoseconds) / 1e18)
        }
    }

    /// The source needs no more indexing (done, removed, or gone): no longer behind.
    private func caughtUp(_ source: IndexedSource) {
        lagBook.withLock { book in
            book.sources.removeValue(forKey: source)
            if book.current?.0 == source { book.current = nil }
        }
    }

    /// Sources reported and not yet indexed, the one being indexed included.
    public var backlog: Int { waiting.withLock { $0.all.count } }

    /// Sources reported and not yet begun, and those waiting to be tried again (what the index
    /// itself may not count as unfinished: a source can fail before it is begun).
    public var queued: Int { waiting.withLock { $0.all.count - ($0.current == nil ? 0 : 1) } + retrying.withLock { $0.count } }

    /// Sources whose indexing failed, waiting for their retry.
    private let retrying = Mutex<Set<IndexedSource>>([])
    /// Sources whose results were deleted while they waited or were being indexed: what was
    /// indexed of them is removed again once the indexing step ends.
    private let removed = Mutex<Set<IndexedSource>>([])

    /// The source's files are being deleted (``ResultsKeeper``): if it is waiting, it is not
    /// indexed; if it is being indexed, its records are removed from the index when that step
    /// ends, so the removal's own `remove` cannot be undone by a step still running.
    public func forget(_ source: IndexedSource) {
        let pending = waiting.withLock { $0.all.contains(source) } || retrying.withLock { $0.contains(source) }
        guard pending else { return }
        removed.withLock { _ = $0.insert(source) }
    }

    public func run() async throws {
        await catchUp()
        let sweeping = catchUpEvery.map { every in
            Task { [weak self] in
                while !Task.isCancelled {
                    do { try await Task.sleep(for: every) } catch { return }
                    await self?.catchUp()
                }
            }
        }
        defer { sweeping?.cancel() }
        for await source in queue.stream.cancelOnGracefulShutdown() {
            await indexLogging(source)
        }
    }

    /// Indexes every landed source the index does not list as finished.
    func catchUp() async {
        do {
            let done = try await index.indexedSources()
            let indexedFeedback = Set(done.filter { $0.kind == .feedback || $0.kind == .capture }.map(\.id))
            let landed = try await blocking.runIfActive { [paths] in try Self.landedSources(paths, skippingFeedback: indexedFeedback) }
            // Not those waiting for a retry already (one another node is indexing, say).
            let missing = landed.filter { source in !done.contains(source) && !retrying.withLock { $0.contains(source) } }
            if !missing.isEmpty { logger.info("indexing pulls and feedback that landed before", metadata: ["count": "\(missing.count)"]) }
            for source in missing { self.landed(source) }
        } catch {
            logger.error("cannot list what landed before; it is indexed on the next start", metadata: ["error": "\(error)"])
        }
    }

    private func indexLogging(_ source: IndexedSource) async {
        waiting.withLock { $0.current = source }
        // Still behind only when it is to be tried again.
        var retried = false
        defer { if !retried { caughtUp(source) } }
        defer {
            waiting.withLock {
                $0.all.remove(source)
                $0.current = nil
            }
        }
        defer { removed.withLock { _ = $0.remove(source) } }
        do {
            if removed.withLock({ $0.contains(source) }) {
                failures.withLock { _ = $0.removeValue(forKey: source) }
                try await index.remove(source)
                return
            }
            // Reported again (an upload adopted after a restart): already done.
            if try await index.isIndexed(source) {
                failures.withLock { _ = $0.removeValue(forKey: source) }
                return
            }
            let count = try await index(source)
            failures.withLock { _ = $0.removeValue(forKey: source) }
            if removed.withLock({ $0.contains(source) }) {
                // Deleted while it was being indexed: what this step added goes too.
                try await index.remove(source)
                logger.info("results removed while they were indexed; their records are out of the index", metadata: ["source": "\(source)"])
                return
            }
            logger.info("indexed", metadata: ["source": "\(source)", "records": "\(count.records)", "unreadable": "\(count.unreadable)", "foreign": "\(count.foreign)"])
            if count.unreadable > 0 {
                logger.warning("lines that are not records of their day file were left out of the index", metadata: ["source": "\(source)", "lines": "\(count.unreadable)"])
            }
            if count.foreign > 0 {
                // Only an agent that is not honest sends these (it exports by the uid asked for).
                logger.warning("records of another user than the one asked for were left out of the index", metadata: [
                    "source": "\(source)", "agent.id": "\(source.agentID)", "records": "\(count.foreign)",
                ])
            }
        } catch {
            if isGone(source) {
                // Its results were deleted (dredge rm, retention): nothing to index, nothing to retry.
                failures.withLock { _ = $0.removeValue(forKey: source) }
                do { try await index.remove(source) } catch { logger.error("could not clear a removed source from the index", metadata: ["source": "\(source)", "error": "\(error)"]) }
                logger.info("not indexed: its results were removed", metadata: ["source": "\(source)"])
                return
            }
            let elsewhere = error is IndexedElsewhere
            let attempt = elsewhere ? 0 : failures.withLock { failures in
                failures[source, default: 0] += 1
                return failures[source] ?? 1
            }
            let wait = Self.retryDelay(afterFailure: attempt, base: retryBase)
            if elsewhere {
                // Another node of the cluster has it: looked at again later, done by then (or
                // free, if that node died).
                logger.info("being indexed by another node; looked at again later", metadata: [
                    "source": "\(source)", "error": "\(error)", "retry.seconds": "\(wait.components.seconds)",
                ])
            } else {
                logger.error("could not index; the files stay, and it is tried again later", metadata: [
                    "source": "\(source)", "error": "\(error)", "retry.seconds": "\(wait.components.seconds)",
                ])
            }
            retried = true
            lagBook.withLock { if $0.current?.0 == source { $0.current = nil } }
            retrying.withLock { _ = $0.insert(source) }
            // Not a child of run(): after the server stops it wakes at most once more, and its
            // source goes to a queue nobody reads; the next start catches up from the files.
            Task { [weak self] in
                try? await Task.sleep(for: wait)  // only the wait is lost if it is cancelled
                guard let self else { return }
                self.retrying.withLock { _ = $0.remove(source) }
                self.landed(source)
            }
        }
    }

    /// How long a source waits to be tried again: after its `attempt`th failure, the base
    /// doubled each time up to an hour; a source another node is indexing (attempt 0, not a
    /// failure) is looked at again after the base alone, so one whose node died is taken
    /// over soon after that node's lease ends, not an hour later.
    static func retryDelay(afterFailure attempt: Int, base: Duration) -> Duration {
        min(base * (1 << min(max(attempt, 1) - 1, 6)), .seconds(3600))
    }

    /// Indexes one source now, from the start.
    @discardableResult
    public func index(_ source: IndexedSource) async throws -> IndexCount {
        if source.kind == .tail { return try await indexTail(source) }
        let directory = try directory(of: source)
        let manifestPath = try paths.inside(directory + "/" + PayloadLimits.manifestName)
        let manifest = try await blocking.runIfActive { () throws -> ExportManifest in
            guard let data = FileManager.default.contents(atPath: manifestPath) else { throw IndexingError("\(manifestPath) cannot be read") }
            do {
                return try JSONDecoder().decode(ExportManifest.self, from: data)
            } catch {
                throw IndexingError("\(manifestPath) is not a manifest: \(error)")
            }
        }
        // Named by the device the registry knows the uploading agent as; a source of an agent
        // the registry does not hold is named by nothing it claims.
        let device: RegisteredDevice? =
            if let registry { try await registry.device(source.agentID) ?? RegisteredDevice(hostname: "", os: "", app: "", appVersion: "") } else { nil }
        try await index.begin(source, contexts: manifest.contexts, device: device, landedAt: Date())
        lagBook.withLock { book in
            if let known = book.sources[source] { book.sources[source] = (known.since, known.records ?? manifest.recordCount) }
            book.current = (source, 0)
        }
        // Only the uid the pull or feedback asked for: the manifest's filter was checked against
        // the pull (its target's uid) or the feedback's header when the upload landed.
        let onlyUID = manifest.filter.uid.flatMap { $0.isEmpty ? nil : $0 }
        var count = IndexCount()
        for day in manifest.days {
            guard day.file != PayloadLimits.manifestName, PayloadLimits.isAllowedName(day.file), let admission = LineAdmission(file: day.file, uid: onlyUID) else {
                throw IndexingError("the manifest names \(day.file.debugDescription), not a day file")
            }
            let file = try paths.inside(directory + "/" + day.file)
            let reader = try await blocking.runIfActive { try LineBlockReader(path: file, blockBytes: Self.blockBytes) }
            while let block = try await blocking.runIfActive({ try reader.next() }) {
                let added = try await index.add(source, lines: block, admitting: admission)
                count += added
                metrics?.indexed(records: added.records)
                lagBook.withLock { book in
                    if let current = book.current, current.0 == source { book.current = (source, current.1 + added.records + added.foreign + added.unreadable) }
                }
            }
            count.unreadable += reader.overlong
        }
        try await index.finish(source)
        return count
    }

    /// What a live tail held of one device: the records file up to the bytes held (what
    /// follows is a batch never recorded as held), its contexts, the tail's uid only.
    private func indexTail(_ source: IndexedSource) async throws -> IndexCount {
        guard let tails else { throw IndexingError("this server does not index tails") }
        guard let tail = try await tails.tail(source.id), let part = tail.parts.first(where: { $0.agentID == source.agentID }) else {
            throw IndexingError("no tail \(source.id) of agent \(source.agentID)")
        }
        // Removed: nothing to index. Still running: indexed whole once it ends (it is reported
        // then); indexing it now would mark it done with what it held so far.
        if tail.removed != nil || (tail.stopped == nil && !part.status.isFinal) { return IndexCount() }
        let directory = try directory(of: source)
        let contexts = try await blocking.runIfActive { try TailFiles.contexts(in: directory) }
        let device: RegisteredDevice? =
            if let registry { try await registry.device(source.agentID) ?? RegisteredDevice(hostname: "", os: "", app: "", appVersion: "") } else { nil }
        try await index.begin(source, contexts: contexts, device: device, landedAt: Date())
        var count = IndexCount()
        let file = try paths.inside(directory + "/" + TailFiles.records)
        if part.bytes > 0 {
            let reader = try await blocking.runIfActive { try LineBlockReader(path: file, blockBytes: Self.blockBytes, limit: part.bytes) }
            while let block = try await blocking.runIfActive({ try reader.next() }) {
                let added = try await index.add(source, lines: block, admitting: LineAdmission(uid: tail.uid))
                count += added
                metrics?.indexed(records: added.records)
            }
            count.unreadable += reader.overlong
        }
        try await index.finish(source)
        // Removed meanwhile (on another node, whose removal could not stop this step): its rows go.
        if try await tails.tail(source.id)?.removed != nil {
            try await index.remove(source)
            return IndexCount()
        }
        return count
    }

    /// The source's directory is no longer there (its results were deleted).
    private func isGone(_ source: IndexedSource) -> Bool {
        guard let directory = try? directory(of: source) else { return false }  // not a path we make: an ordinary failure
        return !FileManager.default.fileExists(atPath: directory)
    }

    private func directory(of source: IndexedSource) throws -> String {
        switch source.kind {
        case .pull: try paths.pullFiles(source.id, agent: source.agentID)
        case .feedback: try paths.feedbackFiles(source.id)
        case .capture: try paths.captureFiles(source.id)
        case .tail: try paths.tailFiles(source.id, agent: source.agentID)
        }
    }

    /// Every finished result under the data directory: `pulls/<pull>/<agent>/` and
    /// `feedback/<id>/` and `captures/<id>/` (whose agent its manifest names). Staging
    /// (`*.partial`) and zips are not results. Feedback and captures in `skippingFeedback`
    /// (indexed already) are left out without
    /// reading its manifest, so a start reads only the manifests it needs.
    static func landedSources(_ paths: DataDirectory, skippingFeedback: Set<String> = []) throws -> [IndexedSource] {
        let fm = FileManager.default
        func directories(_ path: String) throws -> [String] {
            var isDirectory: ObjCBool = false
            guard fm.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue else { return [] }
            return try fm.contentsOfDirectory(atPath: path).filter { name in
                var d: ObjCBool = false
                return fm.fileExists(atPath: path + "/" + name, isDirectory: &d) && d.boolValue && !name.hasSuffix(".partial")
            }.sorted()
        }
        var sources: [IndexedSource] = []
        for pull in try directories(paths.pulls) where WireID.isValid(pull) {
            for agent in try directories(paths.pulls + "/" + pull) where WireID.isValid(agent) {
                sources.append(IndexedSource(kind: .pull, id: pull, agentID: agent))
            }
        }
        // A tail's parts: one still running is left for when it ends (``indexTail``).
        for tail in try directories(paths.tails) where WireID.isValid(tail) {
            for agent in try directories(paths.tails + "/" + tail) where WireID.isValid(agent) {
                sources.append(IndexedSource(kind: .tail, id: tail, agentID: agent))
            }
        }
        // Feedback and captures: their agent is the one their manifest names.
        for (kind, root) in [(IndexedSource.Kind.feedback, paths.feedback), (.capture, paths.captures)] {
            for id in try directories(root) where WireID.isValid(id) && !skippingFeedback.contains(id) {
                let manifest = try paths.inside(root + "/" + id) + "/" + PayloadLimits.manifestName
                guard let data = fm.contents(atPath: manifest), let decoded = try? JSONDecoder().decode(ExportManifest.self, from: data) else { continue }  // not a finished result: nothing to index
                sources.append(IndexedSource(kind: kind, id: id, agentID: decoded.agentID))
            }
        }
        return sources
    }
}

/// Why a landed source could not be indexed.
public struct IndexingError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Reads a file in blocks of whole lines: each block ends after a `\n` (the last one may
/// not, if the file does not end with one). The first block is small (256 KiB), so a source's
/// first records are searchable soon. A line that runs past ``maxLineBytes`` across reads is
/// skipped to its end and counted in ``overlong``, so memory stays bounded by a block plus that
/// limit whatever the file holds (a line within one read is bounded by the read).
final class LineBlockReader: Sendable {
    static let maxLineBytes = 16 << 20
    static let firstBlockBytes = 256 << 10
    private let handle: FileHandle
    private let blockBytes: Int
    private let maxLineBytes: Int
    /// Bytes of the file read at most (nil: to its end).
    private let limit: Int64?
    /// Used by one indexing step at a time, on whichever pool thread runs it.
    private let position = Mutex(Position())

    private struct Position {
        /// The bytes after the last newline handed out: the start of the next line.
        var carry: [UInt8] = []
        /// Inside an over-long line: bytes are dropped up to its newline.
        var skipping = false
        var ended = false
        var reads = 0
        var overlong = 0
        var read: Int64 = 0
    }

    init(path: String, blockBytes: Int, maxLineBytes: Int = LineBlockReader.maxLineBytes, limit: Int64? = nil) throws {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw IndexingError("\(path) cannot be opened") }
        self.handle = handle
        self.blockBytes = blockBytes
        self.maxLineBytes = maxLineBytes
        self.limit = limit
    }

    deinit { try? handle.close() }  // read only; nothing to lose

    /// Lines skipped for being longer than the limit.
    var overlong: Int { position.withLock { $0.overlong } }

    func next() throws -> [UInt8]? {
        try position.withLock { position throws -> [UInt8]? in
            while !position.ended {
                position.reads += 1
                var want = position.reads == 1 ? min(blockBytes, Self.firstBlockBytes) : blockBytes
                if let limit { want = Int(min(Int64(want), max(0, limit - position.read))) }
                guard want > 0, let data = try handle.read(upToCount: want), !data.isEmpty else {
                    position.ended = true
                    break
                }
                position.read += Int64(data.count)
                var bytes = [UInt8](data)
                if position.skipping {
                    guard let newline = bytes.firstIndex(of: 0x0A) else { continue }
                    bytes.removeSubrange(...newline)
                    position.skipping = false
                }
                // Only the new bytes are searched: a long line costs one pass, not one per read.
                if let lastNewline = bytes.lastIndex(of: 0x0A) {
                    var block = position.carry
                    block.append(contentsOf: bytes[...lastNewline])
                    position.carry = Array(bytes[(lastNewline + 1)...])
                    trimCarry(&position)
                    return block
                }
                position.carry.append(contentsOf: bytes)
                trimCarry(&position)
            }
            guard !position.carry.isEmpty else { return nil }
            defer { position.carry = [] }
            return position.carry + [0x0A]
        }
    }

    private func trimCarry(_ position: inout Position) {
        guard position.carry.count > maxLineBytes else { return }
        position.overlong += 1
        position.carry = []
        position.skipping = true
    }
}
