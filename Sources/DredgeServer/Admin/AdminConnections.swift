import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTPTypes
import NIOSSL
import NIOTLS
import Synchronization

/// What the admin listener allows a connection (`"adminConnections"` in `server.json`; keys
/// left out keep their defaults): deadlines for each phase of an HTTP connection, and caps on
/// how many it holds, in all and from one address. The caps come out of the descriptors the
/// agent listener leaves free (``ConnectionLimits/reservedFileDescriptors``), so neither
/// listener can take the descriptors the other needs.
public struct AdminConnectionLimits: Codable, Sendable, Equatable {
    /// Seconds from accept to a finished TLS handshake. Default 10.
    public var handshakeSeconds: Double
    /// Seconds from a request's first byte to the end of its head (request line and headers). Default 10.
    public var headerSeconds: Double
    /// Seconds from a request's head to the end of its body. Default 30 (a body is at most 64 KiB).
    public var bodySeconds: Double
    /// Seconds a connection may wait for its next request (after TLS, or after a response). Default 60.
    public var idleSeconds: Double
    /// Connections open at once. Default 64.
    public var maxConnections: Int
    /// Connections open at once from one address. Default 32 (a browser opens about six; every
    /// engineer behind one SSH tunnel or proxy shares its address).
    public var maxPerAddress: Int

    public init(
        handshakeSeconds: Double = 10, headerSeconds: Double = 10, bodySeconds: Double = 30, idleSeconds: Double = 60, maxConnections: Int = 64,
        maxPerAddress: Int = 32
    ) {
        self.handshakeSeconds = handshakeSeconds
        self.headerSeconds = headerSeconds
        self.bodySeconds = bodySeconds
        self.idleSeconds = idleSeconds
        self.maxConnections = maxConnections
        self.maxPerAddress = maxPerAddress
    }

    public static let `default` = AdminConnectionLimits()

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = AdminConnectionLimits()
        handshakeSeconds = try c.decodeIfPresent(Double.self, forKey: .handshakeSeconds) ?? d.handshakeSeconds
        headerSeconds = try c.decodeIfPresent(Double.self, forKey: .headerSeconds) ?? d.headerSeconds
        bodySeconds = try c.decodeIfPresent(Double.self, forKey: .bodySeconds) ?? d.bodySeconds
        idleSeconds = try c.decodeIfPresent(Double.self, forKey: .idleSeconds) ?? d.idleSeconds
        maxConnections = try c.decodeIfPresent(Int.self, forKey: .maxConnections) ?? d.maxConnections
        maxPerAddress = try c.decodeIfPresent(Int.self, forKey: .maxPerAddress) ?? d.maxPerAddress
        if let problem { throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: problem)) }
    }

    /// Why these limits cannot work, or nil.
    public var problem: String? {
        for (name, seconds) in [("handshakeSeconds", handshakeSeconds), ("headerSeconds", headerSeconds), ("bodySeconds", bodySeconds), ("idleSeconds", idleSeconds)]
        where !(seconds > 0 && seconds <= 3600) {
            return "\(name) must be in (0, 3600]"
        }
        if !(1...4096).contains(maxConnections) { return "maxConnections must be 1 to 4096" }
        if !(1...maxConnections).contains(maxPerAddress) { return "maxPerAddress must be 1 to maxConnections" }
        return nil
    }

    static func amount(_ seconds: Double) -> TimeAmount { .nanoseconds(Int64(seconds * 1e9)) }
}

/// Counts the admin listener's connections and decides who may have one. One over its
/// address's cap is refused (closed before TLS). One over the total takes the place of the
/// oldest connection that is not being answered (closed), so connections held open from many
/// addresses slow engineers down but never lock them out; when every connection is being
/// answered, the new one is refused.
final class AdminConnectionGate: Sendable {
    enum Admission {
        case admitted(token: Int, evicted: (any Channel)?)
        case refused(String)
    }

    private struct Book {
        var next = 0
        var open: [Int: (address: String, channel: any Channel, busy: Bool, served: Bool)] = [:]
        var byAddress: [String: Int] = [:]

        mutating func remove(_ token: Int) -> (any Channel)? {
            guard let entry = open.removeValue(forKey: token) else { return nil }
            let left = byAddress[entry.address, default: 1] - 1
            byAddress[entry.address] = left > 0 ? left : nil
            return entry.channel
        }
    }

    let limits: AdminConnectionLimits
    private let book = Mutex(Book())

    init(limits: AdminConnectionLimits) { self.limits = limits }

