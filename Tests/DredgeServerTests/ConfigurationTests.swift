@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// `server.json`'s keys (#56): one list in the code (``ServerConfiguration/keys``) that the
/// documentation's table, `config check` and the environment overrides come from, kept equal to
/// what the server reads.
@Suite struct ConfigurationTests {
    let dir = TempDir()

    /// What `init` always writes (the keys without a default in the decoder).
    static var required: [String: Any] { ["listenHost": "127.0.0.1", "agentPort": 7443, "adminPort": 7080, "names": ["localhost"]] }

    static func json(_ object: [String: Any]) throws -> Data { try JSONSerialization.data(withJSONObject: object) }

    /// Every key set to its example (not its default).
    static func everyKeySet() -> [String: Any] {
        var object: [String: Any] = [:]
        for key in ServerConfiguration.keys {
            let parts = key.path.split(separator: ".").map(String.init)
            if parts.count == 1 {
                object[parts[0]] = key.example
            } else {
                var section = object[parts[0]] as? [String: Any] ?? [:]
                section[parts[1]] = key.example
                object[parts[0]] = section
            }
        }
        return object
    }

    /// Every leaf path of a JSON object.
    static func paths(_ object: [String: Any], prefix: String = "") -> Set<String> {
        var paths = Set<String>()
        for (name, value) in object {
            let path = prefix.isEmpty ? name : prefix + "." + name
            if let section = value as? [String: Any] { paths.formUnion(Self.paths(section, prefix: path)) } else { paths.insert(path) }
        }
        return paths
    }

    @Test func theServerReadsEveryKeyOnTheListAndNoOther() throws {
        let reading = try ServerConfiguration.read(try Self.json(Self.everyKeySet()), environment: [:])
        #expect(reading.unknownKeys.isEmpty && reading.fromEnvironment.isEmpty)
        for key in ServerConfiguration.keys {
            let effective = try #require(key.effective(reading.config), "\(key.path) was not read")
            #expect(ServerConfiguration.render(effective) == ServerConfiguration.render(key.example), "\(key.path)")
            #expect(ServerConfiguration.render(key.example) != key.defaultValue, "\(key.path)'s example is its default")
        }
        // Everything the configuration holds, written back, is a key on the list.
        let written = try #require(try JSONSerialization.jsonObject(with: try JSONEncoder().encode(reading.config)) as? [String: Any])
        #expect(Self.paths(written) == Set(ServerConfiguration.keys.map(\.path)))
    }

    @Test func theListedDefaultsAreTheServersOwn() throws {
        let sections = ["feedback", "connections", "adminConnections", "threads", "results", "readiness", "metrics"]
        for object in [Self.required, Self.required.merging(sections.map { ($0, [String: Any]()) }, uniquingKeysWith: { a, _ in a })] {
            let config = try ServerConfiguration.read(try Self.json(object), environment: [:]).config
            for key in ServerConfiguration.keys where !Self.required.keys.contains(key.path) {
                #expect(key.effective(config).map(ServerConfiguration.render) == key.defaultValue, "\(key.path)")
            }
        }
        // The keys init always writes: their listed defaults are init's.
        let options = ServerDeployment.Options(dataDirectory: dir.path)
        #expect(ServerConfiguration.key("listenHost")?.defaultValue == options.listenHost)
        #expect(ServerConfiguration.key("agentPort")?.defaultValue == String(options.agentPort))
        #expect(ServerConfiguration.key("adminPort")?.defaultValue == String(options.adminPort))
        #expect(ServerConfiguration.key("adminHost")?.defaultValue == options.adminHost)
    }

