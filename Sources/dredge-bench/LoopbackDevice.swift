import ArgumentParser
import DredgeAdminClient
import DredgeLogging
import DredgeServer
import Foundation

/// A server and one device on loopback, as real processes: a `dredge-server` (SQLite,
/// heartbeats every second), a `dredge-agent` enrolled and running on a device store, and this
/// process as the app (``center``, logging as `uid`) and the engineer (``admin``), so both ends
/// read one clock. Ready once the server sees the agent hold `uid`. The live tail and trigger
/// benches run on it; ``stop()`` ends both processes and removes the directory.
final class LoopbackDevice {
    let dir: String
    let created: ServerDeployment.Created
    let server: ServerProcess
    let center: LogCenter
    let logger: DredgeLogger
    let agent: Process
    let admin: AdminClient

    /// `name`: the bench's, in the scratch directory's name.
    init(name: String, uid: String) async throws {
        dir = NSTemporaryDirectory() + "dredge-bench-\(name)-\(getpid())"
        try? FileManager.default.removeItem(atPath: dir)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        created = try ServerDeployment.initialize(.init(dataDirectory: dir + "/server"))
        server = try ServerProcess(data: dir + "/server", log: dir + "/server.log", heartbeatSeconds: 1)
        let storePath = dir + "/device.sqlite"
        center = try LogCenter(path: storePath)
        center.setUser(uid)
        logger = center.logger(type: .app)
        logger.warning("the device holds the user")
        try await center.flush()

        let state = dir + "/agent"
        let enroll = Process()
        enroll.executableURL = URL(fileURLWithPath: sibling("dredge-agent"))
        enroll.arguments = ["enroll", "--state", state, "--server", "127.0.0.1:\(server.agentPort)", "--ca", created.caPath, "--token", created.enrollmentToken]
        enroll.standardOutput = FileHandle.nullDevice
        enroll.standardError = FileHandle.nullDevice
        try enroll.run()
        enroll.waitUntilExit()
        guard enroll.terminationStatus == 0 else { throw ValidationError("dredge-agent enroll failed") }
        agent = Process()
        agent.executableURL = URL(fileURLWithPath: sibling("dredge-agent"))
        agent.arguments = ["run", "--state", state, "--store", storePath]
        agent.standardOutput = FileHandle.nullDevice
        guard FileManager.default.createFile(atPath: dir + "/agent.log", contents: nil) else { throw ValidationError("cannot write \(dir)/agent.log") }
        agent.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: dir + "/agent.log"))
        try agent.run()
        admin = try server.admin(token: created.adminToken)
        var holding = false
        for _ in 0..<600 where !holding {
            holding = try await admin.agents().contains { $0.connected && $0.activeUIDs.contains(uid) }
            if !holding { try await Task.sleep(for: .milliseconds(100)) }
        }
        guard holding else { throw ValidationError("the agent never reported \(uid); see \(dir)/agent.log") }
    }

    /// Ends the agent and the server, closes the store and removes the directory.
    func stop() {
        agent.terminate()
        agent.waitUntilExit()
        server.stop()
        try? center.close()  // the directory goes next
        try? FileManager.default.removeItem(atPath: dir)
    }
}
