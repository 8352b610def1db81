import DredgeDomain
import Foundation

/// Every key `server.json` may hold, with its type, default, unit and meaning: the one list
/// the documentation's table (docs/configuration.md, `dredge-server config keys --markdown`),
/// `dredge-server config check` and the environment overrides are made from. The defaults are
/// read from the code's own (``ConnectionLimits/default``, …), and a test checks that every key
/// here is one the server reads and that the server reads no key missing here.
///
/// **Environment overrides.** Each key has a variable: `DREDGE_` and its path in capitals, a
/// word to an underscore (`connections.handshakeSeconds` is
/// `DREDGE_CONNECTIONS_HANDSHAKE_SECONDS`, `database` is `DREDGE_DATABASE`). A variable that is
/// set wins over the file; its value is read by the key's type (a list is comma-separated), and
/// then checked as the file's would be.
public enum ServerConfiguration {
    public struct Key: Sendable {
        public enum Kind: String, Sendable {
            case integer, number, string, boolean
            /// A list of strings (comma-separated in an environment variable).
            case strings = "list of strings"
        }

        /// `section.key`, or `key` at the top.
        public let path: String
        public let kind: Kind
        /// The value when the key is absent, as `config check` prints it; nil when absent means
        /// something of its own (said in `absent`).
        public let defaultValue: String?
        /// What the key's absence means when there is no default value.
        public let absent: String?
        /// `init` always writes it, and a file without it does not read (its default is
        /// what `init` writes).
        public let required: Bool
        public let unit: String
        public let meaning: String
        /// A legal value other than the default, for the test that the server reads the key.
        let example: any Sendable
        /// The value in effect under a configuration (its default when the key is absent).
        public let effective: @Sendable (ServerDeployment.Config) -> (any Sendable)?

        init(
            _ path: String, _ kind: Kind, default value: (any Sendable)?, absent: String? = nil, required: Bool = false, unit: String = "", example: any Sendable,
            _ meaning: String, effective: @escaping @Sendable (ServerDeployment.Config) -> (any Sendable)?
        ) {
            self.required = required
            self.path = path
            self.kind = kind
            self.defaultValue = value.map(ServerConfiguration.render)
            self.absent = absent
            self.unit = unit
            self.example = example
            self.meaning = meaning
            self.effective = effective
        }

        /// `DREDGE_` and the path in capitals, each word and section apart.
        public var environmentName: String {
            // A capital starts a word, and a run of capitals is one word (`adminTLS`, `clientID`,
            // `redirectURL`): ADMIN_TLS, CLIENT_ID, REDIRECT_URL.
            var name = "DREDGE_"
            let characters = Array(path)
            for (i, character) in characters.enumerated() {
                if character == "." {
                    name += "_"
                    continue
                }
                let before = i > 0 ? characters[i - 1] : "."
                let after = i + 1 < characters.count ? characters[i + 1] : "."
                if character.isUppercase && (before.isLowercase || before.isNumber || before.isUppercase && after.isLowercase) { name += "_" }
                name += character.uppercased()
            }
            return name
        }

        var components: [String] { path.split(separator: ".").map(String.init) }
    }

