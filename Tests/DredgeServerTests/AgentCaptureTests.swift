import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeLogging
import DredgePayload
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing
@testable import DredgeServer

/// The real agent (``AgentClient``) and the in-process server, both ends of standing triggers
/// (#54): the agent holds the set it is sent, matches what its app logs, and uploads the window
/// around a match as a capture, once per its budget.
@Suite struct AgentCaptureTests {
    @Test func aMatchIsCapturedOncePerBudgetWithItsWindowAndItsRecord() async throws {
        try await withStopping(InProcessServer()) { server in
            let registry = try #require(server.triggers)
            let trigger = try await server.admin.createTrigger(
                TriggerRequest(name: "payment declined", match: TriggerMatch(levels: ["error"], types: ["business"]), beforeSeconds: 30, afterSeconds: 1, perDevicePerDay: 1))
            let path = server.dir.file("app.sqlite")
            let (app, ctx) = try PullEndToEndTests.openDeviceStore(path, host: "oven-7")
            defer { try? app.close() }
            // Before the agent holds the trigger: never matched.
            app.enqueue(LogEntry(timestamp: .now, level: .error, type: .business, uid: "u-1", message: "declined before the trigger was held", context: ctx))
            try await app.flush()
            try await withStopping(PullOutcomeTests.Device(server, store: path)) { device in
                let agentID = device.state.file.agentID
                #expect(try await CaptureTests.answerRecorded(agentID, in: registry) { $0.triggerIDs == [trigger.id] })
                let triggers = try #require(device.client.triggers)
                #expect(await triggers.holding == [trigger.id])
                // The app logs: a few steps, the error that fires the trigger, one more after it.
                let t = Timestamp.now
                for second in [-20, -10, -1] {
                    app.enqueue(LogEntry(timestamp: t.adding(.seconds(second)), level: .info, type: .app, uid: "u-1", message: "step \(second)", context: ctx))
                }
                app.enqueue(LogEntry(timestamp: t.adding(.seconds(-5)), level: .info, type: .app, uid: "u-2", message: "another user's", context: ctx))
                app.enqueue(LogEntry(timestamp: t, level: .error, type: .business, uid: "u-1", message: "payment declined", metadata: ["code": .string("51")], context: ctx))
                try await app.flush()
                #expect(try await PullOutcomeTests.waitFor(.seconds(120)) { try await registry.captures(of: trigger.id, limit: 10).first?.status == .complete })
                let capture = try #require(try await registry.captures(of: trigger.id, limit: 10).first)
                #expect(capture.agentID == agentID && capture.uid == "u-1" && !capture.crash && capture.matchedAt == t)
                #expect(capture.since == t.subtracting(.seconds(30)) && capture.until == t.adding(.microseconds(1_000_001)))
                // The user's records of the window: its three steps, the error logged before the
                // trigger was held (in the window, though it fired nothing) and the match; not
                // the other user's.
                #expect(capture.records == 5, "\(capture)")
                let manifest = try JSONDecoder().decode(
                    ExportManifest.self, from: Data(contentsOf: URL(fileURLWithPath: server.data + "/captures/\(capture.id)/manifest.json")))
                #expect(manifest.kind == "capture" && manifest.capture?.triggerID == trigger.id && manifest.capture?.setVersion == 1)
                guard case .object(let match)? = manifest.capture?.match else {
                    Issue.record("the manifest names no matching record")
                    return
                }
                #expect(match["message"] == .string("payment declined") && match["metadata"] == .object(["code": .string("51")]))

                // A second match, outside the first window: the device's budget of 1 is spent.
                app.enqueue(LogEntry(timestamp: .now.adding(.seconds(5)), level: .error, type: .business, uid: "u-1", message: "payment declined again", context: ctx))
                try await app.flush()
                let end = try app.lastRowID()
                #expect(try await PullOutcomeTests.waitFor { await triggers.cursor >= end }, "the agent read the second match")
                #expect(await triggers.madeToday(trigger.id) == 1)
                #expect(try await registry.captures(of: trigger.id, limit: 10).count == 1)
                #expect(Feedback.pending(stateDirectory: device.state.directory).isEmpty, "nothing waits in the outbox")

                // The console groups it under its trigger, and reads it as a pull is read.
                let source = IndexedSource(kind: .capture, id: capture.id, agentID: agentID)
                #expect(try await PullOutcomeTests.waitFor { try await server.records.indexedSources().contains(source) })
                let browser = ConsoleLiveTailTests.Browser(server.adminURL)
                do {
                    try await browser.signIn(server.created.adminToken)
                    let page = try await browser.send("/console/triggers/\(trigger.id)")
                    #expect(page.status == 200 && page.body.contains("payment declined: 1 capture from 1 device in the last day; held by 1 device."), "\(page.body)")
                    #expect(page.body.contains(#"<a href="/console/captures/\#(capture.id)">"#))
                    let shown = try await browser.send("/console/captures/\(capture.id)")
                    #expect(shown.status == 200 && shown.body.contains(#"href="/console/logs?capture=\#(capture.id)""#) && shown.body.contains("u-1"))
                    let logs = try await browser.send("/console/logs?capture=\(capture.id)")
                    #expect(logs.status == 200 && logs.body.contains("payment declined") && !logs.body.contains("another user&#39;s"), "\(logs.body.prefix(400))")
                    let files = try await browser.send("/console/captures/\(capture.id)/files")
                    #expect(files.status == 200 && files.body.contains("manifest.json"))
                } catch {
                    try await browser.shutdown()
                    throw error
                }
                try await browser.shutdown()
                let api = try await server.admin.triggerActivity(trigger.id)
                #expect(api.lastDay == CaptureTally(captures: 1, devices: 1) && api.holders == 1 && api.captures.map(\.id) == [capture.id])
            }
        }
    }

