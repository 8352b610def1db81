import DredgeAdminAPI
import DredgeAgentCore
import DredgeEnvelope
@testable import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
import Synchronization
import Testing

/// The listener's agent directory, counting the heartbeats held at once and those written in
/// full, whose writes wait while the test holds them back.
final class GatedDirectory: AgentDirectory, Sendable {
    let inner: any AgentDirectory
    let quick = Mutex(0)
    let full = Mutex(0)
    let holding = Mutex(false)
    init(_ inner: any AgentDirectory) { self.inner = inner }

    func holdHeartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) -> Bool {
        let held = inner.holdHeartbeat(agentID, heartbeat, now: now)
        if held { quick.withLock { $0 += 1 } }
        return held
    }
    func heartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) async throws -> Set<String> {
        full.withLock { $0 += 1 }
        while holding.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
        return try await inner.heartbeat(agentID, heartbeat, now: now)
    }
    func resetPresence() async throws { try await inner.resetPresence() }
    func enroll(publicKey: RSAPublicKey, host: WireHostInfo, keyGeneration: Int, now: Date) async throws -> String {
        try await inner.enroll(publicKey: publicKey, host: host, keyGeneration: keyGeneration, now: now)
    }
    func keyGeneration(of agentID: String) async throws -> Int? { try await inner.keyGeneration(of: agentID) }
    func setKeyGeneration(_ agentID: String, _ generation: Int) async throws { try await inner.setKeyGeneration(agentID, generation) }
    func keyGenerations() async throws -> [Int: Int] { try await inner.keyGenerations() }
    func publicKey(of agentID: String) async throws -> RSAPublicKey? { try await inner.publicKey(of: agentID) }
    func connected(_ agentID: String, from address: String?, host: WireHostInfo, now: Date) async throws -> Int64 {
        try await inner.connected(agentID, from: address, host: host, now: now)
    }
    func disconnected(_ agentID: String, generation: Int64) async throws { try await inner.disconnected(agentID, generation: generation) }
    func holders(of uid: String) async throws -> [UIDHolder] { try await inner.holders(of: uid) }
    func uids(of agentID: String) async throws -> Set<String> { try await inner.uids(of: agentID) }
    func isEnrolled(_ agentID: String) async throws -> Bool { try await inner.isEnrolled(agentID) }
    func agents() async throws -> [AgentRecord] { try await inner.agents() }
    func revoke(_ agentID: String, by actor: String, at: Date) async throws -> Revocation { try await inner.revoke(agentID, by: actor, at: at) }
    func isRevoked(_ agentID: String) async throws -> Bool { try await inner.isRevoked(agentID) }
    func revoked(among agentIDs: [String]) async throws -> [String] { try await inner.revoked(among: agentIDs) }
}

/// A heartbeat with nothing new in it is answered on the listener's event loop (the registry
/// holds it in memory); any other goes through the connection's task and the database. Both
/// ways answer alike: every heartbeat is acknowledged, in the order sent, and the registry
/// shows what the last one said.
@Suite struct HeartbeatAnswerTests {
    static func ackSeq(_ frame: WireFrame?) -> UInt64? {
        if case .heartbeatAck(let ack)? = frame?.body { return ack.seq }
        return nil
    }

