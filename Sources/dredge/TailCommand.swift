import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeCommandLine
import DredgeDomain
import Dispatch
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// `dredge tail`: watch what a user's devices log, as they log it (#53).
struct TailCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tail",
        abstract: "Watch a user's devices live: the records they log from now on, as one timeline.",
        discussion: """
            Every online device that holds the user starts sending the matching records it logs
            from now on; a device that comes online or starts holding the user during the tail
            joins it. Lines are as `dredge logs` prints them, with the host and app. The tail ends
            on Ctrl-C (it is stopped on the server), at --for, or when someone stops it. What was
            seen is kept on the server. --verbose has the devices also keep the user's debug and
            trace records while the tail runs, and go back to their level at its end, by
            themselves if the server is gone.

            Examples:
              dredge tail --uid u-1002 --level warning+
              dredge tail --uid u-1002 --host kitchen-oven-0042 --verbose --for 10m --reason T-1
              dredge tail --watch 3f2c…          (watch a running tail again)
              dredge tail --stop 3f2c…
            """)

    @OptionGroup var server: ServerOptions

    @Option(help: "The user whose devices to watch.") var uid: String?
    @Option(help: "Only this device (an agent id or its first 4+ characters).") var agent: String?
    @Option(help: "Only the devices of this host name.") var host: String?
    @Option(name: .customLong("level"), help: "Levels: 'error', 'warning,error' or 'warning+'; repeatable.") var levels: [String] = []
    @Option(name: .customLong("type"), help: "Log types; repeatable or comma-separated.") var types: [String] = []
    @Option(help: "Only records whose message or metadata contain this text (any case), matched on the device.") var grep: String?
    @Option(name: .customLong("for"), help: "How long: 30s, 15m, 1h (at most 1h).") var duration = "15m"
    @Flag(help: "Also keep the user's debug and trace records on the devices while the tail runs.") var verbose = false
    @Option(name: .customLong("verbose-types"), help: "With --verbose: only of these types; repeatable or comma-separated.") var verboseTypes: [String] = []
    @Option(help: "At most this many records a second per device (1–10000).") var rate: UInt32 = TailRequest.defaultRecordsPerSecond
    @Option(help: "Why (a ticket number, say): recorded in the audit log.") var reason: String?
    @Flag(help: "Urgent: a device whose upload policy holds live traffic (a metered network, a spent daily budget) runs it anyway, if its policy allows urgent tails.") var urgent = false
    @Option(help: "Watch this running tail (an id or its first 4+ characters) instead of starting one.") var watch: String?
    @Option(help: "Stop this tail (an id or its first 4+ characters), and watch nothing.") var stop: String?
    @Option(help: "text or jsonl.") var format: LogsCommand.OutputFormat = .text
    @Flag(help: "Show times in UTC (default: this machine's zone, TZ).") var utc = false
    @Option(help: "Colour: auto (on a terminal), always, never.") var color: LogsCommand.ColorChoice = .auto

    func validate() throws {
        if format == .json { throw ValidationError("a tail prints records as they come: use --format text or jsonl") }
        let modes = [uid != nil, watch != nil, stop != nil].filter { $0 }.count
        guard modes == 1 else { throw ValidationError("give --uid (start a tail), --watch ID or --stop ID") }
        if let watch { try IDPrefix.validate(watch, flag: "--watch") }
        if let stop { try IDPrefix.validate(stop, flag: "--stop") }
        if uid != nil { _ = try request() }
    }

    /// The flags as a request.
    func request() throws -> TailRequest {
        guard let uid else { throw ValidationError("--uid is needed") }
        if let problem = UserID.problem(uid) { throw ValidationError("--uid: \(problem)") }
        if let agent { try IDPrefix.validate(agent, flag: "--agent") }
        var filter = LogFilter()
        if !levels.isEmpty { filter.levels = try FilterOptions.levels(levels) }
        if !types.isEmpty { filter.types = try FilterOptions.types(types) }
        if let grep {
            guard !grep.isEmpty else { throw ValidationError("--grep needs some text") }
            filter.text = grep
        }
        guard let seconds = Self.seconds(duration), (1...3_600).contains(seconds) else {
            throw ValidationError("cannot read --for '\(duration)': give 30s, 15m or 1h (at most an hour)")
        }
        guard (1...10_000).contains(rate) else { throw ValidationError("--rate is 1 to 10000 records a second") }
        if !verboseTypes.isEmpty && !verbose { throw ValidationError("--verbose-types goes with --verbose") }
        let verboseTypes = try verboseTypes.isEmpty ? [] : FilterOptions.types(verboseTypes).map(\.rawValue).sorted()
        if let reason, let problem = reasonProblem(reason) { throw ValidationError("--reason: \(problem)") }
        return TailRequest(
            uid: uid, agent: agent, host: host, filter: filter, durationSeconds: seconds, recordsPerSecond: rate, verbose: verbose, verboseTypes: verboseTypes,
            reason: reason, urgent: urgent ? true : nil)
    }

    /// `30s`, `15m`, `1h` as seconds.
    static func seconds(_ text: String) -> Int? {
        guard let unit = text.last, let amount = Int(text.dropLast()), amount > 0, let per = ["s": 1, "m": 60, "h": 3_600][String(unit)], amount <= 3_600 / per
        else { return nil }
        return amount * per
    }

    func run() async throws {
        let client = try server.client()
        if let stop {
            let id = try await calling { try await client.resolveTail(stop) }
            let tail = try await calling { try await client.stopTail(id, reason: reason ?? "") }
            note("stopped tail \(tail.id): \(Self.summary(tail))")
            return
        }
        let tail: TailRecord
        // How each device is named in the notes: its host, as the server registered it.
        var hosts: [String: String] = [:]
        if let watch {
            let id = try await calling { try await client.resolveTail(watch) }
            tail = try await calling { try await client.tail(id) }
        } else {
            var request = try request()
            if let agent = request.agent { request.agent = try await calling { try await client.resolveAgent(agent) } }
            tail = try await calling { try await client.createTail(request) }
            let holders = try await calling { try await client.agents(uid: tail.uid) }.filter { tail.agents?.contains($0.agentID) ?? true }
            for holder in holders { hosts[holder.agentID] = holder.hostname }
            let online = holders.filter(\.connected).map { Terminal.field($0.hostname) }
            let offline = holders.filter { !$0.connected }.map { Terminal.field($0.hostname) }
            note(
                "tail \(tail.id) of uid \(Terminal.field(tail.uid)) until \(Format.time(tail.expiresAt.date)); "
                    + (online.isEmpty ? "no device holding it is online: waiting for one" : "watching \(online.joined(separator: ", "))")
                    + (offline.isEmpty ? "" : "; offline: \(offline.joined(separator: ", "))"))
        }
        // Ctrl-C stops the tail on the server; its stream then ends. A second one leaves at once.
        let interrupts = Interrupts()
        signal(SIGINT, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: SIGINT, queue: .global())
        source.setEventHandler {
            guard interrupts.count() == 1 else { Foundation.exit(130) }
            Task { do { _ = try await client.stopTail(tail.id, reason: "the engineer pressed Ctrl-C") } catch { Foundation.exit(130) } }
        }
        source.resume()
        defer { source.cancel() }

        let printer = RecordPrinter(format: format, utc: utc, color: color == .always || (color == .auto && isatty(1) == 1 && ProcessInfo.processInfo.environment["NO_COLOR"] == nil))
        var statuses: [String: TailPartStatus] = [:]
        try await calling {
            try await client.watchTail(tail.id) { event in
                switch event.kind {
                case .devices:
                    for part in event.devices ?? [] where statuses[part.agentID] != part.status {
                        statuses[part.agentID] = part.status
                        if hosts[part.agentID] == nil, let agent = try? await client.agents().first(where: { $0.agentID == part.agentID }) {  // only a name for the note
                            hosts[part.agentID] = agent.hostname
                        }
                        let name = hosts[part.agentID] ?? String(part.agentID.prefix(8))
                        note("\(Terminal.field(name)): \(part.status.rawValue)\(part.detail.isEmpty ? "" : ": " + Terminal.field(part.detail))")
                    }
                case .record:
                    if let agent = event.agent, let host = event.host { hosts[agent] = host }
                    if let record = event.foundRecord(tailID: tail.id) { printer.print(record) }
                case .dropped:
                    note("\(Terminal.field(event.host ?? event.agent ?? "a device")) left out \(event.count ?? 0) record(s) over the tail's rate")
                case .missed:
                    note("this terminal fell behind: \(event.count ?? 0) record(s) not shown (the server keeps them)")
                case .end:
                    note("tail \(tail.id) ended: \(Terminal.field(event.reason ?? ""))")
                    note("what it showed is kept: dredge fetch \(tail.id.prefix(8)) downloads it, dredge logs --uid \(Terminal.field(tail.uid)) searches it")
                }
            }
        }
    }

    static func summary(_ tail: TailRecord) -> String {
        let records = tail.parts.map(\.records).reduce(0, +)
        return "\(records) record(s) from \(tail.parts.count) device(s)"
    }

    private func note(_ text: String) { Terminal.error("dredge: \(text)\n") }
}

/// How many times Ctrl-C was pressed.
final class Interrupts: Sendable {
    private let pressed = Mutex(0)
    func count() -> Int { pressed.withLock { $0 += 1; return $0 } }
}
