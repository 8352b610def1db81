import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Hummingbird
import Mustache

/// The console's standing triggers (#54): the list, the form that defines one, and a trigger's
/// page with disable and remove. What `dredge triggers` does.
extension Console {
    /// A new-trigger form's fields as a request, or what is wrong with them: `level` as
    /// `error+` or `error,critical`, `type` and `labels` as comma lists, `where` as `key=value`
    /// or a key, the window in seconds, the life in days.
    static func triggerRequest(_ form: [String: String]) -> Result<TriggerRequest, PullRequestError> {
        func field(_ name: String) -> String? {
            let value = (form[name] ?? "").trimmingCharacters(in: .whitespaces)
            return value.isEmpty ? nil : value
        }
        func number(_ name: String, _ fallback: Int, _ what: String) -> Result<Int, PullRequestError> {
            guard let text = field(name) else { return .success(fallback) }
            guard let value = Int(text) else { return .failure(.invalid("\(what) is a whole number, not “\(text.prefix(32))”")) }
            return .success(value)
        }
        guard let name = field("name") else { return .failure(.invalid("give the trigger a name (payment declined, say)")) }
        var match = TriggerMatch()
        if let level = field("level") {
            guard let levels = LogLevel.parseSet(level) else {
                return .failure(.invalid("level is one of \(LogLevel.allCases.map(\.name).joined(separator: ", ")), or one with + (error+: error and above)"))
            }
            match.levels = levels.sorted().map(\.name)
        }
        if let types = field("type") {
            var names: [String] = []
            for name in types.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !name.isEmpty {
                guard LogType(name) != nil else { return .failure(.invalid("“\(name)” is not a log type (app, network, …)")) }
                names.append(name)
            }
            if !names.isEmpty { match.types = names.sorted() }
        }
        match.text = field("text")
        if let member = field("where") {
            if let parsed = MetadataMatch(parsing: member) {
                (match.metadataKey, match.metadataValue) = (parsed.key, parsed.value)
            } else {
                guard !member.hasPrefix("=") else { return .failure(.invalid("a metadata member is key=value (http.status=503), or a key")) }
                match.metadataKey = member
            }
        }
        let crash = form["crash"] != nil
        let fires: TriggerMatch?
        if match == TriggerMatch() {
            guard crash else { return .failure(.invalid("say what fires it: levels, types, a text or a metadata member, or crashes")) }
            fires = nil
        } else {
            fires = match
        }
        var labels: [String: String] = [:]
        for pair in (field("labels") ?? "").split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !pair.isEmpty {
            guard let equals = pair.firstIndex(of: "="), equals != pair.startIndex else { return .failure(.invalid("labels are name=value, separated by commas")) }
            labels[String(pair[..<equals])] = String(pair[pair.index(after: equals)...])
        }
        do {
            let before = try number("before", TriggerRequest.defaultBeforeSeconds, "the window before a match").get()
            let after = try number("after", TriggerRequest.defaultAfterSeconds, "the window after a match").get()
            let perDevice = try number("perDevice", TriggerRequest.defaultPerDevicePerDay, "captures a day from one device").get()
            let perDay = try number("perDay", TriggerRequest.defaultPerDay, "captures a day in all").get()
            let days = try number("days", TriggerRequest.defaultDurationSeconds / 86_400, "how many days it stands").get()
            guard (1...TriggerRequest.maxDurationSeconds / 86_400).contains(days) else {
                return .failure(.invalid("a trigger stands 1 to \(TriggerRequest.maxDurationSeconds / 86_400) days"))
            }
            return .success(
                TriggerRequest(
                    name: name, match: fires, crash: crash, uid: field("uid"), app: field("app"), minAppVersion: field("minVersion"), maxAppVersion: field("maxVersion"),
                    labels: labels.isEmpty ? nil : labels, beforeSeconds: before, afterSeconds: after, perDevicePerDay: perDevice, perDay: perDay,
                    durationSeconds: days * 86_400, reason: field("reason")))
        } catch {
            return .failure(error)
        }
    }

