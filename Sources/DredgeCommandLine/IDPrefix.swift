import ArgumentParser

/// Ids as people type them: a whole id, or (as git takes commits) a unique start of one, at
/// least 4 hex characters, looked up among what the server lists: every agent, the 1000 most
/// recent pulls and feedback (an older one is named by its whole id).
public enum IDPrefix {
    public static let minimumLength = 4

    /// Why a typed id names no one id.
    public struct Problem: Error, Equatable, CustomStringConvertible {
        public let description: String
    }

    /// Whether `text` could be an id or the start of one.
    public static func isPlausible(_ text: String) -> Bool {
        text.utf8.count >= minimumLength && text.utf8.count <= 32 && text.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
    }

    /// Whether `text` is a whole id (32 lowercase hex characters): used as it is, nothing looked up.
    public static func isWhole(_ text: String) -> Bool { text.utf8.count == 32 && isPlausible(text) }

    /// Checks the form only; ``match(_:what:among:)`` finds the id.
    public static func validate(_ text: String, flag: String) throws {
        guard isPlausible(text) else {
            throw ValidationError("\(flag) must be an id (32 lowercase hex characters) or its first \(minimumLength) or more")
        }
    }

    /// Why `text` cannot name a `what` id at all (before anything is looked up); nil when it can.
    public static func formProblem(_ text: String, what: String) -> Problem? {
        isPlausible(text) ? nil : Problem(description: "'\(text)' is not \("aeiou".contains(what.prefix(1)) ? "an" : "a") \(what) id: give its 32 lowercase hex characters or its first \(minimumLength) or more")
    }

    /// The one id among `candidates` that starts with `text`; a clear problem when there is
    /// none or several (listing up to five).
    public static func match(_ text: String, what: String, among candidates: [String]) -> Result<String, Problem> {
        if isWhole(text) { return .success(text) }
        if let problem = formProblem(text, what: what) { return .failure(problem) }
        let matches = Array(Set(candidates.filter { $0.hasPrefix(text) })).sorted()
        switch matches.count {
        case 1: return .success(matches[0])
        case 0: return .failure(Problem(description: "no \(what) id starts with \(text)" + (what == "agent" ? "" : " among the 1000 most recent; give an older one's whole id")))
        default:
            let shown = matches.prefix(5).joined(separator: ", ") + (matches.count > 5 ? ", …" : "")
            return .failure(Problem(description: "\(text) is ambiguous: \(matches.count) \(what) ids start with it (\(shown)); give more characters"))
        }
    }
}
