import DredgeWire
import NIOCore

/// Before the agent is authenticated, hands TLS the bytes it reads one whole TLS record at a
/// time, each followed by the end of a read; once the connection's ``FrameSizeLimit`` is raised
/// (authentication) it passes everything through and reads as NIO does by default.
///
/// It sits first in the pipeline, before TLS, and exists for memory, like the
/// ``PreAuthenticationGatherer`` after TLS: NIOSSL decrypts every record of a read into its
/// 32 KiB plaintext buffer and passes them on only when the read ends, and it doubles that
/// buffer (for the life of the connection) when more than one record's worth of plaintext has
/// gathered. A largest pre-authentication frame sent by an ordinary client (a full record and a
/// small one) did that on every connection. One record per read keeps the buffer at its size.
///
/// Before each record it sends a ``RecordComing`` event down the pipeline, ahead of the record:
/// TLS passes it on, and the ``PreAuthenticationGatherer`` takes what it keeps in TLS's buffer
/// out of it before TLS writes there again.
///
/// Until then the connection also reads at most ``readBytes`` at a time from its socket: NIO
/// keeps each channel's last read buffer for the next read, and its adaptive sizing would grow
/// it for such a frame and keep it for the life of the connection.
///
/// It decides nothing: a header that is not a TLS record's (a content type other than 20–24, a
/// version not 3.x: a plain-text request, say) or that announces more than TLS accepts is
/// passed on at once with all that follows, for TLS to refuse as it did without the pacer. A record cut short by the connection's end is dropped
/// (TLS would only have reported it cut short).
final class PreAuthenticationRecordPacer: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// A user inbound event: a TLS record is about to reach TLS, which will write its plaintext
    /// to its read buffer.
    struct RecordComing: Sendable {}

    /// A TLS record's header: content type, version, length (RFC 8446 § 5.1).
    static let headerBytes = 5
    /// The longest record body the server's TLS (BoringSSL) accepts: 2^14 bytes of plaintext
    /// and 320 of expansion (`SSL3_RT_MAX_ENCRYPTED_LENGTH`). A longer one is passed on for TLS
    /// to refuse.
    static let maxRecordBodyBytes = 16_384 + 256 + 64
    /// TLS content types: change_cipher_spec, alert, handshake, application_data, heartbeat.
    static let contentTypes: ClosedRange<UInt8> = 20...24
    /// The most read from the socket at once before authentication: NIO's first read size.
    static let readBytes = 2_048

    private var phase: PreAuthenticationPhase
    /// A record not yet whole: its header (or the first bytes of it), then its body so far, in a
    /// buffer made for the record's size once its length is known.
    private var held: ByteBuffer?

    init(limit: FrameSizeLimit, preAuthenticationBytes: Int = WireLimits.maxPreAuthFrameBytes) {
        phase = PreAuthenticationPhase(limit: limit, preAuthenticationBytes: preAuthenticationBytes)
    }

    /// The capacity of the buffer of a record not yet whole (tests).
    var heldCapacity: Int? { held?.capacity }

    func handlerAdded(context: ChannelHandlerContext) {
        setReads(FixedSizeRecvByteBufferAllocator(capacity: Self.readBytes), context: context)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch phase.check() {
        case .before: break
        case .endingNow:
            setReads(AdaptiveRecvByteBufferAllocator(), context: context)
            // TLS writes again now: the gatherer takes what it keeps in TLS's buffer out first.
            context.fireUserInboundEventTriggered(RecordComing())
            if let record = held {
                held = nil
                context.fireChannelRead(wrapInboundOut(record))
            }
            return context.fireChannelRead(data)
        case .over: return context.fireChannelRead(data)
        }
        var input = unwrapInboundIn(data)
        while input.readableBytes > 0 {
            var record = held ?? context.channel.allocator.buffer(capacity: Self.headerBytes)
            held = nil
            if record.readableBytes < Self.headerBytes {
                guard let header = input.readSlice(length: min(Self.headerBytes - record.readableBytes, input.readableBytes)) else { return }
                record.writeImmutableBuffer(header)
                guard let length = record.getInteger(at: record.readerIndex + 3, as: UInt16.self) else {
                    held = record  // the header is not all here yet
                    return
                }
                let type = record.getInteger(at: record.readerIndex, as: UInt8.self) ?? 0
                let major = record.getInteger(at: record.readerIndex + 1, as: UInt8.self) ?? 0
                guard Self.contentTypes.contains(type), major == 3, Int(length) <= Self.maxRecordBodyBytes else {
                    phase.stepAside()
                    context.fireChannelRead(wrapInboundOut(record))
                    if input.readableBytes > 0 { context.fireChannelRead(wrapInboundOut(input)) }
                    return
                }
                var sized = context.channel.allocator.buffer(capacity: Self.headerBytes + Int(length))
                sized.writeBuffer(&record)
                record = sized
            }
            let whole = Self.headerBytes + Int(record.getInteger(at: record.readerIndex + 3, as: UInt16.self) ?? 0)
            if let body = input.readSlice(length: min(whole - record.readableBytes, input.readableBytes)) { record.writeImmutableBuffer(body) }
            if record.readableBytes == whole {
                context.fireUserInboundEventTriggered(RecordComing())
                context.fireChannelRead(wrapInboundOut(record))
                context.fireChannelReadComplete()
            } else {
                held = record
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // Before authentication each whole record was followed by its own.
        if phase.isOver { context.fireChannelReadComplete() }
    }

    func channelInactive(context: ChannelHandlerContext) {
        held = nil
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        held = nil
    }

    /// How the channel sizes its socket reads. A channel that takes no such option (one in a
    /// test) reads as it did.
    private func setReads(_ allocator: some RecvByteBufferAllocator, context: ChannelHandlerContext) {
        do {
            try context.channel.syncOptions?.setOption(.recvAllocator, value: allocator)
        } catch {
            context.fireErrorCaught(error)
        }
    }
}
