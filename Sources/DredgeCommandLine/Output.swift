import ArgumentParser
import Foundation

/// Prints `error: message` to stderr and returns the exit code to throw (status 1).
public func fail(_ message: String) -> ExitCode {
    Terminal.error("error: \(message)\n")
    return ExitCode.failure
}

/// Prints a value as pretty, key-sorted JSON with ISO 8601 dates: the `--json` output.
public func printJSON(_ value: some Encodable) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
    encoder.dateEncodingStrategy = .iso8601
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}
