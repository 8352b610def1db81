import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgePayload
@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import Testing

/// Roles and scopes (#55), through the admin API and the console in process, against the real
/// stores: a reader cannot pull, an investigator scoped to one app sees neither another app's
/// devices nor its records, files or pulls, and every refusal is a typed 403, audited.
@Suite struct AccessControlTests {
    typealias Fixture = ConsoleRouteTests.Fixture

    /// Two devices holding u-1: an oven (oven-control 2.4.1, region=eu) and a screen
    /// (oven-ui 1.0, region=us); one pull of both, complete, with records of each indexed. The
    /// oven's store also holds one oven-ui record (its second context).
    struct Fleet {
        let oven: String
        let screen: String
        let pull: String

        init(_ fixture: Fixture) async throws {
            let a = fixture.admin
            oven = try await Self.agent(a, host: "kitchen-oven", app: "oven-control", version: "2.4.1", labels: ["region": "eu"])
            screen = try await Self.agent(a, host: "bakery-screen", app: "oven-ui", version: "1.0", labels: ["region": "us"])
            let new = try a.issuer.newPull(
                uid: "u-1", agentID: "", filter: LogFilter(uid: "u-1"), targets: [oven, screen], lifetime: .seconds(600), requestedBy: "admin", now: .now)
            try await a.pulls.create(new)
            pull = new.id
            let line = RecordIndexConformanceTests.line
            try await fixture.land(
                IndexedSource(kind: .pull, id: pull, agentID: oven), (0..<5).map { line($0, "oven record \($0)", "info", "app", "u-1", "{}", 1) } + [line(9, "ui on the oven", "info", "app", "u-1", "{}", 2)])
            try await fixture.land(IndexedSource(kind: .pull, id: pull, agentID: screen), (0..<3).map { line($0, "screen record \($0)", "error", "app", "u-1", "{}", 2) })
            for agent in [oven, screen] {
                let zip = try DataDirectory(a.data).pullZip(pull, agent: agent)
                try Data("zip of \(agent)".utf8).write(to: URL(fileURLWithPath: zip))
                #expect(try await a.pulls.update(pull, agent: agent, status: .complete, detail: "", at: Date()))
            }
        }

        static func agent(_ a: AdminRouteTests.Fixture, host: String, app: String, version: String, labels: [String: String]) async throws -> String {
            let key = try RSAPrivateKey.generate()
            let id = try await a.registry.enroll(
                publicKey: key.publicKey,
                host: .with {
                    $0.hostname = host
                    $0.app = app
                    $0.appVersion = version
                    $0.extra = labels
                })
            try await a.registry.heartbeat(id, .with { $0.activeUids = ["u-1"] })
            return id
        }
    }

    static func token(_ fixture: Fixture, _ name: String, _ role: AdminRole, scope: AccessScope = .everything, expiresAt: Date? = nil) async throws -> String {
        try await fixture.admin.tokens.create(name: name, kind: .admin, limits: TokenLimits(expiresAt: expiresAt, role: role, scope: scope), now: Date()).token
    }

