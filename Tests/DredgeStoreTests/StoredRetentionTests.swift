@testable import DredgeStore
import DredgeDomain
import Foundation
import GRDB
import Synchronization
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
        #expect(stats.retention.stored?.policy.maxAge == .seconds(7 * 86_400) && stats.retention.stored?.previous == nil)
        #expect(store.replacedRetention == nil)
        try store.close()
    }

    @Test func aSecondProcessOfTheAppWithDefaultsDoesNotChangeIt() throws {
        let dir = TempDir()
        let path = dir.file("app.sqlite")
        try appStore(path)
        let store = try LogStore(path: path, configuration: app(days: nil))  // the owner, policy not set
        #expect(try store.runRetention().deletedByAge == 0)
        #expect(try store.statistics().retention.stored?.policy.maxAge == .seconds(7 * 86_400))
        try store.close()
    }

    /// A store made before policies were recorded: an agent deletes nothing by age (it holds
    /// the store under its size only) and says so; the app's next open records its policy.
    @Test func aStoreThatRecordsNoPolicyLosesNothingToAnAgent() throws {
        let dir = TempDir()
        let path = dir.file("old.sqlite")
        try appStore(path)
        let pool = try DatabasePool(path: path)
        try pool.write { db in try db.execute(sql: "DELETE FROM meta WHERE key = 'retention'") }
        try pool.close()

        let store = try LogStore(path: path, configuration: agent())
        #expect(store.retentionAtOpen == .none)
        let report = try store.runRetention()
        #expect(report.policy == nil && report.maxBytes == RetentionPolicy().maxBytes && report.deletedByAge == 0 && report.deletedBySize == 0)
        #expect(try store.records(matching: .all).count == 6 && store.statistics().retention == .none)
        try store.close()

        // The app (defaults, not set) records its policy: the built-in 3 days.
        let owned = try LogStore(path: path, configuration: app(days: nil))
        #expect(owned.retentionAtOpen.stored?.policy == RetentionPolicy())
        _ = try owned.runRetention()  // (its writer's first pass may have run already)
        #expect(try owned.records(matching: .all).count == 3)
        try owned.close()
    }

    /// A store an agent creates (host logs it ingests) gets the default policy.
    @Test func aStoreAnAgentCreatesGetsTheDefault() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("host.sqlite"), configuration: agent())
        #expect(store.retentionAtOpen.stored?.policy == RetentionPolicy())
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
        let recorded = try #require(try agentStore.statistics().retention.stored)
        #expect(recorded.policy.maxAge == .seconds(86_400) && recorded.previous?.maxAge == .seconds(2 * 86_400))
        #expect(recorded.setBy.hasSuffix("[\(ProcessInfo.processInfo.processIdentifier)]"))
        try appStore.close()
        let report = try agentStore.runRetention()
        #expect(report.policy?.maxAge == .seconds(86_400))
        #expect(try agentStore.records(matching: .all).map(\.message) == ["0"])
        try agentStore.close()
    }

    /// A policy that does not read back (damaged, or written by a newer library) is never taken
    /// as a policy or a default: an agent still opens the store, deletes nothing by age and
    /// says why; its app records its policy over it.
    @Test func aPolicyThatDoesNotReadBackDeletesNothingByAgeAndTheAppReplacesIt() throws {
        let dir = TempDir()
        let path = dir.file("app.sqlite")
        try appStore(path)
        let pool = try DatabasePool(path: path)
        try pool.write { db in try db.execute(sql: "UPDATE meta SET value = ? WHERE key = 'retention'", arguments: [Data("{\"maxAgeMicroseconds\":-1}".utf8)]) }
        try pool.close()
        let store = try LogStore(path: path, configuration: agent())
        guard case .unreadable(let why) = store.retentionAtOpen else { Issue.record("\(store.retentionAtOpen)"); return }
        #expect(why.contains("does not read back"))
        #expect(try store.runRetention().deletedByAge == 0)
        #expect(try store.records(matching: .all).count == 6)
        try store.close()
        var readOnly = agent()
        readOnly.readOnly = true
        #expect(try LogStore(path: path, configuration: readOnly).statistics().retention == store.retentionAtOpen)
        let owned = try LogStore(path: path, configuration: app())
        #expect(owned.retentionAtOpen.stored?.policy.maxAge == .seconds(7 * 86_400))
        try owned.close()
    }

    /// The app and its agent run passes at the same time: each chunk is decided in the
    /// transaction that deletes it, so between them they delete exactly what the policy allows
    /// (two passes that each counted the expired records first deleted live ones too).
    @Test func passesRunAtOnceByTwoProcessesDeleteOnlyWhatThePolicyAllows() throws {
        let dir = TempDir()
        let path = dir.file("app.sqlite")
        var config = app(days: 2)
        config.retentionInterval = .seconds(3600)
        let appStore = try LogStore(path: path, configuration: config)
        let ctx = try appStore.register(testContext)
        // 4,000 records over the last 4 days: those older than 2 days (half) expire.
        for i in 0..<4_000 { appStore.enqueue(entry(absolute: Self.now.microseconds - Int64(i) * Self.day / 1_000 - 1, message: "\(i)", context: ctx)) }
        try appStore.flush()
        var follower = agent()
        follower.retentionInterval = .seconds(3600)
        let agentStore = try LogStore(path: path, configuration: follower)
        let stores = [appStore, agentStore, appStore, agentStore]
        let errors = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: stores.count) { i in
            var retention = Retention(path: path, safeguardBytes: 1 << 40)
            retention.chunkSize = 100
            do { _ = try retention.run(pool: stores[i].pool, now: Self.now) } catch { errors.withLock { $0.append("\(error)") } }
        }
        #expect(errors.withLock { $0 }.isEmpty)
        #expect(try appStore.records(matching: .all).count == 2_000)
        #expect(try appStore.losses().reduce(0) { $0 + $1.count } == 2_000)
        try agentStore.close()
        try appStore.close()
    }
}
