import Foundation

extension LogLevel {
    /// The level a plain log line states, if it states one (for `dredge-agent ingest`):
    ///
    /// - a syslog priority at the start, `<PRI>` (severity PRI mod 8: 0–2 critical, 3 error,
    ///   4 warning, 5 notice, 6 info, 7 debug);
    /// - a JSON object with a string `level`, `severity` or `lvl`;
    /// - a logfmt pair `level=…`, `lvl=…` or `severity=…`;
    /// - among the first 8 words, a level word in capitals (`ERROR`, `WARN`, `W`-less forms such
    ///   as `ERR`, `FATAL`, `SEVERE`…), or in any case when bracketed or followed by a colon
    ///   (`[warn]`, `error:`).
    ///
    /// Nil when none is found (the caller's default applies). Only the first 512 bytes are read.
    public static func detected(inLine line: String) -> LogLevel? {
        let head = String(line.utf8.prefix(512)) ?? String(line.prefix(128))
        if head.hasPrefix("<"), let close = head.firstIndex(of: ">"), close > head.index(after: head.startIndex),
            let priority = Int(head[head.index(after: head.startIndex)..<close]), (0...191).contains(priority)
        {
            return syslogSeverity(priority % 8)
        }
        if head.hasPrefix("{"),
            let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8.prefix(64 << 10)))) as? [String: Any]  // not JSON: a plain line
        {
            for key in ["level", "severity", "lvl"] {
                if let name = object[key] as? String, let level = word(name) { return level }
            }
        }
        let words = head.split(whereSeparator: { $0 == " " || $0 == "\t" })
        for raw in words {
            let lowered = raw.lowercased()
            for key in ["level=", "lvl=", "severity="] where lowered.hasPrefix(key) {
                let value = lowered.dropFirst(key.count).trimmingCharacters(in: CharacterSet(charactersIn: "\"'"))
                if let level = word(value) { return level }
            }
        }
        for raw in words.prefix(8) {
            let marked = raw.hasPrefix("[") || raw.hasPrefix("<") || raw.hasSuffix(":") || raw.hasSuffix("]")
            let bare = raw.trimmingCharacters(in: CharacterSet(charactersIn: "[]<>():|,"))
            guard !bare.isEmpty, let level = word(bare) else { continue }
            if marked || bare == bare.uppercased() { return level }
        }
        return nil
    }

    private static func word(_ text: String) -> LogLevel? {
        switch text.lowercased() {
        case "trace", "trc", "finest", "finer": .trace
        case "debug", "dbg", "fine": .debug
        case "info", "inf", "information", "informational": .info
        case "notice": .notice
        case "warn", "warning", "wrn": .warning
        case "error", "err", "eror": .error
        case "critical", "crit", "fatal", "severe", "panic", "emerg", "emergency", "alert": .critical
        default: nil
        }
    }

    private static func syslogSeverity(_ severity: Int) -> LogLevel {
        switch severity {
        case 0, 1, 2: .critical
        case 3: .error
        case 4: .warning
        case 5: .notice
        case 6: .info
        default: .debug
        }
    }
}
