import DredgeAgentCore
import DredgeDomain
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// Matching a real store's records against the held triggers (Protocol § 21): only records
/// stored after a trigger was first held fire it, never a rewound one, each window once; the
/// app's context bounds it; the read goes on where it stopped.
@Suite struct TriggerMatcherTests {
    static let now = Timestamp(rfc3339: "2026-11-30T10:00:00Z")!

    static func trigger(_ id: Character, _ change: (inout WireTrigger) -> Void = { _ in }) -> WireTrigger {
        var t = WireTrigger.with {
            $0.triggerID = String(repeating: id, count: 32)
            $0.name = "declined"
            $0.match = .with { $0.levels = [.error]; $0.text = "declined" }
            $0.app = "shop"
            $0.minAppVersion = "2.0"
            $0.beforeS = 60
            $0.afterS = 10
            $0.maxPerDeviceDay = 5
            $0.expiresAtUs = now.microseconds + 86_400_000_000
        }
        change(&t)
        return t
    }

    func hold(_ held: inout HeldTriggers, _ triggers: [WireTrigger], version: UInt64, store: LogStore) throws {
        let set = WireTriggerSet.with { $0.version = version; $0.issuedAtUs = Self.now.microseconds; $0.triggers = triggers }
        held.hold(set, rules: try TriggerSetTerms.check(set), storeEnd: try store.lastRowID())
    }

    @Test func recordsStoredAfterATriggerIsHeldFireItOncePerWindow() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: StoreConfiguration())
        defer { try? store.close() }
        let shop = try store.register(LogContext(host: "h", os: "Linux", app: "shop", appVersion: "2.4", process: "shop[1]"))
        let oldShop = try store.register(LogContext(host: "h", os: "Linux", app: "shop", appVersion: "1.9", process: "shop[2]"))
        let other = try store.register(LogContext(host: "h", os: "Linux", app: "till", appVersion: "3", process: "till[1]"))
        func log(_ seconds: Int64, _ level: LogLevel, _ message: String, uid: String = "u-1", metadata: LogMetadata = [:], context: ContextID? = nil) throws {
            #expect(store.enqueue(LogEntry(timestamp: Self.now.adding(.seconds(seconds)), level: level, type: .business, uid: uid, message: message, metadata: metadata, context: context ?? shop)))
            try store.flush()
        }
        var ids = 0
        func newID() -> String { ids += 1; return String(format: "%032x", ids) }

        // Before any trigger is held: a record that would fire it, and the cursor follows the store.
        try log(0, .error, "payment declined before the trigger")
        var held = HeldTriggers()
        #expect(try TriggerMatcher.step(&held, store: store, now: Self.now, newID: newID).isEmpty)
        try hold(&held, [Self.trigger("a")], version: 1, store: store)
        #expect(try TriggerMatcher.step(&held, store: store, now: Self.now, newID: newID).isEmpty)

        try log(5, .info, "payment declined, but only info")
        try log(6, .error, "payment declined by the bank", metadata: ["dredge.rewound": true])  // from a rewind buffer: tells of the past
        try log(7, .error, "payment declined in the old app", context: oldShop)
        try log(8, .error, "payment declined in another app", context: other)
        try log(10, .error, "Payment DECLINED by the bank", uid: "u-2")
        try log(15, .error, "payment declined again, inside the window")
        var planned = try TriggerMatcher.step(&held, store: store, now: Self.now.adding(.seconds(16)), newID: newID)
        #expect(planned.count == 1)
        let capture = try #require(planned.first)
        #expect(capture.uid == "u-2" && capture.matchedAtUs == Self.now.adding(.seconds(10)).microseconds && capture.sinceUs == Self.now.adding(.seconds(-50)).microseconds)
        #expect(capture.untilUs == Self.now.adding(.seconds(20)).microseconds + 1 && capture.setVersion == 1 && capture.matchedRow != nil)
        #expect(held.cursor == (try store.lastRowID()))
        #expect(try TriggerMatcher.step(&held, store: store, now: Self.now.adding(.seconds(17)), newID: newID).isEmpty, "nothing new")

        // A trigger added later matches only what is stored after it is held.
        try log(25, .error, "payment declined after the window")
        try hold(&held, [Self.trigger("a"), Self.trigger("b") { $0.app = "" ; $0.minAppVersion = "" }], version: 2, store: store)
        planned = try TriggerMatcher.step(&held, store: store, now: Self.now.adding(.seconds(26)), newID: newID)
        #expect(planned.map(\.triggerID) == [String(repeating: "a", count: 32)] && planned.first?.sinceUs == capture.untilUs, "b began after it")
        try log(40, .error, "payment declined in another app, later", context: other)
        planned = try TriggerMatcher.step(&held, store: store, now: Self.now.adding(.seconds(41)), newID: newID)
        #expect(planned.map(\.triggerID) == [String(repeating: "b", count: 32)] && planned.first?.setVersion == 2)
        #expect(held.planner.pending.count == 3)
    }
}
