import DredgeWire
import Foundation
import Logging
import NIOCore
import Synchronization

/// Drives one agent connection: the frames the channel decodes go to its
/// ``ConnectionSession`` one at a time, in order, and what the session answers is written.
///
/// An idle connection must be cheap, so no task waits for it: a frame that arrives while
/// nothing runs starts a task that handles the frames queued and ends when the queue is
/// empty (a task keeps, for its whole life, the memory of the deepest chain of async frames it
/// ever ran). Reading stops while ``highWatermark`` frames wait (TCP then holds the agent
/// back) and resumes below ``lowWatermark``; answers wait while the channel is not writable,
/// so a peer that does not read stops being read.
///
/// When the channel closes, the frames already queued are still handled (a chunk that arrived
/// is still stored), then ``AgentListener/ended(_:)`` runs once. When the session asks to
/// close, or a step fails, the frames still queued are dropped.
///
/// The session is used by one caller at a time: the one running task, or the event loop while
/// ``answerAtOnce(_:)`` holds `running`.
final class ConnectionDriver: Sendable {
    enum Input: Sendable {
        case frame(WireFrame)
        /// The decoder refused the stream: the session tells the peer why, then the
        /// connection closes.
        case refused(WireProtocolError)
    }

    static let highWatermark = 8
    static let lowWatermark = 2

    let session: ConnectionSession
    let channel: any Channel
    private let ended: @Sendable (ConnectionSession) async -> Void
    private let logger: Logger
    private let counters: ConnectionCounters
    private struct State {
        var queue = CircularBuffer<Input>(initialCapacity: 4)
        var running = false
        /// The session asked to close: later input is dropped.
        var closing = false
        var inactive = false
        var finished = false
        var readsHeld = false
        /// Answers the running task handed to the channel that it has not written yet (they go
        /// out on the event loop, after the task's hop to it): a heartbeat answered at once
        /// waits for them, so acknowledgements leave in the order their frames came.
        var answersUnwritten = 0

        /// Whether the caller is the one to run ``ConnectionDriver/ended``.
        mutating func claimEnd() -> Bool {
            guard inactive, !running, !finished else { return false }
            finished = true
            return true
        }
    }

    private let state = Mutex(State())

    init(
        session: ConnectionSession, channel: any Channel, logger: Logger, counters: ConnectionCounters = ConnectionCounters(),
        ended: @escaping @Sendable (ConnectionSession) async -> Void
    ) {
        self.session = session
        self.channel = channel
        self.logger = logger
        self.counters = counters
        self.ended = ended
    }

    /// On the event loop: a decoded frame, or the decoder's refusal.
    func receive(_ input: Input) {
        if case .frame(let frame) = input, case .heartbeat? = frame.body, answerAtOnce(frame) { return }
        let (start, behind) = state.withLock { s -> (Bool, Bool) in
            guard !s.closing, !s.finished else { return (false, false) }
            s.queue.append(input)
            if s.running { return (false, true) }
            s.running = true
            return (true, false)
        }
        if behind { counters.framesQueuedBehindAStep.add(1, ordering: .relaxed) }
        if start { startRun() }
    }

    /// On the event loop: answers a heartbeat the session holds in memory (most of them, on a
    /// connection that only heartbeats) here, when nothing else of the connection is queued or
    /// running; true if it did. Such a heartbeat then needs no task: its acknowledgement does
    /// not wait for a thread of Swift's cooperative pool, nor for the event loop to wake again
    /// to write it. Under load each of those waits can be a scheduler's wake-up latency
    /// (docs/benchmarks.md, heartbeats under upload).
    private func answerAtOnce(_ frame: WireFrame) -> Bool {
        let mine = state.withLock { s -> Bool in
            guard !s.closing, !s.finished, !s.running, s.queue.isEmpty, s.answersUnwritten == 0 else { return false }
            s.running = true  // the session is this call's until it returns
            return true
        }
        guard mine else { return false }
        let ack = channel.isWritable ? session.answerAtOnce(frame) : nil
        if let ack { _ = channel.writeAndFlush(frames: [ack]) }
        // A frame queued meanwhile (were the pipeline to call `receive` again from the write)
        // gets the task it would have started.
        let (start, end) = state.withLock { s -> (Bool, Bool) in
            if !s.queue.isEmpty && !s.closing { return (true, false) }
            s.running = false
            return (false, s.claimEnd())
        }
        if start { startRun() }
        if end { Task { await self.ended(self.session) } }
        return ack != nil
    }

    /// On the event loop, when the channel asks for more bytes: whether to read now. A read
    /// held back is made when the queue has drained below ``lowWatermark``.
    func shouldRead() -> Bool {
        state.withLock { s in
            if s.queue.count >= Self.highWatermark {
                s.readsHeld = true
                return false
            }
            return true
        }
    }

    /// The channel closed (its close future completed: also for a channel closed before NIO
    /// registered it, which never goes inactive).
    func channelClosed() {
        session.outbound.closed()
        let end = state.withLock { s -> Bool in
            s.inactive = true
            return s.claimEnd()
        }
        if end { Task { await self.ended(self.session) } }
    }

