import Crypto
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
@testable import DredgeServer
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// A live tail's two cores against each other (Protocol § 20), no network: the agent's
/// ``TailRunner`` reading a real store, the server's ``TailStream`` taking its batches. What the
/// server holds is exactly the tail's user's matching records logged after the tail began, in
/// the order the store took them, each once, across lost frames, a reconnection and an agent
/// restart.
@Suite struct LiveTailCoreTests {
    static let agentKey = try! RSAPrivateKey.generate()
    static let encryption = try! RSAPrivateKey.generate()
    let server = ServerSigningKey.generate()
    let tailKey = SymmetricKey(size: .bits256)
    let now = Timestamp.now
    var agentID: String { Self.agentKey.publicKey.agentID }
    let tailID = "5d1e7a3c9b0f2e4d6c8a1b3e5f7d9c0a"

    var keys: PinnedServerKeys {
        get throws {
            try PinnedServerKeys(
                AgentState.File(
                    agentID: agentID, serverHost: "127.0.0.1", serverPort: 1, servers: nil, serverSigningKey: Hex.encode(server.verifyingKey.rawRepresentation),
                    serverEncryptionKey: Hex.encode(Self.encryption.publicKey.spki), enrolledAt: now.date, keyGeneration: 1))
        }
    }

    func command(verbose: Bool = false) throws -> WireTailCommand {
        var command = try WireTailCommand.with {
            $0.tailID = tailID
            $0.target = .with { $0.uid = "u-1"; $0.agentID = agentID }
            $0.filter = .with { $0.levels = [.warning, .error] }
            $0.issuedAtUs = now.microseconds
            $0.expiresAtUs = now.microseconds + 900_000_000
            $0.maxRecordsPerS = 10_000
            $0.maxBytesPerS = 16 << 20
            $0.verbose = verbose
            $0.verboseTypes = verbose ? ["network"] : []
            $0.wrappedKey = Data(try Self.agentKey.publicKey.wrapKey(tailKey))
        }
        try server.sign(&command)
        return command
    }

