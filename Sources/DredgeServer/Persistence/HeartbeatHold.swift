import DredgeWire
import Foundation
import NIOCore
import Synchronization

/// Heartbeats held in memory between writes, as both agent directories hold them
/// (``SQLiteAgentDirectory``, ``PostgresAgentDirectory``): one whose uids are the ones last written
/// for the agent, without a user report, is kept and written with the others at most every
/// `flushEvery`; any other is written at once, with whatever is held and due.
///
/// With a `refreshEvery` (both directories have one), an agent's held heartbeat is due only
/// once its row was last written that long ago: an idle agent costs the database one row write
/// per `refreshEvery`, however often it heartbeats. Its presence is its connection's row (in a
/// cluster, its node's lease, ``NodeLease``) meanwhile. ``takePending()`` takes everything
/// held, due or not (``SQLiteAgentDirectory/flushHeartbeats()``); ``peek()`` shows it without taking
/// it (the directories' listings, which write nothing).
final class HeartbeatHold: Sendable {
    /// Heartbeat times and record counts held, per agent.
    typealias Held = [String: (at: Double, records: Int64)]

    /// What to do with a heartbeat.
    enum Step {
        /// Nothing now: it is held.
        case hold
        /// Write these held heartbeats (the interval passed).
        case flush(Held)
        /// Write this heartbeat in full now, with these held ones.
        case write(with: Held)
    }

    private struct State {
        var uids: [String: [String]] = [:]
        var pending: Held = [:]
        /// When each agent's row was last written (only with a `refreshEvery`). A held heartbeat
        /// of an agent without one is in `ripe`: a heartbeat is held only once its uids were
        /// written, and ``forget(_:)`` puts what it leaves held there.
        var written: [String: ContinuousClock.Instant] = [:]
        /// Every time set in `written`, oldest first (entries replaced since are skipped), so a
        /// flush looks only at the agents whose refresh came, not at every agent held: with
        /// 18,720 agents held, a scan of them all took milliseconds under this lock, once a
        /// second and at every full write, and stalled every heartbeat meanwhile.
        var writtenOrder = CircularBuffer<(agent: String, at: ContinuousClock.Instant)>()
        /// Agents whose refresh came while nothing of theirs was held, or forgotten with a
        /// heartbeat held: due as soon as one is held.
        var ripe: Set<String> = []
        var lastFlush: ContinuousClock.Instant
        /// Entries the last ``take(_:now:all:)`` looked at (for tests of its cost).
        var examined = 0

        /// Holds the agent's heartbeat at `at`, unless a later one is held already.
        mutating func keep(_ agent: String, at: Double, records: Int64) {
            if (pending[agent]?.at ?? -.infinity) <= at { pending[agent] = (at, records) }
        }

        mutating func setWritten(_ agent: String, _ at: ContinuousClock.Instant) {
            written[agent] = at
            writtenOrder.append((agent, at))
            ripe.remove(agent)
            // Entries replaced since (an agent whose uids change at every heartbeat adds one per
            // heartbeat) go once they outnumber the live ones twice over.
            if writtenOrder.count > 2 * written.count + 1024 {
                var live = CircularBuffer<(agent: String, at: ContinuousClock.Instant)>(initialCapacity: written.count)
                for entry in writtenOrder where written[entry.agent] == entry.at { live.append(entry) }
                writtenOrder = live
            }
        }
    }

    private let state: Mutex<State>
    private let flushEvery: Duration
    private let refreshEvery: Duration
    private let clock: @Sendable () -> ContinuousClock.Instant

    init(flushEvery: Duration, refreshEvery: Duration = .zero, clock: @escaping @Sendable () -> ContinuousClock.Instant = { .now }) {
        self.flushEvery = flushEvery
        self.refreshEvery = refreshEvery
        self.clock = clock
        state = Mutex(State(lastFlush: clock()))
    }

    /// A heartbeat to write in full: its active uids (sorted, without repeats), its user report,
    /// time and record count, and the held heartbeats due to go with it.
    struct Full {
        var uids: [String]
        var report: WireUserReport?
        var at: Double
        var records: Int64
        var held: Held
    }

    /// What a directory does with a heartbeat that keeps the protocol's rules: write the held
    /// heartbeats due (none, often), or write this one in full. Throws, changing nothing, for
    /// one that breaks them (``HeartbeatRules/problem(with:)``).
    enum Received {
        case held(due: Held)
        case full(Full)
    }

    func receive(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) throws -> Received {
        if let problem = HeartbeatRules.problem(with: heartbeat) { throw DeploymentError(problem) }
        let (sorted, at, records) = Self.parts(of: heartbeat, now: now)
        let report = heartbeat.hasUsers ? HeartbeatRules.onTheHour(heartbeat.users) : nil
        switch step(agentID, uids: sorted, hasReport: report != nil, at: at, records: records) {
        case .hold: return .held(due: [:])
        case .flush(let due): return .held(due: due)
        case .write(let held): return .full(Full(uids: sorted, report: report, at: at, records: records, held: held))
        }
    }

