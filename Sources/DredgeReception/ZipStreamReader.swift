import CDredgeZlib
import DredgePayload
import Foundation

#if canImport(CDredgeISAL)
import CDredgeISAL
#endif

/// Reads a zip front to back as its bytes arrive, inflating each entry into a
/// ``PayloadStaging`` (so the payload rules apply as it goes), then checks that the central
/// directory and its end record describe exactly the entries read: the same names, CRCs,
/// sizes, offsets and methods, regular files only, nothing after the end record.
///
/// It reads what README § Payload allows: stored or deflated entries, sizes in the local
/// header or in a data descriptor after a deflated entry, no encryption, no ZIP64. What it
/// cannot read front to back (a stored entry with a data descriptor, bytes between entries,
/// ZIP64 records) is ``Unreadable``: the caller then unpacks the finished zip with
/// ``PayloadExtractor``, which is the judge of anything unusual.
///
/// A deflated entry whose sizes are in its local header (every zip the agent writes) is
/// inflated by ISA-L's igzip where the package is built with it (the `Server` trait), zlib
/// otherwise; an entry with a data descriptor always by zlib, which says exactly where its
/// stream ends. Both are held to the same rules.
final class ZipStreamReader {
    /// The zip is laid out in a way this reader does not follow front to back.
    struct Unreadable: Error, CustomStringConvertible {
        var description: String
    }

    private struct Local {
        var nameBytes: [UInt8]
        var flags: UInt16
        var method: UInt16
        var crc: UInt32
        var compressedSize: UInt32
        var uncompressedSize: UInt32
        var offset: UInt64
        var hasDescriptor: Bool { flags & 0x0008 != 0 }
    }

    private enum State {
        case header
        case data
        /// Bytes after a deflate stream's end, up to its entry's declared compressed size.
        case slack
        case descriptor
        case central
        case end
        case done
    }

    private let staged: PayloadStaging
    private var state = State.header
    private var input: [UInt8] = []
    private var position = 0
    /// Offset in the zip of `input[position]`.
    private var offset: UInt64 = 0
    private var entries: [Local] = []
    private var current: Local?
    private var consumed: Int64 = 0
    private var inflated: Int64 = 0
    private var crc: UInt32 = 0
    private var zlib: ZlibInflater?
    #if canImport(CDredgeISAL)
    private var igzip: IgzipInflater?
    /// The current entry is inflated by ``igzip``.
    private var usingIgzip = false
    #endif
    private var output: [UInt8] = []
    private var centralRead = 0
    private var centralStart: UInt64 = 0

    init(staging: PayloadStaging) {
        staged = staging
    }

    deinit {
        release()
    }

    /// Frees the inflater and the buffers (after the last byte, or when giving up).
    func release() {
        zlib = nil
        #if canImport(CDredgeISAL)
        igzip = nil
        #endif
        input = []
        output = []
    }

    var isDone: Bool { if case .done = state { true } else { false } }

    /// Reads the next bytes of the zip. Throws ``Unreadable``, `.payloadInvalid` for a zip that
    /// breaks the rules, or `.io`/`.diskFull` for a staged file that cannot be written.
    func read(_ bytes: UnsafeRawBufferPointer) throws {
        input.append(contentsOf: bytes)
        while try step() {}
        // Every state consumes what it can; a reader holding megabytes it cannot use is
        // stuck on a layout it does not follow, and must not hold the upload in memory.
        if available > 2 << 20 { throw Unreadable(description: "no progress at offset \(offset)") }
        if position >= 1 << 20 || position == input.count {
            input.removeFirst(position)
            position = 0
        }
    }

    /// The zip has ended: everything it declared was read.
    func finish() throws {
        guard isDone else { throw Self.invalid("the zip ends before its end-of-central-directory record") }
    }

    private static func invalid(_ message: String) -> ExportError { ExportError(.payloadInvalid, message) }

    private var available: Int { input.count - position }

    private func u16(_ at: Int) -> UInt16 { UInt16(input[position + at]) | UInt16(input[position + at + 1]) << 8 }
    private func u32(_ at: Int) -> UInt32 { UInt32(u16(at)) | UInt32(u16(at + 2)) << 16 }

    private func advance(_ n: Int) {
        position += n
        offset += UInt64(n)
    }

    /// One step of the reader; false when it needs more bytes.
    private func step() throws -> Bool {
        switch state {
        case .header:
            guard available >= 4 else { return false }
            switch u32(0) {
            case 0x0403_4B50: return try localHeader()
            case 0x0201_4B50:
                centralStart = offset
                state = .central
                return true
            default: throw Unreadable(description: "no zip record at offset \(offset)")
            }
        case .data: return try entryData()
        case .slack: return try slack()
        case .descriptor: return try descriptor()
        case .central: return try centralHeader()
        case .end: return try endRecord()
        case .done:
            if available > 0 { throw Self.invalid("bytes after the end of the zip") }
            return false
        }
    }

