import CDredgeZlib
import Foundation

/// Inflates one deflated entry with zlib and drops the output, to learn whether its stream
/// ends within its compressed size (``PayloadExtractor/checkDeflateStreams(zipPath:limits:)``).
enum DeflateCheck {
    /// `read(n)` gives the entry's next bytes (at most `n`; fewer at the end of the file).
    /// Throws `.payloadInvalid` for a stream that is damaged, does not end within its size,
    /// inflates past `maxRatio` times its size (once past 1 MiB), or takes `total` (what the
    /// entries before it inflated) past `maxTotal`.
    static func run(_ name: String, compressedSize: Int64, maxRatio: Int64, total: inout Int64, maxTotal: Int64, read: (Int) throws -> Data) throws {
        func invalid(_ message: String) -> ExportError { ExportError(.payloadInvalid, "\(name.debugDescription) \(message)") }
        var stream = z_stream()
        guard inflateInit2_(&stream, -15, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else { throw ExportError(.io, "zlib cannot start inflating") }
        defer { inflateEnd(&stream) }
        let ratio = compressedSize.multipliedReportingOverflow(by: maxRatio)
        let maxInflated = max(ratio.overflow ? Int64.max : ratio.partialValue, 1 << 20)
        var output = [UInt8](repeating: 0, count: 64 << 10)
        var consumed: Int64 = 0, inflated: Int64 = 0
        while consumed < compressedSize {
            var input = [UInt8](try read(Int(min(256 << 10, compressedSize - consumed))))
            guard !input.isEmpty else { throw invalid("is cut short by the end of the zip") }
            let (status, taken) = try input.withUnsafeMutableBytes { raw -> (Int32, Int) in
                stream.next_in = raw.baseAddress!.assumingMemoryBound(to: Bytef.self)
                stream.avail_in = uInt(raw.count)
                var status = Z_OK
                repeat {
                    status = output.withUnsafeMutableBytes { out in
                        stream.next_out = out.baseAddress!.assumingMemoryBound(to: Bytef.self)
                        stream.avail_out = uInt(out.count)
                        return inflate(&stream, Z_NO_FLUSH)
                    }
                    let produced = Int64(output.count - Int(stream.avail_out))
                    inflated += produced
                    total += produced
                    if total > maxTotal { throw ExportError(.payloadInvalid, "payload inflates past \(maxTotal) bytes") }
                    guard status == Z_OK || status == Z_STREAM_END || status == Z_BUF_ERROR else { throw invalid("is damaged: inflate says \(status)") }
                    if inflated > maxInflated { throw invalid("inflates more than \(maxRatio)× its compressed size") }
                } while status == Z_OK && (stream.avail_in > 0 || stream.avail_out == 0)
                return (status, raw.count - Int(stream.avail_in))
            }
            consumed += Int64(taken)
            // Bytes after the end, within the size, are skipped (as the stream reader skips them).
            if status == Z_STREAM_END { return }
        }
        throw invalid("is damaged: its deflate stream does not end within its compressed size")
    }
}