    /// An app's run killed (SIGKILL) or crashed (SIGSEGV), in a real process with a rewind
    /// buffer: the agent finds the run ended uncleanly, stores what its buffer held, and uploads
    /// the minutes before its last record as a crash capture of the crash trigger, with the
    /// debug records from before the end.
    @Test(arguments: ["kill", "segv"])
    func aCrashedRunIsCapturedWithItsRewoundRecords(_ end: String) async throws {
        try await withStopping(InProcessServer()) { server in
            let registry = try #require(server.triggers)
            let trigger = try await server.admin.createTrigger(TriggerRequest(name: "crashes", crash: true, app: "crash-child", beforeSeconds: 600))
            let path = server.dir.file("crash.sqlite")
            try await withStopping(PullOutcomeTests.Device(server, store: path)) { device in
                #expect(try await CaptureTests.answerRecorded(device.state.file.agentID, in: registry) { $0.triggerIDs == [trigger.id] })
                // The app: 200 info records stored, 200 debug ones in its rewind buffer, then its end.
                let (child, line) = try startCrashChild(["rewind", path, "200", end])
                #expect(line == "ready\n")
                let triggers = try #require(device.client.triggers)
                if end == "kill" {
                    // Alive, it is no crash: two looks at the runs find nothing to capture.
                    let before = await triggers.crashLooks
                    #expect(try await PullOutcomeTests.waitFor { await triggers.crashLooks >= before + 2 })
                    let running = try LogStore(path: path).runs().first
                    #expect(running?.end == nil && running?.pid == child.processIdentifier, "\(String(describing: running))")
                    let nothingPending = await triggers.pending.isEmpty
                    #expect(try await registry.captures(of: trigger.id, limit: 10).isEmpty && nothingPending)
                    kill(child.processIdentifier, SIGKILL)
                }
                child.waitUntilExit()
                #expect(child.terminationReason == .uncaughtSignal)

                #expect(try await PullOutcomeTests.waitFor(.seconds(120)) { try await registry.captures(of: trigger.id, limit: 10).first?.status == .complete })
                let capture = try #require(try await registry.captures(of: trigger.id, limit: 10).first)
                #expect(capture.crash && capture.uid == "crash-user" && capture.records == 400, "\(capture)")
                #expect(capture.until.microseconds == capture.matchedAt.microseconds + 1)
                let manifest = try JSONDecoder().decode(
                    ExportManifest.self, from: Data(contentsOf: URL(fileURLWithPath: server.data + "/captures/\(capture.id)/manifest.json")))
                #expect(manifest.capture?.crash == true && manifest.capture?.match == nil)
                // The debug records its buffer held, marked rewound, are in the capture.
                let day = try #require(manifest.days.first)
                let lines = try String(contentsOfFile: server.data + "/captures/\(capture.id)/" + day.file, encoding: .utf8).split(separator: "\n")
                #expect(lines.filter { $0.contains("\"rewound ") && $0.contains("\"dredge.rewound\":true") }.count == 200)
                // One capture of one crash, however often the agent looks (two more looks waited for).
                let looks = await triggers.crashLooks
                #expect(try await PullOutcomeTests.waitFor { await triggers.crashLooks >= looks + 2 })
                let made = await triggers.madeToday(trigger.id)
                let pending = await triggers.pending
                #expect(made == 1 && pending.isEmpty)
                #expect(try await registry.captures(of: trigger.id, limit: 10).count == 1)
            }
        }
    }

