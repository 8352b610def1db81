import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Hummingbird
import Mustache

/// The console's log viewer: one merged timeline of what arrived (a pull's, a feedback's, or
/// a user's across everything pulled), filtered by device, app, level, type, text, a metadata
/// member and time, a page at a time in either direction — what `dredge logs` shows. Every search is
/// audited as `records.search` under the session's token, as on the API.
extension Console {
    static let logsPageSize = 200

    /// The viewer's query string as a search; nil search with the problem when a field is wrong.
    static func logSearch(_ parameters: [String: String]) -> (RecordSearch?, String?) {
        func field(_ name: String) -> String? {
            let value = (parameters[name] ?? "").trimmingCharacters(in: .whitespaces)
            return value.isEmpty ? nil : value
        }
        var search = RecordSearch(limit: logsPageSize)
        search.uid = field("uid")
        if let uid = search.uid, let problem = UserID.problem(uid) { return (nil, "uid: \(problem)") }
        for name in ["pull", "feedback", "capture"] {
            if let id = field(name), !WireID.isValid(id) { return (nil, "\(name) must be an id: 32 lowercase hex characters") }
        }
        search.pull = field("pull")
        search.feedback = field("feedback")
        search.capture = field("capture")
        if let level = field("level") {
            guard let levels = LogLevel.parseSet(level) else {
                return (nil, "level is one of \(LogLevel.allCases.map(\.name).joined(separator: ", ")), or one with + (warning+: warning and above)")
            }
            search.levels = levels.sorted { $0.rawValue < $1.rawValue }.map(\.name)
        }
        if let type = field("type") {
            guard LogType(type) != nil else { return (nil, "type “\(type)” is not a log type (app, network, …)") }
            search.types = [type]
        }
        if let host = field("host") { search.hosts = [host] }
        if let app = field("app") { search.apps = [app] }
        search.text = field("text")
        if let match = field("where") {
            guard let parsed = MetadataMatch(parsing: match) else { return (nil, "a metadata match is key=value, e.g. http.status=503") }
            search.metadata = [parsed]
        }
        for name in ["since", "until"] {
            guard let text = field(name) else { continue }
            guard let time = timeInput(text) else { return (nil, timeInputProblem(name)) }
            if name == "since" { search.since = time } else { search.until = time }
        }
        for name in ["after", "before"] {
            guard let cursor = field(name) else { continue }
            guard isCursor(cursor) else { return (nil, "\(name) must be a page cursor, as the page links give it") }
            if name == "after" { search.after = cursor } else { search.before = cursor }
        }
        if search.after != nil && search.before != nil { return (nil, "give after or before, not both") }
        return (search, nil)
    }

    /// `<µs>.<id>`: digits (a leading `-` on the id only), at most 19 of each.
    static func isCursor(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2 else { return false }
        let id = parts[1].hasPrefix("-") ? parts[1].dropFirst() : parts[1]
        return [parts[0], id].allSatisfy { !$0.isEmpty && $0.count <= 19 && $0.allSatisfy { $0.isASCII && $0.isNumber } }
    }

    /// The viewer at a moment: the records of `filter` just before it (read backwards), then on.
    static func logsAt(_ time: Timestamp, _ filter: (name: String, value: String)) -> String {
        url("/console/logs", [filter, ("before", "\(time.microseconds).0")])
    }

    /// What a time field that ``timeInput(_:now:)`` refuses is told.
    static func timeInputProblem(_ name: String) -> String {
        "\(name) must be a time, 1970–9999: 2d, 90m, today, yesterday, 2026-11-20, 2026-11-20 10:00 (in the zone the console shows), or with a zone as Dredge prints times (2026-11-20 10:00:00 UTC, … +01:00)"
    }

    /// A time field's text in the CLI's vocabulary (``Timestamp/init(userInput:now:timeZone:)``):
    /// `2d`, `yesterday`, a date or a time in the zone the console shows times in, or any time
    /// with its zone as Dredge prints them; nil otherwise. What the new-pull form's and the log
    /// viewer's time fields take.
    static func timeInput(_ text: String, now: Timestamp = .now) -> Timestamp? {
        Timestamp(userInput: text, now: now, timeZone: displayZone)
    }

