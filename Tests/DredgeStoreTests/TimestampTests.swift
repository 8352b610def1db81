import DredgeStore
import Testing

@Suite struct TimestampTests {
    @Test func formatsRFC3339WithMicroseconds() {
        #expect(Timestamp(microseconds: 0).rfc3339 == "1970-01-01T00:00:00.000000Z")
        #expect(Timestamp(microseconds: 1_795_340_400_000_042).rfc3339 == "2026-11-22T09:40:00.000042Z")
        #expect(Timestamp(microseconds: -1).rfc3339 == "1969-12-31T23:59:59.999999Z")
        #expect(Timestamp(microseconds: 1_795_340_400_000_042).utcDay == "2026-11-22")
    }

    @Test func parsesWhatItFormats() {
        for micros: Int64 in [0, 1, 999_999, 1_795_340_400_000_042, -1, -1_000_001, 4_102_444_799_999_999] {
            let ts = Timestamp(microseconds: micros)
            #expect(Timestamp(rfc3339: ts.rfc3339) == ts)
        }
    }

    @Test func parsesOffsetsDatesAndRejectsGarbage() {
        #expect(Timestamp(rfc3339: "2026-11-21T10:00:00+01:00") == Timestamp(rfc3339: "2026-11-21T09:00:00Z"))
        #expect(Timestamp(rfc3339: "2026-11-21") == Timestamp(rfc3339: "2026-11-21T00:00:00Z"))
        #expect(Timestamp(rfc3339: "2026-11-21T00:00:00.5Z")?.microseconds == Timestamp(rfc3339: "2026-11-21")!.microseconds + 500_000)
        for bad in ["", "yesterday", "2026-13-01", "2026-11-21T25:00:00Z", "2026-11-21T10:00:00", "2026-11-21T10:00:00Zjunk", "2026-11-21T10:00:00.Z"] {
            #expect(Timestamp(rfc3339: bad) == nil, "\(bad)")
        }
    }
}
