import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeCommandLine
import DredgeDomain
import DredgeWire
import Foundation

@main
struct Dredge: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dredge",
        abstract: "Pull logs from the field: the support engineer's side of a Dredge server.",
        discussion: """
            Talks to the server's admin API. `dredge login` saves its address, the admin token and
            the deployment's CA as a profile; --server, --token and --ca (or DREDGE_SERVER,
            DREDGE_TOKEN and DREDGE_CA) override it.
            """,
        version: DredgeVersion.current,
        subcommands: [LoginCommand.self, LogoutCommand.self, WhoAmICommand.self, AgentsCommand.self, PullCommand.self, ApproveCommand.self, PullsCommand.self, ShowCommand.self, LogsCommand.self, TailCommand.self, TriggersCommand.self, FetchCommand.self, RemoveCommand.self, FeedbackCommand.self, AuditCommand.self, TokensCommand.self, OpenExportCommand.self])

    static func main() async {
        Mistyped.exitIfMistyped(Self.self)
        await main(nil)
    }
}

/// Runs an admin API call, turning its errors into one line on stderr and exit status 1, or
/// ``notAllowedStatus`` when the token's role may not do it.
func calling<T>(_ body: () async throws -> T) async throws -> T {
    do {
        return try await body()
    } catch let error as AdminClientError {
        throw failing(error)
    }
}

/// An admin API error as one line on stderr, and the exit status it means: ``notAllowedStatus``
/// when the token's role or scope may not do it, 1 otherwise.
func failing(_ error: AdminClientError) -> ExitCode {
    if case .forbidden = error {
        Terminal.error("error: \(error.description)\n")
        return ExitCode(notAllowedStatus)
    }
    return fail(error.description)
}

/// The exit status of a command the token's role may not run: 77, sysexits' EX_NOPERM.
let notAllowedStatus: Int32 = 77

