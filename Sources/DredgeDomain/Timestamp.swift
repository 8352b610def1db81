#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// A point in time in microseconds since the Unix epoch, UTC.
///
/// Microseconds are what the store keeps and what the wire format carries; they order records
/// exactly and survive a round trip through RFC 3339 text without loss.
public struct Timestamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var microseconds: Int64

    public init(microseconds: Int64) { self.microseconds = microseconds }

    public init(_ date: Date) {
        self.microseconds = Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
    }

    /// The wall clock now, read with `clock_gettime(CLOCK_REALTIME)` (no Foundation allocation).
    public static var now: Timestamp {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Timestamp(microseconds: Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1_000)
    }

    public var date: Date { Date(timeIntervalSince1970: Double(microseconds) / 1_000_000) }

    public static func < (a: Timestamp, b: Timestamp) -> Bool { a.microseconds < b.microseconds }

    /// Saturates at the ends of `Int64` instead of trapping.
    public func adding(_ duration: Duration) -> Timestamp {
        let delta = duration.saturatingMicroseconds
        let (sum, overflow) = microseconds.addingReportingOverflow(delta)
        if overflow { return Timestamp(microseconds: delta < 0 ? .min : .max) }
        return Timestamp(microseconds: sum)
    }

    public func subtracting(_ duration: Duration) -> Timestamp { adding(.zero - duration) }

    /// RFC 3339 with exactly six fractional digits and a `Z` suffix, e.g.
    /// `2026-11-21T09:30:00.000042Z`. Formatted by hand: exports format one per record.
    public var rfc3339: String { withRFC3339Bytes { String(decoding: $0, as: UTF8.self) } }

    /// Calls `body` with the 27 bytes of the RFC 3339 form, without making a string. Instants
    /// outside years 0000–9999 are written as the nearest end of that range (RFC 3339 has
    /// four-digit years).
    @inlinable
    public func withRFC3339Bytes<R>(_ body: (UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        let clamped = min(max(microseconds, Self.formattableRange.lowerBound), Self.formattableRange.upperBound)
        let (days, microOfDay) = (clamped.floorDiv(86_400_000_000), clamped.floorMod(86_400_000_000))
        let (year, month, day) = Self.civil(fromDays: days)
        let seconds = Int(microOfDay / 1_000_000), micros = Int(microOfDay % 1_000_000)
        return try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 27) { out in
            func put(_ value: Int, _ at: Int, _ width: Int) {
                var v = value
                for i in stride(from: at + width - 1, through: at, by: -1) {
                    out[i] = UInt8(48 + v % 10)
                    v /= 10
                }
            }
            put(year, 0, 4); out[4] = 45; put(month, 5, 2); out[7] = 45; put(day, 8, 2); out[10] = 84
            put(seconds / 3600, 11, 2); out[13] = 58; put(seconds / 60 % 60, 14, 2); out[16] = 58; put(seconds % 60, 17, 2)
            out[19] = 46; put(micros, 20, 6); out[26] = 90
            return try body(UnsafeBufferPointer(out))
        }
    }

    /// 0000-01-01T00:00:00Z ... 9999-12-31T23:59:59.999999Z.
    @usableFromInline static let formattableRange: ClosedRange<Int64> = -62_167_219_200_000_000...253_402_300_799_999_999

    /// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar
    /// (H. Hinnant's algorithm).
    @usableFromInline static func civil(fromDays z0: Int64) -> (Int, Int, Int) {
        let z = z0 + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (Int(yoe + era * 400 + (m <= 2 ? 1 : 0)), Int(m), Int(d))
    }

    /// Whole days since the Unix epoch (UTC); equal for instants in the same UTC day.
    public var epochDay: Int64 { microseconds.floorDiv(86_400_000_000) }

    /// The UTC day this instant falls in, as `YYYY-MM-DD`.
    public var utcDay: String { String(rfc3339.prefix(10)) }

    /// Parses RFC 3339 (`Z` or a numeric offset, any number of fractional digits up to 9) or a
    /// plain `YYYY-MM-DD` (midnight UTC). Returns nil for anything else.
    public init?(rfc3339 text: String) {
        let bytes = Array(text.utf8)
        func digits(_ start: Int, _ count: Int) -> Int? {
            guard start + count <= bytes.count else { return nil }
            var value = 0
            for b in bytes[start..<start + count] {
                guard b >= 48, b <= 57 else { return nil }
                value = value * 10 + Int(b - 48)
            }
            return value
        }
        guard let year = digits(0, 4), bytes.count >= 10, bytes[4] == 45, let month = digits(5, 2),
            bytes[7] == 45, let day = digits(8, 2), (1...12).contains(month), (1...31).contains(day)
        else { return nil }
        var hour = 0, minute = 0, second = 0, micros = 0, offsetSeconds = 0
        if bytes.count > 10 {
            guard bytes[10] == 84 || bytes[10] == 116 || bytes[10] == 32, let h = digits(11, 2),
                bytes.count > 13, bytes[13] == 58, let m = digits(14, 2), bytes.count > 16,
                bytes[16] == 58, let s = digits(17, 2), h < 24, m < 60, s < 61
            else { return nil }
            hour = h; minute = m; second = s
            var i = 19
            if i < bytes.count, bytes[i] == 46 {
                i += 1
                var scale = 100_000, n = 0
                while i < bytes.count, bytes[i] >= 48, bytes[i] <= 57 {
                    micros += Int(bytes[i] - 48) * scale
                    scale /= 10; i += 1; n += 1
                }
                guard n > 0, n <= 9 else { return nil }
            }
            guard i < bytes.count else { return nil }
            if bytes[i] == 90 || bytes[i] == 122 {
                guard i + 1 == bytes.count else { return nil }
            } else if bytes[i] == 43 || bytes[i] == 45, let oh = digits(i + 1, 2), i + 3 < bytes.count,
                bytes[i + 3] == 58, let om = digits(i + 4, 2), i + 6 == bytes.count {
                offsetSeconds = (oh * 3600 + om * 60) * (bytes[i] == 43 ? 1 : -1)
            } else {
                return nil
            }
        }
        var parts = tm()
        parts.tm_year = Int32(year - 1900); parts.tm_mon = Int32(month - 1); parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(hour); parts.tm_min = Int32(minute); parts.tm_sec = Int32(second)
        let epoch = Int64(timegm(&parts)) - Int64(offsetSeconds)
        self.microseconds = epoch * 1_000_000 + Int64(micros)
    }

    public var description: String { rfc3339 }
}

extension Int64 {
    /// Floor division without overflow for any `self` (`d` > 0).
    @usableFromInline func floorDiv(_ d: Int64) -> Int64 {
        let q = self / d
        return (self % d != 0 && self < 0) ? q - 1 : q
    }
    @usableFromInline func floorMod(_ d: Int64) -> Int64 { self - floorDiv(d) * d }
}

extension Timestamp: Codable {
    /// Microseconds since the epoch, as a JSON number.
    public init(from decoder: any Decoder) throws {
        self.init(microseconds: try decoder.singleValueContainer().decode(Int64.self))
    }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(microseconds)
    }
}

extension Duration {
    /// Whole microseconds, saturating at the ends of `Int64` instead of trapping (a retention
    /// age or a deadline of `.seconds(.max)` means "never").
    public var saturatingMicroseconds: Int64 {
        let (seconds, attoseconds) = components
        let (whole, o1) = seconds.multipliedReportingOverflow(by: 1_000_000)
        let (sum, o2) = whole.addingReportingOverflow(attoseconds / 1_000_000_000_000)
        return o1 || o2 ? (seconds < 0 ? .min : .max) : sum
    }
}