    /// Holds the heartbeat if that is all it needs: it keeps the protocol's rules, carries no
    /// user report, its uids are the ones last written for the agent, and no flush is due.
    /// True if it is held (what ``receive(_:_:now:)`` does then, with nothing due). Otherwise
    /// nothing changes, and the heartbeat goes to ``receive(_:_:now:)``. Quick and without a
    /// write, so an event loop may call it: the listener answers such a heartbeat at once.
    func holdIfQuiet(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) -> Bool {
        guard !heartbeat.hasUsers, HeartbeatRules.problem(with: heartbeat) == nil else { return false }
        let (sorted, at, records) = Self.parts(of: heartbeat, now: now)
        return state.withLock { s in
            guard s.uids[agentID] == sorted, clock() - s.lastFlush < flushEvery else { return false }
            s.keep(agentID, at: at, records: records)
            return true
        }
    }

    /// What the hold keeps of a heartbeat: its active uids (sorted, without repeats), its time
    /// and its record count.
    private static func parts(of heartbeat: WireHeartbeat, now: Date) -> (uids: [String], at: Double, records: Int64) {
        (Array(Set(heartbeat.activeUids)).sorted(), now.timeIntervalSince1970, Int64(clamping: heartbeat.stats.records))
    }

    /// `uids`: the heartbeat's active uids, sorted.
    func step(_ agentID: String, uids: [String], hasReport: Bool, at: Double, records: Int64) -> Step {
        state.withLock { s in
            // Read under the lock, so the times in `writtenOrder` come in order.
            let now = clock()
            // New uids, a user report, or the first heartbeat seen of the agent: written now.
            guard !hasReport, s.uids[agentID] == uids else { return .write(with: take(&s, now: now, all: false)) }
            s.keep(agentID, at: at, records: records)
            return now - s.lastFlush >= flushEvery ? .flush(take(&s, now: now, all: false)) : .hold
        }
    }

    /// The agent's uids as just written (with its heartbeat's time).
    func wrote(_ uids: [String], of agentID: String) {
        state.withLock { s in
            let now = clock()
            s.uids[agentID] = uids
            if refreshEvery > .zero { s.setWritten(agentID, now) }
        }
    }

    /// Forgets what was written for the agent: its next heartbeat is written in full.
    func forget(_ agentID: String) {
        state.withLock { s in
            s.uids.removeValue(forKey: agentID)
            s.written.removeValue(forKey: agentID)
            // What is held of it is due at the next flush, as for an agent never written.
            if s.pending[agentID] != nil { s.ripe.insert(agentID) } else { s.ripe.remove(agentID) }
        }
    }

    /// Everything held, left held: what a listing shows over the rows it read.
    func peek() -> Held {
        state.withLock { $0.pending }
    }

    /// Everything held, taken out to be written.
    func takePending() -> Held {
        state.withLock { take(&$0, now: clock(), all: true) }
    }

    /// The agent disconnected: what is held of it, taken out to be written, and what was
    /// written for it forgotten (its next heartbeat, on whichever connection, is written in
    /// full; a node does not keep every agent that ever passed through it).
    func release(_ agentID: String) -> Held {
        state.withLock { s in
            s.uids.removeValue(forKey: agentID)
            s.written.removeValue(forKey: agentID)
            s.ripe.remove(agentID)
            guard let held = s.pending.removeValue(forKey: agentID) else { return [:] }
            return [agentID: held]
        }
    }

    /// The held heartbeats due (all of them, without a `refreshEvery`, or when `all`). Looks
    /// only at the agents whose refresh came since the last time (and those that came before
    /// with nothing held), however many are held.
    private func take(_ s: inout State, now: ContinuousClock.Instant, all: Bool) -> Held {
        s.lastFlush = now
        guard refreshEvery > .zero, !all else {
            s.examined = s.pending.count
            let due = s.pending
            s.pending.removeAll(keepingCapacity: true)
            if refreshEvery > .zero { for agent in due.keys { s.setWritten(agent, now) } }
            return due
        }
        var due: Held = [:]
        var examined = 0
        for agent in s.ripe {
            examined += 1
            if let held = s.pending[agent] { due[agent] = held }
        }
        while let first = s.writtenOrder.first, now - first.at >= refreshEvery {
            examined += 1
            s.writtenOrder.removeFirst()
            // Replaced by a later write, or the agent forgotten: that entry decides.
            guard s.written[first.agent] == first.at else { continue }
            if let held = s.pending[first.agent] { due[first.agent] = held } else { s.ripe.insert(first.agent) }
        }
        s.examined = examined
        for agent in due.keys {
            s.pending.removeValue(forKey: agent)
            s.setWritten(agent, now)
        }
        return due
    }

    /// Entries the last flush (or write, listing, disconnection) looked at.
    var examinedByLastTake: Int { state.withLock { $0.examined } }
}