struct AgentsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "agents", abstract: "List enrolled agents, or revoke one.",
        subcommands: [List.self, Revoke.self], defaultSubcommand: List.self)

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List enrolled agents: the device (host, app and version, labels), online or not, last seen, records held, users.",
            discussion: """
                An agent holds a uid when its store has records of that user, whatever their age (the
                agent reports them on each connection), or logged it in the last day. --uid lists the
                agents that hold it, with the hour each last saw it. A revoked agent is listed as such.
                """)

        @OptionGroup var server: ServerOptions
        @Flag(help: "Only agents connected now.") var online = false
        @Option(help: "Only agents whose store holds this uid.") var uid: String?
        @Option(help: "Only agents on this host (its name as the device reported it).") var host: String?
        @Flag(help: "JSON output.") var json = false

        func validate() throws {
            if let uid, let problem = UserID.problem(uid) { throw ValidationError("--uid: \(problem)") }
        }

        func run() async throws {
            let client = try server.client()
            let all = try await calling { try await client.agents() }
            var agents = all
            if let uid {
                // A server that does not know `?uid=` lists every agent: keep those that hold it.
                agents = try await calling { try await client.agents(uid: uid) }.filter { $0.uidLastSeen != nil || $0.activeUIDs.contains(uid) }
            }
            if online { agents = agents.filter(\.connected) }
            if let host { agents = agents.filter { $0.hostname == host } }
            if json { return try printJSON(agents) }
            if agents.isEmpty {
                if all.isEmpty { print("no agents enrolled") } else if let uid { print("no agent holds uid \(uid)\(online || host != nil ? " among those that match" : "") (\(all.count) enrolled)") } else { print("no agents match (\(all.count) enrolled)") }
            }
            for a in agents { print(AgentsCommand.describe(a, uid: uid)) }
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Revoke an agent (a lost or stolen device, a decommissioned host).",
            discussion: """
                Its connection is closed at once, it may not connect again, and pulls by uid no longer
                reach it; what it uploaded is kept. Recorded in the audit log with the reason. To use
                the device again, enroll it anew with a new state directory.
                """)

        @OptionGroup var server: ServerOptions
        @Argument(help: "The agent's id (as `dredge agents` lists it).") var id: String
        @Option(help: "Why (a ticket number, \"laptop stolen\"): recorded in the audit log.") var reason: String?

        func run() async throws {
            let client = try server.client()
            let agent = try await calling { try await client.revokeAgent(id, reason: reason) }
            print(AgentsCommand.describe(agent, uid: nil))
            Terminal.error("revoked agent \(agent.agentID)\(agent.hostname.isEmpty ? "" : " (\(agent.hostname))"): its connection is closed and it may not connect again\n")
        }
    }

    /// One agent on one line: id, host, app and version, labels, presence, records, users.
    static func describe(_ a: AgentRecord, uid: String?) -> String {
        var parts = [a.agentID, a.hostname.isEmpty ? "-" : a.hostname, a.app.isEmpty ? "-" : "\(a.app) \(a.appVersion)".trimmingCharacters(in: .whitespaces)]
        if !a.labels.isEmpty { parts.append(a.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")) }
        if let revoked = a.revokedAt {
            parts.append("REVOKED \(Format.time(revoked))\(a.revokedBy.map { " by \($0)" } ?? "")")
        } else {
            parts.append(a.connected ? "online since \(Format.time(a.connectedAt)) from \(a.remoteAddress ?? "?")" : "offline, last seen \(Format.time(a.lastHeartbeatAt ?? a.connectedAt))")
        }
        parts.append("\(a.storeRecords) records")
        parts.append("users: \(a.reportedUsers)\(a.usersTruncated ? "+" : "") (active: \(a.activeUIDs.isEmpty ? "-" : a.activeUIDs.prefix(5).joined(separator: ",") + (a.activeUIDs.count > 5 ? ",…" : "")))")
        if let uid { parts.append(a.uidLastSeen.map { "\(uid) last seen \(Format.time($0))" } ?? "\(uid) active in the last day") }
        return parts.joined(separator: "  ")
    }
}

struct PullCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pull",
        abstract: "Pull a user's logs from every agent that has them (or from one agent).",
        discussion: "With --wait, shows progress until every agent is done, then each device's outcome and how to get the files (dredge fetch, dredge logs, the console); with --out, downloads them.")

    @OptionGroup var server: ServerOptions
    @OptionGroup var selection: FilterOptions

    @Option(help: "Only this agent (with --uid: that agent's records of the uid).")
    var agent: String?

    @Option(help: "Minutes the pull may wait for an offline agent before it expires (a delivered pull that then goes quiet expires 15 minutes later).")
    var expiresIn = 60

    @Option(help: "Why (a ticket number, say): recorded in the audit log.")
    var reason: String?

    @Flag(help: "Urgent: a device whose upload policy waits (for an unmetered network, under a byte cap or a daily budget) lets it by, if its policy allows urgent pulls.")
    var urgent = false

    @Flag(help: "Wait until every device is done, showing progress, then say how to get the files.")
    var wait = false

    @Option(help: "With --wait: download the files into this directory (as `dredge fetch` does).")
    var out: String?

    @Option(help: "With --wait: give up after this many seconds (the pull goes on on the server).")
    var timeout: Int?

    @Flag(help: "JSON output (the pull as it ends, with --wait).")
    var json = false

    func validate() throws {
        guard selection.uid != nil || agent != nil else { throw ValidationError("give --uid, --agent, or both") }
        guard (1...7 * 24 * 60).contains(expiresIn) else { throw ValidationError("--expires-in must be between 1 and \(7 * 24 * 60) minutes") }
        if let agent { try IDPrefix.validate(agent, flag: "--agent") }
        if let reason, let problem = reasonProblem(reason) { throw ValidationError("--reason: \(problem)") }
        if out != nil && !wait { throw ValidationError("--out needs --wait") }
    }

    func run() async throws {
        let client = try server.client()
        let agentID: String? = if let agent { try await client.resolveAgent(agent) } else { nil }
        let request = PullRequest(uid: selection.uid, agent: agentID, filter: try selection.filter(), expiresInSeconds: expiresIn * 60, reason: reason, urgent: urgent ? true : nil)
        let created = try await calling { try await client.createPull(request) }
        // A type no record pulled so far has is most likely a typo; the devices may still hold
        // it, so the pull goes ahead.
        if let types = request.filter.types, let vocabulary = try? await client.vocabulary() {  // only a hint: its failure changes nothing
            for unknown in vocabulary.unknown(types: types.map(\.rawValue).sorted(), hosts: nil, apps: nil) {
                Terminal.error("dredge: warning: \(Terminal.field(unknown.described(subject: "no record pulled so far"))); the devices may still hold it\n")
            }
        }
        guard wait else {
            if json { return try printJSON(created) }
            print(created.id)
            Terminal.error("\(Self.queued(created)); follow it with `dredge show \(created.id)`\n")
            return
        }
        Terminal.error("\(Self.queued(created))\n")
        let devices = await Devices.of(client)
        let progress = ProgressDisplay(devices: devices)
        let deadline = timeout.map { ContinuousClock.now + .seconds($0) }
        let finished = try await calling {
            try await withThrowingTaskGroup(of: PullRecord?.self) { group in
                group.addTask { try await client.wait(for: created.id) { progress.show($0) } }
                if let deadline {
                    group.addTask {
                        try await Task.sleep(until: deadline)
                        return nil
                    }
                }
                let first = try await group.next()!
                group.cancelAll()
                return first
            }
        }
        progress.end()
        guard let finished else {
            throw fail("gave up waiting after \(timeout!) s; the pull goes on: `dredge show \(created.id)`")
        }
        if json { try printJSON(finished) } else if out == nil { Format.printResult(finished, devices: devices, server: client.baseURL) }
        if let out, finished.targets.contains(where: { $0.status == .complete }) {
            // Named again: agents that joined while it ran are listed now.
            try await DredgeFetch.files(of: finished.id, client: client, into: out, devices: await Devices.of(client), toStderr: json)
        }
        if finished.targets.isEmpty || finished.targets.contains(where: { $0.status != .complete }) { throw ExitCode(2) }
    }

    /// What was queued, on one line: a pull by uid that no agent holds yet waits for one.
    static func queued(_ pull: PullRecord) -> String {
        if pull.isAwaitingApproval {
            return "pull \(pull.id) awaits approval: no device is sent it until an investigator or admin other than \(pull.requestedBy) runs "
                + "`dredge approve \(pull.id.prefix(8))` (or presses Approve on its console page), before \(Format.time(pull.expiresAt.date))"
        }
        if pull.targets.isEmpty {
            return "queued pull \(pull.id): no agent holds uid \(pull.uid) yet; the pull waits for one until \(Format.time(pull.expiresAt.date))"
        }
        return "queued pull \(pull.id) for \(pull.targets.count) agent(s)"
            + (pull.agentID.isEmpty ? " (agents that come to hold uid \(pull.uid) before \(Format.time(pull.expiresAt.date)) join it)" : "")
    }
}