    @Test func aReaderReadsButCannotPullAndEachRefusalSaysWhichRoleItNeeds() async throws {
        let fixture = Fixture()
        let fleet = try await Fleet(fixture)
        let reader = try await Self.token(fixture, "rita", .reader)
        let investigator = try await Self.token(fixture, "ivan", .investigator)
        try await fixture.test { browser in
            let rita = AdminRouteTests.Client(client: browser.client, token: reader)
            let me = try await rita.call(.get, "/v1/whoami").decode(CallerInfo.self)
            #expect(me == CallerInfo(name: "rita", role: .reader, scope: .everything, expiresAt: nil))
            #expect(try await rita.call(.get, "/v1/agents").decode([AgentRecord].self).count == 2)
            #expect(try await rita.call(.get, "/v1/pulls/\(fleet.pull)").status == .ok)
            #expect(try await rita.post("/v1/records/search", RecordSearch(uid: "u-1")).decode(RecordPage.self).records.count == 9)

            let pull = try await rita.post("/v1/pulls", PullRequest(uid: "u-1", agent: nil, filter: .all))
            #expect(pull.status == .forbidden && pull.code == "forbidden")
            #expect(try pull.decode(APIErrorBody.self).error.contains("needs the role investigator; rita is reader"))
            _ = try await rita.post("/v1/pulls", PullRequest(uid: "u-1", agent: nil, filter: .all))
            for (method, uri) in [
                (HTTPRequest.Method.get, "/v1/tokens"), (.get, "/v1/audit"), (.get, "/v1/audit/verify"), (.delete, "/v1/pulls/\(fleet.pull)?reason=x"),
                (.post, "/v1/agents/\(fleet.oven)/revoke"),
            ] {
                let refused = try await rita.call(method, uri, json: method == .post ? Data("{}".utf8) : nil)
                #expect(refused.status == .forbidden && refused.code == "forbidden", "\(method) \(uri)")
            }
            let ivan = AdminRouteTests.Client(client: browser.client, token: investigator)
            #expect(try await ivan.post("/v1/pulls", PullRequest(uid: "u-1", agent: nil, filter: .all)).status == .created)
            #expect(try await ivan.call(.get, "/v1/tokens").status == .forbidden)
            #expect(try await fixture.admin.pulls.pulls(limit: 10, now: .now).count == 2, "nothing was pulled by the reader")
            #expect(try await fixture.admin.tokens.list().filter { $0.kind == .admin }.map(\.name) == ["admin", "ivan", "rita"], "nothing changed")
        }
        // Audited once per caller and operation in ten minutes, saying what was asked.
        let denied = try await fixture.audit("access.denied")
        #expect(denied.filter { $0.detail.hasPrefix("POST /v1/pulls:") }.count == 1)
        #expect(denied.allSatisfy { ["rita", "ivan"].contains($0.actor) })
        #expect(denied.count == 6, "rita: pull, tokens, audit, removal, revocation; ivan: tokens")
    }

    @Test func anInvestigatorScopedToOneAppSeesNothingOfAnother() async throws {
        let fixture = Fixture()
        let fleet = try await Fleet(fixture)
        let scope = AccessScope(apps: [AppScope(name: "oven-control", versions: [.init(.atLeast, "2.0")])])
        let scoped = try await Self.token(fixture, "olga", .investigator, scope: scope)
        try await fixture.test { browser in
            let olga = AdminRouteTests.Client(client: browser.client, token: scoped)
            #expect(try await olga.call(.get, "/v1/whoami").decode(CallerInfo.self).scope == scope)
            #expect(try await olga.call(.get, "/v1/agents").decode([AgentRecord].self).map(\.agentID) == [fleet.oven])
            #expect(try await olga.call(.get, "/v1/agents?uid=u-1").decode([AgentRecord].self).map(\.agentID) == [fleet.oven])

            // The pull shows its in-scope target only; its files likewise; the whole zip is refused.
            let pull = try await olga.call(.get, "/v1/pulls/\(fleet.pull)").decode(PullRecord.self)
            #expect(pull.targets.map(\.agentID) == [fleet.oven])
            #expect(try await olga.call(.get, "/v1/pulls").decode([PullRecord].self).map { $0.targets.map(\.agentID) } == [[fleet.oven]])
            let files = try await olga.call(.get, "/v1/pulls/\(fleet.pull)/files").decode([PullFile].self)
            #expect(!files.isEmpty && files.allSatisfy { $0.agentID == fleet.oven })
            let screenFile = "/v1/pulls/\(fleet.pull)/files/\(fleet.screen)/\(PayloadLimits.manifestName)"
            #expect(try await olga.call(.get, screenFile).status == .notFound)
            #expect(try await olga.call(.get, "/v1/pulls/\(fleet.pull)/zip").status == .notFound, "no whole zip within the scope")
            let listed = try await olga.call(.get, "/v1/pulls?disk=true").decode([PullRecord].self)
            #expect(listed.allSatisfy { $0.diskBytes == nil }, "a pull's disk use counts other devices' files")

            // Records: the oven's oven-control records only, and counted so.
            let page = try await olga.post("/v1/records/search", RecordSearch(uid: "u-1")).decode(RecordPage.self)
            #expect(page.records.map(\.message).sorted() == (0..<5).map { "oven record \($0)" })
            #expect(page.indexing == 0)
            #expect(try await olga.post("/v1/records/stats", RecordSearch(uid: "u-1")).decode(RecordStats.self).total == 5)
            #expect(try await olga.post("/v1/records/search", RecordSearch(agents: [fleet.screen])).decode(RecordPage.self).records.isEmpty)
            #expect(try await olga.post("/v1/records/search", RecordSearch(apps: ["oven-ui"])).decode(RecordPage.self).records.isEmpty)
            let admin = AdminRouteTests.Client(client: browser.client, token: fixture.admin.created.adminToken)
            let all = try await admin.post("/v1/records/search", RecordSearch(uid: "u-1")).decode(RecordPage.self).records
            #expect(all.count == 9)
            let screenRecord = try #require(all.first { $0.agentID == fleet.screen })
            #expect(try await olga.call(.get, "/v1/records/\(screenRecord.id)").status == .notFound)
            let ovenRecord = try #require(all.first { $0.message == "oven record 2" })
            let inContext = try await olga.call(.get, "/v1/records/\(ovenRecord.id)?context=10").decode(RecordInContext.self)
            #expect((inContext.before + inContext.after).allSatisfy { $0.app == "oven-control" })
            let vocabulary = try await olga.call(.get, "/v1/records/vocabulary").decode(RecordVocabulary.self)
            #expect(vocabulary.hosts == ["kitchen-oven"] && vocabulary.apps == ["oven-control"])

            // A pull by uid reaches the scope's device only; one of the other device is no device.
            let made = try await olga.post("/v1/pulls", PullRequest(uid: "u-1", agent: nil, filter: .all))
            #expect(made.status == .created)
            let scopedPull = try made.decode(PullRecord.self)
            #expect(scopedPull.targets.map(\.agentID) == [fleet.oven])
            let other = try await olga.post("/v1/pulls", PullRequest(uid: "u-1", agent: fleet.screen, filter: .all))
            #expect(other.status == .notFound && other.code == "no_agent")
            // An agent that comes to hold the uid later joins the admin's pull by uid, not the scoped one.
            let late = try await Fleet.agent(fixture.admin, host: "late-oven", app: "oven-control", version: "3.0", labels: [:])
            #expect(try await fixture.admin.pulls.adopt(agent: late, uids: ["u-1"], now: .now) == [fleet.pull])
        }
    }

