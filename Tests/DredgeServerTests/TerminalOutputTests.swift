import DredgeAdminAPI
import DredgeCommandLine
import DredgeDomain
import DredgeEnvelope
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing
@testable import DredgeServer

/// #49: text an agent chooses (messages, metadata, contexts, feedback text, a refusal's detail)
/// reached the engineer's terminal as raw bytes, so an agent could rewrite what `dredge` shows,
/// set the window title or write the clipboard (OSC 52). The real `dredge` against the real
/// server: every human-readable output shows control characters escaped; JSON stays exact.
@Suite struct TerminalOutputTests {
    /// OSC 52 (clipboard) ended by BEL, a screen clear, a carriage return, a C1 CSI, a
    /// right-to-left override, a backspace and a line break.
    static let hostile = "A\u{1B}]52;c;cHduZWQ=\u{07}B\u{1B}[2J\rC\u{9B}31mD\u{202E}E\u{08}F\nG"
    static let controls: Set<UInt32> = [0x1B, 0x07, 0x0D, 0x9B, 0x202E, 0x08]

    /// `dredge` run to completion on a thread of its own (the server under test answers on the
    /// test process's cooperative threads, which a waiting child must not hold).
    static func dredge(_ arguments: [String], on server: InProcessServer) async throws -> (status: Int32, output: String) {
        let environment = ["XDG_CONFIG_HOME": server.dir.file("config"), "DREDGE_SERVER": "", "DREDGE_TOKEN": "", "DREDGE_CA": "", "DREDGE_PROFILE": ""]
        let all = arguments + ["--server", server.adminURL, "--token", server.created.adminToken]
        return try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try ManagedProcess.run("dredge", all, environment: environment) }) }.start()
        }
    }

    @Test func agentTextReachesTheTerminalEscapedAndJSONExact() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent(hostname: "oven-7")
            let path = server.dir.file("hostile.sqlite")
            let (store, context) = try PullEndToEndTests.openDeviceStore(path, host: "h\u{1B}[8m")
            store.enqueue(
                LogEntry(
                    timestamp: Timestamp.now.subtracting(.seconds(60)), level: .error, type: "app", uid: "u-1", message: Self.hostile,
                    metadata: ["k": .string(Self.hostile), "plain": .string("x\u{1B}y")], context: context))
            try store.close()
            let feedbackID = Hex.encode(secureRandomBytes(16))
            let (pulled, rejected) = try await agent.connect { link in
                _ = try await server.admin.createPull(PullRequest(uid: "u-1", agent: agent.agentID, filter: .all))
                let pulled = try await HostileAgentTests.completePull(agent, link: link, store: path, dir: server.dir)
                let refused = try await server.admin.createPull(PullRequest(uid: "u-1", agent: agent.agentID, filter: .all))
                while let frame = try await link.next() {
                    if case .pullCommand? = frame.body { break }
                }
                try await link.send(.with { $0.commandRejected = .with { $0.commandID = refused.id; $0.reason = .rejectInvalid; $0.detail = Self.hostile } })
                let sent = try await LinkAgent.send(try agent.feedbackUpload(id: feedbackID, uid: "u-1", text: Self.hostile, store: path, dir: server.dir), over: link)
                #expect(sent.result.ok, "\(sent)")
                return (pulled, refused.id)
            }
            try await RecordSearchTests.indexed(server.indexer)
            #expect(try await PullOutcomeTests.waitFor { try await server.admin.pull(rejected).targets.first?.status == .rejected })

            // Each output that shows the text (the pulled record's, the refusal's detail, the
            // feedback's), and one that does not.
            for (arguments, shows) in [
                (["logs", "--uid", "u-1", "--limit", "0"], true), (["logs", "--uid", "u-1", "--color", "never", "--limit", "0"], true), (["pulls"], true),
                (["show", rejected], true), (["show", pulled], false), (["feedback"], true), (["feedback", "show", feedbackID], true),
            ] {
                let result = try await Self.dredge(arguments, on: server)
                #expect(result.status == 0, "\(arguments): \(result.output)")
                let raw = result.output.unicodeScalars.filter { Self.controls.contains($0.value) }
                #expect(raw.isEmpty, "\(arguments): raw \(raw.map { String($0.value, radix: 16) }) in \(result.output.debugDescription)")
                // Its line break too: no line of the output starts with what followed it (a
                // forged line), except the feedback's own text, which keeps its lines indented.
                #expect(!result.output.split(separator: "\n").contains { $0.hasPrefix("G") }, "\(arguments): \(result.output)")
                #expect(result.output.contains("\\u{1B}]52;c;cHduZWQ=\\u{7}") == shows, "\(arguments): \(result.output)")
            }
            // The log line holds the record on one line, its line break escaped too.
            let line = try await Self.dredge(["logs", "--pull", pulled, "--type", "app", "--color", "never", "--level", "error"], on: server)
            #expect(line.output.split(separator: "\n").filter { $0.contains("cHduZWQ") }.count == 1, "\(line.output)")
            #expect(line.output.contains("\\u{202E}E\\u{8}F"), "\(line.output)")
            // `--color always` paints with escapes of its own; the record's still show as text.
            let painted = try await Self.dredge(["logs", "--pull", pulled, "--type", "app", "--color", "always", "--level", "error"], on: server)
            #expect(painted.output.contains("\u{1B}[31m") && painted.output.contains("\\u{1B}[2J") && !painted.output.contains("\u{1B}[2J"))
            // JSON output is exact.
            let json = try await Self.dredge(["logs", "--pull", pulled, "--format", "jsonl", "--type", "app", "--level", "error"], on: server)
            let object = try #require(try LogsCommandEndToEndTests.jsonLines(json.output).first)
            #expect(object["message"] as? String == Self.hostile)
            #expect((object["metadata"] as? [String: Any])?["k"] as? String == Self.hostile)
        }
    }

    @Test func theEscapingItself() {
        #expect(Terminal.visible("plain ☃ é\ttab\nline") == "plain ☃ é\ttab\nline")
        #expect(Terminal.field("a\tb\nc") == "a\\u{9}b\\u{A}c")
        #expect(Terminal.visible("\u{0}\u{1B}\u{7F}\u{80}\u{9F}\u{A0}") == "\\u{0}\\u{1B}\\u{7F}\\u{80}\\u{9F}\u{A0}")
        #expect(Terminal.visible("\u{61C}") == "\\u{61C}")
        #expect(Terminal.visible("\u{200E}\u{200F}\u{202A}\u{202E}\u{2066}\u{2069}\u{2070}") == "\\u{200E}\\u{200F}\\u{202A}\\u{202E}\\u{2066}\\u{2069}\u{2070}")
    }
}
