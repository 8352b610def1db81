import DredgeAdminAPI
import DredgeAdminClient
import DredgeCommandLine

extension IDPrefix {
    /// The one id `text` names among `candidates` (fetched only when `text` is not a whole id);
    /// fails with the problem said to the engineer.
    static func resolve(_ text: String, what: String, among candidates: () async throws -> [String]) async throws -> String {
        if isWhole(text) { return text }
        if let problem = formProblem(text, what: what) { throw fail(problem.description) }
        switch match(text, what: what, among: try await calling { try await candidates() }) {
        case .success(let id): return id
        case .failure(let problem): throw fail(problem.description)
        }
    }
}

extension AdminClient {
    func resolvePull(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "pull") { try await pulls(limit: 1000, diskUse: false).map(\.id) }
    }

    func resolveFeedback(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "feedback") { try await feedback(limit: 1000, diskUse: false).map(\.id) }
    }

    func resolveTail(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "tail") { try await tails(limit: 1000).map(\.id) }
    }

    func resolveAgent(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "agent") { try await agents().map(\.agentID) }
    }
}
