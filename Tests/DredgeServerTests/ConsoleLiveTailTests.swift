import AsyncHTTPClient
import DredgeAdminAPI
import DredgeDomain
import DredgeTestSupport
import Foundation
import NIOCore
import NIOHTTP1
import Testing
@testable import DredgeServer

/// The console's live view of a tail (#53) over HTTP against the in-process server: started
/// from its form (with its CSRF token, refused without), its events as a browser reads them
/// (records as rows, where the page stands as each event's id), a reconnect that goes on from
/// there repeating nothing, and signing out stopping the tail. The page in a real browser is
/// the browser test's part.
@Suite struct ConsoleLiveTailTests {
    /// A browser's cookies and requests, over a real HTTP connection. Its deadlines (5 minutes)
    /// only keep a hung server from hanging the test: a loaded `make test` kept this suite
    /// from running for over two minutes, and a 30 s deadline failed it.
    final class Browser: @unchecked Sendable {
        let base: String
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: HTTPClient.Configuration(redirectConfiguration: .disallow))
        var cookies: [String: String] = [:]

        init(_ base: String) { self.base = base }

        struct Page {
            var status: UInt
            var location: String?
            var body: String
            var csrf: String? {
                guard let range = body.range(of: #"name="csrf" value=""#) else { return nil }
                return String(body[range.upperBound...].prefix { $0 != "\"" })
            }
        }

        func request(_ path: String, method: HTTPMethod = .GET, form: [String: String]? = nil, headers more: [(String, String)] = []) -> HTTPClientRequest {
            var request = HTTPClientRequest(url: base + path)
            request.method = method
            if !cookies.isEmpty { request.headers.add(name: "Cookie", value: cookies.map { "\($0.key)=\($0.value)" }.joined(separator: "; ")) }
            for (name, value) in more { request.headers.add(name: name, value: value) }
            if let form {
                var allowed = CharacterSet.alphanumerics
                allowed.insert(charactersIn: "-._~")
                request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
                request.body = .bytes(ByteBuffer(string: form.map { "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: allowed) ?? "")" }.joined(separator: "&")))
            }
            return request
        }

        func keep(_ response: HTTPClientResponse) {
            for line in response.headers["Set-Cookie"] {
                let pair = line.split(separator: ";", maxSplits: 1)[0].split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let name = String(pair[0]), value = pair.count > 1 ? String(pair[1]) : ""
                if line.contains("Max-Age=0") || value.isEmpty { cookies[name] = nil } else { cookies[name] = value }
            }
        }

        func send(_ path: String, method: HTTPMethod = .GET, form: [String: String]? = nil) async throws -> Page {
            let response = try await client.execute(request(path, method: method, form: form), timeout: .seconds(300))
            keep(response)
            let body = try await response.body.collect(upTo: 1 << 20)
            return Page(status: response.status.code, location: response.headers.first(name: "Location"), body: String(buffer: body))
        }

        func signIn(_ token: String) async throws {
            let form = try await send("/console/sign-in")
            let signedIn = try await send("/console/sign-in", method: .POST, form: ["token": token, "csrf": form.csrf ?? ""])
            #expect(signedIn.status == 303 && cookies["dredge_console"] != nil)
        }

        /// Reads the tail's events until `done` says so of what was read; returns it, with the
        /// last event's id.
        func events(_ tailID: String, lastEventID: String? = nil, until done: (String) -> Bool) async throws -> (text: String, id: String?) {
            let response = try await client.execute(
                request("/console/tails/\(tailID)/events", headers: lastEventID.map { [("Last-Event-ID", $0)] } ?? []), timeout: .seconds(300))
            #expect(response.status == .ok && response.headers.first(name: "Content-Type") == "text/event-stream")
            var text = ""
            for try await chunk in response.body {
                text += String(buffer: chunk)
                if done(text) { break }
            }
            let id = text.split(separator: "\n").last { $0.hasPrefix("id: ") }.map { String($0.dropFirst(4)) }
            return (text, id)
        }

        func shutdown() async throws { try await client.shutdown() }
    }

