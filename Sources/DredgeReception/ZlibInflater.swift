import CDredgeZlib
import DredgePayload
import Foundation

/// What one call to an inflater took and whether its stream ended.
struct InflateStep {
    var taken: Int
    var ended: Bool
}

/// zlib's streaming inflate of a raw deflate stream, kept from stream to stream
/// (``reset()``). The streaming reader's entries with a data descriptor and the whole-zip
/// reader's stream check (``DeflateCheck``) inflate through it; ``IgzipInflater`` has the same
/// shape.
final class ZlibInflater {
    private var stream = z_stream()

    /// Ready for a first stream; throws `.io` when zlib cannot start.
    init() throws {
        guard inflateInit2_(&stream, -15, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
            throw ExportError(.io, "zlib cannot start inflating")
        }
    }

    deinit { inflateEnd(&stream) }

    /// Starts a new stream.
    func reset() { inflateReset(&stream) }

    /// Inflates `count` bytes at `start` through `output`, passing each piece produced to
    /// `write` with the input bytes taken so far in this call. Stops when the stream ends or
    /// makes no more progress on this input (it wants more). A damaged stream throws
    /// `damaged(status)`.
    func inflate(
        _ start: UnsafeMutablePointer<UInt8>, count: Int, into output: inout [UInt8],
        write: (UnsafeRawBufferPointer, Int) throws -> Void, damaged: (Int32) -> any Error
    ) throws -> InflateStep {
        stream.next_in = start
        stream.avail_in = uInt(count)
        while true {
            let before = stream.avail_in
            let (status, produced) = output.withUnsafeMutableBytes { out -> (Int32, Int) in
                stream.next_out = out.baseAddress!.assumingMemoryBound(to: Bytef.self)
                stream.avail_out = uInt(out.count)
                let status = CDredgeZlib.inflate(&stream, Z_NO_FLUSH)
                return (status, out.count - Int(stream.avail_out))
            }
            guard status == Z_OK || status == Z_STREAM_END || (status == Z_BUF_ERROR && produced == 0) else { throw damaged(status) }
            if produced > 0 {
                try output.withUnsafeBytes { try write(UnsafeRawBufferPointer(rebasing: $0[0..<produced]), count - Int(stream.avail_in)) }
            }
            if status == Z_STREAM_END { return InflateStep(taken: count - Int(stream.avail_in), ended: true) }
            if status == Z_BUF_ERROR || (stream.avail_in == 0 && stream.avail_out > 0) { break }
            if produced == 0 && stream.avail_in == before { break }  // no progress: wait for more input
        }
        return InflateStep(taken: count - Int(stream.avail_in), ended: false)
    }
}
