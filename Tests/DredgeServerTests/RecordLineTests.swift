import DredgeAdminAPI
import Foundation
import DredgeDomain
import Testing
@testable import DredgeServer

/// The index's line reader: what is a record, what is not, and the values it picks out.
@Suite struct RecordLineTests {
    static func parse(_ text: String) -> (RecordLine, [UInt8])? {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBufferPointer { b in RecordLine.parse(b).map { ($0, bytes) } }
    }

    static func text(_ t: RecordLine.Text?, _ bytes: [UInt8]) -> String? {
        guard let t else { return nil }
        return bytes.withUnsafeBufferPointer { String(decoding: RecordLine.decode(t, in: $0), as: UTF8.self) }
    }

    let ts = "2026-11-20T23:59:58.250000Z"

    @Test func picksOutTheMembersTheIndexKeeps() throws {
        let line = #"{"ts":"2026-11-20T23:59:58.250000Z","level":"warning","type":"network","uid":"u-1","message":"GET \"/a\\b\" \u00e9\ud83d\ude00\n","metadata":{"a":[1,2.5e-3,{"b":null}],"c":true},"context":7}"#
        let (r, bytes) = try #require(Self.parse(line))
        #expect(r.ts == 1_795_219_198_250_000)
        #expect(r.level == 4 && Self.text(r.type, bytes) == "network" && Self.text(r.uid, bytes) == "u-1" && r.context == 7)
        #expect(Self.text(r.message, bytes) == "GET \"/a\\b\" é😀\n")
        #expect(r.metadata.map { String(decoding: bytes[$0], as: UTF8.self) } == #"{"a":[1,2.5e-3,{"b":null}],"c":true}"#)
    }

    @Test func anyOrderWhitespaceAndUnknownMembersAreFine() throws {
        let (r, bytes) = try #require(Self.parse(" { \"extra\" : [ {} , [] , \"x\" ] , \"type\" : \"app\" , \"level\":\"info\", \"ts\" : \"\(ts)\" } "))
        #expect(r.level == 2 && Self.text(r.type, bytes) == "app" && r.uid == nil && r.message == nil && r.metadata == nil && r.context == nil)
        // The first of a member given twice counts.
        let (twice, b2) = try #require(Self.parse(#"{"ts":"\#(ts)","level":"info","type":"app","uid":"first","uid":"second"}"#))
        #expect(Self.text(twice.uid, b2) == "first")
        // Metadata that is not an object is none; a context that is not an integer is none.
        let (odd, _) = try #require(Self.parse(#"{"ts":"\#(ts)","level":"info","type":"app","metadata":"x","context":1.5}"#))
        #expect(odd.metadata == nil && odd.context == nil)
    }