    /// Runs of records with the same message, level, type, user, host and app (their metadata
    /// may differ), each as its first record, how many it stands for, and their ids.
    static func repeatsGrouped(_ records: [FoundRecord]) -> [(first: FoundRecord, count: Int, ids: Set<Int64>)] {
        var runs: [(first: FoundRecord, count: Int, ids: Set<Int64>)] = []
        for r in records {
            if let last = runs.last?.first, last.message == r.message, last.level == r.level, last.type == r.type, last.uid == r.uid,
                last.hostShown == r.hostShown, last.appShown == r.appShown
            {
                runs[runs.count - 1].count += 1
                runs[runs.count - 1].ids.insert(r.id)
            } else {
                runs.append((r, 1, [r.id]))
            }
        }
        return runs
    }

    /// The counts and the histogram of a search, as the viewer's template reads them.
    static func statsPage(_ stats: RecordStats, narrowed: ([String: String?]) -> String) -> [String: Any] {
        var page: [String: Any] = [:]
        let total = stats.total.formatted()
        page["total"] = stats.complete ? "\(total) record\(stats.total == 1 ? "" : "s") match" : "More than \(total) records match"
        if !stats.complete, let until = stats.countedUntil { page["partial"] = "The counts below are those of the first \(total), up to \(timeText(until.date, fraction: true))." }
        page["levels"] = LogLevel.allCases.reversed().compactMap { level -> [String: Any]? in
            guard let count = stats.levels[level.name] else { return nil }
            return ["name": level.name, "count": count.formatted(), "href": narrowed(["level": level.name])]
        }
        page["hosts"] = stats.hosts.sorted { ($1.value, $0.key) < ($0.value, $1.key) }.prefix(12).map { host, count -> [String: Any] in
            // Records whose device is not known cannot be narrowed to: no link.
            host.isEmpty ? ["name": "unknown device", "count": count.formatted()] : ["name": host, "count": count.formatted(), "href": narrowed(["host": host])]
        }
        page["hasHosts"] = !stats.hosts.isEmpty
        if stats.hosts.count > 12 { page["moreHosts"] = "and \(stats.hosts.count - 12) more" }
        guard let from = stats.from, let to = stats.to, !stats.buckets.isEmpty else { return page }
        // Bars stacked by level, most severe at the bottom, scaled to the fullest span; each a
        // link to that span. Drawn with attributes only (the page allows no inline style).
        let width = 600.0 / Double(stats.buckets.count), tallest = Double(stats.buckets.map { $0.values.reduce(0, +) }.max() ?? 1)
        let iso = { (t: Timestamp) in t.rfc3339 }
        page["histogram"] = [
            "from": "\(from.microseconds)", "to": "\(to.microseconds)", "fromText": timeText(from.date), "toText": timeText(to.date),
            "zoom": narrowed(["since": nil, "until": nil]),
            "label": "Records over time by level, \(timeText(from.date)) to \(timeText(to.date))",
            "bars": stats.buckets.enumerated().compactMap { index, counts -> [String: Any]? in
                let sum = counts.values.reduce(0, +)
                guard sum > 0 else { return nil }
                let start = from.adding(.microseconds(stats.bucketMicroseconds * Int64(index)))
                let end = Timestamp(microseconds: min(to.microseconds, start.microseconds + stats.bucketMicroseconds))
                var y = 100.0
                let rects = LogLevel.allCases.reversed().compactMap { level -> [String: Any]? in
                    guard let count = counts[level.name], count > 0 else { return nil }
                    let height = min(max(0.8, Double(count) / tallest * 96), y)
                    y -= height
                    return ["level": level.name, "x": String(format: "%.2f", Double(index) * width), "y": String(format: "%.2f", y),
                            "w": String(format: "%.2f", max(width - 0.6, 0.4)), "h": String(format: "%.2f", height)]
                }
                let detail = LogLevel.allCases.reversed().compactMap { level in counts[level.name].map { "\($0) \(level.name)" } }.joined(separator: ", ")
                return ["href": narrowed(["since": iso(start), "until": iso(end)]), "title": "\(timeText(start.date)) to \(timeText(end.date)): \(detail)", "rects": rects]
            },
        ]
        return page
    }

