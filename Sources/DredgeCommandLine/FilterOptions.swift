import ArgumentParser
import Foundation
import DredgeDomain

/// The record filter flags, shared by `dredge-agent query`, `dredge-server pull` and
/// `dredge pull`.
public struct FilterOptions: ParsableArguments {
    @Option(help: "Only this user's records.")
    public var uid: String?

    @Option(help: "From this time: 2d, 90m, today, yesterday, 2026-11-20, 2026-11-20T10:00 (local time), or with a zone as Dredge prints times (2026-11-20 10:00:00 UTC, … +01:00, …Z).")
    public var since: String?

    @Option(help: "Before this time; the same forms as --since.")
    public var until: String?

    @Option(name: .customLong("type"), help: "Log types; repeatable or comma-separated.")
    public var types: [String] = []

    @Option(name: .customLong("level"), help: "Levels: 'error', 'warning,error' or 'warning+' (and above); repeatable.")
    public var levels: [String] = []

    @Option(help: "A literal substring of the message or of the metadata as JSON (keys and punctuation too); ASCII letters in any case. Matched on the device.")
    public var grep: String?

    public init() {}

    public func filter() throws -> LogFilter {
        var filter = LogFilter(uid: uid, text: grep)
        filter.since = try since.map { try Self.time($0, flag: "--since") }
        filter.until = try until.map { try Self.time($0, flag: "--until") }
        if let since = filter.since, let until = filter.until, until <= since {
            throw ValidationError("--until must be after --since")
        }
        if let uid, let problem = UserID.problem(uid) { throw ValidationError("--uid: \(problem)") }
        if let problem = filter.problem { throw ValidationError(problem) }
        if !types.isEmpty { filter.types = try Self.types(types) }
        if !levels.isEmpty { filter.levels = try Self.levels(levels) }
        return filter
    }

    // The flags' parsing, for every command that takes them (`dredge logs` too).

    /// A time flag's value in ``Timestamp/init(userInput:now:timeZone:)``'s forms.
    public static func time(_ text: String, flag: String, now: Timestamp = .now, timeZone: TimeZone = .current) throws -> Timestamp {
        guard let t = Timestamp(userInput: text, now: now, timeZone: timeZone) else {
            throw ValidationError("cannot read \(flag) '\(text)': give \(Timestamp.userInputForms), between 1970 and 9999")
        }
        return t
    }

    /// `--type` values: repeatable, each comma-separated.
    public static func types(_ texts: [String]) throws -> Set<LogType> {
        var set = Set<LogType>()
        for name in texts.flatMap({ $0.split(separator: ",") }) {
            guard let type = LogType(String(name)) else {
                throw ValidationError("invalid log type '\(name)': a type is lowercase letters, digits, '.', '-' and '_', at most \(LogType.maxLength) bytes (app, network, business, player, system, or your own)")
            }
            set.insert(type)
        }
        return set
    }

    /// `--level` values: repeatable, each a name, a list or a floor.
    public static func levels(_ texts: [String]) throws -> Set<LogLevel> {
        var set = Set<LogLevel>()
        for text in texts {
            guard let parsed = LogLevel.parseSet(text) else {
                throw ValidationError("cannot read --level '\(text)': give \(LogLevel.allCases.map(\.name).joined(separator: ", ")), a list (warning,error) or a floor (warning+)")
            }
            set.formUnion(parsed)
        }
        return set
    }

    public func validate() throws { _ = try filter() }
}
