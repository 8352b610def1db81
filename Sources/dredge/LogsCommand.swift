import ArgumentParser
import DredgeAdminAPI
import DredgeCommandLine
import DredgeDomain
import DredgeWire
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `dredge logs`: reads across everything the server has received, pulls and feedback, as one
/// timeline across devices, with the host and app on each line.
struct LogsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "logs",
        abstract: "Read and search the records of every pull and feedback: one timeline across devices.",
        discussion: """
            Every filter narrows the result. Lines show each time with its zone (this machine's,
            or UTC with --utc), and times given without a zone are read in that same zone; a time
            copied from any Dredge output or the console, zone included, means the same instant. --words matches whole words in the message and the
            metadata, any case and accents ignored, all of them: `--words 'timeout "connection
            refused" auth*'`. It is not a substring: `auth` does not find `authentication` (say
            `auth*`). (`dredge pull --grep` is a substring, matched on the device.)
            --where matches a top-level metadata member exactly: `--where status=503`.

            Examples:
              dredge logs --uid u-1002 --since yesterday --level warning+
              dredge logs --uid u-1002 --around 2026-11-20T10:02 --window 2m
              dredge logs --pull 3f2c… --format jsonl | jq .message
            """)

    @OptionGroup var server: ServerOptions

    @Option(help: "Only this user's records.") var uid: String?
    @Option(help: "Only this agent's records (an id or its first 4+ characters); repeatable.") var agent: [String] = []
    @Option(help: "Only records from this host (as the server registered the uploading agent); repeatable.") var host: [String] = []
    @Option(help: "Only records from this app; repeatable.") var app: [String] = []
    @Option(help: "Only the records of this pull (an id or its first 4+ characters).") var pull: String?
    @Option(help: "Only the records of this feedback (an id or its first 4+ characters).") var feedback: String?
    @Option(help: "Only the records of this capture of a trigger (an id or its first 4+ characters; `dredge triggers show` lists them).") var capture: String?
    @Option(help: "From this time: 2d, 90m, today, yesterday, 2026-11-20, 2026-11-20T10:00 (local time; UTC with --utc), or with a zone as Dredge prints times (2026-11-20 10:00:00 UTC, … +01:00, …Z).") var since: String?
    @Option(help: "Before this time; the same forms as --since.") var until: String?
    @Option(help: "Records around this time (the same forms as --since), --window either side.") var around: String?
    @Option(help: "With --around: how far either side (30s, 5m, 1h).") var window = "5m"
    @Option(name: .customLong("level"), help: "Levels: 'error', 'warning,error' or 'warning+' (and above); repeatable.") var levels: [String] = []
    @Option(name: .customLong("type"), help: "Log types; repeatable or comma-separated.") var types: [String] = []
    @Option(help: "Whole words in the message or metadata, all of them; any case, accents ignored; \"a phrase\"; word* for a prefix. Not a substring.") var words: String?
    /// The flag's name before it was `--words`: kept for scripts, with a warning (`pull --grep` is a substring).
    @Option(help: .hidden) var grep: String?
    @Option(name: .customLong("where"), help: "A metadata member's value: key=value (status=503, event=userLoggedIn); repeatable.") var matches: [String] = []
    @Option(help: "Why (a ticket number, say): recorded in the audit log with the search.") var reason: String?
    @Option(help: "text, json or jsonl.") var format: OutputFormat = .text
    @Option(help: "At most this many records (0: all).") var limit = 10_000
    @Option(help: "Only the latest N records that match, oldest first (with --follow: then those that arrive), as the console's \"Latest\".") var tail: Int?
    @Flag(help: "Newest first.") var reverse = false
    @Flag(help: "After the records there are, print those that arrive (pulls and feedback landing), until interrupted.") var follow = false
    @Flag(help: "Show times in UTC, and read --since, --until and --around without a zone as UTC (default: this machine's zone, TZ).") var utc = false

    /// The zone times are shown in and read in when they name none.
    var zone: TimeZone { utc ? TimeZone(identifier: "UTC") ?? .gmt : .current }
    @Option(help: "Colour: auto (on a terminal), always, never.") var color: ColorChoice = .auto

    enum OutputFormat: String, ExpressibleByArgument, CaseIterable { case text, json, jsonl }
    enum ColorChoice: String, ExpressibleByArgument, CaseIterable { case auto, always, never }

    func validate() throws { _ = try search() }

    /// The flags as a search.
    func search(now: Timestamp = .now) throws -> RecordSearch {
        var search = RecordSearch()
        if let uid {
            if let problem = UserID.problem(uid) { throw ValidationError("--uid: \(problem)") }
            search.uid = uid
        }
        for id in agent { try IDPrefix.validate(id, flag: "--agent") }
        search.agents = agent.isEmpty ? nil : agent
        search.hosts = host.isEmpty ? nil : host
        search.apps = app.isEmpty ? nil : app
        if let pull {
            try IDPrefix.validate(pull, flag: "--pull")
            search.pull = pull
        }
        if let feedback {
            try IDPrefix.validate(feedback, flag: "--feedback")
            search.feedback = feedback
        }
        if let capture {
            try IDPrefix.validate(capture, flag: "--capture")
            search.capture = capture
        }
        if let around {
            guard since == nil, until == nil else { throw ValidationError("give --around or --since/--until, not both") }
            guard let unit = window.last, let amount = Int64(window.dropLast()), amount > 0,
                let perUnit: Int64 = ["s": 1, "m": 60, "h": 3_600, "d": 86_400][String(unit)], amount <= 366 * 86_400 / perUnit
            else { throw ValidationError("cannot read --window '\(window)': give a duration of up to a year, like 30s, 5m, 2h or 1d") }
            let center = try FilterOptions.time(around, flag: "--around", now: now, timeZone: zone)
            let half = amount * perUnit * 1_000_000
            search.since = Timestamp(microseconds: center.microseconds - half)
            search.until = Timestamp(microseconds: center.microseconds + half + 1)
        } else {
            search.since = try since.map { try FilterOptions.time($0, flag: "--since", now: now, timeZone: zone) }
            search.until = try until.map { try FilterOptions.time($0, flag: "--until", now: now, timeZone: zone) }
            if let s = search.since, let u = search.until, u <= s { throw ValidationError("--until must be after --since") }
        }
        if !levels.isEmpty { search.levels = try FilterOptions.levels(levels).sorted().map(\.name) }
        if !types.isEmpty { search.types = try FilterOptions.types(types).map(\.rawValue).sorted() }
        if words != nil && grep != nil { throw ValidationError("--grep is the old name of --words: give one") }
        if let text = words ?? grep {
            let flag = words != nil ? "--words" : "--grep"
            guard SearchTerms.hasWord(text) else { throw ValidationError("\(flag) '\(text)' has no word to search for") }
            search.text = text
        }
        var metadata: [MetadataMatch] = []
        for text in matches {
            guard let match = MetadataMatch(parsing: text) else { throw ValidationError("cannot read --where '\(text)': give key=value, like status=503") }
            metadata.append(match)
        }
        search.metadata = metadata.isEmpty ? nil : metadata
        guard limit >= 0 else { throw ValidationError("--limit must be 0 (all) or more") }
        if let reason {
            if let problem = reasonProblem(reason) { throw ValidationError("--reason: \(problem)") }
            search.reason = reason
        }
        if follow && format == .json { throw ValidationError("--follow prints records as they come: use --format text or jsonl") }
        if let tail, tail < 1 || tail > 1_000_000 { throw ValidationError("--tail takes a number of records from 1 to 1000000") }
        if reverse && follow { throw ValidationError("--reverse prints the newest first; --follow prints records as they come: give one of them") }
        return search
    }

    func run() async throws {
        if grep != nil { note("`dredge logs --grep` is now `--words`: it matches whole words, not a substring as `dredge pull --grep` does") }
        let client = try server.client()
        var search = try search()
        // Prefixes become whole ids (the server takes whole ids only).
        if let agents = search.agents {
            var whole: [String] = []
            for agent in agents { whole.append(try await client.resolveAgent(agent)) }
            search.agents = whole
        }
        if let pull = search.pull { search.pull = try await client.resolvePull(pull) }
        if let feedback = search.feedback { search.feedback = try await client.resolveFeedback(feedback) }
        if let capture = search.capture { search.capture = try await client.resolveCapture(capture) }
        let printer = RecordPrinter(format: format, utc: utc, color: color == .always || (color == .auto && isatty(1) == 1 && ProcessInfo.processInfo.environment["NO_COLOR"] == nil))
        var printed = 0
        var newest: Int64?
        // Records that arrived while the listing ran and were listed: a follow does not print them again.
        var listedArrivals = Set<Int64>()
        var more = false
        var indexing = 0
        printer.begin()
        if tail != nil || reverse {
            // From the newest back: pages read with `before`, each handed out in time order.
            let want = tail ?? (limit > 0 ? limit : Int.max)
            search.before = "\(Int64.max).0"
            var newestFirst: [FoundRecord] = []
            var collected = 0
            while collected < want {
                search.limit = min(RecordSearch.maximumLimit, want - collected)
                let page = try await calling { try await client.search(search) }
                indexing = page.indexing
                if newest == nil { newest = page.newestID }
                collected += page.records.count
                if let newest { for record in page.records where record.id > newest { listedArrivals.insert(record.id) } }
                if reverse {
                    for record in page.records.reversed() { printer.print(record) }
                } else {
                    newestFirst += page.records.reversed()
                }
                guard let previous = page.previous, !page.records.isEmpty else { break }
                if collected >= want {
                    more = tail == nil
                    break
                }
                search.before = previous
            }
            for record in newestFirst.reversed() { printer.print(record) }
            printed = collected
            search.before = nil
        } else {
            pages: while true {
                search.limit = limit > 0 ? min(RecordSearch.maximumLimit, limit - printed) : RecordSearch.maximumLimit
                let page = try await calling { try await client.search(search) }
                indexing = page.indexing
                // Following starts after what the index held when the listing began.
                if newest == nil { newest = page.newestID }
                for record in page.records {
                    if limit > 0 && printed == limit {
                        more = true
                        break pages
                    }
                    printer.print(record)
                    printed += 1
                    if let newest, record.id > newest { listedArrivals.insert(record.id) }
                }
                guard let next = page.next else { break }
                if limit > 0 && printed == limit {
                    more = true
                    break
                }
                search.after = next
            }
        }
        if !follow { printer.end() }
        if more {
            note("more records match; showing the \(reverse ? "newest" : "first") \(limit) (--limit 0 for all, or narrow the search)")
        }
        if indexing > 0 && !follow {
            note("\(indexing) pull(s) or feedback still being indexed: records may be missing; run again, or add --follow")
        }
        if printed == 0 {
            // A type, host or app no record has is most likely a typo: say so, with the known ones.
            if search.types != nil || search.hosts != nil || search.apps != nil,
                let vocabulary = try? await client.vocabulary()  // only a hint: its failure changes nothing
            {
                for unknown in vocabulary.unknown(in: search) { note("--\(unknown.field) \(Terminal.field(unknown.value)): \(Terminal.field(unknown.description))") }
            }
        }
        if printed == 0 && !follow {
            note("no records match")
            // Words match whole: say when they would match as prefixes (`auth` in `authentication`).
            if let text = search.text, !text.contains("\""), !text.contains("*") {
                var prefixed = search
                prefixed.text = text.split(separator: " ").map { $0 + "*" }.joined(separator: " ")
                (prefixed.after, prefixed.before, prefixed.limit) = (nil, nil, 1)
                if let page = try? await client.search(prefixed), !page.records.isEmpty {  // only a hint: its failure changes nothing
                    note("words match whole, and some records have words that start with these: --words '\(prefixed.text ?? "")'")
                }
            }
        }
        guard follow else { return }
        search.after = nil
        search.limit = RecordSearch.maximumLimit
        var lastID = newest ?? 0
        while true {
            search.arrivedAfter = lastID
            let page = try await calling { try await client.search(search) }
            for record in page.records {
                if listedArrivals.remove(record.id) == nil { printer.print(record) }
                lastID = max(lastID, record.id)
            }
            // Nothing new that matches: nothing before the newest record needs reading again.
            if page.records.isEmpty { lastID = max(lastID, page.newestID) }
            if page.next == nil { try await Task.sleep(for: .seconds(1)) }
        }
    }

    private func note(_ text: String) { Terminal.error("dredge: \(text)\n") }
}

