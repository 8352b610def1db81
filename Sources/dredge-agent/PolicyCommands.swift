import ArgumentParser
import DredgeAgentCore
import DredgeCommandLine
import Foundation

/// `dredge-agent policy`: the device's upload policy (polite uploads, #54).
struct PolicyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "policy",
        abstract: "Show or set how politely this device uploads.",
        discussion: """
            The policy governs what the device uploads by itself (feedback, captures) and the pulls \
            and tails nobody marked urgent. A running `dredge-agent run` takes a change within a second. \
            Without a policy, uploads go at once and as fast as the link allows.
            """,
        subcommands: [PolicyShowCommand.self, PolicySetCommand.self, PolicyClearCommand.self],
        defaultSubcommand: PolicyShowCommand.self)
}

struct PolicyShowCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "show", abstract: "Print the upload policy, the network reported, and today's bytes.")

    @OptionGroup var agentState: AgentStateOptions
    @Flag(help: "Print JSON.") var json = false

    struct Shown: Encodable {
        var policy: UploadPolicy
        var network: String
        var spentToday: UInt64
    }

    func run() async throws {
        let policy: UploadPolicy
        let network: NetworkCost
        do {
            policy = try UploadPolicy.load(stateDirectory: agentState.path)
            network = try NetworkCost.load(stateDirectory: agentState.path)
        } catch let error as AgentError {
            throw fail(error.description)
        }
        let spent = UploadPolicy.spentToday(stateDirectory: agentState.path)
        if json {
            try printJSON(Shown(policy: policy, network: network.rawValue, spentToday: spent))
            return
        }
        print("policy:       \(UploadPolicy.describe(policy))")
        print("network:      \(network.rawValue)\(network == .unknown && policy.unmeteredOnly ? " (taken as metered: report it with `dredge-agent network`)" : "")")
        print("uploaded today (UTC): \(spent) bytes\(policy.dailyBytes.map { " of \($0)" } ?? "")")
    }
}

struct PolicySetCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set", abstract: "Set the upload policy (what is not given is kept as it was).")

    @OptionGroup var agentState: AgentStateOptions

    @Option(name: .customLong("unmetered-only"), help: "Wait while the network is metered or not reported: true or false.")
    var unmeteredOnly: Bool?

    @Option(help: ArgumentHelp("Upload at most this many bytes a second (e.g. 64KiB, 1MB), or `none`.", valueName: "bytes"))
    var maxRate: String?

    @Option(help: ArgumentHelp("Upload at most this many bytes a day, UTC (e.g. 50MB), or `none`.", valueName: "bytes"))
    var dailyBytes: String?

    @Option(help: "Let pulls and tails an engineer marked urgent bypass the policy: true or false.")
    var urgentBypass: Bool?

    static func bytes(_ text: String?, _ flag: String) throws -> UInt64?? {
        guard let text else { return .none }
        if text == "none" { return .some(nil) }
        guard let value = ByteCount.parse(text) else { throw ValidationError("\(flag): '\(text)' is not a count of bytes (e.g. 65536, 64KiB, 1MB) or none") }
        return .some(value)
    }

    func validate() throws {
        guard unmeteredOnly != nil || maxRate != nil || dailyBytes != nil || urgentBypass != nil else {
            throw ValidationError("give at least one of --unmetered-only, --max-rate, --daily-bytes, --urgent-bypass")
        }
        _ = try Self.bytes(maxRate, "--max-rate")
        _ = try Self.bytes(dailyBytes, "--daily-bytes")
    }

    func run() async throws {
        do {
            var policy = try UploadPolicy.load(stateDirectory: agentState.path)
            if let unmeteredOnly { policy.unmeteredOnly = unmeteredOnly }
            if let rate = try Self.bytes(maxRate, "--max-rate") { policy.maxBytesPerSecond = rate }
            if let daily = try Self.bytes(dailyBytes, "--daily-bytes") { policy.dailyBytes = daily }
            if let urgentBypass { policy.urgentBypass = urgentBypass }
            if let problem = policy.problem { throw fail(problem) }
            try policy.save(stateDirectory: agentState.path)
            print("policy: \(UploadPolicy.describe(policy))")
        } catch let error as AgentError {
            throw fail(error.description)
        }
    }
}

struct PolicyClearCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "clear", abstract: "Remove the upload policy: uploads go at once, as fast as the link allows.")

    @OptionGroup var agentState: AgentStateOptions

    func run() async throws {
        do {
            try UploadPolicy().save(stateDirectory: agentState.path)
            print("policy: unrestricted")
        } catch let error as AgentError {
            throw fail(error.description)
        }
    }
}

/// `dredge-agent network`: what the device's network costs now, for a policy that waits for an
/// unmetered one. A host reports it from a network hook (NetworkManager's dispatcher, say).
struct NetworkCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "network",
        abstract: "Report whether the device's network is metered (for an upload policy that waits for an unmetered one).")

    @OptionGroup var agentState: AgentStateOptions

    @Argument(help: "metered, unmetered or unknown.")
    var cost: String

    func validate() throws {
        guard NetworkCost(rawValue: cost) != nil else { throw ValidationError("the network is metered, unmetered or unknown, not '\(cost)'") }
    }

    func run() async throws {
        guard let network = NetworkCost(rawValue: cost) else { throw fail("the network is metered, unmetered or unknown") }
        guard FileManager.default.fileExists(atPath: agentState.path) else { throw fail("no agent state at \(agentState.path) (enroll first, or pass --state)") }
        do {
            try network.save(stateDirectory: agentState.path)
            print("network: \(network.rawValue)")
        } catch let error as AgentError {
            throw fail(error.description)
        }
    }
}
