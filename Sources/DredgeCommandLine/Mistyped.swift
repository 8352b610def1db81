import ArgumentParser
import DredgeDomain
import Foundation

/// A mistyped command named back with the one meant (`dredge pul` → "did you mean 'pull'?"),
/// before ArgumentParser's bare "Unexpected argument". Called first by each executable's
/// `main`.
public enum Mistyped {
    /// The command words of `arguments` are walked down `root`'s subcommands; at the first word
    /// that names none of the current command's subcommands but is close to some (a prefix of
    /// it, or at most two edits away), the closest when no other is as close, says so on
    /// stderr and exits 64.
    public static func exitIfMistyped(_ root: any ParsableCommand.Type, arguments: [String] = Array(CommandLine.arguments.dropFirst())) {
        guard let found = suggestion(root, arguments: arguments) else { return }
        Terminal.error("\(found.path): '\(Terminal.field(found.typed))' is not a command; did you mean '\(found.meant)'? (\(found.path) --help lists them)\n")
        exit(64)
    }

    /// (what was typed, the command meant, the command path so far), or nil.
    public static func suggestion(_ root: any ParsableCommand.Type, arguments: [String]) -> (typed: String, meant: String, path: String)? {
        var command = root
        var path = root._commandName
        for word in arguments {
            if word.hasPrefix("-") { return nil }  // options belong to the command reached
            let subcommands = command.configuration.subcommands
            guard !subcommands.isEmpty else { return nil }
            if let next = subcommands.first(where: { $0._commandName == word || $0.configuration.aliases.contains(word) }) {
                command = next
                path += " " + word
                continue
            }
            guard word != "help" else { return nil }
            guard word.count >= 2 else { return nil }
            // The closest of those close enough, when no other is as close.
            var close: [(name: String, distance: Int)] = []
            for sub in subcommands {
                let name = sub._commandName
                let d = distance(word, name)
                if name.hasPrefix(word) || d <= Swift.min(2, Swift.max(1, name.count / 2)) { close.append((name, d)) }
            }
            guard let best = close.min(by: { $0.distance < $1.distance }), close.filter({ $0.distance == best.distance }).count == 1 else { return nil }
            return (word, best.name, path)
        }
        return nil
    }

    /// Levenshtein distance, by characters (``editDistance(_:_:)``).
    static func distance(_ a: String, _ b: String) -> Int { editDistance(a, b) }
}