    private func localHeader() throws -> Bool {
        guard available >= 30 else { return false }
        let nameLength = Int(u16(26)), extraLength = Int(u16(28))
        guard available >= 30 + nameLength + extraLength else { return false }
        let local = Local(
            nameBytes: Array(input[(position + 30)..<(position + 30 + nameLength)]), flags: u16(6), method: u16(8), crc: u32(14),
            compressedSize: u32(18), uncompressedSize: u32(22), offset: offset)
        guard local.flags & 0x0001 == 0 else { throw Self.invalid("entry \(name(local).debugDescription) is encrypted") }
        guard local.method == 0 || local.method == 8 else { throw Self.invalid("entry \(name(local).debugDescription) uses compression method \(local.method)") }
        if local.compressedSize == 0xFFFF_FFFF || local.uncompressedSize == 0xFFFF_FFFF { throw Unreadable(description: "ZIP64 sizes") }
        if local.method == 0 && local.hasDescriptor { throw Unreadable(description: "a stored entry with a data descriptor") }
        if local.method == 8 && !local.hasDescriptor && local.compressedSize == 0 {
            throw Self.invalid("entry \(name(local).debugDescription) is deflated into no bytes")
        }
        advance(30 + nameLength + extraLength)
        try staged.begin(name(local), isRegularFile: true, compressedSize: local.hasDescriptor ? nil : Int64(local.compressedSize))
        current = local
        consumed = 0
        inflated = 0
        crc = UInt32(crc32(0, nil, 0))
        #if canImport(CDredgeISAL)
        usingIgzip = false
        #endif
        if local.method == 8 {
            if output.isEmpty { output = [UInt8](repeating: 0, count: 256 << 10) }
            #if canImport(CDredgeISAL)
            usingIgzip = !local.hasDescriptor
            if usingIgzip {
                let inflater = igzip ?? IgzipInflater()
                inflater.reset()
                igzip = inflater
            } else {
                try startZlib()
            }
            #else
            try startZlib()
            #endif
        }
        state = .data
        return true
    }

    /// zlib ready for a new raw deflate stream (kept from entry to entry).
    private func startZlib() throws {
        if let zlib { return zlib.reset() }
        zlib = try ZlibInflater()
    }

    private func name(_ local: Local) -> String { String(decoding: local.nameBytes, as: UTF8.self) }

    private func entryData() throws -> Bool {
        guard let local = current else { return false }
        if local.method == 0 {
            let remaining = Int64(local.compressedSize) - consumed
            let n = Int(min(Int64(available), remaining))
            if n > 0 {
                try input.withUnsafeBytes { raw in
                    let slice = UnsafeRawBufferPointer(rebasing: raw[position..<(position + n)])
                    crc = UInt32(crc32(UInt(crc), slice.baseAddress?.assumingMemoryBound(to: Bytef.self), uInt(n)))
                    consumed += Int64(n)
                    inflated += Int64(n)
                    try staged.write(slice, compressedSoFar: consumed)
                }
                advance(n)
            }
            guard consumed == Int64(local.compressedSize) else { return false }
            return try endEntry(declaredCRC: local.crc)
        }
        #if canImport(CDredgeISAL)
        if usingIgzip, let igzip { return try igzipData(local, igzip) }
        #endif
        // Deflated: the stream ends itself; the declared size, when there is one, bounds it.
        let limit = local.hasDescriptor ? Int64(available) : min(Int64(available), Int64(local.compressedSize) - consumed)
        guard limit > 0, let zlib else { return false }
        let step = try input.withUnsafeMutableBytes { raw in
            try zlib.inflate(
                raw.baseAddress!.advanced(by: position).assumingMemoryBound(to: UInt8.self), count: Int(limit), into: &output,
                write: { produced, taken in
                    inflated += Int64(produced.count)
                    crc = UInt32(crc32(UInt(crc), produced.baseAddress?.assumingMemoryBound(to: Bytef.self), uInt(produced.count)))
                    try staged.write(produced, compressedSoFar: consumed + Int64(taken))
                },
                damaged: { Self.invalid("\(name(local)) is damaged: inflate says \($0)") })
        }
        let (used, ended) = (step.taken, step.ended)
        consumed += Int64(used)
        advance(used)
        guard ended else {
            if !local.hasDescriptor && consumed == Int64(local.compressedSize) {
                throw Self.invalid("\(name(local)) is damaged: its deflate stream does not end within its compressed size")
            }
            return used > 0
        }
        if local.hasDescriptor {
            state = .descriptor
            return true
        }
        return try streamEnded(local)
    }