    /// What a trigger fires on, where, and what it captures, in words.
    static func triggerRow(_ t: TriggerRecord, now: Timestamp) -> [String: Any] {
        let d = t.definition
        var scope: [String] = []
        if let uid = d.uid { scope.append("user \(uid)") }
        if let app = d.app { scope.append("\(app)\(d.minAppVersion.map { " ≥ \($0)" } ?? "")\(d.maxAppVersion.map { " ≤ \($0)" } ?? "")") }
        if !d.labels.isEmpty { scope.append(d.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ", ")) }
        let state = t.state(at: now)
        return [
            "id": t.id, "shortID": String(t.id.prefix(8)), "name": d.name, "by": t.createdBy, "createdAt": timeText(t.createdAt), "reason": t.reason,
            "fires": [d.match.map(\.summary), d.crash ? "crashes" : nil].compactMap { $0 }.joined(separator: " and "),
            "scope": scope.isEmpty ? "every device" : scope.joined(separator: "; "),
            "captures": "\(d.beforeSeconds) s before to \(d.afterSeconds) s after; at most \(d.perDevicePerDay) a device and \(d.perDay) in all a day",
            "state": state == "in force" ? "in force until \(timeText(t.expiresAt.date))" : state, "inForce": state == "in force",
        ]
    }

    static func registerTriggers(on console: RouterGroup<AdminRequestContext>, _ library: MustacheLibrary, _ d: Dependencies) {
        console.get("triggers") { request, _ in
            guard let session = try await checked(request, d, .readTriggers) else { return toSignIn(request) }
            var page = signedInPage("Triggers", session, current: "Triggers")
            let now = Timestamp.now
            page["rows"] = try await d.actions.triggers(limit: 100, for: session.caller).map { triggerRow($0, now: now) }
            page["mayDefine"] = session.caller.role >= AdminOperation.createTrigger.leastRole ? true : nil
            return html(library, "triggers", page)
        }

        @Sendable func newTriggerPage(_ session: ConsoleSessions.Session, _ form: [String: String], problem: String?, status: HTTPResponse.Status) -> Response {
            var page = signedInPage("Define a trigger", session, current: "Triggers")
            for name in ["name", "level", "type", "text", "where", "uid", "app", "minVersion", "maxVersion", "labels", "reason"] { page[name] = form[name] ?? "" }
            page["before"] = form["before"] ?? "\(TriggerRequest.defaultBeforeSeconds)"
            page["after"] = form["after"] ?? "\(TriggerRequest.defaultAfterSeconds)"
            page["perDevice"] = form["perDevice"] ?? "\(TriggerRequest.defaultPerDevicePerDay)"
            page["perDay"] = form["perDay"] ?? "\(TriggerRequest.defaultPerDay)"
            page["days"] = form["days"] ?? "\(TriggerRequest.defaultDurationSeconds / 86_400)"
            page["crash"] = form["crash"] != nil
            if let problem { page["problem"] = problem }
            return html(library, "new-trigger", page, status: status)
        }

        console.get("triggers/new") { request, _ in
            guard let session = try await checked(request, d, .createTrigger) else { return toSignIn(request) }
            return newTriggerPage(session, query(request), problem: nil, status: .ok)
        }
        console.post("triggers") { request, context in
            let form = try await formFields(request, context)
            return try await asPoster(request, form, library, d, .createTrigger) { session in
                let trigger: TriggerRecord
                do {
                    trigger = try await d.actions.createTrigger(try triggerRequest(form).get(), by: session.caller, via: "console")
                } catch let error as PullRequestError {
                    return newTriggerPage(session, form, problem: sentence(error), status: .badRequest)
                } catch let error as ActionError {
                    return newTriggerPage(session, form, problem: sentence(error), status: AdminAPIError(error).status)
                }
                return redirect("/console/triggers/\(trigger.id)")
            }
        }

        console.get("triggers/:id") { request, context in
            guard let session = try await checked(request, d, .readTriggers) else { return toSignIn(request) }
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such trigger.") }
            let activity = try await d.actions.activity(ofTrigger: id, limit: 100, for: session.caller)
            let trigger = activity.trigger
            var page = signedInPage("Trigger: \(trigger.definition.name)", session, current: "Triggers")
            let hosts = try await d.actions.hostnames(for: session.caller)
            func count(_ n: Int, _ one: String) -> String { "\(n) \(one)\(n == 1 ? "" : "s")" }
            page["lastDay"] = "\(count(activity.lastDay.captures, "capture")) from \(count(activity.lastDay.devices, "device"))"
            page["holders"] = "held by \(count(activity.holders, "device"))"
            page["hasCaptures"] = !activity.captures.isEmpty
            page["captureRows"] = activity.captures.map { c -> [String: Any] in
                [
                    "id": c.id, "shortID": String(c.id.prefix(8)), "matchedAt": timeText(c.matchedAt.date), "crash": c.crash, "host": hosts[c.agentID] ?? String(c.agentID.prefix(8)),
                    "uid": c.uid.isEmpty ? "every user" : c.uid, "records": "\(c.records)", "status": c.removed == nil ? c.status.rawValue : "removed",
                ]
            }
            for (key, value) in triggerRow(trigger, now: .now) { page[key] = value }
            page["expiresAt"] = timeText(trigger.expiresAt.date)
            if !trigger.makerScope.isEverything { page["makerScope"] = "\(trigger.makerScope)" }
            for (key, ending) in [("disabled", trigger.disabled), ("removed", trigger.removed)] {
                if let ending { page[key] = "\(timeText(ending.at)) by \(ending.by)\(ending.reason.isEmpty ? "" : ": \(ending.reason)")" }
            }
            let mine = (trigger.createdBy == session.caller.name || session.caller.role == .admin) && session.caller.role >= AdminOperation.disableTrigger.leastRole
            if mine, trigger.removed == nil {
                if trigger.disabled == nil { page["mayDisable"] = true }
                page["mayRemove"] = true
            }
            return html(library, "trigger", page)
        }

        console.get("captures/:id") { request, context in
            guard let session = try await checked(request, d, .readTriggers) else { return toSignIn(request) }
            let id = try context.parameters.require("id")
            guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such capture.") }
            let c = try await d.actions.capture(id, for: session.caller)
            var page = signedInPage("Capture \(id.prefix(8))", session, current: "Triggers")
            let trigger = try? await d.actions.trigger(c.triggerID, for: session.caller)  // removed since, or out of sight: named by its id
            let hosts = try await d.actions.hostnames(for: session.caller)
            let fields: [String: Any] = [
                "id": c.id, "shortID": String(c.id.prefix(8)), "triggerID": c.triggerID, "triggerName": trigger?.definition.name ?? String(c.triggerID.prefix(8)),
                "setVersion": "\(c.setVersion)", "matchedAt": timeText(c.matchedAt.date, fraction: true), "crash": c.crash,
                "host": hosts[c.agentID] ?? "?", "agentID": c.agentID, "uid": c.uid.isEmpty ? "every user on the device" : c.uid,
                "since": timeText(c.since.date, fraction: true), "until": timeText(c.until.date, fraction: true), "status": c.status.rawValue, "detail": c.detail,
                "records": "\(c.records)", "receivedAt": timeText(c.receivedAt), "complete": c.status == .complete && c.removed == nil,
            ]
            for (key, value) in fields { page[key] = value }
            if let removed = c.removed { page["removed"] = "\(timeText(removed.at)) by \(removed.by)\(removed.reason.isEmpty ? "" : ": \(removed.reason)")" }
            return html(library, "capture", page)
        }

        for (path, removing) in [("disable", false), ("remove", true)] {
            console.post("triggers/:id/\(path)") { request, context in
                let form = try await formFields(request, context)
                let id = try context.parameters.require("id")
                guard WireID.isValid(id) else { throw AdminAPIError(.notFound, "not_found", "There is no such trigger.") }
                return try await asPoster(request, form, library, d, .disableTrigger) { session in
                    do {
                        let reason = (form["reason"] ?? "").trimmingCharacters(in: .whitespaces)
                        if removing {
                            _ = try await d.actions.removeTrigger(id, by: session.caller, reason: reason)
                        } else {
                            _ = try await d.actions.disableTrigger(id, by: session.caller, reason: reason)
                        }
                    } catch let error as ActionError {
                        // Ended already (by another person): the page says by whom.
                        guard error.kind == .conflict else { throw error }
                    }
                    return redirect(removing ? "/console/triggers" : "/console/triggers/\(id)")
                }
            }
        }
    }
}
