import Foundation

/// A child process for end-to-end tests: output goes to files the test can poll, and the process
/// is killed when the value is released if the test did not stop it.
public final class ManagedProcess: @unchecked Sendable {
    public let process = Process()
    public let outputPath: String

    /// - Parameter environment: set on top of this process's environment.
    public init(_ executable: String, _ arguments: [String], outputPath: String, environment: [String: String] = [:]) throws {
        self.outputPath = outputPath
        guard FileManager.default.createFile(atPath: outputPath, contents: nil) else { throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: outputPath]) }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: outputPath))
        process.executableURL = URL(fileURLWithPath: builtProduct(executable))
        process.arguments = arguments
        if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    public var output: String { String(decoding: FileManager.default.contents(atPath: outputPath) ?? Data(), as: UTF8.self) }

    /// Polls until `condition` holds (or `timeout` passes; the caller then asserts and sees why).
    @discardableResult
    public static func waitFor(timeout: Duration = .seconds(120), _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if try condition() { return true }
            usleep(50_000)
        }
        return try condition()
    }

    /// Sends `signal` and waits for the exit; returns the exit status.
    @discardableResult
    public func stop(_ signal: Int32 = SIGTERM) -> Int32 {
        if process.isRunning { kill(process.processIdentifier, signal) }
        process.waitUntilExit()
        return process.terminationStatus
    }

    /// A built product to run, with `environment` set on top of this process's.
    private static func child(_ executable: String, _ arguments: [String], environment: [String: String]) -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: builtProduct(executable))
        process.arguments = arguments
        if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        return process
    }

    /// Runs a command to completion and returns its status and combined output.
    public static func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws -> (status: Int32, output: String) {
        let process = child(executable, arguments, environment: environment)
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    /// Runs a command to completion and returns its status, its standard output and its
    /// standard error apart (for output a test parses, which a warning on stderr must not spoil).
    public static func runSeparately(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws -> (status: Int32, output: String, errors: String) {
        let process = child(executable, arguments, environment: environment)
        // Standard error goes to a file: reading two pipes one after the other can stall a
        // child that fills the second while the first is read.
        let errorsPath = FileManager.default.temporaryDirectory.appendingPathComponent("dredge-stderr-\(UUID().uuidString)").path
        guard FileManager.default.createFile(atPath: errorsPath, contents: nil) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: errorsPath])
        }
        defer { try? FileManager.default.removeItem(atPath: errorsPath) }
        let errors = try FileHandle(forWritingTo: URL(fileURLWithPath: errorsPath))
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = errors
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        try errors.close()
        let errorText = String(decoding: FileManager.default.contents(atPath: errorsPath) ?? Data(), as: UTF8.self)
        return (process.terminationStatus, String(decoding: data, as: UTF8.self), errorText)
    }
}
