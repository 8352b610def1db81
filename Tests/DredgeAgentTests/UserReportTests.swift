@testable import DredgeAgentCore
import DredgeDomain
import DredgeWire
import Foundation
import Testing

/// The agent's user report (Protocol § Heartbeats): hours, bounds, and sent only when it changes.
@Suite struct UserReportTests {
    @Test func theReportHoldsValidUidsByTheHourWithinTheLimit() {
        let hour: Int64 = 3_600_000_000
        var users: [(uid: String, lastSeen: Timestamp)] = [("u-1", Timestamp(microseconds: 5 * hour + 59)), ("u\u{0}bad", Timestamp(microseconds: 4 * hour))]
        users += (0..<WireLimits.maxReportedUsers).map { ("u-more-\($0)", Timestamp(microseconds: 3 * hour + 1)) }
        let report = AgentClient.userReport(users)
        #expect(report.users.count == WireLimits.maxReportedUsers && report.truncated)
        #expect(report.users.first?.uid == "u-1" && report.users.first?.lastSeenUs == 5 * hour, "truncated to the hour")
        #expect(!report.users.contains { $0.uid.contains("\u{0}") })
        let small = AgentClient.userReport([("u-1", Timestamp(microseconds: hour))])
        #expect(small.users.count == 1 && !small.truncated)
    }

    @Test func aConnectionSendsTheReportOnlyWhenItChanges() {
        var reports = UserReportDeduplication()
        let first = AgentClient.userReport([("u-1", Timestamp(microseconds: 0))])
        #expect(reports.toSend(first) == first, "the first heartbeat of a connection carries the report")
        reports.sent(first)
        #expect(reports.toSend(first) == nil, "the same report again: left out")
        #expect(reports.toSend(nil) == nil, "a store that cannot be read: left out")
        let changed = AgentClient.userReport([("u-1", Timestamp(microseconds: 3_600_000_000))])
        #expect(reports.toSend(changed) == changed)
        reports.sent(changed)
        #expect(reports.toSend(changed) == nil)
        // A new connection starts again: its first heartbeat carries the report.
        #expect(UserReportDeduplication().toSend(changed) == changed)
    }
}
