import DredgeDomain
import Foundation

/// `manifest.json`, the last entry of every export zip (README § Payload). It says what was
/// asked for, what each per-day file holds, where records came from, and what the device had
/// already lost in the range, so an engineer can tell "no logs" from "logs removed".
public struct ExportManifest: Codable, Hashable, Sendable {
    public static let formatName = "dredge-export/1"

    public struct FilterDescription: Codable, Hashable, Sendable {
        public var since: String?
        public var until: String?
        public var uid: String?
        public var types: [String]?
        public var levels: [String]?
        public var text: String?

        public init(_ filter: LogFilter) {
            since = filter.since?.rfc3339
            until = filter.until?.rfc3339
            uid = filter.uid
            types = filter.types.map { $0.map(\.rawValue).sorted() }
            levels = filter.levels.map { $0.sorted().map(\.name) }
            text = filter.text
        }

        /// A description that does not read as a filter.
        public struct Unreadable: Error, CustomStringConvertible, Sendable {
            public var description: String
        }

        /// The filter this describes, read exactly: times in RFC 3339, types and levels by
        /// their names (not aliases), each listed once. Compare with
        /// ``LogFilter/normalized`` (an empty list or text is the same as none).
        public func logFilter() throws -> LogFilter {
            func time(_ text: String?, _ name: String) throws -> Timestamp? {
                guard let text else { return nil }
                guard let time = Timestamp(rfc3339: text) else { throw Unreadable(description: "\(name) \(text.debugDescription) is not an RFC 3339 time") }
                return time
            }
            var filter = LogFilter(since: try time(since, "since"), until: try time(until, "until"), uid: uid, text: text)
            if let types {
                filter.types = Set(try types.map { name in
                    guard let type = LogType(name) else { throw Unreadable(description: "\(name.debugDescription) is not a type name") }
                    return type
                })
                guard filter.types?.count == types.count else { throw Unreadable(description: "a type is listed twice") }
            }
            if let levels {
                filter.levels = Set(try levels.map { name in
                    guard let level = LogLevel.allCases.first(where: { $0.name == name }) else { throw Unreadable(description: "\(name.debugDescription) is not a level name") }
                    return level
                })
                guard filter.levels?.count == levels.count else { throw Unreadable(description: "a level is listed twice") }
            }
            return filter
        }
    }

    public struct Day: Codable, Hashable, Sendable {
        /// `YYYY-MM-DD.jsonl`
        public var file: String
        public var records: Int
        /// Bytes of the uncompressed file.
        public var bytes: Int
        public var first: String
        public var last: String

        public init(file: String, records: Int, bytes: Int, first: String, last: String) {
            self.file = file
            self.records = records
            self.bytes = bytes
            self.first = first
            self.last = last
        }
    }

    public struct Loss: Codable, Hashable, Sendable {
        public var reason: String
        public var count: Int64
        public var first: String
        public var last: String
        public var recordedAt: String

        public init(reason: String, count: Int64, first: String, last: String, recordedAt: String) {
            self.reason = reason
            self.count = count
            self.first = first
            self.last = last
            self.recordedAt = recordedAt
        }
    }

    public struct FeedbackDescription: Codable, Hashable, Sendable {
        public var feedbackID: String
        public var uid: String
        public var text: String
        public var createdAt: String

        public init(feedbackID: String, uid: String, text: String, createdAt: String) {
            self.feedbackID = feedbackID
            self.uid = uid
            self.text = text
            self.createdAt = createdAt
        }
    }

    /// What fired a capture (Protocol § 21): its trigger, the set version it was matched
    /// under, whether a run's unclean end fired it, when, and (unless a crash) the record.
    public struct CaptureDescription: Codable, Hashable, Sendable {
        public var triggerID: String
        public var setVersion: UInt64
        public var crash: Bool
        public var matchedAt: String
        /// The record that fired it, as a § 13 record object; nil for a crash.
        public var match: JSONValue?

        public init(triggerID: String, setVersion: UInt64, crash: Bool, matchedAt: String, match: JSONValue?) {
            self.triggerID = triggerID
            self.setVersion = setVersion
            self.crash = crash
            self.matchedAt = matchedAt
            self.match = match
        }
    }

    public var format: String
    public var uploadID: String
    public var kind: String
    public var commandID: String?
    public var agentID: String
    public var createdAt: String
    public var filter: FilterDescription
    public var recordCount: Int
    public var empty: Bool
    public var days: [Day]
    /// Context rows by id, as the records' `context` field refers to them.
    public var contexts: [String: LogContext]
    public var losses: [Loss]
    public var feedback: FeedbackDescription?
    public var capture: CaptureDescription?

    public init(
        format: String, uploadID: String, kind: String, commandID: String?, agentID: String, createdAt: String, filter: FilterDescription,
        recordCount: Int, empty: Bool, days: [Day], contexts: [String: LogContext], losses: [Loss], feedback: FeedbackDescription?,
        capture: CaptureDescription? = nil
    ) {
        self.capture = capture
        self.format = format
        self.uploadID = uploadID
        self.kind = kind
        self.commandID = commandID
        self.agentID = agentID
        self.createdAt = createdAt
        self.filter = filter
        self.recordCount = recordCount
        self.empty = empty
        self.days = days
        self.contexts = contexts
        self.losses = losses
        self.feedback = feedback
    }

    enum CodingKeys: String, CodingKey {
        case format, kind, filter, empty, days, contexts, losses, feedback, capture
        case uploadID = "upload_id", commandID = "command_id", agentID = "agent_id", createdAt = "created_at"
        case recordCount = "record_count"
    }

    /// Canonical JSON: sorted keys, no escaped slashes, so the same export yields the same bytes.
    public func encoded() throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array(try encoder.encode(self))
    }
}

extension ExportManifest.Loss {
    enum CodingKeys: String, CodingKey {
        case reason, count, first, last
        case recordedAt = "recorded_at"
    }
}

extension ExportManifest.FeedbackDescription {
    enum CodingKeys: String, CodingKey {
        case uid, text
        case feedbackID = "feedback_id", createdAt = "created_at"
    }
}

extension ExportManifest.CaptureDescription {
    enum CodingKeys: String, CodingKey {
        case crash, match
        case triggerID = "trigger_id", setVersion = "set_version", matchedAt = "matched_at"
    }
}
