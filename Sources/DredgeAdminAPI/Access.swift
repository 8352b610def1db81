import Foundation

// Who may do what (#55): a role, and a scope of devices, for every admin token and console
// session. The server checks them in one place (`AdminOperation` on the server, the table of
// what each operation needs); these are the shapes both sides share.

/// What a caller may do, each role all that the one before it may.
public enum AdminRole: String, Codable, Sendable, CaseIterable, Comparable {
    /// Reads what was pulled already (agents, pulls, feedback, records, files), within its scope.
    case reader
    /// Also pulls (and later tails and defines triggers), within its scope.
    case investigator
    /// Everything: tokens, enrollment tokens, the audit log, revocation, removal. An admin has
    /// no scope.
    case admin

    public static func < (a: AdminRole, b: AdminRole) -> Bool { a.rank < b.rank }

    private var rank: Int {
        switch self {
        case .reader: 0
        case .investigator: 1
        case .admin: 2
        }
    }
}

/// The devices a caller may touch: those whose app is one of `apps` (and within its versions)
/// and whose labels hold every one of `labels`. Empty lists scope nothing out: the empty scope
/// is every device.
public struct AccessScope: Codable, Sendable, Equatable, Hashable, CustomStringConvertible {
    public var apps: [AppScope]
    /// Label name → value; a device must carry each.
    public var labels: [String: String]

    public init(apps: [AppScope] = [], labels: [String: String] = [:]) {
        self.apps = apps
        self.labels = labels
    }

    public static let everything = AccessScope()
    public var isEverything: Bool { apps.isEmpty && labels.isEmpty }

    /// Whether a device that reports `app` at `version` with `labels` is in this scope.
    public func admits(app: String, version: String, labels deviceLabels: [String: String]) -> Bool {
        guard apps.isEmpty || apps.contains(where: { $0.admits(app: app, version: version) }) else { return false }
        return labels.allSatisfy { deviceLabels[$0.key] == $0.value }
    }

    /// The app names a record may carry to be read (nil: any).
    public var appNames: Set<String>? { apps.isEmpty ? nil : Set(apps.map(\.name)) }

    /// As `dredge whoami` and the console print it: `everything`, or `app=oven-control@>=2.1 label region=eu`.
    public var description: String {
        if isEverything { return "everything" }
        return (apps.map { "app=\($0)" } + labels.sorted { $0.key < $1.key }.map { "label \($0.key)=\($0.value)" }).joined(separator: " ")
    }

    /// Why this scope cannot be kept, or nil: at most 32 apps and 32 labels, each well formed.
    public var problem: String? {
        if apps.count > 32 { return "a scope names at most 32 apps" }
        if labels.count > 32 { return "a scope names at most 32 labels" }
        for app in apps { if let problem = app.problem { return problem } }
        for (name, value) in labels {
            if name.isEmpty || name.utf8.count > 64 || value.utf8.count > 256 { return "a scope's label is NAME=VALUE, the name 1 to 64 bytes, the value up to 256" }
            if (name + value).unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) { return "a scope's label holds a control character" }
        }
        return nil
    }

    /// A scope from the words people write (a command's `--app` and `--label`, the console's
    /// form, an identity provider's claims): apps as `NAME` or `NAME@>=2.1,<3`, labels as
    /// `name=value`. Throws ``AccessScopeError`` naming the word that does not read, or what
    /// the scope breaks (``problem``).
    public init(apps: [String], labels: [String]) throws {
        self.init()
        for text in apps {
            guard let app = AppScope(parsing: text) else { throw AccessScopeError.app(text) }
            self.apps.append(app)
        }
        for text in labels {
            let parts = text.split(separator: "=", maxSplits: 1)
            guard parts.count == 2 else { throw AccessScopeError.label(text) }
            self.labels[String(parts[0])] = String(parts[1])
        }
        if let problem { throw AccessScopeError.problem(problem) }
    }

    enum CodingKeys: String, CodingKey { case apps, labels }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        apps = try c.decodeIfPresent([AppScope].self, forKey: .apps) ?? []
        labels = try c.decodeIfPresent([String: String].self, forKey: .labels) ?? [:]
    }
}

/// Why words do not make a scope (``AccessScope/init(apps:labels:)``).
public enum AccessScopeError: Error, Equatable, CustomStringConvertible {
    case app(String), label(String), problem(String)

    public var description: String {
        switch self {
        case .app(let text): "'\(text)' is not an app: NAME, or NAME@>=2.1,<3"
        case .label(let text): "'\(text)' is not a label: name=value"
        case .problem(let problem): problem
        }
    }
}

/// An app a scope admits: by name, and optionally a range of its versions, as
/// `oven-control`, `oven-control@>=2.1`, `oven-control@>=2.1,<3`. Versions compare part by part
/// (`2.10` after `2.9`; digits as numbers, other parts as text).
public struct AppScope: Codable, Sendable, Equatable, Hashable, CustomStringConvertible {
    public var name: String
    /// Each `OP VERSION`, all to hold: `>=`, `>`, `<=`, `<`, `=`.
    public var versions: [Bound]

