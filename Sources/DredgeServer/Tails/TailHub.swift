import DredgeAdminAPI
import DredgeDomain
import Foundation
import Synchronization

/// Where a live tail's watchers are woken, in one server process (#53): the agent listener
/// rings when a batch is held or a device joins or ends, a stop ends them. What a watcher is
/// shown is read from what was stored (``TailFollower``), so the devices connected to other
/// nodes of a cluster are seen too (at the watcher's tick). Events handed to a watcher
/// (``publish(_:_:sizes:)``) wait in a bounded buffer of its own; over it the oldest go, counted
/// as missed: no watcher slows a device, the listener or another watcher.
///
/// It also carries stops the other way: a tail stopped through the admin API ends its watchers
/// and has the listener tell the devices connected here (``whenStopped(_:)``).
public final class TailHub: Sendable {
    /// Events, and bytes of records, a watcher may have unread before the oldest go.
    public static let watcherCapacity = 10_000
    public static let watcherBytes = 32 << 20
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

    /// A watcher of one tail: ``next()`` gives what arrived since the last call.
    public final class Watcher: Sendable {
        let tailID: String
        let token: Int
        let capacity: Int
        private struct Buffer {
            /// Unread events from `start` on, with the bytes each weighs.
            var events: [TailEvent] = []
            var sizes: [Int] = []
            var start = 0
            var bytes = 0
            /// Events lost since the last read.
            var missed: Int64 = 0
            /// Why the tail is over, once it is; `said` once the end was read.
            var ended: String?
            var said = false
            var waiting: CheckedContinuation<Void, Never>?

            var hasNews: Bool { events.count > start || missed > 0 || (ended != nil && !said) || said }
        }

        private enum Taken { case events([TailEvent]), over, nothing }

        private let buffer = Mutex(Buffer())

        init(tailID: String, token: Int, capacity: Int) {
            self.tailID = tailID
            self.token = token
            self.capacity = max(1, capacity)
        }

        /// Adds events (`sizes`: the bytes each weighs); over either capacity, the oldest unread
        /// go (counted as missed).
        func add(_ events: [TailEvent], sizes: [Int]) {
            buffer.withLock { b -> CheckedContinuation<Void, Never>? in
                guard b.ended == nil else { return nil }
                b.events.append(contentsOf: events)
                b.sizes.append(contentsOf: sizes)
                b.bytes += sizes.reduce(0, +)
                while b.events.count - b.start > capacity || (b.bytes > TailHub.watcherBytes && b.events.count - b.start > 1) {
                    b.bytes -= b.sizes[b.start]
                    b.missed += 1
                    b.start += 1
                }
                if b.start > 4_096 && b.start * 2 > b.events.count {
                    b.events.removeFirst(b.start)
                    b.sizes.removeFirst(b.start)
                    b.start = 0
                }
                defer { b.waiting = nil }
                return b.waiting
            }?.resume()
        }

        /// The tail is over: the watcher reads what is left, then the end.
        func end(_ reason: String) {
            buffer.withLock { b -> CheckedContinuation<Void, Never>? in
                if b.ended == nil { b.ended = reason }
                defer { b.waiting = nil }
                return b.waiting
            }?.resume()
        }

        /// Ends a wait of ``next()`` with nothing new (a timer's tick, for the caller's checks).
        public func poke() {
            buffer.withLock { b -> CheckedContinuation<Void, Never>? in
                defer { b.waiting = nil }
                return b.waiting
            }?.resume()
        }

        private func take() -> Taken {
            buffer.withLock { b in
                if b.said { return .over }
                var out: [TailEvent] = []
                if b.missed > 0 { out.append(TailEvent(kind: .missed, count: b.missed)) }
                out.append(contentsOf: b.events[b.start...])
                b.events.removeAll(keepingCapacity: true)
                b.sizes.removeAll(keepingCapacity: true)
                (b.start, b.missed, b.bytes) = (0, 0, 0)
                if let ended = b.ended {
                    out.append(TailEvent(kind: .end, reason: ended))
                    b.said = true
                }
                return out.isEmpty ? .nothing : .events(out)
            }
        }

        /// What arrived since the last call: a `missed` event first when some were lost, an
        /// `end` last when the tail is over. Waits while there is nothing; a ``poke()`` ends the
        /// wait with nothing (`[]`). Nil once the end was read. One reader at a time (the
        /// stream that subscribed it).
        public func next() async -> [TailEvent]? {
            switch take() {
            case .events(let events): return events
            case .over: return nil
            case .nothing: break
            }
            await withCheckedContinuation { continuation in
                let now = buffer.withLock { b -> Bool in
                    if b.hasNews { return true }
                    b.waiting = continuation
                    return false
                }
                if now { continuation.resume() }
            }
            switch take() {
            case .events(let events): return events
            case .over: return nil
            case .nothing: return []
            }
        }
    }

    /// A new watcher of `tailID`; ``unsubscribe(_:)`` when done. Nil when it has
    /// ``watchersPerTail`` already.
    public func subscribe(_ tailID: String, capacity: Int = TailHub.watcherCapacity) -> Watcher? {
        state.withLock { s in
            guard (s.watchers[tailID]?.count ?? 0) < Self.watchersPerTail else { return nil }
            s.nextToken += 1
            let watcher = Watcher(tailID: tailID, token: s.nextToken, capacity: capacity)
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

    /// Whether anyone watches `tailID` here (the listener skips making events otherwise).
    public func isWatched(_ tailID: String) -> Bool { state.withLock { $0.watchers[tailID] != nil } }

    /// Hands `events` (`sizes`: the bytes each weighs; 0 each when not given) to every watcher of `tailID`.
    public func publish(_ tailID: String, _ events: [TailEvent], sizes: [Int]? = nil) {
        guard !events.isEmpty else { return }
        let sizes = sizes ?? Array(repeating: 0, count: events.count)
        for watcher in state.withLock({ Array(($0.watchers[tailID] ?? [:]).values) }) { watcher.add(events, sizes: sizes) }
    }

    /// Something of `tailID` was stored here (a batch held, a device joined or ended): its
    /// watchers read on now rather than at their next tick.
    public func ring(_ tailID: String) {
        for watcher in state.withLock({ Array(($0.watchers[tailID] ?? [:]).values) }) { watcher.poke() }
    }

    /// Whether `tailID` was stopped lately through this process.
    public func isStopped(_ tailID: String) -> Bool { state.withLock { $0.stopped.contains(tailID) } }

    /// The tail stopped (`agents`: those with a part): its watchers end with `reason`, and the
    /// listener tells the devices connected here.
    public func stopped(_ tailID: String, reason: String, agents: [String]) {
        let (watchers, handlers) = state.withLock { s in
            if s.stopped.insert(tailID).inserted {
                s.stoppedOrder.append(tailID)
                if s.stoppedOrder.count > Self.stoppedRemembered { s.stopped.remove(s.stoppedOrder.removeFirst()) }
            }
            // Each is read to its end by its stream; none is handed more.
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

    /// Stops, by `server`, the tails whose expiry passed (audited), and ends their watchers
    /// and devices here: the dispatcher's housekeeping, about once a minute.
    static func stopExpired(_ tails: any TailRegistry, hub: TailHub, now: Timestamp = .now) async throws {
        for id in try await tails.stopExpired(now: now) {
            let agents = try await tails.tail(id)?.parts.map(\.agentID) ?? []
            hub.stopped(id, reason: "expired", agents: agents)
        }
    }
}
