/// Parsing of the filter syntax the command-line tools share.
extension Timestamp {
    /// Accepts RFC 3339 (`2026-11-21T09:30:00Z`), a date (`2026-11-21`, midnight UTC), `now`, or
    /// a duration before `now`: a number with `s`, `m`, `h`, `d` or `w` (`90m`, `2d`).
    public init?(userInput text: String, now: Timestamp = .now) {
        if text == "now" {
            self = now
            return
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
        guard let parsed = Timestamp(rfc3339: text), parsed.isAccepted else { return nil }
        self = parsed
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
