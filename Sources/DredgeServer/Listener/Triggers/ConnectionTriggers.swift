import DredgeDomain
import DredgeWire
import Foundation
import Logging
import NIOCore
import Synchronization

/// The triggers in force, as the agent listener's connections read them: read once per change
/// for all connections (not once per connection), and the connections that hold a set told
/// when they change.
final class TriggerSetSource: Sendable {
    private struct State {
        /// Goes up with each change; a read made before a change is not kept after it.
        var generation = 0
        var cached: (generation: Int, value: TriggersInForce)?
        var watchers: [Int: @Sendable () -> Void] = [:]
        var next = 0
    }

    private let state = Mutex(State())

    /// The triggers in force and their version, read from `registry` when a change came since
    /// the last read.
    func current(from registry: any TriggerRegistry) async throws -> TriggersInForce {
        let generation = state.withLock { s -> Int in s.generation }
        if let cached = state.withLock({ $0.cached }), cached.generation == generation { return cached.value }
        let read = try await registry.inForce(now: .now)
        state.withLock { s in
            if s.generation == generation { s.cached = (generation, read) }
        }
        return read
    }

    /// Calls `wake` at each change until ``unwatch(_:)``; returns the token.
    func watch(_ wake: @escaping @Sendable () -> Void) -> Int {
        state.withLock { s in
            s.next += 1
            s.watchers[s.next] = wake
            return s.next
        }
    }

    func unwatch(_ token: Int) { _ = state.withLock { $0.watchers.removeValue(forKey: token) } }

    /// The triggers changed: the next read reads them, and every watcher is woken.
    func changed() {
        let watchers = state.withLock { s in
            s.generation += 1
            s.cached = nil
            return Array(s.watchers.values)
        }
        for wake in watchers { wake() }
    }
}

/// An agent's trigger set on its connection (#54, Protocol § 21), once it agreed to
/// `triggers`: the set is sent after authentication, and again whenever what it holds would
/// change (a trigger made, disabled or removed; a trigger's expiry; a user it came to hold).
/// Each pass reads the triggers in force (``TriggerSetSource``), makes the agent's set and
/// sends it only when its version or its triggers differ from the last one sent on this
/// connection. The agent's `TriggerSetAck` is recorded (``TriggerRegistry/recordAnswer(_:)``);
/// a refusal is logged and counted, never an error of the connection.
final class ConnectionTriggers: Sendable {
    /// A set sent on this connection.
    struct Sent: Sendable, Equatable {
        var version: UInt64
        var issuedAtUs: Int64
        var triggerIDs: [String]
    }

    /// The set last sent on this connection (shared with the passes), and whether the
    /// agent's answer to it was recorded.
    private final class LastSent: Sendable {
        let value = Mutex<(sent: Sent, answered: Bool)?>(nil)
    }

    /// Asks for another pass a while after one could not make the set (the database was busy):
    /// the agent must not keep a stale set until the next change.
    private final class Retry: Sendable {
        let runner = Mutex<SerialRunner<Bool>?>(nil)

        func later(_ delay: Duration) {
            guard let runner = runner.withLock({ $0 }) else { return }
            Task {
                try? await Task.sleep(for: delay)  // cancelled: asked at once, harmlessly
                runner.ask { $0 = true }
            }
        }
    }

    /// How long after a failed pass the next one runs.
    static let retryDelay: Duration = .seconds(5)

    let agentID: String
    let registry: any TriggerRegistry
    /// What the agent said of itself on this connection.
    let host: WireHostInfo
    private let services: ConnectionServices
    private let runner: SerialRunner<Bool>
    private let sent = LastSent()
    private let watch: Int

    /// - Parameter host: what the agent said of itself on this connection (its app, version and
    ///   labels bound which triggers reach it).
    init(agentID: String, host: WireHostInfo, services: ConnectionServices, registry: any TriggerRegistry, token: Int, outbound: ConnectionOutbound, keyPin: KeyPin) {
        self.agentID = agentID
        self.registry = registry
        self.host = host
        self.services = services
        let sent = self.sent
        let retry = Retry()
        runner = SerialRunner(empty: false) { _ in
            await Self.pass(
                agentID: agentID, host: host, services: services, registry: registry, token: token, outbound: outbound, keyPin: keyPin, sent: sent, retry: retry)
        }
        let runner = self.runner
        retry.runner.withLock { $0 = runner }
        watch = services.triggerSets.watch { runner.ask { $0 = true } }
    }