    /// Approvals (#55): a pull needs a reason, waits sent to no device, and goes out once an
    /// investigator or admin other than the requester approves it (through the API or the
    /// console's button); a reader cannot approve, nor can the requester, nor anyone twice.
    @Test func aPullWaitsForASecondPersonsApproval() async throws {
        let fixture = Fixture()
        let fleet = try await Fleet(fixture)
        let ivan = try await Self.token(fixture, "ivan", .investigator)
        let rita = try await Self.token(fixture, "rita", .reader)
        let olga = try await Self.token(fixture, "olga", .investigator, scope: AccessScope(apps: [AppScope(name: "oven-control")]))
        let bob = try await Self.token(fixture, "bob", .investigator)
        try await fixture.test(approvals: ApprovalSettings(required: true)) { browser in
            let asIvan = AdminRouteTests.Client(client: browser.client, token: ivan)
            let unexplained = try await asIvan.post("/v1/pulls", PullRequest(uid: "u-1", agent: nil, filter: .all))
            #expect(unexplained.status == .badRequest && unexplained.code == "reason_required")
            let made = try await asIvan.post("/v1/pulls", PullRequest(uid: "u-1", agent: nil, filter: .all, reason: "SUP-77"))
            #expect(made.status == .created)
            let pull = try made.decode(PullRecord.self)
            #expect(pull.isAwaitingApproval && pull.targets.count == 2)
            for agent in [fleet.oven, fleet.screen] {
                #expect(try await fixture.admin.pulls.deliverable(for: agent, includingUnanswered: true, now: .now).isEmpty, "sent to nobody yet")
            }
            let own = try await asIvan.call(.post, "/v1/pulls/\(pull.id)/approve", json: Data("{}".utf8))
            #expect(own.status == .forbidden && own.code == "own_request")
            let reader = try await AdminRouteTests.Client(client: browser.client, token: rita).call(.post, "/v1/pulls/\(pull.id)/approve", json: Data("{}".utf8))
            #expect(reader.status == .forbidden && reader.code == "forbidden")

            // A scoped investigator cannot let it reach devices beyond its scope (the screen).
            let asOlga = AdminRouteTests.Client(client: browser.client, token: olga)
            let beyond = try await asOlga.call(.post, "/v1/pulls/\(pull.id)/approve", json: Data("{}".utf8))
            #expect(beyond.status == .forbidden && beyond.code == "forbidden")
            // One of the oven alone, it may approve.
            let ovenOnly = try await asIvan.post("/v1/pulls", PullRequest(uid: "u-1", agent: fleet.oven, filter: .all, reason: "SUP-78")).decode(PullRecord.self)
            #expect(try await asOlga.call(.post, "/v1/pulls/\(ovenOnly.id)/approve", json: Data("{}".utf8)).status == .ok)

            // The console shows it waiting, and offers another person the button.
            _ = try await browser.signIn(bob)
            let page = try await browser.get("/console/pulls/\(pull.id)")
            #expect(page.body.contains("awaiting approval") && page.body.contains(#"action="/console/pulls/\#(pull.id)/approve""#))
            #expect(try await browser.get("/console/pulls").body.contains("awaiting approval"))
            let approved = try await browser.post("/console/pulls/\(pull.id)/approve", ["csrf": page.csrf ?? ""])
            #expect(approved.status == .seeOther)
            let after = try await browser.get("/console/pulls/\(pull.id)")
            #expect(after.body.contains("Approved</dt><dd>by bob") && !after.body.contains(#"/approve""#))
            #expect(try await fixture.admin.pulls.deliverable(for: fleet.screen, includingUnanswered: true, now: .now).map(\.id) == [pull.id], "sent once approved")
            #expect(Set(try await fixture.admin.pulls.deliverable(for: fleet.oven, includingUnanswered: true, now: .now).map(\.id)) == [pull.id, ovenOnly.id])
            let twice = try await AdminRouteTests.Client(client: browser.client, token: fixture.admin.created.adminToken).call(
                .post, "/v1/pulls/\(pull.id)/approve", json: Data("{}".utf8))
            #expect(twice.status == .conflict)
            #expect(try twice.decode(APIErrorBody.self).error.contains("approved already, by bob"))
        }
        let approvals = try await fixture.audit("pull.approve")
        #expect(Set(approvals.map(\.actor)) == ["olga", "bob"])
        #expect(approvals.contains { $0.actor == "bob" && $0.detail.contains("requested by ivan; reason \"SUP-77\"") })

        // One left unapproved past its expiry cannot be approved.
        var stale = try fixture.admin.issuer.newPull(
            uid: "u-1", agentID: "", filter: LogFilter(uid: "u-1"), targets: [fleet.oven], lifetime: .seconds(1), requestedBy: "ivan", now: Timestamp(Date().addingTimeInterval(-60)))
        stale.approvalRequired = true
        try await fixture.admin.pulls.create(stale)
        let staleID = stale.id
        try await fixture.test(approvals: ApprovalSettings(required: true)) { browser in
            let late = try await AdminRouteTests.Client(client: browser.client, token: fixture.admin.created.adminToken).call(
                .post, "/v1/pulls/\(staleID)/approve", json: Data("{}".utf8))
            #expect(late.status == .conflict)
            #expect(try late.decode(APIErrorBody.self).error.contains("expired unapproved"))
        }
    }

