import ArgumentParser
import DredgeCommandLine
import DredgeServer
import Foundation

struct ConfigCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "config", abstract: "Check a server.json, or list every key it may hold.",
        subcommands: [ConfigCheckCommand.self, ConfigKeysCommand.self])
}

struct ConfigCheckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Check server.json as the server reads it (with its DREDGE_… environment overrides) and print the configuration in effect.",
        discussion: """
            Prints every key with its value and where it came from (server.json, an environment variable, or the default). \
            Exits 1, naming each problem, when the file does not read, holds a key no release reads, or names what does \
            not work (a plain-HTTP admin API off loopback, a database URL that does not parse, a certificate that does not load).
            """)

    @Option(help: "A data directory: its server.json, keys and certificates are checked as `run` loads them.")
    var data: String?

    @Option(help: "A server.json on its own (relative certificate paths are beside it).")
    var file: String?

    func validate() throws {
        guard (data == nil) != (file == nil) else { throw ValidationError("give --data or --file, one of them") }
    }

    func run() throws {
        let path = data.map { $0 + "/server.json" } ?? file!
        guard let bytes = FileManager.default.contents(atPath: path) else { throw fail("cannot read \(path)") }
        let directory = data ?? (URL(fileURLWithPath: path).deletingLastPathComponent().path)
        let check = ServerConfiguration.check(bytes, directory: directory, deployment: data != nil)
        if !check.lines.isEmpty {
            let width = check.lines.map(\.path.count).max() ?? 0
            for line in check.lines {
                let padded = line.path.padding(toLength: width, withPad: " ", startingAt: 0)
                print("\(padded)  \(line.value ?? "-")  (\(line.source))")
            }
        }
        if check.isValid {
            print("\(path): valid")
        } else {
            for problem in check.problems { FileHandle.standardError.write(Data("problem: \(problem)\n".utf8)) }
            throw fail("\(path): \(check.problems.count) problem(s)")
        }
    }
}

struct ConfigKeysCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keys", abstract: "Every key server.json may hold: its type, default, unit, environment variable and meaning.")

    @Flag(help: "As the Markdown table of docs/configuration.md.")
    var markdown = false

    func run() throws {
        if markdown {
            print(ServerConfiguration.markdownTable(), terminator: "")
            return
        }
        for key in ServerConfiguration.keys {
            let value = key.defaultValue ?? "(\(key.absent ?? "none"))"
            print("\(key.path) = \(value)\(key.unit.isEmpty ? "" : " \(key.unit)")  [\(key.kind.rawValue), \(key.environmentName)]")
            print("    \(key.meaning)")
        }
    }
}
