import DredgeDomain

/// A small, allocation-frugal JSON serializer for metadata: the writer thread encodes every
/// record's metadata, and Foundation's encoders cost several times more per record.
///
/// Output is canonical: object keys sorted by their UTF-8 bytes, no whitespace, strings escaped
/// per RFC 8259 (control characters as `\u00XX`), non-finite doubles written as strings.
public struct JSONWriter {
    public private(set) var bytes: [UInt8] = []

    public init(reservingCapacity capacity: Int = 256) { bytes.reserveCapacity(capacity) }

    public var string: String { String(decoding: bytes, as: UTF8.self) }

    public mutating func reset() { bytes.removeAll(keepingCapacity: true) }

    public mutating func write(_ value: LogValue) {
        switch value {
        case .string(let s): writeString(s)
        case .int(let i): writeRaw(String(i))
        case .double(let d):
            if d.isFinite {
                // Integral doubles keep a fraction so they read back as doubles.
                if d == d.rounded(), abs(d) < 1e15 { writeRaw(String(Int64(d))); writeRaw(".0") } else { writeRaw(String(d)) }
            } else {
                writeString(String(d))
            }
        case .bool(let b): writeRaw(b ? "true" : "false")
        case .null: writeRaw("null")
        case .array(let a):
            bytes.append(UInt8(ascii: "["))
            for (i, element) in a.enumerated() {
                if i > 0 { bytes.append(UInt8(ascii: ",")) }
                write(element)
            }
            bytes.append(UInt8(ascii: "]"))
        case .object(let o): writeObject(o)
        }
    }

    public mutating func writeObject(_ object: [String: LogValue]) {
        // String's `<` orders NFC strings by Unicode scalar value, which is UTF-8 byte order.
        writeMembers(object.sorted(by: { $0.key < $1.key }))
    }

    /// An object in the dictionary's own order: for bytes read back by this library only (the
    /// rewind buffer's records, re-encoded canonically when they are stored), so not sorted.
    mutating func writeObjectUnordered(_ object: [String: LogValue]) {
        writeMembers(object)
    }

    private mutating func writeMembers(_ members: some Sequence<(key: String, value: LogValue)>) {
        bytes.append(UInt8(ascii: "{"))
        var first = true
        for (key, value) in members {
            if !first { bytes.append(UInt8(ascii: ",")) }
            first = false
            writeString(key)
            bytes.append(UInt8(ascii: ":"))
            write(value)
        }
        bytes.append(UInt8(ascii: "}"))
    }

    public mutating func writeRaw(_ s: String) { bytes.append(contentsOf: s.utf8) }

    /// Appends bytes that are already JSON.
    public mutating func writeRawBytes(_ b: UnsafeBufferPointer<UInt8>) { bytes.append(contentsOf: b) }
    public mutating func writeRawBytes(_ b: [UInt8]) { bytes.append(contentsOf: b) }

    /// Appends an integer in decimal.
    public mutating func writeDecimal(_ value: Int64) {
        if value < 0 {
            writeRaw(String(value))
            return
        }
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &digits) { buffer in
            var v = UInt64(value)
            var i = buffer.count
            repeat {
                i -= 1
                buffer[i] = UInt8(48 + v % 10)
                v /= 10
            } while v > 0
            bytes.append(contentsOf: buffer[i...])
        }
    }

    /// Appends a JSON string of UTF-8 bytes.
    public mutating func writeString(_ utf8: UnsafeBufferPointer<UInt8>) {
        bytes.append(UInt8(ascii: "\""))
        appendEscaped(utf8)
        bytes.append(UInt8(ascii: "\""))
    }

    public mutating func writeString(_ s: String) {
        bytes.append(UInt8(ascii: "\""))
        let copied: Void? = s.utf8.withContiguousStorageIfAvailable { buffer in appendEscaped(buffer) }
        if copied == nil {
            var copy = s
            copy.withUTF8 { appendEscaped($0) }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// Copies runs of bytes that need no escaping in one go; escapes the rest.
    private mutating func appendEscaped(_ buffer: UnsafeBufferPointer<UInt8>) {
        var runStart = 0
        for i in 0..<buffer.count {
            let b = buffer[i]
            guard b < 0x20 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") else { continue }
            if runStart < i { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[runStart..<i])) }
            runStart = i + 1
            bytes.append(UInt8(ascii: "\\"))
            switch b {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): bytes.append(b)
            case 0x0A: bytes.append(UInt8(ascii: "n"))
            case 0x0D: bytes.append(UInt8(ascii: "r"))
            case 0x09: bytes.append(UInt8(ascii: "t"))
            default:
                let hex = Self.hexDigits
                bytes.append(contentsOf: [UInt8(ascii: "u"), 48, 48, hex[Int(b >> 4)], hex[Int(b & 0xF)]])
            }
        }
        if runStart < buffer.count { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[runStart...])) }
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)
}

extension Timestamp {
    /// Appends the RFC 3339 form to `w` without making a string (an export writes one per record).
    @inlinable
    public func writeRFC3339(into w: inout JSONWriter) {
        withRFC3339Bytes { w.writeRawBytes($0) }
    }
}
