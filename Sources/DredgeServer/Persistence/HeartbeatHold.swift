import Synchronization

/// Heartbeats held in memory between writes, as both agent directories hold them
/// (``AgentRegistry``, ``PostgresAgentDirectory``): one whose uids are the ones last written
/// for the agent, without a user report, is kept and written with the others at most every
/// `flushEvery`; any other is written at once, with whatever is held.
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
        var lastFlush = ContinuousClock.now
    }

    private let state = Mutex(State())
    private let flushEvery: Duration

    init(flushEvery: Duration) { self.flushEvery = flushEvery }

    /// `uids`: the heartbeat's active uids, sorted.
    func step(_ agentID: String, uids: [String], hasReport: Bool, at: Double, records: Int64) -> Step {
        state.withLock { s in
            // New uids, a user report, or the first heartbeat seen of the agent: written now.
            guard !hasReport, s.uids[agentID] == uids else { return .write(with: Self.takePending(&s)) }
            if (s.pending[agentID]?.at ?? -.infinity) <= at { s.pending[agentID] = (at, records) }
            return ContinuousClock.now - s.lastFlush >= flushEvery ? .flush(Self.takePending(&s)) : .hold
        }
    }

    /// The agent's uids as just written.
    func wrote(_ uids: [String], of agentID: String) { state.withLock { $0.uids[agentID] = uids } }

    /// Forgets the uids last written for the agent: its next heartbeat is written in full.
    func forget(_ agentID: String) { state.withLock { _ = $0.uids.removeValue(forKey: agentID) } }

    /// Everything held, taken out to be written.
    func takePending() -> Held { state.withLock { Self.takePending(&$0) } }

    private static func takePending(_ s: inout State) -> Held {
        s.lastFlush = .now
        defer { s.pending.removeAll(keepingCapacity: true) }
        return s.pending
    }
}
