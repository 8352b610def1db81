import DredgeCommandLine
import DredgeAdminAPI
import DredgeAdminClient
import DredgeDomain
import Foundation
import Synchronization

/// How `dredge` shows things to people.
enum Format {
    static func time(_ date: Date?) -> String {
        guard let date else { return "-" }
        // With its zone, as every surface prints times (`2026-11-20 11:00:00 +01:00`, or `… UTC`):
        // `--since` and the console read it back as the same instant.
        return Timestamp(date).shown(in: .current)
    }

    static func bytes(_ n: Int64) -> String { byteText(n) }

    /// "removed 2026-11-20 10:00:00 +01:00 by alice (T-1): files deleted"
    static func removed(_ r: Removal) -> String {
        let by = r.by == Removal.retention ? "after the server's retention" : "by \(r.by)"
        return "removed \(time(r.at)) \(Terminal.field(by))" + (r.reason.isEmpty || r.by == Removal.retention ? "" : " (\(Terminal.field(r.reason)))") + ": files deleted"
    }

    static func status(_ t: PullTarget) -> String {
        var text = t.status.rawValue
        if t.status == .uploading || (t.status == .complete && t.chunkCount > 0) {
            text += " \(t.chunksReceived)/\(t.chunkCount) chunks, \(bytes(t.bytes))"
        }
        // The detail may be an agent's words (a refusal): on one line, whatever it holds.
        if !t.detail.isEmpty { text += " (\(Terminal.field(t.detail)))" }
        return text
    }

    static func status(_ f: FeedbackRecord) -> String {
        var text = f.status.rawValue
        if f.status == .uploading { text += " \(f.chunksReceived)/\(f.chunkCount) chunks" }
        if f.status == .complete { text += " (\(f.records) records)" }
        if f.status == .failed, !f.detail.isEmpty { text += " (\(Terminal.field(f.detail)))" }
        return text
    }

    /// The start of a text, on one line.
    static func excerpt(_ text: String, _ length: Int = 60) -> String {
        let line = Terminal.field(text.replacingOccurrences(of: "\n", with: " "))
        return line.count > length ? String(line.prefix(length)) + "…" : line
    }

    static func filter(_ f: LogFilter) -> String { f.summary { time($0.date) } }

    /// Each device's outcome, by name, and how to get the files: paths on the server are not
    /// the engineer's to read (`--json` still lists them, for an operator on the server).
    static func printResult(_ pull: PullRecord, devices: Devices, server: URL) {
        if pull.targets.isEmpty {
            print(pull.isFinished ? "no agent held uid \(pull.uid) before the pull expired" : "no agent holds uid \(pull.uid) yet; waiting until \(time(pull.expiresAt.date))")
            return
        }
        for t in pull.targets {
            let days = t.files.filter { $0.hasSuffix(".jsonl") }.count
            print("\(devices.name(t.agentID)): \(status(t))" + (t.status == .complete && pull.removed == nil ? ", \(days) per-day file(s)" : ""))
        }
        let complete = pull.targets.filter { $0.status == .complete }
        let files = complete.flatMap(\.files).filter { $0.hasSuffix(".jsonl") }
        print("\(complete.count) of \(pull.targets.count) agent(s) complete, \(files.count) per-day file(s)")
        if !complete.isEmpty && pull.removed == nil {
            print("get them: dredge fetch \(pull.id) [--out DIR], read them: dredge logs --pull \(pull.id), or in the console: \(consoleURL(server, "pulls/\(pull.id)/files"))")
        }
    }

    /// A console page on the server the command talks to.
    static func consoleURL(_ server: URL, _ page: String) -> String {
        server.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + "/console/" + page
    }
}

/// Devices as an engineer reads them: the host name the agent gave (and its app), with the
/// start of its id to tell two of the same name apart; an agent the server no longer lists by
/// its id.
struct Devices: Sendable {
    /// Host name and app, by agent id.
    let known: [String: (host: String, app: String)]