    /// A deflated entry with declared sizes whose stream has ended: what is left of its declared
    /// compressed bytes is skipped, as unzip tools skip it (igzip, which reads ahead, cannot say
    /// to the byte where a stream ended; the whole-zip reader skips them too).
    private func streamEnded(_ local: Local) throws -> Bool {
        guard consumed < Int64(local.compressedSize) else { return try endEntry(declaredCRC: local.crc) }
        state = .slack
        return true
    }

    private func slack() throws -> Bool {
        guard let local = current else { return false }
        let n = Int(min(Int64(available), Int64(local.compressedSize) - consumed))
        consumed += Int64(n)
        advance(n)
        guard consumed == Int64(local.compressedSize) else { return false }
        return try endEntry(declaredCRC: local.crc)
    }

    #if canImport(CDredgeISAL)
    /// A deflated entry with declared sizes, through igzip: fed at most its declared compressed
    /// bytes, so its stream must end within them. The CRC-32 is igzip's own, of the bytes it
    /// produced.
    private func igzipData(_ local: Local, _ igzip: IgzipInflater) throws -> Bool {
        let limit = min(Int64(available), Int64(local.compressedSize) - consumed)
        guard limit > 0 else { return false }
        var result = InflateStep(taken: 0, ended: false)
        try input.withUnsafeMutableBytes { raw in
            let start = raw.baseAddress!.advanced(by: position).assumingMemoryBound(to: UInt8.self)
            result = try igzip.inflate(start, count: Int(limit), into: &output) { produced, taken in
                inflated += Int64(produced.count)
                try staged.write(produced, compressedSoFar: consumed + Int64(taken))
            } damaged: { status in
                Self.invalid("\(name(local)) is damaged: inflate says \(status)")
            }
        }
        consumed += Int64(result.taken)
        advance(result.taken)
        guard result.ended else {
            if consumed == Int64(local.compressedSize) {
                throw Self.invalid("\(name(local)) is damaged: its deflate stream does not end within its compressed size")
            }
            return result.taken > 0
        }
        crc = igzip.crc
        return try streamEnded(local)
    }
    #endif

    private func descriptor() throws -> Bool {
        guard available >= 4 else { return false }
        let signed = u32(0) == 0x0807_4B50
        let length = signed ? 16 : 12
        guard available >= length else { return false }
        let base = signed ? 4 : 0
        let (declaredCRC, compressed, uncompressed) = (u32(base), u32(base + 4), u32(base + 8))
        guard var local = current else { return false }
        guard Int64(compressed) == consumed, Int64(uncompressed) == inflated else {
            throw Self.invalid("\(name(local)): its data descriptor's sizes differ from its data")
        }
        advance(length)
        local.crc = declaredCRC
        local.compressedSize = compressed
        local.uncompressedSize = uncompressed
        current = local
        return try endEntry(declaredCRC: declaredCRC)
    }

    private func endEntry(declaredCRC: UInt32) throws -> Bool {
        guard var local = current else { return false }
        guard local.hasDescriptor || Int64(local.uncompressedSize) == inflated else {
            throw Self.invalid("\(name(local)): \(inflated) bytes inflated, \(local.uncompressedSize) declared")
        }
        try staged.end(crc: crc, declaredCRC: declaredCRC)
        local.crc = declaredCRC
        entries.append(local)
        current = nil
        state = .header
        return true
    }

    private func centralHeader() throws -> Bool {
        guard available >= 4 else { return false }
        let signature = u32(0)
        if signature == 0x0605_4B50 {
            state = .end
            return true
        }
        if signature == 0x0606_4B50 || signature == 0x0706_4B50 { throw Unreadable(description: "ZIP64 end records") }
        guard signature == 0x0201_4B50 else { throw Self.invalid("damaged central directory at offset \(offset)") }
        guard available >= 46 else { return false }
        let nameLength = Int(u16(28)), extraLength = Int(u16(30)), commentLength = Int(u16(32))
        guard available >= 46 + nameLength + extraLength + commentLength else { return false }
        guard centralRead < entries.count else { throw Self.invalid("the central directory lists more entries than the zip holds") }
        let local = entries[centralRead]
        let nameBytes = Array(input[(position + 46)..<(position + 46 + nameLength)])
        // A comment is where a whole-zip reader may find an end record of its own: this reader
        // leaves such zips to it.
        guard commentLength == 0 else { throw Unreadable(description: "a comment in the central directory") }
        guard nameBytes == local.nameBytes, u16(8) == local.flags, u16(10) == local.method, u32(16) == local.crc, u32(20) == local.compressedSize,
            u32(24) == local.uncompressedSize, UInt64(u32(42)) == local.offset
        else {
            throw Self.invalid("the central directory's entry \(centralRead) (\(String(decoding: nameBytes, as: UTF8.self).debugDescription)) differs from the entry in the zip")
        }
        // The kind of file, read as unzip tools read it (and as PayloadExtractor does).
        let madeBy = u16(4) >> 8, attributes = u32(38)
        var isDirectory = nameBytes.last == UInt8(ascii: "/")
        var regular = !isDirectory
        switch madeBy {
        case 3, 19:  // UNIX, macOS
            switch Int32(UInt16(truncatingIfNeeded: attributes >> 16)) & Int32(S_IFMT) {
            case Int32(S_IFREG): regular = true
            case Int32(S_IFDIR), Int32(S_IFLNK): regular = false
            default: break
            }
        case 0:  // MS-DOS
            isDirectory = isDirectory || (attributes >> 4) == 0x01
            regular = !isDirectory
        default: break
        }
        guard regular else { throw Self.invalid("entry \(String(decoding: nameBytes, as: UTF8.self).debugDescription) is not a regular file") }
        centralRead += 1
        advance(46 + nameLength + extraLength + commentLength)
        return true
    }