    @Test func aTailIsStartedWatchedResumedAndStoppedBySigningOut() async throws {
        try await withStopping(InProcessServer()) { server in
            let browser = Browser(server.adminURL)
            do {
                try await browser.signIn(server.created.adminToken)
                // The viewer's "Watch live" carries its filters into the form.
                let viewer = try await browser.send("/console/logs?uid=u-1&level=warning%2B&text=oven")
                #expect(viewer.body.contains(#"href="/console/tails/new?uid=u-1&amp;level=warning%2B&amp;text=oven""#))
                let form = try await browser.send("/console/tails/new?uid=u-1&level=warning%2B&text=oven")
                #expect(form.status == 200 && form.body.contains(#"name="level" value="warning+""#))
                // Without the form's CSRF token: refused, nothing started.
                let forged = try await browser.send("/console/tails", method: .POST, form: ["uid": "u-1"])
                #expect(forged.status == 403)
                #expect(try await server.admin.tails().isEmpty)
                // Bad fields: the form again, saying what is wrong.
                let bad = try await browser.send("/console/tails", method: .POST, form: ["uid": "u-1", "minutes": "90", "csrf": form.csrf ?? ""])
                #expect(bad.status == 400 && bad.body.contains("1 to 60 minutes"))
                let started = try await browser.send(
                    "/console/tails", method: .POST, form: ["uid": "u-1", "level": "warning+", "minutes": "10", "reason": "SUP-7", "csrf": form.csrf ?? ""])
                let id = try #require(started.location.map { String($0.dropFirst("/console/tails/".count)) })
                let tail = try await server.admin.tail(id)
                #expect(started.status == 303 && tail.uid == "u-1" && tail.filter.levels == [.warning, .error, .critical] && tail.reason == "SUP-7")
                #expect(tail.expiresAt.microseconds - tail.issuedAt.microseconds == 600_000_000)
                let page = try await browser.send("/console/tails/\(id)")
                #expect(page.body.contains(#"data-tail-events="/console/tails/\#(id)/events?from=""#) && page.body.contains(#"id="stop""#))

                // A device's records, held as any node holds them.
                let agent = String(repeating: "cd", count: 16)
                _ = try await server.tails.deliver(id, agent: agent, wrappedKey: try server.issuer.newTailKey(), at: Date())
                _ = try await server.tails.accepted(id, agent: agent, startCursor: 0, at: Date())
                let directory = try DataDirectory(server.data).tailFiles(id, agent: agent)
                var known: TailFiles.KnownContexts?
                var held: Int64 = 0, seq: UInt64 = 0
                func hold(_ messages: [String]) async throws {
                    seq += 1
                    let records = messages.map { Array(#"{"ts":"2026-11-30T10:00:00.000000Z","level":"warning","type":"app","uid":"u-1","message":"\#($0)","metadata":{},"context":3}"#.utf8) }
                    let batch = TailBatchReader.Batch(records: records, contexts: [3: Array(#"{"app":"till","appVersion":"1.0","host":"far","os":"Linux","process":"tilld"}"#.utf8)], times: records.map { _ in 0 })
                    held = try TailFiles.append(batch, after: held, known: &known, in: directory)
                    #expect(try await server.tails.held(id, agent: agent, seq: seq, cursor: seq, records: messages.count, dropped: 0, bytes: held, at: Date()))
                }
                try await hold(["<b>x1</b>", "x2"])
                // From the start (a position of 0): the devices, then the records as rows of text.
                let first = try await browser.events(id, lastEventID: "\(agent):0") { $0.contains("x2") }
                #expect(first.text.contains("event: devices") && first.text.contains(#""message":"<b>x1<\/b>""#) && first.text.contains(#""app":"till""#))
                #expect(first.id == "\(agent):\(held)")
                try await hold(["x3"])
                // Reconnected where it stood: x3 only.
                let second = try await browser.events(id, lastEventID: first.id) { $0.contains("x3") }
                #expect(!second.text.contains("x1") && !second.text.contains("x2"))
                // A position that is not where a record ends (or is not one at all) starts at what is held now.
                try await hold(["x4"])
                let forgedPosition = try await browser.events(id, lastEventID: "\(agent):3,zz:1") { $0.contains("event: devices") }
                #expect(!forgedPosition.text.contains("x1") && forgedPosition.id == "\(agent):\(held)")

                // The page opens with what the tail showed so far, as text, and its events go on from there.
                let shown = try await browser.send("/console/tails/\(id)")
                #expect(shown.body.contains("&lt;b&gt;x1&lt;/b&gt;") && shown.body.contains(">x4<"))
                #expect(shown.body.contains(#"/events?from=\#(agent)%3A\#(held)""#))

                // Another person (a reader, an investigator who did not start it) sees its facts, not its records.
                for role in [AdminRole.reader, .investigator] {
                    let other = Browser(server.adminURL)
                    do {
                        let made = try await server.admin.createToken(TokenRequest(name: "other-\(role.rawValue)", kind: .admin, role: role))
                        try await other.signIn(made.token)
                        let theirs = try await other.send("/console/tails/\(id)")
                        #expect(theirs.status == 200 && theirs.body.contains("u-1") && !theirs.body.contains("x4") && !theirs.body.contains("data-tail-events"))
                        let response = try await other.client.execute(other.request("/console/tails/\(id)/events"), timeout: .seconds(300))
                        #expect(response.status == .forbidden)
                        try await other.shutdown()
                    } catch {
                        try await other.shutdown()
                        throw error
                    }
                }

                // Signing out ends the engineer's session, and so the tail, for its devices and watchers.
                let agents = try await browser.send("/console/agents")
                let out = try await browser.send("/console/sign-out", method: .POST, form: ["csrf": agents.csrf ?? ""])
                #expect(out.status == 303)
                let stopped = try await server.admin.tail(id)
                #expect(stopped.stopped?.reason == "its console session ended" && stopped.stopped?.by == "admin")
                try await browser.shutdown()
            } catch {
                try await browser.shutdown()
                throw error
            }
        }
    }

    /// The page reads each device's last window only, from where a record begins; a resumed
    /// watcher is not taken back further than a watcher that far behind would skip.
    @Test func thePageAndAResumeReadNoFurtherBackThanTheirBound() throws {
        let dir = TempDir()
        let file = dir.file("records.jsonl")
        try Data("aaaa\nbbbbbb\ncc\n".utf8).write(to: URL(fileURLWithPath: file))
        #expect(try Console.recordStart(in: file, atOrAfter: 0, before: 15) == 0)
        #expect(try Console.recordStart(in: file, atOrAfter: 5, before: 15) == 5)  // just after a line break
        #expect(try Console.recordStart(in: file, atOrAfter: 6, before: 15) == 12)
        #expect(try Console.recordStart(in: file, atOrAfter: 13, before: 15) == 15)  // no record begins there

        let agent = String(repeating: "ab", count: 16)
        let paths = DataDirectory(dir.file("data"))
        let tail = TailRecord(
            id: String(repeating: "01", count: 16), uid: "u-1", agents: nil, filter: LogFilter(), issuedAt: .now, expiresAt: .now, recordsPerSecond: 1,
            bytesPerSecond: 1, verbose: false, verboseTypes: [], requestedBy: "a", reason: nil, createdAt: Date(), stopped: nil,
            parts: [TailPart(agentID: agent, status: .running, bytes: TailFollower.maxBehind + 10, updatedAt: Date())])
        let records = try paths.tailFiles(tail.id, agent: agent) + "/" + TailFiles.records
        try FileManager.default.createDirectory(atPath: (records as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        // A line break before every position.
        try Data(repeating: 0x0A, count: Int(TailFollower.maxBehind + 10)).write(to: URL(fileURLWithPath: records))
        var follower = TailFollower(tail, paths: paths)
        try follower.resume([agent: 9], tail: tail)
        #expect(follower.shown[agent] == TailFollower.maxBehind + 10)  // too far back: from what is held
        try follower.resume([agent: 10], tail: tail)
        #expect(follower.shown[agent] == 10)
    }

    @Test func positionsReadBackAsWritten() throws {
        let a = String(repeating: "ab", count: 16), b = String(repeating: "01", count: 16)
        let text = try Console.tailEvents(
            [TailEvent(kind: .dropped, agent: a, host: "", count: 2)], tailID: b, hosts: [:], positions: [a: 10, b: 0])
        #expect(text == "event: dropped\ndata: {\"count\":\"2\",\"host\":\"abababab\"}\nid: \(b):0,\(a):10\n\n")
        #expect(Console.tailPositions("\(a):10,\(b):0") == [a: 10, b: 0])
        #expect(Console.tailPositions("\(a):-1,xyz:3,\(b):1:2,\(b)") == [:])
        #expect(try Console.tailEvents([], tailID: b, hosts: [:], positions: [a: 1]) == "")
    }
}