    public static let keys: [Key] = {
        let c = ConnectionLimits.default, a = AdminConnectionLimits.default, t = WorkThreads.default, f = FeedbackLimits.default
        return [
            Key("listenHost", .string, default: "127.0.0.1", required: true, example: "0.0.0.0", "Address the agent listener binds (what `init --listen` wrote).") { $0.listenHost },
            Key("agentPort", .integer, default: 7443, required: true, example: 17443, "Port of the agent listener (TLS). `run --agent-port` overrides it.") { $0.agentPort },
            Key("adminHost", .string, default: "127.0.0.1", example: "10.0.0.5", "Address the admin API and the console bind. Plain HTTP only on loopback.") { $0.adminHost ?? "127.0.0.1" },
            Key("adminPort", .integer, default: 7080, required: true, example: 17080, "Port of the admin API. `run --admin-port` overrides it.") { $0.adminPort },
            Key(
                "adminTLS.certificate", .string, default: nil, absent: "plain HTTP (loopback only)", example: "admin.pem",
                "The admin API's certificate chain (PEM); a relative path is inside the data directory.") { $0.adminTLS?.certificate },
            Key("adminTLS.key", .string, default: nil, absent: "plain HTTP (loopback only)", example: "admin-key.pem", "The private key (PEM) of `adminTLS.certificate`.") { $0.adminTLS?.key },
            Key("names", .strings, default: nil, absent: "none", required: true, example: ["logs.example.com"], "The names `init` put in the server's certificate (kept for reference).") { $0.names },
            Key(
                "database", .string, default: nil, absent: "SQLite in the data directory", example: "postgres://dredge@db.example.com/dredge",
                "The PostgreSQL database the server's state is in (`postgres://USER@HOST[:PORT]/DATABASE[?sslmode=require]`); the password belongs in `PGPASSWORD` or a password file.") { $0.database },
            Key("feedback.perHour", .integer, default: f.perHour, unit: "uploads", example: 30, "Feedback uploads one agent may begin per hour.") { ($0.feedback ?? .default).perHour },
            Key("feedback.bytesPerDay", .integer, default: f.bytesPerDay, unit: "bytes", example: 1 << 30, "Bytes of feedback (as uploaded) one agent may begin per 24 hours.") { ($0.feedback ?? .default).bytesPerDay },
            Key("feedback.maxUnpackedBytes", .integer, default: f.maxUnpackedBytes, unit: "bytes", example: 16 << 20, "Bytes one feedback upload may unpack to.") { ($0.feedback ?? .default).maxUnpackedBytes },
            Key("connections.handshakeSeconds", .number, default: c.handshakeSeconds, unit: "seconds", example: 20, "From accept to an authenticated agent connection, at most (0 to 600).") { ($0.connections ?? .default).handshakeSeconds },
            Key("connections.missedHeartbeats", .integer, default: c.missedHeartbeats, unit: "intervals", example: 5, "Heartbeat intervals an agent may stay silent before it is closed (1 to 100).") { ($0.connections ?? .default).missedHeartbeats },
            Key(
                "connections.maxConnections", .integer, default: nil, absent: "the open-file limit less 256", unit: "connections", example: 5000,
                "Agent connections open at once, authenticated or not.") { $0.connections?.maxConnections },
            Key(
                "connections.maxUnauthenticated", .integer, default: nil, absent: "a quarter of maxConnections, at most 1,024", unit: "connections", example: 100,
                "Of those, connections not yet authenticated.") { $0.connections?.maxUnauthenticated },
            Key(
                "connections.maxUnauthenticatedPerAddress", .integer, default: c.maxUnauthenticatedPerAddress, unit: "connections", example: 8,
                "Unauthenticated connections from one address.") { ($0.connections ?? .default).maxUnauthenticatedPerAddress },
            Key(
                "connections.restartWithinSeconds", .integer, default: c.restartWithinSeconds, unit: "seconds", example: 120,
                "What a stopping server tells its agents it will be back within (0: nothing; at most 600).") { ($0.connections ?? .default).restartWithinSeconds },
            Key(
                "connections.maxIngressBytesPerSecond", .integer, default: nil, absent: "no cap", unit: "bytes", example: 50_000_000,
                "Bytes of upload chunks this node takes a second from all agents together, shared fairly among those uploading (at least 1 MiB).") { $0.connections?.maxIngressBytesPerSecond },
            Key("adminConnections.handshakeSeconds", .number, default: a.handshakeSeconds, unit: "seconds", example: 5, "From accept to a finished TLS handshake on the admin API.") { ($0.adminConnections ?? .default).handshakeSeconds },
            Key("adminConnections.headerSeconds", .number, default: a.headerSeconds, unit: "seconds", example: 5, "From a request's first byte to the end of its head.") { ($0.adminConnections ?? .default).headerSeconds },
            Key("adminConnections.bodySeconds", .number, default: a.bodySeconds, unit: "seconds", example: 20, "From a request's head to the end of its body.") { ($0.adminConnections ?? .default).bodySeconds },
            Key("adminConnections.idleSeconds", .number, default: a.idleSeconds, unit: "seconds", example: 30, "How long a connection may wait for its next request.") { ($0.adminConnections ?? .default).idleSeconds },
            Key("adminConnections.maxConnections", .integer, default: a.maxConnections, unit: "connections", example: 128, "Admin API connections open at once.") { ($0.adminConnections ?? .default).maxConnections },
            Key("adminConnections.maxPerAddress", .integer, default: a.maxPerAddress, unit: "connections", example: 16, "Admin API connections from one address.") { ($0.adminConnections ?? .default).maxPerAddress },
            Key("threads.control", .integer, default: t.control, unit: "threads", example: 3, "Threads for authentication, enrollment, heartbeats and pull commands.") { ($0.threads ?? .default).control },
            Key("threads.uploads", .integer, default: t.uploads, unit: "threads", example: 6, "Threads for upload chunks' checks and durable writes.") { ($0.threads ?? .default).uploads },
            Key("threads.unpack", .integer, default: t.unpack, unit: "threads", example: 3, "Threads unpacking uploads while they arrive.") { ($0.threads ?? .default).unpack },
            Key("threads.bulkNice", .integer, default: t.bulkNice, example: 5, "The `nice` value (0 to 19) of the upload and unpack threads.") { ($0.threads ?? .default).bulkNice },
            Key("threads.bulkIdle", .boolean, default: t.bulkIdle, example: false, "The upload and unpack threads run under Linux's `SCHED_IDLE` policy.") { ($0.threads ?? .default).bulkIdle },
            Key("results.keepDays", .integer, default: ResultsRetention.default.keepDays, unit: "days", example: 90, "How long pulled and feedback files are kept (0: until removed).") { ($0.results ?? .default).keepDays },
            Key(
                "readiness.minFreeDiskMegabytes", .integer, default: ReadinessLimits.default.minFreeDiskMegabytes, unit: "MB", example: 4096,
                "Free space the data directory's file system needs for `GET /ready` to say ready.") { ($0.readiness ?? .default).minFreeDiskMegabytes },
            Key(
                "metrics.listen", .string, default: nil, absent: "none: /metrics only on the admin listener, behind the scrape token", example: "127.0.0.1:9464",
                "A listener of its own for `GET /metrics` (`HOST:PORT`), plain HTTP without a token.") { $0.metrics?.listen },
            Key(
                "audit.file", .string, default: nil, absent: "none", example: "audit.jsonl",
                "A file each audit entry is appended to as one JSON line, with its hash (a relative path is inside the data directory): a copy outside the database.") { $0.audit?.file },
            Key(
                "audit.syslog", .string, default: nil, absent: "none", example: "/dev/log",
                "The local syslog socket each audit entry written after the start is also sent to (one JSON line, authpriv.notice).") { $0.audit?.syslog },
            Key(
                "approvals.required", .boolean, default: false, example: true,
                "Each pull of user logs carries a reason and waits, sent to no device, until an investigator or admin other than the one who asked approves it (`dredge approve`); unapproved, it expires.") {
                $0.approvals?.required ?? false
            },
            Key(
                "sso.issuer", .string, default: nil, absent: "none: the console signs in with admin tokens only", example: "https://login.example.com/realms/acme",
                "The OpenID Connect identity provider the console also signs people in with (its issuer URL; https, or http on loopback).") { $0.sso?.issuer },
            Key("sso.clientID", .string, default: nil, absent: "none", example: "dredge-console", "The console's client id at the identity provider.") { $0.sso?.clientID },
            Key(
                "sso.clientSecretFile", .string, default: nil, absent: "none", example: "sso-client-secret",
                "The file holding the console's client secret (a relative path is inside the data directory; mode 0600).") { $0.sso?.clientSecretFile },
            Key(
                "sso.redirectURL", .string, default: nil, absent: "none", example: "https://logs.example.com:7080/console/sso/callback",
                "The console's callback as browsers reach it, registered at the provider.") { $0.sso?.redirectURL },
            Key("sso.scopes", .strings, default: ["openid", "profile", "email"], example: ["openid", "email", "groups"], "The scopes asked of the provider.") {
                $0.sso?.scopes ?? ["openid", "profile", "email"]
            },
            Key("sso.groupsClaim", .string, default: "groups", example: "roles", "The ID token's claim that lists the person's groups.") { $0.sso?.groupsClaim ?? "groups" },
            Key("sso.readers", .strings, default: [String](), example: ["support-readers"], "Groups whose people sign in as readers.") { $0.sso?.readers ?? [] },
            Key("sso.investigators", .strings, default: [String](), example: ["support"], "Groups whose people sign in as investigators.") { $0.sso?.investigators ?? [] },
            Key("sso.admins", .strings, default: [String](), example: ["dredge-admins"], "Groups whose people sign in as admins (the highest role of a person's groups wins).") {
                $0.sso?.admins ?? []
            },
            Key(
                "sso.appsClaim", .string, default: nil, absent: "none: unscoped", example: "dredge_apps",
                "A claim listing the apps a reader's or investigator's scope holds (`oven-control@>=2.1`).") { $0.sso?.appsClaim },
            Key(
                "sso.labelsClaim", .string, default: nil, absent: "none: unscoped", example: "dredge_labels",
                "A claim listing the device labels a reader's or investigator's scope requires (`region=eu`).") { $0.sso?.labelsClaim },
            Key(
                "sso.cliClientID", .string, default: nil, absent: "none: `dredge login` takes admin tokens only", example: "dredge-cli",
                "The command line's client id at the identity provider: public, allowed the device authorization grant (`dredge login --sso`).") { $0.sso?.cliClientID },
            Key(
                "sso.deviceAuthorizationURL", .string, default: nil, absent: "the provider's discovery document's", example: "https://login.example.com/oauth2/device/authorize",
                "The provider's device authorization endpoint, for a provider whose discovery document does not name it.") { $0.sso?.deviceAuthorizationURL },
            Key("sso.cliTokenHours", .number, default: 10.0, unit: "hours", example: 8, "How long a token `dredge login --sso` gets lasts (1 to 168).") { $0.sso?.cliTokenHours ?? 10 },
        ]
    }()

