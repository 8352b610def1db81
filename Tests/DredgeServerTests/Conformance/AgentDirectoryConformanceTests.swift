import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
import Synchronization
import Testing

/// The rules of ``AgentDirectory``, run against every ``PersistenceBackend``.
@Suite struct AgentDirectoryConformanceTests {
    /// A fresh directory for each test (Swift Testing makes a suite instance per test).
    let dir = TempDir()

    static let keys = (0..<2).map { _ in try! RSAPrivateKey.generate() }
    static let host = WireHostInfo.with { $0.hostname = "kitchen"; $0.os = "Linux"; $0.app = "oven"; $0.appVersion = "1.2" }

    @Test(arguments: PersistenceBackend.all)
    func enrollmentIsOncePerKey(_ backend: PersistenceBackend) async throws {
        let agents = try await backend.agents(dir)
        let key = Self.keys[0].publicKey
        let id = try await agents.enroll(publicKey: key, host: Self.host, now: Date(timeIntervalSince1970: 1_000))
        #expect(id == key.agentID)
        #expect(try await agents.isEnrolled(id))
        #expect(try await agents.publicKey(of: id)?.spki == key.spki)
        // The same key again, under another name: refused, and the name stays.
        await #expect(throws: AlreadyEnrolled.self) {
            try await agents.enroll(publicKey: key, host: .with { $0.hostname = "impostor" }, now: Date())
        }
        let listed = try await agents.agents()
        #expect(listed.count == 1)
        let record = try #require(listed.first)
        #expect(record.agentID == id && record.hostname == "kitchen" && record.app == "oven" && record.appVersion == "1.2")
        #expect(record.enrolledAt == Date(timeIntervalSince1970: 1_000) && !record.connected && record.activeUIDs.isEmpty)

