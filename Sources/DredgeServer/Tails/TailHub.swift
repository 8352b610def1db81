import DredgeAdminAPI
import DredgeDomain
import Foundation
import Synchronization

/// Where a live tail's watchers are woken, in one server process (#53): the agent listener
/// rings when a batch is held or a device joins or ends, and a stop ends them. What a watcher
/// is shown it reads from what was stored (``TailFollower``), so it holds no records here, a
/// slow one holds up nobody, and the devices connected to other nodes of a cluster are seen too
/// (at the watcher's tick).
///
/// It also carries stops the other way: a tail stopped through the admin API ends its watchers
/// and has the listener tell the devices connected here (``whenStopped(_:)``).
public final class TailHub: Sendable {
    /// Watchers of one tail at once, here.
    public static let watchersPerTail = 16
    /// Tails stopped lately, remembered so a batch already on its way is not written.
    static let stoppedRemembered = 4_096

    private struct State {
        var watchers: [String: [Int: Watcher]] = [:]
        var nextToken = 0
        var stopHandlers: [@Sendable (String, String, [String]) -> Void] = []
        var stopped: Set<String> = []
        var stoppedOrder: [String] = []
    }

    private let state = Mutex(State())

    public init() {}

    /// A watcher of one tail: ``next()`` waits until it is rung, poked or ended.
    public final class Watcher: Sendable {
        let tailID: String
        let token: Int
        private struct Waiting {
            /// Why the tail is over, once it is; `said` once the end was read.
            var ended: String?
            var said = false
            /// Rung or poked since the last read.
            var woken = false
            var waiting: CheckedContinuation<Void, Never>?
        }

        private let waiting = Mutex(Waiting())

        init(tailID: String, token: Int) {
            self.tailID = tailID
            self.token = token
        }

        /// The tail is over: the watcher's next read gives the end.
        func end(_ reason: String) {
            waiting.withLock { w -> CheckedContinuation<Void, Never>? in
                if w.ended == nil { w.ended = reason }
                defer { w.waiting = nil }
                return w.waiting
            }?.resume()
        }

        /// Ends a wait of ``next()`` (something was stored, or a timer's tick).
        public func poke() {
            waiting.withLock { w -> CheckedContinuation<Void, Never>? in
                w.woken = true
                defer { w.waiting = nil }
                return w.waiting
            }?.resume()
        }

        /// Waits until poked (`[]`: read on) or ended (`[end]`); nil once the end was read. One
        /// reader at a time (the stream that subscribed it).
        public func next() async -> [TailEvent]? {
            await withCheckedContinuation { continuation in
                let now = waiting.withLock { w -> Bool in
                    if w.woken || w.ended != nil || w.said { return true }
                    w.waiting = continuation
                    return false
                }
                if now { continuation.resume() }
            }
            return waiting.withLock { w -> [TailEvent]? in
                w.woken = false
                if w.said { return nil }
                guard let ended = w.ended else { return [] }
                w.said = true
                return [TailEvent(kind: .end, reason: ended)]
            }
        }
    }

    /// A new watcher of `tailID`; ``unsubscribe(_:)`` when done. Nil when it has
    /// ``watchersPerTail`` already.
    public func subscribe(_ tailID: String) -> Watcher? {
        state.withLock { s in
            guard (s.watchers[tailID]?.count ?? 0) < Self.watchersPerTail else { return nil }
            s.nextToken += 1
            let watcher = Watcher(tailID: tailID, token: s.nextToken)
            s.watchers[tailID, default: [:]][s.nextToken] = watcher
            return watcher
        }
    }

    public func unsubscribe(_ watcher: Watcher) {
        state.withLock { s in
            s.watchers[watcher.tailID]?[watcher.token] = nil
            if s.watchers[watcher.tailID]?.isEmpty == true { s.watchers[watcher.tailID] = nil }
        }
    }

    /// Something of `tailID` was stored here (a batch held, a device joined or ended): its
    /// watchers read on now rather than at their next tick.
    public func ring(_ tailID: String) {
        for watcher in state.withLock({ Array(($0.watchers[tailID] ?? [:]).values) }) { watcher.poke() }
    }

    /// Whether `tailID` was stopped lately through this process.
    public func isStopped(_ tailID: String) -> Bool { state.withLock { $0.stopped.contains(tailID) } }

    /// The tail stopped (`agents`: those with a part): its watchers end with `reason`, and the
    /// listener tells the devices connected here; once per tail (a second call does nothing).
    public func stopped(_ tailID: String, reason: String, agents: [String]) {
        let (watchers, handlers) = state.withLock { s -> ([Watcher], [@Sendable (String, String, [String]) -> Void]) in
            // Once: this node's own stop comes back to it as the cluster's notice.
            guard s.stopped.insert(tailID).inserted else { return ([], []) }
            s.stoppedOrder.append(tailID)
            if s.stoppedOrder.count > Self.stoppedRemembered { s.stopped.remove(s.stoppedOrder.removeFirst()) }
            // Each is read to its end by its stream.
            let watchers = s.watchers.removeValue(forKey: tailID).map { Array($0.values) } ?? []
            return (watchers, s.stopHandlers)
        }
        for watcher in watchers { watcher.end(reason) }
        for handler in handlers { handler(tailID, reason, agents) }
    }

    /// Calls `handler` with each tail stopped here from now on (id, reason, agents).
    public func whenStopped(_ handler: @escaping @Sendable (String, String, [String]) -> Void) {
        state.withLock { $0.stopHandlers.append(handler) }
    }

    /// Stops, by `server`, the tails whose expiry and grace passed (audited), and ends their
    /// watchers and devices here: the dispatcher's housekeeping, about once a minute.
    static func stopExpired(_ tails: any TailRegistry, hub: TailHub, now: Timestamp = .now) async throws {
        for id in try await tails.stopExpired(now: now) {
            let agents = try await tails.tail(id)?.parts.map(\.agentID) ?? []
            hub.stopped(id, reason: "expired", agents: agents)
        }
    }
}
