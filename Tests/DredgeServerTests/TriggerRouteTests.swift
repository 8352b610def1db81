import DredgeAdminAPI
import DredgeDomain
import DredgeTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import Testing
@testable import DredgeServer

/// `/v1/triggers` (#54), in process through `HummingbirdTesting` against the real stores: a
/// trigger defined, listed, read, disabled and removed; every term checked with a clear 400;
/// who may do what; and the audit log it leaves.
@Suite struct TriggerRouteTests {
    struct Fixture {
        let dir = TempDir()
        let created: ServerDeployment.Created
        let stores: ServerStores

        init() throws {
            let data = dir.file("server")
            created = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
            stores = try ServerStores(try LoadedDeployment(directory: data))
        }

        func token(_ name: String, _ role: AdminRole, scope: AccessScope = .everything) async throws -> String {
            try await stores.tokens.create(name: name, kind: .admin, limits: TokenLimits(role: role, scope: scope), now: Date()).token
        }

        func test(approvals: ApprovalSettings = ApprovalSettings(), _ body: @Sendable (AdminRouteTests.Client) async throws -> Void) async throws {
            let logger = Logger(label: "test.triggers") { _ in SwiftLogNoOpLogHandler() }
            let services = AdminServices(
                registry: stores.registry, pulls: stores.pulls, audit: stores.pulls, issuer: stores.issuer, feedback: stores.feedback, tokens: stores.tokens,
                triggers: stores.triggers, dispatcher: PullDispatcher(pulls: stores.pulls, logger: logger), approvals: approvals, logger: logger)
            let app = try AdminAPI.application(actions: AdminActions(services), port: 0)
            let token = created.adminToken
            try await app.test(.router) { client in try await body(AdminRouteTests.Client(client: client, token: token)) }
        }
    }

    static let declined = TriggerRequest(
        name: "payment declined", match: TriggerMatch(levels: ["err", "critical"], types: ["business"], text: "payment declined"), uid: "u-1", app: "shop",
        minAppVersion: "2.0", labels: ["region": "eu"], beforeSeconds: 600, afterSeconds: 30, perDevicePerDay: 2, perDay: 50, durationSeconds: 3_600, reason: "T-1")