    @Test func linesThatAreNotRecords() {
        let bad = [
            "", "   ", "null", "[]", "{}", "\"str\"", "{\"ts\":\"\(ts)\",\"level\":\"info\"}",
            #"{"ts":"\#(ts)","level":"info","type":""}"#,
            #"{"ts":"\#(ts)","level":"info","type":"\#(String(repeating: "t", count: 65))"}"#,
            #"{"ts":"\#(ts)","level":"Info","type":"app"}"#,
            #"{"ts":"2026-11-20T23:59:58Z","level":"info","type":"app"}"#,
            #"{"ts":"2026-02-29T00:00:00.000000Z","level":"info","type":"app"}"#,
            #"{"ts":"2026-11-20T24:00:00.000000Z","level":"info","type":"app"}"#,
            #"{"ts":"2026-11-20 23:59:58.250000Z","level":"info","type":"app"}"#,
            #"{"ts":1,"level":"info","type":"app"}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app"} x"#,
            #"{"ts":"\#(ts)","level":"info","type":"app",}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app""#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":01}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":1.}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":-}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":tru}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":"\x"}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":"\u12"}"#,
            "{\"ts\":\"\(ts)\",\"level\":\"info\",\"type\":\"app\",\"m\":\"tab\there\"}",
            #"{"ts":"\#(ts)","level":"info","type":"app","m":[1 2]}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":{"a"}}"#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":"#,
            #"{"ts":"\#(ts)","level":"info","type":"app","m":"\"#,
            "{\"ts\":\"\(ts)\",\"level\":\"info\",\"type\":\"app\",\"m\":" + String(repeating: "[", count: 100) + String(repeating: "]", count: 100) + "}",
        ]
        for line in bad { #expect(Self.parse(line) == nil, "\(line.prefix(120))") }
        // Nesting up to the limit is fine.
        let deep = "{\"ts\":\"\(ts)\",\"level\":\"info\",\"type\":\"app\",\"m\":" + String(repeating: "[", count: 63) + String(repeating: "]", count: 63) + "}"
        #expect(Self.parse(deep) != nil)
        // At the edge: a member's value is at depth 1 and no value deeper than 64 is read.
        func nested(_ n: Int, _ inner: String = "") -> String {
            "{\"ts\":\"\(ts)\",\"level\":\"info\",\"type\":\"app\",\"m\":" + String(repeating: "[", count: n) + inner + String(repeating: "]", count: n) + "}"
        }
        #expect(Self.parse(nested(64)) != nil && Self.parse(nested(63, "1")) != nil)
        #expect(Self.parse(nested(65)) == nil && Self.parse(nested(64, "1")) == nil)
    }

    @Test func timestampsMatchTheProtocolsClock() {
        for text in ["1970-01-01T00:00:00.000000Z", "2000-02-29T12:34:56.789012Z", "2026-11-20T23:59:58.250000Z", "9999-12-31T23:59:59.999999Z"] {
            let bytes = Array(text.utf8)
            let parsed = bytes.withUnsafeBufferPointer { RecordLine.timestamp($0[...]) }
            #expect(parsed == DredgeDomain.Timestamp(rfc3339: text)?.microseconds, "\(text)")
        }
    }

    /// The metadata the search hands out is parsed by `JSONValue.parse`: the same JSON as
    /// Foundation's decoder reads, and nil for what is not JSON.
    @Test func metadataParsesAsFoundationReadsIt() throws {
        let texts = [
            #"{}"#, #"{"a":1,"b":-2.5e3,"c":"x\"y\\z\n\u00e9\ud83d\ude00","d":[true,false,null,{"e":[]}],"f":9223372036854775807}"#,
            #" { "k" : [ 1 , 2 ] } "#, #"{"neg0":-0,"frac":0.1,"exp":1E+2}"#,
        ]
        for text in texts {
            let ours = try #require(JSONValue.parse(text), "\(text)")
            let theirs = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
            // Foundation takes -2.5e3 as the integer -2500, this parser as the number written: the same JSON.
            #expect(ours.jsonText == theirs.jsonText, "\(text)")
        }
        // Numbers too large for a Double are not JSON values this parser hands out (the search then shows the text).
        for huge in [#"{"x":1e400}"#, #"{"x":-1e400}"#, #"{"x":"# + String(repeating: "9", count: 400) + "}"] {
            #expect(JSONValue.parse(huge) == nil, "\(huge.prefix(40))")
        }
        for bad in ["", "{", #"{"a":}"#, #"{"a":1,}"#, "[1 2]", #""\x""#, "01", "1.", "tru", #"{"a":1} x"#, String(repeating: "[", count: 70) + String(repeating: "]", count: 70)] {
            #expect(JSONValue.parse(bad) == nil, "\(bad)")
        }
    }

    /// Any bytes at all: never a crash, and a line taken as a record has a readable time.
    @Test func randomBytesNeverCrash() {
        var rng = SystemRandomNumberGenerator()
        let pieces = ["{", "}", "[", "]", ",", ":", "\"", "\\", "u", "\"ts\"", "\"\(ts)\"", "\"level\"", "\"info\"", "\"type\"", "\"app\"", "1", "-", ".", "e", "null", " ", "\u{00}", "é"]
        for _ in 0..<20_000 {
            let line = (0..<Int.random(in: 0..<30, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined()
            if let (r, _) = Self.parse(line) { #expect(r.ts == 1_795_219_198_250_000) }
        }
    }
}
