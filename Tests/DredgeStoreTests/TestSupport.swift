@_exported import DredgeTestSupport
import DredgeDomain
import DredgeStore
import Foundation

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
