import DredgeWire
import Foundation
import NIOCore
import Synchronization

/// What the agent listener allows a connection: how long it may take to authenticate, how
/// long an authenticated one may stay silent, and how many may be open at once
/// (`"connections"` in `server.json`; keys left out keep their defaults).
public struct ConnectionLimits: Codable, Sendable, Equatable {
    /// Seconds from accept to a ready connection (TLS, Hello and authentication). Default 10.
    public var handshakeSeconds: Double
    /// Heartbeat intervals an authenticated agent may send nothing before it is closed. Default 3.
    public var missedHeartbeats: Int
    /// Agent connections open at once, authenticated or not. Default: the open-file limit
    /// less ``reservedFileDescriptors`` (room for the admin API's connections, databases and
    /// uploads), and less what the admin API may hold beyond its default 64.
    public var maxConnections: Int?
    /// Of those, connections not yet authenticated. Default: a quarter, at most 1,024 (more is
    /// no help to agents arriving at once, and every one held back is an agent fewer the server
    /// can hold). The rest is kept for enrolled agents, so a flood of connections that never
    /// authenticate cannot take it.
    public var maxUnauthenticated: Int?
    /// Unauthenticated connections from one source address. Default 32.
    public var maxUnauthenticatedPerAddress: Int
    /// Seconds a stopping server tells its agents it will be back within (its `Goodbye`'s
    /// `back_within_ms`, Protocol § 6): they try every few seconds for that long rather than
    /// backing off, so a restart costs them seconds. Default 60; 0 says nothing; at most 600.
    public var restartWithinSeconds: Int
    /// Bytes of upload chunks this node takes a second from all agents together, shared fairly
    /// among those uploading (``IngressGovernor``). Default: no cap; at least 1 MiB.
    public var maxIngressBytesPerSecond: Int?

    public static let reservedFileDescriptors = 256

    public init(
        handshakeSeconds: Double = Double(WireLimits.defaultHandshakeSeconds), missedHeartbeats: Int = Int(WireLimits.missedHeartbeatsBeforeClose),
        maxConnections: Int? = nil, maxUnauthenticated: Int? = nil, maxUnauthenticatedPerAddress: Int = 32, restartWithinSeconds: Int = 60,
        maxIngressBytesPerSecond: Int? = nil
    ) {
        self.maxIngressBytesPerSecond = maxIngressBytesPerSecond
        self.restartWithinSeconds = restartWithinSeconds
        self.handshakeSeconds = handshakeSeconds
        self.missedHeartbeats = missedHeartbeats
        self.maxConnections = maxConnections
        self.maxUnauthenticated = maxUnauthenticated
        self.maxUnauthenticatedPerAddress = maxUnauthenticatedPerAddress
    }

    public static let `default` = ConnectionLimits()

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = ConnectionLimits()
        handshakeSeconds = try c.decodeIfPresent(Double.self, forKey: .handshakeSeconds) ?? d.handshakeSeconds
        missedHeartbeats = try c.decodeIfPresent(Int.self, forKey: .missedHeartbeats) ?? d.missedHeartbeats
        maxConnections = try c.decodeIfPresent(Int.self, forKey: .maxConnections)
        maxUnauthenticated = try c.decodeIfPresent(Int.self, forKey: .maxUnauthenticated)
        maxUnauthenticatedPerAddress = try c.decodeIfPresent(Int.self, forKey: .maxUnauthenticatedPerAddress) ?? d.maxUnauthenticatedPerAddress
        restartWithinSeconds = try c.decodeIfPresent(Int.self, forKey: .restartWithinSeconds) ?? d.restartWithinSeconds
        maxIngressBytesPerSecond = try c.decodeIfPresent(Int.self, forKey: .maxIngressBytesPerSecond)
        if let problem { throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: problem)) }
    }

    /// Why these limits cannot work, or nil.
    public var problem: String? {
        if !(handshakeSeconds > 0 && handshakeSeconds <= 600) { return "handshakeSeconds must be in (0, 600]" }
        if !(1...100).contains(missedHeartbeats) { return "missedHeartbeats must be 1 to 100" }
        if let maxConnections, maxConnections < 2 { return "maxConnections must be at least 2" }
        if let maxUnauthenticated, maxUnauthenticated < 1 { return "maxUnauthenticated must be at least 1" }
        if let maxConnections, let maxUnauthenticated, maxUnauthenticated >= maxConnections {
            return "maxUnauthenticated must be below maxConnections, to leave room for enrolled agents"
        }
        if maxUnauthenticatedPerAddress < 1 { return "maxUnauthenticatedPerAddress must be at least 1" }
        if !(0...Int(WireLimits.maxRestartWindow.components.seconds)).contains(restartWithinSeconds) { return "restartWithinSeconds must be 0 to 600" }
        if let cap = maxIngressBytesPerSecond, cap < IngressGovernor.minBytesPerSecond { return "maxIngressBytesPerSecond must be at least \(IngressGovernor.minBytesPerSecond) (1 MiB)" }
        return nil
    }

    /// The caps in effect under an open-file limit of `openFiles`.
    /// The most unauthenticated connections by default, whatever the open-file limit.
    public static let defaultMaxUnauthenticated = 1_024

    func caps(openFiles: Int, adminConnections: Int = AdminConnectionLimits.default.maxConnections) -> ConnectionGate.Caps {
        let openFiles = openFiles > 0 ? openFiles : 1024
        let reserved = Self.reservedFileDescriptors + max(0, adminConnections - AdminConnectionLimits.default.maxConnections)
        let total = maxConnections ?? max(16, openFiles - reserved)
        let unauthenticated = min(maxUnauthenticated ?? max(4, min(Self.defaultMaxUnauthenticated, total / 4)), total - 1)
        return ConnectionGate.Caps(
            authenticated: total - unauthenticated, unauthenticated: unauthenticated,
            unauthenticatedPerAddress: min(maxUnauthenticatedPerAddress, unauthenticated))
    }
}

