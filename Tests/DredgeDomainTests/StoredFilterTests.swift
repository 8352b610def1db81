import DredgeDomain
import Foundation
import Testing

@Suite struct StoredFilterTests {
    static let full = LogFilter(
        since: Timestamp(microseconds: 1_763_700_000_000_000), until: Timestamp(microseconds: 1_763_786_400_000_000), uid: "u-1",
        types: ["network", "app"], levels: [.error, .warning], text: "time/out \"x\"")

    /// The version-1 text is pinned: a change to it is a change to every stored pull.
    @Test func theStoredTextIsVersionedSortedAndStable() throws {
        #expect(
            try StoredFilter.encode(Self.full)
                == #"{"levels":["warning","error"],"since_us":1763700000000000,"text":"time/out \"x\"","types":["app","network"],"uid":"u-1","until_us":1763786400000000,"v":1}"#)
        #expect(try StoredFilter.encode(.all) == #"{"v":1}"#)
    }

    @Test(arguments: [
        StoredFilterTests.full, .all, LogFilter(uid: "ü-☃"), LogFilter(types: []), LogFilter(levels: [.critical]),
        LogFilter(since: Timestamp(microseconds: 0)), LogFilter(text: ""),
    ])
    func filtersReadBackExactly(_ filter: LogFilter) throws {
        #expect(try StoredFilter.decode(try StoredFilter.encode(filter)) == filter)
    }

    /// Anything but the exact form is refused: never read as a wider filter, least of all
    /// as every record.
    @Test(arguments: [
        "",  // not JSON
        "{}",  // no version
        #"{"uid":"u-1"}"#,  // the old, unversioned form
        #"{"v":2,"uid":"u-1"}"#,  // a version this build does not know
        #"{"v":"1"}"#,  // the version as a string
        #"{"v":1,"uid":"u-1","users":["u-2"]}"#,  // an unknown key
        #"{"v":1,"since_us":"yesterday"}"#,  // a value of the wrong type
        #"{"v":1,"since_us":true}"#,
        #"{"v":1,"types":["App"]}"#,  // an invalid type name
        #"{"v":1,"types":["app","app"]}"#,  // a duplicate
        #"{"v":1,"levels":["warn"]}"#,  // an alias, not a stored name
        #"{"v":1,"levels":[4]}"#,
        #"{"v":1,"since_us":2,"until_us":1}"#,  // an empty range
        #"{"v":1,"since_us":-1}"#,  // out of the accepted range
        #"{"v":1,"uid":"u-1\u0000x"}"#,  // a NUL in the uid
        #"{"v":1,"uid":""}"#,
        #"[1]"#,
    ])
    func damagedFiltersDoNotReadBack(_ text: String) {
        #expect(throws: StoredFilter.Unreadable.self) { try StoredFilter.decode(text) }
    }

    @Test func feedbackTextAndUidLimits() {
        #expect(FeedbackText.isValid("x"))
        #expect(!FeedbackText.isValid(""))
        #expect(FeedbackText.isValid(String(repeating: "é", count: DomainLimits.feedbackTextBytes / 2)))
        #expect(!FeedbackText.isValid(String(repeating: "é", count: DomainLimits.feedbackTextBytes / 2) + "x"))
        #expect(UserID.isValid(String(repeating: "a", count: DomainLimits.uidBytes)))
        #expect(!UserID.isValid(String(repeating: "a", count: DomainLimits.uidBytes + 1)))
    }

    /// One vocabulary (#52): the admin API's filter JSON is the stored text without `v`.
    @Test(arguments: [StoredFilterTests.full, .all, LogFilter(levels: [.critical, .trace]), LogFilter(types: [])])
    func theAPIsFilterIsTheStoredOneWithoutItsVersion(_ filter: LogFilter) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let api = String(decoding: try encoder.encode(filter), as: UTF8.self)
        let stored = try StoredFilter.encode(filter)
        #expect(api == (stored == #"{"v":1}"# ? "{}" : stored.replacingOccurrences(of: #","v":1}"#, with: "}")))
        #expect(try JSONDecoder().decode(LogFilter.self, from: Data(api.utf8)) == filter)
    }

    /// What older clients sent (the synthesized shape: `since`, levels as numbers) and level
    /// aliases are still read, as the same filter.
    @Test func theAPIStillReadsTheOlderShape() throws {
        let old = #"{"levels":[4,5],"since":1763700000000000,"text":"time/out \"x\"","types":["app","network"],"uid":"u-1","until":1763786400000000}"#
        #expect(try JSONDecoder().decode(LogFilter.self, from: Data(old.utf8)) == Self.full)
        let mixed = #"{"levels":["warn",5],"since_us":1763700000000000,"text":"time/out \"x\"","types":["network","app"],"uid":"u-1","until":1763786400000000}"#
        #expect(try JSONDecoder().decode(LogFilter.self, from: Data(mixed.utf8)) == Self.full)
    }

    /// A part it does not know, a time given twice, a level that is none: refused with what is
    /// wrong, never read as a wider filter.
    @Test(arguments: [
        (#"{"level":["error"]}"#, "no part \"level\""),
        (#"{"since":1,"since_us":1}"#, "since_us or since, not both"),
        (#"{"levels":["loud"]}"#, "\"loud\" is not a level"),
        (#"{"levels":[7]}"#, "level 7 is not one of 0"),
        (#"{"types":["App"]}"#, "invalid log type"),
        (#"{"since_us":"yesterday"}"#, "Int64"),
    ])
    func theAPIRefusesWhatItCannotReadExactly(_ text: String, _ why: String) {
        do {
            let filter = try JSONDecoder().decode(LogFilter.self, from: Data(text.utf8))
            Issue.record("\(text) read as \(filter)")
        } catch {
            #expect("\(error)".contains(why), "\(error)")
        }
    }
}