    /// A key by its path.
    public static func key(_ path: String) -> Key? { keys.first { $0.path == path } }

    /// A value as `config check` and the documentation print it.
    public static func render(_ value: any Sendable) -> String {
        switch value {
        case let b as Bool: return b ? "true" : "false"
        case let d as Double: return d == d.rounded() && abs(d) < 1e15 ? String(Int64(d)) : String(d)
        case let list as [String]: return list.joined(separator: ", ")
        default: return "\(value)"
        }
    }

    // MARK: Reading a file

    /// What was read: the configuration, where each key's value came from, and keys the
    /// server does not know (a misspelling, most likely).
    public struct Reading: Sendable {
        public var config: ServerDeployment.Config
        /// The keys set by an environment variable, by path.
        public var fromEnvironment: [String]
        /// Keys in the file that no release reads (ignored).
        public var unknownKeys: [String]
    }

    /// Reads `server.json`'s bytes with the environment's overrides. Throws ``DeploymentError``
    /// naming the key or the variable at fault.
    public static func read(_ data: Data, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> Reading {
        let parsed: Any
        do {
            parsed = try JSONSerialization.jsonObject(with: data)
        } catch {
            throw DeploymentError("server.json is not JSON: \(error.localizedDescription)")
        }
        guard var object = parsed as? [String: Any] else { throw DeploymentError("server.json is not a JSON object") }
        let unknown = unknownKeys(in: object)
        var overridden: [String] = []
        for key in keys {
            guard let text = environment[key.environmentName] else { continue }
            let value = try parse(text, as: key)
            set(value, at: key.components, in: &object)
            overridden.append(key.path)
        }
        let config: ServerDeployment.Config
        do {
            config = try JSONDecoder().decode(ServerDeployment.Config.self, from: try JSONSerialization.data(withJSONObject: object))
        } catch let error as DecodingError {
            throw DeploymentError("server.json: \(explained(error))" + (overridden.isEmpty ? "" : " (after the environment's \(overridden.map { key($0)!.environmentName }.joined(separator: ", ")))"))
        }
        return Reading(config: config, fromEnvironment: overridden, unknownKeys: unknown)
    }

    /// Paths in `object` that are no key (a section's own name counts when it is a section).
    static func unknownKeys(in object: [String: Any], prefix: String = "") -> [String] {
        var unknown: [String] = []
        for (name, value) in object.sorted(by: { $0.key < $1.key }) {
            let path = prefix.isEmpty ? name : prefix + "." + name
            if keys.contains(where: { $0.path == path }) { continue }
            if let section = value as? [String: Any], keys.contains(where: { $0.path.hasPrefix(path + ".") }) {
                unknown += unknownKeys(in: section, prefix: path)
            } else {
                unknown.append(path)
            }
        }
        return unknown
    }

    /// An environment variable's text as the key's type.
    static func parse(_ text: String, as key: Key) throws -> any Sendable {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        func refuse(_ what: String) -> DeploymentError { DeploymentError("\(key.environmentName)=\(text.debugDescription) is not \(what)") }
        switch key.kind {
        case .string: return text
        case .integer:
            guard let value = Int(trimmed) else { throw refuse("an integer") }
            return value
        case .number:
            guard let value = Double(trimmed), value.isFinite else { throw refuse("a number") }
            return value
        case .boolean:
            switch trimmed.lowercased() {
            case "true", "1", "yes": return true
            case "false", "0", "no": return false
            default: throw refuse("true or false")
            }
        case .strings:
            return trimmed.isEmpty ? [String]() : trimmed.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
        }
    }

    private static func set(_ value: Any, at path: [String], in object: inout [String: Any]) {
        guard let first = path.first else { return }
        if path.count == 1 {
            object[first] = value
            return
        }
        var section = object[first] as? [String: Any] ?? [:]
        set(value, at: Array(path.dropFirst()), in: &section)
        object[first] = section
    }

    /// The value at `path` in a JSON object, if any.
    static func value(at path: [String], in object: [String: Any]) -> Any? {
        guard let first = path.first else { return nil }
        guard path.count > 1 else { return object[first] }
        guard let section = object[first] as? [String: Any] else { return nil }
        return value(at: Array(path.dropFirst()), in: section)
    }

    /// A decoding error as one line: which key and what is wrong.
    static func explained(_ error: DecodingError) -> String {
        func path(_ keys: [any CodingKey]) -> String { keys.map(\.stringValue).joined(separator: ".") }
        switch error {
        case .dataCorrupted(let c): return c.codingPath.isEmpty ? c.debugDescription : "\(path(c.codingPath)): \(c.debugDescription)"
        case .keyNotFound(let key, let c): return "\(path(c.codingPath + [key])) is missing"
        case .typeMismatch(let type, let c): return "\(path(c.codingPath)) is not \(type == String.self ? "a string" : type == [String].self ? "a list of strings" : "a \(type)")"
        case .valueNotFound(let type, let c): return "\(path(c.codingPath)) is null where a \(type) is wanted"
        @unknown default: return "\(error)"
        }
    }

    // MARK: The table

    /// The documentation's table of every key (docs/configuration.md).
    public static func markdownTable() -> String {
        var lines = ["| Key | Type | Default | Unit | Environment | Meaning |", "|---|---|---|---|---|---|"]
        for key in keys {
            var value = key.defaultValue.map { "`\($0)`" } ?? (key.absent ?? "none")
            if key.required { value = key.defaultValue.map { "required (`init` writes `\($0)`)" } ?? "required (`init` writes it)" }
            lines.append("| `\(key.path)` | \(key.kind.rawValue) | \(value) | \(key.unit) | `\(key.environmentName)` | \(key.meaning) |")
        }
        return lines.joined(separator: "\n") + "\n"
    }
}

extension ServerConfiguration {
    /// What `dredge-server config check` finds in a `server.json`: each key's value in effect
    /// and where it came from, and every problem.
    public struct Check: Sendable {
        public struct Line: Sendable, Equatable {
            public var path: String
            /// The value in effect, or nil when the key is absent and has no default.
            public var value: String?
            /// `server.json`, the variable's name, `default`, or what the absence means.
            public var source: String
        }

