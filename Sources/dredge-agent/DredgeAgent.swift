import ArgumentParser
import DredgeCommandLine
import DredgeDomain

@main
struct DredgeAgent: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dredge-agent",
        abstract: "The Dredge agent: feeds and reads the local log store.",
        discussion: "The store path comes from --store, else $DREDGE_STORE, else ~/.local/state/dredge/logs.sqlite.",
        version: DredgeVersion.current,
        subcommands: [LogCommand.self, IngestCommand.self, QueryCommand.self, StatsCommand.self, EnrollCommand.self, RunAgentCommand.self, FeedbackCommand.self, ExportCommand.self, PolicyCommand.self, NetworkCommand.self])

    static func main() async {
        Mistyped.exitIfMistyped(Self.self)
        await main(nil)
    }
}
