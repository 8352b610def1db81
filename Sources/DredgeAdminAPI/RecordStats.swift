import DredgeDomain

/// How many records a search matches and how they spread: per level, per host, and over time by
/// level (``buckets``), as `POST /v1/records/stats` answers and the console's viewer shows above
/// its list. Counted in time order up to ``maximumCounted``: beyond, ``complete`` is false, the
/// figures are those of the first ``maximumCounted`` records, and ``countedUntil`` says how far
/// in time they reach.
public struct RecordStats: Sendable, Equatable, Codable {
    /// The records counted: all that match when ``complete``, else a lower bound.
    public var total: Int
    public var complete: Bool
    /// Records per level name, and per host as the records are shown (the registered device).
    public var levels: [String: Int]
    public var hosts: [String: Int]
    /// The time the buckets cover, `[from, to)`: the search's own range where it gives one,
    /// else from the first record counted to just after the last; nil when nothing matched.
    public var from: Timestamp?
    public var to: Timestamp?
    /// Equal spans of ``bucketMicroseconds`` from ``from``, each with its records per level.
    public var bucketMicroseconds: Int64
    public var buckets: [[String: Int]]
    /// When not ``complete``: the time of the last record counted.
    public var countedUntil: Timestamp?

    public static let maximumCounted = 100_000
    /// How many spans the time is cut into.
    public static let bucketCount = 60

    public init(
        total: Int = 0, complete: Bool = true, levels: [String: Int] = [:], hosts: [String: Int] = [:], from: Timestamp? = nil, to: Timestamp? = nil,
        bucketMicroseconds: Int64 = 0, buckets: [[String: Int]] = [], countedUntil: Timestamp? = nil
    ) {
        self.total = total
        self.complete = complete
        self.levels = levels
        self.hosts = hosts
        self.from = from
        self.to = to
        self.bucketMicroseconds = bucketMicroseconds
        self.buckets = buckets
        self.countedUntil = countedUntil
    }

    /// The search stats are counted for: its filters alone (no cursor, no page size).
    public static func counted(_ search: RecordSearch) -> RecordSearch {
        var counted = search
        (counted.after, counted.before, counted.arrivedAfter, counted.limit) = (nil, nil, nil, nil)
        return counted
    }

    /// The time span the buckets cover and their width, for a search and the first and last
    /// time among the records counted; both back ends ask it, then group their rows by
    /// `(ts - from) / width` themselves.
    public struct Span: Sendable, Equatable {
        public let from: Int64
        public let to: Int64
        public let width: Int64
        public var count: Int { Int((to - from + width - 1) / width) }

        /// `over`: the count stopped at the bound, so the span ends just after the last counted.
        public init(_ search: RecordSearch, first: Int64, last: Int64, over: Bool) {
            from = search.since?.microseconds ?? first
            // The search's end, unless the count stopped before it: then just after the last counted.
            let (after, overflow) = last.addingReportingOverflow(1)
            to = max((over ? nil : search.until?.microseconds) ?? (overflow ? last : after), from + 1)
            let buckets = Int64(RecordStats.bucketCount)
            let span = to - from
            width = max(1, span / buckets + (span % buckets == 0 ? 0 : 1))
        }
    }

    /// The figures from what a back end counted over the first ``maximumCounted`` records in
    /// time order (`over`: more matched): the first and last time, records per bucket and level
    /// (level numbers), per host.
    public static func make(
        _ search: RecordSearch, over: Bool, first: Int64?, last: Int64?, buckets rows: [(bucket: Int64, level: Int, count: Int)], hosts: [String: Int]
    ) -> RecordStats {
        func name(_ level: Int) -> String { LogLevel(rawValue: level)?.name ?? "\(level)" }
        var levels: [String: Int] = [:]
        for row in rows { levels[name(row.level), default: 0] += row.count }
        var stats = RecordStats(total: levels.values.reduce(0, +), complete: !over, levels: levels, hosts: hosts)
        guard let first, let last else { return stats }
        if over { stats.countedUntil = Timestamp(microseconds: last) }
        let span = Span(search, first: first, last: last, over: over)
        var buckets = [[String: Int]](repeating: [:], count: span.count)
        for row in rows where buckets.indices.contains(Int(row.bucket)) { buckets[Int(row.bucket)][name(row.level), default: 0] += row.count }
        (stats.from, stats.to, stats.bucketMicroseconds, stats.buckets) = (Timestamp(microseconds: span.from), Timestamp(microseconds: span.to), span.width, buckets)
        return stats
    }
}
