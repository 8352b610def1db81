import DredgeDomain
import DredgeWire
import Foundation

/// Which captures the agent makes of its triggers (Protocol/README.md § 21, *The window*,
/// *Budget*, *Crashes*): the window each firing captures, kept apart from the trigger's earlier
/// ones; the budget of each trigger on this device; a trigger the server said is spent, left
/// quiet for an hour; and the captures waiting for their window to close.
///
/// A value with no clock of its own: every call is given the time, so tests move it. The agent
/// keeps it on disk across restarts (it is `Codable`), so a restart neither spends a budget
/// twice nor captures a window again.
public struct CapturePlanner: Codable, Sendable, Equatable {
    /// A capture decided on, waiting for its window to close, then exported and uploaded.
    public struct Planned: Codable, Sendable, Equatable {
        /// The upload's id (Protocol § 5 form).
        public var captureID: String
        public var triggerID: String
        public var setVersion: UInt64
        /// Whose records: the firing record's user; "" the device's records.
        public var uid: String
        /// The window, µs: inclusive, exclusive.
        public var sinceUs: Int64
        public var untilUs: Int64
        /// The firing record's time; a crash: the run's last record's.
        public var matchedAtUs: Int64
        public var crash: Bool
        /// Where in the store the firing record is (nil for a crash): the export names it.
        public var matchedRow: Int64?
        /// When it was planned (the agent's clock): a heartbeat after it names its user to the server.
        public var plannedAtUs: Int64?
        /// When the apps were asked to freeze their rewind buffers once its window had closed
        /// (nil: not yet): it is exported once they have had time to.
        public var freezeAskedAtUs: Int64?
    }

    /// What the planner remembers of one trigger.
    struct Book: Codable, Sendable, Equatable {
        /// When each capture of the last day was made (µs, the agent's clock).
        var made: [Int64] = []
        /// Where the trigger's last capture ended: the next one starts no earlier.
        var lastUntilUs: Int64?
        /// The server said the trigger's budget is spent: no capture until then.
        var quietUntilUs: Int64?
    }

    /// A day, µs: the rolling period of a trigger's budget.
    public static let day: Int64 = 86_400_000_000
    /// How long a trigger stays quiet after the server answers `ERROR_BUDGET_SPENT` (§ 21: an hour).
    public static let quietAfterSpent: Int64 = 3_600_000_000

    private var books: [String: Book] = [:]
    /// Oldest first.
    public private(set) var pending: [Planned] = []

    public init() {}

    /// Whether a record at `firedAtUs` (or a run that ended then, `crash`) makes a capture of
    /// `rule` now, and which: nil when the trigger expired, is quiet, the time is inside a
    /// window it captured or will capture, or its budget on this device is spent. A capture
    /// made is counted at once (uploaded or not), and its window kept.
    public mutating func consider(
        _ rule: TriggerRule, setVersion: UInt64, firedAtUs: Int64, uid: String, row: Int64?, crash: Bool, now: Timestamp, newID: () -> String
    ) -> Planned? {
        let nowUs = now.microseconds
        guard nowUs < rule.expiresAt.microseconds else { return nil }
        var book = books[rule.id] ?? Book()
        book.made.removeAll { $0 <= nowUs &- Self.day }
        if let quiet = book.quietUntilUs {
            if nowUs < quiet { return nil }
            book.quietUntilUs = nil
        }
        // Inside a window already captured (or waiting to be): that window holds it.
        if let last = book.lastUntilUs, firedAtUs < last {
            books[rule.id] = book
            return nil
        }
        guard book.made.count < Int(rule.maxPerDeviceDay) else {
            books[rule.id] = book
            return nil
        }
        let before = Int64(rule.beforeSeconds) * 1_000_000
        let after = crash ? 0 : Int64(rule.afterSeconds) * 1_000_000
        let since = max(firedAtUs.subtractingClamped(before), book.lastUntilUs ?? .min, Timestamp.acceptedRange.lowerBound)
        let until = min(firedAtUs.addingClamped(after).addingClamped(1), Timestamp.acceptedRange.upperBound)
        guard since <= firedAtUs, firedAtUs < until else {
            books[rule.id] = book
            return nil
        }
        let planned = Planned(
            captureID: newID(), triggerID: rule.id, setVersion: setVersion, uid: uid, sinceUs: since, untilUs: until, matchedAtUs: firedAtUs, crash: crash,
            matchedRow: crash ? nil : row, plannedAtUs: nowUs)
        book.made.append(nowUs)
        book.lastUntilUs = until
        books[rule.id] = book
        pending.append(planned)
        return planned
    }

    /// The captures whose window closed at least `settle` before `now`: their records are in
    /// the store (the writer, which lingers 5 ms, has had `settle` to take the last of them).
    /// Oldest first.
    public func due(now: Timestamp, settle: Duration = .seconds(1)) -> [Planned] {
        let settled = now.microseconds.subtractingClamped(Int64(settle.components.seconds) * 1_000_000 + settle.components.attoseconds / 1_000_000_000_000)
        return pending.filter { $0.untilUs <= settled }
    }

    /// The apps were asked to freeze their rewind buffers for these captures at `now`.
    public mutating func askedFreeze(_ captureIDs: Set<String>, now: Timestamp) {
        for i in pending.indices where captureIDs.contains(pending[i].captureID) { pending[i].freezeAskedAtUs = now.microseconds }
    }

    /// A capture is uploaded, or given up: it is no longer pending (it stays counted).
    public mutating func finished(_ captureID: String) {
        pending.removeAll { $0.captureID == captureID }
    }

    /// The server answered `ERROR_BUDGET_SPENT` for a capture of `triggerID`: the trigger makes
    /// no capture for an hour (§ 21).
    public mutating func budgetSpent(_ triggerID: String, now: Timestamp) {
        books[triggerID, default: Book()].quietUntilUs = now.microseconds.addingClamped(Self.quietAfterSpent)
    }

    /// The agent holds a new set: what it remembers of triggers no longer in it is let go once
    /// it no longer matters: no capture of it pending (the server decides whether to take it)
    /// and none made in the last day (a trigger back in a later set keeps its budget and its
    /// windows).
    public mutating func held(_ triggerIDs: Set<String>, now: Timestamp = .now) {
        let pendingTriggers = Set(pending.map(\.triggerID))
        let dayAgo = now.microseconds &- Self.day
        books = books.filter { id, book in triggerIDs.contains(id) || pendingTriggers.contains(id) || book.made.contains { $0 > dayAgo } }
    }

    /// Captures of `triggerID` made in the day before `now` (what its budget counts).
    public func madeToday(_ triggerID: String, now: Timestamp) -> Int {
        (books[triggerID]?.made ?? []).filter { $0 > now.microseconds &- Self.day }.count
    }
}

extension Int64 {
    fileprivate func addingClamped(_ other: Int64) -> Int64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? (other > 0 ? .max : .min) : sum
    }

    fileprivate func subtractingClamped(_ other: Int64) -> Int64 {
        let (difference, overflow) = subtractingReportingOverflow(other)
        return overflow ? (other > 0 ? .min : .max) : difference
    }
}
