import DredgeDomain
import DredgeWire
import NIOCore
import Synchronization

/// The one way out of an agent connection: its ``ServerConnectionStateMachine``, under a lock,
/// and its channel. Every frame the server sends on the connection is one the machine decided:
/// the session's steps take their actions from it (``step(_:)``); what other threads send (a
/// delivery pass's pull commands, the committing thread's chunk acks, a quiet heartbeat's ack
/// on the event loop) goes through ``send(_:)``, which the machine lets out only while the
/// agent is authenticated and the connection not ending; and the connection's end is said by
/// ``goodbye(_:)`` (a silent agent, a newer connection of the same agent, the shutdown).
///
/// The machine decides under its lock and the write is made after it: a frame let out just
/// before the `Goodbye` was decided may still reach the channel after it (the agent, closed by
/// then, ignores it). Writing under the lock would close that gap, but a write on the event
/// loop can close the channel, whose close handler takes the same lock.
final class ConnectionOutbound: Sendable {
    let channel: any Channel
    private let machine: Mutex<ServerConnectionStateMachine>

    /// `known`: the capabilities the server agrees to.
    init(channel: any Channel, session: WireAuthResult, known: [String] = WireCapability.known) {
        self.channel = channel
        machine = Mutex(ServerConnectionStateMachine(software: ServerSoftware.name, session: session, known: known))
    }

    /// One step of the machine: the session's, one at a time.
    func step(_ body: (inout ServerConnectionStateMachine) -> [ServerConnectionStateMachine.Action]) -> [ServerConnectionStateMachine.Action] {
        machine.withLock { body(&$0) }
    }

    /// The authenticated agent, while the connection is ready.
    var agentID: String? { machine.withLock { $0.agentID } }

    /// The capabilities agreed in the handshake, and the key generation the agent claimed.
    var agreement: (capabilities: [String], keyGeneration: Int?) { machine.withLock { ($0.capabilities, $0.claimedKeyGeneration) } }

    /// Of the session layer's `frames`, those the machine lets out now: all of them while the
    /// connection is ready, none before authentication or once it is ending.
    func permitted(_ frames: [WireFrame]) -> [WireFrame] {
        machine.withLock { m in
            frames.flatMap { m.send($0) }.compactMap { if case .send(let frame) = $0 { frame } else { nil } }
        }
    }

    /// Writes the session layer's `frames` the machine lets out, in order, and flushes; the
    /// future of the last write, nil when none was let out. Safe from any thread.
    @discardableResult
    func send(_ frames: [WireFrame]) -> EventLoopFuture<Void>? {
        channel.writeAndFlush(frames: permitted(frames))
    }

    /// Says `Goodbye` with `reason` if the connection has not ended yet, and closes once it is
    /// written (at once when there is nothing to say), or after a few seconds if the peer does
    /// not read. Safe from any thread. `returning`: when the server expects to be back (its
    /// planned restart).
    func goodbye(_ reason: String, returning: PlannedReturn? = nil) {
        let frames = machine.withLock { $0.goodbye(reason, returning: returning) }.compactMap { if case .send(let frame) = $0 { frame } else { nil } }
        channel.close(after: channel.writeAndFlush(frames: frames))
    }

    /// The channel closed: nothing is sent from now on.
    func closed() { machine.withLock { $0.closed("connection closed") } }
}

/// What the server calls itself in `HelloAck`.
enum ServerSoftware {
    static let name = "dredge-server/\(DredgeVersion.current)"
}

/// What a connection's driver tells the handlers below it in the pipeline, as a user outbound
/// event: the machine authenticated the agent (``ConnectionDeadlineHandler`` then lifts the
/// handshake deadline and the pre-authentication frame limit, and watches for silence).
enum AgentConnectionEvent: Sendable {
    case authenticated(heartbeatSeconds: UInt32)
}
