import ArgumentParser
import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeServer
import DredgeWire
import Foundation
import Synchronization
import FoundationNetworking

/// `dredge-bench slowloris`: `server.slow_loris`, the time to serve an engineer and an enrolled
/// agent while one address holds every unauthenticated connection it may (and keeps trying for
/// more): the admin API's `/health`, then the agent connecting (TLS, Hello, authentication), a
/// pull created and its command arriving. The limit is the same sequence in the same run with
/// no such connections.
struct SlowLorisBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "slowloris", abstract: "Serving agents and the admin API while one address holds its connection cap.")

    @Option(help: "Rounds of the timed sequence in each phase (the median is reported).")
    var rounds = 15

    func run() async throws {
        let dir = NSTemporaryDirectory() + "dredge-bench-slowloris-\(getpid())"
        try? FileManager.default.removeItem(atPath: dir)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let created = try ServerDeployment.initialize(.init(dataDirectory: dir + "/server"))
        let server = try ServerProcess(data: dir + "/server", log: dir + "/server.log")
        defer { server.stop() }
        let admin = try server.admin(token: created.adminToken)
        let tls = try AgentLink.tlsContext(caPEM: String(contentsOfFile: created.caPath, encoding: .utf8))
        let key = try RSAPrivateKey.generate()
        let agentID = try await AgentEnrollment.register(
            host: "127.0.0.1", port: server.agentPort, tls: tls, token: created.enrollmentToken, key: key, hostInfo: .with { $0.hostname = "bench-agent" })

        /// Milliseconds for: admin `/health`, the agent connecting and authenticating, a pull
        /// created through the admin API and its command arriving.
        func serve() async throws -> Double {
            let start = monotonicNanos()
            try await admin.health()
            let delivered = try await AgentLink.withConnection(host: "127.0.0.1", port: server.agentPort, tls: tls, agentID: agentID, key: key) { link -> Bool in
                let pull = try await admin.createPull(PullRequest(uid: nil, agent: agentID, filter: .all))
                while let frame = try await link.next() {
                    if case .pullCommand(let command)? = frame.body, command.commandID == pull.id {
                        try await link.send(.with { $0.commandRejected = .with { $0.commandID = command.commandID; $0.reason = .rejectBusy } })
                        return true
                    }
                }
                return false
            }
            guard delivered else { throw ValidationError("the pull's command did not arrive") }
            return Double(monotonicNanos() - start) / 1e6
        }
        func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

        _ = try await serve()  // warm up (first TLS contexts, first database pages)
        var quiet: [Double] = []
        for _ in 0..<rounds { quiet.append(try await serve()) }

        // The attacker: plain TCP connections from 127.0.0.2 that never send a byte, opened again
        // as the server closes them (over the address's cap at once, the rest at the handshake
        // deadline), from a thread of its own.
        let attacker = Attacker(port: server.agentPort)
        attacker.start()
        try await Task.sleep(for: .seconds(1))
        var attacked: [Double] = []
        for _ in 0..<rounds { attacked.append(try await serve()) }
        let opened = attacker.stop()

        print(Figure(
            name: "server.slow_loris", value: median(attacked), unit: "ms", limit: median(quiet), higherIsBetter: false,
            extra: String(format: "slowdown=%.2f max=%.1f quiet_max=%.1f attacker_connections=%d rounds=%d",
                median(attacked) / median(quiet), attacked.max() ?? .nan, quiet.max() ?? .nan, opened, rounds)).line)
    }
}

/// Opens silent TCP connections to `port` from 127.0.0.2 as fast as the server lets it keep
/// them: it keeps up to `target` open, replacing each one the server closes.
final class Attacker: Sendable {
    let port: Int
    let target: Int
    private let state = Mutex((running: true, started: false, opened: 0))
    private let finished = DispatchSemaphore(value: 0)

    init(port: Int, target: Int = 256) {
        self.port = port
        self.target = target
    }

    func start() {
        state.withLock { $0.started = true }
        Thread { [self] in
            loop()
            finished.signal()
        }.start()
    }

    private var isRunning: Bool { state.withLock { $0.running } }

    /// The attacker's thread: its sockets are its own, closed when it ends.
    private func loop() {
        var sockets: [Int32] = []
        defer { for fd in sockets { close(fd) } }
        while isRunning {
            // Drop the sockets the server closed (a read of 0 bytes, without blocking).
            sockets.removeAll { fd in
                var byte: UInt8 = 0
                let n = recv(fd, &byte, 1, Int32(MSG_DONTWAIT))
                if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                    close(fd)
                    return true
                }
                return false
            }
            while sockets.count < target, isRunning, let fd = connectSilently() {
                sockets.append(fd)
                state.withLock { $0.opened += 1 }
            }
            usleep(20_000)
        }
    }

    private func connectSilently() -> Int32? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        // From an address of its own (all of 127/8 is loopback): the agent and the engineer
        // come from 127.0.0.1.
        guard Self.call(bind, fd, "127.0.0.2", port: 0) == 0, Self.call(connect, fd, "127.0.0.1", port: port) == 0 else {
            close(fd)
            return nil
        }
        return fd
    }

    /// `operation` (bind or connect) on `fd` with an IPv4 address and port.
    private static func call(
        _ operation: (Int32, UnsafePointer<sockaddr>, socklen_t) -> Int32, _ fd: Int32, _ ip: String, port: Int
    ) -> Int32 {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr(ip)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { operation(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
    }

    /// Stops and closes every connection (call after ``start()``); returns how many it opened in all.
    func stop() -> Int {
        let started = state.withLock {
            $0.running = false
            return $0.started
        }
        if started { finished.wait() }
        return state.withLock { $0.opened }
    }
}