        let unknown = Self.keys[1].publicKey.agentID
        #expect(try await !agents.isEnrolled(unknown))
        #expect(try await agents.publicKey(of: unknown) == nil)
    }

    @Test(arguments: PersistenceBackend.all)
    func presenceFollowsTheNewestConnection(_ backend: PersistenceBackend) async throws {
        let agents = try await backend.agents(dir)
        let id = try await agents.enroll(publicKey: Self.keys[0].publicKey, host: Self.host, now: Date())
        let first = try await agents.connected(id, from: "10.0.0.1:5000", host: Self.host, now: Date(timeIntervalSince1970: 2_000))
        let second = try await agents.connected(id, from: "10.0.0.2:5000", host: .with { $0.hostname = "kitchen-2" }, now: Date(timeIntervalSince1970: 3_000))
        #expect(second > first)
        var record = try #require(try await agents.agents().first)
        #expect(record.connected && record.remoteAddress == "10.0.0.2:5000" && record.hostname == "kitchen-2")
        #expect(record.connectedAt == Date(timeIntervalSince1970: 3_000))
        // The replaced connection closes late: the live one stays online.
        try await agents.disconnected(id, generation: first)
        #expect(try await agents.agents().first?.connected == true)
        try await agents.disconnected(id, generation: second)
        #expect(try await agents.agents().first?.connected == false)

        _ = try await agents.connected(id, from: nil, host: Self.host, now: Date())
        try await agents.resetPresence()
        record = try #require(try await agents.agents().first)
        #expect(!record.connected)
    }

    @Test(arguments: PersistenceBackend.all)
    func heartbeatsSetTheUIDsAgentsAreFoundBy(_ backend: PersistenceBackend) async throws {
        let agents = try await backend.agents(dir)
        let a = try await agents.enroll(publicKey: Self.keys[0].publicKey, host: Self.host, now: Date())
        let b = try await agents.enroll(publicKey: Self.keys[1].publicKey, host: .with { $0.hostname = "bakery" }, now: Date())
        try await agents.heartbeat(a, .with { $0.activeUids = ["u-2", "u-1", "u-2"]; $0.stats.records = 40 }, now: Date(timeIntervalSince1970: 5_000))
        try await agents.heartbeat(b, .with { $0.activeUids = ["u-1"] }, now: Date())
        #expect(try await agents.agentIDs(withUID: "u-1") == [a, b].sorted())
        #expect(try await agents.agentIDs(withUID: "u-2") == [a])
        let record = try #require(try await agents.agents().first { $0.agentID == a })
        #expect(record.activeUIDs == ["u-1", "u-2"] && record.storeRecords == 40 && record.lastHeartbeatAt == Date(timeIntervalSince1970: 5_000))
        #expect(try await agents.agents().map(\.hostname) == ["bakery", "kitchen"], "by host name")

        // New uids replace the old ones.
        try await agents.heartbeat(a, .with { $0.activeUids = ["u-3"] }, now: Date())
        #expect(try await agents.agentIDs(withUID: "u-2").isEmpty)
        #expect(try await agents.agentIDs(withUID: "u-3") == [a])

        // A heartbeat that breaks the rules changes nothing.
        for bad in [["u\u{0}3"], [""], (0...DomainLimits.activeUIDs).map { "u-\($0)" }] {
            await #expect(throws: (any Error).self) { try await agents.heartbeat(a, .with { $0.activeUids = bad }, now: Date()) }
        }
        #expect(try await agents.agentIDs(withUID: "u-3") == [a])
        // An invalid uid finds nobody (a NUL would otherwise cut it to a valid one).
        #expect(try await agents.agentIDs(withUID: "u-3\u{0}x").isEmpty)
    }

    /// A revoked agent stays enrolled (its key cannot enroll again) but is revoked for good:
    /// pulls by uid no longer find it, and its record says when and by whom.
    @Test(arguments: PersistenceBackend.all)
    func aRevokedAgentIsFoundByNoUIDAndSaysSo(_ backend: PersistenceBackend) async throws {
        let agents = try await backend.agents(dir)
        let a = try await agents.enroll(publicKey: Self.keys[0].publicKey, host: Self.host, now: Date())
        let b = try await agents.enroll(publicKey: Self.keys[1].publicKey, host: .with { $0.hostname = "bakery" }, now: Date())
        try await agents.heartbeat(a, .with { $0.activeUids = ["u-1"] }, now: Date())
        try await agents.heartbeat(b, .with { $0.activeUids = ["u-1"] }, now: Date())
        #expect(try await agents.agentIDs(withUID: "u-1") == [a, b].sorted())
        #expect(try await !agents.isRevoked(a))

        let at = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(try await agents.revoke(a, by: "alice", at: at) == .revoked)
        #expect(try await agents.revoke(a, by: "bob", at: Date()) == .alreadyRevoked(at))
        #expect(try await agents.revoke(String(repeating: "0", count: 32), by: "alice", at: Date()) == .unknown)
        let (revokedA, revokedB) = (try await agents.isRevoked(a), try await agents.isRevoked(b))
        #expect(revokedA && !revokedB)
        #expect(try await !agents.isRevoked(String(repeating: "0", count: 32)))
        #expect(try await agents.agentIDs(withUID: "u-1") == [b])
        #expect(try await agents.revoked(among: [b, a, String(repeating: "0", count: 32)]) == [a])
        #expect(try await agents.revoked(among: []).isEmpty)
        let record = try #require(try await agents.agents().first { $0.agentID == a })
        #expect(record.revokedAt == at && record.revokedBy == "alice")
        #expect(try await agents.agents().first { $0.agentID == b }?.revokedAt == nil)
        // Still enrolled: its key is refused, not enrolled anew.
        #expect(try await agents.isEnrolled(a))
        await #expect(throws: AlreadyEnrolled.self) { try await agents.enroll(publicKey: Self.keys[0].publicKey, host: Self.host, now: Date()) }
    }

    /// A heartbeat with nothing new in it is held in memory at once, without a wait (the
    /// listener answers such a heartbeat on its event loop), and is recorded like any other;
    /// anything else is left to `heartbeat`, with nothing changed.
    @Test(arguments: PersistenceBackend.all)
    func aQuietHeartbeatIsHeldAtOnceAndRecordedLikeAnyOther(_ backend: PersistenceBackend) async throws {
        let now = Mutex(ContinuousClock.now)
        let agents = try await backend.agentsOnClock(dir) { now.withLock { $0 } }
        let a = try await agents.enroll(publicKey: Self.keys[0].publicKey, host: Self.host, now: Date())
        let generation = try await agents.connected(a, from: nil, host: Self.host, now: Date())
        func at(_ seconds: Double) -> Date { Date(timeIntervalSince1970: seconds) }
        let quiet = WireHeartbeat.with { $0.activeUids = ["u-1", "u-1"]; $0.stats.records = 9 }

        // The connection's first heartbeat is written in full, never just held.
        #expect(!agents.holdHeartbeat(a, quiet, now: at(5_000)))
        try await agents.heartbeat(a, .with { $0.activeUids = ["u-1"]; $0.stats.records = 3 }, now: at(5_000))
        // The same uids (repeated, in any order) and no report: held.
        #expect(agents.holdHeartbeat(a, quiet, now: at(6_000)))
        #expect(try await agents.agents().first?.lastHeartbeatAt == at(6_000))

        // New uids, a user report, a broken rule: not held, and nothing changes.
        let loud: [WireHeartbeat] = [
            .with { $0.activeUids = ["u-2"] },
            .with { $0.activeUids = ["u-1"]; $0.users = Self.report([("u-9", 1)]) },
            .with { $0.activeUids = ["u-1", ""] },
        ]
        for heartbeat in loud { #expect(!agents.holdHeartbeat(a, heartbeat, now: at(7_000))) }
        #expect(try await agents.agentIDs(withUID: "u-2").isEmpty)
        #expect(try await agents.agentIDs(withUID: "u-9").isEmpty)
        #expect(try await agents.agentIDs(withUID: "u-1") == [a])
        #expect(try await agents.agents().first?.lastHeartbeatAt == at(6_000))

        // Once a flush is due, the heartbeat that brings it is left to `heartbeat` (which
        // flushes what is due); then the next quiet one is held again.
        now.withLock { $0 += .seconds(2) }
        #expect(!agents.holdHeartbeat(a, quiet, now: at(8_000)))
        try await agents.heartbeat(a, quiet, now: at(8_000))
        #expect(agents.holdHeartbeat(a, quiet, now: at(9_000)))
        // What is held is written when the agent disconnects.
        try await agents.disconnected(a, generation: generation)
        let stored = try await backend.agents(dir)
        #expect(try await stored.agents().first?.lastHeartbeatAt == at(9_000))
    }

    static func report(_ users: [(String, Int64)], truncated: Bool = false) -> WireUserReport {
        .with { r in
            r.users = users.map { u in .with { $0.uid = u.0; $0.lastSeenUs = u.1 } }
            r.truncated = truncated
        }
    }

    @Test(arguments: PersistenceBackend.all)
    func userReportsFindAgentsByAnyUIDTheirStoreHolds(_ backend: PersistenceBackend) async throws {
        let agents = try await backend.agents(dir)
        let a = try await agents.enroll(publicKey: Self.keys[0].publicKey, host: Self.host, now: Date())
        let b = try await agents.enroll(publicKey: Self.keys[1].publicKey, host: Self.host, now: Date())
        let hour: Int64 = 3_600_000_000
        // a logged u-old two days ago (not active), u-new today (active too).
        var added = try await agents.heartbeat(a, .with {
            $0.activeUids = ["u-new"]
            $0.users = Self.report([("u-new", 100 * hour), ("u-old", 52 * hour)], truncated: true)
        }, now: Date())
        #expect(added == ["u-new", "u-old"])
        added = try await agents.heartbeat(b, .with { $0.activeUids = ["u-new"] }, now: Date())
        #expect(added == ["u-new"])
        #expect(try await agents.holders(of: "u-old") == [UIDHolder(agentID: a, lastSeen: Date(timeIntervalSince1970: Double(52 * 3_600)))])
        #expect(try await agents.holders(of: "u-new") == [
            UIDHolder(agentID: a, lastSeen: Date(timeIntervalSince1970: Double(100 * 3_600))), UIDHolder(agentID: b, lastSeen: nil),
        ].sorted { $0.agentID < $1.agentID })
        let record = try #require(try await agents.agents().first { $0.agentID == a })
        #expect(record.reportedUsers == 2 && record.usersTruncated && record.activeUIDs == ["u-new"])
        // What it holds, both ways (whose live tails it runs).
        #expect(try await agents.uids(of: a) == ["u-new", "u-old"])
        #expect(try await agents.uids(of: b) == ["u-new"])
        #expect(try await agents.uids(of: String(repeating: "0", count: 32)).isEmpty)

        // No report: the reported users stay, and nothing is new.
        added = try await agents.heartbeat(a, .with { $0.activeUids = [] }, now: Date())
        #expect(added.isEmpty)
        #expect(try await agents.agentIDs(withUID: "u-old") == [a])
        #expect(try await agents.agentIDs(withUID: "u-new") == [a, b].sorted(), "a's report still holds u-new")
        // The same again (nothing changed: an implementation may hold it in memory): the same.
        #expect(try await agents.heartbeat(a, .with { $0.activeUids = [] }, now: Date()).isEmpty)
        #expect(try await agents.agentIDs(withUID: "u-old") == [a])
        // The same report again (every connection sends one): nothing new, nothing lost.
        added = try await agents.heartbeat(a, .with { $0.users = Self.report([("u-new", 100 * hour), ("u-old", 52 * hour)], truncated: true) }, now: Date())
        #expect(added.isEmpty)
        #expect(try await agents.holders(of: "u-old") == [UIDHolder(agentID: a, lastSeen: Date(timeIntervalSince1970: Double(52 * 3_600)))])
        // Two spellings of "é" are two uids, byte for byte (a store keeps them apart).
        try await agents.heartbeat(a, .with { $0.users = Self.report([("u-\u{E9}", 1), ("u-e\u{301}", 1), ("u-old", 52 * hour)]) }, now: Date())
        #expect(try await agents.agents().first { $0.agentID == a }?.reportedUsers == 3)
        #expect(try await agents.agentIDs(withUID: "u-e\u{301}") == [a])
        #expect(try await agents.agentIDs(withUID: "u-\u{E9}") == [a])

        // A new report replaces the last; an empty one clears it.
        added = try await agents.heartbeat(a, .with { $0.users = Self.report([("u-third", 101 * hour)]) }, now: Date())
        #expect(added == ["u-third"])
        #expect(try await agents.agentIDs(withUID: "u-old").isEmpty)
        added = try await agents.heartbeat(a, .with { $0.users = WireUserReport() }, now: Date())
        #expect(added.isEmpty)
        #expect(try await agents.agentIDs(withUID: "u-third").isEmpty)
        #expect(try await agents.agents().first { $0.agentID == a }?.reportedUsers == 0)

        // A report that breaks the rules changes nothing.
        try await agents.heartbeat(a, .with { $0.users = Self.report([("u-kept", 1)]) }, now: Date())
        let bad: [WireUserReport] = [
            Self.report([("u-1", 1), ("u-1", 2)]), Self.report([("u-1", -1)]), Self.report([("u-1", 253_402_300_800_000_000)]), Self.report([("u\u{0}1", 1)]),
            Self.report([("", 1)]),
            Self.report((0...DomainLimits.reportedUsers).map { ("u-\($0)", 1) }),
        ]
        for report in bad {
            await #expect(throws: (any Error).self) { try await agents.heartbeat(a, .with { $0.users = report }, now: Date()) }
        }
        #expect(try await agents.agentIDs(withUID: "u-kept") == [a])
        #expect(try await agents.agentIDs(withUID: "u-1").isEmpty)
    }

    @Test(arguments: PersistenceBackend.all)
    func hostInfoIsKeptWithinTheProtocolsBounds(_ backend: PersistenceBackend) async throws {
        let agents = try await backend.agents(dir)
        var labels: [String: String] = ["region": "eu", "": "dropped", "tier": "gold\u{1B}[31m"]
        for i in 0..<40 { labels["z\(i)"] = "v" }
        let hostile = WireHostInfo.with {
            $0.hostname = "kitchen\u{7}\n" + String(repeating: "é", count: 300)
            $0.app = "oven"
            $0.appVersion = "2.4.1"
            $0.extra = labels
        }
        let id = try await agents.enroll(publicKey: Self.keys[0].publicKey, host: hostile, now: Date())
        var record = try #require(try await agents.agents().first)
        #expect(record.hostname.hasPrefix("kitchen\u{FFFD}\u{FFFD}é") && record.hostname.utf8.count <= 256)
        #expect(!record.hostname.unicodeScalars.contains { $0.value < 0x20 })
        #expect(record.labels["region"] == "eu" && record.labels["tier"] == "gold\u{FFFD}[31m" && record.labels[""] == nil)
        #expect(record.labels.count == WireHostInfo.maxLabels)
        #expect(record.app == "oven" && record.appVersion == "2.4.1")
        // Each connection's host info replaces the last.
        _ = try await agents.connected(id, from: nil, host: .with { $0.hostname = "kitchen"; $0.app = "oven"; $0.appVersion = "2.5"; $0.extra = ["region": "us"] }, now: Date())
        record = try #require(try await agents.agents().first)
        #expect(record.hostname == "kitchen" && record.appVersion == "2.5" && record.labels == ["region": "us"])
    }
}
