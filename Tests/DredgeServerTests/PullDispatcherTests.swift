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
}
