import DredgeDomain
import Foundation

/// A found record's metadata: a JSON object, kept as the text the index holds when that text
/// can go into a page as written, parsed into a ``JSONValue`` only when asked for.
///
/// A page of 500 records would otherwise build 500 trees of dictionaries and strings that the
/// server then writes back out as JSON: ``RecordPage/jsonBytes()`` splices the text instead.
/// Text is kept only when splicing it says exactly what ``value`` says: one JSON object, at
/// most 64 deep, no member name given twice in any object (``JSONValue/parse(_:)`` keeps the
/// first, a JSON reader may keep the last), member names of ASCII without escapes (names that
/// differ in bytes but not as Swift strings, `é` precomposed or not, are one key to the parser
/// and two to other readers), no `\u` escape of half a surrogate pair (the parser reads U+FFFD,
/// Swift's JSONDecoder refuses the page), and numbers read alike everywhere (an integer within
/// Int64 but not `-0`, or a finite Double). Anything else is parsed, and text that does not
/// parse is shown as a string of itself.
public struct RecordMetadata: Sendable, Equatable, Codable {
    enum Storage: Sendable {
        case text(String)
        case value(JSONValue)
    }

    let storage: Storage

    public init(_ value: JSONValue) { storage = .value(value) }

    /// Metadata as the index stores it.
    public init(indexedText text: String) {
        if Self.isSpliceable(text) {
            storage = .text(text)
        } else {
            storage = .value(JSONValue.parse(text) ?? .string(text))
        }
    }

    /// The metadata as a JSON value (parsed now when it was kept as text).
    public var value: JSONValue {
        switch storage {
        case .value(let value): value
        case .text(let text): JSONValue.parse(text) ?? .string(text)  // checked by isSpliceable: does not happen
        }
    }

    /// The text that goes into a page as written, when there is one.
    var spliceableText: String? {
        if case .text(let text) = storage { return text }
        return nil
    }

    public static func == (a: RecordMetadata, b: RecordMetadata) -> Bool { a.value == b.value }

    public init(from decoder: any Decoder) throws { storage = .value(try JSONValue(from: decoder)) }

    public func encode(to encoder: any Encoder) throws { try value.encode(to: encoder) }

