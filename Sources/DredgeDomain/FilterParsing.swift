import Foundation

/// Parsing of the filter syntax the command-line tools share.
extension Timestamp {
    /// The forms ``init(userInput:now:timeZone:)`` accepts, for help texts and errors.
    public static let userInputForms =
        "now, today, yesterday, a duration ago (90m, 2d, 1w), a date (2026-11-20), a time (2026-11-20T10:00 or 2026-11-20 10:00:30.5), or a time with its zone as Dredge prints them (2026-11-20 10:00:00 UTC, 2026-11-20T10:00:00Z, 2026-11-20 11:00:00 +01:00); dates and times without a zone are in the zone times are shown in (this machine's, or UTC with --utc)"

    /// Accepts `now`; `today` and `yesterday` (midnight, local time); a duration before `now`:
    /// a number with `s`, `m`, `h`, `d` or `w` (`90m`, `2d`); a date `YYYY-MM-DD` (midnight,
    /// local time); a time `YYYY-MM-DDTHH:MM[:SS[.ffffff]]` (`T` or a space) in local time; or
    /// RFC 3339 with `Z` or an offset. Only instants between 1970 and 9999; anything else
    /// (including amounts that overflow) is nil, never a trap.
    public init?(userInput raw: String, now: Timestamp = .now, timeZone: TimeZone = .current) {
        let text = raw.trimmingCharacters(in: .whitespaces)
        switch text.lowercased() {
        case "now":
            self = now
            return
        case "today", "yesterday":
            var calendar = Calendar(identifier: .gregorian)
            calendar.timeZone = timeZone
            let midnight = calendar.startOfDay(for: now.date)
            let day = text.lowercased() == "today" ? midnight : calendar.date(byAdding: .day, value: -1, to: midnight)
            guard let day else { return nil }
            self = Timestamp(day)
            return
        default: break
        }
        if let unit = text.last, let amount = Int64(text.dropLast()), amount >= 0 {
            let seconds: Int64
            switch unit {
            case "s": seconds = 1
            case "m": seconds = 60
            case "h": seconds = 3_600
            case "d": seconds = 86_400
            case "w": seconds = 604_800
            default: return nil
            }
            // Overflow is a value nobody meant (99999999d): refused, never a trap.
            let (perUnit, o1) = seconds.multipliedReportingOverflow(by: 1_000_000)
            let (ago, o2) = amount.multipliedReportingOverflow(by: perUnit)
            let (value, o3) = now.microseconds.subtractingReportingOverflow(ago)
            guard !o1, !o2, !o3, Timestamp.acceptedRange.contains(value) else { return nil }
            self = Timestamp(microseconds: value)
            return
        }
        let parsed: Timestamp?
        if let (time, offset) = Self.zoned(text) {
            parsed = TimeZone(secondsFromGMT: offset).flatMap { Self.localTime(time, timeZone: $0) }
        } else {
            parsed = Self.localTime(text, timeZone: timeZone)
        }
        guard let parsed, parsed.isAccepted else { return nil }
        self = parsed
    }

    /// A time followed by its zone, as every Dredge surface prints them and RFC 3339 writes
    /// them: `Z`, ` UTC`, or a `±HH:MM` offset (a space before it or not). The time without
    /// its zone and the offset in seconds; nil when the text names no zone after a time.
    static func zoned(_ text: String) -> (time: String, offset: Int)? {
        let b = Array(text.utf8)
        guard b.count > 16 else { return nil }  // a zone comes after a time: YYYY-MM-DDTHH:MM at least
        func trimmed(_ count: Int) -> String {
            var end = b.count - count
            if b[end - 1] == UInt8(ascii: " ") { end -= 1 }
            return String(decoding: b[..<end], as: UTF8.self)
        }
        if text.hasSuffix("Z") || text.hasSuffix("z") { return (trimmed(1), 0) }
        if text.hasSuffix(" UTC") { return (trimmed(3), 0) }
        let sign = b[b.count - 6]
        guard sign == UInt8(ascii: "+") || sign == UInt8(ascii: "-"), b[b.count - 3] == UInt8(ascii: ":") else { return nil }
        let digits = [b.count - 5, b.count - 4, b.count - 2, b.count - 1].map { b[$0] }
        guard digits.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
        let hours = Int(digits[0] - 48) * 10 + Int(digits[1] - 48), minutes = Int(digits[2] - 48) * 10 + Int(digits[3] - 48)
        guard hours <= 23, minutes <= 59 else { return nil }
        let offset = (hours * 3600 + minutes * 60) * (sign == UInt8(ascii: "-") ? -1 : 1)
        return (trimmed(6), offset)
    }

