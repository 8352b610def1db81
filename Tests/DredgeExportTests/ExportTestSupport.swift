import DredgeDomain
import DredgeSamples
import DredgeStore
import DredgeTestSupport
import Foundation

let exportContext = LogContext(host: "kitchen-oven-0042", os: "Debian 12", app: "oven-control", appVersion: "2.4.1", process: "oven-control[812]")

/// A store with `count` sample records over the last `days` days, for `uids`.
func makeStore(in dir: TempDir, count: Int, days: Int = 3, uids: [String] = ["u-1", "u-2", "u-3"], seed: UInt64 = 7) throws -> LogStore {
    var config = StoreConfiguration()
    config.overflowPolicy = .block
    config.retention.maxAge = .seconds(30 * 86_400)
    let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
    let ctx = try store.register(exportContext)
    let now = Timestamp.now
    for e in SampleLogs(count: count, uids: uids, from: now.subtracting(.seconds(Int64(days) * 86_400)), to: now, context: ctx, seed: seed) {
        store.enqueue(e)
    }
    try store.flush()
    return store
}

/// The JSON lines the store itself produces for `filter`, grouped by UTC day.
func expectedDays(_ store: LogStore, _ filter: LogFilter) throws -> [String: String] {
    var days: [String: String] = [:]
    try store.forEachRecord(matching: filter) { r in days[r.timestamp.utcDay + ".jsonl", default: ""] += r.jsonLine + "\n" }
    return days
}

func contents(_ path: String) -> String { String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self) }
