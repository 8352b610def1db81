@testable import DredgeAdminAPI
import DredgeDomain
import Foundation
import Testing

/// A search page is written by hand (`RecordPage.jsonBytes`), each record's metadata spliced in
/// as the index holds it: what a JSON reader gets must be what the page says.
@Suite struct PageJSONTests {
    static func record(_ id: Int64, message: String, metadata: RecordMetadata, uid: String = "u-1") -> FoundRecord {
        FoundRecord(
            id: id, ts: Timestamp(microseconds: 1_795_219_198_250_000 + id), level: "warning", type: "network", uid: uid, message: message,
            metadata: metadata, agentID: "a-0123456789abcdef", sourceKind: "pull", sourceID: "p-0123456789abcdef", host: "host \"one\"",
            app: "Shop/iOS", appVersion: "4.2 (17)", os: "Linux\tx86_64", process: "shopd")
    }

    static func read(_ bytes: [UInt8]) throws -> RecordPage { try JSONDecoder.adminAPI.decode(RecordPage.self, from: Data(bytes)) }

    /// Text kept for splicing reads, in a JSON reader, as the index's parser reads it.
    @Test func spliceableMetadataReadsAsTheParserReadsIt() throws {
        let texts = [
            #"{}"#, #" { "k" : [ 1 , 2 ] } "#, #"{"a":1,"b":-2.5,"c":"x\"y\\z\n\u00e9\ud83d\ude00","d":[true,false,null,{"e":[]}],"f":9223372036854775807}"#,
            #"{"a":{"a":1},"b":{"a":2},"c":[{"a":1},{"a":2}]}"#, #"{"pair":"\ud83d\ude00","bmp":"\u00e9\u2028","not an escape":"\\ud800"}"#, #"{"big":1e300,"small":-1E-300,"long":123456789012345678}"#, #"{"k":"é ☃ 😀 \u2028"}"#,
        ]
        for text in texts {
            let metadata = RecordMetadata(indexedText: text)
            #expect((metadata.spliceableText != nil), "\(text)")
            let page = RecordPage(records: [Self.record(1, message: "m", metadata: metadata)], next: nil, indexing: 0, newestID: 1)
            let read = try Self.read(try page.jsonBytes())
            #expect(read.records.first?.metadata.value == JSONValue.parse(text), "\(text)")
        }
        // Swift's reader takes 1.0 and -0.0 as the integers 1 and 0, the parser as Doubles: the
        // same numbers (and what the encoder's 1.0 read as before).
        let fractions = #"{"fraction":-0.0,"one":1.0}"#
        #expect(RecordMetadata(indexedText: fractions).spliceableText != nil)
        let page = RecordPage(records: [Self.record(1, message: "m", metadata: RecordMetadata(indexedText: fractions))], next: nil, indexing: 0, newestID: 1)
        #expect(try Self.read(try page.jsonBytes()).records.first?.metadata.value == .object(["fraction": .integer(0), "one": .integer(1)]))
    }

