import ArgumentParser
import DredgeAgentCore
import DredgeCommandLine
import DredgeDomain
import Foundation

/// `dredge-agent feedback`: a user's feedback with their recent logs, queued for the server.
struct FeedbackCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "feedback",
        abstract: "Record a user's feedback and queue an upload of their recent logs with it.",
        discussion: """
            The upload waits in the agent's outbox (STATE/uploads/) and is sent by `dredge-agent run` \
            as soon as it is connected, also if the server is unreachable now or the agent restarts. \
            Encrypted under a key made here, which only the server can unwrap.
            """)

    @OptionGroup var agentState: AgentStateOptions
    @OptionGroup var store: StoreOptions

    @Option(help: "The user giving the feedback.")
    var uid: String

    @Option(help: "What the user said.")
    var text: String

    @Option(help: "Days of the user's logs to send with it.")
    var days = Feedback.defaultDays

    func validate() throws {
        guard (1...30).contains(days) else { throw ValidationError("--days must be between 1 and 30") }
        if let problem = FeedbackText.problem(text) { throw ValidationError("--text: \(problem)") }
    }

    func run() async throws {
        let state: AgentState
        do {
            state = try AgentState.load(from: agentState.path)
        } catch let error as AgentError {
            throw fail("\(error.description) (feedback is sent by an enrolled agent)")
        }
        let logStore = try store.open(readOnly: false)
        defer { try? logStore.close() }
        do {
            let id = try Feedback.submit(uid: uid, text: text, days: days, state: state, store: logStore)
            print(id)
            FileHandle.standardError.write(Data("queued feedback \(id) with \(days) day(s) of \(uid)'s logs; `dredge-agent run` sends it\n".utf8))
        } catch let error as AgentError {
            throw fail(error.description)
        }
    }
}