/// Counts the agent listener's connections and decides who may have one (``ConnectionLimits``).
///
/// A new connection is unauthenticated. One over its address's cap is refused. One over the
/// global cap for unauthenticated connections takes the place of the oldest of them (closed),
/// so a flood from many addresses slows new agents down but never locks them out. An
/// authenticated connection moves to its own pool (``authenticate(_:)``), which unauthenticated
/// ones never use.
final class ConnectionGate: Sendable {
    struct Caps: Sendable, Equatable {
        var authenticated: Int
        var unauthenticated: Int
        var unauthenticatedPerAddress: Int
    }

    enum Admission {
        case admitted(token: Int, evicted: (any Channel)?)
        case refused(String)
    }

    /// Who holds a place, and in which pool.
    private struct Book {
        var next = 0
        var pending: [Int: (address: String, channel: any Channel)] = [:]
        /// Tokens of unauthenticated connections in arrival order; entries no longer pending
        /// are skipped when met (and dropped when they pile up).
        var arrivals: [Int] = []
        var arrivalsHead = 0
        var pendingByAddress: [String: Int] = [:]
        var authenticated: Set<Int> = []
        var refused = 0
        var evicted = 0

        mutating func oldestPending() -> Int? {
            while arrivalsHead < arrivals.count {
                let token = arrivals[arrivalsHead]
                if pending[token] != nil { return token }
                arrivalsHead += 1
            }
            return nil
        }

        @discardableResult
        mutating func removePending(_ token: Int) -> (address: String, channel: any Channel)? {
            guard let entry = pending.removeValue(forKey: token) else { return nil }
            let left = pendingByAddress[entry.address, default: 1] - 1
            pendingByAddress[entry.address] = left > 0 ? left : nil
            return entry
        }
    }

    let caps: Caps
    private let book = Mutex(Book())

    init(caps: Caps) { self.caps = caps }

    var counts: (authenticated: Int, unauthenticated: Int) { book.withLock { ($0.authenticated.count, $0.pending.count) } }
    var refusedCount: Int { book.withLock { $0.refused } }
    var evictedCount: Int { book.withLock { $0.evicted } }

    func admit(address: String, channel: any Channel) -> Admission {
        book.withLock { b in
            if b.pendingByAddress[address, default: 0] >= caps.unauthenticatedPerAddress {
                b.refused += 1
                return .refused("\(caps.unauthenticatedPerAddress) connections from \(address) are already authenticating")
            }
            var evicted: (any Channel)?
            if b.pending.count >= caps.unauthenticated, let oldest = b.oldestPending() {
                evicted = b.removePending(oldest)?.channel
                b.evicted += 1
            }
            b.next += 1
            b.pending[b.next] = (address, channel)
            b.arrivals.append(b.next)
            if b.arrivalsHead > 1024 && b.arrivalsHead * 2 > b.arrivals.count {
                b.arrivals.removeFirst(b.arrivalsHead)
                b.arrivalsHead = 0
            }
            b.pendingByAddress[address, default: 0] += 1
            return .admitted(token: b.next, evicted: evicted)
        }
    }

    /// Moves a connection to the authenticated pool; false when that pool is full (or the
    /// connection was evicted meanwhile).
    func authenticate(_ token: Int) -> Bool {
        book.withLock { b in
            guard b.pending[token] != nil, b.authenticated.count < caps.authenticated else { return false }
            b.removePending(token)
            b.authenticated.insert(token)
            return true
        }
    }

    func release(_ token: Int) {
        book.withLock { b in
            if b.authenticated.remove(token) == nil { b.removePending(token) }
        }
    }
}

