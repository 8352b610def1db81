import DredgeWire
import NIOCore

/// Before the agent is authenticated, passes only whole frames on to the frame decoder, and
/// gathers a frame that is not whole yet where it costs least; once the connection's
/// ``FrameSizeLimit`` is raised (authentication) it passes everything through.
///
/// It sits between TLS and the frame decoder, and exists for memory, with the
/// ``PreAuthenticationRecordPacer`` before TLS: a connection nobody has vouched for may hold a
/// partial frame of up to ``WireLimits/maxPreAuthFrameBytes``. The decoder would keep it in
/// the TLS handler's own 32 KiB read buffer, and the TLS handler's next write would then copy
/// that whole buffer (a `ByteBuffer` copied on write copies its capacity); or it would grow a
/// buffer of its own by doubling. Here:
///
/// - a whole frame is passed on as it lies (the decoder keeps nothing of it);
/// - the start of a frame with room after it in TLS's buffer stays there until TLS is about to
///   write again (the pacer's ``PreAuthenticationRecordPacer/RecordComing``), and is then copied
///   out to a buffer made for the frame, so TLS's buffer is its own again; a client that never
///   sends the next record costs no copy;
/// - otherwise the frame is gathered in a buffer made for it.
///
/// NIO rounds a buffer's capacity up to a power of two; the agent connections' allocator
/// (``ConnectionBuffers``) keeps the pages never written out of memory. And once it is done
/// with bytes TLS handed it (passed on whole, copied out), it gives their pages of TLS's
/// buffer back to the system (``ConnectionBuffers/discardPages(of:)``): TLS resets its buffer
/// before it passes the bytes on and reads nothing there again, so what an unauthenticated
/// client sent earlier does not stay resident beside what it holds now.
///
/// It decides nothing: a length prefix of zero or over the limit is passed on at once with all
/// that follows, for the decoder to refuse as before, and bytes it holds when the connection
/// closes are passed on first, so the decoder sees a frame cut short.
final class PreAuthenticationGatherer: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private var phase: PreAuthenticationPhase
    /// The bytes of a frame not yet whole: its length prefix (or the first bytes of one), then
    /// its body so far, in a buffer made for `4 + length` bytes once the length is known.
    private var held: ByteBuffer?

    init(limit: FrameSizeLimit, preAuthenticationBytes: Int = WireLimits.maxPreAuthFrameBytes) {
        phase = PreAuthenticationPhase(limit: limit, preAuthenticationBytes: preAuthenticationBytes)
    }

    /// Whether `held` lies in TLS's read buffer.
    private var heldInPlace = false

    /// What it holds: the capacity of the buffer of a frame not yet whole (tests).
    var heldCapacity: Int? { held?.capacity }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var input = unwrapInboundIn(data)
        guard case .before = phase.check() else {
            releaseHeld(context: context)
            return context.fireChannelRead(data)
        }
        // The bytes as they came, given back once done with: up to a frame kept in place, and
        // none if passed on for the decoder to refuse.
        let entry = input
        var doneUpTo: Int? = entry.writerIndex
        defer {
            if let end = doneUpTo, end > entry.readerIndex {
                entry.withUnsafeReadableBytes { ConnectionBuffers.discardPages(of: UnsafeRawBufferPointer(rebasing: $0[..<(end - entry.readerIndex)])) }
            }
        }
        while input.readableBytes > 0 {
            if held == nil, let length = input.getInteger(at: input.readerIndex, as: UInt32.self), length > 0, Int(length) <= phase.frameLimit {
                let whole = 4 + Int(length)
                // A whole frame: passed on as it lies. Its pages are given back when this read
                // is done, so nothing after this handler may keep these bytes past its
                // channelRead (the frame decoder copies a frame's body out to parse it:
                // FrameDecoder.parse).
                if let frame = input.readSlice(length: whole) {
                    context.fireChannelRead(wrapInboundOut(frame))
                    continue
                }
                // The start of one with room after it: left where it lies for now.
                if input.writerIndex + whole - input.readableBytes <= input.capacity {
                    held = input
                    heldInPlace = true
                    doneUpTo = input.readerIndex
                    return
                }
            }
            copyOutHeld(context: context)
            var frame = held ?? context.channel.allocator.buffer(capacity: 4)
            held = nil
            if frame.readableBytes < 4 {
                guard let prefix = input.readSlice(length: min(4 - frame.readableBytes, input.readableBytes)) else { return }
                frame.writeImmutableBuffer(prefix)
                guard let length = frame.getInteger(at: frame.readerIndex, as: UInt32.self) else {
                    held = frame  // the prefix is not all here yet
                    return
                }
                guard length > 0, Int(length) <= phase.frameLimit else {
                    // Refused by the decoder, which says why.
                    phase.stepAside()
                    doneUpTo = nil
                    context.fireChannelRead(wrapInboundOut(frame))
                    if input.readableBytes > 0 { context.fireChannelRead(wrapInboundOut(input)) }
                    return
                }
                var sized = context.channel.allocator.buffer(capacity: 4 + Int(length))
                sized.writeBuffer(&frame)
                frame = sized
            }
            let length = Int(frame.getInteger(at: frame.readerIndex, as: UInt32.self) ?? 0)
            let missing = 4 + length - frame.readableBytes
            if let body = input.readSlice(length: min(missing, input.readableBytes)) { frame.writeImmutableBuffer(body) }
            if frame.readableBytes == 4 + length {
                context.fireChannelRead(wrapInboundOut(frame))
            } else {
                held = frame
            }
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is PreAuthenticationRecordPacer.RecordComing { return copyOutHeld(context: context) }
        // The peer closed its side (with half-closure allowed): a frame cut short reaches the decoder.
        if case ChannelEvent.inputClosed = event { releaseHeld(context: context) }
        context.fireUserInboundEventTriggered(event)
    }

    /// A frame left in TLS's buffer, copied out to a buffer made for it.
    private func copyOutHeld(context: ChannelHandlerContext) {
        guard heldInPlace, let frame = held, let length = frame.getInteger(at: frame.readerIndex, as: UInt32.self) else { return }
        var copy = context.channel.allocator.buffer(capacity: 4 + Int(length))
        copy.writeImmutableBuffer(frame)
        held = copy
        heldInPlace = false
        frame.withUnsafeReadableBytes { ConnectionBuffers.discardPages(of: $0) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        releaseHeld(context: context)
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        held = nil
        heldInPlace = false
    }

    /// Passes on what it holds, as it is.
    private func releaseHeld(context: ChannelHandlerContext) {
        guard let frame = held else { return }
        held = nil
        heldInPlace = false
        context.fireChannelRead(wrapInboundOut(frame))
    }
}