    /// How every Dredge surface prints a time for people: `2026-11-20 10:00:00 UTC` where the
    /// zone's offset is zero at that instant, `2026-11-20 11:00:00 +01:00` elsewhere, with
    /// milliseconds when asked. ``init(userInput:now:timeZone:)`` reads it back as the same
    /// instant, so a time copied from one surface means the same on another.
    public func shown(in zone: TimeZone, milliseconds: Bool = false) -> String {
        let offset = zone.secondsFromGMT(for: date)
        let (shifted, overflow) = microseconds.addingReportingOverflow(Int64(offset) * 1_000_000)
        let local = overflow ? microseconds : shifted
        var (days, rest) = local.quotientAndRemainder(dividingBy: 86_400_000_000)
        if rest < 0 {
            days -= 1
            rest += 86_400_000_000
        }
        let (year, month, day) = Self.civil(fromDays: days)
        let second = rest / 1_000_000
        func two(_ n: Int64) -> String { n < 10 ? "0\(n)" : "\(n)" }
        var text = "\(year)-\(two(Int64(month)))-\(two(Int64(day))) \(two(second / 3600)):\(two(second / 60 % 60)):\(two(second % 60))"
        if milliseconds {
            let millis = rest % 1_000_000 / 1000
            text += "." + (millis < 10 ? "00" : millis < 100 ? "0" : "") + "\(millis)"
        }
        // No offset at that instant (UTC, or London in winter): the same wall clock as UTC, said so.
        if offset == 0 { return text + " UTC" }
        let sign = offset < 0 ? "-" : "+"
        let minutes = abs(offset) / 60
        return text + " \(sign)\(two(Int64(minutes / 60))):\(two(Int64(minutes % 60)))"
    }

    /// `YYYY-MM-DD`, or with `T`/space `HH:MM`, `HH:MM:SS`, `HH:MM:SS.ffffff`, in `timeZone`.
    /// Nil for a date or time that does not exist (2026-02-30, 25:00); a local time skipped by
    /// a daylight-saving change is taken as the calendar moves it (forward by the gap).
    static func localTime(_ text: String, timeZone: TimeZone) -> Timestamp? {
        let b = Array(text.utf8)
        func digits(_ start: Int, _ count: Int) -> Int? {
            guard start + count <= b.count else { return nil }
            var value = 0
            for c in b[start..<start + count] {
                guard c >= 48, c <= 57 else { return nil }
                value = value * 10 + Int(c - 48)
            }
            return value
        }
        guard b.count >= 10, let year = digits(0, 4), b[4] == 45, let month = digits(5, 2), b[7] == 45, let day = digits(8, 2),
            (1...12).contains(month), (1...31).contains(day)
        else { return nil }
        var hour = 0, minute = 0, second = 0, micros = 0
        if b.count > 10 {
            guard b[10] == UInt8(ascii: "T") || b[10] == UInt8(ascii: "t") || b[10] == UInt8(ascii: " "), b.count >= 16, let h = digits(11, 2), b[13] == 58,
                let m = digits(14, 2), h < 24, m < 60
            else { return nil }
            (hour, minute) = (h, m)
            var i = 16
            if i < b.count {
                guard b[i] == 58, let s = digits(i + 1, 2), s < 60 else { return nil }
                second = s
                i += 3
                if i < b.count {
                    guard b[i] == 46 else { return nil }
                    i += 1
                    var scale = 100_000, n = 0
                    while i < b.count, b[i] >= 48, b[i] <= 57, n < 9 {
                        micros += Int(b[i] - 48) * scale
                        scale /= 10
                        i += 1
                        n += 1
                    }
                    guard n > 0, i == b.count else { return nil }
                }
            }
        }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let components = DateComponents(year: year, month: month, day: day, hour: hour, minute: minute, second: second)
        guard let date = calendar.date(from: components) else { return nil }
        // The calendar rolls 2026-02-30 over into March: a date that does not read back does not exist.
        let back = calendar.dateComponents([.year, .month, .day], from: date)
        guard back.year == year, back.month == month, back.day == day else { return nil }
        return Timestamp(microseconds: Int64(date.timeIntervalSince1970.rounded()) * 1_000_000 + Int64(micros))
    }
}

extension LogLevel {
    /// Parses `error`, a list `warning,error`, or a floor `warning+` (that level and above).
    public static func parseSet(_ text: String) -> Set<LogLevel>? {
        var result = Set<LogLevel>()
        for part in text.split(separator: ",") {
            if part.hasSuffix("+") {
                guard let floor = LogLevel(name: String(part.dropLast())) else { return nil }
                result.formUnion(LogLevel.allCases.filter { $0 >= floor })
            } else {
                guard let level = LogLevel(name: String(part)) else { return nil }
                result.insert(level)
            }
        }
        return result.isEmpty ? nil : result
    }
}
