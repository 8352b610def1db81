import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeCommandLine
import DredgeDomain
import Foundation

/// `dredge triggers`: standing triggers (#54) — logs that arrive by themselves when a device
/// logs what a trigger matches, or crashes.
struct TriggersCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "triggers", abstract: "Standing triggers: devices send the records around a match, or a crash, by themselves.",
        subcommands: [Create.self, List.self, Show.self, Disable.self, Remove.self], defaultSubcommand: List.self)

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "create",
            abstract: "Define a trigger: what fires it, where, the window it captures and how often.",
            discussion: """
                Every device in scope is sent the trigger and matches what it logs against it, off
                the app's logging path. On a match it uploads the records from --before the match to
                --after it (the matching record's user's records, or the device's when the record has
                none) as a capture of the trigger, at most --per-device times a day; the server keeps
                at most --per-day captures of it a day from all devices. --crash also captures the
                minutes before an app's run ended uncleanly (a crash, a kill).

                Examples:
                  dredge triggers create "payment declined" --level error+ --type business --grep "payment declined"
                  dredge triggers create "checkout 503" --where http.status=503 --app shop --min-version 2.4 --before 10m --after 0s
                  dredge triggers create crashes --crash --label region=eu --for 30d --reason T-1
                """)

        @OptionGroup var server: ServerOptions
        @Argument(help: "Its name, for people: \"payment declined\".") var name: String
        @Option(name: .customLong("level"), help: "Levels: 'error', 'warning,error' or 'error+'; repeatable.") var levels: [String] = []
        @Option(name: .customLong("type"), help: "Log types; repeatable or comma-separated.") var types: [String] = []
        @Option(help: "Records whose message or metadata contain this text (ASCII letters in any case).") var grep: String?
        @Option(name: .customLong("where"), help: "A top-level metadata member: key=value (http.status=503), or key alone (the member is there).") var member: String?
        @Flag(help: "An app's run that ended uncleanly (a crash, a kill) fires it too.") var crash = false
        @Flag(name: .customLong("crash-only"), help: "Only crashes fire it, no record.") var crashOnly = false
        @Option(help: "Only this user's records, on the devices that hold the user.") var uid: String?
        @Option(help: "Only records of this app.") var app: String?
        @Option(name: .customLong("min-version"), help: "Only app versions at or above this.") var minVersion: String?
        @Option(name: .customLong("max-version"), help: "Only app versions at or below this.") var maxVersion: String?
        @Option(name: .customLong("label"), help: "Only devices with this label: name=value; repeatable.") var labels: [String] = []
        @Option(help: "The window before a match: 30s, 5m, 1h (at most 1h).") var before = "5m"
        @Option(help: "The window after a match: 0s, 1m, 10m (at most 10m).") var after = "1m"
        @Option(name: .customLong("per-device"), help: "Captures one device may send a day (1–100).") var perDevice = TriggerRequest.defaultPerDevicePerDay
        @Option(name: .customLong("per-day"), help: "Captures of it the server keeps a day, from all devices.") var perDay = TriggerRequest.defaultPerDay
        @Option(name: .customLong("for"), help: "How long it stands: 12h, 7d, 90d (at most 90d).") var duration = "7d"
        @Option(help: "Why (a ticket number, say): recorded in the audit log.") var reason: String?
        @Flag(help: "JSON output.") var json = false

        func validate() throws { _ = try request() }

        func request() throws -> TriggerRequest {
            var match: TriggerMatch?
            if !crashOnly {
                var m = TriggerMatch()
                if !levels.isEmpty { m.levels = try FilterOptions.levels(levels).sorted().map(\.name) }
                if !types.isEmpty { m.types = try FilterOptions.types(types).map(\.rawValue).sorted() }
                if let grep {
                    guard !grep.isEmpty else { throw ValidationError("--grep needs some text") }
                    m.text = grep
                }
                if let member {
                    if let parsed = MetadataMatch(parsing: member) {
                        (m.metadataKey, m.metadataValue) = (parsed.key, parsed.value)
                    } else {
                        guard !member.isEmpty, !member.hasPrefix("=") else { throw ValidationError("cannot read --where '\(member)': give key=value, like http.status=503, or a key") }
                        m.metadataKey = member
                    }
                }
                if m == TriggerMatch() {
                    // --crash alone: only crashes fire it.
                    guard crash else { throw ValidationError("say what fires it: --level, --type, --grep or --where, or --crash (crashes only)") }
                } else {
                    match = m
                }
            } else if !levels.isEmpty || !types.isEmpty || grep != nil || member != nil {
                throw ValidationError("--crash-only takes no --level, --type, --grep or --where")
            }
            var labelMap: [String: String] = [:]
            for label in labels {
                guard let equals = label.firstIndex(of: "="), equals != label.startIndex else { throw ValidationError("cannot read --label '\(label)': give name=value") }
                labelMap[String(label[..<equals])] = String(label[label.index(after: equals)...])
            }
            guard let before = Self.seconds(before), before <= 3_600 else { throw ValidationError("cannot read --before '\(before)': give 0s, 30s, 5m or 1h (at most an hour)") }
            guard let after = Self.seconds(after), after <= 600 else { throw ValidationError("cannot read --after '\(after)': give 0s, 30s or 10m (at most 10 minutes)") }
            guard let lasting = Self.seconds(duration), lasting >= 60, lasting <= TriggerRequest.maxDurationSeconds else {
                throw ValidationError("cannot read --for '\(duration)': give 12h, 7d or 90d (a minute to 90 days)")
            }
            if let uid, let problem = UserID.problem(uid) { throw ValidationError("--uid: \(problem)") }
            if let reason, let problem = reasonProblem(reason) { throw ValidationError("--reason: \(problem)") }
            return TriggerRequest(
                name: name, match: match, crash: crash || crashOnly, uid: uid, app: app, minAppVersion: minVersion, maxAppVersion: maxVersion,
                labels: labelMap.isEmpty ? nil : labelMap, beforeSeconds: before, afterSeconds: after, perDevicePerDay: perDevice, perDay: perDay,
                durationSeconds: lasting, reason: reason)
        }

        /// `0s`, `30s`, `5m`, `12h`, `7d` as seconds.
        static func seconds(_ text: String) -> Int? {
            guard let unit = text.last, let amount = Int(text.dropLast()), amount >= 0, let per = ["s": 1, "m": 60, "h": 3_600, "d": 86_400][String(unit)],
                amount <= 365 * 86_400 / per
            else { return nil }
            return amount * per
        }

        func run() async throws {
            let client = try server.client()
            let trigger = try await calling { try await client.createTrigger(try request()) }
            if json { return try printJSON(trigger) }
            print("trigger \(trigger.id) defined: \(TriggersCommand.summary(trigger))")
            print("  in force until \(Format.time(trigger.expiresAt.date)); devices in scope are sent it when they connect")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "The triggers, newest first (removed ones are not listed).")
        @OptionGroup var server: ServerOptions
        @Flag(help: "JSON output.") var json = false

        func run() async throws {
            let client = try server.client()
            let all = try await calling { try await client.triggers() }
            if json { return try printJSON(all) }
            if all.isEmpty { print("no triggers") }
            let now = Timestamp.now
            for t in all {
                print("\(t.id)  \(t.state(at: now))  \(Terminal.field(t.definition.name).debugDescription)  \(TriggersCommand.fires(t))  by \(Terminal.field(t.createdBy))")
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "One trigger: what fires it, where, its window and budgets, whether it is in force, and what it brought in (its captures).")
        @OptionGroup var server: ServerOptions
        @Argument(help: "The trigger id, or its first 4 or more characters.") var id: String
        @Flag(help: "JSON output.") var json = false

        func validate() throws { try IDPrefix.validate(id, flag: "the trigger id") }

        func run() async throws {
            let client = try server.client()
            let resolved = try await calling { try await client.resolveTrigger(id) }
            let activity = try await calling { try await client.triggerActivity(resolved, limit: 20) }
            let t = activity.trigger
            if json { return try printJSON(activity) }
            print("trigger \(t.id) \(Terminal.field(t.definition.name).debugDescription): \(t.state(at: .now))")
            print("  \(TriggersCommand.summary(t))")
            print("  defined by \(Terminal.field(t.createdBy)) \(Format.time(t.createdAt))\(t.reason.isEmpty ? "" : ", reason \(Terminal.field(t.reason).debugDescription)"); until \(Format.time(t.expiresAt.date))")
            if !t.makerScope.isEverything { print("  reaches only devices in its maker's scope: \(t.makerScope)") }
            if let d = t.disabled { print("  disabled \(Format.time(d.at)) by \(Terminal.field(d.by))\(d.reason.isEmpty ? "" : ": \(Terminal.field(d.reason))")") }
            if let r = t.removed { print("  removed \(Format.time(r.at)) by \(Terminal.field(r.by))\(r.reason.isEmpty ? "" : ": \(Terminal.field(r.reason))")") }
            func count(_ n: Int, _ one: String) -> String { "\(n) \(one)\(n == 1 ? "" : "s")" }
            print("  \(Terminal.field(t.definition.name)): \(count(activity.lastDay.captures, "capture")) from \(count(activity.lastDay.devices, "device")) in the last day; held by \(count(activity.holders, "device"))")
            for c in activity.captures {
                let status = c.removed == nil ? c.status.rawValue : "removed"
                print("  capture \(c.id)  \(Format.time(c.matchedAt.date))\(c.crash ? " (crash)" : "")  agent \(c.agentID.prefix(8))  uid \(c.uid.isEmpty ? "(every user)" : Terminal.field(c.uid))  \(c.records) records  \(status)")
            }
        }
    }

    struct Disable: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Disable a trigger: devices stop matching it when next sent their triggers; its captures stay.")
        @OptionGroup var server: ServerOptions
        @Argument(help: "The trigger id, or its first 4 or more characters.") var id: String
        @Option(help: "Why: recorded in the audit log.") var reason = ""

        func validate() throws { try IDPrefix.validate(id, flag: "the trigger id") }

        func run() async throws {
            let client = try server.client()
            let resolved = try await calling { try await client.resolveTrigger(id) }
            let t = try await calling { try await client.disableTrigger(resolved, reason: reason) }
            print("disabled trigger \(t.id) \(Terminal.field(t.definition.name).debugDescription)")
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "rm", abstract: "Remove a trigger: no longer listed, and captures of it are refused from now on.")
        @OptionGroup var server: ServerOptions
        @Argument(help: "The trigger id, or its first 4 or more characters.") var id: String
        @Option(help: "Why: recorded in the audit log.") var reason = ""

        func validate() throws { try IDPrefix.validate(id, flag: "the trigger id") }

        func run() async throws {
            let client = try server.client()
            let resolved = try await calling { try await client.resolveTrigger(id) }
            let t = try await calling { try await client.removeTrigger(resolved, reason: reason) }
            print("removed trigger \(t.id) \(Terminal.field(t.definition.name).debugDescription)")
        }
    }

    /// What fires it: `level=error type=business and crashes`.
    static func fires(_ t: TriggerRecord) -> String {
        [t.definition.match.map(\.summary), t.definition.crash ? "crashes" : nil].compactMap { $0 }.joined(separator: " and ")
    }

    /// What fires it, where, the window and the budgets.
    static func summary(_ t: TriggerRecord) -> String {
        let d = t.definition
        var scope: [String] = []
        if let uid = d.uid { scope.append("uid \(uid)") }
        if let app = d.app { scope.append("app \(app)\(d.minAppVersion.map { " >= \($0)" } ?? "")\(d.maxAppVersion.map { " <= \($0)" } ?? "")") }
        if !d.labels.isEmpty { scope.append(d.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")) }
        return Terminal.field(
            "fires on \(fires(t)) on \(scope.isEmpty ? "every device" : scope.joined(separator: " "))"
                + "; captures \(d.beforeSeconds) s before to \(d.afterSeconds) s after; at most \(d.perDevicePerDay) a device and \(d.perDay) in all a day")
    }
}
