import DredgeDomain
import DredgeWire
import Foundation

/// How politely the device uploads (#54): what the app (or the host's owner) allows the
/// uploads the device makes by itself, and the pulls and tails nobody marked urgent.
/// `STATE/upload-policy.json`; no file, or no member, allows everything (as before there was
/// a policy).
///
/// ```json
/// {"unmeteredOnly": true, "maxBytesPerSecond": 65536, "dailyBytes": 50000000, "urgentBypass": true}
/// ```
///
/// - `unmeteredOnly`: wait while the network is metered (or not known: see ``NetworkCost``).
/// - `maxBytesPerSecond`: the uploads' chunks go out at most this fast, all uploads together,
///   counted as they cross the link (their frames with TLS, TCP and IP headers, about 5 % more).
/// - `dailyBytes`: at most this many bytes of uploads a day (UTC), counted alike; then they
///   wait for the next.
/// - `urgentBypass`: a pull or tail an engineer marked urgent skips the three (default true);
///   its bytes still count toward the day.
public struct UploadPolicy: Codable, Sendable, Equatable {
    public var unmeteredOnly: Bool
    public var maxBytesPerSecond: UInt64?
    public var dailyBytes: UInt64?
    public var urgentBypass: Bool

    /// The lowest cap (a device's own 64 KiB chunk then takes about a minute).
    public static let minBytesPerSecond: UInt64 = 1_024
    /// The lowest daily budget: a chunk of the largest size must fit in a day (§ 16 MAX_CHUNK_BYTES, with its frame).
    public static let minDailyBytes: UInt64 = UInt64(WireLimits.maxChunkBytes) + 65_536

    public init(unmeteredOnly: Bool = false, maxBytesPerSecond: UInt64? = nil, dailyBytes: UInt64? = nil, urgentBypass: Bool = true) {
        self.unmeteredOnly = unmeteredOnly
        self.maxBytesPerSecond = maxBytesPerSecond
        self.dailyBytes = dailyBytes
        self.urgentBypass = urgentBypass
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        unmeteredOnly = try c.decodeIfPresent(Bool.self, forKey: .unmeteredOnly) ?? false
        maxBytesPerSecond = try c.decodeIfPresent(UInt64.self, forKey: .maxBytesPerSecond)
        dailyBytes = try c.decodeIfPresent(UInt64.self, forKey: .dailyBytes)
        urgentBypass = try c.decodeIfPresent(Bool.self, forKey: .urgentBypass) ?? true
        if let problem { throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: problem)) }
    }

    /// Allows everything: uploads go as they did before there were policies.
    public var isUnrestricted: Bool { !unmeteredOnly && maxBytesPerSecond == nil && dailyBytes == nil }

    /// What is wrong with it, or nil.
    public var problem: String? {
        if let rate = maxBytesPerSecond, rate < Self.minBytesPerSecond { return "maxBytesPerSecond must be at least \(Self.minBytesPerSecond), not \(rate)" }
        if let daily = dailyBytes, daily < Self.minDailyBytes { return "dailyBytes must be at least \(Self.minDailyBytes) (a chunk must fit in a day), not \(daily)" }
        return nil
    }

    public static let fileName = "upload-policy.json"

    /// The policy in `stateDirectory`; unrestricted when there is none. A file that cannot be
    /// read or is not a valid policy is an error, not the default.
    public static func load(stateDirectory: String) throws -> UploadPolicy {
        let path = stateDirectory + "/" + fileName
        guard let data = FileManager.default.contents(atPath: path) else {
            if FileManager.default.fileExists(atPath: path) { throw AgentError("cannot read \(path)") }
            return UploadPolicy()
        }
        do {
            return try JSONDecoder().decode(UploadPolicy.self, from: data)
        } catch DecodingError.dataCorrupted(let context) {
            throw AgentError("\(path) is not a valid upload policy: \(context.debugDescription)")
        } catch {
            throw AgentError("\(path) is not a valid upload policy: \(error)")
        }
    }

    /// Writes the policy durably, where a running agent takes it within a second (its
    /// ``AgentClient/setUploadPolicy(_:)`` takes it at once). Unrestricted removes the file.
    public func save(stateDirectory: String) throws {
        if let problem { throw AgentError("the upload policy is not valid: \(problem)") }
        let path = stateDirectory + "/" + Self.fileName
        if isUnrestricted {
            do { try FileManager.default.removeItem(atPath: path) } catch CocoaError.fileNoSuchFile {} catch { throw AgentError("cannot remove \(path): \(error)") }
            return
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try AgentState.write(Array(try encoder.encode(self)), to: path, mode: 0o644)
    }
}

/// What the device's network costs, as the app or the host reports it (`STATE/network.json`,
/// `dredge-agent network`, ``AgentClient/setNetwork(_:)``). An agent cannot know a data plan:
/// with `unmeteredOnly`, a network nobody reported is taken as metered, so nothing is sent on
/// a plan the user pays for until someone says otherwise.
public enum NetworkCost: String, Codable, Sendable, CaseIterable {
    case metered, unmetered, unknown

    public static let fileName = "network.json"

    struct Report: Codable { var network: NetworkCost }

    /// The network last reported in `stateDirectory`; `unknown` when none was. A report that
    /// cannot be read is an error.
    public static func load(stateDirectory: String) throws -> NetworkCost {
        let path = stateDirectory + "/" + fileName
        guard let data = FileManager.default.contents(atPath: path) else {
            if FileManager.default.fileExists(atPath: path) { throw AgentError("cannot read \(path)") }
            return .unknown
        }
        do {
            return try JSONDecoder().decode(Report.self, from: data).network
        } catch {
            throw AgentError("\(path) is not a valid network report (want {\"network\": \"metered\"|\"unmetered\"|\"unknown\"}): \(error)")
        }
    }

    /// Reports the network durably; a running agent takes it within a second.
    public func save(stateDirectory: String) throws {
        try AgentState.write(Array(try JSONEncoder().encode(Report(network: self))), to: stateDirectory + "/" + Self.fileName, mode: 0o644)
    }
}

/// The bytes the device uploaded on one UTC day (`STATE/upload-usage.json`), what
/// ``UploadPolicy/dailyBytes`` is counted against.
struct DailyUsage: Codable, Sendable, Equatable {
    /// Days since 1970-01-01, UTC.
    var day: Int64
    var bytes: UInt64

    static let fileName = "upload-usage.json"

    static func day(of time: Timestamp) -> Int64 {
        let us = time.microseconds
        return us >= 0 ? us / 86_400_000_000 : (us - 86_399_999_999) / 86_400_000_000
    }

    /// The start of the day after `day`.
    static func start(ofDayAfter day: Int64) -> Timestamp { Timestamp(microseconds: (day + 1) * 86_400_000_000) }
}
