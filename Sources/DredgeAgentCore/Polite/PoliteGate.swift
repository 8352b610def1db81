import DredgeDomain
import Foundation

/// The pure core of polite uploads (#54): whether a frame of an upload may go now under the
/// device's ``UploadPolicy``, and when. The caller asks ``hold(bytes:urgent:now:)`` first (a
/// reason to wait, re-asked until there is none), then ``reserve(bytes:urgent:monotonic:)``
/// for the time the frame may go under the rate cap, and counts what it sent with
/// ``spent(_:now:)``.
///
/// The cap has no burst: each frame waits for its own slot (its bytes ÷ the cap after the
/// previous frame's slot, or after now when the uploads were idle), so an upload of any size
/// goes at the cap or a little below it, never above.
struct PoliteGate: Sendable, Equatable {
    enum Hold: Sendable, Equatable, CustomStringConvertible {
        /// The policy wants an unmetered network and it is not (or nobody said).
        case network(NetworkCost)
        /// The day's budget is spent; the next day begins at `resumesAt`.
        case dailyBudget(spent: UInt64, budget: UInt64, resumesAt: Timestamp)
        /// The policy file cannot be read: nothing polite goes until it can (nothing is lost).
        case unreadablePolicy(String)

        var description: String {
            switch self {
            case .network(let cost): "waiting for an unmetered network (the network is \(cost == .unknown ? "not reported: dredge-agent network" : cost.rawValue))"
            case .dailyBudget(let spent, let budget, let resumesAt): "the day's upload budget is spent (\(spent) of \(budget) bytes); waiting until \(resumesAt.rfc3339)"
            case .unreadablePolicy(let problem): "the upload policy cannot be read: \(problem)"
            }
        }

        /// A short name for logs and metrics.
        var kind: String {
            switch self {
            case .network: "network"
            case .dailyBudget: "daily_budget"
            case .unreadablePolicy: "policy_unreadable"
            }
        }
    }

    /// What `payload` bytes written to the connection cost on the link: TLS records of up to
    /// 16 KiB (22 bytes each) in TCP segments of up to 1,448 bytes, each with 66 bytes of TCP,
    /// IP and link headers (as on Ethernet or Wi-Fi). The cap and the daily budget count these,
    /// as a data plan does.
    static func wireBytes(payload: UInt64) -> UInt64 {
        let tls = payload + (payload + 16_383) / 16_384 * 22
        return tls + (tls + 1_447) / 1_448 * 66
    }

    /// The policy in force; nil when its file could not be read (``policyProblem`` says why).
    var policy: UploadPolicy? = UploadPolicy()
    var policyProblem: String?
    var network: NetworkCost = .unknown
    var usage: DailyUsage
    /// The end of the last slot reserved under the cap, on a monotonic clock in seconds.
    private(set) var slotEnd: Double = -.infinity

    init(usage: DailyUsage) { self.usage = usage }

    /// Whether the policy governs traffic that is `urgent` (or not): urgent traffic bypasses it
    /// when the policy says so.
    func governs(urgent: Bool) -> Bool {
        guard let policy else { return true }
        if policy.isUnrestricted { return false }
        return !(urgent && policy.urgentBypass)
    }

    /// The bytes uploaded on the day of `now`.
    func spentToday(now: Timestamp) -> UInt64 { usage.day == DailyUsage.day(of: now) ? usage.bytes : 0 }

    /// Why `bytes` more (0 for a frame as small as an upload's beginning) may not go now, or nil.
    func hold(bytes: UInt64, urgent: Bool, now: Timestamp) -> Hold? {
        guard governs(urgent: urgent) else { return nil }
        guard let policy else { return .unreadablePolicy(policyProblem ?? "unknown") }
        if policy.unmeteredOnly && network != .unmetered { return .network(network) }
        if let budget = policy.dailyBytes {
            let spent = spentToday(now: now)
            if spent >= budget || bytes > budget - spent {
                return .dailyBudget(spent: spent, budget: budget, resumesAt: DailyUsage.start(ofDayAfter: DailyUsage.day(of: now)))
            }
        }
        return nil
    }

    /// When `bytes` may go under the cap (a monotonic time ≥ `monotonic`), its slot reserved.
    /// A caller that comes back later than its previous slot's end (sealing and sending the
    /// last frame took time) by less than this frame's slot starts it where the last ended,
    /// so the delays of a busy device do not add up below the cap; one idle for longer starts
    /// from now (nothing saved up).
    mutating func reserve(bytes: UInt64, urgent: Bool, monotonic: Double) -> Double {
        guard governs(urgent: urgent), let rate = policy?.maxBytesPerSecond else { return monotonic }
        let slot = Double(bytes) / Double(rate)
        let start = monotonic - slotEnd < slot ? slotEnd : monotonic
        let due = max(start + slot, monotonic)
        slotEnd = start + slot
        return due
    }

    /// Counts `bytes` sent at `now` toward the day (urgent bytes too: the plan was used).
    mutating func spent(_ bytes: UInt64, now: Timestamp) {
        let today = DailyUsage.day(of: now)
        if usage.day != today { usage = DailyUsage(day: today, bytes: 0) }
        usage.bytes &+= bytes
    }
}