    func admit(_ address: String, channel: any Channel) -> Admission {
        book.withLock { b in
            if b.byAddress[address, default: 0] >= limits.maxPerAddress {
                return .refused("\(limits.maxPerAddress) connections from \(address) are open")
            }
            var evicted: (any Channel)?
            if b.open.count >= limits.maxConnections {
                // Tokens grow with arrival: the smallest is the oldest. One that was never
                // answered (a flood's) goes before an engineer's kept-alive connection.
                let idle = b.open.filter { !$0.value.busy }
                guard let oldest = idle.filter({ !$0.value.served }).keys.min() ?? idle.keys.min() else {
                    return .refused("all \(limits.maxConnections) admin connections are being answered")
                }
                evicted = b.remove(oldest)
            }
            b.next += 1
            b.open[b.next] = (address, channel, false, false)
            b.byAddress[address, default: 0] += 1
            return .admitted(token: b.next, evicted: evicted)
        }
    }

    /// A connection being answered (and reading its answer) is not closed to make room; one
    /// that has been answered goes after those that never were.
    func setBusy(_ token: Int, _ busy: Bool) {
        book.withLock { b in
            b.open[token]?.busy = busy
            if !busy, b.open[token] != nil { b.open[token]?.served = true }
        }
    }

    func release(_ token: Int) {
        book.withLock { b in _ = b.remove(token) }
    }
}

/// The admin listener's child channel: Hummingbird's HTTP/1.1 channel (behind TLS when the
/// deployment has it) with the gate in front and ``AdminConnectionWatch`` keeping its deadlines.
struct AdminChildChannel: ServerChildChannel {
    typealias Value = HTTP1Channel.Value

    let http: HTTP1Channel
    let tls: ReloadableTLS?
    let gate: AdminConnectionGate
    /// Refusals and deadline closes, with the address: at most a few a minute.
    let refusals: RateLimitedLog
    let logger: Logger

    init(responder: @escaping HTTPChannelHandler.Responder, tls: ReloadableTLS?, gate: AdminConnectionGate, refusals: RateLimitedLog, logger: Logger) {
        // The watch's tap on HTTP parts; the watch itself is found in the pipeline.
        http = HTTP1Channel(responder: responder, configuration: .init(additionalChannelHandlers: [AdminHTTPTap()]))
        self.tls = tls
        self.gate = gate
        self.refusals = refusals
        self.logger = logger
    }

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        let address = channel.remoteAddress?.ipAddress ?? "unknown"
        let token: Int
        switch gate.admit(address, channel: channel) {
        case .refused(let why):
            refusals.log { suppressed in
                self.logger.notice("admin connection refused", metadata: ["remote": "\(address)", "reason": "\(why)", "suppressed": "\(suppressed)"])
            }
            channel.close(promise: nil)
            return channel.eventLoop.makeFailedFuture(ChannelError.inputClosed)
        case .admitted(let admitted, let evicted):
            if let evicted {
                refusals.log { suppressed in
                    self.logger.notice("closing the oldest idle admin connection to make room", metadata: ["remote": "\(address)", "suppressed": "\(suppressed)"])
                }
                evicted.close(promise: nil)
            }
            token = admitted
        }
        let gate = self.gate
        channel.closeFuture.whenComplete { _ in gate.release(token) }
        let (refusals, log) = (self.refusals, self.logger)
        return channel.eventLoop.makeCompletedFuture {
            let handlers = channel.pipeline.syncOperations
            let watch = AdminConnectionWatch(limits: gate.limits, secure: tls != nil) { phase in
                refusals.log { suppressed in
                    log.notice("admin connection closed at its deadline", metadata: ["remote": "\(address)", "phase": "\(phase)", "suppressed": "\(suppressed)"])
                }
            } busy: { gate.setBusy(token, $0) }
            try handlers.addHandler(watch)
            if let tls {
                try handlers.addHandler(NIOSSLServerHandler(context: tls.context))
                try handlers.addHandler(AdminTLSTap())
            }
        }.flatMap {
            self.http.setup(channel: channel, logger: logger)
        }.flatMapError { error in
            // NIO drops a channel whose initializer failed without closing it.
            channel.close(promise: nil)
            return channel.eventLoop.makeFailedFuture(error)
        }
    }

    func handle(value: Value, logger: Logger) async {
        await http.handle(value: value, logger: logger)
    }
}

