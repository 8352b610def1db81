import Foundation

/// The log types, hosts and apps the server's records have: what a filter's values are checked
/// against, so a typo is told (`no record has type "netwrok"; known: business, network,
/// player`) instead of matching nothing in silence. `GET /v1/records/vocabulary` answers it.
///
/// Types are those of every record indexed so far (a removed pull's stay known); hosts are the
/// registered devices' names and, for records indexed before devices were registered, their
/// contexts'; apps are the records' contexts'. Each list is sorted and at most
/// ``maximumListed`` long (`more` is then true).
public struct RecordVocabulary: Sendable, Equatable, Codable {
    public var types: [String]
    public var hosts: [String]
    public var apps: [String]
    /// Some list was cut at ``maximumListed``: a value not in it may still be known.
    public var more: Bool

    public static let maximumListed = 1000

    public init(types: [String] = [], hosts: [String] = [], apps: [String] = [], more: Bool = false) {
        self.types = types
        self.hosts = hosts
        self.apps = apps
        self.more = more
    }

    /// One filter value nothing has, with the known values nearest to it.
    public struct Unknown: Sendable, Equatable, CustomStringConvertible {
        /// `type`, `host` or `app`.
        public var field: String
        public var value: String
        /// The nearest known values first, at most ``shown``.
        public var nearest: [String]
        /// How many known values there are in all.
        public var known: Int

        public static let shown = 8

        /// `no record has type "netwrok"; known: "network", "business", "player"` (nearest first).
        public var description: String { described(subject: "no record") }

        /// As ``description``, with another subject (`no record pulled so far`).
        public func described(subject: String) -> String {
            let listed = nearest.map { "\"\($0)\"" }.joined(separator: ", ")
            let rest = known > nearest.count ? " (and \(known - nearest.count) more)" : ""
            return "\(subject) has \(field) \"\(value)\"" + (nearest.isEmpty ? "" : "; known: \(listed)\(rest)")
        }
    }

    /// The values of `search`'s types, hosts and apps that no record has. Nothing when the
    /// lists are cut (``more``) or hold nothing of that kind yet: then no value can be called
    /// unknown.
    public func unknown(types wantedTypes: [String]?, hosts wantedHosts: [String]?, apps wantedApps: [String]?) -> [Unknown] {
        guard !more else { return [] }
        var found: [Unknown] = []
        for (field, wanted, known) in [("type", wantedTypes, types), ("host", wantedHosts, hosts), ("app", wantedApps, apps)] where !known.isEmpty {
            let set = Set(known)
            for value in wanted ?? [] where !set.contains(value) {
                found.append(Unknown(field: field, value: value, nearest: Self.nearest(value, in: known), known: known.count))
            }
        }
        return found
    }

    public func unknown(in search: RecordSearch) -> [Unknown] { unknown(types: search.types, hosts: search.hosts, apps: search.apps) }

    /// The known values nearest `value` by edit distance (case ignored), ties in order.
    static func nearest(_ value: String, in known: [String]) -> [String] {
        let target = Array(value.lowercased())
        let ranked = known.enumerated().map { (distance: editDistance(target, Array($0.element.lowercased())), index: $0.offset, value: $0.element) }
        return ranked.sorted { ($0.distance, $0.index) < ($1.distance, $1.index) }.prefix(Unknown.shown).map(\.value)
    }

    /// Levenshtein distance, with a transposition counted once (`netwrok` is 1 from `network`).
    static func editDistance(_ a: [Character], _ b: [Character]) -> Int {
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var before = [Int](repeating: 0, count: b.count + 1)
        var previous = Array(0...b.count)
        var current = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            current[0] = i
            for j in 1...b.count {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] { current[j] = min(current[j], before[j - 2] + 1) }
            }
            (before, previous, current) = (previous, current, before)
        }
        return previous[b.count]
    }
}
