import DredgeAdminAPI
import DredgeDomain
@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Logging
import Testing

/// The actions the admin API and the console share (#52), tested once, with no HTTP: what an
/// engineer may do, how a refusal is typed, and what the audit log keeps. Each surface's own
/// tests check only that it shows these.
@Suite struct AdminActionsTests {
    struct Fixture {
        let base: AdminRouteTests.Fixture
        let actions: AdminActions
        /// The actions' wall clock, which only the test moves.
        let clock = ConsoleRouteTests.Clock()

        init(records: Bool = true) throws {
            base = try AdminRouteTests.Fixture()
            let logger = Logger(label: "test.actions") { _ in SwiftLogNoOpLogHandler() }
            let index = records ? try ServerStores(try LoadedDeployment(directory: base.data)).records : nil
            actions = AdminActions(
                AdminServices(
                    registry: base.registry, pulls: base.pulls, audit: base.pulls, issuer: base.issuer, feedback: base.feedback, tokens: base.tokens,
                    dispatcher: PullDispatcher(pulls: base.pulls, logger: logger), records: index, results: base.results, logger: logger),
                now: { [clock] in clock.now() })
        }

        func audit(_ action: AuditAction) async throws -> [AuditEntry] {
            try await base.pulls.audit(AuditQuery(action: action.rawValue)).filter { $0.action == action.rawValue }
        }
    }

    func refusal(_ body: () async throws -> Void) async -> ActionError? {
        do {
            try await body()
            return nil
        } catch let error as ActionError {
            return error
        } catch {
            Issue.record("not an ActionError: \(error)")
            return nil
        }
    }

