import DredgeDomain
import Foundation

extension RecordPage {
    /// The page as `POST /v1/records/search` answers it: the JSON a `JSONEncoder` would write
    /// (the same members; `next` and `previous` left out when nil), written in one pass with each record's
    /// metadata spliced in as the index holds it (see ``RecordMetadata``). Throws only for a
    /// metadata value built in code with a non-finite number, which JSON cannot carry.
    public func jsonBytes() throws -> [UInt8] {
        var out = JSONBytes()
        out.bytes.reserveCapacity(64 + records.count * 400)
        out.byte("{")
        out.key("indexing", first: true)
        out.integer(Int64(indexing))
        out.key("newestID")
        out.integer(newestID)
        if let next {
            out.key("next")
            out.string(next)
        }
        if let previous {
            out.key("previous")
            out.string(previous)
        }
        out.key("records")
        out.byte("[")
        for (n, r) in records.enumerated() {
            if n > 0 { out.byte(",") }
            out.byte("{")
            out.key("agentID", first: true)
            out.string(r.agentID)
            out.key("app")
            out.string(r.app)
            out.key("appVersion")
            out.string(r.appVersion)
            if let claimed = r.claimedHost {
                out.key("claimedHost")
                out.string(claimed)
            }
            out.key("host")
            out.string(r.host)
            out.key("id")
            out.integer(r.id)
            out.key("level")
            out.string(r.level)
            out.key("message")
            out.string(r.message)
            out.key("metadata")
            if let text = r.metadata.spliceableText {
                out.bytes.append(contentsOf: text.utf8)
            } else {
                try out.value(r.metadata.value)
            }
            out.key("os")
            out.string(r.os)
            out.key("process")
            out.string(r.process)
            out.key("sourceID")
            out.string(r.sourceID)
            out.key("sourceKind")
            out.string(r.sourceKind)
            out.key("ts")
            out.integer(r.ts.microseconds)
            out.key("type")
            out.string(r.type)
            out.key("uid")
            out.string(r.uid)
            out.byte("}")
        }
        out.byte("]")
        out.byte("}")
        return out.bytes
    }
}

/// JSON written byte by byte (RFC 8259): strings escaped as they must be (quote, backslash,
/// control characters), everything else in UTF-8 as it is.
struct JSONBytes {
    struct NonFiniteNumber: Error, CustomStringConvertible {
        var description: String { "a JSON number must be finite" }
    }

    var bytes: [UInt8] = []

    mutating func byte(_ c: Unicode.Scalar) { bytes.append(UInt8(ascii: c)) }

    mutating func key(_ name: StaticString, first: Bool = false) {
        if !first { byte(",") }
        byte("\"")
        bytes.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        byte("\"")
        byte(":")
    }

    mutating func integer(_ value: Int64) { bytes.append(contentsOf: String(value).utf8) }

    mutating func string(_ text: String) {
        byte("\"")
        let utf8 = text.utf8
        if !utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) {
            bytes.append(contentsOf: utf8)
        } else {
            for c in utf8 {
                switch c {
                case UInt8(ascii: "\""): bytes.append(contentsOf: [0x5C, 0x22])
                case UInt8(ascii: "\\"): bytes.append(contentsOf: [0x5C, 0x5C])
                case 0x0A: bytes.append(contentsOf: [0x5C, UInt8(ascii: "n")])
                case 0x0D: bytes.append(contentsOf: [0x5C, UInt8(ascii: "r")])
                case 0x09: bytes.append(contentsOf: [0x5C, UInt8(ascii: "t")])
                case 0x08: bytes.append(contentsOf: [0x5C, UInt8(ascii: "b")])
                case 0x0C: bytes.append(contentsOf: [0x5C, UInt8(ascii: "f")])
                case ..<0x20:
                    func hex(_ n: UInt8) -> UInt8 { n < 10 ? 0x30 + n : 0x61 + n - 10 }
                    bytes.append(contentsOf: [0x5C, UInt8(ascii: "u"), 0x30, 0x30, hex(c >> 4), hex(c & 0xF)])
                default: bytes.append(c)
                }
            }
        }
        byte("\"")
    }

    /// A value built in code; object members in name order.
    mutating func value(_ value: JSONValue) throws {
        switch value {
        case .null: bytes.append(contentsOf: "null".utf8)
        case .bool(let b): bytes.append(contentsOf: (b ? "true" : "false").utf8)
        case .integer(let i): integer(i)
        case .number(let d):
            guard d.isFinite else { throw NonFiniteNumber() }
            // Swift's shortest round-trip form ("1.5", "1e-07", "5.0"), which is JSON's grammar.
            bytes.append(contentsOf: "\(d)".utf8)
        case .string(let s): string(s)
        case .array(let items):
            byte("[")
            for (n, item) in items.enumerated() {
                if n > 0 { byte(",") }
                try self.value(item)
            }
            byte("]")
        case .object(let members):
            byte("{")
            for (n, (name, member)) in members.sorted(by: { $0.key < $1.key }).enumerated() {
                if n > 0 { byte(",") }
                string(name)
                byte(":")
                try self.value(member)
            }
            byte("}")
        }
    }
}
