import DredgeAdminAPI
@testable import DredgeAdminClient
import DredgeDomain
import DredgeEnvelope
@testable import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import Testing

/// Every admin route, in process through `HummingbirdTesting` (no socket), against the real
/// stores in a temporary data directory: the answers, the error codes, and what the routes
/// leave behind (the audit log, the token file).
@Suite struct AdminRouteTests {
    /// A data directory with its stores, and the admin application over them.
    struct Fixture {
        let dir = TempDir()
        let created: ServerDeployment.Created
        let registry: SQLiteAgentDirectory
        let pulls: SQLitePullQueue
        let issuer: CommandIssuer
        let feedback: SQLiteFeedbackInbox
        let tokens: SQLiteTokenVault
        let results: ResultsKeeper
        let data: String

        init() throws {
            data = dir.file("server")
            created = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
            let stores = try ServerStores(try LoadedDeployment(directory: data))
            (registry, pulls, issuer, feedback, tokens) = (stores.registry, stores.pulls, stores.issuer, stores.feedback, stores.tokens)
            let logger = Logger(label: "test.admin") { _ in SwiftLogNoOpLogHandler() }
            results = ResultsKeeper(
                paths: DataDirectory(data), pulls: pulls, feedback: feedback, records: stores.records,
                indexer: Indexer(index: stores.records, registry: nil, paths: DataDirectory(data), logger: logger), audit: pulls, retention: ResultsRetention(keepDays: 30), logger: logger)
        }

        /// Runs `body` against the application, each request with the admin token unless told otherwise.
        func test(_ body: @Sendable (Client) async throws -> Void) async throws {
            let logger = Logger(label: "test.admin") { _ in SwiftLogNoOpLogHandler() }
            let services = AdminServices(
                registry: registry, pulls: pulls, audit: pulls, issuer: issuer, feedback: feedback, tokens: tokens, dispatcher: PullDispatcher(pulls: pulls, logger: logger),
                files: PullFiles(paths: DataDirectory(data), pulls: pulls, feedback: feedback), results: results, logger: logger)
            let app = try AdminAPI.application(actions: AdminActions(services), port: 0)
            let token = created.adminToken
            try await app.test(.router) { client in try await body(Client(client: client, token: token)) }
        }

        /// An enrolled agent whose last heartbeat reported `uids`.
        func agent(uids: [String]) async throws -> String {
            let key = try RSAPrivateKey.generate()
            let id = try await registry.enroll(publicKey: key.publicKey, host: .with { $0.hostname = "host-\(uids.first ?? "none")" })
            try await registry.heartbeat(id, .with { $0.activeUids = uids })
            return id
        }
    }

    struct Client: Sendable {
        let client: any TestClientProtocol
        let token: String

        struct Answer {
            var status: HTTPResponse.Status
            var headers: HTTPFields
            var body: Data

            func decode<T: Decodable>(_ type: T.Type) throws -> T { try JSONDecoder.adminAPI.decode(type, from: body) }
            var code: String? { (try? decode(APIErrorBody.self))?.code }
        }

        func call(_ method: HTTPRequest.Method, _ uri: String, json: Data? = nil, token: String?? = .none) async throws -> Answer {
            var headers: HTTPFields = [:]
            let bearer: String? = token ?? self.token
            if let bearer { headers[.authorization] = "Bearer \(bearer)" }
            if json != nil { headers[.contentType] = "application/json" }
            return try await client.execute(uri: uri, method: method, headers: headers, body: json.map { ByteBuffer(bytes: $0) }) { response in
                Answer(status: response.status, headers: response.headers, body: Data(response.body.readableBytesView))
            }
        }

        func post(_ uri: String, _ value: some Encodable) async throws -> Answer {
            try await call(.post, uri, json: try JSONEncoder.adminAPI.encode(value))
        }
    }

