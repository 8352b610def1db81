import Crypto
import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeServer
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// The server's side of standing triggers on the wire (#54, Protocol § 21): the set each agent
/// that agrees to `triggers` is sent and what it answers, and the captures it uploads, checked
/// against their trigger and its budgets before anything is stored.
@Suite struct CaptureTests {
    static let capabilities = [WireCapability.keyRotation, WireCapability.triggers]

    /// The next trigger set on `link`, other frames skipped.
    static func nextSet(over link: AgentLink) async throws -> WireTriggerSet {
        while let frame = try await link.next() {
            if case .triggerSet(let set)? = frame.body { return set }
        }
        throw AgentError("the server closed the connection before sending a trigger set")
    }

    /// Waits (for an event: the registry's record, looked at until it shows) until `agentID`'s
    /// answer is recorded as `done` says; false after the limit.
    static func answerRecorded(
        _ agentID: String, in registry: any TriggerRegistry, within limit: Duration = .seconds(60), _ done: (HeldTriggerSet) -> Bool
    ) async throws -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if let held = try await registry.answer(of: agentID), done(held) { return true }
            try await Task.sleep(for: .milliseconds(20))
        }
        return false
    }

    static func ack(_ set: WireTriggerSet, reason: WireRejectReason = .rejectUnspecified, over link: AgentLink) async throws {
        try await link.send(.with { $0.triggerSetAck = .with { $0.version = set.version; $0.issuedAtUs = set.issuedAtUs; $0.reason = reason } })
    }

    @Test func anAgentThatAgreesIsSentItsSignedSetAgainAtEachChangeAndItsAnswerIsRecorded() async throws {
        try await withStopping(InProcessServer()) { server in
            let registry = try #require(server.triggers)
            let first = try await server.admin.createTrigger(TriggerRequest(name: "payment declined", match: TriggerMatch(levels: ["error"])))
            let elsewhere = try await server.admin.createTrigger(TriggerRequest(name: "elsewhere", match: TriggerMatch(levels: ["error"]), labels: ["region": "us"]))
            let a = try await server.enrollAgent()
            let keys = try PinnedServerKeys(
                AgentState.File(
                    agentID: a.agentID, serverHost: "127.0.0.1", serverPort: 1, servers: nil,
                    serverSigningKey: Hex.encode(server.issuer.keys.current.signingKey.verifyingKey.rawRepresentation),
                    serverEncryptionKey: Hex.encode(server.issuer.keys.current.encryptionKey.publicKey.spki), enrolledAt: Date(), keyGeneration: 1))
            try await a.connect(capabilities: Self.capabilities) { link in
                let set = try await Self.nextSet(over: link)
                // Signed for this agent; the trigger for other labels is not in it.
                #expect(set.agentID == a.agentID && set.version == 2)
                #expect(set.triggers.map(\.triggerID) == [first.id], "\(set.triggers.map(\.name)) (\(elsewhere.id) is for region us)")
                guard case .hold = TriggerSetAdmission.admit(set, agentID: a.agentID, serverKeys: keys, heldIssuedAtUs: nil, now: .now) else {
                    Issue.record("the agent's own checks refuse the set the server sent")
                    return
                }
                try await Self.ack(set, over: link)
                #expect(try await Self.answerRecorded(a.agentID, in: registry) { $0.held?.version == 2 && $0.triggerIDs == [first.id] && $0.refusal == nil })
                let holders = (try await registry.holders(of: first.id), try await registry.holders(of: elsewhere.id))
                #expect(holders == (1, 0))

                // A new trigger reaches the connected agent at once, with the one it held.
                let second = try await server.admin.createTrigger(TriggerRequest(name: "timeouts", match: TriggerMatch(text: "timed out")))
                let next = try await Self.nextSet(over: link)
                #expect(next.version == 3 && next.triggers.map(\.triggerID) == [first.id, second.id])
                // A refusal is recorded beside the set held, and the connection goes on.
                try await Self.ack(next, reason: .rejectInvalid, over: link)
                #expect(try await Self.answerRecorded(a.agentID, in: registry) { $0.refused?.version == 3 && $0.held?.version == 2 })
                #expect(try await LinkAgent.heartbeatAcked([], over: link))

                // Disabled: gone from the next set.
                _ = try await server.admin.disableTrigger(first.id, reason: "fixed")
                let after = try await Self.nextSet(over: link)
                #expect(after.version == 4 && after.triggers.map(\.triggerID) == [second.id])
            }
        }
    }

    /// A device store whose records around `at` include one error of `uid` at `at` itself.
    static func incident(on server: InProcessServer, at: Timestamp, uid: String = "u-1") throws -> String {
        let store = server.dir.file("incident-\(UUID().uuidString).sqlite")
        let (s, ctx) = try PullEndToEndTests.openDeviceStore(store, host: "oven-7")
        for second in -90...30 where second != 0 {
            s.enqueue(LogEntry(timestamp: at.adding(.seconds(second)), level: .info, type: .app, uid: second % 2 == 0 ? uid : "u-2", message: "step \(second)", context: ctx))
        }
        s.enqueue(LogEntry(timestamp: at, level: .error, type: .business, uid: uid, message: "payment declined", context: ctx))
        try s.close()
        return store
    }

    static func match(at: Timestamp, uid: String = "u-1") -> JSONValue {
        .object(["ts": .string(at.rfc3339), "level": .string("error"), "type": .string("business"), "uid": .string(uid), "message": .string("payment declined"), "context": .integer(1)])
    }

    @Test func aCaptureWithinItsTriggerLandsAndIsIndexedAndBudgetsAndOverlapsAreRefusedWithNothingKept() async throws {
        try await withStopping(InProcessServer()) { server in
            let registry = try #require(server.triggers)
            let trigger = try await server.admin.createTrigger(
                TriggerRequest(name: "payment declined", match: TriggerMatch(levels: ["error"]), beforeSeconds: 60, afterSeconds: 10, perDevicePerDay: 2))
            let t = Timestamp.now.subtracting(.seconds(100))
            let store = try Self.incident(on: server, at: t)
            let a = try await server.enrollAgent()
            func window(_ at: Timestamp) -> (since: Timestamp, until: Timestamp) { (at.subtracting(.seconds(60)), at.adding(.microseconds(10_000_001))) }
            try await a.connect(capabilities: Self.capabilities) { link in
                _ = try await Self.nextSet(over: link)
                let (since, until) = window(t)
                let id = Hex.encode(secureRandomBytes(16))
                let sealed = try a.captureUpload(id: id, trigger: trigger.id, since: since, until: until, matchedAt: t, match: Self.match(at: t), store: store, dir: server.dir)
                let landed = try await LinkAgent.send(sealed, over: link)
                #expect(landed.result.ok, "\(landed)")
                // 60 s before (every user's) to 10 s after: the 70 records of those seconds and the error.
                #expect(landed.result.records == 71, "\(landed)")
                let capture = try #require(try await registry.capture(id))
                #expect(capture.status == .complete && capture.triggerID == trigger.id && capture.agentID == a.agentID && capture.records == 71)
                #expect(FileManager.default.fileExists(atPath: server.data + "/captures/\(id)/manifest.json"))
                // Searchable as a pull's records are (the indexer was told when it landed).
                let source = IndexedSource(kind: .capture, id: id, agentID: a.agentID)
                for _ in 0..<3000 where !(try await server.records.indexedSources().contains(source)) { try await Task.sleep(for: .milliseconds(20)) }
                let found = try await server.admin.search(RecordSearch(text: "payment declined"))
                #expect(found.records.map(\.message) == ["payment declined"] && found.records.first?.sourceKind == "capture", "\(found.records.map { ($0.message, $0.sourceKind) })")

                // Begun again once complete: its result, not counted again.
                let again = try await LinkAgent.send(sealed, over: link)
                #expect(again == .finished(landed.result), "\(again)")

                // A window that overlaps the first: refused, nothing kept.
                let overlapping = Hex.encode(secureRandomBytes(16))
                let later = t.adding(.seconds(12))
                let refused = try await LinkAgent.send(
                    try a.captureUpload(
                        id: overlapping, trigger: trigger.id, since: until.subtracting(.seconds(1)), until: later.adding(.seconds(10)), matchedAt: later,
                        match: Self.match(at: later), store: store, dir: server.dir), over: link)
                #expect(refused.result.error == .errorUploadInvalid && refused.result.detail.contains("overlaps"), "\(refused)")
                #expect(try await registry.capture(overlapping) == nil)

                // The second of the day lands; the third is over the device's budget of 2.
                let t2 = t.adding(.seconds(20))
                let second = try await LinkAgent.send(
                    try a.captureUpload(trigger: trigger.id, since: until, until: window(t2).until, matchedAt: t2, match: Self.match(at: t2), store: store, dir: server.dir),
                    over: link)
                #expect(second.result.ok, "\(second)")
                let third = Hex.encode(secureRandomBytes(16))
                let t3 = t.adding(.seconds(40))
                let spent = try await LinkAgent.send(
                    try a.captureUpload(id: third, trigger: trigger.id, since: window(t2).until, until: window(t3).until, matchedAt: t3, match: Self.match(at: t3), store: store, dir: server.dir),
                    over: link)
                #expect(spent == .finished(spent.result) && spent.result.error == .errorBudgetSpent, "\(spent)")
                #expect(try await registry.capture(third) == nil)
                #expect(!FileManager.default.fileExists(atPath: server.data + "/uploads/\(third)-\(a.agentID)"), "nothing of a refused capture is kept")
                #expect(try await registry.captures(of: trigger.id, limit: 10).count == 2)
            }
            try await server.connectionsEnded()
            #expect(try await registry.tally(of: trigger.id, since: Date().addingTimeInterval(-3600)) == CaptureTally(captures: 2, devices: 1))
        }
    }

    /// A capture begun is counted once, when it begins: resumed after its budget was spent by
    /// others, it is never refused; resumed with another header, it is.
    @Test func aResumedCaptureIsNeverRefusedForItsBudgetButMustKeepItsHeader() async throws {
        try await withStopping(InProcessServer()) { server in
            let trigger = try await server.admin.createTrigger(
                TriggerRequest(name: "payment declined", match: TriggerMatch(levels: ["error"]), beforeSeconds: 60, afterSeconds: 10, perDevicePerDay: 2))
            let t = Timestamp.now.subtracting(.seconds(100))
            let store = try Self.incident(on: server, at: t)
            let a = try await server.enrollAgent()
            func upload(_ id: String, at: Timestamp, since: Timestamp) throws -> SealedUpload {
                try a.captureUpload(
                    id: id, trigger: trigger.id, since: since, until: at.adding(.microseconds(10_000_001)), matchedAt: at, match: Self.match(at: at), store: store, dir: server.dir)
            }
            let first = Hex.encode(secureRandomBytes(16))
            let begun = try upload(first, at: t, since: t.subtracting(.seconds(60)))
            try await a.connect(capabilities: Self.capabilities) { link in
                // Begun only: the server answers Ready, and the agent goes away.
                try await link.send(.with { $0.uploadBegin = .with { $0.header = begun.header } })
                let answer = try #require(try await LinkAgent.answer(to: first, over: link))
                guard case .uploadReady? = answer.body else {
                    Issue.record("a capture within its budget was not begun: \(answer)")
                    return
                }
            }
            try await a.connect(capabilities: Self.capabilities) { link in
                // The second of the day spends the budget of 2; a third is refused.
                let t2 = t.adding(.seconds(20))
                let second = try await LinkAgent.send(try upload(Hex.encode(secureRandomBytes(16)), at: t2, since: t.adding(.microseconds(10_000_001))), over: link)
                #expect(second.result.ok, "\(second)")
                let t3 = t.adding(.seconds(40))
                let third = try await LinkAgent.send(try upload(Hex.encode(secureRandomBytes(16)), at: t3, since: t2.adding(.microseconds(10_000_001))), over: link)
                #expect(third.result.error == .errorBudgetSpent, "\(third)")
                // The first, begun before, may still finish.
                let resumed = try await LinkAgent.send(begun, over: link)
                #expect(resumed.result.ok, "\(resumed)")
            }
            // Another header under an id already begun: refused, the capture as it was.
            try await a.connect(capabilities: Self.capabilities) { link in
                let other = try a.captureUpload(
                    id: first, trigger: trigger.id, setVersion: 7, since: t.subtracting(.seconds(60)), until: t.adding(.microseconds(10_000_001)), matchedAt: t,
                    match: Self.match(at: t), store: store, dir: server.dir)
                let refused = try await LinkAgent.send(other, over: link)
                #expect(refused.result.error == .errorUploadInvalid && refused.result.detail.contains("another header"), "\(refused)")
            }
            let kept = try #require(try await server.triggers?.capture(first))
            #expect(kept.setVersion == 1 && kept.status == .complete)
        }
    }

    /// Every rule of § 21's capture header: each refused with ERROR_UPLOAD_INVALID, nothing
    /// recorded; and a manifest that does not describe its header fails the payload.
    @Test func aCaptureOutsideItsTriggerIsRefusedWithNothingKept() async throws {
        try await withStopping(InProcessServer()) { server in
            let registry = try #require(server.triggers)
            let trigger = try await server.admin.createTrigger(
                TriggerRequest(name: "u-1's errors", match: TriggerMatch(levels: ["error"]), uid: "u-1", beforeSeconds: 60, afterSeconds: 10))
            let elsewhere = try await server.admin.createTrigger(TriggerRequest(name: "us only", match: TriggerMatch(levels: ["error"]), labels: ["region": "us"]))
            let crashOnly = try await server.admin.createTrigger(TriggerRequest(name: "crashes", crash: true, beforeSeconds: 60))
            let anyone = try await server.admin.createTrigger(TriggerRequest(name: "anyone's errors", match: TriggerMatch(levels: ["error"]), beforeSeconds: 60, afterSeconds: 10))
            let removed = try await server.admin.createTrigger(TriggerRequest(name: "removed", match: TriggerMatch(levels: ["error"]), beforeSeconds: 60, afterSeconds: 10))
            _ = try await server.admin.removeTrigger(removed.id, reason: "gone")
            let disabled = try await server.admin.createTrigger(TriggerRequest(name: "disabled", match: TriggerMatch(levels: ["error"]), beforeSeconds: 60, afterSeconds: 10))
            _ = try await server.admin.disableTrigger(disabled.id, reason: "enough")
            let t = Timestamp.now.subtracting(.seconds(100))
            let store = try Self.incident(on: server, at: t)
            let a = try await server.enrollAgent()
            let since = t.subtracting(.seconds(60))
            let until = t.adding(.microseconds(10_000_001))
            func attempt(
                _ link: AgentLink, trigger: String, uid: String = "u-1", since: Timestamp = since, until: Timestamp = until, matchedAt: Timestamp = t, crash: Bool = false,
                header: (inout WireCapture) -> Void = { _ in }, describe: (inout ExportManifest.CaptureDescription) -> Void = { _ in }
            ) async throws -> (id: String, outcome: UploadOutcome) {
                let id = Hex.encode(secureRandomBytes(16))
                let upload = try a.captureUpload(
                    id: id, trigger: trigger, uid: uid, since: since, until: until, matchedAt: matchedAt, crash: crash, match: crash ? nil : Self.match(at: matchedAt),
                    store: store, dir: server.dir, describe: describe, header: header)
                return (id, try await LinkAgent.send(upload, over: link))
            }
            // Without the capability: refused before anything else.
            try await a.connect { link in
                let (id, outcome) = try await attempt(link, trigger: trigger.id)
                #expect(outcome.result.error == .errorUploadInvalid && outcome.result.detail.contains("capability"), "\(outcome)")
                #expect(try await registry.capture(id) == nil)
            }
            try await a.connect(capabilities: Self.capabilities) { link in
                _ = try await Self.nextSet(over: link)
                #expect(try await LinkAgent.heartbeatAcked(["u-1"], over: link))
                let refusals: [(String, String, () async throws -> (id: String, outcome: UploadOutcome))] = [
                    ("an unknown trigger", "not one", { try await attempt(link, trigger: Hex.encode(secureRandomBytes(16))) }),
                    ("another scope's trigger", "not one", { try await attempt(link, trigger: elsewhere.id, uid: "") }),
                    ("a crash of a trigger that is not one", "not a crash trigger", {
                        try await attempt(link, trigger: trigger.id, until: t.adding(.microseconds(1)), crash: true)
                    }),
                    ("a record of a crash-only trigger", "crashes only", { try await attempt(link, trigger: crashOnly.id, until: t.adding(.microseconds(1))) }),
                    ("another user", "another user", { try await attempt(link, trigger: trigger.id, uid: "u-2") }),
                    ("a user the agent does not hold", "holds", {
                        try await attempt(link, trigger: anyone.id, uid: "u-9")
                    }),
                    ("a window longer than the trigger's", "longer", { try await attempt(link, trigger: trigger.id, since: since.subtracting(.seconds(1))) }),
                    ("a match outside its window", "outside", { try await attempt(link, trigger: trigger.id, matchedAt: until) }),
                    ("a match before the trigger was made", "life", {
                        let early = t.subtracting(.seconds(3600))
                        return try await attempt(link, trigger: trigger.id, since: early.subtracting(.seconds(60)), until: early.adding(.seconds(10)), matchedAt: early)
                    }),
                    ("set version 0", "form", { try await attempt(link, trigger: trigger.id) { $0.setVersion = 0 } }),
                    ("an empty window", "empty", { try await attempt(link, trigger: trigger.id) { $0.untilUs = $0.sinceUs } }),
                    ("a removed trigger", "not one", { try await attempt(link, trigger: removed.id) }),
                    ("a match after its trigger was disabled", "life", {
                        let late = Timestamp.now.adding(.seconds(600))
                        return try await attempt(link, trigger: disabled.id, since: late.subtracting(.seconds(60)), until: late.adding(.seconds(10)), matchedAt: late)
                    }),
                ]
                for (what, says, run) in refusals {
                    let (id, outcome) = try await run()
                    #expect(outcome.result.error == .errorUploadInvalid && outcome.result.detail.contains(says), "\(what): \(outcome)")
                    #expect(try await registry.capture(id) == nil, "\(what) was recorded")
                }
                // The manifest must say what the header says.
                let (lying, outcome) = try await attempt(link, trigger: trigger.id) { $0.setVersion = 9 }
                #expect(outcome.result.error == .errorPayloadInvalid, "\(outcome)")
                #expect(try await registry.capture(lying)?.status == .failed)
                #expect(!FileManager.default.fileExists(atPath: server.data + "/captures/\(lying)"))
            }
        }
    }
}