    /// Looks at the agent's set again (and sends it if it changed).
    func wake() { runner.ask { $0 = true } }

    /// No pass starts from now on; returns when the running one (if any) is done.
    func stop() async {
        services.triggerSets.unwatch(watch)
        await runner.stop()
    }

    /// The set last sent on this connection.
    var lastSent: Sent? { sent.value.withLock { $0?.sent } }

    private static func pass(
        agentID: String, host: WireHostInfo, services: ConnectionServices, registry: any TriggerRegistry, token: Int, outbound: ConnectionOutbound, keyPin: KeyPin,
        sent: LastSent, retry: Retry
    ) async -> SerialRunner<Bool>.After {
        guard services.agentConnections.isLive(agentID, token: token) else { return .stop }
        let set: WireTriggerSet
        do {
            let inForce = try await services.triggerSets.current(from: registry)
            // The uids it holds matter only to a trigger of one user.
            let uids = inForce.triggers.contains { $0.definition.uid != nil } ? try await services.registry.uids(of: agentID) : []
            let audience = TriggerAudience(agentID: agentID, host: host, uids: uids)
            let generation = keyPin.value
            set = try await services.work.control.runIfActive { [issuer = services.issuer] in
                try issuer.triggerSet(for: audience, from: inForce, keyGeneration: generation)
            }
        } catch is CancellationError {
            return .stop
        } catch {
            services.logger.error("cannot make an agent's trigger set; trying again shortly", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
            retry.later(retryDelay)
            return .next
        }
        let made = Sent(version: set.version, issuedAtUs: set.issuedAtUs, triggerIDs: set.triggers.map(\.triggerID))
        if let last = sent.value.withLock({ $0?.sent }), last.version == made.version, last.triggerIDs == made.triggerIDs { return .next }
        sent.value.withLock { $0 = (made, false) }
        do {
            guard let written = outbound.send([.with { $0.triggerSet = set }]) else { throw ChannelError.ioOnClosedChannel }
            try await written.get()
        } catch {
            return .stop
        }
        services.metrics.triggerSetsSent.increment()
        services.logger.info("trigger set sent", metadata: ["agent.id": "\(agentID)", "version": "\(set.version)", "triggers": "\(set.triggers.count)"])
        return .next
    }

    /// The agent answered a set: recorded once, when it answers the one last sent here (an
    /// answer to an earlier one, to none, or again, is logged and dropped).
    func answered(_ ack: WireTriggerSetAck) async {
        let last = sent.value.withLock { last -> Sent? in
            guard let held = last, held.sent.version == ack.version, held.sent.issuedAtUs == ack.issuedAtUs, !held.answered else { return nil }
            last?.answered = true
            return held.sent
        }
        guard let last else {
            services.logger.notice("trigger set answer for a set not sent last, or answered already; ignored", metadata: ["agent.id": "\(agentID)", "version": "\(ack.version)"])
            return
        }
        let refusal: String? =
            if case .rejectUnspecified = ack.reason { nil } else { "\(ack.reason)" + (ack.detail.isEmpty ? "" : ": \(ConnectionUploads.bounded(ack.detail))") }
        if let refusal {
            services.metrics.triggerSetRefused.increment()
            services.logger.warning("agent refused its trigger set", metadata: ["agent.id": "\(agentID)", "version": "\(ack.version)", "why": "\(refusal)"])
        }
        do {
            try await registry.recordAnswer(
                TriggerSetAnswer(agentID: agentID, version: last.version, issuedAt: Timestamp(microseconds: last.issuedAtUs), triggerIDs: last.triggerIDs, refusal: refusal, at: Date()))
        } catch {
            services.logger.error("cannot record an agent's answer to its trigger set", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
        }
    }
}
