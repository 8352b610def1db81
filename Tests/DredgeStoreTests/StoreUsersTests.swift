@testable import DredgeStore
import DredgeDomain
import Foundation
import Testing

/// What the agent reports of its store: every user, whatever the age of their records, and the
/// context of the newest record.
@Suite struct StoreUsersTests {
    @Test func everyUserIsListedWithTheirNewestRecordMostRecentFirst() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let run = try store.register(testContext)
        #expect(try store.users().isEmpty)
        #expect(try store.newestContext() == nil)
        let day: Int64 = 86_400_000_000
        store.enqueue(entry(absolute: testEpoch - 2 * day, uid: "u-old", context: run))
        store.enqueue(entry(absolute: testEpoch - 3 * day, uid: "u-old", context: run))
        store.enqueue(entry(absolute: testEpoch, uid: "u-b", context: run))
        store.enqueue(entry(absolute: testEpoch, uid: "u-a", context: run))
        store.enqueue(entry(absolute: testEpoch + 10, uid: "", context: run))
        let later = try store.register(LogContext(host: "till-7", os: "Linux", app: "checkout", appVersion: "3.2.1", process: "p", extra: ["lane": "4"]))
        store.enqueue(entry(absolute: testEpoch - day, uid: "u-mid", context: later))
        try store.flush()
        let users = try store.users()
        #expect(users.map(\.uid) == ["u-a", "u-b", "u-mid", "u-old"], "newest first, ties by uid, no empty uid")
        #expect(users.map(\.lastSeen.microseconds) == [testEpoch, testEpoch, testEpoch - day, testEpoch - 2 * day])
        // Only active within the last day: u-old and u-mid are not, and still listed above.
        #expect(try store.activeUIDs(since: Timestamp(microseconds: testEpoch - 1)) == ["u-a", "u-b"])
        // The newest record (by time) is the anonymous one of the first context.
        #expect(try store.newestContext() == testContext)
        store.enqueue(entry(absolute: testEpoch + 20, uid: "u-a", context: later))
        try store.flush()
        #expect(try store.newestContext()?.extra == ["lane": "4"])
    }
}
