import DredgeDomain
@testable import DredgePayload
@testable import DredgeReception
import DredgeTestSupport
import Foundation
import Testing

/// The manifest's JSON Schema (Protocol/manifest.schema.json) as every reader applies it, and
/// the schema subset validator under it.
@Suite struct ManifestSchemaTests {
    @Test func theCompiledCopyIsTheProtocolFile() throws {
        let file = try String(contentsOf: Vectors.repositoryRoot.appendingPathComponent("Protocol/manifest.schema.json"), encoding: .utf8)
        #expect(ManifestSchema.text == file, "Sources/DredgePayload/Payload/ManifestSchema.swift must hold Protocol/manifest.schema.json byte for byte")
        // It compiles: a valid manifest has no problems (a schema that did not compile gives one for every manifest).
        let upload = try #require(Vectors.load("upload.json"))
        #expect(ManifestSchema.problems(Array(try #require(upload["manifest"] as? String).utf8)) == [])
    }

    /// Protocol/vectors/manifests.json: the same verdicts as Python's `jsonschema` (check_vectors.py).
    @Test func everyManifestCaseGetsItsVerdict() throws {
        let cases = try #require(Vectors.load("manifests.json")?["cases"] as? [[String: Any]])
        #expect(cases.count > 50)
        var invalid = 0
        for c in cases {
            let name = c["name"] as? String ?? "?"
            let valid = try #require(c["valid"] as? Bool)
            let problems = ManifestSchema.problems(Array(try #require(c["manifest"] as? String).utf8))
            #expect(problems.isEmpty == valid, "\(name): \(c["rule"] ?? ""): \(problems)")
            if !valid { invalid += 1 }
        }
        #expect(invalid > 40)
    }

    @Test func problemsNameTheValueAndTheRule() throws {
        let upload = try #require(Vectors.load("upload.json"))
        let text = try #require(upload["manifest"] as? String)
        var manifest = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
        var days = try #require(manifest["days"] as? [[String: Any]])
        days[1]["records"] = 0
        manifest["days"] = days
        manifest.removeValue(forKey: "losses")
        let problems = ManifestSchema.problems(Array(try JSONSerialization.data(withJSONObject: manifest)))
        #expect(problems.sorted() == ["/: lacks the required losses", "/days/1/records: is less than 1"])
    }

    @Test func hostileDocumentsAreRefusedWithoutTrapping() {
        // Nesting far deeper than any manifest: the JSON reader refuses it instead of exhausting the stack.
        let deep = String(repeating: "[", count: 200_000) + String(repeating: "]", count: 200_000)
        #expect(!ManifestSchema.problems(Array(deep.utf8)).isEmpty)
        let deepObject = "{\"filter\":" + String(repeating: "{\"a\":", count: 100_000) + "1" + String(repeating: "}", count: 100_001)
        #expect(!ManifestSchema.problems(Array(deepObject.utf8)).isEmpty)
        // A long list under `uniqueItems` is checked in one pass.
        let types = (0..<20_000).map { "\"t\($0)\"" }.joined(separator: ",")
        let manifest = "{\"filter\":{\"types\":[\(types),\"t0\"]}}"
        #expect(ManifestSchema.problems(Array(manifest.utf8)).contains("/filter/types: repeats an item"))
        // Nesting past 16 levels is refused before anything is decoded (decoding a hostile deep
        // document costs time that grows with its depth), brackets inside strings do not count.
        let wide = "[" + Array(repeating: String(repeating: "[", count: 500) + String(repeating: "]", count: 500), count: 100).joined(separator: ",") + "]"
        #expect(ManifestSchema.problems(Array(wide.utf8)).count == 1)
        #expect(JSONSchema.shallowJSON(Array(#"{"a":[{"b":"[[[[{{{{"}]}"#.utf8)) == .fine)
        // Exactly 16 levels (with a value in the deepest, or empty) are read; 17 are not; a text
        // that is not JSON is said to be so, however deep it goes.
        for (levels, inner, verdict) in [(16, "1", JSONSchema.Shallowness.fine), (16, "", .fine), (17, "", .tooDeep), (17, "1", .tooDeep)] {
            let text = String(repeating: "[", count: levels) + inner + String(repeating: "]", count: levels)
            #expect(JSONSchema.shallowJSON(Array(text.utf8)) == verdict, "\(levels) \(inner)")
        }
        #expect(JSONSchema.shallowJSON(Array("[[1]".utf8)) == .notJSON)
        #expect(ManifestSchema.problems(Array((String(repeating: "[", count: 17) + String(repeating: "]", count: 17)).utf8)) == ["/: nests arrays and objects more than 16 deep"])
        // A document breaking a rule millions of times yields a bounded list.
        let losses = "[" + Array(repeating: "1", count: 100_000).joined(separator: ",") + "]"
        let many = ManifestSchema.problems(Array(#"{"losses":\#(losses)}"#.utf8))
        #expect(many.count == JSONSchema.maxViolations)
        #expect(!ManifestSchema.problems([0xFF, 0xFE]).isEmpty)
        #expect(!ManifestSchema.problems([]).isEmpty)
    }

    @Test func aSchemaUsingWhatTheValidatorDoesNotDoIsRefused() {
        for schema in [##"{"format": "email"}"##, ##"{"$ref": "#/$defs/missing"}"##, ##"{"type": "text"}"##, ##"{"then": {}}"##, ##"{"pattern": "("}"##, "[]"] {
            #expect(throws: JSONSchema.SchemaError.self, "\(schema)") { try JSONSchema(json: Array(schema.utf8)) }
        }
    }

    /// The manifest's filter reads back as the filter it describes, exactly: the server compares
    /// filters, not their texts (#52), and a description that names no filter is refused.
    @Test func aManifestsFilterReadsBackAsTheFilterItDescribes() throws {
        let filter = LogFilter(
            since: Timestamp(microseconds: 1_763_700_000_000_001), until: Timestamp(microseconds: 1_763_786_400_000_000), uid: "u-1",
            types: ["network", "app"], levels: [.error, .warning], text: "timeout é")
        #expect(try ExportManifest.FilterDescription(filter).logFilter() == filter)
        #expect(try ExportManifest.FilterDescription(.all).logFilter() == .all)
        #expect(LogFilter(types: [], levels: [], text: "").normalized == .all)
        var bad = ExportManifest.FilterDescription(filter)
        for change in [{ (d: inout ExportManifest.FilterDescription) in d.since = "yesterday" }, { $0.levels = ["warn"] }, { $0.levels = ["error", "error"] }, { $0.types = ["App"] }] {
            bad = ExportManifest.FilterDescription(filter)
            change(&bad)
            #expect(throws: ExportManifest.FilterDescription.Unreadable.self, "\(bad)") { try bad.logFilter() }
        }
    }
}

