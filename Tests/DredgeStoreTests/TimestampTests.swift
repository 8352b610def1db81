import Foundation
import DredgeDomain
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

/// Values from outside never trap: every Int64 formats, durations saturate, and user input that
/// would overflow or leave 1970–9999 is refused (`dredge pull --since 99999999d` once crashed).
@Suite struct TimestampBoundsTests {
    @Test func everyInt64FormatsWithoutTrapping() {
        #expect(Timestamp(microseconds: .min).rfc3339 == "0000-01-01T00:00:00.000000Z")
        #expect(Timestamp(microseconds: .max).rfc3339 == "9999-12-31T23:59:59.999999Z")
        #expect(Timestamp(microseconds: -1).rfc3339 == "1969-12-31T23:59:59.999999Z")
        #expect(Timestamp(microseconds: .min).utcDay == "0000-01-01")
        _ = Timestamp(microseconds: .min).epochDay
    }

    @Test func arithmeticSaturates() {
        #expect(Timestamp(microseconds: .max - 5).adding(.seconds(1)).microseconds == .max)
        #expect(Timestamp(microseconds: .min + 5).subtracting(.seconds(1)).microseconds == .min)
        #expect(Timestamp(microseconds: 0).adding(.seconds(Int64.max)).microseconds == .max)
    }

    @Test func userInputOutOfRangeIsRefused() {
        let now = Timestamp(rfc3339: "2026-11-21T10:00:00Z")!
        #expect(Timestamp(userInput: "99999999d", now: now) == nil)
        #expect(Timestamp(userInput: "9223372036854775807s", now: now) == nil)
        #expect(Timestamp(userInput: "60000w", now: now) == nil)  // before 1970
        #expect(Timestamp(userInput: "0000-01-01", now: now) == nil)
        #expect(Timestamp(userInput: "2d", now: now) == now.subtracting(.seconds(2 * 86_400)))
        #expect(LogFilter(since: Timestamp(microseconds: .min)).problem != nil)
        #expect(LogFilter(until: Timestamp(microseconds: .max)).problem != nil)
        #expect(LogFilter(since: now, until: now.adding(.seconds(1))).problem == nil)
    }

    @Test func userInputTakesLocalDaysAndTimesAndZones() throws {
        let berlin = try #require(TimeZone(identifier: "Europe/Berlin"))
        let now = Timestamp(rfc3339: "2026-11-21T00:30:00Z")!  // 01:30 on the 21st in Berlin
        func t(_ text: String) -> Timestamp? { Timestamp(userInput: text, now: now, timeZone: berlin) }
        #expect(t("today") == Timestamp(rfc3339: "2026-11-20T23:00:00Z"))
        #expect(t("Yesterday") == Timestamp(rfc3339: "2026-11-19T23:00:00Z"))
        #expect(t("now") == now)
        #expect(t("2026-11-20") == Timestamp(rfc3339: "2026-11-19T23:00:00Z"), "a date is local midnight")
        #expect(t("2026-11-20T10:00") == Timestamp(rfc3339: "2026-11-20T09:00:00Z"))
        #expect(t("2026-11-20 10:00:30") == Timestamp(rfc3339: "2026-11-20T09:00:30Z"))
        #expect(t("2026-11-20T10:00:30.25") == Timestamp(rfc3339: "2026-11-20T09:00:30.25Z"))
        #expect(t("2026-07-01T10:00") == Timestamp(rfc3339: "2026-07-01T08:00:00Z"), "summer time")
        #expect(t("2026-11-20T10:00:00Z") == Timestamp(rfc3339: "2026-11-20T10:00:00Z"), "a zone given is kept")
        #expect(t("2026-11-20T10:00:00+05:00") == Timestamp(rfc3339: "2026-11-20T05:00:00Z"))
        #expect(t("90m") == now.subtracting(.seconds(5_400)))
        for bad in ["2026-02-30", "2026-11-20T25:00", "2026-11-20T10", "2026-11-20T10:00:61", "2026-11-20T10:00:00.", "tomorrow", "2d ago", "", "1e3d", "-2d"] {
            #expect(t(bad) == nil, "\(bad)")
        }
    }

    /// #50: one rule for times on every surface. Each prints a time with its zone
    /// (`shown(in:)`), and each reads what any prints back as the same instant, whatever zone
    /// the reader is in.
    @Test func aPrintedTimeReadsBackAsTheSameInstantInAnyZone() throws {
        let berlin = try #require(TimeZone(identifier: "Europe/Berlin")), kolkata = try #require(TimeZone(identifier: "Asia/Kolkata"))
        let utc = try #require(TimeZone(identifier: "UTC")), newYork = try #require(TimeZone(identifier: "America/New_York"))
        let instant = Timestamp(rfc3339: "2026-11-20T09:00:30.25Z")!
        #expect(instant.shown(in: utc) == "2026-11-20 09:00:30 UTC")
        #expect(instant.shown(in: utc, milliseconds: true) == "2026-11-20 09:00:30.250 UTC")
        #expect(instant.shown(in: berlin) == "2026-11-20 10:00:30 +01:00")
        #expect(instant.shown(in: kolkata) == "2026-11-20 14:30:30 +05:30")
        #expect(instant.shown(in: newYork) == "2026-11-20 04:00:30 -05:00")
        #expect(Timestamp(rfc3339: "2026-07-01T09:00:00Z")!.shown(in: berlin) == "2026-07-01 11:00:00 +02:00", "the offset at that instant")
        #expect(Timestamp(rfc3339: "1999-12-31T23:59:59.999Z")!.shown(in: utc, milliseconds: true) == "1999-12-31 23:59:59.999 UTC")
        for shownIn in [utc, berlin, kolkata, newYork] {
            for readIn in [utc, berlin, kolkata, newYork] {
                let back = Timestamp(userInput: instant.shown(in: shownIn, milliseconds: true), timeZone: readIn)
                #expect(back == instant, "shown in \(shownIn.identifier), read in \(readIn.identifier)")
            }
        }
        func t(_ text: String) -> Timestamp? { Timestamp(userInput: text, timeZone: kolkata) }
        #expect(t("2026-11-20 09:00:30Z") == Timestamp(rfc3339: "2026-11-20T09:00:30Z"))
        #expect(t("2026-11-20T10:00+01:00") == Timestamp(rfc3339: "2026-11-20T09:00:00Z"), "minutes and an offset")
        #expect(t("2026-11-20 10:00:00 UTC") == Timestamp(rfc3339: "2026-11-20T10:00:00Z"))
        for bad in ["2026-11-20 10:00:00 +25:00", "2026-11-20 10:00:00 +01:0x", "2026-11-20 UTC", "2026-11-20 10:00:00 CET", "2026-11-20 10:00:00  UTC"] {
            #expect(t(bad) == nil, "\(bad)")
        }
    }

    @Test func uidsWithControlCharactersAreInvalid() {
        for bad in ["", "u-1\u{0}x", "u\n1", "u\u{7F}", "u\u{85}", String(repeating: "x", count: 257)] {
            #expect(UserID.problem(bad) != nil, "\(bad.debugDescription)")
        }
        for good in ["u-1", "42", "élodie@example.com", String(repeating: "x", count: 256)] {
            #expect(UserID.problem(good) == nil, "\(good)")
        }
    }
}
