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
