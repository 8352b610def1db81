import DredgeWire
import Foundation
import Synchronization

/// Heartbeats held in memory between writes, as both agent directories hold them
/// (``AgentRegistry``, ``PostgresAgentDirectory``): one whose uids are the ones last written
/// for the agent, without a user report, is kept and written with the others at most every
/// `flushEvery`; any other is written at once, with whatever is held and due.
///
/// With a `refreshEvery` (both directories have one), an agent's held heartbeat is due only
/// once its row was last written that long ago: an idle agent costs the database one row write
/// per `refreshEvery`, however often it heartbeats. Its presence is its connection's row (in a
/// cluster, its node's lease, ``NodeLease``) meanwhile. ``takePending()`` takes everything
/// held, due or not (``AgentRegistry/flushHeartbeats()``); ``peek()`` shows it without taking
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
        /// When each agent's row was last written (only with a `refreshEvery`).
        var written: [String: ContinuousClock.Instant] = [:]
        var lastFlush: ContinuousClock.Instant
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
        let sorted = Array(Set(heartbeat.activeUids)).sorted()
        let report = heartbeat.hasUsers ? heartbeat.users : nil
        let at = now.timeIntervalSince1970, records = Int64(clamping: heartbeat.stats.records)
        switch step(agentID, uids: sorted, hasReport: report != nil, at: at, records: records) {
        case .hold: return .held(due: [:])
        case .flush(let due): return .held(due: due)
        case .write(let held): return .full(Full(uids: sorted, report: report, at: at, records: records, held: held))
        }
    }

    /// `uids`: the heartbeat's active uids, sorted.
    func step(_ agentID: String, uids: [String], hasReport: Bool, at: Double, records: Int64) -> Step {
        let now = clock()
        return state.withLock { s in
            // New uids, a user report, or the first heartbeat seen of the agent: written now.
            guard !hasReport, s.uids[agentID] == uids else { return .write(with: take(&s, now: now, all: false)) }
            if (s.pending[agentID]?.at ?? -.infinity) <= at { s.pending[agentID] = (at, records) }
            return now - s.lastFlush >= flushEvery ? .flush(take(&s, now: now, all: false)) : .hold
        }
    }

    /// The agent's uids as just written (with its heartbeat's time).
    func wrote(_ uids: [String], of agentID: String) {
        let now = clock()
        state.withLock { s in
            s.uids[agentID] = uids
            if refreshEvery > .zero { s.written[agentID] = now }
        }
    }

    /// Forgets what was written for the agent: its next heartbeat is written in full.
    func forget(_ agentID: String) {
        state.withLock { s in
            s.uids.removeValue(forKey: agentID)
            s.written.removeValue(forKey: agentID)
        }
    }

    /// Everything held, left held: what a listing shows over the rows it read.
    func peek() -> Held {
        state.withLock { $0.pending }
    }

    /// Everything held, taken out to be written.
    func takePending() -> Held {
        let now = clock()
        return state.withLock { take(&$0, now: now, all: true) }
    }

    /// The agent disconnected: what is held of it, taken out to be written, and what was
    /// written for it forgotten (its next heartbeat, on whichever connection, is written in
    /// full; a node does not keep every agent that ever passed through it).
    func release(_ agentID: String) -> Held {
        state.withLock { s in
            s.uids.removeValue(forKey: agentID)
            s.written.removeValue(forKey: agentID)
            guard let held = s.pending.removeValue(forKey: agentID) else { return [:] }
            return [agentID: held]
        }
    }

    /// The held heartbeats due (all of them, without a `refreshEvery`, or when `all`).
    private func take(_ s: inout State, now: ContinuousClock.Instant, all: Bool) -> Held {
        s.lastFlush = now
        guard refreshEvery > .zero else {
            defer { s.pending.removeAll(keepingCapacity: true) }
            return s.pending
        }
        var due: Held = [:]
        for (agent, held) in s.pending where all || s.written[agent].map({ now - $0 >= refreshEvery }) ?? true {
            due[agent] = held
        }
        for agent in due.keys {
            s.pending.removeValue(forKey: agent)
            s.written[agent] = now
        }
        return due
    }
}