    /// An app keeping a rewind buffer (``LogCenter``): its debug records stay out of the store
    /// until a match, when the agent asks it to freeze them; the capture holds them, marked
    /// rewound, and a rewound record fires nothing.
    @Test func aMatchFreezesTheAppsRewindBufferIntoTheCapture() async throws {
        try await withStopping(InProcessServer()) { server in
            let registry = try #require(server.triggers)
            let trigger = try await server.admin.createTrigger(
                TriggerRequest(name: "payment declined", match: TriggerMatch(levels: ["error", "debug"], text: "declined"), beforeSeconds: 60, afterSeconds: 0, perDevicePerDay: 5))
            let path = server.dir.file("rewinding.sqlite")
            let app = try LogCenter(path: path, context: .current(app: "oven", appVersion: "2"), rewind: RewindConfiguration(bytes: 1 << 20))
            defer { try? app.close() }
            app.setUser("u-1")
            let log = app.logger(type: .business, minimumLevel: .info)
            log.info("started")
            try await app.flush()
            try await withStopping(PullOutcomeTests.Device(server, store: path)) { device in
                #expect(try await CaptureTests.answerRecorded(device.state.file.agentID, in: registry) { $0.triggerIDs == [trigger.id] })
                for i in 0..<50 { log.debug("step \(i) of the checkout") }
                // A debug record that would match, were it not rewound: it fires nothing.
                log.debug("declined by the cache, retried")
                #expect(try app.store.records(matching: LogFilter(levels: [.debug])).isEmpty, "the debug records wait in the buffer")
                log.error("payment declined")
                try await app.flush()
                #expect(try await PullOutcomeTests.waitFor(.seconds(120)) { try await registry.captures(of: trigger.id, limit: 10).first?.status == .complete })
                let captures = try await registry.captures(of: trigger.id, limit: 10)
                #expect(captures.count == 1, "only the error fired: \(captures.map(\.matchedAt))")
                let capture = try #require(captures.first)
                let manifest = try JSONDecoder().decode(
                    ExportManifest.self, from: Data(contentsOf: URL(fileURLWithPath: server.data + "/captures/\(capture.id)/manifest.json")))
                let lines = try manifest.days.flatMap { day in
                    try String(contentsOfFile: server.data + "/captures/\(capture.id)/" + day.file, encoding: .utf8).split(separator: "\n")
                }
                let rewound = lines.filter { $0.contains("\"level\":\"debug\"") && $0.contains("\"dredge.rewound\":true") }
                #expect(rewound.count == 51, "\(lines.count) lines")
                #expect(lines.contains { $0.contains("payment declined") } && capture.records == lines.count)
            }
        }
    }
}
