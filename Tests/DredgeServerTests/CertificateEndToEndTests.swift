import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// `dredge-server certificate` on a real deployment, and a real agent following a renewed
/// certificate without re-enrolling (#56). The renewal itself, its crash points and the
/// listeners' hand-over are tested in process (``CertificateRenewalTests``).
@Suite struct CertificateEndToEndTests {
    typealias Deployment = AgentServerEndToEndTests.Deployment

    @Test func aRenewedCertificateIsFollowedByARunningAgentAcrossARestart() throws {
        let d = try Deployment()
        var (server, port) = try d.startServer()
        defer { server.stop() }
        let (agent, _, _) = try d.runDevice(port: port)
        defer { agent.stop() }

        let (shown, before) = try ManagedProcess.run("dredge-server", ["certificate", "show", "--data", d.data])
        #expect(shown == 0 && before.contains("names:        localhost, 127.0.0.1") && before.contains("days left"), "\(before)")
        let old = try #require(before.firstMatch(of: /fingerprint: +(sha256:[0-9a-f]{64})/).map { String($0.1) })
        // Not due: left alone unless forced.
        let (kept, keptSaid) = try ManagedProcess.run("dredge-server", ["certificate", "renew", "--data", d.data])
        #expect(kept == 0 && keptSaid.contains("not renewed"), "\(keptSaid)")
        let (renewed, said) = try ManagedProcess.run("dredge-server", ["certificate", "renew", "--data", d.data, "--force"])
        #expect(renewed == 0 && said.contains("renewed: valid until"), "\(said)")
        let new = try #require(said.firstMatch(of: /fingerprint (sha256:[0-9a-f]{64})/).map { String($0.1) })
        #expect(new != old)

        // The server restarts on the same port with the new certificate; the agent, which
        // pinned the CA at enrollment, reconnects by itself.
        #expect(server.stop() == 0)
        server = try ManagedProcess(
            "dredge-server", ["run", "--data", d.data, "--agent-port", String(port), "--admin-port", "0", "--heartbeat-seconds", "1"],
            outputPath: d.dir.file("restarted.log"))
        #expect(try ManagedProcess.waitFor(timeout: .seconds(120)) { try d.agents().contains { ($0["connected"] as? Bool) == true } }, "\(agent.output.suffix(2000))")
        #expect(server.output.contains("fingerprint=\(new)"), "\(server.output.suffix(2000))")
        #expect(try CertificateRenewalTests.presented(port: port) == new)
    }

    /// A key written by another user is one the server cannot read: the command refuses.
    @Test(.enabled(if: geteuid() == 0, "needs root to give the data directory to another user"))
    func renewingAsAnotherUserIsRefused() throws {
        let d = try Deployment()
        let before = InProcessServer.snapshot(d.data)
        #expect(chown(d.data, 65_534, 65_534) == 0)
        defer { chown(d.data, 0, 0) }
        let (status, said) = try ManagedProcess.run("dredge-server", ["certificate", "renew", "--data", d.data, "--force"])
        #expect(status != 0 && said.contains("run this as the data directory's owner (uid 65534"), "\(said)")
        #expect(InProcessServer.snapshot(d.data) == before)
    }
}
