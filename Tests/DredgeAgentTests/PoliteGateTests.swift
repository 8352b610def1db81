@testable import DredgeAgentCore
import DredgeCommandLine
import DredgeDomain
import Foundation
import Testing

/// The pure core of polite uploads (#54) on times the test gives: what holds an upload
/// (a metered or unreported network, the day's budget, a policy that cannot be read), the
/// cap's slots, urgent traffic, and the day turning.
@Suite struct PoliteGateTests {
    static let noon = Timestamp(microseconds: 1_795_348_800_000_000)  // 2026-11-21 12:00:00 UTC
    static func at(_ seconds: Int64) -> Timestamp { Timestamp(microseconds: noon.microseconds + seconds * 1_000_000) }

    func gate(_ policy: UploadPolicy, network: NetworkCost = .unmetered, spent: UInt64 = 0) -> PoliteGate {
        var gate = PoliteGate(usage: DailyUsage(day: DailyUsage.day(of: Self.noon), bytes: spent))
        gate.policy = policy
        gate.network = network
        return gate
    }

    @Test func noPolicyGovernsNothing() {
        var g = gate(UploadPolicy(), network: .metered, spent: 1 << 40)
        #expect(!g.governs(urgent: false))
        #expect(g.hold(bytes: 1 << 20, urgent: false, now: Self.noon) == nil)
        #expect(g.reserve(bytes: 1 << 20, urgent: false, monotonic: 7) == 7)
    }

    @Test func anUnmeteredOnlyPolicyWaitsOnAMeteredOrUnreportedNetwork() {
        let policy = UploadPolicy(unmeteredOnly: true)
        #expect(gate(policy, network: .metered).hold(bytes: 0, urgent: false, now: Self.noon) == .network(.metered))
        #expect(gate(policy, network: .unknown).hold(bytes: 0, urgent: false, now: Self.noon) == .network(.unknown))
        #expect(gate(policy, network: .unmetered).hold(bytes: 1 << 20, urgent: false, now: Self.noon) == nil)
        // Urgent traffic goes when the policy lets it by, and waits when it does not.
        #expect(gate(policy, network: .metered).hold(bytes: 0, urgent: true, now: Self.noon) == nil)
        var strict = policy
        strict.urgentBypass = false
        #expect(gate(strict, network: .metered).hold(bytes: 0, urgent: true, now: Self.noon) == .network(.metered))
    }

    @Test func theDaysBudgetHoldsUntilTheNextUTCDay() {
        let budget = UploadPolicy.minDailyBytes
        var g = gate(UploadPolicy(dailyBytes: budget), spent: budget - 1000)
        #expect(g.hold(bytes: 1000, urgent: false, now: Self.noon) == nil)
        let midnight = Timestamp(microseconds: (DailyUsage.day(of: Self.noon) + 1) * 86_400_000_000)
        #expect(g.hold(bytes: 1001, urgent: false, now: Self.noon) == .dailyBudget(spent: budget - 1000, budget: budget, resumesAt: midnight))
        g.spent(1000, now: Self.noon)
        #expect(g.hold(bytes: 0, urgent: false, now: Self.noon) == .dailyBudget(spent: budget, budget: budget, resumesAt: midnight))
        // A second before midnight it still holds; at midnight the day is new and empty.
        let lastSecond = Timestamp(microseconds: midnight.microseconds - 1_000_000)
        #expect(g.hold(bytes: 1, urgent: false, now: lastSecond) != nil)
        #expect(g.hold(bytes: 1 << 20, urgent: false, now: midnight) == nil)
        #expect(g.spentToday(now: midnight) == 0)
        g.spent(500, now: midnight)
        #expect(g.usage == DailyUsage(day: DailyUsage.day(of: midnight), bytes: 500))
        // Urgent bytes count toward the day, although they bypass it.
        var u = gate(UploadPolicy(dailyBytes: budget), spent: 0)
        #expect(u.hold(bytes: budget * 2, urgent: true, now: Self.noon) == nil)
        u.spent(budget * 2, now: Self.noon)
        #expect(u.hold(bytes: 1, urgent: false, now: Self.noon) != nil)
    }

