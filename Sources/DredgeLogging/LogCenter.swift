import DredgeDomain
import DredgeStore
import Foundation
import Synchronization

/// The client side an app embeds: one per store and process. It stamps every record with the
/// current user and the process's context row, applies privacy, and hands records to the store.
///
/// ```swift
/// let center = try LogCenter(path: "/var/lib/myapp/logs.sqlite", context: .current(app: "oven", appVersion: "2.1"))
/// center.setUser("42")                      // on login; setUser(nil) on logout
/// let log = center.logger(type: .business)
/// log.info("order placed", metadata: ["order": "A-17", "email": .hashed(email)])
/// LoggingSystem.bootstrap { center.logHandler(label: $0) }   // swift-log users log here too
/// ```
public final class LogCenter: Sendable {
    public let store: LogStore
    /// The context row every record of this center refers to.
    public let context: ContextID
    public let redactor: Redactor
    private let currentUID = Mutex("")
    /// Invalid type names already recorded as a warning.
    private let warned = Mutex<Set<String>>([])
    private let ownsStore: Bool

    /// Sees every record as it is enqueued (tests: ``LogRecorder``).
    public let recorder: LogRecorder?
    /// Prints every record to stderr as well (while developing); nil: off.
    public let echo: ConsoleEcho?
    /// A directory of this center's own, removed by ``close()`` (``recording(_:)``).
    private let scratch: String?
    /// What a sign-in does to the anonymous records before it.
    public let beforeSignIn: RecordsBeforeSignIn
    /// When this center was opened: where ``RecordsBeforeSignIn/processRun`` begins.
    private let opened = Timestamp.now
    /// The verbosity windows open in the store (``VerbosityWindow``, Protocol § 20) as last
    /// read: a log call below its logger's level asks here, never the store itself. Read again
    /// when older than a second, off the caller's thread.
    private let verbosity = Mutex<(windows: [VerbosityWindow], readAt: ContinuousClock.Instant?, reading: Bool)>(([], nil, false))
    static let verbosityRefresh: Duration = .seconds(1)

    /// This process's run over the store (``StoreRun``), marked as started when the center
    /// opened and as ended cleanly by ``close()``; nil when it could not be marked (a warning
    /// in the store says why) or the store is read-only.
    public let run: StoreRun?
    /// The rewind buffer (``RewindConfiguration``); nil when none is kept.
    let rewindBuffer: RewindBuffer?
    /// The lowest level the rewind buffer keeps; nil when none is kept.
    public let rewindLevel: LogLevel?
    /// Runs of other processes found ended uncleanly as this center opened (their rewind
    /// buffers frozen into the store).
    public let uncleanEnds: [StoreRun]
    /// Whether ``close()`` has ended the run (a second close does not end it again).
    private let runEnded = Mutex(false)
    /// Freezes the rewind buffer when an agent asks (nil when no buffer is kept).
    private let freezeWatch: RewindFreezeWatch?

    /// Uses an open store (several centers may share one, each with its own context).
    public init(
        store: LogStore, context: LogContext = .current(), recorder: LogRecorder? = nil, echo: ConsoleEcho? = nil,
        beforeSignIn: RecordsBeforeSignIn = .processRun, rewind: RewindConfiguration? = nil
    ) throws {
        self.store = store
        self.beforeSignIn = beforeSignIn
        self.context = try store.register(context)
        self.redactor = Redactor(installKey: store.installKey)
        self.ownsStore = false
        self.recorder = recorder
        self.echo = echo
        self.scratch = nil
        let started = Self.startRun(store, context: self.context, rewind: rewind)
        (run, rewindBuffer, uncleanEnds) = (started.run, started.buffer, started.unclean)
        rewindLevel = started.buffer == nil ? nil : rewind?.level
        freezeWatch = Self.watchFreezes(store, started.buffer, context: self.context)
        for problem in started.problems { warn(problem) }
    }

    /// Opens the store at `path` and owns it: ``close()`` closes it.
    public convenience init(
        path: String, configuration: StoreConfiguration = StoreConfiguration(), context: LogContext = .current(), recorder: LogRecorder? = nil,
        echo: ConsoleEcho? = nil, beforeSignIn: RecordsBeforeSignIn = .processRun, rewind: RewindConfiguration? = nil
    ) throws {
        try self.init(
            path: path, configuration: configuration, context: context, recorder: recorder, echo: echo, beforeSignIn: beforeSignIn, rewind: rewind, scratch: nil)
    }