    /// A scope by label, and a version range: only devices whose labels hold every one, and
    /// whose app's version is within it.
    @Test func scopesMatchLabelsAndVersionRanges() {
        let eu = AccessScope(labels: ["region": "eu"])
        #expect(eu.admits(app: "a", version: "1", labels: ["region": "eu", "tier": "gold"]))
        #expect(!eu.admits(app: "a", version: "1", labels: ["region": "us"]))
        #expect(!eu.admits(app: "a", version: "1", labels: [:]))
        let range = try! #require(AppScope(parsing: "oven-control@>=2.1,<3"))
        #expect(range.versions == [.init(.atLeast, "2.1"), .init(.below, "3")])
        #expect(range.description == "oven-control@>=2.1,<3")
        for (version, admitted) in [("2.1", true), ("2.10.4", true), ("2.9", true), ("2.0.9", false), ("3", false), ("3.0.1", false), ("1.9", false)] {
            #expect(range.admits(app: "oven-control", version: version) == admitted, "\(version)")
        }
        #expect(!range.admits(app: "oven-ui", version: "2.5"))
        #expect(AppScope.compare("2.10", "2.9") == .orderedDescending && AppScope.compare("1.0", "1.0") == .orderedSame)
        for bad in ["", "@>=1", "a@~1", "a@>=", "a@>=1,"] { #expect(AppScope(parsing: bad) == nil, "\(bad)") }
        #expect(AccessScope(apps: [AppScope(name: "a\u{7}")]).problem != nil)
    }

    /// Tokens that expire are refused from then on, and a console session ends with its token.
    @Test func anExpiredTokenIsRefusedAndItsSessionsEnd() async throws {
        let fixture = Fixture()
        // Half an hour: the API checks expiry on the real clock, and a loaded machine must not
        // reach it during the test; the console's sessions read the injected clock, moved past it.
        let soon = fixture.clock.now().addingTimeInterval(1800)
        let temporary = try await Self.token(fixture, "temp", .reader, expiresAt: soon)
        let gone = try await Self.token(fixture, "gone", .reader, expiresAt: Date().addingTimeInterval(-1))
        try await fixture.test { browser in
            let api = AdminRouteTests.Client(client: browser.client, token: gone)
            #expect(try await api.call(.get, "/v1/whoami").status == .unauthorized)
            let temp = AdminRouteTests.Client(client: browser.client, token: temporary)
            #expect(try await temp.call(.get, "/v1/whoami").decode(CallerInfo.self).expiresAt == soon.rounded)
            _ = try await browser.signIn(temporary)
            #expect(try await browser.get("/console/agents").status == .ok)
            fixture.clock.advance(1801)  // within the session's own hour: the token's end ends it
            #expect(try await browser.get("/console/agents").location?.hasPrefix("/console/sign-in") == true, "the session ended with its token")
        }
        #expect(try await fixture.admin.tokens.admin(for: gone, now: Date()) == nil)
    }

    /// The console asks the same table: a reader is refused the new-pull page and the tokens
    /// page (403 pages, audited), its menu offers neither, and a scoped investigator's pages
    /// list only its devices and records.
    @Test func theConsoleChecksTheSameRolesAndScopes() async throws {
        let fixture = Fixture()
        let fleet = try await Fleet(fixture)
        let reader = try await Self.token(fixture, "rita", .reader)
        let scoped = try await Self.token(fixture, "olga", .investigator, scope: AccessScope(labels: ["region": "eu"]))
        try await fixture.test { browser in
            _ = try await browser.signIn(reader)
            let agents = try await browser.get("/console/agents")
            #expect(agents.status == .ok && agents.body.contains("bakery-screen"))
            #expect(!agents.body.contains(#"href="/console/tokens""#) && !agents.body.contains(#"href="/console/audit""#))
            for page in ["/console/pulls/new", "/console/tokens", "/console/audit", "/console/pulls/\(fleet.pull)/remove", "/console/agents/\(fleet.oven)/revoke"] {
                let refused = try await browser.get(page)
                #expect(refused.status == .forbidden && refused.body.contains("rita is reader"), "\(page)")
            }
            let csrf = try #require(agents.csrf)
            let post = try await browser.post("/console/pulls", ["uid": "u-1", "range": "2d", "csrf": csrf])
            #expect(post.status == .forbidden)
            #expect(!(try await browser.get("/console/pulls").body.contains(#"href="/console/pulls/new""#)))
        }
        try await fixture.test { browser in
            _ = try await browser.signIn(scoped)
            let agents = try await browser.get("/console/agents")
            #expect(agents.body.contains("kitchen-oven") && !agents.body.contains("bakery-screen"))
            #expect(try await browser.get("/console/agents/\(fleet.screen)").status == .notFound)
            let logs = try await browser.get("/console/logs?uid=u-1")
            #expect(logs.status == .ok && logs.body.contains("oven record 1") && !logs.body.contains("screen record"))
            #expect(logs.body.contains("<strong>6 records match.</strong>"), "the oven's six, the ui record on it included: the scope is by label")
            #expect(try await browser.get("/console/pulls/new").status == .ok)
        }
        #expect(try await fixture.audit("access.denied").filter { $0.actor == "rita" }.count == 5)
    }
}

extension Date {
    /// To the second, as tokens keep their expiry.
    fileprivate var rounded: Date { Date(timeIntervalSince1970: timeIntervalSince1970.rounded(.down)) }
}