struct PullsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pulls", abstract: "List recent pulls and feedback, newest first, and where each stands per agent.")

    @OptionGroup var server: ServerOptions
    @Option(help: "Only targets in this status: \(PullStatus.allCases.map(\.rawValue).joined(separator: ", ")).") var status: PullStatus?
    @Option(help: "Only pulls and feedback of this uid.") var uid: String?
    @Option(help: "Only pulls whose reason holds this text (a ticket number, say; letters in any case). Feedback has no reason: it is left out.")
    var reason: String?
    @Flag(help: "JSON output (the pulls alone; `dredge feedback --json` lists feedback).") var json = false

    func validate() throws {
        if let reason, let problem = reasonProblem(reason) { throw ValidationError("--reason: \(problem)") }
    }

    func run() async throws {
        let client = try server.client()
        let narrowed = uid != nil || status != nil || reason != nil
        // Narrowed here (the reason on the server), so the window is wider when narrowing.
        var pulls = try await calling { try await client.pulls(limit: narrowed ? 1000 : nil, reason: reason) }
        // Again here: a server from before reasons were kept ignores `reason` and lists every pull.
        if let reason {
            let needle = PullReason.folded(reason)
            pulls = pulls.filter { $0.reason.map { PullReason.folded($0).contains(needle) } ?? false }
        }
        if let uid { pulls = pulls.filter { $0.uid == uid } }
        if let status {
            pulls = pulls.compactMap { pull in
                var pull = pull
                pull.targets = pull.targets.filter { $0.status == status }
                return pull.targets.isEmpty ? nil : pull
            }
        }
        if json { return try printJSON(pulls) }
        var feedback = reason != nil ? [] : try await calling { try await client.feedback(limit: narrowed ? 1000 : nil) }
        if let uid { feedback = feedback.filter { $0.uid == uid } }
        if let status { feedback = feedback.filter { $0.status.rawValue == status.rawValue } }
        if pulls.isEmpty && feedback.isEmpty { print(!narrowed ? "no pulls yet" : reason != nil ? "no pulls match" : "no pulls or feedback match") }
        let devices = await Devices.of(client)
        // Feedback uploads are pulls nobody asked for: the user's agent sent them. One list, newest first.
        var lines: [(Timestamp, String)] = []
        for p in pulls {
            let why = p.reason.map { "  (\(Terminal.field($0)))" } ?? ""
            if let removed = p.removed {
                // Its files are gone: one line says so, whatever its targets were.
                lines.append((p.issuedAt, "\(p.id)  \(Format.time(p.issuedAt.date))  by \(p.requestedBy)\(why)  uid=\(p.uid.isEmpty ? "-" : p.uid)  \(Format.removed(removed))"))
                continue
            }
            let disk = p.diskBytes.map { "  [\(Format.bytes($0))]" } ?? ""
            if p.isAwaitingApproval && p.expiresAt > .now && status == nil {
                lines.append((p.issuedAt, "\(p.id)  \(Format.time(p.issuedAt.date))  by \(p.requestedBy)\(why)  uid=\(p.uid.isEmpty ? "-" : p.uid)  awaiting approval"))
                continue
            }
            if p.targets.isEmpty && status == nil {
                let state = p.isFinished ? "expired (no agent held the uid)" : "waiting for an agent that holds the uid (until \(Format.time(p.expiresAt.date)))"
                lines.append((p.issuedAt, "\(p.id)  \(Format.time(p.issuedAt.date))  by \(p.requestedBy)\(why)  uid=\(p.uid)  \(state)"))
            }
            for t in p.targets {
                // The pull's disk use once, on its first line.
                let shown = t.agentID == p.targets.first?.agentID ? disk : ""
                lines.append(
                    (p.issuedAt, "\(p.id)  \(Format.time(p.issuedAt.date))  by \(p.requestedBy)\(why)  uid=\(p.uid.isEmpty ? "-" : p.uid)  on \(devices.name(t.agentID))  \(Format.status(t))\(shown)"))
            }
        }
        for f in feedback {
            let state = f.removed.map(Format.removed) ?? Format.status(f) + (f.diskBytes.map { "  [\(Format.bytes($0))]" } ?? "")
            lines.append((f.createdAt, "\(f.id)  \(Format.time(f.createdAt.date))  feedback  uid=\(f.uid)  on \(devices.name(f.agentID))  \(state)  \"\(Format.excerpt(f.text))\""))
        }
        for (_, line) in lines.sorted(by: { $0.0 > $1.0 }) { print(line) }
        let total = pulls.compactMap(\.diskBytes).reduce(0, +) + feedback.compactMap(\.diskBytes).reduce(0, +)
        if !lines.isEmpty && (pulls.contains { $0.diskBytes != nil } || feedback.contains { $0.diskBytes != nil }) {
            print("\(Format.bytes(total)) on the server's disk for these")
        }
    }
}