    private init(
        path: String, configuration: StoreConfiguration, context: LogContext, recorder: LogRecorder?, echo: ConsoleEcho?,
        beforeSignIn: RecordsBeforeSignIn, rewind: RewindConfiguration?, scratch: String?
    ) throws {
        let store = try LogStore(path: path, configuration: configuration)
        self.store = store
        self.beforeSignIn = beforeSignIn
        self.context = try store.register(context)
        self.redactor = Redactor(installKey: store.installKey)
        self.ownsStore = true
        self.recorder = recorder
        self.echo = echo
        self.scratch = scratch
        let started = Self.startRun(store, context: self.context, rewind: rewind)
        (run, rewindBuffer, uncleanEnds) = (started.run, started.buffer, started.unclean)
        rewindLevel = started.buffer == nil ? nil : rewind?.level
        freezeWatch = Self.watchFreezes(store, started.buffer, context: self.context)
        for problem in started.problems { warn(problem) }
        if let replaced = store.replacedRetention, let now = store.retentionAtOpen.stored {
            // Every process that has the store open applies the new policy from its next pass.
            submit(
                level: .notice, type: .app, message: "the store's retention policy changed from \(replaced) to \(now.policy)",
                metadata: ["dredge.retention.previous": .string(replaced.description), "dredge.retention.policy": .string(now.policy.description)],
                at: nil, uid: "")
        }
    }

    /// A center for tests: a real store in a temporary directory of its own (removed by
    /// ``close()``), every record also kept by `recorder` for the test to check.
    ///
    /// ```swift
    /// let recorder = LogRecorder()
    /// let center = try LogCenter.recording(recorder)
    /// Checkout(log: center.logger()).pay()
    /// #expect(recorder.events.map(\.name) == ["paymentFailed"])
    /// ```
    public static func recording(
        _ recorder: LogRecorder, context: LogContext = .current(), beforeSignIn: RecordsBeforeSignIn = .processRun, rewind: RewindConfiguration? = nil
    ) throws -> LogCenter {
        let directory = NSTemporaryDirectory() + "dredge-recording-" + UUID().uuidString
        return try LogCenter(
            path: directory + "/logs.sqlite", configuration: StoreConfiguration(), context: context, recorder: recorder, echo: nil,
            beforeSignIn: beforeSignIn, rewind: rewind, scratch: directory)
    }

    /// The uid stamped on records from now on; empty when nobody is logged in.
    public var uid: String { currentUID.withLock { $0 } }

    /// Sets the logged-in user (login) or clears it with nil (logout). Records logged after the
    /// call carry the new uid. On a sign-in (no user before, one now) the anonymous records
    /// logged just before are given the uid too, as ``beforeSignIn`` says; ``flush()`` waits
    /// for that. Other records already enqueued keep theirs.
    public func setUser(_ uid: String?) {
        let new = uid ?? ""
        currentUID.withLock { current in
            // Queued under the lock entries are stamped and queued under (``submit``): every
            // entry stamped anonymous is queued before it, every entry stamped with the new
            // uid after it.
            if current.isEmpty, !new.isEmpty,
                let attribution = Self.attribution(of: beforeSignIn, uid: new, context: context, opened: opened, now: .now)
            {
                store.attribute(attribution)
            }
            current = new
        }
    }

    public func logger(type: LogType = .app, minimumLevel: LogLevel = .trace, metadata: LogFields = [:]) -> DredgeLogger {
        DredgeLogger(center: self, type: type, minimumLevel: minimumLevel, metadata: metadata)
    }

    /// A swift-log handler writing into this center's store. See ``DredgeLogHandler``.
    public func logHandler(label: String, type: LogType = .app) -> DredgeLogHandler {
        DredgeLogHandler(label: label, center: self, type: type)
    }

