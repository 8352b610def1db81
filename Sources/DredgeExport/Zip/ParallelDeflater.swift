import CDredgeZlib
import Foundation
import Synchronization

/// Raw deflate of a byte stream on several cores, producing one standard deflate stream.
///
/// The input is cut into blocks; each block is compressed on its own worker with the last
/// 32 KiB of the previous block's input as its dictionary and ends with a sync flush (the last
/// with a final block), so the concatenated outputs are one valid stream — the pigz technique.
/// Outputs are handed to `sink` in order. At most `4 × workers` blocks are in flight, so memory
/// is bounded by the block size, not by the input.
///
/// One caller writes and finishes; only each block's ``Slot`` crosses to its worker.
final class ParallelDeflater {
    struct Summary {
        var crc32: UInt32
        var compressedSize: UInt64
        var uncompressedSize: UInt64
    }

    private let level: Int32
    private let blockSize: Int
    private let maxInFlight: Int
    private let sink: ([UInt8]) throws -> Void
    private var current: [UInt8] = []
    private var previousTail: [UInt8] = []
    private var nextIndex = 0
    private var nextToWrite = 0
    /// Blocks handed to workers and not yet written, by index.
    private var pending: [Int: Slot] = [:]
    private var summary = Summary(crc32: 0, compressedSize: 0, uncompressedSize: 0)

    static let dictionaryBytes = 32 * 1024

    init(level: Int32, blockSize: Int = 512 * 1024, workers: Int, sink: @escaping ([UInt8]) throws -> Void) {
        self.level = level
        self.blockSize = blockSize
        self.maxInFlight = max(1, workers) * 4
        self.sink = sink
        current.reserveCapacity(blockSize)
    }

    func write(_ bytes: UnsafeRawBufferPointer) throws {
        var offset = 0
        while offset < bytes.count {
            let n = min(blockSize - current.count, bytes.count - offset)
            current.append(contentsOf: bytes[offset..<offset + n])
            offset += n
            if current.count == blockSize { try submit(last: false) }
        }
    }

    func write(_ bytes: [UInt8]) throws { try bytes.withUnsafeBytes { try write($0) } }

    /// Compresses what is left, writes every block, and returns the stream's CRC-32 and sizes.
    func finish() throws -> Summary {
        try submit(last: true)
        while nextToWrite < nextIndex { try writeNext() }
        return summary
    }

    private func submit(last: Bool) throws {
        while nextIndex - nextToWrite >= maxInFlight { try writeNext() }
        let input = current
        let dictionary = previousTail
        previousTail = Array(input.suffix(Self.dictionaryBytes))
        if previousTail.count < Self.dictionaryBytes && !dictionary.isEmpty {
            previousTail = Array((dictionary + input).suffix(Self.dictionaryBytes))
        }
        current = []
        current.reserveCapacity(blockSize)
        let index = nextIndex
        nextIndex += 1
        let slot = Slot()
        pending[index] = slot
        let level = self.level
        DispatchQueue.global().async {
            slot.fill(Result { (try Self.compress(input, dictionary: dictionary, level: level, last: last), Self.crc(input), input.count) })
        }
    }

    private func writeNext() throws {
        let slot = pending.removeValue(forKey: nextToWrite)!
        nextToWrite += 1
        let block = try slot.take().get()
        summary.crc32 = nextToWrite == 1 ? block.crc : UInt32(crc32_combine(uLong(summary.crc32), uLong(block.crc), off_t(block.length)))
        summary.uncompressedSize += UInt64(block.length)
        summary.compressedSize += UInt64(block.bytes.count)
        try sink(block.bytes)
    }

    /// One block's result, filled by its worker and taken by the writer.
    private final class Slot: Sendable {
        typealias Block = Result<(bytes: [UInt8], crc: UInt32, length: Int), any Error>
        private let done = DispatchSemaphore(value: 0)
        private let result = Mutex<Block?>(nil)

        func fill(_ block: Block) {
            result.withLock { $0 = block }
            done.signal()
        }

        /// Waits for the worker.
        func take() -> Block {
            done.wait()
            return result.withLock { $0.take()! }
        }
    }

    static func crc(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBufferPointer { UInt32(crc32(0, $0.baseAddress, uInt($0.count))) }
    }

    /// One block: raw deflate (no zlib header), primed with `dictionary`, ending in a sync flush
    /// or, for the last block, the final block.
    static func compress(_ input: [UInt8], dictionary: [UInt8], level: Int32, last: Bool) throws -> [UInt8] {
        var stream = z_stream()
        guard deflateInit2_(&stream, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
            throw ZipError("deflateInit2 failed")
        }
        defer { deflateEnd(&stream) }
        if !dictionary.isEmpty {
            let rc = dictionary.withUnsafeBufferPointer { deflateSetDictionary(&stream, $0.baseAddress, uInt($0.count)) }
            guard rc == Z_OK else { throw ZipError("deflateSetDictionary failed") }
        }
        var output = [UInt8](repeating: 0, count: Int(deflateBound(&stream, uLong(input.count))) + 64)
        var input = input
        let rc: Int32 = input.withUnsafeMutableBufferPointer { inBuf in
            output.withUnsafeMutableBufferPointer { outBuf in
                stream.next_in = inBuf.baseAddress
                stream.avail_in = uInt(inBuf.count)
                stream.next_out = outBuf.baseAddress
                stream.avail_out = uInt(outBuf.count)
                return deflate(&stream, last ? Z_FINISH : Z_SYNC_FLUSH)
            }
        }
        guard (last && rc == Z_STREAM_END) || (!last && rc == Z_OK), stream.avail_in == 0 else {
            throw ZipError("deflate failed (\(rc))")
        }
        output.removeLast(Int(stream.avail_out))
        return output
    }
}

/// A failure writing or reading a zip container.
struct ZipError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