extension PullStatus: ExpressibleByArgument {}

struct ShowCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "show", abstract: "Show one pull: its filter, who asked, each device's status, and how to get its files.")

    @OptionGroup var server: ServerOptions
    @Argument(help: "The pull id, or its first 4 or more characters.") var pull: String
    @Flag(help: "Wait until every agent is done, showing progress.") var wait = false
    @Flag(help: "JSON output.") var json = false

    func run() async throws {
        let client = try server.client()
        let id = try await client.resolvePull(pull)
        var record = try await calling { try await client.pull(id) }
        // Names for people only: `--json` carries the ids.
        let devices = json && !wait ? Devices(known: [:]) : await Devices.of(client)
        if wait && !record.isFinished {
            let progress = ProgressDisplay(devices: devices)
            record = try await calling { try await client.wait(for: record.id) { progress.show($0) } }
            progress.end()
        }
        if json {
            try printJSON(record)
        } else {
            print("pull \(record.id)")
            print("  requested by \(record.requestedBy) at \(Format.time(record.issuedAt.date)), expires \(Format.time(record.expiresAt.date))")
            if let reason = record.reason { print("  reason: \(Terminal.field(reason))") }
            if let approval = record.approval {
                if let by = approval.approvedBy, let at = approval.approvedAt {
                    print("  approved by \(by) at \(Format.time(at))")
                } else {
                    print(
                        record.removed != nil ? "  never approved: it was removed first"
                            : record.expiresAt > .now ? "  awaiting approval: no device is sent it until another investigator or admin runs `dredge approve \(record.id.prefix(8))`"
                            : "  never approved: it expired unapproved")
                }
            }
            print("  uid: \(record.uid.isEmpty ? "-" : record.uid)   device: \(record.agentID.isEmpty ? "(every one that holds the uid until it expires)" : devices.name(record.agentID))")
            print("  filter: \(record.filter.map(Format.filter) ?? "(unreadable on the server; the pull is failed)")")
            if let removed = record.removed {
                print("  \(Format.removed(removed))")
            } else if let disk = record.diskBytes {
                print("  on the server's disk: \(Format.bytes(disk))")
            }
            Format.printResult(record, devices: devices, server: client.baseURL)
        }
        if wait && (record.targets.isEmpty || record.targets.contains(where: { $0.status != .complete })) { throw ExitCode(2) }
    }
}

