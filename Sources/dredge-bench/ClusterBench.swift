import ArgumentParser
import DredgeAdminAPI
import DredgeDomain
import DredgeServer
import Foundation

/// `dredge-bench cluster`: `cluster.command_latency`, three real `dredge-server` nodes on one
/// PostgreSQL database and one data directory, a simulated fleet spread over them (one
/// `fleet-child` process per node); pulls made through node A's admin API, each timed until
/// the agent receives the command. The figure is the p99 of the pulls whose agent another node
/// holds (the command crosses `pg_notify`); the p99 of those whose agent node A holds is beside
/// it. The limit is the goal, 25 ms.
struct ClusterBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "cluster", abstract: "Command latency across the nodes of a cluster on PostgreSQL.")

    @OptionGroup var postgres: BenchDatabase

    @Option(help: "Agents in the fleet, spread over the nodes.")
    var agents = 3_000

    @Option(help: "Nodes.")
    var nodes = 3

    @Option(help: "Pulls timed.")
    var samples = 300

    @Option(help: "Where the fleet's keys are cached (made by scripts/bench-fleet-keys.py).")
    var keyCache = ".build/bench-fleet-keys"

    func run() async throws {
        let url = try postgres.url()
        let dir = NSTemporaryDirectory() + "dredge-bench-cluster-\(getpid())"
        try? FileManager.default.removeItem(atPath: dir)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let created = try await ServerBench.initialize(dir + "/server", database: url, schema: "bench_cluster_\(getpid())")
        try ServerBench.allowOneAddressFleet(dir + "/server")
        var servers: [ServerProcess] = []
        defer { for s in servers { s.stop() } }
        for n in 0..<nodes { servers.append(try ServerProcess(data: dir + "/server", log: dir + "/node-\(n).log")) }
        let admin = try servers[0].admin(token: created.adminToken)

        let keys = try ServerBench.fleetKeys(cache: keyCache, count: agents)
        let children = try FleetProcess.spawn(agents: agents, processes: nodes, keys: keys, ports: servers.map(\.agentPort), created: created)
        defer { for c in children { c.stop() } }
        FileHandle.standardError.write(Data("cluster: \(nodes) nodes; enrolling \(agents) agents\n".utf8))
        for c in children { try c.waitFor("enrolled", timeout: 1_800) }
        for c in children { c.send("connect") }
        for c in children { try c.waitFor("ready", timeout: 1_800) }
        try await Task.sleep(for: .seconds(5))
        let ids = try await admin.agents().filter(\.connected).map(\.agentID)
        guard ids.count == agents else { throw ValidationError("\(ids.count) of \(agents) agents read as connected") }

        var elsewhere: [Double] = [], here: [Double] = []
        for _ in 0..<samples {
            let target = ids.randomElement()!
            let start = monotonicNanos()
            let pull = try await admin.createPull(PullRequest(uid: nil, agent: target, filter: .all, expiresInSeconds: 60))
            var arrival: (child: Int, at: Int64)?
            let deadline = ContinuousClock.now + .seconds(10)
            while arrival == nil && ContinuousClock.now < deadline {
                for (n, c) in children.enumerated() { if let at = c.arrival(of: pull.id) { arrival = (n, at) } }
                if arrival == nil { try await Task.sleep(for: .milliseconds(1)) }
            }
            guard let arrival else { throw ValidationError("pull \(pull.id) never reached agent \(target)") }
            let ms = Double(arrival.at - start) / 1e6
            if arrival.child == 0 { here.append(ms) } else { elsewhere.append(ms) }
            try await Task.sleep(for: .milliseconds(20))
        }
        func percentile(_ values: [Double], _ p: Double) -> Double {
            guard !values.isEmpty else { return .nan }
            let sorted = values.sorted()
            return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
        }
        print(
            Figure(
                name: "cluster.command_latency", value: percentile(elsewhere, 0.99), unit: "ms", limit: 25, higherIsBetter: false,
                extra: String(
                    format: "p50=%.1f p99=%.1f same_node_p50=%.1f same_node_p99=%.1f nodes=%d agents=%d samples=%d/%d", percentile(elsewhere, 0.5),
                    percentile(elsewhere, 0.99), percentile(here, 0.5), percentile(here, 0.99), nodes, agents, elsewhere.count, here.count)
            ).line)
    }
}
