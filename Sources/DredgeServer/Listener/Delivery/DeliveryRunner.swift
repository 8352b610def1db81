import Synchronization

/// Runs an agent's pull deliveries for one connection (a ``SerialRunner``): a wake starts a
/// pass in a task of its own, or, when one is running, another pass after it; no task waits
/// between wakes.
///
/// A pass reads the agent's due pulls when a wake asked for it (the connection's first pass,
/// the sweep, a late join), or when an earlier read failed; a pass woken only by pulls this
/// process just queued (``FreshPull``) sends those without reading.
final class DeliveryRunner: Sendable {
    enum Pass: Sendable {
        /// The agent's pulls could not be read: the next wake tries again.
        case unread
        case delivered
        /// This connection is no longer the agent's live one: no more passes.
        case stop
    }

    /// What one pass is to do.
    struct Request: Sendable {
        /// Read the agent's due pulls (they include the fresh ones, if still queued).
        var read: Bool
        /// With `read`: the pulls delivered before and never answered, too (a connection's
        /// first pass).
        var includingUnanswered: Bool
        /// Pulls just queued for the agent, oldest first; sent as they are when not `read`.
        var fresh: [FreshPull]
    }

    /// Fresh pulls kept for the next pass at most; past that, the pass reads instead.
    static let freshLimit = 16

    /// What the wakes since the last pass began asked for.
    private struct Asked: Sendable {
        var read = false
        var fresh: [FreshPull] = []
    }

    /// What the passes so far leave to the next one.
    private final class Memory: Sendable {
        struct State {
            /// The first pass of a connection also sends the pulls delivered before and never
            /// answered.
            var reconnecting = true
            /// The last pass could not read: the next one reads.
            var readOwed = false
        }

        let state = Mutex(State())
    }

    private let runner: SerialRunner<Asked>

    init(pass: @escaping @Sendable (Request) async -> Pass) {
        let memory = Memory()
        runner = SerialRunner(empty: Asked()) { asked in
            let request = memory.state.withLock { m in
                defer { m.readOwed = false }
                return Request(read: asked.read || m.readOwed || m.reconnecting, includingUnanswered: m.reconnecting, fresh: asked.fresh)
            }
            switch await pass(request) {
            case .delivered:
                memory.state.withLock { $0.reconnecting = false }
                return .next
            case .unread:
                memory.state.withLock { $0.readOwed = true }
                return .next
            case .stop:
                return .stop
            }
        }
    }

    /// Starts a pass (or another after the running one): for `pull`, just queued for the
    /// agent, or, with nil, to read what is due.
    func wake(_ pull: FreshPull? = nil) {
        runner.ask { asked in
            if let pull, asked.fresh.count < Self.freshLimit {
                asked.fresh.append(pull)
            } else {
                asked.read = true
            }
        }
    }

    /// No pass starts from now on; returns when the running one (if any) is done.
    func stop() async { await runner.stop() }
}
