import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeExport
import DredgePayload
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Synchronization
import Testing
@testable import DredgeServer

/// What an enrolled agent can do against the real server, through the real wire protocol and
/// admin API (docs/threat_model.md): each attack once broke something; each is refused now,
/// and nothing already stored changes.
@Suite struct HostileAgentTests {
    /// Accepts the next pull command on `link` and sends a real export for it; returns the id.
    static func completePull(_ agent: LinkAgent, link: AgentLink, store: String, dir: TempDir) async throws -> String {
        let cmd = try await LinkAgent.acceptNextPull(over: link)
        let outcome = try await LinkAgent.send(try agent.pullUpload(cmd, store: store, dir: dir), over: link)
        #expect(outcome.result.ok, "\(outcome)")
        return cmd.commandID
    }

    /// Makes a pull for `agent`, accepts it, begins its upload and sends chunk 0 changed by
    /// `tamper` after sealing (by default one bit flipped).
    static func beginWithATamperedChunk(
        _ agent: LinkAgent, server: InProcessServer, store: String, over link: AgentLink,
        tamper: (inout [UInt8]) -> Void = { $0[$0.count / 2] ^= 0x01 }
    ) async throws -> (pull: PullRecord, command: WirePullCommand, upload: SealedUpload) {
        let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: agent.agentID, filter: LogFilter(uid: "u-2")))
        let cmd = try await LinkAgent.acceptNextPull(over: link)
        let upload = try agent.pullUpload(cmd, store: store, dir: server.dir)
        try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
        _ = try await LinkAgent.answer(to: cmd.commandID, over: link)
        var sealed = try upload.chunk(0)
        tamper(&sealed)
        try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = cmd.commandID; $0.index = 0; $0.ciphertext = Data(sealed) } })
        return (pull, cmd, upload)
    }

    /// A feedback whose id is a path (`../pulls`, `../../victim`, `..`, `.`, an absolute path,
    /// 100 KB, uppercase) or another agent's finished feedback is refused at its first frame:
    /// no row, no file, nothing outside the data directory touched, no finished pull or
    /// feedback changed. The same agent cannot rewrite its completed pull afterwards either.
    @Test func hostileIdsAreRefusedAndNothingStoredChanges() async throws {
        try await withStopping(InProcessServer()) { server in
            let dir = server.dir
            let store = dir.file("device.sqlite")
            try PullEndToEndTests.makeDeviceStore(store)
            let victim = dir.file("victim")
            try FileManager.default.createDirectory(atPath: victim, withIntermediateDirectories: true)
            try Data("precious".utf8).write(to: URL(fileURLWithPath: victim + "/keep.txt"))

            // A finished pull and a finished feedback from agent A.
            let a = try await server.enrollAgent(hostname: "a")
            let feedbackID = Hex.encode(secureRandomBytes(16))
            let pullID = try await a.connect { link in
                _ = try await server.admin.createPull(PullRequest(uid: nil, agent: a.agentID, filter: LogFilter(uid: "u-1")))
                let id = try await Self.completePull(a, link: link, store: store, dir: dir)
                let outcome = try await LinkAgent.send(try a.feedbackUpload(id: feedbackID, store: store, dir: dir), over: link)
                #expect(outcome.result.ok, "\(outcome)")
                return id
            }
            #expect(try await server.admin.pull(pullID).targets.first?.status == .complete)
            // The server removes a landed upload's chunks after its result went out; the agent's
            // close can come first (a CI run once saw the feedback's chunks in `before` only).
            try await server.connectionsEnded()
            let before = InProcessServer.snapshot(dir.path)
            #expect(before.keys.contains("server/pulls/\(pullID)/\(a.agentID)/manifest.json"))
            #expect(before.keys.contains("server/feedback/\(feedbackID)/manifest.json"))

            let hostile = ["../pulls", "../../victim", "..", ".", dir.file("absolute"), String(repeating: "a", count: 100_000), feedbackID.uppercased(), "", "0123456789abcdef0123456789abcde/"]
            let b = try await server.enrollAgent(hostname: "b")
            try await b.connect { link in
                for id in hostile {
                    let upload = try b.feedbackUpload(id: id, store: store, dir: dir)
                    try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
                    let answer = try await LinkAgent.answer(to: WireID.echo(id), over: link)
                    #expect(answer?.error.code == .errorUploadInvalid, "\(id.prefix(40).debugDescription): \(String(describing: answer))")
                    // Chunks and completion for it are refused the same way.
                    try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = id; $0.index = 0; $0.ciphertext = Data((try? upload.chunk(0)) ?? []) } })
                    #expect(try await LinkAgent.answer(to: WireID.echo(id), over: link)?.error.code == .errorUploadInvalid)
                    try await link.send(.with { $0.uploadComplete = .with { $0.uploadID = id } })
                    #expect(try await LinkAgent.answer(to: WireID.echo(id), over: link)?.error.code == .errorUploadInvalid)
                }
                // A valid-looking id: agent A's finished feedback.
                let theirs = try b.feedbackUpload(id: feedbackID, store: store, dir: dir)
                try await link.send(.with { $0.uploadBegin = .with { $0.header = theirs.header } })
                #expect(try await LinkAgent.answer(to: feedbackID, over: link)?.error.code == .errorUploadInvalid)
                // The connection survived all of it.
                #expect(try await LinkAgent.heartbeatAcked(["u-9"], over: link))
            }
            // A cannot rewrite its completed pull.
            try await a.connect { link in
                try await link.send(.with { $0.commandRejected = .with { $0.commandID = pullID; $0.reason = .rejectBadSignature; $0.detail = "changed my mind" } })
                try await link.heartbeat(activeUIDs: [])
                _ = try await link.next()
            }

            try await server.connectionsEnded()
            let after = InProcessServer.snapshot(dir.path)
            #expect(after.filter { !$0.key.hasPrefix("feedback-") } == before.filter { !$0.key.hasPrefix("feedback-") }, "files changed")
            #expect(try await server.admin.feedback().map(\.id) == [feedbackID])
            #expect(try await server.admin.feedback(feedbackID).agentID == a.agentID)
            let pull = try await server.admin.pull(pullID)
            #expect(pull.targets.first?.status == .complete)
            #expect(pull.targets.first?.detail.hasPrefix("rejectBadSignature") == false)
        }
    }

    /// A chunk one byte short or long is ERROR_CHUNK_INVALID (not an internal error the agent
    /// would retry), and the pull fails with the reason instead of staying `uploading`.
    @Test func aChunkOfTheWrongSizeFailsThePull() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let a = try await server.enrollAgent()
            for change in [-1, 1] {
                let pullID = try await a.connect { link in
                    let (pull, cmd, _) = try await Self.beginWithATamperedChunk(a, server: server, store: store, over: link) { sealed in
                        if change < 0 { sealed.removeLast() } else { sealed.append(0) }
                    }
                    let answer = try await LinkAgent.answer(to: cmd.commandID, over: link)
                    #expect(answer?.error.code == .errorChunkInvalid, "\(String(describing: answer))")
                    return pull.id
                }
                try await server.connectionsEnded()
                let target = try #require(try await server.admin.pull(pullID).targets.first)
                #expect(target.status == .failed)
                #expect(target.detail.contains("chunk 0"))
            }
        }
    }

    /// Chunks sent all at once, last first and each twice, without waiting for a single
    /// acknowledgement (far past the window, so many are written at the same time): every
    /// chunk is acknowledged, the upload completes with every record, and the pull's progress
    /// counts every chunk once.
    @Test func chunksFloodedOutOfOrderAndTwiceAreEachHeldOnce() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let a = try await server.enrollAgent()
            let (pullID, chunkCount) = try await a.connect { link in
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: a.agentID, filter: .all))
                let cmd = try await LinkAgent.acceptNextPull(over: link)
                let upload = try a.pullUpload(cmd, store: store, dir: server.dir, chunkSize: WireLimits.minChunkBytes)
                let count = upload.header.chunkCount
                try #require(count > 32, "enough chunks to fill the server's pipeline several times")
                try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
                let ready = try await LinkAgent.answer(to: cmd.commandID, over: link)
                #expect(ready?.uploadReady.uploadID == cmd.commandID, "\(String(describing: ready))")
                for index in (0..<count).reversed() {
                    let chunk = WireFrame.with { $0.uploadChunk = .with { $0.uploadID = cmd.commandID; $0.index = index; $0.ciphertext = Data(try! upload.chunk(index)) } }
                    try await link.send(chunk)
                    try await link.send(chunk)
                }
                var acked = Set<UInt32>()
                while acked.count < count {
                    let answer = try #require(try await LinkAgent.answer(to: cmd.commandID, over: link))
                    guard case .chunkAck(let ack)? = answer.body else {
                        Issue.record("not an acknowledgement: \(answer)")
                        return (pull.id, Int(count))
                    }
                    acked.insert(ack.index)
                }
                try await link.send(.with { $0.uploadComplete = .with { $0.uploadID = cmd.commandID } })
                var result: WireUploadResult?
                while result == nil, let answer = try await LinkAgent.answer(to: cmd.commandID, over: link) {
                    if case .uploadResult(let r)? = answer.body { result = r }  // late duplicate acks may come first
                }
                let expected = try PullEndToEndTests.expected(store, .all).values.reduce(0) { $0 + $1.utf8.reduce(0) { $1 == 10 ? $0 + 1 : $0 } }
                #expect(result?.ok == true && result?.records == UInt64(expected), "\(String(describing: result))")
                return (pull.id, Int(count))
            }
            let target = try #require(try await server.admin.pull(pullID).targets.first)
            #expect(target.status == .complete && target.chunksReceived == chunkCount && target.chunkCount == chunkCount, "\(target)")
        }
    }

    /// A chunk refusal that ends an upload reaches the agent only once the upload's failure is
    /// stored: with that write held, a heartbeat sent after the chunk is answered and the
    /// refusal is not; once the write is let go the refusal comes, and the pull reads `failed`
    /// at that moment. (Before, the refusal went out first and the failure was written after
    /// it, so an agent that began the upload again on a new connection could be let in.)
    @Test func aRefusalThatEndsAnUploadIsSentOnceTheFailureIsStored() async throws {
        let held = HeldFailures()
        try await withStopping(InProcessServer(listenerPulls: { held.wrapping($0) })) { server in
            defer { held.open() }
            let store = try server.deviceStore()
            let a = try await server.enrollAgent()
            try await a.connect { link in
                let (pull, cmd, _) = try await Self.beginWithATamperedChunk(a, server: server, store: store, over: link)
                try await held.reached()
                try await link.heartbeat(activeUIDs: [])
                var early: [WireFrame] = []
                reading: while let frame = try await link.next() {
                    switch frame.body {
                    case .heartbeatAck?: break reading
                    case .uploadResult(let r)? where r.uploadID == cmd.commandID: early.append(frame)
                    case .error(let e)? where e.uploadID == cmd.commandID: early.append(frame)
                    case .chunkAck(let a)? where a.uploadID == cmd.commandID: early.append(frame)
                    default: continue
                    }
                }
                #expect(early.isEmpty, "sent before the failure was stored: \(early)")
                #expect(try await server.admin.pull(pull.id).targets.first?.status == .uploading)
                held.open()
                let answer = try await early.isEmpty ? LinkAgent.answer(to: cmd.commandID, over: link) : early.first
                #expect(answer?.uploadResult.error == .errorChunkAuthFailed, "\(String(describing: answer))")
                #expect(try await server.admin.pull(pull.id).targets.first?.status == .failed)
            }
        }
    }

    /// A failed upload's result outlives its connection: the agent that begins it again, on
    /// another connection, is answered the same `UploadResult` (the spec's "for an upload it
    /// has already finished it answers the UploadResult"), and nothing it sends revives it.
    @Test func aFailedUploadIsAnsweredWithItsResultOnLaterConnections() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let a = try await server.enrollAgent()
            let (pullID, upload) = try await a.connect { link in
                let (pull, cmd, upload) = try await Self.beginWithATamperedChunk(a, server: server, store: store, over: link)
                let answer = try await LinkAgent.answer(to: cmd.commandID, over: link)
                #expect(answer?.uploadResult.error == .errorChunkAuthFailed, "\(String(describing: answer))")
                return (pull.id, upload)
            }
            try await server.connectionsEnded()
            let target = try #require(try await server.admin.pull(pullID).targets.first)
            #expect(target.status == .failed && target.errorCode == Int(WireErrorCode.errorChunkAuthFailed.rawValue))
            for _ in 0..<2 {
                try await a.connect { link in
                    try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
                    let again = try #require(try await LinkAgent.answer(to: pullID, over: link))
                    #expect(again.uploadResult.uploadID == pullID && !again.uploadResult.ok, "\(again)")
                    #expect(again.uploadResult.error == .errorChunkAuthFailed && again.uploadResult.detail == target.detail, "\(again)")
                }
            }
            #expect(try await server.admin.pull(pullID).targets.first?.status == .failed)
        }
    }

    /// Heartbeats over MAX_ACTIVE_UIDS or with a control character in a uid are refused and
    /// recorded nowhere; a pull for `"u-1\0x"` is refused and never reaches u-1's agent.
    @Test func heartbeatListsAndUidsAreHeldToTheSpec() async throws {
        try await withStopping(InProcessServer()) { server in
            let a = try await server.enrollAgent()
            try await a.connect { link in
                try await link.heartbeat(activeUIDs: ["u-1"])
                _ = try await link.next()
            }
            for uids in [(0...WireLimits.maxActiveUIDs).map { "u-\($0)" }, ["u-2", "u-1\u{0}x"], ["u\nforged"]] {
                await #expect(throws: (any Error).self) {
                    try await a.connect { link in
                        // Raw: the agent's own state machine would trim the list.
                        try await link.send(.with { $0.heartbeat = .with { $0.seq = 1; $0.activeUids = uids } })
                        while try await link.next() != nil {}
                    }
                }
            }
            #expect(try await server.admin.agents().first?.activeUIDs == ["u-1"])
            #expect(try await server.registry.agentIDs(withUID: "u-1\u{0}x").isEmpty)

            let (status, body, _) = try await AdminEndToEndTests.http(
                "POST", server.adminURL + "/v1/pulls", authorization: "Bearer \(server.created.adminToken)", body: #"{"uid":"u-1\u0000x","filter":{}}"#)
            #expect(status == 400, "\(body)")
            #expect(try await server.admin.pulls().isEmpty)
        }
    }

    /// The admin API refuses times outside 1970–9999 (Int64.min once crash-looped every agent
    /// it reached) and ids that are not ids, with 400 and nothing queued.
    @Test func theAdminAPIRefusesOutOfRangeTimesAndMalformedIds() async throws {
        try await withStopping(InProcessServer()) { server in
            let a = try await server.enrollAgent()
            let auth = "Bearer \(server.created.adminToken)"
            for filter in [#"{"since":-9223372036854775808}"#, #"{"until":9223372036854775807}"#, #"{"since":-1}"#] {
                let (status, body, _) = try await AdminEndToEndTests.http("POST", server.adminURL + "/v1/pulls", authorization: auth, body: #"{"agent":"\#(a.agentID)","filter":\#(filter)}"#)
                #expect(status == 400, "\(filter): \(body)")
            }
            let (badAgent, _, _) = try await AdminEndToEndTests.http("POST", server.adminURL + "/v1/pulls", authorization: auth, body: #"{"agent":"..","filter":{}}"#)
            #expect(badAgent == 400)
            for path in ["/v1/pulls/ZZZ", "/v1/feedback/abc", "/v1/pulls/" + String(repeating: "a", count: 33)] {
                let (status, _, _) = try await AdminEndToEndTests.http("GET", server.adminURL + path, authorization: auth)
                #expect(status == 400, "\(path)")
            }
            #expect(try await server.admin.pulls().isEmpty)
        }
    }

    /// Per-agent feedback quotas and the unpacked-size limit: a feedback that inflates past the
    /// limit fails; one over the hourly count is ERROR_LIMIT_EXCEEDED (the agent keeps it for
    /// later), and nothing of it is stored.
    @Test func feedbackQuotasHold() async throws {
        try await withStopping(InProcessServer(feedbackLimits: FeedbackLimits(perHour: 2, bytesPerDay: 64 << 20, maxUnpackedBytes: 256 * 1024))) { server in
            let store = server.dir.file("device.sqlite")
            let (s, ctx) = try PullEndToEndTests.openDeviceStore(store, host: "h")
            for i in 0..<10 { s.enqueue(LogEntry(timestamp: .now, level: .info, type: .app, uid: "u-1", message: "small \(i)", context: ctx)) }
            for _ in 0..<20_000 { s.enqueue(LogEntry(timestamp: .now, level: .info, type: .app, uid: "bomb", message: String(repeating: "A", count: 100), context: ctx)) }
            try s.close()
            let a = try await server.enrollAgent()
            try await a.connect { link in
                let small = try await LinkAgent.send(try a.feedbackUpload(id: Hex.encode(secureRandomBytes(16)), uid: "u-1", store: store, dir: server.dir), over: link)
                #expect(small.result.ok, "\(small)")
                let bomb = try await LinkAgent.send(try a.feedbackUpload(id: Hex.encode(secureRandomBytes(16)), uid: "bomb", store: store, dir: server.dir), over: link)
                #expect(bomb == .finished(bomb.result) && bomb.result.error == .errorPayloadInvalid, "\(bomb)")
                let third = Hex.encode(secureRandomBytes(16))
                let over = try await LinkAgent.send(try a.feedbackUpload(id: third, uid: "u-1", store: store, dir: server.dir), over: link)
                #expect(over == .retryLater(over.result) && over.result.error == .errorLimitExceeded, "\(over)")
                #expect(!FileManager.default.fileExists(atPath: server.data + "/feedback/\(third)"))
            }
            try await server.connectionsEnded()
            let listed = try await server.admin.feedback()
            #expect(listed.count == 2)
            #expect(listed.filter { $0.status == .complete }.count == 1)
            let unpacked = try FileManager.default.contentsOfDirectory(atPath: server.data + "/feedback").filter { !$0.hasSuffix(".zip") }
            #expect(unpacked.count == 1)
        }
    }

    /// Enrollment refusals are logged with where they came from, and a flood of them is
    /// rate-limited rather than logged one by one.
    @Test func enrollmentRefusalsAreLoggedWithTheSourceRateLimited() async throws {
        try await withStopping(InProcessServer()) { server in
            let tls = try AgentLink.tlsContext(caPEM: contents(server.data + "/ca.pem"))
            let key = try RSAPrivateKey.generate()
            // Time stands still for the limiter: on a loaded machine 25 attempts can span a minute.
            let start = ContinuousClock.now
            server.listener.refusals.useClock { start }
            for _ in 0..<25 {
                _ = try? await AgentEnrollment.register(host: "127.0.0.1", port: server.agentPort, tls: tls, token: "dredge_enr_wrong", key: key, hostInfo: .init())
            }
            // The refusal records: the ones that carry a source and a count of records held back.
            let refusals = server.logs.records.filter { $0.metadata["remote"] != nil && $0.metadata["suppressed"] != nil }
            #expect(!refusals.isEmpty)
            #expect(refusals.count <= 10)
            #expect(refusals.allSatisfy { "\($0.metadata["remote"]!)".contains("127.0.0.1") })
        }
    }

    /// #49: refused enrollments are throttled per address: after ten in a minute, the next
    /// ones from that address are refused unseen (`ERROR_LIMIT_EXCEEDED`, try later), the right
    /// token too, until the minute ends; and the connection-closing notices they cause are
    /// rate-limited with the refusals (500 attempts had written 94 KB of log).
    @Test func refusedEnrollmentsAreThrottledPerAddress() async throws {
        try await withStopping(InProcessServer()) { server in
            let tls = try AgentLink.tlsContext(caPEM: contents(server.data + "/ca.pem"))
            let start = ContinuousClock.now
            let now = Mutex(start)
            server.listener.refusals.useClock { now.withLock { $0 } }
            server.listener.enrollmentThrottle.useClock { now.withLock { $0 } }
            func enroll(_ token: String) async throws -> WireErrorCode? {
                do {
                    _ = try await AgentEnrollment.register(host: "127.0.0.1", port: server.agentPort, tls: tls, token: token, key: try RSAPrivateKey.generate(), hostInfo: .init())
                    return nil
                } catch {
                    return (error as? AgentError)?.serverError ?? .errorUnspecified
                }
            }
            var codes: [WireErrorCode?] = []
            for _ in 0..<30 { codes.append(try await enroll("dredge_enr_wrong")) }
            #expect(codes.prefix(10).allSatisfy { $0 == .errorEnrollmentRefused } && codes.dropFirst(10).allSatisfy { $0 == .errorLimitExceeded }, "\(codes)")
            #expect(try await enroll(server.created.enrollmentToken) == .errorLimitExceeded)
            #expect(server.listener.enrollmentThrottle.throttledCount == 21)
            // 31 refusals and 31 closed connections: at most ten lines in the minute.
            let lines = server.logs.records.filter { $0.metadata["remote"] != nil && ($0.message.hasPrefix("enrollment refused") || $0.message == "closing agent connection") }
            #expect(lines.count == 10, "\(lines.map(\.message))")
            // The next minute: the right token enrolls, and the next line says how many were held back.
            now.withLock { $0 = start + .seconds(60) }
            #expect(try await enroll(server.created.enrollmentToken) == nil)
            #expect(try await enroll("dredge_enr_wrong") == .errorEnrollmentRefused)
            let after = server.logs.records.filter { $0.metadata["remote"] != nil && $0.metadata["suppressed"] != nil }
            #expect(after.contains { Int("\($0.metadata["suppressed"]!)") ?? 0 >= 50 }, "\(after.map { "\($0.message) \($0.metadata)" })")
        }
    }

    /// The throttle counts each address on its own, forgets a window after a minute, and keeps
    /// at most ``EnrollmentThrottle/maxAddresses`` windows.
    @Test func theEnrollmentThrottleCountsEachAddressApart() {
        let start = ContinuousClock.now
        let now = Mutex(start)
        let throttle = EnrollmentThrottle(perMinute: 3) { now.withLock { $0 } }
        // Three begun at once (none finished yet) fill the minute: a fourth is refused unseen.
        for _ in 0..<3 { #expect(throttle.begin("10.0.0.1")) }
        #expect(!throttle.begin("10.0.0.1"))
        #expect(throttle.isThrottled("10.0.0.1"))
        #expect(!throttle.isThrottled("10.0.0.2"))
        // One that succeeds does not count.
        #expect(throttle.begin("10.0.0.2"))
        throttle.succeeded("10.0.0.2")
        for _ in 0..<3 { #expect(throttle.begin("10.0.0.2")) }
        #expect(!throttle.begin("10.0.0.2"))
        now.withLock { $0 = start + .seconds(59) }
        #expect(throttle.isThrottled("10.0.0.1"))
        now.withLock { $0 = start + .seconds(60) }
        #expect(!throttle.isThrottled("10.0.0.1"))
        #expect(throttle.begin("10.0.0.1"))
        #expect(!throttle.isThrottled("10.0.0.1"))
        // At most maxAddresses minutes remembered.
        for n in 0..<(EnrollmentThrottle.maxAddresses + 5) { _ = throttle.begin("10.1.\(n / 256).\(n % 256)") }
        #expect(throttle.addresses == EnrollmentThrottle.maxAddresses)
        for _ in 0..<3 { #expect(throttle.begin("10.0.0.9")) }
        #expect(throttle.isThrottled("10.0.0.9"))
    }

    /// A server that cannot read its tokens answers an enrollment `ERROR_INTERNAL` (its fault:
    /// try later), not `ERROR_ENROLLMENT_REFUSED` (which asks an operator for a new token); a
    /// wrong token is still refused, and once the tokens read again the same agent enrolls.
    @Test func aServerFaultAtEnrollmentIsNotARefusal() async throws {
        let vault = FlakyTokens()
        try await withStopping(InProcessServer(tokens: { vault.wrap($0) })) { server in
            let tls = try AgentLink.tlsContext(caPEM: contents(server.data + "/ca.pem"))
            let key = try RSAPrivateKey.generate()
            func enroll(_ token: String) async -> WireErrorCode? {
                do {
                    _ = try await AgentEnrollment.register(host: "127.0.0.1", port: server.agentPort, tls: tls, token: token, key: key, hostInfo: .init())
                    return nil
                } catch {
                    return (error as? AgentError)?.serverError ?? .errorUnspecified
                }
            }
            vault.failing.withLock { $0 = true }
            #expect(await enroll(server.created.enrollmentToken) == .errorInternal)
            vault.failing.withLock { $0 = false }
            #expect(await enroll("dredge_enr_wrong") == .errorEnrollmentRefused)
            #expect(await enroll(server.created.enrollmentToken) == nil)
        }
    }

    /// The limiter lets `perMinute` records through a window, holds the rest back, and the first
    /// record of the next window says how many were held back.
    @Test func theRefusalLimiterCountsWhatItHoldsBack() {
        let start = ContinuousClock.now
        let now = Mutex(start)
        let limiter = RateLimitedLog(perMinute: 3) { now.withLock { $0 } }
        var emitted: [Int] = []
        for _ in 0..<8 { limiter.log { emitted.append($0) } }
        #expect(emitted == [0, 0, 0])
        now.withLock { $0 = start + .seconds(59) }
        limiter.log { emitted.append($0) }
        #expect(emitted == [0, 0, 0])
        now.withLock { $0 = start + .seconds(60) }
        for _ in 0..<4 { limiter.log { emitted.append($0) } }
        #expect(emitted == [0, 0, 0, 6, 0, 0])
    }

    /// Upload state nothing will finish is removed; uploads still open and finished results stay.
    @Test func theJanitorRemovesOnlyAbandonedUploadState() async throws {
        try await withStopping(InProcessServer()) { server in
            let a = try await server.enrollAgent()
            let open = try await server.queuePull(agentID: a.agentID)
            let done = try await server.queuePull(agentID: a.agentID)
            try await server.pulls.update(done, agent: a.agentID, status: .failed, detail: "x")
            let paths = DataDirectory(server.data)
            let keep = try paths.upload(open, agent: a.agentID), drop = try paths.upload(done, agent: a.agentID)
            let orphan = try paths.upload(Hex.encode(secureRandomBytes(16)), agent: a.agentID), odd = paths.uploads + "/not-an-upload"
            for p in [keep, drop, orphan, odd] { try FileManager.default.createDirectory(atPath: p + "/chunks", withIntermediateDirectories: true) }
            let finished = try paths.pullFiles(done, agent: a.agentID)
            try FileManager.default.createDirectory(atPath: finished, withIntermediateDirectories: true)
            let removed = try await UploadJanitor(paths: paths, pulls: server.pulls, feedback: server.feedback, logger: .init(label: "t")).sweep()
            #expect(Set(removed) == [drop, orphan, odd])
            #expect(FileManager.default.fileExists(atPath: keep) && FileManager.default.fileExists(atPath: finished))
        }
    }

    /// Paths are built from ids only and never leave the data directory.
    @Test func dataDirectoryPathsStayInside() throws {
        let paths = DataDirectory("/srv/dredge/data")
        let id = "0123456789abcdef0123456789abcdef"
        #expect(try paths.feedbackFiles(id) == "/srv/dredge/data/feedback/\(id)")
        for bad in ["../pulls", "..", ".", "/etc", String(repeating: "a", count: 100_000)] {
            #expect(throws: DataDirectory.PathError.self) { try paths.feedbackFiles(bad) }
            #expect(throws: DataDirectory.PathError.self) { try paths.upload(id, agent: bad) }
        }
        #expect(throws: DataDirectory.PathError.self) { try paths.inside("/srv/dredge/data/../pulls") }
        #expect(throws: DataDirectory.PathError.self) { try paths.inside("/srv/dredge/data") }
        #expect(throws: DataDirectory.PathError.self) { try paths.inside("/srv/dredge/database") }
    }
}

/// `UploadStatusQuery` answers from what the server stored, not only from the asking
/// connection: a resuming agent learns its partial upload is held, or that it finished.
@Suite struct UploadStatusTests {
    @Test func statusComesFromStoredStateAcrossConnections() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let a = try await server.enrollAgent(hostname: "a"), b = try await server.enrollAgent(hostname: "b")
            func status(_ agent: LinkAgent, _ id: String) async throws -> WireUploadStatus? {
                try await agent.connect { link in
                    try await link.send(.with { $0.uploadStatusQuery = .with { $0.uploadID = id } })
                    while let frame = try await link.next() { if case .uploadStatus(let s)? = frame.body { return s } }
                    return nil
                }
            }
            // A partial upload: one chunk of two or more stored, then the connection is gone.
            let (command, upload) = try await a.connect { link -> (WirePullCommand, SealedUpload) in
                _ = try await server.admin.createPull(PullRequest(uid: nil, agent: a.agentID, filter: .all))
                let cmd = try await LinkAgent.acceptNextPull(over: link)
                let upload = try a.pullUpload(cmd, store: store, dir: server.dir)
                try #require(upload.header.chunkCount >= 2)
                try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
                _ = try await LinkAgent.answer(to: cmd.commandID, over: link)
                for index: UInt32 in [1] {
                    let sealed = try upload.chunk(index)
                    try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = cmd.commandID; $0.index = index; $0.ciphertext = Data(sealed) } })
                    #expect(try await LinkAgent.answer(to: cmd.commandID, over: link)?.chunkAck.index == index)
                }
                return (cmd, upload)
            }
            let partial = try #require(try await status(a, command.commandID))
            #expect(partial.state == .receiving)
            #expect(ChunkBitmap.decode(partial.received, count: upload.header.chunkCount) == [1])
            // Not another agent's to know, nor an id nobody began.
            #expect(try await status(b, command.commandID)?.state == .unknown)
            #expect(try await status(a, Hex.encode(secureRandomBytes(16)))?.state == .unknown)
            // Finished on a later connection: complete.
            try await a.connect { link in
                let outcome = try await LinkAgent.send(upload, over: link)
                #expect(outcome.result.ok, "\(outcome)")
            }
            #expect(try await status(a, command.commandID)?.state == .complete)
        }
    }
}