    /// Enqueues a finished entry stamped with this center's context and current uid (unless the
    /// entry already names one).
    @discardableResult
    func submit(level: LogLevel, type: LogType, message: String, metadata: LogMetadata, at timestamp: Timestamp?, uid: String?) -> Bool {
        if let given = type.normalizedFrom { warnOnce(given: given, used: type) }
        var entry = LogEntry(
            timestamp: timestamp ?? .now, level: level, type: type, uid: uid ?? "", message: message,
            metadata: metadata, context: context)
        let enqueued: Bool
        if uid != nil {
            enqueued = store.enqueue(entry)
        } else {
            // The current uid is read and the entry queued under one lock, the one `setUser`
            // queues its attribution under: an entry stamped anonymous is always queued before
            // the sign-in's attribution, so the attribution sees it.
            enqueued = currentUID.withLock { current in
                entry.uid = current
                return store.enqueue(entry)
            }
        }
        recorder?.record(entry)
        echo?.print(entry)
        return enqueued
    }

    /// A type name that was not valid and was normalized is recorded once per center (at most
    /// 64 names), as a warning.
    private func warnOnce(given: String, used: LogType) {
        let first = warned.withLock { names -> Bool in
            guard names.count < 64 else { return false }
            return names.insert(given).inserted
        }
        guard first else { return }
        submit(
            level: .warning, type: .app, message: "log type \(given.debugDescription) is not a valid type name; its records are logged as type \"\(used)\"",
            metadata: ["dredge.given_type": .string(given), "dredge.type": .string(used.rawValue)], at: nil, uid: nil)
    }

    // MARK: Verbosity windows

    /// Whether a record of `uid` and `type` below its logger's level is kept anyway: a verbosity
    /// window a live tail opened covers it. Never waits for the store.
    public func keepsVerbose(uid: String, type: LogType) -> Bool {
        let now = Timestamp.now
        return openWindows().contains { $0.admits(uid: uid, type: type, at: now) }
    }

    /// Whether any verbosity window is open (swift-log's handler lowers its level then).
    public var hasVerbosityWindow: Bool {
        let now = Timestamp.now
        return openWindows().contains { now < $0.until }
    }

    /// Reads the store's verbosity windows now (a center reads them by itself about once a second).
    public func refreshVerbosity() {
        let started = ContinuousClock.now
        let windows: [VerbosityWindow]
        do {
            windows = try store.verbosityWindows()
        } catch {
            // The store cannot be read now: the windows as last read stand, and it is tried again.
            verbosity.withLock { $0.reading = false }
            return
        }
        verbosity.withLock { state in
            // A read that began before the one already kept (a slow background read) is older news.
            if state.readAt.map({ started >= $0 }) ?? true {
                state = (windows, started, false)
            } else {
                state.reading = false
            }
        }
    }

    private func openWindows() -> [VerbosityWindow] {
        let (windows, stale) = verbosity.withLock { state -> ([VerbosityWindow], Bool) in
            let stale = !state.reading && state.readAt.map { ContinuousClock.now - $0 >= Self.verbosityRefresh } ?? true
            if stale { state.reading = true }
            return (state.windows, stale)
        }
        if stale { DispatchQueue.global(qos: .utility).async { [self] in refreshVerbosity() } }
        return windows
    }

    /// Waits until everything logged before the call is durable. See ``LogStore/flush()``.
    public func flush() throws { try store.flush() }
    public func flush() async throws { try await store.flush() }

    /// Closes the store if this center opened it (and removes it, for a ``recording(_:)`` center),
    /// after marking this run as ended cleanly: its rewind buffer is let go (nothing went
    /// wrong), its file removed.
    public func close() throws {
        var failure: (any Error)?
        let first = runEnded.withLock { ended in
            defer { ended = true }
            return !ended
        }
        if first {
            do {
                try store.flush()
                if let run { try store.endRun(run.id) }
            } catch {
                failure = error
            }
        }
        freezeWatch?.stop()
        if first, let rewindBuffer {
            do {
                try rewindBuffer.close()
                // A run not marked ended keeps its buffer: the next process that looks freezes it.
                if failure == nil { try LogStore.removeRewindFile(rewindBuffer.path) }
            } catch {
                failure = failure ?? error
            }
        }
        if ownsStore { try store.close() } else { try store.flush() }
        if let scratch { try FileManager.default.removeItem(atPath: scratch) }
        if let failure { throw failure }
    }
}