    /// The server's agents, or none (each then shown by its id) when they cannot be listed:
    /// names are a help to reading, never a reason for a command to fail.
    static func of(_ client: AdminClient) async -> Devices {
        do {
            let agents = try await client.agents()
            return Devices(known: Dictionary(agents.map { ($0.agentID, (host: $0.hostname, app: $0.app)) }, uniquingKeysWith: { a, _ in a }))
        } catch {
            Terminal.error("dredge: devices are shown by id: their names could not be read (\(error))\n")
            return Devices(known: [:])
        }
    }

    /// "oven-7 (bakery) [3f2a1c0d]" (at most 48 characters of name), or the id; `wholeID`
    /// keeps the whole id in the brackets (where the id itself is the record, as in the audit log).
    func name(_ agentID: String, wholeID: Bool = false) -> String {
        guard let device = known[agentID], !device.host.isEmpty else { return agentID }
        var shown = Terminal.field(device.host) + (device.app.isEmpty ? "" : " (\(Terminal.field(device.app)))")
        if shown.count > 48 { shown = String(shown.prefix(47)) + "…" }
        return shown + " [\(wholeID ? agentID : String(agentID.prefix(8)))]"
    }

    /// `text` with each agent id it holds (a whole 32-character word) as ``name(_:)`` says it.
    func naming(_ text: String) -> String {
        text.replacing(/\b[0-9a-f]{32}\b/) { match in
            let id = String(match.output)
            return known[id] == nil ? id : name(id, wholeID: true)
        }
    }

    /// A device's download folder in `root`: one already there for the agent (`…_AGENT` or
    /// `AGENT`, whatever its host was called then), else ``folder(_:)``.
    func folder(_ agentID: String, in root: String) -> String {
        let present = (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []  // none yet: a new pull's
        return present.sorted().first { $0 == agentID || $0.hasSuffix("_" + agentID) } ?? folder(agentID)
    }

    /// A device's download folder: `HOST_AGENT` (the host name with anything but ASCII letters,
    /// digits, `-` and `.` as `_`), or the id alone when the server does not list the agent.
    func folder(_ agentID: String) -> String {
        guard let host = known[agentID]?.host else { return agentID }
        let safe = String(host.prefix(64).map { $0.isASCII && ($0.isLetter || $0.isNumber || "-.".contains($0)) ? $0 : "_" })
        return safe.allSatisfy({ $0 == "." || $0 == "_" }) ? agentID : safe + "_" + agentID
    }
}

/// A progress line per agent on stderr: redrawn in place on a terminal, one line per change
/// otherwise (logs, CI).
final class ProgressDisplay: Sendable {
    private struct Drawn {
        /// Lines drawn last time (on a terminal).
        var lines = 0
        /// The state last printed per agent (otherwise).
        var last: [String: String] = [:]
    }

    private let terminal = isatty(2) == 1
    private let drawn = Mutex(Drawn())
    private let devices: Devices

    init(devices: Devices) { self.devices = devices }

    func show(_ pull: PullRecord) {
        drawn.withLock { d in
            if terminal {
                var out = d.lines > 0 ? "\u{1B}[\(d.lines)A" : ""
                for t in pull.targets { out += "\u{1B}[2K" + line(t) + "\n" }
                d.lines = pull.targets.count
                FileHandle.standardError.write(Data(out.utf8))
            } else {
                for t in pull.targets {
                    let state = "\(t.status.rawValue) \(t.chunksReceived)/\(t.chunkCount)"
                    if d.last[t.agentID] != state {
                        d.last[t.agentID] = state
                        Terminal.error(line(t) + "\n")
                    }
                }
            }
        }
    }

    func end() {}

    private func line(_ t: PullTarget) -> String {
        let width = 30
        let fraction: Double = switch t.status {
        case .complete: 1
        case .uploading where t.chunkCount > 0: Double(t.chunksReceived) / Double(t.chunkCount)
        default: 0
        }
        let filled = Int((fraction * Double(width)).rounded(.down))
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        return "\(devices.name(t.agentID))  [\(bar)] \(String(format: "%3d", Int(fraction * 100)))%  \(Terminal.field(Format.status(t)))"
    }
}
