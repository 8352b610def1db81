import DredgeAdminAPI
import DredgeDomain
import DredgePayload
import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// Two real `dredge-server` nodes on one PostgreSQL database and one data directory, and a
/// real `dredge-agent` that knows both: a pull issued on one node reaches the agent on the
/// other, and when the agent's node is killed mid-upload the agent moves to the first node,
/// where the upload resumes from the chunks the dead node stored and completes.
@Suite(.enabled(if: TestPostgres.url != nil, "needs DREDGE_TEST_POSTGRES (make test starts a cluster)"))
struct ClusterEndToEndTests {
    @Test func anUploadResumesOnAnotherNodeWhenItsNodeIsKilled() throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: .postgres)
        let (nodeA, portA) = try d.startServer()
        defer { nodeA.stop() }
        let (nodeB, portB) = try d.startServer()
        defer { nodeB.stop() }
        let state = d.dir.file("agent"), store = d.dir.file("device.sqlite")
        try FaultyNetworkTests.makeLargeStore(store)
        #expect(try d.enroll(state: state, port: portB).0 == 0)
        // Node B first, through a proxy that cuts the connection now and then (the upload takes
        // several connections, long enough to kill B in the middle of it); node A second,
        // through a proxy that counts what the agent sends it.
        let proxy = try CuttingProxy(targetPort: portB, cutAfter: 300_000...1_200_000)
        let viaA = try CuttingProxy(targetPort: portA, cutAfter: nil)
        let agent = try ManagedProcess(
            "dredge-agent",
            ["run", "--state", state, "--store", store, "--reconnect-max-seconds", "1", "--server", "localhost:\(proxy.port),localhost:\(viaA.port)"],
            outputPath: d.dir.file("agent.log"))
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["connected"] as? Bool) == true && ($0["activeUIDs"] as? [String]) == ["u-1"] } }, "agent:\n\(agent.output)")
        let agentID = try #require(try d.agents().first?["agentID"] as? String)

        // Issued on node A's admin API; the agent is held by node B.
        let (status, output) = try d.dredge(["pull", "--uid", "u-1", "--json"], server: try d.adminAddress(nodeA))
        #expect(status == 0, "\(output)")
        let pull = try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])
        let id = try #require(pull["id"] as? String)
        let midway = try ManagedProcess.waitFor(timeout: .seconds(120)) {
            guard let t = try d.pullTarget(id), let received = t["chunksReceived"] as? Int, let count = t["chunkCount"] as? Int else { return false }
            return received > 2 && received < count
        }
        #expect(midway, "agent:\n\(agent.output)\nnode B:\n\(nodeB.output)")
        let heldByB = try #require(try d.pullTarget(id)?["chunksReceived"] as? Int)
        #expect(viaA.forwarded.withLockedValue { $0 } == 0, "the agent was on node B until now")
        #expect(nodeB.stop(SIGKILL) != 0)

        // The agent moves to node A, which resumes the upload from what B stored.
        #expect(try ManagedProcess.waitFor(timeout: .seconds(180)) { try d.pullTarget(id)?["status"] as? String == "complete" }, "agent:\n\(agent.output)\nnode A:\n\(nodeA.output)")
        #expect(try d.agents().first?["connected"] as? Bool == true, "present through node A's lease")
        let target = try #require(try d.pullTarget(id))
        let count = try #require(target["chunkCount"] as? Int), size = try #require(target["bytes"] as? Int)
        #expect(target["chunksReceived"] as? Int == count)
        // Resumed, not begun again: node A was sent at most the chunks B had not stored (and
        // one chunk more: the last one's size, the chunks' tags and frames), plus a
        // connection's handshakes and heartbeats (64 KB). Sent again from the start, it would
        // be at least the whole upload (`bytes`: its size before encryption).
        let toA = viaA.forwarded.withLockedValue { $0 }
        #expect(heldByB >= 3 && toA < size / count * (count - heldByB + 1) + 64 * 1024, "\(toA) bytes to A; \(heldByB) of \(count) chunks held by B; \(size) bytes")
        let dir = d.data + "/pulls/\(id)/\(agentID)"
        try PullEndToEndTests.expectLanded(dir, store: store, filter: LogFilter(uid: "u-1"))
        // The node that finished it indexed it: all of it searchable through node A.
        let adminA = try d.adminAddress(nodeA)
        #expect(try ManagedProcess.waitFor(timeout: .seconds(120)) {
            let found = try d.dredge(["logs", "--pull", id, "--limit", "0", "--format", "jsonl"], server: adminA)
            return found.status == 0 && found.output.split(separator: "\n").count == 40_000
        })
    }

    /// `dredge agents revoke` on node A closes the agent's connection on node B at once (the
    /// database's notification), and neither node lets it back in.
    @Test func anAgentRevokedOnOneNodeIsClosedOnTheOther() throws {
        let d = try AgentServerEndToEndTests.Deployment(backend: .postgres)
        let (nodeA, portA) = try d.startServer()
        defer { nodeA.stop() }
        let (nodeB, portB) = try d.startServer()
        defer { nodeB.stop() }
        let state = d.dir.file("agent"), store = d.dir.file("device.sqlite")
        try PullEndToEndTests.makeDeviceStore(store)
        #expect(try d.enroll(state: state, port: portB).0 == 0)
        let agent = try ManagedProcess(
            "dredge-agent", ["run", "--state", state, "--store", store, "--reconnect-max-seconds", "1", "--server", "localhost:\(portB),localhost:\(portA)"],
            outputPath: d.dir.file("agent.log"))
        defer { agent.stop() }
        #expect(try ManagedProcess.waitFor { try d.agents().contains { ($0["connected"] as? Bool) == true } }, "agent:\n\(agent.output)")
        let agentID = try #require(try d.agents().first?["agentID"] as? String)

        let (status, output) = try d.dredge(["agents", "revoke", agentID, "--reason", "stolen"], server: try d.adminAddress(nodeA))
        #expect(status == 0, "\(output)")
        #expect(output.contains("REVOKED") && output.contains("revoked agent \(agentID)"), "\(output)")
        // Node B, which holds the connection, closes it; the agent, trying both nodes every
        // second, is refused by each.
        #expect(try ManagedProcess.waitFor(timeout: .seconds(60)) { nodeB.output.contains("closing a revoked agent's connection") }, "node B:\n\(nodeB.output)")
        #expect(try ManagedProcess.waitFor(timeout: .seconds(60)) {
            let offline = try d.agents().first?["connected"] as? Bool == false
            return offline && nodeA.output.contains("agent refused: revoked")
        }, "node A:\n\(nodeA.output)\nagent:\n\(agent.output)")
        #expect(agent.output.contains("this agent was revoked"), "\(agent.output)")
        let (listed, list) = try d.dredge(["agents"], server: try d.adminAddress(nodeB))
        #expect(listed == 0 && list.contains("REVOKED") && list.contains("by admin"), "\(list)")
    }
}
