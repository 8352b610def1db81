import DredgeDomain
import DredgeStore
import DredgeTestSupport
import Foundation
import Testing

/// The writer holds back a trickle of records briefly to write them in fewer transactions; a
/// flush, a full enough batch or the end of the linger writes them.
@Suite struct WriteLingerTests {
    func open(_ dir: TempDir, linger: Duration, below: Int) throws -> (LogStore, ContextID) {
        var configuration = StoreConfiguration()
        configuration.writeLinger = linger
        configuration.lingerBelow = below
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: configuration)
        return (store, try store.register(.current(app: "test")))
    }

    func entry(_ i: Int, _ context: ContextID) -> LogEntry {
        LogEntry(level: .info, type: .network, uid: "u", message: "request \(i)", context: context)
    }

    /// Polls (without asserting any duration) until `condition` holds or `attempts` run out.
    func eventually(_ attempts: Int = 400, _ condition: () throws -> Bool) rethrows -> Bool {
        for _ in 0..<attempts {
            if try condition() { return true }
            usleep(25_000)
        }
        return try condition()
    }

    /// The blocking `flush()` (an async context would pick the async one).
    func blockingFlush(_ store: LogStore) throws { try store.flush() }

    @Test func aFlushDoesNotWaitForTheLinger() async throws {
        let dir = TempDir()
        // An hour-long linger: only the flush can get the record written in this test.
        let (store, context) = try open(dir, linger: .seconds(3600), below: 1000)
        defer { try? store.close() }
        usleep(100_000)  // let the writer go to sleep, so the record wakes it into the linger
        store.enqueue(entry(0, context))
        usleep(100_000)
        try blockingFlush(store)
        #expect(try store.count(matching: .all) == 1)
        store.enqueue(entry(1, context))
        try await store.flush()
        #expect(try store.count(matching: .all) == 2)
    }

    @Test func aTrickleIsWrittenAfterTheLingerAndABatchAtOnce() throws {
        let dir = TempDir()
        let (store, context) = try open(dir, linger: .milliseconds(50), below: 1000)
        for i in 0..<3 { store.enqueue(entry(i, context)) }
        #expect(try eventually { try store.count(matching: .all) == 3 }, "written without a flush once the linger ended")
        try store.close()

        let dir2 = TempDir()
        let (held, context2) = try open(dir2, linger: .seconds(3600), below: 8)
        defer { try? held.close() }
        usleep(100_000)
        for i in 0..<8 { held.enqueue(entry(i, context2)) }
        #expect(try eventually { try held.count(matching: .all) == 8 }, "a batch of `lingerBelow` records is written at once")
    }
}
