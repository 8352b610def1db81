@testable import DredgeServer
import DredgeAdminAPI
import DredgeAdminClient
import DredgeAgentCore
import DredgeDomain
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing

/// `dredge agents revoke` (#56): a lost or stolen device, a decommissioned host. Its
/// connection ends at once, it may not authenticate again, pulls no longer reach it, what it
/// uploaded stays, and it is audited. The real server in process, an agent through the real
/// wire protocol; across the nodes of a cluster in ``ClusterEndToEndTests``.
@Suite struct AgentRevocationTests {
    @Test func aRevokedAgentIsClosedAtOnceRefusedAfterAndWhatItUploadedStays() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let lost = try await server.enrollAgent(hostname: "lost-laptop")
            let kept = try await server.enrollAgent(hostname: "kept")
            #expect(try await kept.connect { link in try await LinkAgent.heartbeatAcked(["u-2"], over: link) })

            let (pullID, goodbye) = try await lost.connect { link -> (String, String?) in
                #expect(try await LinkAgent.heartbeatAcked(["u-2"], over: link))
                // Something it uploaded before it was lost.
                _ = try await server.admin.createPull(PullRequest(uid: nil, agent: lost.agentID, filter: LogFilter(uid: "u-2")))
                let pullID = try await HostileAgentTests.completePull(lost, link: link, store: store, dir: server.dir)

                let revoked = try await server.admin.revokeAgent(lost.agentID, reason: "laptop stolen (SUP-7)")
                #expect(revoked.agentID == lost.agentID && revoked.revokedBy == "admin" && revoked.revokedAt != nil, "\(revoked)")
                // The server ends the connection at once (its Goodbye ends the link).
                do {
                    while try await link.next() != nil {}
                    return (pullID, "closed without a goodbye")
                } catch {
                    return (pullID, "\(error)")
                }
            }
            #expect(goodbye?.contains("the server closed the connection: goodbye") == true, "\(goodbye ?? "nothing")")
            #expect(server.logs.records.contains { $0.message == "closing a revoked agent's connection" && $0.metadata["agent.id"] == "\(lost.agentID)" })

            // It may not authenticate again: refused, with the reason, and counted.
            await #expect { try await lost.connect { _ in } } throws: { "\($0)".contains("this agent was revoked") }
            #expect(server.listener.metrics.registry.emitToString().contains("dredge_agent_connections_refused_total{cause=\"revoked\"} 1"))
            try await server.connectionsEnded()
            #expect(try await server.registry.agents().first { $0.agentID == lost.agentID }?.connected == false)
            // Counted as revoked, not again as a protocol error.
            #expect(server.listener.metrics.registry.emitToString().contains("dredge_agent_connections_refused_total{cause=\"protocol_error\"} 0"))

            // What it uploaded stays.
            let landed = try await server.admin.pull(pullID)
            #expect(landed.targets.first?.status == .complete)
            for file in landed.targets.flatMap(\.files) { #expect(FileManager.default.fileExists(atPath: file), "\(file)") }

            // Pulls no longer reach it: by uid, only the other agent; by its id, refused.
            let byUID = try await server.admin.createPull(PullRequest(uid: "u-2", agent: nil, filter: LogFilter(uid: "u-2")))
            #expect(byUID.targets.map(\.agentID) == [kept.agentID])
            await #expect { try await server.admin.createPull(PullRequest(uid: nil, agent: lost.agentID, filter: .all)) } throws: {
                "\($0)".contains("was revoked")
            }

            // Audited once with its reason; revoking again changes nothing and says since when.
            await #expect { try await server.admin.revokeAgent(lost.agentID, reason: nil) } throws: { "\($0)".contains("was revoked already") }
            await #expect { try await server.admin.revokeAgent(String(repeating: "0", count: 32), reason: nil) } throws: { "\($0)".contains("no agent") }
            await #expect { try await server.admin.revokeAgent("not-an-id", reason: nil) } throws: { "\($0)".contains("32 lowercase hex") }
            let entries = try await server.admin.audit(AuditQuery(action: AuditAction.agentRevoke.rawValue))
            #expect(entries.map(\.detail) == ["agent \(lost.agentID): laptop stolen (SUP-7)"] && entries.first?.actor == "admin")
            // The other agent is untouched.
            #expect(try await kept.connect { link in try await LinkAgent.heartbeatAcked(["u-2"], over: link) })
        }
    }
}
