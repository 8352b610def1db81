import Foundation

/// One benchmark result line: `figure: NAME value=V UNIT limit=L ratio=R [extra]`.
/// For rates the ratio is value ÷ limit; for latencies limit ÷ value, so bigger is better.
struct Figure {
    var name: String
    var value: Double
    var unit: String
    var limit: Double
    var higherIsBetter: Bool
    var extra: String = ""

    var ratio: Double { higherIsBetter ? value / limit : limit / value }

    var line: String {
        "figure: \(name) value=\(Self.format(value)) \(unit) limit=\(Self.format(limit)) ratio=\(String(format: "%.2f", ratio))\(extra.isEmpty ? "" : " " + extra)"
    }

    static func format(_ v: Double) -> String {
        if v >= 100 { return String(format: "%.0f", v) }
        if v >= 1 { return String(format: "%.2f", v) }
        return String(format: "%.4f", v)
    }
}

/// Monotonic time in nanoseconds.
@inline(__always)
func monotonicNanos() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

func seconds(_ body: () throws -> Void) rethrows -> Double {
    let start = monotonicNanos()
    try body()
    return Double(monotonicNanos() - start) / 1e9
}

func median(_ values: [Double]) -> Double {
    let s = values.sorted()
    return s[s.count / 2]
}

func note(_ message: String) {
    FileHandle.standardError.write(Data("# \(message)\n".utf8))
}

func fileSize(_ path: String) -> Int64 {
    ((try? FileManager.default.attributesOfItem(atPath: path)[.size]) as? NSNumber)?.int64Value ?? 0
}

/// The machine's CPU time so far, from `/proc/stat` (Linux; zeros elsewhere): on a virtual
/// machine, `steal` is the time its CPUs were ready to run and the host ran something else.
struct CPUTimes {
    var steal: Double = 0
    var total: Double = 0

    static func now() -> CPUTimes {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),  // not Linux: no figure
            let line = stat.split(separator: "\n").first(where: { $0.hasPrefix("cpu ") })
        else { return CPUTimes() }
        // user nice system idle iowait irq softirq steal guest guest_nice (guest is in user)
        let fields = line.split(separator: " ").dropFirst().prefix(8).compactMap { Double($0) }
        guard fields.count == 8 else { return CPUTimes() }
        return CPUTimes(steal: fields[7], total: fields.reduce(0, +))
    }

    /// The share of CPU time stolen by the host since `earlier`, percent.
    func stealPercent(since earlier: CPUTimes) -> Double {
        let total = self.total - earlier.total
        return total > 0 ? 100 * (steal - earlier.steal) / total : 0
    }
}