    @Test func theCapGivesEachFrameItsOwnSlotWithoutBurst() {
        var g = gate(UploadPolicy(maxBytesPerSecond: 100_000))
        // Idle: the first frame waits for its own bytes, not more and not less.
        #expect(g.reserve(bytes: 50_000, urgent: false, monotonic: 10) == 10.5)
        // Queued behind it: one after the other, whatever the clock says meanwhile.
        #expect(g.reserve(bytes: 100_000, urgent: false, monotonic: 10.1) == 11.5)
        #expect(g.reserve(bytes: 25_000, urgent: false, monotonic: 11.5) == 11.75)
        // Back late by less than a slot (the last frame took time to seal and send): this one
        // starts where the last ended, so the delays do not add up below the cap.
        #expect(g.reserve(bytes: 100_000, urgent: false, monotonic: 12.25) == 12.75)
        #expect(g.reserve(bytes: 100_000, urgent: false, monotonic: 12.75) == 13.75)
        // After an idle minute nothing is saved up: no burst.
        #expect(g.reserve(bytes: 100_000, urgent: false, monotonic: 70) == 71)
        // 1,000 frames of 10 kB reserve exactly 100 s.
        var h = gate(UploadPolicy(maxBytesPerSecond: 100_000))
        var last = 0.0
        for _ in 0..<1000 { last = h.reserve(bytes: 10_000, urgent: false, monotonic: 0) }
        #expect(abs(last - 100) < 1e-6)
        // Urgent frames under a bypassing policy take no slot.
        #expect(g.reserve(bytes: 1 << 20, urgent: true, monotonic: 80) == 80)
    }

    @Test func aPolicyThatCannotBeReadHoldsGovernedUploads() {
        var g = gate(UploadPolicy())
        g.policy = nil
        g.policyProblem = "not JSON"
        #expect(g.governs(urgent: true))
        #expect(g.hold(bytes: 0, urgent: true, now: Self.noon) == .unreadablePolicy("not JSON"))
    }

    @Test func policyFilesAreCheckedAndRoundTrip() throws {
        let dir = NSTemporaryDirectory() + "polite-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        #expect(try UploadPolicy.load(stateDirectory: dir) == UploadPolicy())
        #expect(try NetworkCost.load(stateDirectory: dir) == .unknown)
        let policy = UploadPolicy(unmeteredOnly: true, maxBytesPerSecond: 65_536, dailyBytes: 50_000_000, urgentBypass: false)
        try policy.save(stateDirectory: dir)
        #expect(try UploadPolicy.load(stateDirectory: dir) == policy)
        // Refused before anything is written: the policy in force stays.
        #expect(throws: AgentError.self) { try UploadPolicy(maxBytesPerSecond: 10).save(stateDirectory: dir) }
        #expect(throws: AgentError.self) { try UploadPolicy(dailyBytes: 1000).save(stateDirectory: dir) }
        #expect(try UploadPolicy.load(stateDirectory: dir) == policy)
        // A file written by hand that is not a valid policy is an error, never the default.
        try Data(#"{"maxBytesPerSecond": 5}"#.utf8).write(to: URL(fileURLWithPath: dir + "/upload-policy.json"))
        #expect(throws: AgentError.self) { try UploadPolicy.load(stateDirectory: dir) }
        try Data("{".utf8).write(to: URL(fileURLWithPath: dir + "/upload-policy.json"))
        #expect(throws: AgentError.self) { try UploadPolicy.load(stateDirectory: dir) }
        // Unrestricted removes the file.
        try UploadPolicy().save(stateDirectory: dir)
        #expect(!FileManager.default.fileExists(atPath: dir + "/upload-policy.json"))
        try NetworkCost.metered.save(stateDirectory: dir)
        #expect(try NetworkCost.load(stateDirectory: dir) == .metered)
        try Data(#"{"network": "cheap"}"#.utf8).write(to: URL(fileURLWithPath: dir + "/network.json"))
        #expect(throws: AgentError.self) { try NetworkCost.load(stateDirectory: dir) }
    }

    @Test func byteCountsAsPeopleWriteThem() {
        #expect(ByteCount.parse("65536") == 65_536)
        #expect(ByteCount.parse("64KiB") == 65_536)
        #expect(ByteCount.parse("64k") == 64_000)
        #expect(ByteCount.parse("1.5MB") == 1_500_000)
        #expect(ByteCount.parse("2GiB") == 2_147_483_648)
        #expect(ByteCount.parse(" 10 MB".replacingOccurrences(of: " ", with: "")) == 10_000_000)
        for bad in ["", "MB", "1.5", "-1", "1e6", "12XB", "1..2k", "ten"] { #expect(ByteCount.parse(bad) == nil, "\(bad)") }
    }
}