extension UploadStatusTests {
    /// `header.empty` must agree with the payload: an upload that claims to be empty but holds
    /// records fails as an invalid payload, and the pull says so.
    @Test func aHeaderThatMisstatesEmptinessFailsThePayload() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let a = try await server.enrollAgent()
            let pullID = try await a.connect { link in
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: a.agentID, filter: LogFilter(uid: "u-3")))
                let cmd = try await LinkAgent.acceptNextPull(over: link)
                let honest = try a.pullUpload(cmd, store: store, dir: server.dir)
                #expect(!honest.header.empty)
                let lying = try SealedUpload(
                    zipPath: honest.path, uploadID: cmd.commandID, kind: .pull, agentID: a.agentID, key: try a.key.unwrapKey(Array(cmd.wrappedKey)),
                    empty: true, createdAt: Timestamp.now.microseconds)
                let outcome = try await LinkAgent.send(lying, over: link)
                #expect(outcome == .finished(outcome.result) && outcome.result.error == .errorPayloadInvalid, "\(outcome)")
                return pull.id
            }
            try await server.connectionsEnded()
            #expect(try await server.admin.pull(pullID).targets.first?.status == .failed)
        }
    }
}

extension UploadStatusTests {
    /// A device store on `server` with records of u-1, u-2 and u-3, and one enrolled agent.
    static func device(on server: InProcessServer) async throws -> (store: String, agent: LinkAgent) {
        (try server.deviceStore(), try await server.enrollAgent())
    }