struct FeedbackCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "feedback", abstract: "Feedback users sent with their logs: list, show one, or download its files.",
        subcommands: [List.self, Show.self, Fetch.self], defaultSubcommand: List.self)

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Recent feedback, newest first.")
        @OptionGroup var server: ServerOptions
        @Flag(help: "JSON output.") var json = false

        func run() async throws {
            let client = try server.client()
            let all = try await calling { try await client.feedback() }
            if json { return try printJSON(all) }
            if all.isEmpty { print("no feedback yet") }
            let devices = await Devices.of(client)
            for f in all {
                print("\(f.id)  \(Format.time(f.createdAt.date))  uid=\(f.uid)  on \(devices.name(f.agentID))  \(Format.status(f))  \"\(Format.excerpt(f.text))\"")
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "One feedback: the text, who, when, and how to get its files.")
        @OptionGroup var server: ServerOptions
        @Argument(help: "The feedback id, or its first 4 or more characters.") var id: String
        @Flag(help: "JSON output.") var json = false

        func run() async throws {
            let client = try server.client()
            let resolved = try await client.resolveFeedback(id)
            let f = try await calling { try await client.feedback(resolved) }
            if json { return try printJSON(f) }
            print("feedback \(f.id)")
            let devices = await Devices.of(client)
            print("  from uid \(f.uid) on \(devices.name(f.agentID)), given \(Format.time(f.createdAt.date)), received \(Format.time(f.receivedAt))")
            print("  status: \(Format.status(f))")
            if let removed = f.removed {
                print("  \(Format.removed(removed))")
            } else if let disk = f.diskBytes {
                print("  on the server's disk: \(Format.bytes(disk))")
            }
            // Its own lines kept, each indented under it: a line of it cannot pass for one of ours.
            print("  text: \(f.text.replacingOccurrences(of: "\r\n", with: "\n").replacingOccurrences(of: "\n", with: "\n        "))")
            if f.status == .complete && f.removed == nil {
                print("  get its files: dredge feedback fetch \(f.id) [--out DIR], read them: dredge logs --feedback \(f.id), or in the console: \(Format.consoleURL(client.baseURL, "feedback/\(f.id)/files"))")
            }
        }
    }

    struct Fetch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Download a feedback's files: its per-day JSON-lines files and manifest (or its zip).",
            discussion: """
                Files go to DIR/FEEDBACK/. Each is checked against the SHA-256 the server lists; an
                interrupted download goes on where it stopped when run again, and files already
                there are not downloaded again. Downloads are recorded in the server's audit log.
                """)
        @OptionGroup var server: ServerOptions
        @Argument(help: "The feedback id, or its first 4 or more characters.") var id: String
        @Option(help: "Where to put the files (default: the current directory).") var out = "."
        @Flag(help: "Its zip instead of its per-day files.") var zip = false

        func run() async throws {
            let client = try server.client()
            let resolved = try await client.resolveFeedback(id)
            let listed = try await calling { try await client.feedbackFiles(resolved) }
            let wanted = listed.filter { ($0.kind == .zip) == zip }
            guard !wanted.isEmpty else {
                let f = try await calling { try await client.feedback(resolved, diskUse: false) }
                if let removed = f.removed { throw fail("feedback \(resolved) has no files: \(Format.removed(removed))") }
                throw fail("feedback \(resolved) has no files yet (\(Format.status(f))): `dredge feedback show \(resolved)` says where it stands")
            }
            let root = URL(fileURLWithPath: out).standardizedFileURL.path + "/" + resolved
            var bytes: Int64 = 0
            for file in wanted {
                guard AdminClient.isSafeName(file.name) else { throw fail("the server listed a file named \(file.name.debugDescription): refused") }
                let path = root + "/" + file.name
                let outcome = try await calling { try await client.download(feedback: resolved, file: file, to: path) }
                print("\(path)  \(Format.bytes(file.size))  sha256 \(file.sha256.prefix(16))…  \(DredgeFetch.describe(outcome))")
                bytes += file.size
            }
            print("\(wanted.count) file(s), \(Format.bytes(bytes)), each checked against its SHA-256, in \(root)")
        }
    }
}

