import ArgumentParser
import DredgeAgentCore
import DredgeEnvelope
import DredgeServer
import DredgeWire
import Foundation
import NIOSSL
import Synchronization

/// `dredge-bench fleet-child` (hidden): many simulated agents in one process, built from the
/// agent library (``AgentLink``). Enrolls its share of the keys, says `enrolled`, waits for
/// `connect` on stdin, connects and authenticates them all (64 at a time), says `ready`, then
/// heartbeats each at the server's interval and prints `pull ID MONOTONIC_NS` when a command
/// arrives (and refuses it as busy). With `--measure-heartbeats` each agent times its
/// heartbeats' round trips: `reset` on stdin forgets the times so far, `report` prints them
/// with when each heartbeat was sent (`rtt NS:MS,…`, `CLOCK_MONOTONIC`). Stops when stdin
/// closes.
struct FleetChild: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "fleet-child", shouldDisplay: false)

    @Option var keys: String
    @Option var from: Int
    @Option var count: Int
    @Option var port: Int
    @Option var ca: String
    @Option var token: String
    @Flag var measureHeartbeats = false

    /// Heartbeat round trips since the last `reset`: when each was sent (`CLOCK_MONOTONIC`, ns)
    /// and how long it took (ms).
    static let roundTrips = Mutex<[(sent: Int64, ms: Double)]>([])

    func run() async throws {
        ServerRuntime.raiseOpenFileLimit()
        let all = try Self.loadKeys(keys, from: from, count: count)
        let tls = try AgentLink.tlsContext(caPEM: String(contentsOfFile: ca, encoding: .utf8))
        let port = self.port, token = self.token

        // Enrollment, a few at a time.
        let ids = try await withThrowingTaskGroup(of: (Int, String).self) { group in
            var ids = [String](repeating: "", count: all.count)
            var next = 0
            func add() {
                let i = next
                next += 1
                group.addTask {
                    // The server counts enrollments in flight from one address against its
                    // refusal limit (10 a minute): when it says so, wait and enroll again.
                    var attempt = 0
                    while true {
                        do {
                            return (i, try await AgentEnrollment.register(host: "127.0.0.1", port: port, tls: tls, token: token, key: all[i], hostInfo: .with { $0.hostname = "fleet-\(i)" }))
                        } catch let error as AgentError where error.serverError == .errorLimitExceeded && attempt < 600 {
                            attempt += 1
                            try await Task.sleep(for: .milliseconds(200))
                        }
                    }
                }
            }
            // Fewer in flight than the server's limit, with two fleet processes.
            while next < min(4, all.count) { add() }
            while let (i, id) = try await group.next() {
                ids[i] = id
                if next < all.count { add() }
            }
            return ids
        }
        Self.say("enrolled \(ids.count)")
        await Self.waitForLine("connect")

        let connected = Counter()
        let failed = Counter()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                await Self.readCommands()
                throw CancellationError()
            }
            group.addTask {
                await withTaskGroup(of: Void.self) { agents in
                    for i in ids.indices {
                        while i - connected.value - failed.value >= 64 {
                            try? await Task.sleep(for: .milliseconds(5))
                        }
                        agents.addTask {
                            do {
                                try await Self.agent(id: ids[i], key: all[i], uid: "fleet-u-\(i)", port: port, tls: tls, connected: connected, measure: measureHeartbeats)
                            } catch {
                                if !Task.isCancelled { failed.add() }
                            }
                        }
                    }
                    while connected.value + failed.value < ids.count {
                        try? await Task.sleep(for: .milliseconds(20))
                    }
                    Self.say("ready \(connected.value) failed \(failed.value)")
                }
            }
            _ = try await group.next()
            group.cancelAll()
        }
    }

    static func agent(id: String, key: RSAPrivateKey, uid: String, port: Int, tls: NIOSSLContext, connected: Counter, measure: Bool) async throws {
        try await AgentLink.withConnection(host: "127.0.0.1", port: port, tls: tls, agentID: id, key: key) { link in
            connected.add()
            let interval = Double(max(1, link.session.heartbeatIntervalS))
            // When the heartbeat waiting for its ack was sent (one at a time per agent).
            let sentAt = SentAt()
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    // Spread the fleet's heartbeats over the interval.
                    try await Task.sleep(for: .seconds(Double.random(in: 0..<interval)))
                    while true {
                        sentAt.value.withLock { $0.append(monotonicNanos()) }
                        try await link.heartbeat(activeUIDs: [uid])
                        try await Task.sleep(for: .seconds(interval))
                    }
                }
                group.addTask {
                    while let frame = try await link.next() {
                        if measure, case .heartbeatAck? = frame.body, let sent = sentAt.value.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) {
                            let ms = Double(monotonicNanos() - sent) / 1e6
                            roundTrips.withLock { $0.append((sent, ms)) }
                        }
                        guard case .pullCommand(let command)? = frame.body else { continue }
                        say("pull \(command.commandID) \(monotonicNanos())")
                        try await link.send(.with {
                            $0.commandRejected = .with { $0.commandID = command.commandID; $0.reason = .rejectBusy; $0.detail = "simulated agent" }
                        })
                    }
                }
                _ = try await group.next()
                group.cancelAll()
            }
        }
    }

    /// Keys `from..<from+count` of a file of (u32 BE length, PKCS#8 DER) records.
    static func loadKeys(_ path: String, from: Int, count: Int) throws -> [RSAPrivateKey] {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        var keys: [RSAPrivateKey] = []
        var offset = data.startIndex
        var index = 0
        while offset + 4 <= data.endIndex && keys.count < count {
            let length = data[offset..<offset + 4].reduce(0) { $0 << 8 | Int($1) }
            let der = data[offset + 4..<offset + 4 + length]
            if index >= from { keys.append(try RSAPrivateKey(derRepresentation: der)) }
            offset += 4 + length
            index += 1
        }
        guard keys.count == count else { throw ValidationError("\(path) holds too few keys") }
        return keys
    }

    static let output = Mutex(())
    static func say(_ line: String) {
        output.withLock { _ in FileHandle.standardOutput.write(Data((line + "\n").utf8)) }
    }

    /// Reads stdin on its own thread (never on the cooperative pool) until `line` or EOF.
    static func waitForLine(_ line: String) async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread {
                while let read = readLine() { if read == line { break } }
                c.resume()
            }
        }
    }

    /// Reads `reset` and `report` lines on its own thread until EOF.
    static func readCommands() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread {
                while let line = readLine() {
                    switch line {
                    case "reset": roundTrips.withLock { $0.removeAll() }
                    case "report":
                        let all = roundTrips.withLock { $0 }
                        say("rtt " + all.map { "\($0.sent):" + String(format: "%.3f", $0.ms) }.joined(separator: ","))
                    default: break
                    }
                }
                c.resume()
            }
        }
    }
}

/// When an agent's heartbeats that wait for their acks were sent, oldest first.
final class SentAt: Sendable {
    let value = Mutex<[Int64]>([])
}

/// A thread-safe count.
final class Counter: Sendable {
    private let count = Mutex(0)
    var value: Int { count.withLock { $0 } }
    func add() { count.withLock { $0 += 1 } }
}