    @Test func heartbeatsAreAnsweredInOrderWhicheverWayTheyAreHandled() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent()
            // First, full (a new connection), quiet, quiet, new uids (full), quiet, new uids again.
            let said: [[String]] = [["u-1"], ["u-1"], ["u-1"], ["u-1", "u-2"], ["u-2", "u-1"], ["u-3"]]
            try await agent.connect { link in
                // One at a time: each answered before the next is sent.
                var acks: [UInt64] = []
                for uids in said {
                    try await link.heartbeat(activeUIDs: uids)
                    acks.append(try #require(Self.ackSeq(try await link.next())))
                }
                #expect(acks == Array(1...UInt64(said.count)))
                #expect(try await server.admin.agents().first?.activeUIDs == ["u-3"])

                // All at once: some arrive while the connection's task still handles one before
                // them (which must not be overtaken), others when nothing of it runs.
                for round in 0..<16 {
                    for uids in said { try await link.heartbeat(activeUIDs: round % 2 == 0 ? uids : ["u-4"]) }
                    acks = []
                    for _ in said { acks.append(try #require(Self.ackSeq(try await link.next()))) }
                    let first = UInt64(said.count * (round + 1) + 1)
                    #expect(acks == Array(first..<first + UInt64(said.count)), "round \(round)")
                }
            }
            #expect(try await server.admin.agents().first?.activeUIDs == ["u-4"])
            #expect(try await server.registry.agentIDs(withUID: "u-3").isEmpty)
        }
    }

    /// A quiet heartbeat is answered without the full write, and never before a heartbeat
    /// sent ahead of it whose write is still running.
    @Test func aQuietHeartbeatIsAnsweredAtOnceButNeverAheadOfAnEarlierOne() async throws {
        let directory = Mutex<GatedDirectory?>(nil)
        try await withStopping(InProcessServer(listenerRegistry: { inner in
            let gated = GatedDirectory(inner)
            directory.withLock { $0 = gated }
            return gated
        })) { server in
            let gated = try #require(directory.withLock { $0 })
            let agent = try await server.enrollAgent()
            try await agent.connect { link in
                try await link.heartbeat(activeUIDs: ["u-1"])  // a connection's first: in full
                #expect(Self.ackSeq(try await link.next()) == 1)
                // Quiet: held at once, when nothing of the connection runs. Each try waits for the
                // connection's task to end first; on a loaded machine the task's answer may still
                // be on its way to the channel, and the heartbeat then (rightly) queues behind it
                // and is written in full, so a few tries are allowed.
                let counters = server.listener.counters
                var seq: UInt64 = 1
                var tries = 0
                while gated.quick.withLock({ $0 }) == 0 && tries < 5 {
                    tries += 1
                    #expect(try await PullOutcomeTests.waitFor(.seconds(30)) {
                        counters.runsStarted.load(ordering: .relaxed) == counters.runsEnded.load(ordering: .relaxed)
                    })
                    try await link.heartbeat(activeUIDs: ["u-1"])
                    seq += 1
                    #expect(Self.ackSeq(try await link.next()) == seq)
                }
                let (full, quick) = (gated.full.withLock { $0 }, gated.quick.withLock { $0 })
                #expect(quick == 1, "after \(tries) tries")
                #expect(full == tries, "the first and each try that found the connection busy")

                // New uids: written in full, and the write is held back.
                gated.holding.withLock { $0 = true }
                try await link.heartbeat(activeUIDs: ["u-2"])
                #expect(ManagedProcess.waitFor(timeout: .seconds(30)) { gated.full.withLock { $0 } == full + 1 })
                // The old uids again: quiet for the directory, but sent after one still being
                // written, so it waits for it (and is then written in full: the uids changed).
                let queued = server.listener.counters.framesQueuedBehindAStep.load(ordering: .relaxed)
                try await link.heartbeat(activeUIDs: ["u-1"])
                // It arrived and waits behind the one being written; then the write goes on.
                #expect(try await PullOutcomeTests.waitFor(.seconds(60)) { server.listener.counters.framesQueuedBehindAStep.load(ordering: .relaxed) == queued + 1 })
                gated.holding.withLock { $0 = false }
                #expect(Self.ackSeq(try await link.next()) == seq + 1)
                #expect(Self.ackSeq(try await link.next()) == seq + 2)
                #expect(gated.quick.withLock { $0 } == 1)
            }
            #expect(try await server.admin.agents().first?.activeUIDs == ["u-1"])
        }
    }

    /// A heartbeat that breaks the protocol's rules, after quiet ones, still closes the
    /// connection and records nothing.
    @Test func aHeartbeatThatBreaksTheRulesAfterQuietOnesClosesTheConnection() async throws {
        try await withStopping(InProcessServer()) { server in
            let agent = try await server.enrollAgent()
            await #expect(throws: (any Error).self) {
                try await agent.connect { link in
                    for _ in 0..<3 {
                        try await link.heartbeat(activeUIDs: ["u-1"])
                        _ = try await link.next()
                    }
                    // Raw: the agent's own state machine would not send it.
                    try await link.send(.with { $0.heartbeat = .with { $0.seq = 4; $0.activeUids = ["u-1", ""] } })
                    while try await link.next() != nil {}
                }
            }
            #expect(try await server.admin.agents().first?.activeUIDs == ["u-1"])
        }
    }
}
