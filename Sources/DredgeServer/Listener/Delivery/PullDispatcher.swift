import DredgeEnvelope
import DredgeWire
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// Wakes the connection of every agent that has a pull to deliver.
///
/// Pulls made through this process's admin API wake their agents at once. A sweep every
/// `sweepInterval` catches the rest: pulls queued by another process (`dredge-server pull`)
/// and anything a wake missed. Idle connections cost nothing: one query per sweep in all,
/// not one per agent.
///
/// With ``PullNotices`` (the PostgreSQL back end, shared by several nodes), a pull queued by
/// any node or process wakes its agents here at once, through the database's notifications;
/// the sweep then only runs with the housekeeping, once a minute, as a safety net.
public final class PullDispatcher: Service, Sendable {
    let pulls: any PullQueue
    let sweepInterval: Duration
    let logger: Logger
    /// The wakes of the connections, by agent id and registration token.
    private struct Waiting {
        var wakes: [String: [Int: @Sendable (FreshPull?) -> Void]] = [:]
        var next = 0
    }

    private let waiting = Mutex(Waiting())
    /// Told of each agent revoked (``whenRevoked(_:)``).
    private let revocationHandlers = Mutex<[@Sendable (String) -> Void]>([])
    /// Told of each tail another node stopped (``whenTailStopped(_:)``).
    private let tailStopHandlers = Mutex<[@Sendable (String) -> Void]>([])
    /// Told whenever the standing triggers change (``whenTriggersChanged(_:)``).
    private let triggerHandlers = Mutex<[@Sendable () -> Void]>([])

    /// Run about once a minute: ends pulls that will not finish, removes abandoned uploads.
    let housekeeping: (@Sendable () async throws -> Void)?
    let notices: (any PullNotices)?
    /// Of the agents connected here, those revoked: asked at each sweep, so a revocation whose
    /// notification this node missed (its listening connection lost at the time) still ends
    /// the agent's connection here, a sweep later.
    let revokedAmong: (@Sendable ([String]) async throws -> [String])?

    public init(
        pulls: any PullQueue, sweepInterval: Duration = .seconds(1), logger: Logger, notices: (any PullNotices)? = nil,
        revokedAmong: (@Sendable ([String]) async throws -> [String])? = nil, housekeeping: (@Sendable () async throws -> Void)? = nil
    ) {
        self.revokedAmong = revokedAmong
        self.pulls = pulls
        self.sweepInterval = notices == nil ? sweepInterval : max(sweepInterval, .seconds(60))
        self.logger = logger
        self.notices = notices
        self.housekeeping = housekeeping
    }

    /// Calls `wake` whenever `agentID` may have pulls to deliver, and once at once: with the
    /// pull when it is one this process just queued (``FreshPull``), else with nil (the
    /// agent's pulls must be read). `wake` is called on whichever thread wakes (an admin
    /// request, the sweep, a notification) and must only start work, never wait. Returns the
    /// token to ``unregister(_:token:)`` with.
    func register(_ agentID: String, wake: @escaping @Sendable (FreshPull?) -> Void) -> Int {
        let token = waiting.withLock { w in
            w.next += 1
            w.wakes[agentID, default: [:]][w.next] = wake
            return w.next
        }
        wake(nil)
        return token
    }

    /// Whether `agentID` has an authenticated connection to this process now (and so is
    /// enrolled: no agent is ever unenrolled).
    public func isConnected(_ agentID: String) -> Bool {
        waiting.withLock { $0.wakes[agentID] != nil }
    }

    func unregister(_ agentID: String, token: Int) {
        waiting.withLock { w in
            w.wakes[agentID]?.removeValue(forKey: token)
            if w.wakes[agentID]?.isEmpty == true { w.wakes[agentID] = nil }
        }
    }

    /// Wakes the connections of these agents, if connected: with `fresh`, to send that pull,
    /// just queued for them (their delivery need not read it); without, to read and send
    /// whatever is due.
    public func wake(_ agentIDs: some Sequence<String>, with fresh: FreshPull? = nil) {
        let wakes = waiting.withLock { w in agentIDs.flatMap { w.wakes[$0].map { Array($0.values) } ?? [] } }
        for wake in wakes { wake(fresh) }
    }

