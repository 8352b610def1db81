import DredgePayload
import Foundation

/// Inflates one deflated entry with zlib (``ZlibInflater``) and drops the output, to learn whether its stream
/// ends within its compressed size (``PayloadExtractor/checkDeflateStreams(zipPath:limits:)``).
enum DeflateCheck {
    /// `read(n)` gives the entry's next bytes (at most `n`; fewer at the end of the file).
    /// Throws `.payloadInvalid` for a stream that is damaged, does not end within its size,
    /// inflates past `maxRatio` times its size (once past 1 MiB), or takes `total` (what the
    /// entries before it inflated) past `maxTotal`.
    static func run(_ name: String, compressedSize: Int64, maxRatio: Int64, total: inout Int64, maxTotal: Int64, read: (Int) throws -> Data) throws {
        func invalid(_ message: String) -> ExportError { ExportError(.payloadInvalid, "\(name.debugDescription) \(message)") }
        let zlib = try ZlibInflater()
        let ratio = compressedSize.multipliedReportingOverflow(by: maxRatio)
        let maxInflated = max(ratio.overflow ? Int64.max : ratio.partialValue, 1 << 20)
        var output = [UInt8](repeating: 0, count: 64 << 10)
        var consumed: Int64 = 0, inflated: Int64 = 0
        while consumed < compressedSize {
            var input = [UInt8](try read(Int(min(256 << 10, compressedSize - consumed))))
            guard !input.isEmpty else { throw invalid("is cut short by the end of the zip") }
            let step = try input.withUnsafeMutableBytes { raw in
                try zlib.inflate(
                    raw.baseAddress!.assumingMemoryBound(to: UInt8.self), count: raw.count, into: &output,
                    write: { produced, _ in
                        inflated += Int64(produced.count)
                        total += Int64(produced.count)
                        if total > maxTotal { throw ExportError(.payloadInvalid, "payload inflates past \(maxTotal) bytes") }
                        if inflated > maxInflated { throw invalid("inflates more than \(maxRatio)× its compressed size") }
                    },
                    damaged: { invalid("is damaged: inflate says \($0)") })
            }
            consumed += Int64(step.taken)
            // Bytes after the end, within the size, are skipped (as the stream reader skips them).
            if step.ended { return }
        }
        throw invalid("is damaged: its deflate stream does not end within its compressed size")
    }
}
