import DredgeAdminAPI
import DredgeDomain
import Testing

/// #50: the viewer's counts and histogram, from what both back ends count.
@Suite struct RecordStatsTests {
    @Test func theSpanIsTheSearchsRangeOrTheRecords() {
        var search = RecordSearch()
        (search.since, search.until) = (Timestamp(microseconds: 0), Timestamp(microseconds: 600))
        let ranged = RecordStats.Span(search, first: 5, last: 500, over: false)
        #expect(ranged.from == 0 && ranged.to == 600 && ranged.width == 10 && ranged.count == RecordStats.bucketCount)
        let stopped = RecordStats.Span(search, first: 5, last: 300, over: true)
        #expect(stopped.to == 301, "a count that stopped ends just after the last counted")
        let open = RecordStats.Span(RecordSearch(), first: 1_000, last: 1_000, over: false)
        #expect(open.from == 1_000 && open.to == 1_001 && open.width == 1 && open.count == 1, "one instant: one span")
        let uneven = RecordStats.Span(RecordSearch(), first: 0, last: 60, over: false)
        #expect(uneven.width == 2 && uneven.count == 31 && uneven.to == 61)
    }

    @Test func countsArePerLevelHostAndBucket() {
        var search = RecordSearch()
        (search.since, search.until) = (Timestamp(microseconds: 0), Timestamp(microseconds: 600))
        let stats = RecordStats.make(
            search, over: false, first: 0, last: 599, buckets: [(0, 5, 2), (1, 2, 1), (30, 4, 1), (59, 2, 1), (99, 2, 7)], hosts: ["a": 3, "b": 2])
        #expect(stats.total == 12 && stats.complete && stats.countedUntil == nil)
        #expect(stats.levels == ["error": 2, "info": 9, "warning": 1] && stats.hosts == ["a": 3, "b": 2])
        #expect(stats.from == Timestamp(microseconds: 0) && stats.to == Timestamp(microseconds: 600) && stats.bucketMicroseconds == 10)
        #expect(stats.buckets.count == 60 && stats.buckets[0] == ["error": 2] && stats.buckets[30] == ["warning": 1] && stats.buckets[59] == ["info": 1])
        let over = RecordStats.make(RecordSearch(), over: true, first: 0, last: 99, buckets: [(0, 2, 100)], hosts: ["a": 100])
        #expect(!over.complete && over.countedUntil == Timestamp(microseconds: 99))
        #expect(RecordStats.make(RecordSearch(), over: false, first: nil, last: nil, buckets: [], hosts: [:]) == RecordStats(), "nothing matched")
    }

    @Test func countedSearchesDropTheirCursorAndPageSize() {
        var search = RecordSearch(uid: "u-1")
        (search.after, search.before, search.limit, search.arrivedAfter) = ("1.1", nil, 5, 9)
        #expect(RecordStats.counted(search) == RecordSearch(uid: "u-1"))
    }
}