    /// Calls `handler` with each agent revoked from now on: by this process (``revoked(_:)``),
    /// or, on a shared database, by any node (its notification).
    func whenRevoked(_ handler: @escaping @Sendable (String) -> Void) {
        revocationHandlers.withLock { $0.append(handler) }
    }

    /// An agent was revoked: whoever holds its connection here ends it.
    public func revoked(_ agentID: String) {
        for handler in revocationHandlers.withLock({ $0 }) { handler(agentID) }
    }

    /// A live tail stopped on another node (#53), on the pull channel: its id after a `~`.
    static let tailStoppedMark = "~"

    /// Calls `handler` with each tail another node says it stopped (on a shared database).
    func whenTailStopped(_ handler: @escaping @Sendable (String) -> Void) {
        tailStopHandlers.withLock { $0.append(handler) }
    }

    private func tailStopped(_ tailID: String) {
        guard WireID.isValid(tailID) else { return }
        for handler in tailStopHandlers.withLock({ $0 }) { handler(tailID) }
    }

    /// The standing triggers changed (#54), on the pull channel: this mark alone.
    public static let triggersChangedMark = "^"

    /// Calls `handler` whenever the standing triggers change: through this process's admin
    /// API (``triggersChanged()``) or, on a shared database, on any node (its notification).
    func whenTriggersChanged(_ handler: @escaping @Sendable () -> Void) {
        triggerHandlers.withLock { $0.append(handler) }
    }

    /// The standing triggers changed: the agents connected here are sent their sets again.
    public func triggersChanged() {
        for handler in triggerHandlers.withLock({ $0 }) { handler() }
    }

    /// A revocation on the pull channel: the agent's id after a `-` (an id is hex, never so).
    static func revokedNotice(_ agentID: String) -> String { "-" + agentID }

    public func run() async throws {
        let listening = notices.map { notices in
            Task { [weak self, logger] in
                await notices.listen(logger: logger) { [weak self] ids in
                    guard let self else { return }
                    for id in ids where id.hasPrefix("-") { self.revoked(String(id.dropFirst())) }
                    for id in ids where id.hasPrefix(Self.tailStoppedMark) { self.tailStopped(String(id.dropFirst())) }
                    if ids.contains(Self.triggersChangedMark) { self.triggersChanged() }
                    self.wake(ids.filter { !$0.hasPrefix("-") && !$0.hasPrefix(Self.tailStoppedMark) && $0 != Self.triggersChangedMark })
                }
            }
        }
        defer { listening?.cancel() }
        var lastHousekeeping = ContinuousClock.now
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: self.sweepInterval) }
            } catch {
                break
            }
            do {
                wake(try await pulls.agentsWithQueuedPulls())
            } catch {
                logger.error("delivery sweep failed", metadata: ["error": "\(error)"])
            }
            if let revokedAmong {
                let connected = waiting.withLock { Array($0.wakes.keys) }
                do {
                    for id in try await revokedAmong(connected) { revoked(id) }
                } catch {
                    logger.error("could not look for revoked agents among those connected", metadata: ["error": "\(error)"])
                }
            }
            if let housekeeping, ContinuousClock.now - lastHousekeeping >= .seconds(60) {
                lastHousekeeping = .now
                do { try await housekeeping() } catch { logger.error("housekeeping failed", metadata: ["error": "\(error)"]) }
            }
        }
    }
}

/// A pull this process just queued, handed to its targets' connections with the wake: what
/// its command is made from, and the public keys of the targets it read while storing it, so
/// a delivery reads nothing before claiming the pull (``PullQueue/update`` from `queued`
/// only, so a pull delivered meanwhile is not sent twice).
public struct FreshPull: Sendable {
    public var pull: StoredPull
    /// By agent id; an agent not here has its key read by its delivery.
    public var agentKeys: [String: RSAPublicKey]

    public init(_ pull: StoredPull, agentKeys: [String: RSAPublicKey] = [:]) {
        self.pull = pull
        self.agentKeys = agentKeys
    }
}

/// Pulls queued anywhere (any node, any process on the same database), as they are queued.
public protocol PullNotices: Sendable {
    /// Calls `wake` with the agents of each pull queued from now on, until cancelled; after
    /// each (re)connection also with every agent that has a queued pull and
    /// ``PullDispatcher/triggersChangedMark`` (what it may have missed). Never throws: a lost
    /// connection is logged and made again.
    func listen(logger: Logger, _ wake: @escaping @Sendable ([String]) -> Void) async
}