/// Closes a connection that misses its deadlines: one that is not authenticated
/// `handshake` after it was accepted (TLS, Hello, credentials, however slowly they trickle
/// in), and an authenticated one that sends no whole frame for `missedHeartbeats` heartbeat
/// intervals (told why with `Goodbye`, through the connection's machine: `goodbye`). On
/// authentication it also raises the connection's frame limit from
/// ``WireLimits/maxPreAuthFrameBytes`` to ``WireLimits/maxFrameBytes``.
///
/// It learns of the authentication from the connection's driver, which tells it through the
/// pipeline (``AgentConnectionEvent/authenticated(heartbeatSeconds:)``) when the connection's
/// machine decided it: no frame that passes is taken for one. Times come from the channel's
/// event loop (an `EmbeddedEventLoop` in tests).
final class ConnectionDeadlineHandler: ChannelDuplexHandler {
    typealias InboundIn = WireFrame
    typealias InboundOut = WireFrame
    typealias OutboundIn = WireFrame
    typealias OutboundOut = WireFrame

    enum Expiry: Sendable, Equatable {
        case handshake
        case silent(TimeAmount)
    }

    private let handshake: TimeAmount
    private let missedHeartbeats: Int64
    private let frameLimit: FrameSizeLimit
    private let onExpiry: @Sendable (Expiry) -> Void
    private let goodbye: @Sendable (String) -> Void
    private var timer: Scheduled<Void>?
    private var silenceLimit: TimeAmount?
    private var lastFrame = NIODeadline.uptimeNanoseconds(0)

    /// - Parameter goodbye: says `Goodbye` with the reason and closes once it is written (the
    ///   connection's ``ConnectionOutbound/goodbye(_:)``); the handler closes anyway a few
    ///   seconds later if that never happens (a peer that does not read).
    init(
        handshake: TimeAmount, missedHeartbeats: Int, frameLimit: FrameSizeLimit, onExpiry: @escaping @Sendable (Expiry) -> Void = { _ in },
        goodbye: @escaping @Sendable (String) -> Void
    ) {
        self.handshake = handshake
        self.missedHeartbeats = Int64(missedHeartbeats)
        self.frameLimit = frameLimit
        self.onExpiry = onExpiry
        self.goodbye = goodbye
    }

    func handlerAdded(context: ChannelHandlerContext) {
        lastFrame = context.eventLoop.now
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: handshake) {
            guard self.silenceLimit == nil else { return }
            self.onExpiry(.handshake)
            context.close(promise: nil)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        lastFrame = context.eventLoop.now
        context.fireChannelRead(data)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let event = event as? AgentConnectionEvent else { return context.triggerUserOutboundEvent(event, promise: promise) }
        switch event {
        case .authenticated(let heartbeatSeconds):
            if silenceLimit == nil {
                silenceLimit = .seconds(Int64(max(1, heartbeatSeconds)) * missedHeartbeats)
                frameLimit.set(WireLimits.maxFrameBytes)
                lastFrame = context.eventLoop.now
                timer?.cancel()
                scheduleSilenceCheck(context: context)
            }
        }
        promise?.succeed()
    }

    private func scheduleSilenceCheck(context: ChannelHandlerContext) {
        guard let limit = silenceLimit else { return }
        timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: lastFrame + limit) {
            if context.eventLoop.now - self.lastFrame >= limit {
                self.onExpiry(.silent(limit))
                self.goodbye("nothing received for \(limit.nanoseconds / 1_000_000_000) s")
                // A peer that does not read never lets the Goodbye be written: close anyway.
                context.eventLoop.assumeIsolated().scheduleTask(in: .seconds(5)) { context.close(promise: nil) }
            } else {
                self.scheduleSilenceCheck(context: context)
            }
        }
    }
}

/// The one live connection of each authenticated agent. A newer connection of the same agent
/// replaces the older, which is told so and closed: a stale connection can neither take
/// commands nor mark the agent offline.
final class AgentConnections: Sendable {
    private let live = Mutex<[String: (token: Int, generation: Int64, outbound: ConnectionOutbound)]>([:])

    /// Makes `outbound`'s connection the agent's, unless a connection with a newer presence
    /// generation got there first (two authenticating at once). Returns the connection that
    /// must go: the one replaced, or `outbound` itself when it lost.
    func replace(_ agentID: String, token: Int, generation: Int64, outbound: ConnectionOutbound) -> ConnectionOutbound? {
        live.withLock { live in
            if let current = live[agentID], current.generation > generation { return outbound }
            let old = live[agentID]
            live[agentID] = (token, generation, outbound)
            return old?.outbound
        }
    }

    /// Whether `token` holds the agent's live connection (a replaced one no longer delivers).
    func isLive(_ agentID: String, token: Int) -> Bool { live.withLock { $0[agentID]?.token == token } }

    /// Forgets the agent's connection if it is still `token`'s.
    func remove(_ agentID: String, token: Int) {
        live.withLock { live in
            if live[agentID]?.token == token { live[agentID] = nil }
        }
    }

    var count: Int { live.withLock { $0.count } }

    /// The agent's live connection here, if any.
    func connection(of agentID: String) -> ConnectionOutbound? { live.withLock { $0[agentID]?.outbound } }
}
