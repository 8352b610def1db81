import Foundation

/// A fresh directory under the system temp dir, removed when the value is released.
public final class TempDir: @unchecked Sendable {
    public let url: URL
    public var path: String { url.path }

    public init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("dredge-test-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    public func file(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// The path of an executable built beside the test bundle (`swift build --build-tests` builds
/// every product into the same directory).
public func builtProduct(_ name: String) -> String {
    var dir = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
    while dir.path != "/" {
        let candidate = dir.appendingPathComponent(name).path
        if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        dir = dir.deletingLastPathComponent()
    }
    return name
}

/// A tmpfs mounted for one test: a file system that can be made read-only under a store, or
/// that fills up. Needs permission to mount, which the test machine's root has; tests that use
/// it are enabled only where ``isSupported``.
public struct TmpfsMount {
    public let path: String

    public static let isSupported: Bool = {
        guard let mount = try? TmpfsMount() else { return false }
        mount.remove()
        return true
    }()

    public init(megabytes: Int = 16) throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("dredge-mnt-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        guard Self.run(["mount", "-t", "tmpfs", "-o", "size=\(megabytes)m", "tmpfs", path]) else {
            try? FileManager.default.removeItem(atPath: path)
            throw CocoaError(.featureUnsupported)
        }
    }

    public func remount(readOnly: Bool) throws {
        guard Self.run(["mount", "-o", "remount,\(readOnly ? "ro" : "rw")", path]) else { throw CocoaError(.featureUnsupported) }
    }

    /// Unmounts and removes the mount point. A file system still in use (a server whose stop
    /// has not finished) is detached lazily instead of being left mounted, as one was after
    /// every test run until this fallback.
    public func remove() {
        if !Self.run(["umount", path]) {
            // Said, so a test that leaves its file system busy shows.
            FileHandle.standardError.write(Data("note: \(path) was still in use; detached lazily\n".utf8))
            _ = Self.run(["umount", "--lazy", path])
        }
        try? FileManager.default.removeItem(atPath: path)  // test scratch space
    }

    private static func run(_ arguments: [String]) -> Bool {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return false }
        process.waitUntilExit()
        return process.terminationStatus == 0
    }
}

/// Tests run in parallel in one process, and a few measure that process's resident memory:
/// those measurements, and the tests that allocate tens of megabytes at once, hold this lock,
/// so one never counts the other's memory.
public enum MemoryHeavy {
    private static let lock = NSLock()
    public static func run<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }
}

/// SplitMix64: the same sequence for a seed on every run, for tests that draw at random.
public struct SeededRandom: RandomNumberGenerator {
    var state: UInt64
    public init(_ seed: UInt64) { state = seed &* 0x9E37_79B9_7F4A_7C15 }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Starts the crash child (`store-crash-child`, Tests/Helpers) with `arguments` and returns it
/// with the first line it wrote ("ready\n" once it is set up). No backtrace is printed for a
/// crash: it is the point.
public func startCrashChild(_ arguments: [String]) throws -> (child: Process, firstLine: String) {
    let child = Process()
    child.executableURL = URL(fileURLWithPath: builtProduct("store-crash-child"))
    child.arguments = arguments
    child.environment = ProcessInfo.processInfo.environment.merging(["SWIFT_BACKTRACE": "enable=no"]) { $1 }
    let output = Pipe()
    child.standardOutput = output
    try child.run()
    var line = Data()
    while !line.contains(UInt8(ascii: "\n")) {
        let chunk = output.fileHandleForReading.availableData
        if chunk.isEmpty { break }
        line.append(chunk)
    }
    return (child, String(decoding: line, as: UTF8.self))
}
