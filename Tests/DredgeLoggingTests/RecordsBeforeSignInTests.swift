import DredgeLogging
import DredgeTestSupport
import Foundation
import Testing

/// `LogCenter.setUser` and ``RecordsBeforeSignIn``: what a pull by uid sees of the records an app
/// logged before its user signed in.
@Suite struct RecordsBeforeSignInTests {
    func context(_ process: String, app: String = "oven") -> LogContext {
        LogContext(host: "h", os: "Linux", app: app, appVersion: "1", process: process)
    }

    /// "message" or "message(before)" for each record of `uid`, in time order.
    func pulled(_ store: LogStore, uid: String) throws -> [String] {
        try store.records(matching: LogFilter(uid: uid)).map { $0.message + ($0.metadata[LogStore.beforeSignInKey] == .bool(true) ? "(before)" : "") }
    }

    @Test func aSignInTakesTheRecordsOfThisRunSinceTheLastUserLeft() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: context("oven[1]"))
        let log = center.logger()
        log.info("launch")
        log.warning("sign-in failed: wrong password")
        center.setUser("u-42")
        log.info("home")
        center.setUser("u-42")  // the same user again: not a sign-in
        log.info("cart")
        center.setUser(nil)
        log.info("signed out screen")
        center.setUser("u-43")
        log.info("b's home")
        center.setUser("u-44")  // a switch without signing out: nothing anonymous to take
        log.info("c's home")
        try center.flush()

        #expect(try pulled(center.store, uid: "u-42") == ["launch(before)", "sign-in failed: wrong password(before)", "home", "cart"])
        #expect(try pulled(center.store, uid: "u-43") == ["signed out screen(before)", "b's home"])
        #expect(try pulled(center.store, uid: "u-44") == ["c's home"])
        #expect(try center.store.count(matching: LogFilter(uid: "")) == 0)
        try center.close()
    }

    /// Threads logging (into a queue that blocks when full) while the user signs out and in 200
    /// times: nothing is lost, nothing deadlocks, and every anonymous record is taken by the next
    /// sign-in. (The narrow window between stamping a record and queueing it is closed by one
    /// lock in `LogCenter.submit`; this test does not reliably provoke that window.)
    @Test func recordsLoggedOnOtherThreadsDuringSignInsAreNeverLeftBehind() throws {
        let dir = TempDir()
        var configuration = StoreConfiguration()
        configuration.overflowPolicy = .block
        let center = try LogCenter(path: dir.file("logs.sqlite"), configuration: configuration, context: context("oven[1]"))
        let done = DispatchGroup()
        for thread in 0..<2 {
            DispatchQueue.global().async(group: done) {
                let log = center.logger()
                for i in 0..<4_000 { log.info("t\(thread) \(i)") }
            }
        }
        for k in 0..<200 {
            center.setUser(nil)
            center.setUser("u-\(k)")
        }
        done.wait()
        try center.flush()
        #expect(try center.store.count(matching: .all) == 8_000)
        #expect(try center.store.count(matching: LogFilter(uid: "")) == 0)
        try center.close()
    }

    @Test func noneLeavesThemAnonymous() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: context("oven[1]"), beforeSignIn: .none)
        center.logger().info("launch")
        center.setUser("u-1")
        center.logger().info("home")
        try center.flush()
        #expect(try pulled(center.store, uid: "u-1") == ["home"])
        #expect(try pulled(center.store, uid: "") == ["launch"])
        try center.close()
    }

    /// A run that crashed before anyone signed in: the next run's sign-in takes its records only
    /// with a window, and only within it.
    @Test func aWindowReachesBackIntoAnEarlierRunOfTheSameApp() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        do {
            let crashed = try LogCenter(path: path, context: context("oven[1]"))
            // Logged 20 minutes ago, then 2 minutes ago, then the run died.
            let old = crashed.context
            crashed.store.enqueue(LogEntry(timestamp: .now.subtracting(.seconds(1_200)), level: .info, type: .app, uid: "", message: "long ago", context: old))
            crashed.store.enqueue(LogEntry(timestamp: .now.subtracting(.seconds(120)), level: .critical, type: .app, uid: "", message: "crash at launch", context: old))
            try crashed.close()
            let fridge = try LogCenter(path: path, context: context("fridge[2]", app: "fridge"))
            fridge.logger().info("another app")
            try fridge.close()
        }
        do {
            let run = try LogCenter(path: path, context: context("oven[3]"))  // default: this run only
            run.logger().info("launch again")
            run.setUser("u-1")
            try run.flush()
            #expect(try pulled(run.store, uid: "u-1") == ["launch again(before)"])
            try run.close()
        }
        let run = try LogCenter(path: path, context: context("oven[4]"), beforeSignIn: .within(.seconds(600)))
        run.logger().info("third launch")
        run.setUser("u-2")
        try run.flush()
        // "launch again" carries u-1 now, so the stretch begins after it.
        #expect(try pulled(run.store, uid: "u-2") == ["third launch(before)"])
        let all = try run.store.records(matching: .all).map { "\($0.message):\($0.uid)" }
        #expect(all == ["long ago:", "crash at launch:", "another app:", "launch again:u-1", "third launch:u-2"])
        try run.close()

        // Without the intervening sign-in, the window takes the crashed run's record but not the
        // one older than the window, nor the other app's.
        let fresh = TempDir()
        let path2 = fresh.file("logs.sqlite")
        do {
            let crashed = try LogCenter(path: path2, context: context("oven[1]"))
            crashed.store.enqueue(LogEntry(timestamp: .now.subtracting(.seconds(1_200)), level: .info, type: .app, uid: "", message: "long ago", context: crashed.context))
            crashed.store.enqueue(LogEntry(timestamp: .now.subtracting(.seconds(120)), level: .critical, type: .app, uid: "", message: "crash at launch", context: crashed.context))
            try crashed.close()
            let fridge = try LogCenter(path: path2, context: context("fridge[2]", app: "fridge"))
            fridge.logger().info("another app")
            try fridge.close()
        }
        let next = try LogCenter(path: path2, context: context("oven[3]"), beforeSignIn: .within(.seconds(600)))
        next.logger().info("launch again")
        next.setUser("u-1")
        try next.flush()
        #expect(try pulled(next.store, uid: "u-1") == ["crash at launch(before)", "launch again(before)"])
        #expect(try pulled(next.store, uid: "").sorted() == ["another app", "long ago"])
        try next.close()
    }
}
