import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeCommandLine
import Foundation

struct FetchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fetch",
        abstract: "Download a pull's files (per agent, its per-day JSON-lines files and manifest, or its zip), or what a live tail held.",
        discussion: """
            Files go to DIR/PULL/HOST_AGENT/ (the device's host name, then its id; the id alone
            for an agent the server no longer lists; a folder already there for the agent is
            used whatever its host was called). Each is checked against the SHA-256 the server lists; an
            interrupted download goes on where it stopped when run again, and files already there
            are not downloaded again. Downloads are recorded in the server's audit log.

            A live tail's are each device's records.jsonl (the records as the device sent them)
            and contexts.jsonl (the contexts they name by number), in DIR/TAIL/HOST_AGENT/, as
            far as the server holds them: run again while the tail goes on to add what came
            since. Its requester or an admin may download them.
            """)

    @OptionGroup var server: ServerOptions
    @Argument(help: "The pull or live tail id, or its first 4 or more characters.") var pull: String
    @Option(help: "Where to put the files (default: the current directory).") var out = "."
    @Option(help: "Only this agent's files.") var agent: String?
    @Flag(help: "Each agent's zip instead of its per-day files.") var zip = false
    @Flag(help: "The whole pull as one zip, DIR/PULL.zip: every agent's per-day files and manifest as AGENT/NAME. An interrupted download goes on where it stopped.") var oneZip = false

    func validate() throws {
        if let agent { try IDPrefix.validate(agent, flag: "--agent") }
        if oneZip && (zip || agent != nil) { throw ValidationError("--one-zip holds every agent's files: it goes without --zip and --agent") }
    }

    func run() async throws {
        let client = try server.client()
        let (isTail, id) = try await client.resolvePullOrTail(pull)
        if isTail {
            if zip || oneZip { throw fail("tail \(id) has no zip: its files are each device's records.jsonl and contexts.jsonl") }
            let agentID: String? = if let agent { try await client.resolveAgent(agent) } else { nil }
            try await DredgeFetch.files(ofTail: id, client: client, into: out, devices: await Devices.of(client), agent: agentID)
            return
        }
        if oneZip {
            let path = URL(fileURLWithPath: out).standardizedFileURL.path + "/" + id + ".zip"
            do {
                let (file, outcome) = try await client.downloadWholeZip(pull: id, to: path)
                print("\(path)  \(Format.bytes(file.size))  sha256 \(file.sha256.prefix(16))…  \(DredgeFetch.describe(outcome)), checked")
            } catch AdminClientError.notFound(let message) {
                try await DredgeFetch.failIfRemoved(id, client: client)
                throw fail(message)
            } catch let error as AdminClientError {
                throw failing(error)
            }
            return
        }
        let agentID: String? = if let agent { try await client.resolveAgent(agent) } else { nil }
        try await DredgeFetch.files(of: id, client: client, into: out, devices: await Devices.of(client), agent: agentID, zip: zip)
    }
}

enum DredgeFetch {
    /// A pull with no files to download because it was removed: says so, and by whom.
    static func failIfRemoved(_ id: String, client: AdminClient) async throws {
        if let removed = try await calling({ try await client.pull(id, diskUse: false) }).removed { throw fail("pull \(id) has no files: \(Format.removed(removed))") }
    }

    /// Downloads the pull's files into `directory/PULL/HOST_AGENT/` (``Devices/folder(_:)``),
    /// one line per file on stdout (on stderr when stdout carries JSON).
    static func files(
        of id: String, client: AdminClient, into directory: String, devices: Devices, agent: String? = nil, zip: Bool = false, toStderr: Bool = false
    ) async throws {
        func say(_ line: String) {
            if toStderr { Terminal.error(line + "\n") } else { print(line) }
        }
        let listed = try await calling { try await client.pullFiles(id) }
        let wanted = listed.filter { ($0.kind == .zip) == zip && (agent == nil || $0.agentID == agent) }
        guard !wanted.isEmpty else {
            try await failIfRemoved(id, client: client)
            throw fail("pull \(id) has no files\(agent.map { " from agent \($0)" } ?? "") yet: `dredge show \(id)` says where it stands")
        }
        try await download(wanted, of: id, into: directory, devices: devices, say: say) { file, path in try await client.download(pull: id, file: file, to: path) }
    }

    /// Downloads `files` into `directory/ID/HOST_AGENT/NAME`, a line each, then the total.
    private static func download(
        _ files: [PullFile], of id: String, into directory: String, devices: Devices, say: (String) -> Void,
        _ fetch: (PullFile, String) async throws -> AdminClient.DownloadOutcome
    ) async throws {
        let root = URL(fileURLWithPath: directory).standardizedFileURL.path + "/" + id
        var bytes: Int64 = 0
        for file in files {
            let path = root + "/" + devices.folder(file.agentID, in: root) + "/" + file.name
            let outcome = try await calling { try await fetch(file, path) }
            say("\(path)  \(Format.bytes(file.size))  sha256 \(file.sha256.prefix(16))…  \(describe(outcome))")
            bytes += file.size
        }
        say("\(files.count) file(s), \(Format.bytes(bytes)), each checked against its SHA-256, in \(root)")
    }

    /// Downloads what a live tail held into `directory/TAIL/HOST_AGENT/`, as far as the server
    /// holds it; a file an earlier run left is continued.
    static func files(ofTail id: String, client: AdminClient, into directory: String, devices: Devices, agent: String?) async throws {
        let listed = try await calling { try await client.tailFiles(id) }
        let wanted = listed.filter { agent == nil || $0.agentID == agent }
        let tail = try await calling { try await client.tail(id) }
        guard !wanted.isEmpty else {
            if let removed = tail.removed { throw fail("tail \(id) has no files: \(Format.removed(removed))") }
            throw fail("tail \(id) holds no records\(agent.map { " from agent \($0)" } ?? "") yet: `dredge tail --watch \(id)` shows them as they come")
        }
        try await download(wanted, of: id, into: directory, devices: devices, say: { print($0) }) { file, path in
            try await client.download(tail: id, file: file, to: path)
        }
        if tail.isOpen(at: .now) {
            print("tail \(id) is still running: these are the records held so far; run this again for what comes since")
        }
    }

    static func describe(_ outcome: AdminClient.DownloadOutcome) -> String {
        switch outcome {
        case .present: "already there"
        case .downloaded: "downloaded"
        case .resumed(let from): "resumed from byte \(from)"
        }
    }
}