    @Test func aTriggerIsDefinedListedReadDisabledAndRemoved() async throws {
        let fixture = try Fixture()
        try await fixture.test { api in
            let made = try await api.post("/v1/triggers", Self.declined)
            #expect(made.status == .created)
            let trigger = try made.decode(TriggerRecord.self)
            let d = trigger.definition
            #expect(d.name == "payment declined" && d.match?.levels == ["error", "critical"], "level names are read (err is error)")
            #expect(d.match?.types == ["business"] && d.match?.text == "payment declined" && d.uid == "u-1" && d.app == "shop" && d.minAppVersion == "2.0")
            #expect(d.labels == ["region": "eu"] && d.beforeSeconds == 600 && d.afterSeconds == 30 && d.perDevicePerDay == 2 && d.perDay == 50 && !d.crash)
            #expect(trigger.createdBy == "admin" && trigger.reason == "T-1" && trigger.isInForce(at: .now))
            #expect(abs(trigger.expiresAt.date.timeIntervalSince(trigger.createdAt) - 3_600) < 1)

            // A match with no condition is no match: with crash, a crash-only trigger; without, nothing fires it.
            let empty = try await api.post("/v1/triggers", TriggerRequest(name: "everything", match: TriggerMatch(levels: [], text: "")))
            #expect(empty.status == .badRequest)
            #expect(try empty.decode(APIErrorBody.self).error.contains("nothing fires it"))
            let defaults = try await api.post("/v1/triggers", TriggerRequest(name: "crashes", match: TriggerMatch(), crash: true)).decode(TriggerRecord.self)
            #expect(defaults.definition.match == nil && defaults.definition.crash)
            #expect(defaults.definition.beforeSeconds == 300 && defaults.definition.afterSeconds == 60 && defaults.definition.perDevicePerDay == 3 && defaults.definition.perDay == 100)
            #expect(abs(defaults.expiresAt.date.timeIntervalSince(defaults.createdAt) - 7 * 86_400) < 1)

            #expect(try await api.call(.get, "/v1/triggers").decode([TriggerRecord].self).map(\.id) == [defaults.id, trigger.id])
            #expect(try await api.call(.get, "/v1/triggers/\(trigger.id)").decode(TriggerRecord.self) == trigger)
            #expect(try await api.call(.get, "/v1/triggers/\(String(repeating: "0", count: 32))").status == .notFound)
            #expect(try await api.call(.get, "/v1/triggers/nope").status == .badRequest)

            let disabled = try await api.call(.post, "/v1/triggers/\(trigger.id)/disable?reason=noisy")
            #expect(disabled.status == .ok)
            #expect(try disabled.decode(TriggerRecord.self).disabled?.reason == "noisy")
            let twice = try await api.call(.post, "/v1/triggers/\(trigger.id)/disable")
            #expect(twice.status == .conflict && twice.code == "disabled")
            #expect(try await fixture.stores.triggers.inForce(now: .now).triggers.map(\.id) == [defaults.id])

            let removed = try await api.call(.delete, "/v1/triggers/\(defaults.id)?reason=done")
            #expect(removed.status == .ok)
            #expect(try removed.decode(TriggerRecord.self).removed?.by == "admin")
            #expect(try await api.call(.delete, "/v1/triggers/\(defaults.id)").status == .conflict)
            #expect(try await api.call(.get, "/v1/triggers").decode([TriggerRecord].self).map(\.id) == [trigger.id], "a removed trigger is not listed")
            #expect(try await fixture.stores.triggers.inForce(now: .now) == TriggersInForce(version: 4, triggers: []))

            let audit = try await fixture.stores.pulls.audit(limit: 20).map(\.action).filter { $0.hasPrefix("trigger") }
            #expect(audit.sorted() == ["trigger", "trigger", "trigger.disable", "trigger.remove"])
        }
    }

    /// Every term a device would refuse, and every server bound, is a 400 that says which;
    /// nothing is stored.
    @Test func eachBadTermIsAClearErrorAndNothingIsStored() async throws {
        let fixture = try Fixture()
        func with(_ change: (inout TriggerRequest) -> Void) -> TriggerRequest {
            var r = Self.declined
            change(&r)
            return r
        }
        let cases: [(TriggerRequest, String)] = [
            (with { $0.name = "" }, "a name is 1 to"),
            (with { $0.name = String(repeating: "n", count: 300) }, "a name is 1 to"),
            (with { $0.match = nil }, "nothing fires it"),
            (with { $0.match?.levels = ["loud"] }, "unknown level"),
            (with { $0.match?.types = ["Not A Type"] }, "is not a type name"),
            (with { $0.match?.metadataValue = "503" }, "needs the member's name"),
            (with { $0.uid = String(repeating: "u", count: 300) }, "uid"),
            (with { $0.minAppVersion = "3"; $0.maxAppVersion = "2.9" }, "the lowest app version is above the highest"),
            (with { $0.beforeSeconds = 3_601 }, "the window before a match"),
            (with { $0.afterSeconds = -1 }, "the window after a match"),
            (with { $0.perDevicePerDay = 0 }, "captures a day from one device are 1 to 100"),
            (with { $0.perDay = 100_001 }, "captures a day, from all devices"),
            (with { $0.durationSeconds = 59 }, "a trigger lasts from a minute"),
            (with { $0.durationSeconds = 91 * 86_400 }, "a trigger lasts from a minute"),
            (with { $0.labels = ["": "x"] }, "label"),
            (with { $0.reason = String(repeating: "r", count: 5_000) }, "reason"),
        ]
        try await fixture.test { api in
            for (request, says) in cases {
                let answer = try await api.post("/v1/triggers", request)
                let message = (try? answer.decode(APIErrorBody.self))?.error ?? ""
                #expect(answer.status == .badRequest, "\(says): \(answer.status)")
                #expect(message.contains(says), "\(says): \(message)")
            }
            #expect(try await api.call(.post, "/v1/triggers", json: Data("{\"name\": 7}".utf8)).status == .badRequest)
            #expect(try await api.call(.get, "/v1/triggers").decode([TriggerRecord].self).isEmpty)
            #expect(try await fixture.stores.triggers.inForce(now: .now).version == 0)
        }
    }