        public var lines: [Line] = []
        public var problems: [String] = []
        public var isValid: Bool { problems.isEmpty }
    }

    /// Checks `server.json`'s bytes as the server would read them, with `environment`'s
    /// overrides. `directory`: where relative paths (the admin API's certificate) are, and, with
    /// `deployment`, a data directory whose keys and certificates are loaded too.
    public static func check(
        _ data: Data, directory: String, deployment: Bool, environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> Check {
        var check = Check()
        let reading: Reading
        do {
            reading = try read(data, environment: environment)
        } catch {
            check.problems.append("\(error)")
            return check
        }
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]  // read above: it parses
        for key in keys {
            let value = key.effective(reading.config).map(render)
            let source: String
            if reading.fromEnvironment.contains(key.path) {
                source = key.environmentName
            } else if ServerConfiguration.value(at: key.components, in: object) != nil {
                source = "server.json"
            } else {
                source = key.defaultValue == nil ? (key.absent ?? "none") : "default"
            }
            check.lines.append(Check.Line(path: key.path, value: value, source: source))
        }
        for unknown in reading.unknownKeys {
            // The key, or the section, it is most like.
            let known = Set(keys.map(\.path) + keys.compactMap { $0.components.count > 1 ? $0.components[0] : nil })
            let guess = known.sorted().min { distance($0, unknown) < distance($1, unknown) }
            let hint = guess.flatMap { distance($0, unknown) <= max(2, unknown.count / 4) ? " (did you mean \($0)?)" : nil } ?? ""
            check.problems.append("\(unknown): no release reads this key\(hint)")
        }
        let config = reading.config
        do {
            try LoadedDeployment.checkAdmin(host: config.adminHost ?? "127.0.0.1", tls: config.adminTLS != nil)
        } catch {
            check.problems.append("\(error)")
        }
        if let database = config.database {
            do {
                _ = try PostgresDatabase.Location(url: database, environment: environment)
            } catch {
                check.problems.append("database: \(error)")
            }
        }
        if deployment {
            // The keys and certificates, as `run` loads them (the admin API's included).
            do {
                _ = try LoadedDeployment(directory: directory, environment: environment)
            } catch {
                check.problems.append("\(error)")
            }
        } else if let tls = config.adminTLS {
            do {
                _ = try ServerDeployment.adminTLSConfiguration(tls, directory: directory)
            } catch {
                check.problems.append("\(error)")
            }
        }
        return check
    }

    /// Edit distance, case ignored, for suggesting the key a misspelling meant.
    static func distance(_ a: String, _ b: String) -> Int { editDistance(a.lowercased(), b.lowercased()) }
}
