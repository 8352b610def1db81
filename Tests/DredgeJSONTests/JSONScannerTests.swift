import DredgeJSON
import Foundation
import Testing

/// The one JSON reader (#52): its grammar against Foundation's, its depth bound at the edge,
/// and the walk a visitor is told.
@Suite struct JSONScannerTests {
    /// Records every event, as text.
    struct Recorder: JSONVisitor {
        var events: [String] = []
        mutating func beginObject(depth: Int) -> Bool { events.append("{\(depth)"); return true }
        mutating func name(_ name: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool { events.append("name \(Self.text(name, bytes))"); return true }
        mutating func endObject() -> Bool { events.append("}"); return true }
        mutating func beginArray(depth: Int) -> Bool { events.append("[\(depth)"); return true }
        mutating func endArray() -> Bool { events.append("]"); return true }
        mutating func string(_ text: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            events.append("string \(Self.text(text, bytes))\(text.escaped ? " escaped" : "")")
            return true
        }
        mutating func number(_ range: Range<Int>, integral: Bool, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            events.append("number \(String(decoding: bytes[range], as: UTF8.self))\(integral ? "" : " fraction")")
            return true
        }
        mutating func literal(_ value: JSONLiteral) -> Bool { events.append("\(value)"); return true }
        static func text(_ t: JSONText, _ bytes: UnsafeBufferPointer<UInt8>) -> String { String(decoding: JSONString.unescape(bytes, t.range), as: UTF8.self) }
    }

    static func walk(_ text: String, limit: Int = 64) -> [String]? {
        var recorder = Recorder()
        let ok = Array(text.utf8).withUnsafeBufferPointer { JSONScanner.document($0, limit: limit, &recorder) }
        return ok ? recorder.events : nil
    }

    @Test func aWalkTellsEveryValueInOrder() {
        #expect(
            Self.walk(#" {"a": [1, -2.5e3, "x\n", true, false, null, {}], "b\u00e9": {"c": []}} "#) == [
                "{0", "name a", "[1", "number 1", "number -2.5e3 fraction", "string x\n escaped", "true", "false", "null", "{2", "}", "]",
                "name bé", "{1", "name c", "[2", "]", "}", "}",
            ])
        #expect(Self.walk("7") == ["number 7"])
    }

    /// RFC 8259, at the grammar's edges (UTF-8 aside: the scanner does not check it).
    /// Foundation's reader is no reference here: it takes `[1,]`.
    @Test(arguments: ["{}", "[]", "0", "-0", "1.5", "1e5", "1E+5", "1e-5", "\"\"", "\"\\u00e9\\/\\b\\f\\n\\r\\t\\\"\\\\\"", " \t\r\n[ 1 , 2 ]\n"])
    func valid(_ text: String) {
        #expect(Self.walk(text) != nil, "\(text.debugDescription)")
        #expect((try? JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed])) != nil, "\(text.debugDescription)")
    }

    @Test(arguments: [
        "01", "1.", ".5", "-", "+1", "1e", "0x10", "[1,]", "[,1]", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{a:1}", "'a'", "\"\\x\"", "\"\\u12\"",
        "\"a\u{1}b\"", "tru", "nul", "true false", "[1 2]", "{\"a\":1 \"b\":2}", "", "   ", "[", "{", "\"abc", "NaN", "[1]]", "{}}",
    ])
    func invalid(_ text: String) {
        #expect(Self.walk(text) == nil, "\(text.debugDescription)")
    }

    /// A value at depth `limit` is refused, one above it read: the bound every reader gives.
    @Test func theDepthBoundIsExact() {
        let nested = { (n: Int) in String(repeating: "[", count: n) + String(repeating: "]", count: n) }
        #expect(Self.walk(nested(64), limit: 64) != nil)  // the innermost array at depth 63
        #expect(Self.walk(nested(65), limit: 64) == nil)
        #expect(Self.walk(nested(63) + "", limit: 64) != nil)
        #expect(Self.walk(String(repeating: "[", count: 63) + "1" + String(repeating: "]", count: 63), limit: 64) != nil)  // 1 at depth 63
        #expect(Self.walk(String(repeating: "[", count: 64) + "1" + String(repeating: "]", count: 64), limit: 64) == nil)  // 1 at depth 64
        // A hostile depth stops at the bound instead of recursing on.
        #expect(Self.walk(nested(1_000_000), limit: 64) == nil)
    }

    /// A hook that refuses ends the walk there.
    @Test func aVisitorRefusesAndTheWalkStops() {
        struct NoNulls: JSONVisitor {
            var seen = 0
            mutating func literal(_ value: JSONLiteral) -> Bool {
                seen += 1
                if case .null = value { return false }
                return true
            }
        }
        var visitor = NoNulls()
        let ok = Array("[true, null, false]".utf8).withUnsafeBufferPointer { JSONScanner.document($0, limit: 8, &visitor) }
        #expect(!ok && visitor.seen == 2)
    }

    /// `members` hands each name with the scanner at its value; the body consumes it.
    @Test func membersAreHandedOneByOne() {
        var names: [String] = []
        let ok = Array(#"{"ts": "x", "n": {"deep": [1]}, "z": 3}"#.utf8).withUnsafeBufferPointer { bytes in
            var scanner = JSONScanner(bytes)
            return scanner.members { scanner, name in
                names.append(String(decoding: scanner.bytes[name.range], as: UTF8.self))
                return scanner.skip(depth: 1, limit: 4)
            } && scanner.atEnd()
        }
        #expect(ok && names == ["ts", "n", "z"])
        let tooDeep = Array(#"{"n": {"deep": [1]}}"#.utf8).withUnsafeBufferPointer { bytes in
            var scanner = JSONScanner(bytes)
            return scanner.members { scanner, _ in scanner.skip(depth: 1, limit: 3) }
        }
        #expect(!tooDeep)  // 1 is at depth 3
    }

    /// Random bytes and random cuts of valid texts never trap, and a cut text is never read whole.
    @Test func randomBytesNeverTrap() {
        var generator = SystemRandomNumberGenerator()
        let valid = Array(#"{"a":[1,-2.5e3,"x\u00e9\n",true,false,null,{"b":{}}]}"#.utf8)
        for cut in 0..<valid.count {
            let prefix = String(decoding: valid[..<cut], as: UTF8.self)
            #expect(Self.walk(prefix) == nil, "\(prefix)")
        }
        for _ in 0..<2_000 {
            let bytes = (0..<Int.random(in: 0..<40, using: &generator)).map { _ in "{}[]\",:\\u0123456789-+.eEtrufalsn \t"[...].utf8.randomElement(using: &generator)! }
            _ = Self.walk(String(decoding: bytes, as: UTF8.self))
        }
    }
}