    @Test func aPullIsCheckedMadeAndAudited() async throws {
        let f = try Fixture()
        let agent = try await f.base.agent(uids: ["u-1"])
        let none = await refusal { _ = try await f.actions.createPull(PullRequest(uid: nil, agent: nil, filter: .all), by: .admin("alice"), via: "test") }
        #expect(none?.kind == .invalid && none?.code == "bad_request")
        let unknown = await refusal {
            _ = try await f.actions.createPull(PullRequest(uid: nil, agent: String(repeating: "a", count: 32), filter: .all), by: .admin("alice"), via: "test")
        }
        #expect(unknown?.kind == .notFound && unknown?.code == "no_agent")
        let badUID = await refusal { _ = try await f.actions.createPull(PullRequest(uid: "u\u{0}1", agent: nil, filter: .all), by: .admin("alice"), via: "test") }
        #expect(badUID?.kind == .invalid)
        #expect(try await f.audit(.pull).isEmpty, "a refused pull is not made, nor audited")

        let filter = LogFilter(since: Timestamp(microseconds: 1_763_700_000_000_000), levels: [.error, .warning], text: "time out")
        let pull = try await f.actions.createPull(PullRequest(uid: "u-1", agent: nil, filter: filter, reason: "TICKET-7"), by: .admin("alice"), via: "test")
        #expect(pull.targets.map(\.agentID) == [agent] && pull.requestedBy == "alice")
        let entries = try await f.audit(.pull)
        // A sentence: whom, the filter in the CLI's words (times in UTC), the devices, the reason (#50).
        #expect(entries.count == 1 && entries[0].actor == "alice", "\(entries)")
        #expect(
            entries.first?.detail
                == "pull \(pull.id) of uid u-1 on any device holding it, since 2025-11-21T04:40:00.000000Z, levels warning,error, containing \"time out\"; queued for 1 device(s): \(agent); reason \"TICKET-7\"")
    }

    @Test func tokensAreMadeAndRevokedWithTypedRefusalsAndAudited() async throws {
        let f = try Fixture()
        _ = try await f.actions.createToken(TokenRequest(name: "bob", kind: .admin), by: .admin("alice"))
        #expect(await refusal { _ = try await f.actions.createToken(TokenRequest(name: "bob", kind: .admin), by: .admin("alice")) }?.kind == .conflict)
        #expect(await refusal { _ = try await f.actions.createToken(TokenRequest(name: "no spaces", kind: .admin), by: .admin("alice")) }?.kind == .invalid)
        #expect(await refusal { try await f.actions.revokeToken(name: "nobody", kind: .admin, by: .admin("alice")) }?.kind == .notFound)
        try await f.actions.revokeToken(name: "bob", kind: .admin, by: .admin("alice"))
        // The deployment's own admin token is now the last one.
        let last = try #require(try await f.base.tokens.list().first { $0.kind == .admin }?.name)
        #expect(await refusal { try await f.actions.revokeToken(name: last, kind: .admin, by: .admin("alice")) }?.kind == .conflict)
        #expect(try await f.audit(.tokenCreate).map(\.detail) == ["admin token 'bob', role admin"])
        #expect(try await f.audit(.tokenRevoke).map(\.detail) == ["admin token 'bob'"])
    }

    /// One throttle for every surface: the same search by the same actor is one entry in ten
    /// minutes, whichever surface ran it; another actor or filter is another entry.
    @Test func searchesAreCheckedAndAuditedOnceForEverySurface() async throws {
        let f = try Fixture()
        for bad in [
            RecordSearch(uid: "u-1", text: "a\u{1B}b"), RecordSearch(pull: "not-an-id"), RecordSearch(hosts: (0..<65).map { "h\($0)" }),
            RecordSearch(since: Timestamp(microseconds: 10), until: Timestamp(microseconds: 5)), RecordSearch(uid: "u\u{0}1"),
        ] {
            #expect(await refusal { _ = try await f.actions.search(bad, by: .admin("alice")) }?.kind == .invalid, "\(bad)")
        }
        #expect(try await f.audit(.recordsSearch).isEmpty)
        _ = try await f.actions.search(RecordSearch(uid: "u-1"), by: .admin("alice"))  // the API
        try await f.actions.searchOpened(RecordSearch(uid: "u-1"), by: .admin("alice"))  // the console's follow
        _ = try await f.actions.search(RecordSearch(uid: "u-1"), by: .admin("carol"))
        _ = try await f.actions.search(RecordSearch(uid: "u-2"), by: .admin("alice"))
        #expect(try await f.audit(.recordsSearch).map { "\($0.actor) \($0.detail)" }.sorted() == ["alice uid=u-1", "alice uid=u-2", "carol uid=u-1"])
        #expect(try await f.actions.record(123, context: 5, by: .admin("alice")) == nil)
        #expect(await refusal { _ = try await f.actions.record(1, context: 999, by: .admin("alice")) }?.kind == .invalid)
    }

    @Test func whatAServerDoesNotRunIsUnavailable() async throws {
        let f = try Fixture(records: false)
        #expect(await refusal { _ = try await f.actions.search(RecordSearch(uid: "u-1"), by: .admin("alice")) }?.kind == .unavailable)
        #expect(await refusal { _ = try await f.actions.remove(.pull, "nope", by: .admin("alice"), reason: "") }?.kind == .invalid)
        #expect(await refusal { _ = try await f.actions.remove(.pull, String(repeating: "b", count: 32), by: .admin("alice"), reason: "") }?.kind == .notFound)
        #expect(await refusal { _ = try await f.actions.remove(.feedback, String(repeating: "b", count: 32), by: .admin("alice"), reason: "a\u{7}") }?.kind == .invalid)
    }

    /// Refused tokens from one host are one entry a minute, on the API and the console alike.
    @Test func refusedTokensAreAuditedOncePerHostAndMinute() async throws {
        let f = try Fixture()
        await f.actions.refusedToken("no bearer token", for: "GET \"/v1/pulls\"", from: "10.0.0.1:5000")
        await f.actions.refusedToken("a token that is not an admin token", for: "the console's sign-in", from: "10.0.0.1:5001")
        await f.actions.refusedToken("no bearer token", for: "GET \"/v1/pulls\"", from: "10.0.0.2:5000")
        let entries = try await f.audit(.authFailed)
        #expect(entries.count == 2 && entries.allSatisfy { $0.actor == "-" })
        #expect(Set(entries.map { $0.detail.components(separatedBy: " from ").last ?? "" }) == ["10.0.0.1:5000", "10.0.0.2:5000"])
        // The minute over, the host's next refusal is recorded and says how many were not.
        f.clock.advance(59)
        await f.actions.refusedToken("no bearer token", for: "GET \"/v1/pulls\"", from: "10.0.0.1:5002")
        #expect(try await f.audit(.authFailed).count == 2)
        f.clock.advance(2)
        await f.actions.refusedToken("no bearer token", for: "GET \"/v1/pulls\"", from: "10.0.0.1:5003")
        let later = try await f.audit(.authFailed).map(\.detail).filter { $0.contains("10.0.0.1:5003") }
        #expect(later == ["no bearer token for GET \"/v1/pulls\" from 10.0.0.1:5003 (and 2 more from that host not recorded)"])
    }

    /// Reads pass through the actions too (the place a rule on who may read what will live):
    /// the same refusals on both surfaces.
    @Test func readsAreCheckedOnce() async throws {
        let f = try Fixture()
        #expect(await refusal { _ = try await f.actions.pull("nope", disk: false, for: .admin("alice")) }?.kind == .invalid)
        #expect(await refusal { _ = try await f.actions.pull(String(repeating: "c", count: 32), disk: true, for: .admin("alice")) }?.kind == .notFound)
        #expect(await refusal { _ = try await f.actions.feedback(String(repeating: "c", count: 32), disk: false, for: .admin("alice")) }?.kind == .notFound)
        #expect(await refusal { _ = try await f.actions.agents(holding: "u\u{0}1", for: .admin("alice")) }?.kind == .invalid)
        #expect(try await f.actions.agents(holding: "nobody", for: .admin("alice")).isEmpty)
        #expect(try await f.actions.pulls(limit: -5, disk: true, for: .admin("alice")).isEmpty)
        #expect(try await f.actions.feedback(limit: 1_000_000, disk: false, for: .admin("alice")).isEmpty)
        _ = try await f.actions.createToken(TokenRequest(name: "zed", kind: .enrollment), by: .admin("alice"))
        _ = try await f.actions.createToken(TokenRequest(name: "bob", kind: .admin), by: .admin("alice"))
        let tokens = try await f.actions.tokens().map { "\($0.kind.rawValue) \($0.name)" }
        #expect(tokens == tokens.sorted() && tokens.contains("admin bob") && tokens.contains("enrollment zed"))
    }

    /// A download is one entry per engineer and subject (a device's files of a pull, its whole
    /// zip, a feedback) in ten minutes, naming the file it began with: fetching a device's files
    /// is not one entry per file (#50).
    @Test func downloadsAreOneEntryPerPullAndEngineer() async throws {
        let f = try Fixture()
        func download(_ subject: String, _ file: String) -> AdminActions.Download {
            AdminActions.Download(
                located: PullFiles.Located(path: "/nowhere", file: PullFile(agentID: "a", name: file, kind: .day, size: 1, sha256: "")),
                action: subject.hasPrefix("pull") ? .pullDownload : .feedbackDownload, detail: "\(subject) file \(file)", subject: subject)
        }
        for file in ["1.jsonl", "2.jsonl", "manifest.json"] { try await f.actions.downloading(download("pull P", file), by: .admin("alice")) }
        try await f.actions.downloading(download("pull P", "2.jsonl"), by: .admin("bob"))
        try await f.actions.downloading(download("pull P agent B", "1.jsonl"), by: .admin("alice"))  // another device's files
        try await f.actions.downloading(download("pull Q", "1.jsonl"), by: .admin("alice"))
        try await f.actions.downloading(download("feedback F", "1.jsonl"), by: .admin("alice"))
        #expect(try await f.audit(.pullDownload).map { "\($0.actor) \($0.detail)" }.sorted() == ["alice pull P agent B file 1.jsonl", "alice pull P file 1.jsonl", "alice pull Q file 1.jsonl", "bob pull P file 2.jsonl"])
        #expect(try await f.audit(.feedbackDownload).count == 1)
        f.clock.advance(601)
        try await f.actions.downloading(download("pull P", "2.jsonl"), by: .admin("alice"))
        #expect(try await f.audit(.pullDownload).count == 5)
    }

    @Test func theAuditLogsActionsAreOneList() {
        #expect(AuditAction.filters == ["pull", "pull.approve", "pull.download", "pull.remove", "tail", "tail.stop", "tail.download", "tail.remove", "trigger", "trigger.disable", "trigger.remove", "capture.download", "capture.remove", "feedback.download", "feedback.remove", "records.search", "records.read", "console", "token", "agent.revoke", "auth.failed", "access.denied"])
    }
}