/// Whether a `--words` text holds anything to search for (the server's rule).
enum SearchTerms {
    static func hasWord(_ text: String) -> Bool { text.contains { $0.isLetter || $0.isNumber } }
}

/// Prints found records: one line each (text), a JSON array (json) or one object per line (jsonl).
final class RecordPrinter {
    let format: LogsCommand.OutputFormat
    let utc: Bool
    let color: Bool
    private var first = true
    private let encoder: JSONEncoder
    /// The zone text lines show times in, each with its offset (as every surface prints them).
    private let zone: TimeZone

    init(format: LogsCommand.OutputFormat, utc: Bool, color: Bool) {
        self.format = format
        self.utc = utc
        self.color = color
        encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        zone = utc ? TimeZone(identifier: "UTC") ?? .gmt : .current
    }

    /// A record as `--format json`/`jsonl` writes it: the payload's members, the time in
    /// RFC 3339, and where it came from.
    struct Line: Encodable {
        var ts: String
        var level: String
        var type: String
        var uid: String
        var message: String
        var metadata: JSONValue
        var agent: String
        var host: String
        var app: String
        var appVersion: String
        var source: String
        var sourceID: String
        var claimedHost: String?

        enum CodingKeys: String, CodingKey {
            case ts, level, type, uid, message, metadata, agent, host, app, source
            case appVersion = "app_version", sourceID = "source_id", claimedHost = "claimed_host"
        }
    }