struct AuditCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audit", abstract: "The audit log, newest first: which token asked for what, and when; refused tokens with their source.",
        discussion: "Each line starts with the entry's id; --before ID shows the page after it. `dredge audit verify` checks the log's hash chain.",
        subcommands: [AuditVerifyCommand.self])

    @OptionGroup var server: ServerOptions
    @Option(help: "Entries from this time (the same forms as `dredge logs --since`).") var since: String?
    @Option(help: "Only this actor's entries (a token's name; - for refused tokens).") var actor: String?
    @Option(help: ArgumentHelp("Only this action: \(AuditAction.filters.joined(separator: ", ")).", discussion: "An action matches itself only (pull: the pulls made); token and console match the actions under them (token.create, token.revoke; console.sign-in, console.sign-out).")) var action: String?
    @Option(help: "Entries older than the one with this id.") var before: Int64?
    @Option(help: "At most this many entries (1 to 10000).") var limit = 100
    @Flag(help: "JSON output.") var json = false

    func validate() throws {
        guard (1...10_000).contains(limit) else { throw ValidationError("--limit must be between 1 and 10000") }
        if let since, Timestamp(userInput: since) == nil { throw ValidationError("cannot read --since '\(since)': give \(Timestamp.userInputForms)") }
    }

    func run() async throws {
        let client = try server.client()
        let query = AuditQuery(since: since.flatMap { Timestamp(userInput: $0)?.date }, actor: actor, action: action, before: before, limit: limit)
        let entries = try await calling { try await client.audit(query) }
        if json { return try printJSON(entries) }
        if entries.isEmpty { print("no audit entries match") }
        let devices = await Devices.of(client)
        for e in entries { print("\(e.id.map(String.init) ?? "-")  \(Format.time(e.at))  \(e.actor)  \(e.action)  \(devices.naming(Terminal.field(e.detail)))") }
        if entries.count == limit, let last = entries.last?.id {
            Terminal.error("dredge: more entries may follow: --before \(last)\n")
        }
    }
}