    /// A reader reads and defines nothing; an investigator defines, and disables its own only;
    /// a scoped investigator sees its own triggers, which reach only its scope; an admin ends any.
    @Test func whoMayDefineAndEndATrigger() async throws {
        let fixture = try Fixture()
        let reader = try await fixture.token("rita", .reader)
        let ivan = try await fixture.token("ivan", .investigator)
        let sara = try await fixture.token("sara", .investigator, scope: AccessScope(labels: ["region": "eu"]))
        try await fixture.test { api in
            let rita = AdminRouteTests.Client(client: api.client, token: reader)
            let refused = try await rita.post("/v1/triggers", Self.declined)
            #expect(refused.status == .forbidden && refused.code == "forbidden")
            let mine = try await AdminRouteTests.Client(client: api.client, token: ivan).post("/v1/triggers", Self.declined).decode(TriggerRecord.self)
            #expect(mine.createdBy == "ivan" && mine.makerScope.isEverything)
            #expect(try await rita.call(.get, "/v1/triggers").decode([TriggerRecord].self).map(\.id) == [mine.id], "a reader reads them")
            #expect(try await rita.call(.post, "/v1/triggers/\(mine.id)/disable").status == .forbidden)

            let scoped = AdminRouteTests.Client(client: api.client, token: sara)
            let hers = try await scoped.post("/v1/triggers", Self.declined).decode(TriggerRecord.self)
            #expect(hers.makerScope == AccessScope(labels: ["region": "eu"]))
            #expect(try await scoped.call(.get, "/v1/triggers").decode([TriggerRecord].self).map(\.id) == [hers.id], "a scoped caller sees its own")
            #expect(try await scoped.call(.get, "/v1/triggers?limit=1").decode([TriggerRecord].self).map(\.id) == [hers.id], "its own, before the limit")
            #expect(try await scoped.call(.get, "/v1/triggers/\(mine.id)").status == .notFound)
            let notHers = try await AdminRouteTests.Client(client: api.client, token: ivan).call(.post, "/v1/triggers/\(hers.id)/disable")
            #expect(notHers.status == .forbidden && notHers.code == "forbidden")
            #expect(try await api.call(.delete, "/v1/triggers/\(hers.id)").status == .ok, "an admin removes any")
        }
        let denied = try await fixture.stores.pulls.audit(AuditQuery(action: "access.denied"))
        #expect(denied.contains { $0.actor == "rita" && $0.detail.contains("define a trigger") })
    }

    @Test func underRequiredApprovalsATriggerIsRefused() async throws {
        let fixture = try Fixture()
        try await fixture.test(approvals: ApprovalSettings(required: true)) { api in
            let answer = try await api.post("/v1/triggers", Self.declined)
            #expect(answer.status == .forbidden && answer.code == "approval_required")
        }
    }

    /// A device holds at most MAX_TRIGGERS_PER_SET: the server keeps no more in force.
    @Test func atMostASetsWorthIsInForce() async throws {
        let fixture = try Fixture()
        try await fixture.test { api in
            for i in 0..<AdminActions.maxTriggersInForce {
                #expect(try await api.post("/v1/triggers", TriggerRequest(name: "t\(i)", crash: true)).status == .created)
            }
            let over = try await api.post("/v1/triggers", TriggerRequest(name: "one more", crash: true))
            #expect(over.status == .conflict && over.code == "too_many_triggers")
            let first = try #require(try await api.call(.get, "/v1/triggers?limit=1000").decode([TriggerRecord].self).last)
            #expect(try await api.call(.post, "/v1/triggers/\(first.id)/disable").status == .ok)
            #expect(try await api.post("/v1/triggers", TriggerRequest(name: "one more", crash: true)).status == .created)
        }
    }
}
