import DredgeTestSupport
import Foundation
import Logging
import Synchronization
import Testing
@testable import DredgeServer

/// Which agents the dispatcher holds connections of, and who it wakes.
@Suite struct PullDispatcherTests {
    @Test func anAgentIsConnectedWhileOneOfItsConnectionsIsRegistered() throws {
        let dir = TempDir()
        let dispatcher = PullDispatcher(pulls: SQLitePullQueue(try ServerDatabase(directory: dir.path)), logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() })
        let wakes = Mutex(0)
        #expect(!dispatcher.isConnected("a"))
        let first = dispatcher.register("a") { _ in wakes.withLock { $0 += 1 } }
        let second = dispatcher.register("a") { _ in wakes.withLock { $0 += 1 } }  // a replacing connection, the old one still closing
        #expect(dispatcher.isConnected("a") && !dispatcher.isConnected("b"))
        dispatcher.wake(["a", "b"])
        #expect(wakes.withLock { $0 } == 4, "once each at registration, once each by the wake")
        dispatcher.unregister("a", token: first)
        #expect(dispatcher.isConnected("a"))
        dispatcher.unregister("a", token: second)
        #expect(!dispatcher.isConnected("a"))
    }

    /// A revocation whose notification a node missed is found by its sweep: of the agents
    /// connected there, the revoked ones are handed to whoever ends their connections; an agent
    /// not connected there is not asked about.
    @Test func theSweepFindsRevocationsANotificationMissed() async throws {
        let dir = TempDir()
        let asked = Mutex<[[String]]>([])
        let dispatcher = PullDispatcher(
            pulls: SQLitePullQueue(try ServerDatabase(directory: dir.path)), sweepInterval: .milliseconds(20), logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() },
            revokedAmong: { ids in
                asked.withLock { $0.append(ids.sorted()) }
                return ids.filter { $0 == "b" }
            })
        _ = dispatcher.register("a") { _ in }
        _ = dispatcher.register("b") { _ in }
        let (ended, endedOne) = AsyncStream.makeStream(of: String.self)
        dispatcher.whenRevoked { endedOne.yield($0) }
        let running = Task { try await dispatcher.run() }
        defer { running.cancel() }
        var iterator = ended.makeAsyncIterator()
        #expect(await iterator.next() == "b")
        #expect(asked.withLock { $0.first } == ["a", "b"])
    }
}