struct AuditVerifyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify", abstract: "Check the audit log's hash chain from its first entry: an entry edited, removed or moved breaks it.",
        discussion: """
            Exits 0 when the chain holds, 1 when it breaks (saying at which entry and why). Entries cut from the end leave the \
            chain whole: keep the last id and hash it prints elsewhere, or compare with the server's audit.file copy.
            """)

    @OptionGroup var server: ServerOptions
    @Flag(help: "JSON output.") var json = false

    func run() async throws {
        let client = try server.client()
        let verdict = try await calling { try await client.verifyAudit() }
        if json {
            try printJSON(verdict)
        } else if let broken = verdict.broken {
            print("audit log: BROKEN at entry \(verdict.brokenAt.map(String.init) ?? "?"): \(broken)")
            print("  \(verdict.entries) entries before it hold\(verdict.lastID.map { " (up to entry \($0))" } ?? "")")
        } else {
            print("audit log: intact, \(verdict.entries) entries")
            if let id = verdict.lastID, let hash = verdict.lastHash { print("  last entry \(id), hash \(hash)") }
        }
        if !verdict.intact { throw ExitCode(1) }
    }
}

struct TokensCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tokens", abstract: "List, create and revoke admin and enrollment tokens.",
        discussion: "Rotate a token: create a new one, move its users over, revoke the old one. Changes take effect at once.",
        subcommands: [List.self, Create.self, Revoke.self], defaultSubcommand: List.self)

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List tokens by name (never the secrets).")
        @OptionGroup var server: ServerOptions
        @Flag(help: "JSON output.") var json = false

        func run() async throws {
            let client = try server.client()
            let tokens = try await calling { try await client.tokens() }
            if json { return try printJSON(tokens) }
            for t in tokens { print(TokensCommand.describe(t)) }
        }
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a token; its secret is printed once.")
        @OptionGroup var server: ServerOptions
        @Option(help: "A name for the token (who or what uses it).") var name: String
        @Option(help: "admin or enrollment.") var kind: TokenKind = .admin
        @Option(help: ArgumentHelp("Refused after this long (30m, 12h, 7d; a minute to a year).", valueName: "duration"))
        var expiresIn: String?
        @Option(help: "Enrollment tokens: how many agents may enroll with it (1 to 1000000).") var uses: Int?
        @Option(help: "Admin tokens: reader (reads what was pulled), investigator (also pulls) or admin (everything; the default).")
        var role: AdminRole?
        @Option(
            name: .customLong("app"),
            help: ArgumentHelp("Readers and investigators: only devices of this app, with versions as app@>=2.1,<3 (repeat for more apps).", valueName: "app"))
        var apps: [String] = []
        @Option(
            name: .customLong("label"), help: ArgumentHelp("Readers and investigators: only devices with this label (repeat: every one).", valueName: "name=value"))
        var labels: [String] = []

        func validate() throws {
            if let expiresIn, TokensCommand.seconds(expiresIn) == nil { throw ValidationError("--expires-in: '\(expiresIn)' is not a duration such as 30m, 12h or 7d") }
            if kind == .admin, role == nil, !apps.isEmpty || !labels.isEmpty { throw ValidationError("a scope (--app, --label) needs --role reader or investigator") }
            let request = try self.request
            if let problem = request.limitsProblem {
                throw ValidationError(problem.replacingOccurrences(of: "expiresInSeconds", with: "--expires-in").replacingOccurrences(of: "uses must", with: "--uses must"))
            }
        }

        var request: TokenRequest {
            get throws {
                let scope: AccessScope
                do {
                    scope = try AccessScope(apps: apps, labels: labels)
                } catch let error as AccessScopeError {
                    switch error {
                    case .app: throw ValidationError("--app: \(error)")
                    case .label: throw ValidationError("--label: \(error)")
                    case .problem: throw ValidationError(error.description)
                    }
                }
                return TokenRequest(
                    name: name, kind: kind, expiresInSeconds: expiresIn.flatMap(TokensCommand.seconds), uses: uses, role: role,
                    scope: scope.isEverything ? nil : scope)
            }
        }

        func run() async throws {
            let client = try server.client()
            let request = try self.request
            let created = try await calling { try await client.createToken(request) }
            // A server from before roles ignores them and makes an admin: take it back at once.
            if kind == .admin, created.info.role != (request.role ?? .admin) || created.info.scope != request.scope {
                try await calling { try await client.revokeToken(kind: .admin, name: created.info.name) }
                throw fail("the server does not know roles or scopes (it is older than this dredge): the token it made was an admin, and is revoked")
            }
            print(created.token)
            Terminal.error("created \(TokensCommand.describe(created.info)); it is not shown again\n")
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke a token at once.")
        @OptionGroup var server: ServerOptions
        @Option(help: "The token's name.") var name: String
        @Option(help: "admin or enrollment.") var kind: TokenKind = .admin

        func run() async throws {
            let client = try server.client()
            try await calling { try await client.revokeToken(kind: kind, name: name) }
            Terminal.error("revoked \(kind.rawValue) token '\(name)'\n")
        }
    }
}

