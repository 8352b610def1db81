import NIOCore
import SwiftProtobuf
import Synchronization

/// Splits the byte stream into frames (README § Framing): a 4-byte big-endian length, then that
/// many bytes of a serialized `Frame`.
///
/// A length of zero or over ``WireLimits/maxFrameBytes`` is rejected as soon as the 4 bytes of
/// the prefix arrive, before anything is buffered or allocated for the body. A body that does
/// not parse, or parses to a frame with no (known) body, is rejected too. All rejections are
/// ``WireProtocolError``s and fatal: framing cannot recover from them.
///
/// A server gives the decoder a ``FrameSizeLimit`` that starts at
/// ``WireLimits/maxPreAuthFrameBytes`` and is raised once the agent is authenticated, so a
/// connection nobody has vouched for cannot make it buffer 2 MiB.
public struct FrameDecoder: ByteToMessageDecoder {
    public typealias InboundOut = WireFrame
    let limit: FrameSizeLimit?

    /// - Parameter limit: the largest body accepted, if it may change during the connection;
    ///   ``WireLimits/maxFrameBytes`` when nil.
    public init(limit: FrameSizeLimit? = nil) { self.limit = limit }

    public mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let frame = try Self.decodeFrame(from: &buffer, maxBytes: limit?.bytes ?? WireLimits.maxFrameBytes) else { return .needMoreData }
        context.fireChannelRead(Self.wrapInboundOut(frame))
        return .continue
    }

    public mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        if seenEOF && buffer.readableBytes > 0 {
            throw WireProtocolError.malformed("connection closed inside a frame (\(buffer.readableBytes) bytes pending)")
        }
        return .needMoreData
    }

    /// Reads one frame if the buffer holds a whole one; nil if more bytes are needed. Leaves
    /// the buffer untouched when it returns nil or throws on the length prefix.
    public static func decodeFrame(from buffer: inout ByteBuffer, maxBytes: Int = WireLimits.maxFrameBytes) throws -> WireFrame? {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self) else { return nil }
        guard length > 0 else { throw WireProtocolError.malformed("empty frame") }
        guard length <= min(maxBytes, WireLimits.maxFrameBytes) else {
            // "HTTP" where a length goes: an HTTP server answered (an agent given the admin
            // API's address, say), which a person should be told in those words.
            if length == 0x4854_5450 {
                throw WireProtocolError(
                    .errorFrameTooLarge,
                    "the server answered in HTTP, not in Dredge's protocol: this address is an HTTP port, likely the admin API's (the console and `dredge login` use it); an agent connects to the agent port (7443 unless `dredge-server init --agent-port` chose another)")
            }
            throw WireProtocolError.frameTooLarge(Int(length), limit: min(maxBytes, WireLimits.maxFrameBytes))
        }
        guard buffer.readableBytes >= 4 + Int(length) else { return nil }
        buffer.moveReaderIndex(forwardBy: 4)
        let body = buffer.readSlice(length: Int(length))!
        return try parse(body)
    }

    static func parse(_ body: ByteBuffer) throws -> WireFrame {
        let frame: WireFrame
        do {
            // Copied out: the server gives the pages of a frame decoded before authentication
            // back to the system once decoded (PreAuthenticationGatherer), so nothing here may
            // keep a view of the buffer.
            frame = try WireFrame(serializedBytes: Array(body.readableBytesView), extensions: nil, partial: false, options: decodingOptions)
        } catch {
            throw WireProtocolError.malformed("frame body is not a Frame message: \(error)")
        }
        guard frame.body != nil else { throw WireProtocolError.malformed("frame has no known body") }
        return frame
    }

    static let decodingOptions: BinaryDecodingOptions = {
        var options = BinaryDecodingOptions()
        options.messageDepthLimit = 16
        options.discardUnknownFields = true
        return options
    }()
}

/// The largest frame body a connection's ``FrameDecoder`` accepts now; one per connection,
/// shared with whatever raises it (the server, once the agent is authenticated).
public final class FrameSizeLimit: Sendable {
    private let value: Atomic<Int>

    public init(_ bytes: Int) { value = Atomic(bytes) }

    public var bytes: Int { value.load(ordering: .relaxed) }

    public func set(_ bytes: Int) { value.store(bytes, ordering: .relaxed) }
}

/// Writes frames (README § Framing). Refuses to send a frame over the maximum rather than
/// produce one the peer must reject.
public struct FrameEncoder: MessageToByteEncoder {
    public typealias OutboundIn = WireFrame

    public init() {}

    public func encode(data: WireFrame, out: inout ByteBuffer) throws {
        let body: [UInt8] = try data.serializedBytes()
        guard !body.isEmpty else { throw WireProtocolError.malformed("refusing to send an empty frame") }
        guard body.count <= WireLimits.maxFrameBytes else { throw WireProtocolError.frameTooLarge(body.count) }
        out.reserveCapacity(out.writerIndex + 4 + body.count)
        out.writeInteger(UInt32(body.count))
        out.writeBytes(body)
    }

    /// The bytes of one frame on the wire, prefix included.
    public static func bytes(of frame: WireFrame) throws -> [UInt8] {
        var buffer = ByteBuffer()
        try FrameEncoder().encode(data: frame, out: &buffer)
        return Array(buffer.readableBytesView)
    }
}
