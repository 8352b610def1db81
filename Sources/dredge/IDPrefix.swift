import ArgumentParser
import DredgeAdminAPI
import DredgeCommandLine
import DredgeWire

/// Ids as people type them: a whole id, or (as git takes commits) a unique start of one, at
/// least 4 hex characters, looked up among what the server lists: every agent, the 1000 most
/// recent pulls and feedback (an older one is named by its whole id).
enum IDPrefix {
    static let minimumLength = 4

    /// Whether `text` could be an id or the start of one.
    static func isPlausible(_ text: String) -> Bool {
        text.utf8.count >= minimumLength && text.utf8.count <= 32 && text.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
    }

    /// Checks the form only; ``resolve(_:what:among:)`` finds the id.
    static func validate(_ text: String, flag: String) throws {
        guard isPlausible(text) else {
            throw ValidationError("\(flag) must be an id (32 lowercase hex characters) or its first \(minimumLength) or more")
        }
    }

    /// The one id among `candidates` that starts with `text`; a clear error when there is none
    /// or several (listing up to five).
    static func resolve(_ text: String, what: String, among candidates: () async throws -> [String]) async throws -> String {
        if WireID.isValid(text) { return text }
        guard isPlausible(text) else {
            throw fail("'\(text)' is not a \(what) id: give its 32 lowercase hex characters or its first \(minimumLength) or more")
        }
        let matches = Array(Set(try await calling { try await candidates() }.filter { $0.hasPrefix(text) })).sorted()
        switch matches.count {
        case 1: return matches[0]
        case 0: throw fail("no \(what) id starts with \(text)" + (what == "agent" ? "" : " among the 1000 most recent; give an older one's whole id"))
        default:
            let shown = matches.prefix(5).joined(separator: ", ") + (matches.count > 5 ? ", …" : "")
            throw fail("\(text) is ambiguous: \(matches.count) \(what) ids start with it (\(shown)); give more characters")
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

    func resolveAgent(_ text: String) async throws -> String {
        try await IDPrefix.resolve(text, what: "agent") { try await agents().map(\.agentID) }
    }
}
