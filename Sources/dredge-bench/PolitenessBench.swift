import ArgumentParser
import Foundation

/// `dredge-bench politeness`: `upload.politeness` (#54), the rate a device's upload achieves
/// over a link the kernel shapes, ÷ the cap its upload policy sets. Each round is
/// Tests/polite/shaped_link.py on the binaries beside this one: a real server, a real agent in
/// a network namespace of its own behind a tc token bucket at 2 Mbit/s, a policy of 96 KiB/s
/// and an unmetered-only network turned metered and back in the middle of a 1.5 MB feedback.
/// The rate is the slope of the link's byte counter while the upload crosses it (frames and
/// every header, which the agent's cap counts). Goal: 0.9–1.0. Needs root (ip netns, tc).
struct PolitenessBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "politeness", abstract: "upload.politeness: a capped upload's rate over a kernel-shaped link ÷ its cap (needs root).")

    @Option(help: "Rounds; the median is the figure.")
    var rounds = 3

    @Option(help: "The test script that runs one round.")
    var script = "Tests/polite/shaped_link.py"

    struct Round: Decodable {
        var politeness: Double
        var payloadOverCap: Double

        enum CodingKeys: String, CodingKey {
            case politeness = "upload.politeness"
            case payloadOverCap = "payload_over_cap"
        }
    }

    func run() async throws {
        let binaries = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent().path
        guard FileManager.default.fileExists(atPath: script) else { throw ValidationError("no \(script): run from the repository's top") }
        var results: [Round] = []
        for round in 0..<rounds {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["python3", script, binaries, "--figure"]
            let output = Pipe()
            process.standardOutput = output
            try process.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            let text = String(decoding: data, as: UTF8.self)
            guard process.terminationStatus == 0, let line = text.split(separator: "\n").last(where: { $0.hasPrefix("{") }) else {
                throw ValidationError("round \(round) failed:\n\(text)")
            }
            let result = try JSONDecoder().decode(Round.self, from: Data(line.utf8))
            note(String(format: "round %d: wire rate %.3f of the cap, payload %.3f", round, result.politeness, result.payloadOverCap))
            results.append(result)
        }
        let values = results.map(\.politeness)
        print(Figure(
            name: "upload.politeness", value: median(values), unit: "of the cap", limit: 1, higherIsBetter: true,
            extra: String(format: "min=%.3f max=%.3f payload=%.3f goal=0.9-1.0", values.min() ?? .nan, values.max() ?? .nan, median(results.map(\.payloadOverCap)))).line)
    }
}
