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
        switch stats.retention {
        case .recorded(let retention):
            print("retention: \(retention.policy) (set \(retention.setAt.rfc3339) by \(Terminal.field(retention.setBy))\(retention.previous.map { "; it was \($0)" } ?? ""))")
        case .none:
            print("retention: none recorded in the store (it predates recorded policies): nothing is deleted by age until its app sets one; held under \(stats.sizeWithoutPolicy) bytes")
        case .unreadable(let why):
            print("retention: \(Terminal.field(why)): nothing is deleted by age until its app sets one again; held under \(stats.sizeWithoutPolicy) bytes")
        }
        let losses = try logStore.losses()
        if losses.isEmpty { print("losses:   none") }
        for loss in losses {
            print("loss:     \(loss.count) records \(loss.first) .. \(loss.last) (\(loss.reason), noticed \(loss.recordedAt))")
        }
    }
}