    @Test func theDocumentedTableIsTheServersList() throws {
        let doc = try String(contentsOf: MetricsTests.repository.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        let table = try #require(doc.firstMatch(of: /<!-- keys:begin -->\n([\s\S]*)<!-- keys:end -->/)?.1)
        #expect(String(table) == ServerConfiguration.markdownTable(), "regenerate with: dredge-server config keys --markdown")
        let names = ServerConfiguration.keys.map(\.environmentName)
        #expect(Set(names).count == names.count)
        #expect(names.allSatisfy { $0.wholeMatch(of: /DREDGE_[A-Z]+(_[A-Z]+)*/) != nil })
        #expect(ServerConfiguration.key("adminTLS.certificate")?.environmentName == "DREDGE_ADMIN_TLS_CERTIFICATE")
        #expect(ServerConfiguration.key("connections.maxUnauthenticatedPerAddress")?.environmentName == "DREDGE_CONNECTIONS_MAX_UNAUTHENTICATED_PER_ADDRESS")
        // A run of capitals is one word.
        #expect(ServerConfiguration.key("sso.clientID")?.environmentName == "DREDGE_SSO_CLIENT_ID")
        #expect(ServerConfiguration.key("sso.deviceAuthorizationURL")?.environmentName == "DREDGE_SSO_DEVICE_AUTHORIZATION_URL")
    }

    /// The environment wins over the file, read by each key's type and checked as the file is;
    /// a value that does not read or breaks a bound names the variable.
    @Test func environmentVariablesOverrideTheFileAndAreChecked() throws {
        let file = try Self.json(Self.required.merging(["connections": ["handshakeSeconds": 5]], uniquingKeysWith: { a, _ in a }))
        let reading = try ServerConfiguration.read(file, environment: [
            "DREDGE_CONNECTIONS_HANDSHAKE_SECONDS": "20.5", "DREDGE_THREADS_BULK_IDLE": "no", "DREDGE_NAMES": "a.example.com, b.example.com",
            "DREDGE_DATABASE": "postgres://dredge@db/dredge", "DREDGE_METRICS_LISTEN": "127.0.0.1:9464", "DREDGE_AGENT_PORT": "17443",
            "DREDGE_TEST_POSTGRES": "not a key", "HOME": "/root",
        ])
        let config = reading.config
        #expect(config.connections?.handshakeSeconds == 20.5 && config.threads?.bulkIdle == false)
        #expect(config.names == ["a.example.com", "b.example.com"] && config.database == "postgres://dredge@db/dredge")
        #expect(config.metrics?.listen == "127.0.0.1:9464" && config.agentPort == 17443)
        #expect(Set(reading.fromEnvironment) == ["connections.handshakeSeconds", "threads.bulkIdle", "names", "database", "metrics.listen", "agentPort"])

        for (variable, value, said) in [
            ("DREDGE_AGENT_PORT", "seventy", "DREDGE_AGENT_PORT=\"seventy\" is not an integer"),
            ("DREDGE_THREADS_BULK_IDLE", "maybe", "is not true or false"),
            ("DREDGE_CONNECTIONS_HANDSHAKE_SECONDS", "nan", "is not a number"),
            ("DREDGE_CONNECTIONS_MISSED_HEARTBEATS", "500", "missedHeartbeats must be 1 to 100 (after the environment's DREDGE_CONNECTIONS_MISSED_HEARTBEATS)"),
            ("DREDGE_METRICS_LISTEN", "nowhere", "is not HOST:PORT"),
            ("DREDGE_ADMIN_TLS_KEY", "key.pem", "adminTLS.certificate is missing"),
        ] {
            #expect { try ServerConfiguration.read(file, environment: [variable: value]) } throws: { "\($0)".contains(said) }
        }
    }

    /// `config check`: every key with its value and source; a misspelled key named with the key
    /// it most likely meant; what cannot work said.
    @Test func checkNamesEachProblemAndWhereEachValueCameFrom() throws {
        var object = Self.required
        object["conections"] = ["handshakeSeconds": 5]
        object["results"] = ["keepDay": 10, "keepDays": 7]
        object["adminHost"] = "10.0.0.5"  // plain HTTP off loopback
        object["database"] = "mysql://nope"
        let check = ServerConfiguration.check(try Self.json(object), directory: dir.path, deployment: false, environment: ["DREDGE_THREADS_UNPACK": "3"])
        #expect(!check.isValid)
        #expect(check.problems.contains("conections: no release reads this key (did you mean connections?)"))
        #expect(check.problems.contains("results.keepDay: no release reads this key (did you mean results.keepDays?)"))
        #expect(check.problems.contains { $0.contains("plain HTTP, which is allowed only on loopback") })
        #expect(check.problems.contains { $0.hasPrefix("database: ") })
        let lines = Dictionary(uniqueKeysWithValues: check.lines.map { ($0.path, $0) })
        #expect(lines["results.keepDays"] == .init(path: "results.keepDays", value: "7", source: "server.json"))
        #expect(lines["threads.unpack"] == .init(path: "threads.unpack", value: "3", source: "DREDGE_THREADS_UNPACK"))
        #expect(lines["threads.uploads"] == .init(path: "threads.uploads", value: "4", source: "default"))
        #expect(lines["metrics.listen"]?.value == nil && lines["metrics.listen"]?.source.hasPrefix("none") == true)

        let broken = ServerConfiguration.check(Data("{\"agentPort\": ".utf8), directory: dir.path, deployment: false, environment: [:])
        #expect(broken.lines.isEmpty && broken.problems.count == 1 && broken.problems[0].contains("not JSON"))
    }

    /// The command on a real deployment: valid as `init` made it (exit 0); a misspelled key
    /// makes it exit 1, naming the key, and the server still starts with the rest.
    @Test func theConfigCheckCommandOnARealDeployment() throws {
        let data = dir.file("server")
        _ = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
        let (status, output) = try ManagedProcess.run("dredge-server", ["config", "check", "--data", data])
        #expect(status == 0, "\(output)")
        #expect(output.contains("\(data)/server.json: valid") && output.contains("connections.handshakeSeconds") && output.contains("(default)"))

        let path = data + "/server.json"
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        config["readines"] = ["minFreeDiskMegabytes": 1]
        try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: path))
        let (bad, said) = try ManagedProcess.run("dredge-server", ["config", "check", "--data", data])
        #expect(bad == 1 && said.contains("problem: readines: no release reads this key (did you mean readiness?)"), "\(said)")
        // Read as run reads it: the unknown key is listed, not fatal.
        #expect(try LoadedDeployment(directory: data, environment: [:]).unknownKeys == ["readines"])
    }
}
