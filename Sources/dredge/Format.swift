import DredgeCommandLine
import DredgeAdminAPI
import DredgeDomain
import Foundation
import Synchronization

/// How `dredge` shows things to people.
enum Format {
    static func time(_ date: Date?) -> String {
        guard let date else { return "-" }
        return date.formatted(.iso8601.year().month().day().time(includingFractionalSeconds: false).timeZone(separator: .omitted))
    }

    static func bytes(_ n: Int64) -> String { byteText(n) }

    /// "removed 2026-11-20T10:00:00+0100 by alice (T-1): files deleted"
    static func removed(_ r: Removal) -> String {
        let by = r.by == Removal.retention ? "after the server's retention" : "by \(r.by)"
        return "removed \(time(r.at)) \(by)" + (r.reason.isEmpty || r.by == Removal.retention ? "" : " (\(r.reason))") + ": files deleted"
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

    /// Each agent's outcome and, for complete ones, the files.
    static func printResult(_ pull: PullRecord) {
        if pull.targets.isEmpty {
            print(pull.isFinished ? "no agent held uid \(pull.uid) before the pull expired" : "no agent holds uid \(pull.uid) yet; waiting until \(time(pull.expiresAt.date))")
            return
        }
        for t in pull.targets {
            print("agent \(t.agentID): \(status(t))")
            if pull.removed == nil { for file in t.files { print("  \(file)") } }
        }
        let complete = pull.targets.filter { $0.status == .complete }
        let files = complete.flatMap(\.files).filter { $0.hasSuffix(".jsonl") }
        print("\(complete.count) of \(pull.targets.count) agent(s) complete, \(files.count) per-day file(s)")
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
        return "\(t.agentID.prefix(12))  [\(bar)] \(String(format: "%3d", Int(fraction * 100)))%  \(Terminal.field(Format.status(t)))"
    }
}
