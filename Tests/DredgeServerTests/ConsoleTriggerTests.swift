import DredgeAdminAPI
import DredgeDomain
import DredgeTestSupport
import Foundation
import Testing
@testable import DredgeServer

/// The console's trigger pages (#54) over HTTP against the in-process server: a trigger defined
/// from the form (refused without its CSRF token, the form again with what is wrong), listed,
/// shown, disabled and removed, as `dredge triggers` does.
@Suite struct ConsoleTriggerTests {
    typealias Browser = ConsoleLiveTailTests.Browser

    @Test func aTriggerIsDefinedShownDisabledAndRemovedFromTheConsole() async throws {
        try await withStopping(InProcessServer()) { server in
            let browser = Browser(server.adminURL)
            do {
                try await browser.signIn(server.created.adminToken)
                let list = try await browser.send("/console/triggers")
                #expect(list.status == 200 && list.body.contains("No trigger yet.") && list.body.contains(#"href="/console/triggers/new""#))
                let form = try await browser.send("/console/triggers/new")
                #expect(form.status == 200 && form.body.contains(#"name="before" value="300""#))
                let fields = [
                    "name": "payment declined", "level": "error+", "type": "business", "text": "payment declined", "where": "code=51", "labels": "region=eu",
                    "before": "600", "after": "30", "perDevice": "2", "perDay": "40", "days": "3", "reason": "SUP-9",
                ]
                // Without the form's CSRF token: refused, nothing defined.
                #expect(try await browser.send("/console/triggers", method: .POST, form: fields).status == 403)
                #expect(try await server.admin.triggers().isEmpty)
                // Bad fields: the form again, saying what is wrong, with what was typed.
                let bad = try await browser.send("/console/triggers", method: .POST, form: fields.merging(["before": "7200", "csrf": form.csrf ?? ""]) { $1 })
                #expect(bad.status == 400 && bad.body.contains("The window before a match (seconds) is 0 to 3600."), "\(bad.status) \(bad.body.components(separatedBy: "problem").dropFirst().first?.prefix(200) ?? "")")
                #expect(bad.status == 400 && bad.body.contains(#"value="payment declined""#))
                let nothing = try await browser.send("/console/triggers", method: .POST, form: ["name": "x", "csrf": form.csrf ?? ""])
                #expect(nothing.status == 400 && nothing.body.contains("Say what fires it"), "\(nothing.body.components(separatedBy: "problem").dropFirst().first?.prefix(200) ?? "")")
                #expect(try await server.admin.triggers().isEmpty)

                let made = try await browser.send("/console/triggers", method: .POST, form: fields.merging(["csrf": form.csrf ?? ""]) { $1 })
                let id = try #require(made.location.map { String($0.dropFirst("/console/triggers/".count)) })
                #expect(made.status == 303)
                let trigger = try await server.admin.trigger(id)
                let d = trigger.definition
                #expect(d.match == TriggerMatch(levels: ["error", "critical"], types: ["business"], text: "payment declined", metadataKey: "code", metadataValue: "51"))
                #expect(d.labels == ["region": "eu"] && d.beforeSeconds == 600 && d.afterSeconds == 30 && d.perDevicePerDay == 2 && d.perDay == 40 && !d.crash)
                #expect(trigger.reason == "SUP-9" && abs(trigger.expiresAt.date.timeIntervalSince(trigger.createdAt) - 3 * 86_400) < 1)

                let page = try await browser.send("/console/triggers/\(id)")
                #expect(page.status == 200 && page.body.contains("level=error,critical type=business text~&quot;payment declined&quot; code=51"), "\(page.body)")
                #expect(page.body.contains("region=eu") && page.body.contains("600 s before to 30 s after") && page.body.contains(">Disable</button>"))
                #expect(try await browser.send("/console/triggers").body.contains(#"<a href="/console/triggers/\#(id)">payment declined</a>"#))

                #expect(try await browser.send("/console/triggers/\(id)/disable", method: .POST, form: ["reason": "noisy"]).status == 403, "no CSRF token")
                let disabled = try await browser.send("/console/triggers/\(id)/disable", method: .POST, form: ["reason": "noisy", "csrf": page.csrf ?? ""])
                #expect(disabled.status == 303 && disabled.location == "/console/triggers/\(id)")
                let after = try await browser.send("/console/triggers/\(id)")
                #expect(after.body.contains("Disabled") && after.body.contains("noisy") && !after.body.contains(">Disable</button>"))
                let removed = try await browser.send("/console/triggers/\(id)/remove", method: .POST, form: ["csrf": page.csrf ?? ""])
                #expect(removed.status == 303 && removed.location == "/console/triggers")
                #expect(try await browser.send("/console/triggers").body.contains("No trigger yet."))
                let audit = try await server.pulls.audit(limit: 20).filter { $0.action.hasPrefix("trigger") }
                #expect(Set(audit.map(\.action)) == ["trigger", "trigger.disable", "trigger.remove"])
                #expect(server.logs.records.contains { $0.message == "trigger defined" && $0.metadata["via"] == "console" })
            } catch {
                try await browser.shutdown()
                throw error
            }
            try await browser.shutdown()
        }
    }
}