    /// An export sealed for `cmd` but made with `filter` and naming `commandID` in its manifest.
    static func export(_ cmd: WirePullCommand, filter: LogFilter, commandID: String, by agent: LinkAgent, store: String, dir: TempDir) throws -> SealedUpload {
        let s = try LogStore(path: store)
        defer { try? s.close() }
        let zip = dir.file("lying-\(UUID().uuidString).zip")
        let manifest = try Exporter.export(
            from: s, ExportRequest(uploadID: cmd.commandID, kind: .pull, agentID: agent.agentID, commandID: commandID, filter: filter), to: zip)
        return try SealedUpload(
            zipPath: zip, uploadID: cmd.commandID, kind: .pull, agentID: agent.agentID, key: try agent.key.unwrapKey(Array(cmd.wrappedKey)),
            empty: manifest.empty, createdAt: Timestamp.now.microseconds)
    }

    /// The manifest must describe the pull it answers (Protocol § Payload): its command, and the
    /// command's filter bounded by the target uid. An agent that exports more than was asked
    /// (every user's records for a pull by uid) or answers with another command's manifest
    /// fails the payload; the honest export of the same pull completes.
    @Test func aManifestThatDoesNotDescribeItsPullFailsThePayload() async throws {
        try await withStopping(InProcessServer()) { server in
            let (store, a) = try await Self.device(on: server)
            let filter = LogFilter(levels: [.info, .error])
            let (wider, otherCommand, honest) = try await a.connect { link in
                try await link.heartbeat(activeUIDs: ["u-3"])
                var ids: [String] = []
                for _ in 0..<3 {
                    let pull = try await server.admin.createPull(PullRequest(uid: "u-3", agent: a.agentID, filter: filter))
                    let cmd = try await LinkAgent.acceptNextPull(over: link)
                    #expect(cmd.commandID == pull.id)
                    ids.append(pull.id)
                    let upload: SealedUpload
                    switch ids.count {
                    case 1: upload = try Self.export(cmd, filter: filter, commandID: cmd.commandID, by: a, store: store, dir: server.dir)  // uid left out
                    case 2: upload = try Self.export(cmd, filter: filter.bounded(toTarget: "u-3"), commandID: ids[0], by: a, store: store, dir: server.dir)
                    default: upload = try a.pullUpload(cmd, store: store, dir: server.dir)
                    }
                    let outcome = try await LinkAgent.send(upload, over: link)
                    #expect(outcome.result.ok == (ids.count == 3), "\(outcome)")
                    if ids.count < 3 { #expect(outcome.result.error == .errorPayloadInvalid, "\(outcome)") }
                }
                return (ids[0], ids[1], ids[2])
            }
            try await server.connectionsEnded()
            #expect(try await server.admin.pull(wider).targets.first?.status == .failed)
            #expect(try await server.admin.pull(otherCommand).targets.first?.status == .failed)
            #expect(try await server.admin.pull(honest).targets.first?.status == .complete)
        }
    }
}

/// Tokens that fail to read while `failing` is set (a database the server cannot reach).
final class FlakyTokens: Sendable {
    let failing = Mutex(false)
    struct Unreadable: Error {}

