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

    func resolveCapture(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "capture") { try await captures(limit: 1000).map(\.id) }
    }

    func resolveTail(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "tail") { try await tails(limit: 1000).map(\.id) }
    }

    func resolveTrigger(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "trigger") { try await triggers(limit: 1000).map(\.id) }
    }

    /// A pull's or a live tail's id (`dredge fetch`): a whole id is a pull's unless the server
    /// knows no such pull; a start of one is looked up among the 1000 most recent of each.
    func resolvePullOrTail(_ text: String) async throws -> (isTail: Bool, id: String) {
        if IDPrefix.isWhole(text) {
            do {
                _ = try await pull(text, diskUse: false)
                return (false, text)
            } catch AdminClientError.notFound {
                do {
                    _ = try await tail(text)
                    return (true, text)
                } catch AdminClientError.notFound {
                    throw fail("no pull or tail \(text)")
                } catch let error as AdminClientError {
                    throw failing(error)
                }
            } catch let error as AdminClientError {
                throw failing(error)
            }
        }
        let pulls = Set(try await calling { try await self.pulls(limit: 1000, diskUse: false) }.map(\.id))
        // A server before live tails has no /v1/tails: its pulls are all there is.
        let tails: [String]
        do { tails = try await self.tails(limit: 1000).map(\.id) } catch AdminClientError.notFound { tails = [] } catch let error as AdminClientError { throw failing(error) }
        let id = try await IDPrefix.resolve(text, what: "pull or tail") { Array(pulls) + tails }
        return (!pulls.contains(id), id)
    }

    func resolveAgent(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "agent") { try await agents().map(\.agentID) }
    }
}
