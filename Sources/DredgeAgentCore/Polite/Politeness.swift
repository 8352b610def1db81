import DredgeDomain
import DredgeWire
import Foundation
import Logging

/// The agent's side of polite uploads (#54): the ``PoliteGate`` fed from the state directory's
/// files (the policy, the network, the day's usage), which it reads again when they change.
/// Owned by ``UploadManager``, which queues the frames the policy governs and sends each when
/// the gate lets it.
///
/// Governed: the uploads the device makes by itself (feedback, captures) always; a pull unless
/// an engineer marked it urgent and the policy lets urgent traffic by.
struct Politeness {
    private(set) var gate: PoliteGate
    let stateDirectory: String
    let logger: Logger
    private var policyStamp: FileStamp?
    private var networkStamp: FileStamp?
    /// The usage as last written, and when.
    private var savedUsage: DailyUsage
    private var savedAt = ContinuousClock.now
    /// What holds the governed uploads now, as last looked at and said in the log (nil: they go).
    private(set) var currentHold: PoliteGate.Hold?

    /// The usage is written at most this often while uploads go (and when they stop).
    static let usageSaveInterval: Duration = .seconds(5)

    init(stateDirectory: String, logger: Logger) {
        self.stateDirectory = stateDirectory
        self.logger = logger
        let usage = Self.loadUsage(stateDirectory + "/" + DailyUsage.fileName, logger: logger)
        gate = PoliteGate(usage: usage)
        savedUsage = usage
        refresh()
    }

    /// Whether the policy governs `active`'s frames.
    func governs(_ active: UploadManager.Active) -> Bool {
        switch active.upload.header.kind {
        case .pull: gate.governs(urgent: active.urgent)
        default: gate.governs(urgent: false)
        }
    }

    /// Reads the policy and the network again if their files changed. A policy file that
    /// cannot be read holds every governed upload (nothing is lost: they wait) and is said in
    /// the log; a network report that cannot be read counts as not reported.
    mutating func refresh() {
        let policyPath = stateDirectory + "/" + UploadPolicy.fileName
        let policyNow = FileStamp(policyPath)
        if policyNow != policyStamp || gate.policyProblem != nil {
            policyStamp = policyNow
            do {
                let policy = try UploadPolicy.load(stateDirectory: stateDirectory)
                if policy != gate.policy || gate.policyProblem != nil {
                    logger.notice("upload policy", metadata: ["policy": "\(UploadPolicy.describe(policy))"])
                }
                gate.policy = policy
                gate.policyProblem = nil
            } catch {
                if gate.policyProblem == nil { logger.error("the upload policy cannot be read; uploads it governs wait", metadata: ["error": "\(error)"]) }
                gate.policy = nil
                gate.policyProblem = "\(error)"
            }
        }
        let networkPath = stateDirectory + "/" + NetworkCost.fileName
        let networkNow = FileStamp(networkPath)
        if networkNow != networkStamp {
            networkStamp = networkNow
            let network: NetworkCost
            do { network = try NetworkCost.load(stateDirectory: stateDirectory) } catch {
                logger.warning("the network report cannot be read; taken as not reported", metadata: ["error": "\(error)"])
                network = .unknown
            }
            if network != gate.network { logger.info("network reported", metadata: ["network": "\(network.rawValue)"]) }
            gate.network = network
        }
    }

    func hold(bytes: UInt64, urgent: Bool, now: Timestamp) -> PoliteGate.Hold? { gate.hold(bytes: bytes, urgent: urgent, now: now) }

    mutating func reserve(bytes: UInt64, urgent: Bool, monotonic: Double) -> Double { gate.reserve(bytes: bytes, urgent: urgent, monotonic: monotonic) }

    /// Says a hold in the log once (and its end).
    mutating func say(_ hold: PoliteGate.Hold?) {
        let said = currentHold?.kind
        currentHold = hold
        guard hold?.kind != said else { return }
        if let hold {
            logger.notice("uploads held by the device's upload policy", metadata: ["reason": "\(hold)"])
        } else {
            logger.notice("the upload policy lets uploads go again")
        }
    }