    struct Vault: TokenVault {
        let inner: any TokenVault
        let owner: FlakyTokens
        func admin(for token: String, now: Date) async throws -> Caller? { try await inner.admin(for: token, now: now) }
        func acceptsEnrollment(_ token: String, now: Date) async throws -> Bool {
            if owner.failing.withLock({ $0 }) { throw Unreadable() }
            return try await inner.acceptsEnrollment(token, now: now)
        }
        func useEnrollment(_ token: String, now: Date) async throws -> EnrollmentTokenUse {
            if owner.failing.withLock({ $0 }) { throw Unreadable() }
            return try await inner.useEnrollment(token, now: now)
        }
        func returnEnrollmentUse(_ token: String) async throws { try await inner.returnEnrollmentUse(token) }
        func list() async throws -> [TokenInfo] { try await inner.list() }
        func create(name: String, kind: TokenKind, limits: TokenLimits, now: Date) async throws -> TokenCreated {
            try await inner.create(name: name, kind: kind, limits: limits, now: now)
        }
        func revoke(name: String, kind: TokenKind) async throws { try await inner.revoke(name: name, kind: kind) }
        func openSession(_ session: StoredConsoleSession, capacity: Int, now: Date) async throws { try await inner.openSession(session, capacity: capacity, now: now) }
        func session(key: String, now: Date) async throws -> StoredConsoleSession? { try await inner.session(key: key, now: now) }
        func closeSession(key: String) async throws { try await inner.closeSession(key: key) }
    }

