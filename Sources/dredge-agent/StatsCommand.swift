import ArgumentParser
import DredgeCommandLine
import DredgeDomain
import DredgeStore

struct StatsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "stats", abstract: "Show what the store holds and what it lost.")

    @OptionGroup var store: StoreOptions

    func run() async throws {
        let logStore = try store.open(readOnly: true)
        let stats = try logStore.statistics()
        print("store:    \(logStore.path)")
        print("records:  \(stats.recordCount)")
        print("oldest:   \(stats.oldest?.rfc3339 ?? "-")")
        print("newest:   \(stats.newest?.rfc3339 ?? "-")")
        print("on disk:  \(stats.bytesOnDisk) bytes")
        if let retention = stats.retention {
            print("retention: \(retention.policy) (set \(retention.setAt.rfc3339) by \(Terminal.field(retention.setBy))\(retention.previous.map { "; it was \($0)" } ?? ""))")
        } else {
            print("retention: none recorded in the store: nothing is deleted by age or size until its app sets a policy (the agent applies none of its own)")
        }
        let losses = try logStore.losses()
        if losses.isEmpty { print("losses:   none") }
        for loss in losses {
            print("loss:     \(loss.count) records \(loss.first) .. \(loss.last) (\(loss.reason), noticed \(loss.recordedAt))")
        }
    }
}