    /// Text a reader could read otherwise than the parser, or not at all, is parsed and written again.
    @Test func metadataThatCannotBeSplicedIsParsed() throws {
        let cases: [(text: String, value: JSONValue)] = [
            // A name given twice: the first counts, as for `--where`; a reader would take the last.
            (#"{"a":1,"a":2}"#, .object(["a": .integer(1)])),
            (#"{"x":{"a":"first","b":0,"a":"second"}}"#, .object(["x": .object(["a": .string("first"), "b": .integer(0)])])),
            // A name with escapes (which could spell another name).
            (#"{"a":1,"\u0061":2}"#, .object(["a": .integer(1)])),
            // Names the parser takes as one (é precomposed, then e and a combining accent); a name not in ASCII at all.
            ("{\"\u{E9}\":1,\"e\u{301}\":2}", .object(["\u{E9}": .integer(1)])),
            (#"{"café":1}"#, .object(["café": .integer(1)])),
            // Half a surrogate pair escaped: U+FFFD to the parser, a refused page to Swift's reader.
            (#"{"a":"\ud800"}"#, .object(["a": .string("\u{FFFD}")])),
            (#"{"a":"\udc00x"}"#, .object(["a": .string("\u{FFFD}x")])),
            (#"{"a":["\ud800\u0041"]}"#, .object(["a": .array([.string("\u{FFFD}A")])])),
            // Numbers other readers take otherwise: -0, an integer beyond Int64.
            (#"{"z":-0}"#, .object(["z": .integer(0)])),
            (#"{"u":18446744073709551615}"#, .object(["u": .number(18446744073709551615)])),
            // Not an object.
            (#"[1]"#, .array([.integer(1)])),
            // Numbers a reader takes as infinity, and text that is not JSON: shown as the text.
            (#"{"big":1e400}"#, .string(#"{"big":1e400}"#)),
            (#"{"x":"# + String(repeating: "9", count: 400) + "}", .string(#"{"x":"# + String(repeating: "9", count: 400) + "}")),
            (#"{"a":}"#, .string(#"{"a":}"#)),
            (String(repeating: #"{"a":"#, count: 70) + "1" + String(repeating: "}", count: 70), .string(String(repeating: #"{"a":"#, count: 70) + "1" + String(repeating: "}", count: 70))),
        ]
        for (text, value) in cases {
            let metadata = RecordMetadata(indexedText: text)
            #expect(!(metadata.spliceableText != nil), "\(text.prefix(40))")
            #expect(metadata.value == value, "\(text.prefix(40))")
            let page = RecordPage(records: [Self.record(1, message: "m", metadata: metadata)], next: nil, indexing: 0, newestID: 1)
            #expect(try Self.read(try page.jsonBytes()).records.first?.metadata.value == value, "\(text.prefix(40))")
        }
        // More member names open at once than the checker holds: parsed, and still right.
        let many = "{" + (0..<300).map { #""k\#($0)":\#($0)"# }.joined(separator: ",") + "}"
        #expect(!(RecordMetadata(indexedText: many).spliceableText != nil))
        #expect(RecordMetadata(indexedText: many).value == JSONValue.parse(many))
    }

    /// Every member of a page, whatever its strings hold, reads back as it was.
    @Test func aPageReadsBackAsItWas() throws {
        let strings = ["", "plain", "quote \" backslash \\ slash /", "line\nbreak\r\ttab\u{08}\u{0C}", "\u{01}\u{1F}\u{7F}", "é ☃ 😀 \u{2028}\u{2029}", "\u{0}"]
        var records: [FoundRecord] = []
        for (n, s) in strings.enumerated() {
            records.append(Self.record(Int64(n), message: s, metadata: RecordMetadata(indexedText: #"{"n":\#(n),"s":"\u0041\n"}"#), uid: s))
            records.append(
                Self.record(
                    Int64(100 + n), message: s, metadata: RecordMetadata(.object([s: .string(s), "list": .array([.null, .bool(true), .number(0.5), .integer(-7)])])),
                    uid: s))
            // What a record's context claimed beside the registered names (#49).
            var claimed = Self.record(Int64(200 + n), message: s, metadata: RecordMetadata(indexedText: "{}"), uid: s)
            claimed.claimedHost = n % 2 == 0 ? nil : s
            records.append(claimed)
        }
        for page in [
            RecordPage(records: records, next: "1795219198250006.6", indexing: 3, newestID: 9_000_000_000),
            RecordPage(records: records, next: "1795219198250006.6", previous: "1795219198250001.2", indexing: 0, newestID: 9),
            RecordPage(records: [], next: nil, indexing: 0, newestID: 0),
        ] {
            let bytes = try page.jsonBytes()
            #expect(try Self.read(bytes) == page)
            // What the generic encoder writes reads back the same.
            #expect(try JSONDecoder.adminAPI.decode(RecordPage.self, from: JSONEncoder.adminAPI.encode(page)) == page)
            let object = try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
            #expect(Set(object.keys) == Set(["indexing", "newestID", "records"] + (page.next == nil ? [] : ["next"]) + (page.previous == nil ? [] : ["previous"])))
            // The members as the generic encoder writes them: a claim only where there is one.
            let generic = try #require(try JSONSerialization.jsonObject(with: JSONEncoder.adminAPI.encode(page)) as? [String: Any])
            let keys = { (o: [String: Any]) in ((o["records"] as? [[String: Any]]) ?? []).map { Set($0.keys) } }
            #expect(keys(object) == keys(generic))
        }
    }

    /// A value built in code with a number JSON cannot carry fails the page, as the encoder would.
    @Test func aNonFiniteNumberIsAnError() {
        let page = RecordPage(records: [Self.record(1, message: "m", metadata: RecordMetadata(.object(["x": .number(.infinity)])))], next: nil, indexing: 0, newestID: 1)
        #expect(throws: (any Error).self) { try page.jsonBytes() }
    }
}