    func wrap(_ inner: any TokenVault) -> any TokenVault { Vault(inner: inner, owner: self) }
}

extension UploadStatusTests {
    /// A `CommandRejected` for a command the agent already accepted (and is uploading) changes
    /// nothing: only a queued or delivered pull can be rejected, as only those can be accepted.
    @Test func aRejectionAfterAcceptanceIsIgnored() async throws {
        try await withStopping(InProcessServer()) { server in
            let (store, a) = try await Self.device(on: server)
            let pullID = try await a.connect { link in
                let pull = try await server.admin.createPull(PullRequest(uid: nil, agent: a.agentID, filter: LogFilter(uid: "u-3")))
                let cmd = try await LinkAgent.acceptNextPull(over: link)
                try await link.send(.with { $0.commandRejected = .with { $0.commandID = cmd.commandID; $0.reason = .rejectBusy } })
                let outcome = try await LinkAgent.send(try a.pullUpload(cmd, store: store, dir: server.dir), over: link)
                #expect(outcome.result.ok, "\(outcome)")
                return pull.id
            }
            #expect(try await server.admin.pull(pullID).targets.first?.status == .complete)
        }
    }
}

extension UploadStatusTests {
    /// A completed pull begun again, on a later connection, is answered its original
    /// `UploadResult`: the same day files and records (the stored file list also holds the
    /// manifest, which is not a day file).
    @Test func aCompletedPullBegunAgainGetsItsOriginalResult() async throws {
        try await withStopping(InProcessServer()) { server in
            let (store, a) = try await Self.device(on: server)
            let (upload, first) = try await a.connect { link in
                _ = try await server.admin.createPull(PullRequest(uid: nil, agent: a.agentID, filter: LogFilter(uid: "u-3")))
                let cmd = try await LinkAgent.acceptNextPull(over: link)
                let upload = try a.pullUpload(cmd, store: store, dir: server.dir)
                return (upload, try await LinkAgent.send(upload, over: link).result)
            }
            #expect(first.ok && first.files > 0 && first.records > 0, "\(first)")
            // Its chunks are removed (by the connection, well before the janitor's first sweep).
            let chunks = try DataDirectory(server.data).upload(first.uploadID, agent: a.agentID)
            #expect(try await PullOutcomeTests.waitFor(.seconds(5)) { !FileManager.default.fileExists(atPath: chunks) }, "a landed upload's chunks are removed")
            let again = try await a.connect { link in try await LinkAgent.send(upload, over: link).result }
            #expect(again == first)
        }
    }
}

extension UploadStatusTests {
    /// A pull's header is a pull's: kind PULL, no feedback, no wrapped key. An export-kind header
    /// (a manual export file's), or a pull header dressed with feedback fields, is refused at
    /// its first frame, and the honest header of the same pull is then received.
    @Test func aPullHeaderOfAnotherShapeIsRefused() async throws {
        try await withStopping(InProcessServer()) { server in
            let (store, a) = try await Self.device(on: server)
            try await a.connect { link in
                _ = try await server.admin.createPull(PullRequest(uid: nil, agent: a.agentID, filter: LogFilter(uid: "u-3")))
                let cmd = try await LinkAgent.acceptNextPull(over: link)
                let upload = try a.pullUpload(cmd, store: store, dir: server.dir)
                var shapes: [WireUploadHeader] = []
                var export = upload.header
                export.kind = .export
                shapes.append(export)
                var withFeedback = upload.header
                withFeedback.feedback = .with { $0.feedbackID = cmd.commandID; $0.uid = "u-3"; $0.text = "hi"; $0.createdAtUs = 1 }
                shapes.append(withFeedback)
                var withKey = upload.header
                withKey.wrappedKey = Data(repeating: 7, count: 384)
                shapes.append(withKey)
                for header in shapes {
                    try await link.send(.with { $0.uploadBegin = .with { $0.header = header } })
                    #expect(try await LinkAgent.answer(to: cmd.commandID, over: link)?.error.code == .errorUploadInvalid, "\(header.kind)")
                }
                let outcome = try await LinkAgent.send(upload, over: link)
                #expect(outcome.result.ok, "\(outcome)")
            }
        }
    }
}

/// The listener's pull queue, with every write of a `failed` status held until ``open()``.
final class HeldFailures: Sendable {
    private struct State {
        var isOpen = false
        var held: [CheckedContinuation<Void, Never>] = []
    }
    private let state = Mutex(State())

