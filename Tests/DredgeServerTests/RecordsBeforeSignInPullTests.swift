import DredgeAdminAPI
import DredgeDomain
import DredgeLogging
import DredgeStore
import DredgeTestSupport
import Foundation
import Testing
@testable import DredgeServer

/// The app logs its launch and a failed sign-in, then the user signs in: a pull by their uid
/// brings those records too, marked, through the real exporter, wire and server.
@Suite struct RecordsBeforeSignInPullTests {
    @Test func aPullByUidBringsTheRecordsFromBeforeSignInMarked() async throws {
        // In a function of its own: as a closure, Swift 6.3.1's region checker crashes on it.
        try await withStopping(InProcessServer()) { server in try await Self.pullBeforeSignIn(on: server) }
    }

    static func pullBeforeSignIn(on server: InProcessServer) async throws {
        let store = server.dir.file("app.sqlite")
        do {
            let earlier = try LogCenter(path: store, context: LogContext(host: "h", os: "Linux", app: "oven", appVersion: "1", process: "oven[1]"))
            earlier.logger().error("an earlier run, nobody signed in")
            try earlier.close()
            let center = try LogCenter(path: store, context: LogContext(host: "h", os: "Linux", app: "oven", appVersion: "1", process: "oven[2]"))
            let log = center.logger()
            log.info("launch")
            log.warning("sign-in failed", metadata: ["reason": "wrong password"])
            center.setUser("u-7")
            log.info("home")
            try center.close()
        }

        let agent = try await server.enrollAgent()
        let pullID = try await agent.connect { link in
            _ = try await server.admin.createPull(PullRequest(uid: "u-7", agent: agent.agentID, filter: .all))
            return try await HostileAgentTests.completePull(agent, link: link, store: store, dir: server.dir)
        }
        let dir = server.data + "/pulls/\(pullID)/\(agent.agentID)"
        let files = try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".jsonl") }.sorted()
        let records = try files.flatMap { file in
            try contents(dir + "/" + file).split(separator: "\n").map { line in
                try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            }
        }
        #expect(records.map { $0["message"] as? String } == ["launch", "sign-in failed", "home"])
        #expect(records.allSatisfy { $0["uid"] as? String == "u-7" })
        let marked = records.map { (($0["metadata"] as? [String: Any])?[LogStore.beforeSignInKey] as? Bool) ?? false }
        #expect(marked == [true, true, false])
        #expect((records[1]["metadata"] as? [String: Any])?["reason"] as? String == "wrong password")
    }
}
