import DredgeCommandLine
import Testing

/// Ids as engineers type them (`dredge show 3f2a`): the rules of ``IDPrefix``.
@Suite struct IDPrefixTests {
    static let a = "3f2a" + String(repeating: "0", count: 28)
    static let b = "3f2b" + String(repeating: "1", count: 28)
    static let c = "3f2a9" + String(repeating: "2", count: 27)

    @Test func aUniqueStartNamesItsId() {
        #expect(IDPrefix.match("3f2b", what: "pull", among: [Self.a, Self.b, Self.c]) == .success(Self.b))
        #expect(IDPrefix.match("3f2a0", what: "pull", among: [Self.a, Self.b, Self.c]) == .success(Self.a))
        #expect(IDPrefix.match("3f2b", what: "pull", among: [Self.b, Self.b]) == .success(Self.b), "listed twice is still one")
    }

    @Test func aWholeIdIsTakenAsItIsWithoutLookingItUp() {
        #expect(IDPrefix.match(Self.a, what: "pull", among: []) == .success(Self.a))
    }

    @Test func anAmbiguousStartListsWhatItMatches() throws {
        guard case .failure(let problem) = IDPrefix.match("3f2a", what: "pull", among: [Self.c, Self.a, Self.b]) else {
            Issue.record("3f2a matches two ids")
            return
        }
        #expect(problem.description.contains("ambiguous: 2 pull ids"))
        #expect(problem.description.contains("\(Self.a), \(Self.c)"), "sorted, both shown: \(problem)")
        let many = (0..<7).map { "abcd" + String($0) + String(repeating: "f", count: 27) }
        guard case .failure(let more) = IDPrefix.match("abcd", what: "feedback", among: many) else {
            Issue.record("abcd matches seven ids")
            return
        }
        #expect(more.description.contains("7 feedback ids") && more.description.contains(", …"), "at most five shown: \(more)")
    }

    @Test func noMatchAndBadFormsAreSaid() {
        guard case .failure(let none) = IDPrefix.match("dead", what: "pull", among: [Self.a]) else {
            Issue.record("dead matches nothing")
            return
        }
        #expect(none.description.contains("no pull id starts with dead"))
        for bad in ["3f2", "3F2A", "zzzz", String(repeating: "a", count: 33), ""] {
            guard case .failure(let problem) = IDPrefix.match(bad, what: "agent", among: [Self.a]) else {
                Issue.record("\(bad) is not an id")
                continue
            }
            #expect(problem.description.contains("is not an agent id"), "\(problem)")
        }
    }
}
