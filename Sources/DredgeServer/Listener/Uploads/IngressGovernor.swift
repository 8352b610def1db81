import DredgeDomain
import Foundation
import Synchronization

/// Caps the bytes of upload chunks one server node takes a second, shared fairly among the
/// agents uploading at once (#54, `connections.maxIngressBytesPerSecond`).
///
/// A connection hands over its next frame only once the last is answered, so a chunk that
/// waits here for its turn stops its connection's reading: the agent's window fills, its TCP
/// window closes, and it sends no faster than it is given. Nothing is refused and nothing is
/// lost; an agent that has nothing to send takes nothing from the others.
///
/// Turns are by *start-time fair queuing*: each agent's request is tagged with the virtual
/// time at which its bytes start (the later of the node's virtual time and the end of that
/// agent's previous request), and the lowest tag goes next. Agents that upload at once get
/// equal bytes a second, whatever their chunk sizes or how many connections' worth of chunks
/// they keep waiting. The node's bytes go out in slots, each request's bytes ÷ the cap after
/// the previous one's, with no saved-up burst after an idle spell beyond one request.
final class IngressGovernor: Sendable {
    let bytesPerSecond: Double
    private let clock: @Sendable () -> Double
    private let state: Mutex<State>

    private struct State {
        var schedule: IngressSchedule
        var continuations: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var granter: Task<Void, Never>?
        var nextID: UInt64 = 0
        /// Bytes granted since the node started, and requests that had to wait for their turn.
        var granted: UInt64 = 0
        var delayed: UInt64 = 0
    }

    /// The lowest cap: a 1 MiB chunk must not hold a connection's reading for more than a second.
    static let minBytesPerSecond = 1 << 20

    init(bytesPerSecond: Int, clock: @escaping @Sendable () -> Double = MonotonicClock.seconds) {
        self.bytesPerSecond = Double(bytesPerSecond)
        self.clock = clock
        state = Mutex(State(schedule: IngressSchedule(bytesPerSecond: Double(bytesPerSecond))))
    }

    /// Returns when `agent` may take `bytes` more: at once when the node is under its cap and
    /// nobody waits before it. A cancelled wait returns at once (the connection is closing).
    func admit(agent: String, bytes: Int) async {
        let id = state.withLock { s -> UInt64 in
            s.nextID += 1
            return s.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                state.withLock { s in
                    if Task.isCancelled {
                        continuation.resume()
                        return
                    }
                    s.schedule.enqueue(id: id, agent: agent, bytes: Double(bytes))
                    s.continuations[id] = continuation
                    if s.granter == nil { s.granter = Task { await self.grant() } }
                }
            }
        } onCancel: {
            let cancelled = state.withLock { s -> CheckedContinuation<Void, Never>? in
                s.schedule.remove(id: id)
                return s.continuations.removeValue(forKey: id)
            }
            cancelled?.resume()
        }
    }

    /// Bytes granted since the node started.
    var granted: UInt64 { state.withLock { $0.granted } }
    /// Requests that waited for their turn since the node started.
    var delayed: UInt64 { state.withLock { $0.delayed } }

    /// Grants the waiting requests one slot at a time, in the schedule's order; ends when none waits.
    private func grant() async {
        while true {
            let next: (id: UInt64, wait: Double)? = state.withLock { s in
                guard let turn = s.schedule.next(now: clock()) else {
                    s.granter = nil
                    return nil
                }
                s.granted &+= UInt64(turn.bytes)
                if turn.wait > 0 { s.delayed += 1 }
                return (turn.id, turn.wait)
            }
            guard let (id, wait) = next else { return }
            if wait > 0 { try? await Task.sleep(for: .seconds(wait)) }  // never cancelled: the granter outlives its callers
            state.withLock { $0.continuations.removeValue(forKey: id) }?.resume()
        }
    }
}

/// The pure core of ``IngressGovernor``: start-time fair queuing of byte requests under a cap,
/// on times the caller gives.
struct IngressSchedule: Sendable {
    struct Request: Sendable, Equatable {
        var id: UInt64
        var agent: String
        var bytes: Double
        var tag: Double
    }

    let bytesPerSecond: Double
    /// Virtual time: the tag of the last request granted.
    private(set) var virtual: Double = 0
    /// Per agent, the virtual end of its last request (forgotten when none waits).
    private var finish: [String: Double] = [:]
    private(set) var waiting: [Request] = []
    /// The node's next free slot.
    private(set) var slotEnd: Double = -.infinity

    init(bytesPerSecond: Double = 1) { self.bytesPerSecond = bytesPerSecond }

    mutating func enqueue(id: UInt64, agent: String, bytes: Double) {
        let tag = max(virtual, finish[agent] ?? 0)
        finish[agent] = tag + bytes
        waiting.append(Request(id: id, agent: agent, bytes: bytes, tag: tag))
    }

    mutating func remove(id: UInt64) { waiting.removeAll { $0.id == id } }

    /// The next request to grant, and how long after `now` its slot starts; nil when none
    /// waits (then the agents' histories are forgotten: nobody's past counts against them).
    mutating func next(now: Double) -> (id: UInt64, agent: String, bytes: Double, wait: Double)? {
        guard let i = waiting.indices.min(by: { waiting[$0].tag < waiting[$1].tag || waiting[$0].tag == waiting[$1].tag && waiting[$0].id < waiting[$1].id }) else {
            finish.removeAll()
            virtual = 0
            return nil
        }
        let chosen = waiting.remove(at: i)
        let start = max(slotEnd, now)
        slotEnd = start + chosen.bytes / bytesPerSecond
        virtual = chosen.tag
        return (chosen.id, chosen.agent, chosen.bytes, start - now)
    }
}
