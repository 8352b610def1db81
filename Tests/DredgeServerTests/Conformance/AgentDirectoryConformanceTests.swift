import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
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
}
