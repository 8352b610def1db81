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
        bytes.append(UInt8(ascii: "{"))
        var first = true
        for key in object.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
            if !first { bytes.append(UInt8(ascii: ",")) }
            first = false
            writeString(key)
            bytes.append(UInt8(ascii: ":"))
            write(object[key]!)
        }
        bytes.append(UInt8(ascii: "}"))
    }

    public mutating func writeRaw(_ s: String) { bytes.append(contentsOf: s.utf8) }

    public mutating func writeString(_ s: String) {
        bytes.append(UInt8(ascii: "\""))
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "\""): bytes.append(UInt8(ascii: "\\")); bytes.append(b)
            case UInt8(ascii: "\\"): bytes.append(UInt8(ascii: "\\")); bytes.append(b)
            case 0x0A: bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "n"))
            case 0x0D: bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "r"))
            case 0x09: bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "t"))
            case 0..<0x20:
                let hex: [UInt8] = Array("0123456789abcdef".utf8)
                bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), 48, 48, hex[Int(b >> 4)], hex[Int(b & 0xF)]])
            default: bytes.append(b)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }
}