/// Keeps an admin connection's deadlines (``AdminConnectionLimits``): the TLS handshake from
/// accept, then in turn the wait for a request (idle), its head from its first byte, its body
/// from its head. While the server answers there is none, unless the client stops reading its
/// answer (the socket stays full for `idleSeconds`: stalled). A connection past its phase's
/// deadline is closed, however slowly it was trickling bytes; one that sends more than
/// ``maxPipelined`` requests ahead of their answers is closed at once. First in the pipeline (it sees
/// bytes as they arrive, before TLS); ``AdminTLSTap`` and ``AdminHTTPTap`` tell it of the
/// handshake and of requests and responses.
final class AdminConnectionWatch: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    enum Phase: String, Sendable {
        case handshake, idle, head, body, responding
        /// Answering, and the client has not read what was written for a while.
        case stalled
        /// More requests sent ahead than are answered at once.
        case pipelined
    }

    /// Requests a client may send before their answers (HTTP/1.1 pipelining); more is abuse.
    static let maxPipelined = 16

    private let limits: AdminConnectionLimits
    private let expired: (Phase) -> Void
    private let busy: (Bool) -> Void
    private var handshaking: Bool
    /// A request's head has arrived and its end not yet.
    private var readingRequest = false
    /// Requests read whose response has not ended.
    private var unanswered = 0
    /// Responses that ended before their request did (an early refusal of a body).
    private var answeredEarly = 0
    /// Bytes arrived since the connection went idle: a request has begun.
    private var begun = false
    /// The socket takes what is written (false while the client does not read).
    private var writable = true
    private var busyNow = false
    private var phase: Phase?
    private var timer: Scheduled<Void>?
    private var context: ChannelHandlerContext?

    /// - Parameter busy: told when the connection starts and stops being answered.
    init(limits: AdminConnectionLimits, secure: Bool, expired: @escaping (Phase) -> Void, busy: @escaping (Bool) -> Void = { _ in }) {
        self.limits = limits
        self.handshaking = secure
        self.expired = expired
        self.busy = busy
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        update()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if !begun && phase == .idle {
            begun = true
            update()
        }
        context.fireChannelRead(data)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        writable = context.channel.isWritable
        update()
        context.fireChannelWritabilityChanged()
    }

    func handshakeCompleted() {
        handshaking = false
        begun = false
        update()
    }

    func requestHead() {
        readingRequest = true
        if unanswered >= Self.maxPipelined, let context {
            expired(.pipelined)
            context.close(promise: nil)
            return
        }
        update()
    }

    func requestEnd() {
        readingRequest = false
        if answeredEarly > 0 { answeredEarly -= 1 } else { unanswered += 1 }
        begun = false
        update()
    }

    func responseEnd() {
        if unanswered > 0 { unanswered -= 1 } else { answeredEarly += 1 }
        update()
    }

    private var current: Phase {
        if handshaking { return .handshake }
        // A response the client does not read, even while it sends its next request.
        if unanswered > 0 && !writable { return .stalled }
        if readingRequest { return .body }
        if unanswered > 0 { return .responding }
        return begun ? .head : .idle
    }

    /// A new phase starts its own deadline; staying in one keeps the deadline it started with.
    private func update() {
        // Busy while answering a client that reads its answers, pipelined requests or not.
        let busyNext = unanswered > 0 && writable
        if busyNext != busyNow {
            busyNow = busyNext
            busy(busyNext)
        }
        let next = current
        guard next != phase, let context else { return }
        phase = next
        timer?.cancel()
        timer = nil
        let seconds: Double? =
            switch next {
            case .handshake: limits.handshakeSeconds
            case .idle: limits.idleSeconds
            case .head: limits.headerSeconds
            case .body: limits.bodySeconds
            case .stalled: limits.idleSeconds
            case .responding, .pipelined: nil
            }
        guard let seconds else { return }
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: AdminConnectionLimits.amount(seconds)) {
            guard self.phase == next else { return }
            self.expired(next)
            context.close(promise: nil)
        }
    }

    static func find(in pipeline: ChannelPipeline) -> AdminConnectionWatch? {
        try? pipeline.syncOperations.handler(type: AdminConnectionWatch.self)  // absent only outside the admin listener
    }
}

/// After TLS: tells the watch the handshake is done.
final class AdminTLSTap: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted = event {
            AdminConnectionWatch.find(in: context.pipeline)?.handshakeCompleted()
        }
        context.fireUserInboundEventTriggered(event)
    }
}

/// After the HTTP codec: tells the watch where each request and response begins and ends.
final class AdminHTTPTap: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private var watch: AdminConnectionWatch?

    func handlerAdded(context: ChannelHandlerContext) {
        watch = AdminConnectionWatch.find(in: context.pipeline)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head: watch?.requestHead()
        case .end: watch?.requestEnd()
        case .body: break
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) { watch?.responseEnd() }
        context.write(data, promise: promise)
    }
}
