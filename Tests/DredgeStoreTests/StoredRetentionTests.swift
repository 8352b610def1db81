@testable import DredgeStore
import DredgeDomain
import Foundation
import GRDB
import Testing

/// #50 defect 1: the store's retention belongs to whoever configured the store and is kept in
/// it. An agent, a second process or a restart applies what the store records, never a
/// stricter default of its own; a change is recorded and reported.
@Suite struct StoredRetentionTests {
    static let now = Timestamp(rfc3339: "2026-11-21T12:00:00Z")!
    static let day: Int64 = 86_400_000_000

    /// The app: it keeps 7 days (set explicitly, so recorded in the store).
    func app(days: Int64? = 7) -> StoreConfiguration {
        var config = StoreConfiguration()
        if let days { config.retention.maxAge = .seconds(days * 86_400) }
        config.now = { Self.now }
        return config
    }

    /// The agent: a follower with the built-in defaults (3 days).
    func agent() -> StoreConfiguration {
        var config = StoreConfiguration()
        config.retentionRole = .follower
        config.now = { Self.now }
        return config
    }

    /// A store the app filled with one record a day for the last 6 days (5.5 days old and newer).
    func appStore(_ path: String, days: Int64? = 7) throws {
        let store = try LogStore(path: path, configuration: app(days: days))
        let ctx = try store.register(testContext)
        for i in 0..<6 { store.enqueue(entry(absolute: Self.now.microseconds - Int64(i) * Self.day - Self.day / 2, message: "\(i)", context: ctx)) }
        try store.close()
    }

    @Test func anAgentWithItsDefaultsKeepsTheAppsLongerPolicy() throws {
        let dir = TempDir()
        let path = dir.file("app.sqlite")
        try appStore(path)
        let store = try LogStore(path: path, configuration: agent())
        let report = try store.runRetention()
        #expect(report.deletedByAge == 0 && report.policy?.maxAge == .seconds(7 * 86_400))
        #expect(try store.records(matching: .all).count == 6)
        #expect(try store.losses().isEmpty)
        let stats = try store.statistics()
        #expect(stats.retention?.policy.maxAge == .seconds(7 * 86_400) && stats.retention?.previous == nil)
        #expect(store.replacedRetention == nil)
        try store.close()
    }

    @Test func aSecondProcessOfTheAppWithDefaultsDoesNotChangeIt() throws {
        let dir = TempDir()
        let path = dir.file("app.sqlite")
        try appStore(path)
        let store = try LogStore(path: path, configuration: app(days: nil))  // the owner, policy not set
        #expect(try store.runRetention().deletedByAge == 0)
        #expect(try store.statistics().retention?.policy.maxAge == .seconds(7 * 86_400))
        try store.close()
    }

    /// A store made before policies were recorded: an agent keeps everything and says so; the
    /// app's next open records its policy.
    @Test func aStoreThatRecordsNoPolicyLosesNothingToAnAgent() throws {
        let dir = TempDir()
        let path = dir.file("old.sqlite")
        try appStore(path)
        let pool = try DatabasePool(path: path)
        try pool.write { db in try db.execute(sql: "DELETE FROM meta WHERE key = 'retention'") }
        try pool.close()

        let store = try LogStore(path: path, configuration: agent())
        #expect(store.retentionAtOpen == nil)
        let report = try store.runRetention()
        #expect(report.policy == nil && report.deletedByAge == 0 && report.deletedBySize == 0)
        #expect(try store.records(matching: .all).count == 6 && store.statistics().retention == nil)
        try store.close()

        // The app (defaults, not set) records its policy: the built-in 3 days.
        let owned = try LogStore(path: path, configuration: app(days: nil))
        #expect(owned.retentionAtOpen?.policy == RetentionPolicy())
        _ = try owned.runRetention()  // (its writer's first pass may have run already)
        #expect(try owned.records(matching: .all).count == 3)
        try owned.close()
    }

    /// A store an agent creates (host logs it ingests) gets the default policy.
    @Test func aStoreAnAgentCreatesGetsTheDefault() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("host.sqlite"), configuration: agent())
        #expect(store.retentionAtOpen?.policy == RetentionPolicy())
        try store.close()
    }

    /// The app changes its policy: recorded with the one it replaced, reported, and applied by
    /// an agent that has the store open from its next pass.
    @Test func theAppChangingItsPolicyIsRecordedAndReachesAnOpenAgent() throws {
        let dir = TempDir()
        let path = dir.file("app.sqlite")
        try appStore(path, days: 2)
        let agentStore = try LogStore(path: path, configuration: agent())
        _ = try agentStore.runRetention()
        #expect(try agentStore.records(matching: .all).count == 2)

        // The app now keeps a day only: the running agent applies it at its next pass.
        let appStore = try LogStore(path: path, configuration: app(days: 1))
        #expect(appStore.replacedRetention?.maxAge == .seconds(2 * 86_400))
        let recorded = try #require(try agentStore.statistics().retention)
        #expect(recorded.policy.maxAge == .seconds(86_400) && recorded.previous?.maxAge == .seconds(2 * 86_400))
        #expect(recorded.setBy.hasSuffix("[\(ProcessInfo.processInfo.processIdentifier)]"))
        try appStore.close()
        let report = try agentStore.runRetention()
        #expect(report.policy?.maxAge == .seconds(86_400))
        #expect(try agentStore.records(matching: .all).map(\.message) == ["0"])
        try agentStore.close()
    }

    /// A policy that does not read back is an error, never taken as none or as a default.
    @Test func aDamagedPolicyIsAnErrorAndDeletesNothing() throws {
        let dir = TempDir()
        let path = dir.file("app.sqlite")
        try appStore(path)
        let pool = try DatabasePool(path: path)
        try pool.write { db in try db.execute(sql: "UPDATE meta SET value = ? WHERE key = 'retention'", arguments: [Data("{\"maxAgeMicroseconds\":-1}".utf8)]) }
        try pool.close()
        #expect(throws: StoreError.self) { _ = try LogStore(path: path, configuration: agent()) }
        var readOnly = agent()
        readOnly.readOnly = true
        #expect(throws: StoreError.self) { _ = try LogStore(path: path, configuration: readOnly) }
        // The app setting its policy again repairs it.
        let store = try LogStore(path: path, configuration: app())
        #expect(try store.records(matching: .all).count == 6)
        try store.close()
    }
}
