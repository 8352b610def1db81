import DredgeStore
import Foundation

/// A fresh directory under the system temp dir, removed when the value is released.
final class TempDir: @unchecked Sendable {
    let url: URL
    var path: String { url.path }

    init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("dredge-test-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func file(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

let testContext = LogContext(host: "test-host", os: "Linux", app: "tests", appVersion: "1.0", process: "tests[1]")

/// An hour ago: test records are recent, so the retention pass at open never races a test.
let testEpoch = Timestamp.now.subtracting(.seconds(3_600)).microseconds

/// A record `offset` microseconds after ``testEpoch``.
func entry(_ offset: Int64, uid: String = "u1", level: LogLevel = .info, type: LogType = .app, message: String = "m", metadata: LogMetadata = [:], context: ContextID) -> LogEntry {
    entry(absolute: testEpoch + offset, uid: uid, level: level, type: type, message: message, metadata: metadata, context: context)
}

func entry(absolute ts: Int64, uid: String = "u1", level: LogLevel = .info, type: LogType = .app, message: String = "m", metadata: LogMetadata = [:], context: ContextID) -> LogEntry {
    LogEntry(timestamp: Timestamp(microseconds: ts), level: level, type: type, uid: uid, message: message, metadata: metadata, context: context)
}

/// The path of an executable built beside the test bundle.
func builtProduct(_ name: String) -> String {
    let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    var dir = exe.deletingLastPathComponent()
    while dir.path != "/" {
        let candidate = dir.appendingPathComponent(name).path
        if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        dir = dir.deletingLastPathComponent()
    }
    return name
}
