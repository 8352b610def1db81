import NIOCore
import SwiftProtobuf

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
