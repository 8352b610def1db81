@testable import DredgeStore
import DredgeDomain
import DredgeSamples
import Foundation
import GRDB
import Testing

@Suite struct RetentionTests {
    static let now = Timestamp(rfc3339: "2026-11-21T12:00:00Z")!

    func configuration(maxAge: Duration = .seconds(3 * 86_400), maxBytes: Int64 = 200_000_000) -> StoreConfiguration {
        var config = StoreConfiguration()
        config.retention = RetentionPolicy(maxAge: maxAge, maxBytes: maxBytes)
        config.now = { RetentionTests.now }
        return config
    }

    @Test func deletesRecordsOlderThanMaxAgeAndRecordsTheLoss() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: configuration(maxAge: .seconds(86_400)))
        let ctx = try store.register(testContext)
        let day: Int64 = 86_400_000_000
        let oldest = Self.now.microseconds - 3 * day
        for i in 0..<300 { store.enqueue(entry(absolute: oldest + Int64(i) * day / 100, message: "\(i)", context: ctx)) }
        try store.flush()

        let report = try store.runRetention()
        // Records at or after now - 1 day stay: i >= 200.
        #expect(report.deletedByAge == 200)
        let remaining = try store.records(matching: .all)
        #expect(remaining.first?.message == "200")
        #expect(remaining.count == 100)
        let losses = try store.losses()
        #expect(losses.count == 1)
        #expect(losses[0].reason == .retentionAge)
        #expect(losses[0].count == 200)
        #expect(losses[0].first.microseconds == oldest)
        #expect(losses[0].last.microseconds == oldest + 199 * day / 100)
        // An export of the last two days can say that logs before a point were removed.
        #expect(try store.losses(since: Timestamp(microseconds: Self.now.microseconds - 2 * day)).count == 1)
        #expect(try store.losses(since: Timestamp(microseconds: Self.now.microseconds - day / 2)).isEmpty)
    }

    @Test func runsAtOpenBeforeAnyWrite() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        do {
            let store = try LogStore(path: path, configuration: configuration(maxAge: .seconds(100 * 86_400)))
            let ctx = try store.register(testContext)
            for i in 0..<50 { store.enqueue(entry(absolute: Self.now.microseconds - Int64(10 - i / 5) * 86_400_000_000, context: ctx)) }
            try store.close()
        }
        let store = try LogStore(path: path, configuration: configuration(maxAge: .seconds(3 * 86_400)))
        try store.flush()  // the writer ran retention first; flush waits for it
        let stats = try store.statistics()
        // 10 to 1 days old, five records a day; older than 3 days means 4 to 10 days old.
        #expect(stats.lastRetention?.deletedByAge == 35)
        #expect(stats.recordCount == 15)
    }

    @Test func keepsTheStoreUnderItsSizeLimitOldestFirstAndTheFileShrinks() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        let unlimited = configuration(maxAge: .seconds(365 * 86_400))
        let ctx: ContextID
        do {
            let store = try LogStore(path: path, configuration: unlimited)
            ctx = try store.register(testContext)
            let samples = SampleLogs(count: 40_000, uids: ["a", "b"], from: Self.now.subtracting(.seconds(86_400)), to: Self.now, context: ctx)
            for e in samples { store.enqueue(e) }
            try store.close()
        }
        let before = Retention.fileSize(path) + Retention.fileSize(path + "-wal")
        #expect(before > 8_000_000)
        let limit: Int64 = 4_000_000
        let store = try LogStore(path: path, configuration: configuration(maxAge: .seconds(365 * 86_400), maxBytes: limit))
        try store.flush()
        let report = try #require(try store.statistics().lastRetention)
        let after = Retention.fileSize(path) + Retention.fileSize(path + "-wal")
        #expect(after <= limit, "store is \(after) bytes")
        #expect(after < before / 2)
        #expect(report.deletedBySize > 20_000)
        #expect(report.bytesAfter <= limit)
        // What is left is the newest records, contiguous up to the last one.
        let remaining = try store.records(matching: .all)
        let newestDeleted = try #require(store.losses().filter { $0.reason == .retentionSize }.map(\.last).max())
        #expect(remaining.allSatisfy { $0.timestamp >= newestDeleted })
        #expect(Int64(remaining.count) + report.deletedBySize == 40_000)
        let lossCount = try store.losses().filter { $0.reason == .retentionSize }.reduce(0) { $0 + $1.count }
        #expect(lossCount == report.deletedBySize)
    }

    @Test func sizeIsCheckedWhileWritingNotOnlyOnATimer() throws {
        let dir = TempDir()
        var config = configuration(maxAge: .seconds(365 * 86_400), maxBytes: 2_000_000)
        config.sizeCheckEveryBatches = 1
        config.maxBatchSize = 500
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
        let ctx = try store.register(testContext)
        for e in SampleLogs(count: 30_000, uids: ["a"], from: Self.now.subtracting(.seconds(3_600)), to: Self.now, context: ctx) {
            store.enqueue(e)
        }
        try store.flush()
        let stats = try store.statistics()
        #expect(stats.bytesOnDisk <= 2_000_000 + 500_000, "at most one transaction over the limit")
        #expect(try store.losses().contains { $0.reason == .retentionSize })
        #expect(stats.recordCount < 30_000)
    }
}
