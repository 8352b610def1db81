@testable import DredgeStore
import Foundation
import Testing

@Suite struct JSONWriterTests {
    @Test func writesCanonicalSortedJSON() {
        var w = JSONWriter()
        w.writeObject(["b": 1, "a": "x", "c": ["k": true, "j": .null], "d": [1.5, 2.0, "s"]])
        #expect(w.string == #"{"a":"x","b":1,"c":{"j":null,"k":true},"d":[1.5,2.0,"s"]}"#)
    }

    @Test func escapesStringsSoAnyParserReadsThemBack() throws {
        let nasty = "quote\" backslash\\ newline\n tab\t cr\r nul\u{0} bell\u{7} é 日本 🚀"
        var w = JSONWriter()
        w.writeObject(["v": .string(nasty)])
        let decoded = try JSONSerialization.jsonObject(with: Data(w.bytes)) as! [String: String]
        #expect(decoded["v"] == nasty)
    }

    @Test func roundTripsThroughLogValueDecoding() throws {
        let value: LogMetadata = ["i": .int(-7), "d": .double(0.25), "b": false, "s": "t", "a": [1, "2"], "o": ["n": .null]]
        var w = JSONWriter()
        w.writeObject(value)
        let decoded = try JSONDecoder().decode(LogMetadata.self, from: Data(w.bytes))
        #expect(decoded == value)
    }
}