    func begin() { if format == .json { write("[") } }

    func end() { if format == .json { write(first ? "]\n" : "\n]\n") } }

    func print(_ r: FoundRecord) {
        switch format {
        case .json, .jsonl:
            let line = Line(
                ts: r.ts.rfc3339, level: r.level, type: r.type, uid: r.uid, message: r.message, metadata: r.metadata.value, agent: r.agentID, host: r.host, app: r.app,
                appVersion: r.appVersion, source: r.sourceKind, sourceID: r.sourceID, claimedHost: r.claimedHost)
            let json = (try? encoder.encode(line)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"  // encoding strings and a JSONValue does not fail
            if format == .jsonl {
                write(json + "\n")
            } else {
                write((first ? "\n  " : ",\n  ") + json)
            }
        case .text:
            write(text(r) + "\n")
        }
        first = false
    }

    /// A record on one line. Everything in it but the time and level came from a device: each
    /// piece is made harmless (``Terminal/field(_:)``: control characters, line breaks
    /// included, escaped) before the colours are added.
    func text(_ r: FoundRecord) -> String {
        let time = r.ts.shown(in: zone, milliseconds: true)
        let level = Terminal.field(r.level.uppercased()).padding(toLength: 8, withPad: " ", startingAt: 0)
        let (host, app, type) = (Terminal.field(r.hostShown), Terminal.field(r.appShown), Terminal.field(r.type))
        var metadata = ""
        if case .object(let members) = r.metadata.value, !members.isEmpty {
            metadata = "  " + members.sorted { $0.key < $1.key }.map { key, member in
                let value: String
                if case .string(let s) = member { value = Terminal.field(s.contains(" ") ? s.debugDescription : s) } else { value = Terminal.field(member.jsonText) }
                return "\(Terminal.field(key))=\(value)"
            }.joined(separator: " ")
        }
        let uid = r.uid.isEmpty ? "-" : Terminal.field(r.uid)
        let message = Terminal.field(r.message.replacingOccurrences(of: "\n", with: "⏎"))
        guard color else { return "\(time)  \(host)  \(app)  \(level) \(type)  \(uid)  \(message)\(metadata)" }
        let paint: String
        switch r.level {
        case "critical", "error": paint = "\u{1B}[31m"
        case "warning": paint = "\u{1B}[33m"
        case "notice": paint = "\u{1B}[36m"
        case "debug", "trace": paint = "\u{1B}[2m"
        default: paint = ""
        }
        let dim = "\u{1B}[2m", reset = "\u{1B}[0m"
        return "\(dim)\(time)\(reset)  \(host)  \(app)  \(paint)\(level)\(reset) \(type)  \(uid)  \(paint)\(message)\(reset)\(dim)\(metadata)\(reset)"
    }

    private func write(_ text: String) { FileHandle.standardOutput.write(Data(text.utf8)) }
}
