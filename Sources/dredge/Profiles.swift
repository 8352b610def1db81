import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeCommandLine
import DredgeDomain
import Foundation

/// What `dredge login` stores: per profile name, the admin API's address, the token and the
/// pinned CA. One file, `$XDG_CONFIG_HOME/dredge/profiles.json` (else `~/.config/dredge/`),
/// mode 0600 in a 0700 directory; a file others can read is refused, as ssh refuses its keys.
struct ProfileFile: Codable, Equatable {
    struct Profile: Codable, Equatable {
        var server: String
        var token: String
        /// The deployment CA (PEM) to pin, or nil for the system's trust roots.
        var ca: String?
    }

    var profiles: [String: Profile] = [:]

    static var path: String {
        let environment = ProcessInfo.processInfo.environment
        let base = environment["XDG_CONFIG_HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil }
            ?? (environment["HOME"] ?? NSHomeDirectory()) + "/.config"
        return base + "/dredge/profiles.json"
    }

    /// The stored profiles; none when there is no file.
    static func load(from path: String = path) throws -> ProfileFile {
        var info = stat()
        guard stat(path, &info) == 0 else {
            if errno == ENOENT { return ProfileFile() }
            throw fail("cannot read \(path): \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & 0o077 == 0 else {
            throw fail("\(path) holds admin tokens but others can read it: `chmod 600 \(path)` (or log in again)")
        }
        guard let data = FileManager.default.contents(atPath: path) else { throw fail("cannot read \(path)") }
        do {
            return try JSONDecoder().decode(ProfileFile.self, from: data)
        } catch {
            throw fail("\(path) is not a profile file (\(error)); remove it and log in again")
        }
    }

    /// Writes the file whole: a new file (0600) synced and renamed over the old one.
    func save(to path: String = path) throws {
        let directory = (path as NSString).deletingLastPathComponent
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw fail("cannot create \(directory): \(error.localizedDescription)")
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        let bytes = Array(try encoder.encode(self)) + [10]
        let temporary = path + ".\(getpid()).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw fail("cannot write \(temporary): \(String(cString: strerror(errno)))") }
        var done = 0
        while done < bytes.count {
            let n = bytes[done...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            guard n > 0 else {
                let reason = String(cString: strerror(errno))
                close(fd)
                unlink(temporary)
                throw fail("cannot write \(temporary): \(reason)")
            }
            done += n
        }
        let synced = fsync(fd) == 0
        close(fd)
        guard synced, rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw fail("cannot save \(path): \(reason)")
        }
    }
}

/// Where the server is and the token to show it: flags, else the environment, else the
/// profile `dredge login` saved.
struct ServerOptions: ParsableArguments {
    @Option(help: "The admin API: https://HOST:PORT (default: $DREDGE_SERVER, else the profile's, else https://127.0.0.1:7080).")
    var server: String?

    @Option(help: "An admin token (default: $DREDGE_TOKEN, else the profile's).")
    var token: String?

    @Option(help: "Trust only this CA (PEM) for https (default: $DREDGE_CA, else the profile's).")
    var ca: String?

    @Option(help: "The `dredge login` profile to use (default: $DREDGE_PROFILE, else 'default').")
    var profile: String?

    func client() throws -> AdminClient {
        let environment = ProcessInfo.processInfo.environment
        let name = profile ?? nonEmpty(environment["DREDGE_PROFILE"]) ?? "default"
        let stored = try ProfileFile.load().profiles[name]
        if profile != nil && stored == nil { throw fail("no profile '\(name)' in \(ProfileFile.path): `dredge login --profile \(name) …` first") }
        let address = server ?? nonEmpty(environment["DREDGE_SERVER"]) ?? stored?.server ?? "https://127.0.0.1:7080"
        // The profile's token and CA go only to the profile's server.
        let own = stored.flatMap { $0.server == address ? $0 : nil }
        guard let token = token ?? nonEmpty(environment["DREDGE_TOKEN"]) ?? own?.token, !token.isEmpty else {
            throw fail("no admin token: `dredge login`, or give --token or set DREDGE_TOKEN (`dredge-server init` printed one)")
        }
        let trust: AdminClient.Trust
        if let file = ca ?? nonEmpty(environment["DREDGE_CA"]) {
            trust = .pinned(caPEM: try readCA(file))
        } else if let pem = own?.ca {
            trust = .pinned(caPEM: pem)
        } else {
            trust = .system
        }
        do {
            return try AdminClient(server: address, token: token, trust: trust)
        } catch let error as AdminClientError {
            throw fail(error.description)
        }
    }
}

func nonEmpty(_ text: String?) -> String? { text?.isEmpty == false ? text : nil }

func readCA(_ path: String) throws -> String {
    guard let data = FileManager.default.contents(atPath: path) else { throw fail("cannot read the CA certificate \(path)") }
    let pem = String(decoding: data, as: UTF8.self)
    guard pem.contains("-----BEGIN CERTIFICATE-----") else { throw fail("\(path) is not a PEM certificate") }
    return pem
}

struct LoginCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "login",
        abstract: "Check an admin API address, its certificate and a token, and save them as a profile.",
        discussion: """
            `dredge-server init` prints the line to paste. The server's certificate is pinned to the
            deployment's CA: give the CA file with --ca, or its fingerprint with --fingerprint
            (the CA is then fetched and kept only if its SHA-256 matches). Without either, the
            system's trust roots are used (an operator's own certificate). The profile is saved in
            \(ProfileFile.path) with mode 0600.

            With --sso instead of --token, you sign in through your company's identity provider:
            the command prints an address and a code, you open the address in any browser, sign
            in and enter the code, and the server gives this profile a short-lived token with
            the role and scope your groups give (`dredge whoami` shows them, and when it ends).
            """)

