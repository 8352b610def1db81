import DredgeAdminAPI
import DredgeTestSupport
import Foundation
import NIOCore
import NIOPosix
import Testing
@testable import DredgeServer

/// #49, as the probe found it: with the server at a 1,024-descriptor limit, 1,124 TCP
/// connections to the admin port that never start TLS took everything down (`/health` timed
/// out, agents could not enroll or reconnect, nothing was logged). The real `dredge-server`
/// under that limit and the real agent; the connections come from 40 loopback addresses, so the
/// total cap and its room-making are met (the per-address cap is tested in process).
@Suite struct AdminFloodEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    @Test func aFloodOfAdminConnectionsAtTheOpenFileLimitLeavesEngineersAndAgentsServed() async throws {
        let d = try Deployment()
        let (server, port) = try d.startServer(openFiles: 1024)
        defer { server.stop() }
        let admin = try d.adminAddress(server)
        let adminPort = try #require(Int(admin.split(separator: ":").last ?? ""))
        #expect(server.output.contains("limit=1024"), "\(server.output.prefix(400))")

        var flood: [any Channel] = []
        defer { for channel in flood { channel.close(promise: nil) } }
        for n in 0..<1_124 {
            let source = "127.0.0.\(2 + n % 40)"
            let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .bind(to: try SocketAddress(ipAddress: source, port: 0))
                .connect(host: "127.0.0.1", port: adminPort).get()
            flood.append(channel)
        }
        // An engineer is answered, an agent enrolls, connects and reports its user.
        #expect(try await d.adminClient(server).agents().isEmpty)
        let (agent, _, _) = try d.runDevice(port: port)
        defer { agent.stop() }
        #expect(try await d.adminClient(server).agents().first?.connected == true)
        // The admin listener kept to its cap (28 from each address is under the per-address
        // cap: the total made room, closing the oldest), and said so with the addresses.
        #expect(flood.filter(\.isActive).count <= AdminConnectionLimits.default.maxConnections)
        let said = server.output.split(separator: "\n").filter { $0.contains("closing the oldest idle admin connection to make room") }
        #expect(!said.isEmpty && said.count <= 10 && said.allSatisfy { $0.contains("remote=127.0.0.") }, "\(server.output.suffix(2000))")
    }
}