    /// A file download answers HEAD with its headers alone (not audited), a range asked with
    /// the file's ETag in `If-Range` with that range, and one asked with another ETag with the
    /// whole file (it changed since the first part was fetched).
    @Test func downloadsAnswerHeadAndRangesOnlyForTheSameFile() async throws {
        let fixture = try Fixture()
        let agent = try await fixture.agent(uids: ["u-1"])
        let new = try fixture.issuer.newPull(
            uid: "u-1", agentID: "", filter: LogFilter(uid: "u-1"), targets: [agent], lifetime: .seconds(600), requestedBy: "alice", now: .now)
        try await fixture.pulls.create(new)
        let zip = try DataDirectory(fixture.data).pullZip(new.id, agent: agent)
        try FileManager.default.createDirectory(atPath: (zip as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let content = Data((0..<1000).map { UInt8($0 % 251) })
        try content.write(to: URL(fileURLWithPath: zip))
        #expect(try await fixture.pulls.update(new.id, agent: agent, status: .complete, detail: "", at: Date()))
        let uri = "/v1/pulls/\(new.id)/files/\(agent)/\((zip as NSString).lastPathComponent)"
        @Sendable func downloads() async throws -> Int { try await fixture.pulls.audit(AuditQuery(action: "pull.download")).count }

        try await fixture.test { api in
            let head = try await api.call(.head, uri)
            #expect(head.status == .ok)
            #expect(head.headers[.contentLength] == "1000")
            #expect(head.body.isEmpty)
            let etag = try #require(head.headers[.eTag])
            #expect(try await downloads() == 0, "a HEAD is not a download")

            func get(_ headers: HTTPFields) async throws -> (HTTPResponse.Status, HTTPFields, Data) {
                var all = headers
                all[.authorization] = "Bearer \(api.token)"
                return try await api.client.execute(uri: uri, method: .get, headers: all) { ($0.status, $0.headers, Data($0.body.readableBytesView)) }
            }
            let part = try await get([.range: "bytes=10-19", .ifRange: etag])
            #expect(part.0 == .partialContent)
            #expect(part.2 == content[10..<20])
            #expect(part.1[.contentRange] == "bytes 10-19/1000")
            let changed = try await get([.range: "bytes=10-19", .ifRange: "\"0000\""])
            #expect(changed.0 == .ok)
            #expect(changed.2 == content)
            #expect(try await downloads() == 1)
            let headPart = try await api.client.execute(
                uri: uri, method: .head, headers: [.authorization: "Bearer \(api.token)", .range: "bytes=0-9"]
            ) { ($0.status, $0.headers[.contentLength], $0.body.readableBytes) }
            #expect(headPart.0 == .partialContent && headPart.1 == "10" && headPart.2 == 0)
        }
    }

    /// A feedback's files are listed and served once it is complete (its day files, manifest
    /// and zip), audited as `feedback.download`; none while it uploads; 404 for one unknown.
    @Test func feedbackFilesAreListedAndServedOnceComplete() async throws {
        let fixture = try Fixture()
        let agent = try await fixture.agent(uids: ["u-1"])
        let id = "0123456789abcdef0123456789abcdef"
        try await fixture.feedback.begin(id: id, agentID: agent, uid: "u-1", text: "it broke", createdAt: .now, chunkCount: 1, bytes: 10, at: Date())
        let paths = DataDirectory(fixture.data)
        let dir = try paths.feedbackFiles(id)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let day = Data("{\"ts\":\"2027-01-15T10:00:00.000000Z\",\"level\":\"info\",\"type\":\"app\",\"message\":\"m\"}\n".utf8)
        try day.write(to: URL(fileURLWithPath: dir + "/2027-01-15.jsonl"))
        try Data("{}".utf8).write(to: URL(fileURLWithPath: dir + "/manifest.json"))
        try Data(repeating: 7, count: 300).write(to: URL(fileURLWithPath: try paths.feedbackZip(id)))

        try await fixture.test { api in
            let uploading = try await api.call(.get, "/v1/feedback/\(id)/files")
            #expect(uploading.status == .ok)
            #expect(try uploading.decode([PullFile].self).isEmpty, "nothing is served before the feedback is complete")
            #expect(try await api.call(.get, "/v1/feedback/\(id)/files/2027-01-15.jsonl").status == .notFound)
        }
        #expect(
            try await fixture.feedback.update(
                id, status: .complete, detail: "", chunksReceived: 1, records: 1, files: [dir + "/2027-01-15.jsonl", dir + "/manifest.json"], errorCode: nil))
        try await fixture.test { api in
            let listed = try await api.call(.get, "/v1/feedback/\(id)/files").decode([PullFile].self)
            #expect(listed.map(\.name) == ["\(id).zip", "2027-01-15.jsonl", "manifest.json"])
            #expect(listed.allSatisfy { $0.agentID == agent })
            #expect(listed.first { $0.name == "2027-01-15.jsonl" }?.sha256 == FileDigest.sha256(day))
            let file = try await api.call(.get, "/v1/feedback/\(id)/files/2027-01-15.jsonl")
            #expect(file.status == .ok && file.body == day)
            #expect(try await api.call(.get, "/v1/feedback/\(id)/files/..%2Fmanifest.json").status == .notFound)
            #expect(try await api.call(.get, "/v1/feedback/fedcba9876543210fedcba9876543210/files").status == .notFound)
            #expect(try await api.call(.get, "/v1/feedback/\(id)/files/nothing.jsonl").status == .notFound)
        }
        let audited = try await fixture.pulls.audit(AuditQuery(action: "feedback.download"))
        #expect(audited.map(\.detail) == ["feedback \(id) file 2027-01-15.jsonl"])
    }

    @Test func healthNeedsNoToken() async throws {
        try await Fixture().test { api in
            let answer = try await api.call(.get, "/health", token: .some(nil))
            #expect(answer.status == .ok)
            #expect(try answer.decode([String: String].self) == ["status": "ok"])
        }
    }

    /// `dredge login --sso`'s routes take no token (they are how a person gets one), and a
    /// server without single sign-on for the command line says so; they open no other route.
    @Test func singleSignOnRoutesNeedNoTokenAndSaySoWhenOff() async throws {
        try await Fixture().test { api in
            for uri in ["/v1/sso/device", "/v1/sso/device/token"] {
                let answer = try await api.call(.post, uri, json: Data(#"{"deviceCode":"x"}"#.utf8), token: .some(nil))
                #expect(answer.status == .notFound && answer.code == "sso_off", "\(uri)")
                #expect(try answer.decode(APIErrorBody.self).error.contains("sso.cliClientID"))
            }
            #expect(try await api.call(.get, "/v1/sso/anything", token: .some(nil)).status == .notFound)
            #expect(try await api.call(.get, "/v1/tokens", token: .some(nil)).status == .unauthorized)
        }
    }

    /// Each start or poll of a device sign-in is a request to the identity provider, asked by
    /// someone without a token: so many per address a minute, and so many starts in all.
    @Test func deviceSignInsAreThrottledPerAddress() {
        let throttle = DeviceSignInThrottle()
        let t0 = Date(timeIntervalSince1970: 1_800_000_000 - 1_800_000_000.truncatingRemainder(dividingBy: 60))
        for _ in 0..<DeviceSignInThrottle.startsPerAddress { #expect(throttle.admit(.start, host: "10.0.0.1", now: t0)) }
        #expect(!throttle.admit(.start, host: "10.0.0.1", now: t0.addingTimeInterval(59)))
        #expect(throttle.admit(.start, host: "10.0.0.2", now: t0), "another address")
        #expect(throttle.admit(.poll, host: "10.0.0.1", now: t0), "polls are counted apart")
        #expect(throttle.admit(.start, host: "10.0.0.1", now: t0.addingTimeInterval(60)), "the next minute")
        // An IPv6 host may hold a whole /64: it is one address.
        let six = DeviceSignInThrottle()
        for i in 0..<DeviceSignInThrottle.startsPerAddress { #expect(six.admit(.start, host: "2001:db8:0:1::\(i + 1)", now: t0)) }
        #expect(!six.admit(.start, host: "[2001:db8:0:1:ffff::9]", now: t0))
        #expect(six.admit(.start, host: "2001:db8:0:2::1", now: t0))
        // Starts in all, over many addresses.
        let all = DeviceSignInThrottle()
        for i in 0..<DeviceSignInThrottle.startsInAll { #expect(all.admit(.start, host: "10.1.\(i / 250).\(i % 250)", now: t0)) }
        #expect(!all.admit(.start, host: "10.9.9.9", now: t0))
    }

    /// A token `dredge login --sso` made is named for its person, whatever their subject holds:
    /// revoked by the address the client makes of its name, decoded by the server.
    @Test func aSignedOnTokenIsRevokedByItsName() async throws {
        let fixture = try Fixture()
        let made = try await fixture.tokens.create(
            name: TokenLimits.signedOnName(subject: "50%/a b|~x"), kind: .admin, limits: TokenLimits(expiresAt: Date().addingTimeInterval(3600), role: .reader, signedOn: true),
            now: Date())
        let path = try #require(URLComponents(url: AdminClient(server: "https://127.0.0.1:7080", token: "x").url("/v1/tokens/admin/\(made.info.name)"), resolvingAgainstBaseURL: false))
            .percentEncodedPath
        try await fixture.test { api in
            let answer = try await api.call(.delete, path)
            #expect(answer.status == .ok, "\(path): \(String(decoding: answer.body, as: UTF8.self))")
            let left = try await fixture.tokens.list()
            #expect(!left.contains { $0.name == made.info.name } && left.contains { $0.name == "admin" })
        }
    }

    @Test func everyV1RouteNeedsAnAdminToken() async throws {
        let fixture = try Fixture()
        let enrollment = fixture.created.enrollmentToken
        try await fixture.test { api in
            for (method, uri) in [(HTTPRequest.Method.get, "/v1/agents"), (.get, "/v1/pulls"), (.post, "/v1/pulls"), (.get, "/v1/feedback"), (.get, "/v1/audit"), (.get, "/v1/tokens"), (.delete, "/v1/tokens/admin/admin"), (.get, "/v1/records/vocabulary"), (.post, "/v1/records/stats")] {
                for token in [nil, "nonsense", enrollment] {
                    let answer = try await api.call(method, uri, token: .some(token))
                    #expect(answer.status == .unauthorized, "\(method) \(uri) with \(token ?? "no token")")
                    #expect(answer.code == "unauthorized")
                    #expect(answer.headers[.wwwAuthenticate]?.hasPrefix("Bearer") == true)
                }
            }
            // Not "Bearer": refused even with the right secret.
            var headers: HTTPFields = [.authorization: "Basic \(api.token)"]
            headers[.accept] = "application/json"
            let basic = try await api.client.execute(uri: "/v1/agents", method: .get, headers: headers) { $0.status }
            #expect(basic == .unauthorized)
        }
    }

    @Test func agentsAreListedWithTheirUIDs() async throws {
        let fixture = try Fixture()
        let id = try await fixture.agent(uids: ["u-2", "u-1"])
        try await fixture.test { api in
            let answer = try await api.call(.get, "/v1/agents")
            #expect(answer.status == .ok)
            let agents = try answer.decode([AgentRecord].self)
            #expect(agents.map(\.agentID) == [id])
            #expect(agents.first?.activeUIDs == ["u-1", "u-2"])
            #expect(agents.first?.connected == false)
        }
    }

    @Test func pullsAreQueuedListedAndShown() async throws {
        let fixture = try Fixture()
        let a = try await fixture.agent(uids: ["u-1"]), b = try await fixture.agent(uids: ["u-1", "u-2"])
        try await fixture.test { api in
            let filter = LogFilter(since: Timestamp(microseconds: 1_000), levels: [.error])
            let created = try await api.post("/v1/pulls", PullRequest(uid: "u-1", agent: nil, filter: filter))
            #expect(created.status == .created)
            let pull = try created.decode(PullRecord.self)
            #expect(Set(pull.targets.map(\.agentID)) == [a, b])
            #expect(pull.targets.allSatisfy { $0.status == .queued })
            #expect(pull.filter == LogFilter(since: Timestamp(microseconds: 1_000), uid: "u-1", levels: [.error]))
            #expect(pull.requestedBy == "admin")

            let narrowed = try await api.post("/v1/pulls", PullRequest(uid: "u-2", agent: b, filter: .all, reason: "SUP-77 crash")).decode(PullRecord.self)
            #expect(narrowed.targets.map(\.agentID) == [b])
            #expect(narrowed.reason == "SUP-77 crash" && pull.reason == nil)
            #expect(try await api.call(.get, "/v1/pulls?reason=sup-77").decode([PullRecord].self).map(\.id) == [narrowed.id])
            #expect(try await api.call(.get, "/v1/pulls?reason=SUP-78").decode([PullRecord].self).isEmpty)
            #expect(try await api.call(.get, "/v1/pulls?reason=%0A").status == .badRequest)

            let shown = try await api.call(.get, "/v1/pulls/\(pull.id)")
            #expect(shown.status == .ok)
            var shownPull = try shown.decode(PullRecord.self)
            #expect(shownPull.diskBytes == 0, "nothing landed yet")
            shownPull.diskBytes = nil
            #expect(shownPull == pull)

            let list = try await api.call(.get, "/v1/pulls").decode([PullRecord].self)
            #expect(Set(list.map(\.id)) == [pull.id, narrowed.id])
            #expect(try await api.call(.get, "/v1/pulls?limit=1").decode([PullRecord].self).count == 1)
            #expect(try await api.call(.get, "/v1/pulls?limit=0").decode([PullRecord].self).count == 1, "a limit below 1 is 1")

            let audit = try await api.call(.get, "/v1/audit").decode([AuditEntry].self)
            #expect(audit.filter { $0.action == "pull" }.count == 2)
            #expect(audit.allSatisfy { $0.actor == "admin" })
        }
    }

    /// Listings carry each result's disk use unless asked not to (`disk=false`, what the CLI
    /// asks when it only resolves an id prefix); any other value is refused.
    @Test func listingsMeasureDiskUseUnlessToldNot() async throws {
        let fixture = try Fixture()
        _ = try await fixture.agent(uids: ["u-1"])
        let paths = DataDirectory(fixture.data)
        let feedbackID = Hex.encode(secureRandomBytes(16))
        try await fixture.feedback.begin(id: feedbackID, agentID: "a", uid: "u-1", text: "", createdAt: Timestamp(microseconds: 1), chunkCount: 1, bytes: 10)
        try FileManager.default.createDirectory(atPath: try paths.feedbackFiles(feedbackID), withIntermediateDirectories: true)
        try Data(count: 700).write(to: URL(fileURLWithPath: try paths.feedbackFiles(feedbackID) + "/2027-01-01.jsonl"))
        try await fixture.test { api in
            let pull = try await api.post("/v1/pulls", PullRequest(uid: "u-1", agent: nil, filter: .all)).decode(PullRecord.self)
            try FileManager.default.createDirectory(atPath: try paths.pull(pull.id) + "/x", withIntermediateDirectories: true)
            try Data(count: 1234).write(to: URL(fileURLWithPath: try paths.pull(pull.id) + "/x/f"))
            #expect(try await api.call(.get, "/v1/pulls").decode([PullRecord].self).first?.diskBytes == 1234)
            #expect(try await api.call(.get, "/v1/pulls?disk=true&limit=5").decode([PullRecord].self).first?.diskBytes == 1234)
            #expect(try await api.call(.get, "/v1/pulls?disk=false").decode([PullRecord].self).map(\.diskBytes) == [nil])
            #expect(try await api.call(.get, "/v1/feedback").decode([FeedbackRecord].self).first?.diskBytes == 700)
            #expect(try await api.call(.get, "/v1/feedback?disk=false").decode([FeedbackRecord].self).map(\.diskBytes) == [nil])
            // One at a time, likewise.
            #expect(try await api.call(.get, "/v1/pulls/\(pull.id)").decode(PullRecord.self).diskBytes == 1234)
            #expect(try await api.call(.get, "/v1/pulls/\(pull.id)?disk=false").decode(PullRecord.self).diskBytes == nil)
            #expect(try await api.call(.get, "/v1/feedback/\(feedbackID)").decode(FeedbackRecord.self).diskBytes == 700)
            #expect(try await api.call(.get, "/v1/feedback/\(feedbackID)?disk=false").decode(FeedbackRecord.self).diskBytes == nil)
            for bad in ["/v1/pulls?disk=no", "/v1/feedback?disk=1", "/v1/pulls/\(pull.id)?disk=0"] {
                let answer = try await api.call(.get, bad)
                #expect(answer.status == .badRequest && answer.code == "bad_request", "\(bad)")
            }
        }
    }

    @Test func agentsAreFoundByAnyUIDTheirStoreHolds() async throws {
        let fixture = try Fixture()
        let active = try await fixture.agent(uids: ["u-1"])
        let key = try RSAPrivateKey.generate()
        let reporting = try await fixture.registry.enroll(publicKey: key.publicKey, host: .with { $0.hostname = "host-old" })
        // Records of u-1 and u-old two days ago: no longer active, still in the store.
        let seen = Timestamp.now.subtracting(.seconds(48 * 3_600)).microseconds / 3_600_000_000 * 3_600_000_000
        try await fixture.registry.heartbeat(reporting, .with {
            // u-old's time is not on an hour (an agent that did not truncate it): kept truncated (§ 9).
            $0.users = .with { $0.users = [.with { $0.uid = "u-old"; $0.lastSeenUs = seen + 1_800_000_123 }, .with { $0.uid = "u-1"; $0.lastSeenUs = seen }] }
        })
        try await fixture.test { api in
            let holders = try await api.call(.get, "/v1/agents?uid=u-old").decode([AgentRecord].self)
            #expect(holders.map(\.agentID) == [reporting])
            #expect(holders.first?.uidLastSeen == Date(timeIntervalSince1970: Double(seen) / 1e6) && holders.first?.reportedUsers == 2)
            let both = try await api.call(.get, "/v1/agents?uid=u-1").decode([AgentRecord].self)
            #expect(Set(both.map(\.agentID)) == [active, reporting])
            #expect(both.first { $0.agentID == active }?.uidLastSeen == nil, "known by its active uids alone")
            #expect(try await api.call(.get, "/v1/agents?uid=nobody").decode([AgentRecord].self).isEmpty)
            #expect(try await api.call(.get, "/v1/agents").decode([AgentRecord].self).count == 2)
            let bad = try await api.call(.get, "/v1/agents?uid=u%001")
            #expect(bad.status == .badRequest && bad.code == "bad_request")

            // A pull by u-old goes to the agent that holds it though its records are two days old.
            let pull = try await api.post("/v1/pulls", PullRequest(uid: "u-old", agent: nil, filter: .all)).decode(PullRecord.self)
            #expect(pull.targets.map(\.agentID) == [reporting])
            // A pull by a uid nobody holds yet waits for an agent that comes to hold it.
            let created = try await api.post("/v1/pulls", PullRequest(uid: "u-later", agent: nil, filter: .all))
            #expect(created.status == .created)
            let waiting = try created.decode(PullRecord.self)
            #expect(waiting.targets.isEmpty && !waiting.isFinished)
            let added = try await fixture.registry.heartbeat(active, .with { $0.activeUids = ["u-1", "u-later"] })
            #expect(added == ["u-later"])
            #expect(try await fixture.pulls.adopt(agent: active, uids: added, now: .now) == [waiting.id])
            let joined = try await api.call(.get, "/v1/pulls/\(waiting.id)").decode(PullRecord.self)
            #expect(joined.targets.map(\.agentID) == [active] && joined.targets.first?.status == .queued)
        }
    }

    @Test func pullRequestsThatCannotBeMetAreRefused() async throws {
        let fixture = try Fixture()
        let agent = try await fixture.agent(uids: ["u-1"])
        try await fixture.test { api in
            let cases: [(PullRequest, HTTPResponse.Status, String)] = [
                (PullRequest(uid: nil, agent: nil, filter: .all), .badRequest, "bad_request"),
                (PullRequest(uid: nil, agent: String(repeating: "0", count: 32), filter: .all), .notFound, "no_agent"),
                (PullRequest(uid: nil, agent: "not-an-id", filter: .all), .badRequest, "bad_request"),
                (PullRequest(uid: "u\u{0}1", agent: agent, filter: .all), .badRequest, "bad_request"),
                (PullRequest(uid: nil, agent: agent, filter: LogFilter(since: Timestamp(microseconds: 5), until: Timestamp(microseconds: 5))), .badRequest, "bad_request"),
                (PullRequest(uid: nil, agent: agent, filter: LogFilter(since: Timestamp(microseconds: -1))), .badRequest, "bad_request"),
            ]
            for (request, status, code) in cases {
                let answer = try await api.post("/v1/pulls", request)
                #expect(answer.status == status, "\(request)")
                #expect(answer.code == code, "\(request)")
            }
            let unreadable = try await api.call(.post, "/v1/pulls", json: Data("{\"uid\": 7".utf8))
            #expect(unreadable.status == .badRequest && unreadable.code == "bad_request")
            let huge = try await api.call(.post, "/v1/pulls", json: Data(repeating: 32, count: 64 * 1024 + 1))
            #expect(huge.status == .contentTooLarge)
            // Nothing above was queued or audited.
            #expect(try await fixture.pulls.pulls().isEmpty)
            #expect(try await api.call(.get, "/v1/audit").decode([AuditEntry].self).isEmpty)
        }
    }

    @Test func unknownAndMalformedIdsAreTold() async throws {
        try await Fixture().test { api in
            let unknown = String(repeating: "a", count: 32)
            for uri in ["/v1/pulls/\(unknown)", "/v1/feedback/\(unknown)", "/v1/nothing"] {
                let answer = try await api.call(.get, uri)
                #expect(answer.status == .notFound, "\(uri)")
                #expect(answer.code == "not_found", "\(uri)")
            }
            for uri in ["/v1/pulls/ABC", "/v1/feedback/..%2F..%2Fetc", "/v1/pulls/\(unknown)0"] {
                let answer = try await api.call(.get, uri)
                #expect(answer.status == .badRequest, "\(uri)")
                #expect(answer.code == "bad_request", "\(uri)")
            }
        }
    }

    @Test func feedbackIsListedAndShown() async throws {
        let fixture = try Fixture()
        let agent = try await fixture.agent(uids: ["u-1"])
        let first = Hex.encode(secureRandomBytes(16)), second = Hex.encode(secureRandomBytes(16))
        try await fixture.feedback.begin(id: first, agentID: agent, uid: "u-1", text: "the oven", createdAt: Timestamp(microseconds: 1), chunkCount: 1, bytes: 10)
        try await fixture.feedback.begin(id: second, agentID: agent, uid: "u-1", text: "the fridge", createdAt: Timestamp(microseconds: 2), chunkCount: 1, bytes: 10)
        try await fixture.feedback.update(first, status: .complete, detail: "3 records", records: 3, files: ["a.jsonl"])
        try await fixture.test { api in
            let list = try await api.call(.get, "/v1/feedback")
            #expect(list.status == .ok)
            #expect(Set(try list.decode([FeedbackRecord].self).map(\.id)) == [first, second])
            let one = try await api.call(.get, "/v1/feedback/\(first)").decode(FeedbackRecord.self)
            #expect(one.text == "the oven" && one.status == .complete && one.records == 3 && one.files == ["a.jsonl"])
            #expect(try await api.call(.get, "/v1/feedback?limit=1").decode([FeedbackRecord].self).count == 1)
        }
    }

    @Test func tokensAreMadeListedAndRevoked() async throws {
        let fixture = try Fixture()
        try await fixture.test { api in
            let made = try await api.post("/v1/tokens", TokenRequest(name: "alice", kind: .admin))
            #expect(made.status == .created)
            let alice = try made.decode(TokenCreated.self)
            #expect(alice.token.hasPrefix("dredge_adm_"))
            // The new token works at once, and what it does is audited under its name.
            let asAlice = try await api.call(.post, "/v1/tokens", json: try JSONEncoder.adminAPI.encode(TokenRequest(name: "bob", kind: .enrollment)), token: .some(alice.token))
            #expect(asAlice.status == .created)
            let names = try await api.call(.get, "/v1/tokens").decode([TokenInfo].self).map(\.name)
            #expect(Set(names) == ["admin", "alice", "bob", "default"])
            #expect(!String(decoding: try await api.call(.get, "/v1/tokens").body, as: UTF8.self).contains(alice.token))

            #expect(try await api.post("/v1/tokens", TokenRequest(name: "alice", kind: .admin)).status == .conflict)
            #expect(try await api.post("/v1/tokens", TokenRequest(name: "no spaces", kind: .admin)).code == "bad_request")

            let revoked = try await api.call(.delete, "/v1/tokens/admin/alice")
            #expect(revoked.status == .ok)
            #expect(!(try revoked.decode([TokenInfo].self)).contains { $0.name == "alice" })
            #expect(try await api.call(.get, "/v1/agents", token: .some(alice.token)).status == .unauthorized)
            #expect(try await api.call(.delete, "/v1/tokens/admin/alice").code == "not_found")
            #expect(try await api.call(.delete, "/v1/tokens/root/alice").code == "not_found")

            let audit = try await api.call(.get, "/v1/audit").decode([AuditEntry].self)
            #expect(audit.contains { $0.actor == "alice" && $0.action == "token.create" && $0.detail.contains("bob") })
            #expect(audit.contains { $0.actor == "admin" && $0.action == "token.revoke" })
        }
        // Each change was committed before it took effect: the database opened anew has it.
        let onDisk = try await SQLiteTokenVault(try ServerDatabase(directory: fixture.data)).list().map(\.name)
        #expect(onDisk.contains("bob") && !onDisk.contains("alice"))
    }

    @Test func theLastAdminTokenCannotBeRevoked() async throws {
        let fixture = try Fixture()
        try await fixture.test { api in
            let admins = try await api.call(.get, "/v1/tokens").decode([TokenInfo].self).filter { $0.kind == .admin }
            #expect(admins.count == 1)
            let answer = try await api.call(.delete, "/v1/tokens/admin/\(admins[0].name)")
            #expect(answer.status == .conflict && answer.code == "conflict")
            #expect(try await api.call(.get, "/v1/agents").status == .ok, "the token still works")
        }
    }

    @Test func refusedTokensAndSearchesAreRecordedWithoutFlooding() {
        let refusals = RefusalAudit()
        let t0 = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(refusals.admit(host: "10.0.0.1", now: t0) == 0)
        #expect(refusals.admit(host: "10.0.0.1", now: t0.addingTimeInterval(1)) == nil)
        #expect(refusals.admit(host: "10.0.0.1", now: t0.addingTimeInterval(59)) == nil)
        #expect(refusals.admit(host: "10.0.0.2", now: t0.addingTimeInterval(2)) == 0, "another host is recorded at once")
        #expect(refusals.admit(host: "10.0.0.1", now: t0.addingTimeInterval(61)) == 2, "the next entry says how many were not recorded")

        let searches = SearchAudit()
        #expect(searches.shouldRecord(actor: "alice", detail: "uid=u-1", now: t0))
        #expect(!searches.shouldRecord(actor: "alice", detail: "uid=u-1", now: t0.addingTimeInterval(599)))
        #expect(searches.shouldRecord(actor: "bob", detail: "uid=u-1", now: t0.addingTimeInterval(1)))
        #expect(searches.shouldRecord(actor: "alice", detail: "uid=u-2", now: t0.addingTimeInterval(1)))
        #expect(searches.shouldRecord(actor: "alice", detail: "uid=u-1", now: t0.addingTimeInterval(601)))
    }
}