    public struct Bound: Codable, Sendable, Equatable, Hashable {
        public enum Comparison: String, Codable, Sendable, CaseIterable { case atLeast = ">=", above = ">", atMost = "<=", below = "<", exactly = "=" }
        public var comparison: Comparison
        public var version: String

        public init(_ comparison: Comparison, _ version: String) {
            self.comparison = comparison
            self.version = version
        }

        func holds(for version: String) -> Bool {
            let order = AppScope.compare(version, self.version)
            switch comparison {
            case .atLeast: return order != .orderedAscending
            case .above: return order == .orderedDescending
            case .atMost: return order != .orderedDescending
            case .below: return order == .orderedAscending
            case .exactly: return order == .orderedSame
            }
        }
    }

    public init(name: String, versions: [Bound] = []) {
        self.name = name
        self.versions = versions
    }

    /// Reads `NAME` or `NAME@BOUND[,BOUND…]`; nil when it is not that.
    public init?(parsing text: String) {
        let parts = text.split(separator: "@", maxSplits: 1, omittingEmptySubsequences: false)
        let name = String(parts[0]).trimmingCharacters(in: .whitespaces)
        var bounds: [Bound] = []
        if parts.count == 2 {
            for clause in parts[1].split(separator: ",", omittingEmptySubsequences: false) {
                let clause = clause.trimmingCharacters(in: .whitespaces)
                // The longest operator first: `>=` before `>`.
                guard let comparison = [Bound.Comparison.atLeast, .atMost, .above, .below, .exactly].first(where: { clause.hasPrefix($0.rawValue) }) else { return nil }
                let version = clause.dropFirst(comparison.rawValue.count).trimmingCharacters(in: .whitespaces)
                guard !version.isEmpty else { return nil }
                bounds.append(Bound(comparison, version))
            }
        }
        self.init(name: name, versions: bounds)
        if problem != nil { return nil }
    }

    public var description: String {
        versions.isEmpty ? name : name + "@" + versions.map { $0.comparison.rawValue + $0.version }.joined(separator: ",")
    }

    var problem: String? {
        if name.isEmpty || name.utf8.count > 128 { return "a scope's app name is 1 to 128 bytes" }
        if versions.count > 4 { return "a scope's app has at most 4 version bounds" }
        if versions.contains(where: { $0.version.isEmpty || $0.version.utf8.count > 64 }) { return "a scope's app version is 1 to 64 bytes" }
        if (name + versions.map(\.version).joined()).unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            return "a scope's app holds a control character"
        }
        return nil
    }

    public func admits(app: String, version: String) -> Bool {
        app == name && versions.allSatisfy { $0.holds(for: version) }
    }

    /// `2.10` after `2.9`, `2.1` before `2.1.1`, `2.0-beta` after `2.0`… part by part: runs of
    /// digits compare as numbers, other runs as text; a missing part is the lowest.
    public static func compare(_ a: String, _ b: String) -> ComparisonResult {
        let x = parts(a), y = parts(b)
        for i in 0..<max(x.count, y.count) {
            guard i < x.count else { return .orderedAscending }
            guard i < y.count else { return .orderedDescending }
            switch (UInt64(x[i]), UInt64(y[i])) {
            case let (m?, n?) where m != n: return m < n ? .orderedAscending : .orderedDescending
            case (_?, nil): return .orderedAscending  // a number before text
            case (nil, _?): return .orderedDescending
            case (nil, nil) where x[i] != y[i]: return x[i] < y[i] ? .orderedAscending : .orderedDescending
            default: continue
            }
        }
        return .orderedSame
    }

    /// Runs of digits and runs of letters; anything else separates.
    private static func parts(_ version: String) -> [String] {
        var parts: [String] = [], current = "", digits = false
        for c in version {
            let isDigit = c.isASCII && c.isNumber
            if c.isLetter || isDigit {
                if !current.isEmpty && isDigit != digits {
                    parts.append(current)
                    current = ""
                }
                current.append(c)
                digits = isDigit
            } else if !current.isEmpty {
                parts.append(current)
                current = ""
            }
        }
        if !current.isEmpty { parts.append(current) }
        return parts
    }
}

/// `GET /v1/whoami`: the caller as the server sees it.
public struct CallerInfo: Codable, Sendable, Equatable {
    /// The admin token's name (or the signed-in person's).
    public var name: String
    public var role: AdminRole
    public var scope: AccessScope
    /// When the token ends (nil: it does not).
    public var expiresAt: Date?

    public init(name: String, role: AdminRole, scope: AccessScope, expiresAt: Date?) {
        self.name = name
        self.role = role
        self.scope = scope
        self.expiresAt = expiresAt
    }
}
