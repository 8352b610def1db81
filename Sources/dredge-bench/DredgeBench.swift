import ArgumentParser
import DredgeDomain

@main
struct DredgeBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dredge-bench",
        abstract: "Dredge's benchmarks. Each prints `figure:` lines: a value, a limit measured in the same run on the same data, and their ratio (bigger is better).",
        version: DredgeVersion.current,
        subcommands: [StoreBench.self, ExportBench.self, SearchBench.self, JSONBench.self, ServerBench.self, HeartbeatBench.self, SlowLorisBench.self, UnauthenticatedBench.self, NetworkBench.self, PresenceBench.self, ClusterBench.self, TailBench.self, TriggerBench.self, PolitenessBench.self, ExportRSSChild.self, FleetChild.self])
}