    /// Counts bytes sent; returns the usage to write when it is due (`force`: now, if changed).
    mutating func spent(_ bytes: UInt64, now: Timestamp, force: Bool = false) -> DailyUsage? {
        if bytes > 0 { gate.spent(bytes, now: now) }
        guard gate.usage != savedUsage, force || ContinuousClock.now - savedAt >= Self.usageSaveInterval || gate.usage.day != savedUsage.day else { return nil }
        savedUsage = gate.usage
        savedAt = .now
        return gate.usage
    }

    func status(waiting: Int, now: Timestamp = .now) -> UploadPolicyStatus {
        UploadPolicyStatus(
            policy: gate.policy, policyProblem: gate.policyProblem, network: gate.network, spentToday: gate.spentToday(now: now),
            held: waiting > 0 ? currentHold.map { "\($0)" } : nil, holdKind: waiting > 0 ? currentHold?.kind : nil, waitingFrames: waiting)
    }

    static func writeUsage(_ usage: DailyUsage, stateDirectory: String, logger: Logger) {
        do {
            try AgentState.write(Array(try JSONEncoder().encode(usage)), to: stateDirectory + "/" + DailyUsage.fileName, mode: 0o600)
        } catch {
            logger.warning("cannot save the day's upload usage", metadata: ["error": "\(error)"])
        }
    }

    static func loadUsage(_ path: String, logger: Logger) -> DailyUsage {
        guard let data = FileManager.default.contents(atPath: path) else { return DailyUsage(day: DailyUsage.day(of: .now), bytes: 0) }
        do {
            return try JSONDecoder().decode(DailyUsage.self, from: data)
        } catch {
            // Counted from zero: the day's budget may be overspent once, never lost uploads.
            logger.error("the day's upload usage is unreadable; counting from zero", metadata: ["path": "\(path)", "error": "\(error)"])
            return DailyUsage(day: DailyUsage.day(of: .now), bytes: 0)
        }
    }
}

extension UploadPolicy {
    /// The policy in words.
    public static func describe(_ policy: UploadPolicy) -> String {
        if policy.isUnrestricted { return "unrestricted" }
        var parts: [String] = []
        if policy.unmeteredOnly { parts.append("unmetered networks only") }
        if let rate = policy.maxBytesPerSecond { parts.append("at most \(rate) B/s") }
        if let daily = policy.dailyBytes { parts.append("at most \(daily) B a day") }
        parts.append(policy.urgentBypass ? "urgent pulls and tails bypass it" : "urgent pulls and tails too")
        return parts.joined(separator: ", ")
    }
}

extension UploadPolicy {
    /// The bytes uploaded today (UTC) as the agent last saved them (at most 5 s behind).
    public static func spentToday(stateDirectory: String, now: Timestamp = .now) -> UInt64 {
        guard let data = FileManager.default.contents(atPath: stateDirectory + "/" + DailyUsage.fileName),
            let usage = try? JSONDecoder().decode(DailyUsage.self, from: data), usage.day == DailyUsage.day(of: now)
        else { return 0 }  // none saved today, or unreadable (the agent says so when it starts)
        return usage.bytes
    }
}

/// What the device's upload policy does now (``AgentClient/uploadPolicyStatus()``).
public struct UploadPolicyStatus: Sendable, Equatable {
    /// The policy in force; nil when its file cannot be read (``policyProblem``).
    public var policy: UploadPolicy?
    public var policyProblem: String?
    public var network: NetworkCost
    /// Bytes uploaded today (UTC), what ``UploadPolicy/dailyBytes`` counts.
    public var spentToday: UInt64
    /// Why the uploads the policy governs wait now, for people; nil when none waits.
    public var held: String?
    /// The same as a word: `network`, `daily_budget` or `policy_unreadable`.
    public var holdKind: String?
    /// Frames (beginnings and chunks) waiting for the policy.
    public var waitingFrames: Int
}