    private func endRecord() throws -> Bool {
        guard available >= 22 else { return false }
        guard u16(20) == 0 else { throw Unreadable(description: "a zip comment") }
        let commentLength = 0
        guard u16(4) == 0, u16(6) == 0 else { throw Unreadable(description: "a zip split over disks") }
        let onDisk = Int(u16(8)), total = Int(u16(10)), size = UInt64(u32(12)), start = UInt64(u32(16))
        if onDisk == 0xFFFF || total == 0xFFFF || size == 0xFFFF_FFFF || start == 0xFFFF_FFFF { throw Unreadable(description: "ZIP64 end records") }
        guard onDisk == entries.count, total == entries.count, centralRead == entries.count, start == centralStart, size == offset - centralStart else {
            throw Self.invalid("the end of the central directory does not describe the entries read")
        }
        advance(22 + commentLength)
        state = .done
        return true
    }
}

#if canImport(CDredgeISAL)
/// ISA-L's streaming inflate of a raw deflate stream, with the CRC-32 of what it produced.
final class IgzipInflater {
    private let state: UnsafeMutablePointer<inflate_state>

    init() {
        state = .allocate(capacity: 1)
        state.initialize(to: inflate_state())
        isal_inflate_init(state)
        state.pointee.crc_flag = UInt32(ISAL_GZIP_NO_HDR)
    }

    deinit {
        state.deinitialize(count: 1)
        state.deallocate()
    }

    /// Starts a new stream (the CRC flag stays).
    func reset() { isal_inflate_reset(state) }

    /// The CRC-32 of everything produced since ``reset()`` (complete once the stream ended).
    var crc: UInt32 { state.pointee.crc }

    /// Inflates `count` bytes at `start` through `output`, passing each piece produced to
    /// `write` with the input bytes taken so far in this call. Stops when the input is used up
    /// (the stream wants more) or the stream ends. A damaged stream throws `damaged(status)`.
    /// igzip reads ahead and gives back at the end only part of what it read past the stream
    /// (up to about 6 bytes are not given back): `taken` may count a few bytes after the end.
    func inflate(
        _ start: UnsafeMutablePointer<UInt8>, count: Int, into output: inout [UInt8],
        write: (UnsafeRawBufferPointer, Int) throws -> Void, damaged: (Int32) -> any Error
    ) throws -> InflateStep {
        state.pointee.next_in = start
        state.pointee.avail_in = UInt32(count)
        while true {
            let before = state.pointee.avail_in
            let (status, produced) = output.withUnsafeMutableBytes { out -> (Int32, Int) in
                state.pointee.next_out = out.baseAddress!.assumingMemoryBound(to: UInt8.self)
                state.pointee.avail_out = UInt32(out.count)
                let status = isal_inflate(state)
                return (status, out.count - Int(state.pointee.avail_out))
            }
            guard status >= 0 else { throw damaged(status) }
            let ended = state.pointee.block_state == ISAL_BLOCK_FINISH
            if produced > 0 {
                let taken = ended ? count : count - Int(state.pointee.avail_in)
                try output.withUnsafeBytes { try write(UnsafeRawBufferPointer(rebasing: $0[0..<produced]), max(0, taken)) }
            }
            if ended { return InflateStep(taken: max(0, count - Int(state.pointee.avail_in)), ended: true) }
            // Not full: it took what it could and wants more input.
            if produced < output.count && (state.pointee.avail_in == 0 || state.pointee.avail_in == before) { break }
        }
        return InflateStep(taken: count - Int(state.pointee.avail_in), ended: false)
    }
}
#endif
