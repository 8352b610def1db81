import DredgeAdminAPI
import DredgeDomain
import Foundation
import Hummingbird
import Mustache

/// The console's record page (`/console/records/{id}`): one record in full, its permalink.
/// Its metadata member by member, a network record as request and response (the network
/// logger's fields), and its context: the records just before and after it from the same
/// device's payload. The log viewer shows the same article in its detail panel. Each record
/// read is audited as `records.read` (once per token and record in ten minutes), as on the API.
extension Console {
    /// Records shown on each side of the one opened.
    static let contextCount = 10

    static func registerRecords(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        console.get("records/:id") { request, context in
            guard let session = try await checked(request, d, .searchRecords) else { return toSignIn(request) }
            guard let id = Int64(try context.parameters.require("id")), id > 0, let found = try await d.actions.record(id, context: contextCount, by: session.caller) else {
                throw AdminAPIError(.notFound, "not_found", "There is no such record (it may have been removed with its pull or feedback).")
            }
            var page = signedInPage("Record \(id)", session, current: "Logs")
            for (key, value) in recordFields(found) { page[key] = value }
            return html(library, "record", page)
        }
    }

    /// What the record template shows of a record and its context.
    static func recordFields(_ found: RecordInContext) -> [String: Any] {
        let r = found.record
        let source = ["feedback", "tail", "capture"].contains(r.sourceKind) ? r.sourceKind : "pull"
        let sourceHref = switch source {
        case "pull": "/console/pulls/\(r.sourceID)"
        case "feedback": "/console/logs?feedback=\(r.sourceID)"
        case "capture": "/console/captures/\(r.sourceID)"
        default: "/console/tails/\(r.sourceID)"
        }
        var fields: [String: Any] = [
            "id": "\(r.id)", "time": timeText(r.ts.date, fraction: true), "rfc3339": r.ts.rfc3339, "level": r.level, "type": r.type,
            "uid": r.uid.isEmpty ? "none" : r.uid, "host": r.host.isEmpty ? "?" + (r.claimedHost.map { " (claims \($0))" } ?? "") : r.hostShown, "app": r.appShown,
            "os": r.os, "process": r.process, "agentID": r.agentID, "sourceKind": source, "sourceID": r.sourceID, "message": r.message,
            "sourceHref": sourceHref,
            // The viewer over the same payload, from this record on (the page before is one link away);
            // a live tail's records (#53) are in its device's timeline.
            "timeline": source == "tail"
                ? "/console/logs?uid=\(query(r.uid))&host=\(query(r.host))&after=\(r.ts.microseconds).\(r.id - 1)&focus=\(r.id)"
                : "/console/logs?\(source)=\(r.sourceID)&after=\(r.ts.microseconds).\(r.id - 1)&focus=\(r.id)",
        ]
        // Its source's files: a pull's or a feedback's. A live tail's are on its page, for those who may read them.
        if source != "tail" { fields["files"] = "/console/\(source == "pull" ? "pulls" : source == "capture" ? "captures" : "feedback")/\(r.sourceID)/files" }
        // A section of an empty string is shown (swift-mustache): absent keys are not.
        for key in ["app", "os", "process"] where (fields[key] as? String)?.isEmpty == true { fields[key] = nil }
        if case .object(let members) = r.metadata.value, !members.isEmpty {
            // One section (a dictionary) around the rows: the table is written once.
            fields["metadata"] = ["rows": members.sorted { $0.key < $1.key }.map { ["key": $0.key, "value": text($0.value)] }]
        }
        if let network = NetworkExchangeView(r) { fields["network"] = network.fields }
        let row = { (record: FoundRecord, current: Bool) -> [String: Any] in
            var row = logRow(record)
            if current { row["current"] = true }
            return row
        }
        fields["context"] = found.before.map { row($0, false) } + [row(r, true)] + found.after.map { row($0, false) }
        return fields
    }

    /// A value in a link's query.
    static func query(_ text: String) -> String { text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "" }

    /// A metadata value as shown: a string as it is, anything else as JSON.
    static func text(_ value: JSONValue) -> String {
        if case .string(let s) = value { return s }
        return value.jsonText
    }

    /// A row of the viewer's table (and of a record's context).
    static func logRow(_ r: FoundRecord) -> [String: Any] {
        var row: [String: Any] = [
            "id": "\(r.id)", "time": timeText(r.ts.date, fraction: true), "host": r.hostShown, "app": r.appShown,
            "level": r.level, "type": r.type, "uid": r.uid, "message": r.message,
        ]
        if case .object(let members) = r.metadata.value, !members.isEmpty {
            row["metadata"] = members.sorted { $0.key < $1.key }.map { "\($0.key)=\(text($0.value))" }.joined(separator: " ")
        }
        return row
    }
}

/// A network record read as an HTTP exchange: the fields the client library's network logger
/// writes (`method`, `url`, `status`, `duration_ms`, `request_headers`, …), or their dotted
/// forms (`http.method`, `http.url`, `http.status`, `bytes.out`, `bytes.in`). Nil for a record
/// that names neither a method nor a URL.
struct NetworkExchangeView {
    var fields: [String: Any]

    init?(_ r: FoundRecord) {
        guard case .object(let m) = r.metadata.value else { return nil }
        func first(_ keys: String...) -> JSONValue? { keys.lazy.compactMap { m[$0] }.first }
        func text(_ keys: String...) -> String? {
            guard let value = keys.lazy.compactMap({ m[$0] }).first, value != .null else { return nil }
            return Console.text(value)
        }
        let method = text("method", "http.method"), url = text("url", "http.url")
        guard method != nil || url != nil else { return nil }
        func headers(_ key: String) -> [[String: String]]? {
            guard case .object(let headers)? = m[key], !headers.isEmpty else { return nil }
            return headers.sorted { $0.key.lowercased() < $1.key.lowercased() }.map { ["name": $0.key, "value": Console.text($0.value)] }
        }
        var fields: [String: Any] = ["method": method ?? "?", "url": url ?? "?"]
        var request: [[String: String]] = [], response: [[String: String]] = []
        func fact(_ list: inout [[String: String]], _ name: String, _ value: String?) { if let value, !value.isEmpty { list.append(["name": name, "value": value]) } }
        fact(&request, "Correlation id", text("correlation_id"))
        fact(&request, "Bytes", text("request_bytes", "bytes.out"))
        fact(&response, "Status", text("status", "http.status") ?? (m["error"] != nil ? "no response" : nil))
        if let duration = first("duration_ms") { fact(&response, "Duration", Console.text(duration) + " ms") }
        fact(&response, "Bytes", text("response_bytes", "bytes.in"))
        fact(&response, "Error", text("error"))
        fields["request"] = request
        fields["response"] = response
        if let requestHeaders = headers("request_headers") { fields["requestHeaders"] = ["rows": requestHeaders] }
        if let responseHeaders = headers("response_headers") { fields["responseHeaders"] = ["rows": responseHeaders] }
        if let body = text("request_body"), !body.isEmpty { fields["requestBody"] = body }
        if let body = text("response_body"), !body.isEmpty { fields["responseBody"] = body }
        self.fields = fields
    }
}