    func wrapping(_ base: any PullQueue) -> any PullQueue { Queue(base: base, held: self) }

    /// Returns once a write of `failed` is being held (or the gate is open); throws if none is
    /// within `limit` (a server that never writes it fails the test instead of hanging it).
    func reached(within limit: Duration = .seconds(300)) async throws {
        let deadline = ContinuousClock.now + limit
        while !state.withLock({ $0.isOpen || !$0.held.isEmpty }) {
            guard ContinuousClock.now < deadline else { throw AgentError("no write of `failed` was held within \(limit)") }
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    /// Lets every held write go on, and every later one through.
    func open() {
        let go = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.isOpen = true
            defer { s.held = [] }
            return s.held
        }
        for c in go { c.resume() }
    }

    fileprivate func hold() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if s.isOpen { return true }
                s.held.append(c)
                return false
            }
            if now { c.resume() }
        }
    }

    private struct Queue: PullQueue {
        let base: any PullQueue
        let held: HeldFailures
        func create(_ pull: NewPull) async throws { try await base.create(pull) }
        func pull(_ id: String, now: Timestamp) async throws -> PullRecord? { try await base.pull(id, now: now) }
        func pulls(limit: Int, reason: String?, now: Timestamp) async throws -> [PullRecord] { try await base.pulls(limit: limit, reason: reason, now: now) }
        func storedPull(_ id: String) async throws -> StoredPull { try await base.storedPull(id) }
        func wrappedKey(of pullID: String) async throws -> [UInt8]? { try await base.wrappedKey(of: pullID) }
        func deliverable(for agentID: String, includingUnanswered: Bool, now: Timestamp) async throws -> [DuePull] {
            try await base.deliverable(for: agentID, includingUnanswered: includingUnanswered, now: now)
        }
        func markDelivered(_ pullID: String, agent: String, at: Date) async throws -> Bool { try await base.markDelivered(pullID, agent: agent, at: at) }
        func update(
            _ pullID: String, agent: String, status: PullStatus, detail: String, chunksReceived: Int?, chunkCount: Int?, bytes: Int64?, files: [String]?,
            errorCode: Int?, from: Set<PullStatus>?, at: Date
        ) async throws -> Bool {
            if status == .failed { await held.hold() }
            return try await base.update(
                pullID, agent: agent, status: status, detail: detail, chunksReceived: chunksReceived, chunkCount: chunkCount, bytes: bytes, files: files,
                errorCode: errorCode, from: from, at: at)
        }
        func expireStalled(now: Date, listeningSince: Date, deadlines: PullTargetLife.Deadlines) async throws -> Int {
            try await base.expireStalled(now: now, listeningSince: listeningSince, deadlines: deadlines)
        }
        func agentsWithQueuedPulls() async throws -> Set<String> { try await base.agentsWithQueuedPulls() }
        func adopt(agent: String, uids: Set<String>, now: Timestamp) async throws -> [String] { try await base.adopt(agent: agent, uids: uids, now: now) }
        func approve(_ pullID: String, by approver: String, now: Timestamp) async throws -> PullRecord? { try await base.approve(pullID, by: approver, now: now) }
        func markRemoved(_ pullID: String, by actor: String, reason: String, at: Date) async throws -> RemovalMark? {
            try await base.markRemoved(pullID, by: actor, reason: reason, at: at)
        }
        func removable(keptUntil cutoff: Date, limit: Int) async throws -> [String] { try await base.removable(keptUntil: cutoff, limit: limit) }
    }
}