    private func next() -> (input: Input?, resumeReading: Bool, end: Bool) {
        state.withLock { s in
            guard !s.closing, let input = s.queue.popFirst() else {
                s.queue.removeAll()
                s.running = false
                return (nil, false, s.claimEnd())
            }
            var resume = false
            if s.readsHeld && s.queue.count < Self.lowWatermark {
                s.readsHeld = false
                resume = true
            }
            return (input, resume, false)
        }
    }

    private func startRun() {
        counters.runsStarted.add(1, ordering: .relaxed)
        Task { await self.run() }
    }

    private func run() async {
        defer { counters.runsEnded.add(1, ordering: .relaxed) }
        while true {
            let (input, resumeReading, end) = next()
            if resumeReading { channel.read() }
            guard let input else {
                if end { await ended(session) }
                return
            }
            let outcome: ConnectionSession.Outcome
            do {
                switch input {
                case .frame(let frame): outcome = try await session.receive(frame)
                case .refused(let error): outcome = try await session.fail(error)
                }
            } catch {
                logger.debug("agent connection ended", metadata: ["error": "\(error)", "remote": "\(session.remote ?? "?")"])
                close(after: nil)
                continue
            }
            if !outcome.frames.isEmpty { state.withLock { $0.answersUnwritten += 1 } }
            if outcome.registered != nil {
                // Announced to the handlers that act on it before the AuthResult goes out
                // (both hop to the event loop in this order).
                channel.triggerUserOutboundEvent(AgentConnectionEvent.authenticated(heartbeatSeconds: session.heartbeatSeconds), promise: nil)
            }
            let written = channel.writeAndFlush(frames: outcome.frames)
            written?.whenComplete { _ in self.state.withLock { $0.answersUnwritten -= 1 } }
            if let agentID = outcome.registered { session.startDelivery(agentID) }
            if outcome.close {
                close(after: written)
                continue
            }
            if let written, !channel.isWritable {
                // The peer is not reading: neither do we, until it does.
                do { try await written.get() } catch { close(after: nil) }
            }
        }
    }

    /// Drops further input (queued frames too) and closes the channel once `written` is (at
    /// once if nil); closes anyway after a few seconds if the peer does not read.
    private func close(after written: EventLoopFuture<Void>?) {
        state.withLock { $0.closing = true }
        channel.close(after: written)
    }
}

/// Counts of what the agent listener's connections did, for tests and operators.
final class ConnectionCounters: Sendable {
    /// Frames that arrived while an earlier frame of their connection was still being handled,
    /// and so waited in its queue.
    let framesQueuedBehindAStep = Atomic<Int>(0)
    /// Tasks started to handle a connection's queued frames, and those ended: equal when no
    /// connection's task runs (a test waits for that before it sends a frame that should find
    /// its connection idle).
    let runsStarted = Atomic<Int>(0)
    let runsEnded = Atomic<Int>(0)
}

/// The last handler of an agent connection's pipeline: hands decoded frames to its
/// ``ConnectionDriver`` and holds reads while the driver is behind.
final class ConnectionDriverHandler: ChannelDuplexHandler {
    typealias InboundIn = WireFrame
    typealias OutboundIn = WireFrame
    typealias OutboundOut = WireFrame

    private let driver: ConnectionDriver
    private let logger: Logger
    /// The decoder refused the stream: what it reports after that (data received in its error
    /// state) is not news, and the driver closes once the refusal is answered.
    private var refused = false

    init(driver: ConnectionDriver, logger: Logger) {
        self.driver = driver
        self.logger = logger
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        driver.receive(.frame(unwrapInboundIn(data)))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if refused { return }
        if let error = error as? WireProtocolError {
            refused = true
            driver.receive(.refused(error))
        } else {
            logger.debug("agent connection ended", metadata: ["error": "\(error)", "remote": "\(driver.session.remote ?? "?")"])
            context.close(promise: nil)
        }
    }

    func read(context: ChannelHandlerContext) {
        if driver.shouldRead() { context.read() }
    }

    /// Every frame the server sends passes here: its errors are counted (`GET /metrics`).
    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .error(let error)? = unwrapOutboundIn(data).body {
            driver.session.services.metrics.errorSent(error.code, aboutUpload: !error.uploadID.isEmpty)
        }
        context.write(data, promise: promise)
    }
}

extension Channel {
    /// Closes once `written` is done (at once if nil), or after a few seconds if the peer does
    /// not read and the write never completes.
    func close(after written: EventLoopFuture<Void>?) {
        guard let written else { return close(promise: nil) }
        let fallback = eventLoop.scheduleTask(in: .seconds(5)) { self.close(promise: nil) }
        written.whenComplete { _ in
            fallback.cancel()
            self.close(promise: nil)
        }
    }

    /// Writes `frames` in order and flushes; the future of the last write, nil when there are
    /// none. Safe from any thread: writes made one after another keep their order.
    func writeAndFlush(frames: [WireFrame]) -> EventLoopFuture<Void>? {
        guard let last = frames.last else { return nil }
        for frame in frames.dropLast() { write(frame, promise: nil) }
        return writeAndFlush(last)
    }
}
