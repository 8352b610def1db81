import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeStore
import DredgeWire
import Foundation

/// The agent's live tails, across connections (Protocol/README.md § 20): admits each
/// `TailCommand` (``TailAdmission``), answers it, runs one ``TailRunner`` per tail, opens the
/// device's verbosity window for a `verbose` one (``VerbosityWindow``, closed when the tail
/// ends), and ends each at its expiry by the agent's clock, heard of or not. While no connection
/// is ready the tails keep their place in the store and send nothing; on a new connection each
/// is accepted again and goes on after what the server holds.
///
/// ``step(now:clock:)`` is one pass over the tails; the agent calls it every ``pollInterval``
/// while a tail runs, every ``idleInterval`` otherwise.
public actor TailManager {
    public typealias Send = @Sendable (WireFrame) async throws -> Void

    /// How often the agent steps its tails while one runs (a tail's latency: `dredge-bench tail`).
    public static let pollInterval: Duration = .milliseconds(20)
    /// How often it steps them while none runs.
    public static let idleInterval: Duration = .milliseconds(250)

    private let store: LogStore
    private let agentID: String
    private let agentKey: RSAPrivateKey
    private var runners: [String: TailRunner] = [:]
    private var send: Send?
    /// The device's upload policy as it applies to a tail (urgent or not), if the agent has one.
    private var politeness: (@Sendable (_ urgent: Bool) async -> TailPoliteness)?
    /// Told the bytes each pass sent (they count toward the policy's day).
    private var counted: (@Sendable (UInt64) async -> Void)?

    /// What the device's upload policy says of a tail now (#54).
    public struct TailPoliteness: Sendable {
        /// Why the policy holds it now (a metered network, the day's budget), or nil.
        public var hold: String?
        /// The most bytes a second it may send (the policy's cap), or nil.
        public var bytesPerSecond: UInt64?

        public init(hold: String? = nil, bytesPerSecond: UInt64? = nil) {
            self.hold = hold
            self.bytesPerSecond = bytesPerSecond
        }
    }

    /// Makes the tails follow the device's upload policy: one it holds is refused (or ended),
    /// one it caps sends at most at the cap, and what they send counts toward the day.
    public func follow(_ politeness: @escaping @Sendable (_ urgent: Bool) async -> TailPoliteness, counting counted: @escaping @Sendable (UInt64) async -> Void) {
        self.politeness = politeness
        self.counted = counted
    }

    public init(store: LogStore, agentID: String, agentKey: RSAPrivateKey) {
        self.store = store
        self.agentID = agentID
        self.agentKey = agentKey
    }

    /// The tails running now, by id.
    public var running: Set<String> { Set(runners.keys) }

    /// A connection is ready: every running tail is accepted again on it.
    public func connected(_ send: @escaping Send) async throws {
        self.send = send
        for id in runners.keys.sorted() {
            guard let frame = runners[id]?.accept() else { continue }
            try await send(frame)
        }
    }

    /// The connection went: nothing is sent until the next one.
    public func disconnected() {
        send = nil
    }

    /// A frame of the live tail: a command, an acknowledgement, a stop.
    /// - Parameter urgentAgreed: the connection agreed `urgent` (§ 22): a tail the policy holds
    ///   is refused `REJECT_POLICY`; without it, `REJECT_BUSY` (the base protocol's).
    public func receive(_ frame: WireFrame, serverKeys: PinnedServerKeys, now: Timestamp = .now, clock: Double, urgentAgreed: Bool = false) async throws {
        switch frame.body {
        case .tailCommand(let command)?:
            var decision = TailAdmission.admit(command, agentID: agentID, serverKeys: serverKeys, agentKey: agentKey, running: running, now: now)
            if case .accept(var accepted) = decision, runners[accepted.tailID] == nil, let politeness {
                let policy = await politeness(accepted.urgent)
                if let hold = policy.hold {
                    decision = .reject(urgentAgreed ? .rejectPolicy : .rejectBusy, "the device's upload policy holds it: \(hold)\(accepted.urgent ? "" : "; an urgent tail may go by")")
                } else if let cap = policy.bytesPerSecond {
                    // The cap counts the link's bytes, the tail's rate its record lines: a fifth kept for the batches' sealing and framing.
                    accepted.bytesPerSecond = max(WireLimits.tailByteRate.lowerBound, min(accepted.bytesPerSecond, cap / 5 * 4))
                    decision = .accept(accepted)
                }
            }
            guard case .accept(let accepted) = decision else {
                try await send?(decision.frame(tailID: command.tailID, startCursor: 0))
                return
            }
            if runners[accepted.tailID] == nil {
                runners[accepted.tailID] = try TailRunner(accepted, agentID: agentID, startCursor: UInt64(max(0, try store.lastRowID())))
                if accepted.verbose {
                    try store.openVerbosityWindow(VerbosityWindow(uid: accepted.uid, types: accepted.verboseTypes, until: accepted.expiresAt, owner: accepted.tailID), now: now)
                }
            }
            if let answer = runners[accepted.tailID]?.accept() { try await send?(answer) }
        case .tailAck(let ack)?:
            runners[ack.tailID]?.acknowledged(ack, now: clock)
        case .tailStop(let stop)?:
            try end(stop.tailID)
        default:
            break
        }
    }

    /// One pass: each tail past its expiry ends; each other sends what is due. A tail whose
    /// store cannot be read ends, and the server is told (`Error{ERROR_INTERNAL, upload_id}`).
    public func step(now: Timestamp = .now, clock: Double) async throws {
        // What the upload policy holds, asked before the pass: no runner is copied out across
        // a wait (an acknowledgement or a stop that came meanwhile would be overwritten).
        var holds: [Bool: String] = [:]
        if let politeness {
            for urgent in Set(runners.values.map(\.accepted.urgent)) { holds[urgent] = await politeness(urgent).hold }
        }
        for id in runners.keys.sorted() {
            guard var runner = runners[id] else { continue }
            if runner.hasExpired(at: now) {
                try end(id)
                continue
            }
            guard let send else { continue }
            if let hold = holds[runner.accepted.urgent] {
                // Held while it ran (the network turned metered, the day's budget is spent): ended, and the server told why.
                try end(id)
                try await send(.with { $0.error = .with { $0.code = .errorInternal; $0.fatal = false; $0.uploadID = id; $0.detail = "the device's upload policy holds the tail: \(hold)" } })
                continue
            }
            let frames: [WireFrame]
            do {
                frames = try runner.poll(store: store, now: clock, clock: now)
            } catch {
                try end(id)
                try await send(.with { $0.error = .with { $0.code = .errorInternal; $0.fatal = false; $0.uploadID = id; $0.detail = "the tail cannot go on: \(error)" } })
                continue
            }
            runners[id] = runner
            for frame in frames { try await send(frame) }
            if let counted, !frames.isEmpty {
                await counted(PoliteGate.wireBytes(payload: UInt64(frames.reduce(0) { $0 + $1.sizeForPolicy })))
            }
        }
    }

    /// Ends a tail here: it sends nothing more, and its verbosity window closes.
    private func end(_ id: String) throws {
        guard runners.removeValue(forKey: id) != nil else { return }
        try store.closeVerbosityWindow(owner: id)
    }
}

extension WireFrame {
    /// About the bytes of the frame on the connection, for the upload policy: a batch's sealed
    /// records and a bound on the rest (ids, numbers, nonce, length prefix), without
    /// serializing it a second time.
    var sizeForPolicy: Int {
        if case .tailBatch(let batch)? = body { return batch.ciphertext.count + 96 }
        return 96
    }
}