    /// The agent's manager, driven as the agent's loop does, with the server's core on the
    /// other side: the command answered, the verbosity window opened for the tail's life, the
    /// records sent, accepted again on a new connection, and everything ended by a stop or by
    /// the expiry on the agent's own clock.
    @Test func theAgentsManagerAnswersRunsAndEndsATail() async throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("device.sqlite"))
        let context = try store.register(LogContext(host: "kitchen-oven-0042", os: "Linux", app: "oven-control", appVersion: "2.4.1", process: "ovend"))
        try log(store, context, 1...3)
        let manager = TailManager(store: store, agentID: agentID, agentKey: Self.agentKey)
        let outbox = Outbox()
        try await manager.connected { frame in await outbox.add(frame) }
        let command = try command(verbose: true)
        try await manager.receive(.with { $0.tailCommand = command }, serverKeys: try keys, now: now, clock: 0)
        let accepted = try #require(await outbox.take().first?.tailAccepted)
        let end = try store.lastRowID()
        #expect(accepted.tailID == tailID && accepted.startCursor == UInt64(end))
        let windows = try store.verbosityWindows(at: now)
        #expect(windows.map(\.uid) == ["u-1"] && windows.first?.types == ["network"] && windows.first?.until.microseconds == command.expiresAtUs)

        var server = try TailStream(tailID: tailID, agentID: agentID, uid: "u-1", key: tailKey, expiresAt: Timestamp(microseconds: command.expiresAtUs))
        try await manager.receive(.with { $0.tailAck = server.accepted(startCursor: accepted.startCursor).tailAck }, serverKeys: try keys, now: now, clock: 0)
        try log(store, context, 4...6)
        var received: [String] = []
        func serve(_ frames: [WireFrame], clock: Double) async throws {
            for frame in frames where frame.tailBatch.seq > 0 {
                guard case .take(let taken) = server.receive(frame.tailBatch, now: .now) else { throw DeploymentError("not taken") }
                received += taken.batch.records.map { (try! JSONSerialization.jsonObject(with: Data($0)) as! [String: Any])["message"] as! String }
                try await manager.receive(.with { $0.tailAck = server.stored(taken).tailAck }, serverKeys: try keys, now: now, clock: clock)
            }
        }
        // Read at one pass, sent at the next once the batch has waited its tenth of a second.
        try await manager.step(now: now, clock: 0.2)
        #expect(await outbox.take().isEmpty)
        try await manager.step(now: now, clock: 0.35)
        try await serve(await outbox.take(), clock: 0.35)
        #expect(received == ["w4", "w5", "w6"])

        // A new connection: accepted again, going on after what the server holds.
        await manager.disconnected()
        try log(store, context, 7...8)
        try await manager.step(now: now, clock: 0.4)
        #expect(await outbox.take().isEmpty, "nothing while no connection is ready")
        try await manager.connected { frame in await outbox.add(frame) }
        let again = try #require(await outbox.take().first?.tailAccepted)
        try await manager.receive(.with { $0.tailAck = server.accepted(startCursor: again.startCursor).tailAck }, serverKeys: try keys, now: now, clock: 0.4)
        try await manager.step(now: now, clock: 0.6)
        try await manager.step(now: now, clock: 0.75)
        try await serve(await outbox.take(), clock: 0.75)
        #expect(received == (4...8).map { "w\($0)" })

        // A stop ends it here, and the window closes.
        try await manager.receive(.with { $0.tailStop = .with { $0.tailID = tailID; $0.reason = "stopped by alice" } }, serverKeys: try keys, now: now, clock: 0.7)
        #expect(await manager.running.isEmpty)
        #expect(try store.verbosityWindows(at: now).isEmpty)

        // Delivered again, it runs again, and its expiry ends it by the agent's clock alone.
        try await manager.receive(.with { $0.tailCommand = command }, serverKeys: try keys, now: now, clock: 1)
        #expect(await manager.running == [tailID])
        try await manager.step(now: Timestamp(microseconds: command.expiresAtUs), clock: 2)
        #expect(await manager.running.isEmpty)
        #expect(try store.verbosityWindows(at: now).isEmpty)
        // A command it refuses is answered with the reason.
        _ = await outbox.take()
        var forged = try self.command()
        forged.target.uid = "u-2"
        try await manager.receive(.with { $0.tailCommand = forged }, serverKeys: try keys, now: now, clock: 3)
        #expect(await outbox.take().first?.commandRejected.reason == .rejectBadSignature)
    }

    actor Outbox {
        var frames: [WireFrame] = []
        func add(_ frame: WireFrame) { frames.append(frame) }
        func take() -> [WireFrame] {
            defer { frames = [] }
            return frames
        }
    }

    func accepted() throws -> TailAdmission.Accepted {
        let command = try command()
        guard case .accept(let a) = TailAdmission.admit(command, agentID: agentID, serverKeys: try keys, agentKey: Self.agentKey, running: [], now: now) else {
            throw DeploymentError("the tail was refused")
        }
        return a
    }

    /// Both ends, and what the server took.
    struct Link {
        var agent: TailRunner
        var server: TailStream
        var received: [String] = []
        var clock = 0.0

        /// The agent (re)accepts: it waits for what the server holds, and goes on from there.
        mutating func accept() {
            let accepted = agent.accept()
            agent.acknowledged(server.accepted(startCursor: accepted.tailAccepted.startCursor).tailAck, now: clock)
        }

        /// Polls until nothing more is due; `lose`: frames the network loses (by seq).
        mutating func pump(_ store: LogStore, lose: Set<UInt64> = []) throws {
            for _ in 0..<50 {
                clock += 0.1
                let frames = try agent.poll(store: store, now: clock)
                if frames.isEmpty && agent.unacknowledged == 0 && !agent.isHolding { return }
                for frame in frames where !lose.contains(frame.tailBatch.seq) {
                    guard case .take(let taken) = server.receive(frame.tailBatch, now: .now) else { throw DeploymentError("not taken: \(frame.tailBatch.seq)") }
                    received += taken.batch.records.map { record in
                        let object = try! JSONSerialization.jsonObject(with: Data(record)) as! [String: Any]
                        return object["message"] as! String
                    }
                    agent.acknowledged(server.stored(taken).tailAck, now: clock)
                }
                if !lose.isEmpty && frames.contains(where: { lose.contains($0.tailBatch.seq) }) { return }
            }
        }
    }

    func log(_ store: LogStore, _ context: ContextID, _ range: ClosedRange<Int>) throws {
        for i in range {
            // Only u-1's warnings and errors match; u-2's and u-1's infos do not.
            store.enqueue(LogEntry(timestamp: .now, level: .warning, type: .network, uid: "u-1", message: "w\(i)", metadata: [:], context: context))
            store.enqueue(LogEntry(timestamp: .now, level: .info, type: .network, uid: "u-1", message: "i\(i)", metadata: [:], context: context))
            store.enqueue(LogEntry(timestamp: .now, level: .error, type: .network, uid: "u-2", message: "x\(i)", metadata: [:], context: context))
        }
        try store.flush()
    }

    /// An agent that restarts before the server holds anything knows only its store's end:
    /// the server kept where the tail began, so nothing logged since is skipped. Unacknowledged
    /// batches stop at MAX_TAIL_IN_FLIGHT, and the agent stops at the tail's expiry on its own.
    @Test func aRestartBeforeAnythingIsHeldSkipsNothingAndTheAgentStopsAtExpiry() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("device.sqlite"))
        let context = try store.register(LogContext(host: "kitchen-oven-0042", os: "Linux", app: "oven-control", appVersion: "2.4.1", process: "ovend"))
        try log(store, context, 1...3)
        let accepted = try accepted()
        var link = Link(
            agent: try TailRunner(accepted, agentID: agentID, startCursor: UInt64(try store.lastRowID())),
            server: try TailStream(tailID: tailID, agentID: agentID, uid: "u-1", key: tailKey, expiresAt: accepted.expiresAt))
        link.accept()
        try log(store, context, 4...10)  // logged, then the agent dies before sending anything
        link.agent = try TailRunner(accepted, agentID: agentID, startCursor: UInt64(try store.lastRowID()))
        link.accept()
        try link.pump(store)
        #expect(link.received == (4...10).map { "w\($0)" })

        // No acknowledgements: 16 batches in flight, then nothing more until one comes.
        try log(store, context, 11...(11 + 200 * 20))
        let frames = try link.agent.poll(store: store, now: 100)
        #expect(frames.count == WireLimits.maxTailInFlight && link.agent.unacknowledged == WireLimits.maxTailInFlight)
        #expect(try link.agent.poll(store: store, now: 101).isEmpty)
        // Past the expiry, by the agent's clock: nothing, acknowledged or not.
        link.accept()
        #expect(try link.agent.poll(store: store, now: 102, clock: accepted.expiresAt).isEmpty)
        #expect(link.agent.hasExpired(at: accepted.expiresAt) && !link.agent.hasExpired(at: now))
    }

    @Test func theServerHoldsEachMatchingRecordOnceInStoreOrderAcrossLossesAndARestart() throws {
        let dir = TempDir()
        let store = try LogStore(path: dir.file("device.sqlite"))
        let context = try store.register(LogContext(host: "kitchen-oven-0042", os: "Linux", app: "oven-control", appVersion: "2.4.1", process: "ovend"))
        try log(store, context, 1...5)  // before the tail: never sent
        let accepted = try accepted()
        var link = Link(
            agent: try TailRunner(accepted, agentID: agentID, startCursor: UInt64(try store.lastRowID())),
            server: try TailStream(tailID: tailID, agentID: agentID, uid: "u-1", key: tailKey, expiresAt: accepted.expiresAt))
        #expect(try link.agent.poll(store: store, now: 0).isEmpty, "nothing before the server says what it holds")
        link.accept()
        try log(store, context, 6...305)
        try link.pump(store)
        #expect(link.received == (6...305).map { "w\($0)" })
        #expect(link.server.held.seq == 2, "300 records: a full batch and the rest")

        // Frames lost with a connection: the agent accepts again and goes on from what the
        // server holds, reading the lost records again from its store.
        try log(store, context, 306...705)
        try link.pump(store, lose: [4])
        let before = link.received.count
        #expect(before < (6...705).count)
        link.accept()
        try link.pump(store)
        #expect(link.received == (6...705).map { "w\($0)" }, "each once, in order")

        // The agent restarts: a new runner, which knows nothing but the store, goes on after
        // what the server holds, numbering on.
        let held = link.server.held
        link.agent = try TailRunner(accepted, agentID: agentID, startCursor: UInt64(try store.lastRowID()))
        try log(store, context, 706...720)
        link.accept()
        try link.pump(store)
        #expect(link.received == (6...720).map { "w\($0)" })
        let last = try store.lastRowID()
        #expect(link.server.held.seq > held.seq && link.server.held.cursor == UInt64(last - 2), "the cursor is the last match's: w720, before i720 and x720")
    }
}