extension TokensCommand {
    /// A token on one line: kind, name, an admin token's role and scope, created, and its limits.
    static func describe(_ t: TokenInfo) -> String {
        var line = "\(t.kind.rawValue)  \(t.name)"
        if let role = t.role { line += "  \(role.rawValue)" + (t.scope.map { " of \($0)" } ?? "") }
        line += "  created \(Format.time(t.createdAt))"
        if let expiresAt = t.expiresAt { line += "  \(expiresAt <= Date() ? "expired" : "expires") \(Format.time(expiresAt))" }
        if let uses = t.usesLeft { line += "  \(uses) use\(uses == 1 ? "" : "s") left" }
        return line
    }

    /// Seconds of `30m`, `12h`, `7d` (or `90s`).
    static func seconds(_ text: String) -> Int? {
        guard let unit = text.last, let count = Int(text.dropLast()), count > 0 else { return nil }
        let per = ["s": 1, "m": 60, "h": 3600, "d": 86_400][String(unit)]
        return per.flatMap { count.multipliedReportingOverflow(by: $0).overflow ? nil : count * $0 }
    }
}

extension TokenKind: ExpressibleByArgument {}
extension AdminRole: ExpressibleByArgument {}

struct ApproveCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "approve", abstract: "Approve a pull that awaits a second person's approval: its devices are then sent it.",
        discussion: """
            On a deployment that requires approvals (approvals.required), a pull carries a reason and waits,
            sent to no device, until an investigator or admin other than the one who asked approves it;
            unapproved, it expires. The audit log records who asked, who approved and why (pull.approve).
            """)
    @OptionGroup var server: ServerOptions
    @Argument(help: "The pull id, or its first 4 or more characters.") var pull: String
    @Flag(help: "JSON output.") var json = false

    func run() async throws {
        let client = try server.client()
        let id = try await client.resolvePull(pull)
        let approved = try await calling { try await client.approvePull(id) }
        if json { return try printJSON(approved) }
        print("approved pull \(approved.id) (asked by \(approved.requestedBy)\(approved.reason.map { ", reason: \(Terminal.field($0))" } ?? "")); its \(approved.targets.count) device(s) are sent it now")
    }
}

struct WhoAmICommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "whoami", abstract: "Who the admin token signs in: its name, role, scope and expiry.",
        discussion: """
            A reader searches and downloads what was pulled; an investigator also pulls; an admin does
            everything. A scope limits a reader or investigator to some apps' or labels' devices. A
            command the role may not run exits with status 77.
            """)
    @OptionGroup var server: ServerOptions
    @Flag(help: "JSON output.") var json = false

    func run() async throws {
        let client = try server.client()
        let me = try await calling { try await client.whoami() }
        if json { return try printJSON(me) }
        print("\(me.name)  \(me.role.rawValue)")
        print("scope    \(me.scope)")
        print("expires  \(me.expiresAt.map(Format.time) ?? "never")")
    }
}