    /// Whether `text` is one JSON object that can be spliced into a page as written (see the type's
    /// comment). A single pass with no allocation; false for anything it does not vouch for.
    static func isSpliceable(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            withUnsafeTemporaryAllocation(of: Range<Int>.self, capacity: Checker.maxOpenNames) { names in
                var checker = Checker(bytes: bytes, names: names)
                checker.space()
                guard checker.i < bytes.count, bytes[checker.i] == UInt8(ascii: "{"), checker.value(depth: 0) else { return false }
                checker.space()
                return checker.i == bytes.count
            }
        }
    }

    /// The checker of ``isSpliceable(_:)``: ``JSONValue/parse(_:)``'s grammar and limits, with the
    /// member names of every open object kept (as ranges of the text) to find one given twice.
    private struct Checker {
        /// Member names held at once across the open objects; more sends the text to the parser.
        static let maxOpenNames = 256
        let bytes: UnsafeBufferPointer<UInt8>
        let names: UnsafeMutableBufferPointer<Range<Int>>
        var held = 0
        var i = 0

        init(bytes: UnsafeBufferPointer<UInt8>, names: UnsafeMutableBufferPointer<Range<Int>>) {
            self.bytes = bytes
            self.names = names
        }

        mutating func space() {
            while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x09 || bytes[i] == 0x0A || bytes[i] == 0x0D { i += 1 }
        }

        mutating func value(depth: Int) -> Bool {
            guard depth < 64, i < bytes.count else { return false }
            switch bytes[i] {
            case UInt8(ascii: "{"):
                i += 1
                let first = held
                defer { held = first }
                space()
                if i < bytes.count, bytes[i] == UInt8(ascii: "}") {
                    i += 1
                    return true
                }
                while true {
                    space()
                    guard i < bytes.count, bytes[i] == UInt8(ascii: "\""), let (end, escaped) = JSONString.scan(bytes, from: i + 1), !escaped else { return false }
                    let name = (i + 1)..<end
                    i = end + 1
                    guard held < names.count, !name.contains(where: { bytes[$0] >= 0x80 }), isNew(name, since: first) else { return false }
                    names[held] = name
                    held += 1
                    space()
                    guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { return false }
                    i += 1
                    space()
                    guard value(depth: depth + 1) else { return false }
                    space()
                    guard i < bytes.count else { return false }
                    if bytes[i] == UInt8(ascii: ",") {
                        i += 1
                        continue
                    }
                    guard bytes[i] == UInt8(ascii: "}") else { return false }
                    i += 1
                    return true
                }
            case UInt8(ascii: "["):
                i += 1
                space()
                if i < bytes.count, bytes[i] == UInt8(ascii: "]") {
                    i += 1
                    return true
                }
                while true {
                    space()
                    guard value(depth: depth + 1) else { return false }
                    space()
                    guard i < bytes.count else { return false }
                    if bytes[i] == UInt8(ascii: ",") {
                        i += 1
                        continue
                    }
                    guard bytes[i] == UInt8(ascii: "]") else { return false }
                    i += 1
                    return true
                }
            case UInt8(ascii: "\""):
                guard let (end, escaped) = JSONString.scan(bytes, from: i + 1), !escaped || surrogatesPair((i + 1)..<end) else { return false }
                i = end + 1
                return true
            case UInt8(ascii: "t"): return literal("true")
            case UInt8(ascii: "f"): return literal("false")
            case UInt8(ascii: "n"): return literal("null")
            default: return number()
            }
        }

        func isNew(_ name: Range<Int>, since first: Int) -> Bool {
            guard let base = bytes.baseAddress else { return false }
            for k in first..<held {
                let other = names[k]
                guard other.count == name.count else { continue }
                if memcmp(base + name.lowerBound, base + other.lowerBound, name.count) == 0 { return false }
            }
            return true
        }

        /// Whether every `\u` escape of a surrogate in a string's content (escapes checked by
        /// `JSONString.scan`) is a high one followed at once by a low one.
        func surrogatesPair(_ content: Range<Int>) -> Bool {
            func unit(at k: Int) -> UInt32? {
                guard k + 6 <= content.upperBound, bytes[k] == UInt8(ascii: "\\"), bytes[k + 1] == UInt8(ascii: "u") else { return nil }
                var v: UInt32 = 0
                for c in bytes[(k + 2)..<(k + 6)] {
                    switch c {
                    case 0x30...0x39: v = v << 4 | UInt32(c - 0x30)
                    case 0x41...0x46: v = v << 4 | UInt32(c - 0x41 + 10)
                    case 0x61...0x66: v = v << 4 | UInt32(c - 0x61 + 10)
                    default: return nil
                    }
                }
                return v
            }
            var k = content.lowerBound
            while k < content.upperBound {
                guard bytes[k] == UInt8(ascii: "\\") else {
                    k += 1
                    continue
                }
                guard let v = unit(at: k) else {
                    k += 2  // a two-character escape
                    continue
                }
                switch v {
                case 0xD800...0xDBFF:
                    guard let low = unit(at: k + 6), (0xDC00...0xDFFF).contains(low) else { return false }
                    k += 12
                case 0xDC00...0xDFFF: return false
                default: k += 6
                }
            }
            return true
        }

        mutating func literal(_ word: StaticString) -> Bool {
            guard let end = JSONToken.literal(bytes, at: i, word) else { return false }
            i = end
            return true
        }

        /// A number every reader takes as the parser does: an integer within Int64 (up to 18
        /// digits always is) but not `-0` (0 to the parser, -0 to JavaScript), or a fraction or
        /// exponent that is a finite Double. An integer beyond Int64 is a Double to the parser
        /// and exact to Python: not vouched for.
        mutating func number() -> Bool {
            guard let (end, integral) = JSONToken.number(bytes, from: i) else { return false }
            defer { i = end }
            if integral {
                if bytes[i] == UInt8(ascii: "-"), bytes[i + 1] == UInt8(ascii: "0") { return false }
                return end - i <= 18 || Int64(String(decoding: bytes[i..<end], as: UTF8.self)) != nil
            }
            return Double(String(decoding: bytes[i..<end], as: UTF8.self))?.isFinite ?? false
        }
    }
}