    static func registerLogs(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        console.get("logs") { request, _ in
            guard let session = try await checked(request, d, .searchRecords) else { return toSignIn(request) }
            let parameters = query(request)
            var page = signedInPage("Logs", session, current: "Logs")
            for name in ["uid", "pull", "feedback", "capture", "host", "app", "level", "type", "text", "where", "since", "until"] { page[name] = parameters[name] ?? "" }
            let (search, problem) = logSearch(parameters)
            guard var search else {
                page["problem"] = problem
                return html(library, "logs", page, status: .badRequest)
            }
            guard search.uid != nil || search.pull != nil || search.feedback != nil || search.capture != nil || search.hosts != nil else {
                page["hint"] = "Choose a user, a device, a pull, a feedback or a capture to read."
                return html(library, "logs", page)
            }
            search.reason = nil
            let found: RecordPage
            do {
                found = try await d.actions.search(search, by: session.caller)
            } catch let error as ActionError where error.kind == .invalid {
                page["problem"] = error.description
                return html(library, "logs", page, status: .badRequest)
            }
            // The record asked for is marked (and focused); on a page read backwards, the last
            // one: the moment or the page the reader came from is just below it.
            let focus = parameters["focus"] ?? (search.before != nil ? found.records.last.map { "\($0.id)" } : nil)
            // With "group": a run of the same message (same level, host and app) is one row, counted.
            let grouped = parameters["group"] == "1"
            page["grouped"] = grouped
            page["rows"] = (grouped ? repeatsGrouped(found.records) : found.records.map { ($0, 1, [$0.id]) }).map { r, repeated, ids -> [String: Any] in
                var row = logRow(r)
                if let focus, let id = Int64(focus), ids.contains(id) { row["current"] = true }
                if repeated > 1 { row["repeated"] = "×\(repeated)" }
                return row
            }
            page["count"] = found.records.count
            page["searched"] = true
            if !found.records.isEmpty { page["hasRows"] = true }
            // Nothing found on a first page with a type, host or app no record has: most likely
            // a typo, said with the known ones.
            if found.records.isEmpty && search.after == nil && search.before == nil && (search.types != nil || search.hosts != nil || search.apps != nil) {
                do {
                    let unknown = try await d.actions.vocabulary(for: session.caller).unknown(in: search).map { sentence($0) }
                    if !unknown.isEmpty { page["unknown"] = unknown.joined(separator: " ") }
                } catch {
                    // Only a hint: the page stands without it.
                    d.logger.warning("the viewer's typo hint failed", metadata: ["error": "\(error)"])
                }
            }
            if found.indexing > 0 { page["indexing"] = "\(found.indexing) pull(s) or feedback still being indexed: more may come." }
            /// The search's fields without its cursor.
            let kept = parameters.filter { !["after", "before", "focus", "from"].contains($0.key) && !$0.value.isEmpty }
            /// This search at another page: the filters kept, the cursor replaced.
            func link(_ cursor: (name: String, value: String)?, path: String = "/console/logs") -> String {
                url(path, kept.sorted { $0.key < $1.key }.map { ($0.key, $0.value) } + (cursor.map { [($0.name, $0.value)] } ?? []))
            }
            /// This search from its first page, with `changes` (nil removes a field).
            func narrowed(_ changes: [String: String?]) -> String {
                var fields = kept
                for (key, value) in changes { fields[key] = value }
                return url("/console/logs", fields.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
            }
            // What the whole search matches, above its pages: counts per level and host, and the
            // records over time by level, whose bars (or a drag across them) zoom the time range.
            let stats = try await d.actions.stats(search, by: session.caller)
            page["stats"] = statsPage(stats, narrowed: narrowed)
            page["groupLink"] = narrowed(["group": grouped ? nil : "1"])
            if let next = found.next { page["next"] = link(("after", next)) }
            if let previous = found.previous { page["previous"] = link(("before", previous)) }
            if search.after != nil || search.before != nil { page["first"] = link(nil) }
            page["latest"] = link(("before", "\(Int64.max).0"))
            // A user's records live from now on, with the same filters (what a tail takes of them).
            if let uid = search.uid {
                page["watch"] = url("/console/tails/new", [("uid", uid)] + ["host", "level", "type", "text"].compactMap { name in parameters[name].flatMap { $0.isEmpty ? nil : (name, $0) } })
            }
            // The last page can follow what arrives after it, as `dredge logs --follow`.
            if found.next == nil { page["follow"] = link(("from", "\(found.newestID)"), path: "/console/logs/follow") }
            return html(library, "logs", page)
        }

        // Server-sent events: the records of the viewer's search that arrive after `from` (a
        // record id: the newest the page saw), in arrival order, 500 at most per event, looked
        // for every second. Each event's id is its last record's, so a browser that reconnects
        // (`Last-Event-ID`) misses and repeats nothing. Bounded and ended as the pull page's
        // streams are: 4 per session and 200 in all, 10 minutes, the session's end, shutdown.
        let follows = EventStreams()
        console.get("logs/follow") { request, _ in
            guard let cookie = request.cookies[sessionCookie]?.value, let session = try await checked(request, d, .searchRecords) else {
                throw AdminAPIError(.unauthorized, "unauthorized", "Sign in first.")
            }
            let parameters = query(request)
            let (parsed, problem) = logSearch(parameters)
            guard var search = parsed else { throw AdminAPIError(.badRequest, "bad_request", problem ?? "The search cannot be read.") }
            guard search.uid != nil || search.pull != nil || search.feedback != nil || search.capture != nil || search.hosts != nil else {
                throw AdminAPIError(.badRequest, "bad_request", "Choose a user, a device, a pull, a feedback or a capture to follow.")
            }
            let resumed = request.headers[HTTPFields.Element.Name("Last-Event-ID")!].flatMap { Int64($0) }
            guard let from = parameters["from"].flatMap({ Int64($0) }), from >= 0, (resumed ?? 0) >= 0 else {
                throw AdminAPIError(.badRequest, "bad_request", "from must be a record id.")
            }
            guard d.records != nil else { throw AdminAPIError(.serviceUnavailable, "unavailable", "This server does not index records.") }
            (search.after, search.before, search.limit, search.arrivedAfter, search.reason) = (nil, nil, 500, max(from, resumed ?? 0), nil)
            try AdminActions.check(search)
            let asked = search, encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            // State: the search, from the last record sent.
            return try await eventStream(
                request, cookie: cookie, follows, d, every: .seconds(1), state: asked,
                opened: { try await d.actions.searchOpened(asked, by: session.caller) }
            ) { search in
                let page = try await d.actions.followed(search, by: session.caller)
                guard let last = page.records.last else { return .quiet }
                let data = String(decoding: try encoder.encode(page.records.map(FollowedRecord.init)), as: UTF8.self)  // one line: JSON escapes newlines
                search.arrivedAfter = last.id
                return .send("id: \(last.id)\ndata: \(data)\n\n", more: page.next != nil)  // more: already there
            }
        }
    }

    /// A followed record as the viewer's script writes it into a row (as text).
    struct FollowedRecord: Encodable {
        var id: String, time: String, host: String, app: String, level: String, type: String, uid: String, message: String, metadata: String

        init(_ r: FoundRecord) {
            let row = Console.logRow(r)
            func text(_ key: String) -> String { row[key] as? String ?? "" }
            (id, time, host, app, level, type, uid, message, metadata) = (
                text("id"), text("time"), text("host"), text("app"), text("level"), text("type"), text("uid"), text("message"), text("metadata")
            )
        }
    }
}
