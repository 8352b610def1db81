import DredgeDomain
import DredgeLogging
import DredgeStore
import DredgeTestSupport
import Foundation
import Logging
import Testing

/// A live tail's verbosity window (Protocol § 20): the agent writes it into the store, the apps
/// sharing the store read it, and while it is open one user's records below the apps' levels
/// are kept too; other users' are not, and when it closes or ends everything is as before.
@Suite struct VerbosityWindowTests {
    @Test func theStoreKeepsWindowsByOwnerUntilTheyEnd() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let now = Timestamp.now
        #expect(try store.verbosityWindows(at: now).isEmpty)
        try store.openVerbosityWindow(VerbosityWindow(uid: "u-1", until: now.adding(.seconds(60)), owner: "t1"), now: now)
        try store.openVerbosityWindow(VerbosityWindow(uid: "u-2", types: [.player], until: now.adding(.seconds(30)), owner: "t2"), now: now)
        // Opened again by its owner: replaced.
        try store.openVerbosityWindow(VerbosityWindow(uid: "u-1", until: now.adding(.seconds(90)), owner: "t1"), now: now)
        #expect(try store.verbosityWindows(at: now).map(\.owner).sorted() == ["t1", "t2"])
        #expect(try store.verbosityWindows(at: now).first { $0.owner == "t1" }?.until == now.adding(.seconds(90)))
        // Ended ones are not open, whatever the store still holds.
        #expect(try store.verbosityWindows(at: now.adding(.seconds(45))).map(\.owner) == ["t1"])
        try store.closeVerbosityWindow(owner: "t1", now: now)
        #expect(try store.verbosityWindows(at: now).map(\.owner) == ["t2"])
        // Another process of the same store sees what this one wrote.
        let other = try LogStore(path: dir.file("logs.sqlite"))
        #expect(try other.verbosityWindows(at: now).map(\.uid) == ["u-2"])
        // A window for no valid uid is refused, and nothing changes.
        #expect(throws: StoreError.self) { try store.openVerbosityWindow(VerbosityWindow(uid: "", until: now.adding(.seconds(60)), owner: "t3"), now: now) }
        #expect(try store.verbosityWindows(at: now).map(\.owner) == ["t2"])
        let window = VerbosityWindow(uid: "u-2", types: [.player], until: now.adding(.seconds(30)), owner: "t2")
        #expect(window.admits(uid: "u-2", type: .player, at: now) && !window.admits(uid: "u-2", type: .network, at: now))
        #expect(!window.admits(uid: "u-1", type: .player, at: now) && !window.admits(uid: "u-2", type: .player, at: now.adding(.seconds(30))))
    }

    @Test func aWindowKeepsOneUsersRecordsBelowTheLoggersLevel() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: .current(app: "tests"))
        center.setUser("u-1")
        let log = center.logger(type: .player, minimumLevel: .info)
        log.debug("before the window")
        // The agent (another store handle on the same file) opens a window for u-1.
        let agent = try LogStore(path: dir.file("logs.sqlite"))
        try agent.openVerbosityWindow(VerbosityWindow(uid: "u-1", until: Timestamp.now.adding(.seconds(600)), owner: "tail-1"))
        center.refreshVerbosity()
        log.debug("in the window")
        log.log(.debug, "another user's", uid: "u-2")
        center.logger(type: .network, minimumLevel: .info).trace("trace too")
        // swift-log: the handler lets debug through for u-1 only.
        var handler = center.logHandler(label: "app")
        handler.logLevel = .info
        let swiftLog = Logger(label: "app") { _ in handler }
        swiftLog.debug("swift-log in the window")
        swiftLog.debug("swift-log, another user's", metadata: ["dredge.uid": "u-2"])
        try agent.closeVerbosityWindow(owner: "tail-1")
        center.refreshVerbosity()
        log.debug("after the window")
        swiftLog.debug("swift-log after the window")
        #expect(handler.logLevel == .info)
        try center.flush()
        #expect(try center.store.records(matching: .all).map(\.message) == ["in the window", "trace too", "swift-log in the window"])
    }

    @Test func aTypedWindowKeepsThoseTypesOnlyAndAnEndedOneNothing() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: .current(app: "tests"))
        center.setUser("u-1")
        try center.store.openVerbosityWindow(VerbosityWindow(uid: "u-1", types: [.network], until: Timestamp.now.adding(.seconds(600)), owner: "t"))
        center.refreshVerbosity()
        center.logger(type: .network, minimumLevel: .info).debug("network")
        center.logger(type: .player, minimumLevel: .info).debug("player")
        // One that has already ended keeps nothing, though the store still holds it.
        try center.store.openVerbosityWindow(VerbosityWindow(uid: "u-1", types: [.network], until: Timestamp.now.adding(.seconds(-1)), owner: "t"))
        center.refreshVerbosity()
        center.logger(type: .network, minimumLevel: .info).debug("ended")
        try center.flush()
        #expect(try center.store.records(matching: .all).map(\.message) == ["network"])
    }
}
