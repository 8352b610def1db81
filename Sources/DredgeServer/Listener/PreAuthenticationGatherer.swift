import DredgeWire
import NIOCore

/// Before the agent is authenticated, gathers each frame's bytes in a buffer made for the size
/// its length prefix announces, and passes only whole frames on to the frame decoder; once the
/// connection's ``FrameSizeLimit`` is raised (authentication) it passes everything through.
///
/// It sits between TLS and the frame decoder, and exists for memory, with the
/// ``PreAuthenticationRecordPacer`` before TLS: a connection nobody has vouched for may hold a
/// partial frame of up to ``WireLimits/maxPreAuthFrameBytes``, and without it that partial frame
/// is held in the TLS handler's own 32 KiB read buffer (kept by the decoder, which makes the TLS
/// handler allocate another) or in a cumulation buffer grown by doubling. Here it costs its own
/// size and no more: NIO rounds the buffer's capacity up to a power of two, and the agent
/// connections' allocator (``ConnectionBuffers``) keeps the pages never written out of memory.
///
/// It decides nothing: a length prefix of zero or over the limit is passed on at once with all
/// that follows, for the decoder to refuse as before, and bytes it holds when the connection
/// closes are passed on first, so the decoder sees a frame cut short.
final class PreAuthenticationGatherer: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let limit: FrameSizeLimit
    private let preAuthenticationBytes: Int
    /// The bytes of a frame not yet whole: its length prefix (or the first bytes of one), then
    /// its body so far, in a buffer made for `4 + length` bytes once the length is known.
    private var held: ByteBuffer?
    /// Authenticated, or a refused length was passed on: everything passes from now on.
    private var passing = false

    init(limit: FrameSizeLimit, preAuthenticationBytes: Int = WireLimits.maxPreAuthFrameBytes) {
        self.limit = limit
        self.preAuthenticationBytes = preAuthenticationBytes
    }

    /// What it holds: the capacity of the buffer of a frame not yet whole (tests).
    var heldCapacity: Int? { held?.capacity }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var input = unwrapInboundIn(data)
        if !passing && limit.bytes > preAuthenticationBytes { passing = true }
        if passing {
            releaseHeld(context: context)
            context.fireChannelRead(data)
            return
        }
        while input.readableBytes > 0 {
            // A whole frame: passed on as it lies (the decoder keeps nothing of it).
            if held == nil, let length = input.getInteger(at: input.readerIndex, as: UInt32.self), length > 0, Int(length) <= limit.bytes,
                let frame = input.readSlice(length: 4 + Int(length))
            {
                context.fireChannelRead(wrapInboundOut(frame))
                continue
            }
            // Part of one: copied out, so that TLS's buffer stays its own. Keeping it instead
            // (as the decoder would) makes TLS copy it on its next write: 16 KB more measured.
            var frame = held ?? context.channel.allocator.buffer(capacity: 4)
            held = nil
            if frame.readableBytes < 4 {
                guard let prefix = input.readSlice(length: min(4 - frame.readableBytes, input.readableBytes)) else { return }
                frame.writeImmutableBuffer(prefix)
                guard let length = frame.getInteger(at: frame.readerIndex, as: UInt32.self) else {
                    held = frame  // the prefix is not all here yet
                    return
                }
                guard length > 0, Int(length) <= limit.bytes else {
                    // Refused by the decoder, which says why.
                    passing = true
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

    func channelInactive(context: ChannelHandlerContext) {
        releaseHeld(context: context)
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        held = nil
    }

    /// Passes on what it holds, as it is.
    private func releaseHeld(context: ChannelHandlerContext) {
        guard let frame = held else { return }
        held = nil
        context.fireChannelRead(wrapInboundOut(frame))
    }
}
