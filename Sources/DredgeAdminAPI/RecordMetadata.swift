import DredgeDomain
import DredgeJSON
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

    /// Whether it was kept as the text it was read from (the benchmark's count).
    package var isSpliced: Bool { spliceableText != nil }

    public static func == (a: RecordMetadata, b: RecordMetadata) -> Bool { a.value == b.value }

    public init(from decoder: any Decoder) throws { storage = .value(try JSONValue(from: decoder)) }

    public func encode(to encoder: any Encoder) throws { try value.encode(to: encoder) }

    /// Whether `text` is one JSON object that can be spliced into a page as written (see the type's
    /// comment). A single pass with no allocation; false for anything it does not vouch for.
    static func isSpliceable(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            var scanner = JSONScanner(bytes)
            scanner.space()
            guard scanner.at(UInt8(ascii: "{")) else { return false }
            return withUnsafeTemporaryAllocation(of: Range<Int>.self, capacity: Checker.maxOpenNames) { names in
                withUnsafeTemporaryAllocation(of: Int.self, capacity: Checker.maxDepth) { firsts in
                    var checker = Checker(names: names, firsts: firsts)
                    return scanner.value(depth: 0, limit: Checker.maxDepth, &checker) && scanner.atEnd()
                }
            }
        }
    }

    /// The rules of ``isSpliceable(_:)`` over ``JSONScanner``'s walk: ``JSONValue/parse(_:)``'s
    /// grammar and limits, with the member names of every open object kept (as ranges of the
    /// text) to find one given twice.
    private struct Checker: JSONVisitor {
        /// Member names held at once across the open objects; more sends the text to the parser.
        static let maxOpenNames = 256
        /// The parser's nesting limit.
        static let maxDepth = 64
        let names: UnsafeMutableBufferPointer<Range<Int>>
        /// Where each open object's names start in `names`.
        let firsts: UnsafeMutableBufferPointer<Int>
        var held = 0
        var open = 0

        init(names: UnsafeMutableBufferPointer<Range<Int>>, firsts: UnsafeMutableBufferPointer<Int>) {
            self.names = names
            self.firsts = firsts
        }

        mutating func beginObject(depth: Int) -> Bool {
            guard open < firsts.count else { return false }  // the walk's limit keeps it below; never trusted
            firsts[open] = held
            open += 1
            return true
        }

        mutating func endObject() -> Bool {
            open -= 1
            held = firsts[open]
            return true
        }

        /// Plain ASCII, and not one the object gave before.
        mutating func name(_ name: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            let range = name.range
            guard !name.escaped, held < names.count, !range.contains(where: { bytes[$0] >= 0x80 }), let base = bytes.baseAddress else { return false }
            for k in firsts[open - 1]..<held {
                let other = names[k]
                if other.count == range.count && memcmp(base + range.lowerBound, base + other.lowerBound, range.count) == 0 { return false }
            }
            names[held] = range
            held += 1
            return true
        }

        func string(_ text: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            !text.escaped || Self.surrogatesPair(text.range, in: bytes)
        }

        /// A number every reader takes as the parser does: an integer within Int64 (up to 18
        /// digits always is) but not `-0` (0 to the parser, -0 to JavaScript), or a fraction or
        /// exponent that is a finite Double. An integer beyond Int64 is a Double to the parser
        /// and exact to Python: not vouched for.
        func number(_ range: Range<Int>, integral: Bool, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            if integral {
                if bytes[range.lowerBound] == UInt8(ascii: "-"), bytes[range.lowerBound + 1] == UInt8(ascii: "0") { return false }
                return range.count <= 18 || Int64(String(decoding: bytes[range], as: UTF8.self)) != nil
            }
            return Double(String(decoding: bytes[range], as: UTF8.self))?.isFinite ?? false
        }

        /// Whether every `\u` escape of a surrogate in a string's content (escapes checked by
        /// `JSONString.scan`) is a high one followed at once by a low one.
        static func surrogatesPair(_ content: Range<Int>, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
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
    }
}
