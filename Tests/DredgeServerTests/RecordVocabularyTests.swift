@testable import DredgeAdminAPI
import Testing

/// #50: a filter's type, host or app that no record has is told with the known values nearest it.
@Suite struct RecordVocabularyTests {
    @Test func unknownValuesAreToldWithTheNearestKnownOnes() {
        let vocabulary = RecordVocabulary(types: ["business", "network", "player"], hosts: ["oven-7", "oven-8"], apps: ["oven-control"])
        let unknown = vocabulary.unknown(types: ["netwrok", "player"], hosts: ["oven-9"], apps: ["oven-contrl"])
        #expect(unknown.map(\.field) == ["type", "host", "app"])
        #expect(unknown[0].description == #"no record has type "netwrok"; known: "network", "player", "business""#)
        #expect(unknown[1].nearest == ["oven-7", "oven-8"])
        #expect(unknown[2].described(subject: "no record pulled so far") == #"no record pulled so far has app "oven-contrl"; known: "oven-control""#)
        #expect(vocabulary.unknown(types: ["network"], hosts: ["oven-7"], apps: nil).isEmpty)
    }

    @Test func nothingIsCalledUnknownWhenTheListsAreCutOrEmpty() {
        #expect(RecordVocabulary(types: ["app"], more: true).unknown(types: ["netwrok"], hosts: nil, apps: nil).isEmpty)
        #expect(RecordVocabulary().unknown(types: ["netwrok"], hosts: ["h"], apps: ["a"]).isEmpty, "nothing indexed yet: nothing is known")
    }

    @Test func aLongListShowsTheNearestAndCountsTheRest() {
        let types = (0..<20).map { "type\($0)" }
        let unknown = RecordVocabulary(types: types).unknown(types: ["type7x"], hosts: nil, apps: nil)
        #expect(unknown.first?.nearest.first == "type7" && unknown.first?.nearest.count == RecordVocabulary.Unknown.shown)
        #expect(unknown.first?.description.hasSuffix("(and 12 more)") == true)
    }

    @Test func editDistanceCountsATranspositionOnce() {
        func d(_ a: String, _ b: String) -> Int { RecordVocabulary.editDistance(Array(a), Array(b)) }
        #expect(d("netwrok", "network") == 1 && d("network", "network") == 0 && d("", "abc") == 3 && d("kitten", "sitting") == 3)
    }
}
