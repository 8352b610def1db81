import DredgeDomain
import DredgeStore
import Foundation
import Synchronization

/// What an app keeps in its rewind buffer (#54, ``RewindBuffer``): the records its loggers log
/// below their levels, from `level` up, in a ring of `bytes` beside the store. Frozen into the
/// store, the minutes before an incident come with their debug records: by the app
/// (``LogCenter/freezeRewind()``) and, after a crash, by the next center to open the store. A
/// clean close lets it go.
///
/// ```swift
/// let center = try LogCenter(path: path, context: .current(app: "oven"), rewind: RewindConfiguration(bytes: 4 << 20))
/// let log = center.logger(minimumLevel: .info)
/// log.debug("cache miss")           // not stored: kept in the rewind buffer
/// try center.freezeRewind()          // now stored, marked `dredge.rewound`
/// ```
public struct RewindConfiguration: Sendable, Hashable {
    /// The ring's size: 64 KiB to 64 MiB (4 MiB by default: a few minutes of a chatty app).
    public var bytes: Int
    /// The lowest level kept: debug by default (trace records, such as SwiftNIO's through
    /// swift-log, are many and seldom what an incident needs).
    public var level: LogLevel

    public init(bytes: Int = 4 << 20, level: LogLevel = .debug) {
        self.bytes = bytes
        self.level = level
    }
}

extension LogCenter {
    /// Marks the run (after finding the other processes' runs that ended uncleanly, and freezing
    /// their buffers) and makes the rewind buffer. Nothing here stops the center from opening:
    /// what fails is said in `problems`, logged as warnings by the caller.
    static func startRun(_ store: LogStore, context: ContextID, rewind: RewindConfiguration?) -> (
        run: StoreRun?, buffer: RewindBuffer?, unclean: [StoreRun], problems: [(String, LogMetadata)]
    ) {
        guard !store.configuration.readOnly else { return (nil, nil, [], []) }
        var problems: [(String, LogMetadata)] = []
        var unclean: [StoreRun] = []
        do {
            let found = try store.markUncleanEnds()
            unclean = found.marked
            for problem in found.problems { problems.append((problem, [:])) }
        } catch {
            problems.append(("cannot look for the runs that ended uncleanly: \(error)", ["dredge.error": .string("\(error)")]))
        }
        let run: StoreRun
        do {
            run = try store.beginRun(context: context, keepsRewind: rewind != nil)
        } catch {
            problems.append(("cannot mark this run as started: a crash of it will not be known: \(error)", ["dredge.error": .string("\(error)")]))
            return (nil, nil, unclean, problems)
        }
        guard let rewind, let name = run.rewind else { return (run, nil, unclean, problems) }
        do {
            let buffer = try RewindBuffer.create(at: store.rewindDirectory + "/" + name, capacity: rewind.bytes)
            return (run, buffer, unclean, problems)
        } catch {
            problems.append(("cannot keep a rewind buffer: records below the loggers' levels are dropped: \(error)", ["dredge.error": .string("\(error)")]))
            return (run, nil, unclean, problems)
        }
    }

    /// The watch that freezes `buffer` when an agent asks; nil without a buffer.
    static func watchFreezes(_ store: LogStore, _ buffer: RewindBuffer?, context: ContextID) -> RewindFreezeWatch? {
        guard let buffer else { return nil }
        return RewindFreezeWatch(store: store, buffer: buffer, context: context) { problem in
            store.enqueue(LogEntry(timestamp: .now, level: .warning, type: .app, uid: "", message: problem, context: context))
        }
    }

    func warn(_ problem: (String, LogMetadata)) {
        submit(level: .warning, type: .app, message: problem.0, metadata: problem.1, at: nil, uid: nil)
    }

    /// Whether a record at `level`, below its logger's level, goes to the rewind buffer.
    @inline(__always)
    public func rewinds(_ level: LogLevel) -> Bool {
        guard let rewindLevel else { return false }
        return level >= rewindLevel
    }

    /// Puts a record below its logger's level into the rewind buffer (stamped with the current
    /// uid unless given). Never waits for the disk; false when the buffer did not take it (none
    /// is kept, or the record is larger than a quarter of it).
    @discardableResult
    func rewind(level: LogLevel, type: LogType, message: String, metadata: LogMetadata, at timestamp: Timestamp?, uid: String?) -> Bool {
        guard let rewindBuffer else { return false }
        let entry = LogEntry(timestamp: timestamp ?? .now, level: level, type: type, uid: uid ?? self.uid, message: message, metadata: metadata, context: context)
        return rewindBuffer.append(entry)
    }

    /// Freezes the rewind buffer into the store now: its records, each marked `dredge.rewound`,
    /// are stored (one transaction) and the buffer lets them go. What a feedback or the app's
    /// own sense of trouble calls; returns how many were frozen (0 when none is kept).
    @discardableResult
    public func freezeRewind() throws -> Int {
        guard let rewindBuffer else { return 0 }
        return try store.freeze(rewindBuffer, context: context)
    }
}

/// Freezes a center's rewind buffer when the store's count of freeze requests goes up (an
/// agent asked, at a trigger's match: ``LogStore/requestRewindFreeze()``), looked at about once
/// a second on a utility queue, never on a logging thread. Stopped before the buffer closes.
/// (`@unchecked`: its one stored value outside the mutex is a GCD timer, safe from any thread.)
final class RewindFreezeWatch: @unchecked Sendable {
    static let interval: DispatchTimeInterval = .seconds(1)

    private struct State {
        /// The count of requests already answered; nil until the store could first be read
        /// (requests made before this run began are not its).
        var seen: Int64?
        var stopped = false
    }

    /// Held while a look runs, and by ``stop()``: no look runs after it returns.
    private final class Looks: Sendable {
        let state: Mutex<State>
        init(seen: Int64?) { state = Mutex(State(seen: seen)) }
    }

    private let timer: any DispatchSourceTimer
    private let looks: Looks

    init(store: LogStore, buffer: RewindBuffer, context: ContextID, warn: @escaping @Sendable (String) -> Void) {
        // Requests made before this run began are not this run's.
        let seen: Int64?
        do { seen = try store.rewindFreezeRequests() } catch { seen = nil }
        let looks = Looks(seen: seen)
        self.looks = looks
        let timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "dredge.rewind-freeze", qos: .utility))
        self.timer = timer
        timer.schedule(deadline: .now() + Self.interval, repeating: Self.interval, leeway: .milliseconds(200))
        timer.setEventHandler {
            looks.state.withLock { s in
                guard !s.stopped else { return }
                let asked: Int64
                do { asked = try store.rewindFreezeRequests() } catch { return }  // looked at again in a second
                guard let seen = s.seen else {
                    s.seen = asked
                    return
                }
                guard asked > seen else { return }
                // Answered either way: a freeze that fails is said once, not tried every second.
                s.seen = asked
                do {
                    try store.freeze(buffer, context: context)
                } catch {
                    warn("cannot freeze the rewind buffer an agent asked for: \(error)")
                }
            }
        }
        timer.resume()
    }

    /// No look runs once this returns.
    func stop() {
        looks.state.withLock { $0.stopped = true }
        timer.cancel()
    }
}