    @Option(help: "The admin API: https://HOST:PORT (http:// only on loopback).") var server: String
    @Option(help: "The admin token.") var token: String?
    @Flag(help: "Sign in through the identity provider instead of giving a token (the server must have sso.cliClientID).") var sso = false
    @Option(help: "The deployment's CA certificate (PEM file).") var ca: String?
    @Option(help: "The deployment CA's fingerprint, sha256:HEX, as `dredge-server init` printed it.") var fingerprint: String?
    @Option(help: "Save under this name (default 'default').") var profile = "default"

    func validate() throws {
        guard ca == nil || fingerprint == nil else { throw ValidationError("give --ca or --fingerprint, not both") }
        guard (token == nil) == sso else { throw ValidationError(sso ? "give --token or --sso, not both" : "give --token, or --sso to sign in through the identity provider") }
        guard !profile.isEmpty, profile.count <= 64, profile.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-_.".contains($0)) }) else {
            throw ValidationError("--profile is 1 to 64 letters, digits, '-', '_' or '.'")
        }
    }

    func run() async throws {
        guard let url = URL(string: server), let scheme = url.scheme, let host = url.host else {
            throw fail("'\(server)' is not an address: give https://HOST:PORT")
        }
        if scheme == "http" && !HostAddress.isLoopback(host) {
            throw fail("plain http is only for loopback: the token would cross the network in the clear; give https://\(host)…")
        }
        let pem: String? =
            if let ca { try readCA(ca) } else if let fingerprint { try await calling { try await AdminClient.fetchCA(server: server, fingerprint: fingerprint) } } else { nil }
        let trust: AdminClient.Trust = pem.map { .pinned(caPEM: $0) } ?? .system
        func client(_ token: String) throws -> AdminClient {
            do {
                return try AdminClient(server: server, token: token, trust: trust)
            } catch let error as AdminClientError {
                throw fail(error.description)
            }
        }
        guard let token else {
            let answer = try await signOn(try client(""))
            guard let token = answer.token, let me = answer.caller else { throw fail("the server answered the sign-in without a token") }
            // The certificate and the token, both checked before anything is saved.
            _ = try await calling { try await client(token).whoami() }
            try save(token, pem)
            let scope = me.scope.isEverything ? "" : " of \(me.scope)"
            let until = me.expiresAt.map { ", until \(Timestamp($0).rfc3339)" } ?? ""
            print("logged in to \(server) as \(me.name) (\(answer.shown ?? "?")), \(me.role.rawValue)\(scope)\(until); profile '\(profile)' saved in \(ProfileFile.path)")
            return
        }
        // The certificate and the token, both checked before anything is saved.
        let agents = try await calling { try await client(token).agents() }
        try save(token, pem)
        print("logged in to \(server) (\(agents.count) agent(s) enrolled); profile '\(profile)' saved in \(ProfileFile.path)")
    }

    private func save(_ token: String, _ pem: String?) throws {
        var file = try ProfileFile.load()
        file.profiles[profile] = .init(server: server, token: token, ca: pem)
        try file.save()
    }

    /// The device authorization grant, through the server: the address and code for the
    /// person, then polls (at the interval the server gives) until they have answered.
    func signOn(_ client: AdminClient) async throws -> DeviceSignInAnswer {
        let started = try await calling { try await client.startDeviceSignIn() }
        let minutes = max(1, started.expiresIn / 60)
        // On stderr, unbuffered: the person needs it now, and stdout may be a pipe.
        var prompt = "To sign in, open \(started.verificationURI) in a browser and enter the code \(started.userCode)"
        if let complete = started.verificationURIComplete { prompt += "\n(or open \(complete))" }
        prompt += "\nWaiting for you to sign in; the code lapses in \(minutes) minute\(minutes == 1 ? "" : "s")…\n"
        FileHandle.standardError.write(Data(prompt.utf8))
        var interval = started.interval
        var failures = 0
        let deadline = ContinuousClock.now + .seconds(started.expiresIn)
        while ContinuousClock.now + .seconds(interval) < deadline {
            try await Task.sleep(for: .seconds(interval))
            let answer: DeviceSignInAnswer
            do {
                answer = try await client.pollDeviceSignIn(DeviceSignInPoll(deviceCode: started.deviceCode, interval: interval))
                failures = 0
            } catch let error as AdminClientError where failures < 4 && Self.isPassing(error) {
                // Throttled, or the server or the provider briefly away: wait longer, a few times.
                failures += 1
                interval = min(60, interval * 2)
                Terminal.error("(\(error.description); trying again in \(interval) s)\n")
                continue
            } catch AdminClientError.forbidden(let message) {
                // Denied at the provider, or no group of the person's gives a role here: the
                // server's words, without the hint about tokens a refused token gets.
                Terminal.error("error: \(message)\n")
                throw ExitCode(notAllowedStatus)
            } catch let error as AdminClientError {
                throw failing(error)
            }
            switch answer.status {
            case .pending: interval = min(60, max(1, answer.interval ?? interval))
            case .signedIn: return answer
            }
        }
        throw fail("the code lapsed before anyone entered it: run `dredge login --sso` again")
    }

    /// A failure worth waiting out: too many requests, a server or provider briefly away.
    static func isPassing(_ error: AdminClientError) -> Bool {
        switch error {
        case .server(let status, _): [429, 502, 503, 504].contains(status)
        case .unreachable: true
        default: false
        }
    }
}

struct LogoutCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "logout", abstract: "Forget a saved profile (its token and CA).")

    @Option(help: "The profile to forget (default 'default').") var profile = "default"

    func run() async throws {
        var file = try ProfileFile.load()
        guard file.profiles.removeValue(forKey: profile) != nil else { throw fail("no profile '\(profile)' in \(ProfileFile.path)") }
        try file.save()
        print("forgot profile '\(profile)'")
    }
}
