import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation

/// The life of a pull on one agent (a *target*), as a value, the way the wire's state
/// machines are: which status may follow which, expiry before delivery, the deadlines of a
/// delivered pull, and the texts an engineer reads. Both pull queues keep only row I/O and
/// guarded updates whose status lists come from here (`PullTargetLifeTests` checks the rules
/// themselves; `PullQueueConformanceTests` that both back ends keep them).
///
/// ```
///            deliver             accept              upload
///   queued ─────────▶ delivered ────────▶ exporting ────────▶ uploading ──complete──▶ complete
///     │  ◀──undeliver──  │   │                 │                   │
///     │                  │   └──reject──▶ rejected                 │
///     │ (expires_at)     └──── fail, remove (any open status) ─────┴──▶ failed
///     └──expire──▶ expired ◀── stall (delivered, exporting, uploading: past the deadlines)
/// ```
/// A final status (complete, rejected, failed, expired) never changes again: no move leaves it.
public enum PullTargetLife {
    /// A status change: where it goes and the statuses it applies from (never a final one).
    /// A queue applies it with one guarded update (`… WHERE status IN from`), so of two moves
    /// racing for one target, the one the other made impossible changes nothing.
    public struct Move: Sendable, Hashable, CustomStringConvertible {
        public let to: PullStatus
        public let from: Set<PullStatus>

        init(to: PullStatus, from: Set<PullStatus>) {
            precondition(from.allSatisfy { !$0.isFinal }, "a move never leaves a final status")
            self.to = to
            self.from = from
        }

        /// Whether the move applies to a target in `status`.
        public func applies(to status: PullStatus) -> Bool { from.contains(status) }

        public var description: String { "\(from.map(\.rawValue).sorted().joined(separator: "|")) → \(to.rawValue)" }
    }

    /// Statuses a target can still leave.
    public static let open: Set<PullStatus> = Set(PullStatus.allCases.filter { !$0.isFinal })
    /// Statuses a target never leaves.
    public static let final: Set<PullStatus> = Set(PullStatus.allCases.filter(\.isFinal))

    /// Its command is about to be written: a queued target, or a delivered one sent again
    /// after a reconnection (Protocol § 10, Redelivery).
    public static let deliver = Move(to: .delivered, from: [.queued, .delivered])
    /// Its command is about to be written for the first time (a delivery pass that sends
    /// queued pulls only, not a reconnection's redelivery).
    public static let deliverQueued = Move(to: .delivered, from: [.queued])
    /// Its command was not written after all (the connection went): queued again.
    public static let undeliver = Move(to: .queued, from: [.delivered])
    /// The server could not make its command (its row or key does not read back).
    public static let failCommand = Move(to: .failed, from: [.queued, .delivered])
    /// `CommandAccepted`.
    public static let accept = Move(to: .exporting, from: [.queued, .delivered])
    /// `CommandRejected` (after an acceptance it is ignored, § 10).
    public static let reject = Move(to: .rejected, from: [.queued, .delivered])
    /// Its upload is begun or goes on.
    public static let upload = Move(to: .uploading, from: open)
    /// Its upload completed and its payload was kept.
    public static let complete = Move(to: .complete, from: open)
    /// Its upload failed, or the agent said it cannot carry it out (`Error{upload_id}`).
    public static let fail = Move(to: .failed, from: open)
    /// An engineer removed the pull before it finished.
    public static let remove = Move(to: .failed, from: open)
    /// Its pull expired before its command was delivered.
    public static let expireBeforeDelivery = Move(to: .expired, from: [.queued])
    /// Delivered and never finished: ended by ``Deadlines``.
    public static let stall = Move(to: .expired, from: [.delivered, .exporting, .uploading])

    /// The statuses whose command is sent to an agent: queued, and on a new connection the
    /// delivered ones it never answered (§ 10, Redelivery).
    public static func deliverable(includingUnanswered: Bool) -> Set<PullStatus> {
        includingUnanswered ? deliver.from : deliverQueued.from
    }

    /// Whether a deliverable target's command is sent at `now`: only before its pull's expiry
    /// (one at or past it is expired instead, ``expiredBeforeDelivery(_:expiresAt:now:)``, or,
    /// delivered and unanswered, left to ``stall``).
    public static func isSent(expiresAt: Timestamp, now: Timestamp) -> Bool { expiresAt > now }

    /// Whether a target in `status` has expired before delivery: queued at or past its pull's
    /// expiry. Such a target shows as expired even before a delivery pass marks it so.
    public static func expiredBeforeDelivery(_ status: PullStatus, expiresAt: Timestamp, now: Timestamp) -> Bool {
        expireBeforeDelivery.applies(to: status) && expiresAt <= now
    }

    /// The status and detail a target shows: what is stored, except a queued one past its expiry.
    public static func shown(_ status: PullStatus, detail: String, expiresAt: Timestamp, now: Timestamp) -> (status: PullStatus, detail: String) {
        expiredBeforeDelivery(status, expiresAt: expiresAt, now: now) ? (.expired, expiredBeforeDeliveryDetail) : (status, detail)
    }

    public static let expiredBeforeDeliveryDetail = "expired before delivery"

    /// The detail of a target an engineer's removal ended (answered `ERROR_UPLOAD_INVALID` if
    /// its agent uploads it later).
    public static func removedDetail(by actor: String) -> String { "removed by \(actor) before it finished" }

    /// The wire code a removed target's upload is answered with.
    public static let removedErrorCode = WireErrorCode.errorUploadInvalid

    /// How long a delivered target may go without word from its agent, and how long an upload
    /// may go on, before the server ends it (Protocol § 10, Deadlines: protocol values).
    public struct Deadlines: Sendable, Equatable {
        /// After the pull's expiry, a target with no progress for this long is expired.
        public var quietAfterExpiry: Duration
        /// After the pull's expiry, every target still open this long is expired, progress or not.
        public var afterExpiry: Duration

        public init(quietAfterExpiry: Duration = WireLimits.pullQuietPeriod, afterExpiry: Duration = WireLimits.pullExpiryGrace) {
            self.quietAfterExpiry = quietAfterExpiry
            self.afterExpiry = afterExpiry
        }

        /// Why a target in `status` ends now (``stall``), or nil while it may go on: it was
        /// last heard of at `heard`, its pull expires at `expiresAt`, and the server has been
        /// listening since `listeningSince` (silence before it is the server's own downtime,
        /// never counted).
        public func ending(_ status: PullStatus, heard: Timestamp, expiresAt: Timestamp, now: Timestamp, listeningSince: Timestamp) -> String? {
            guard stall.applies(to: status) else { return nil }
            let quietFrom = max(heard.microseconds, expiresAt.microseconds, listeningSince.microseconds)
            if now.microseconds - quietFrom >= quietAfterExpiry.saturatingMicroseconds {
                return "no word from the agent since \(heard) (\(status.rawValue)); the pull expired at \(expiresAt)"
            }
            if now.microseconds - expiresAt.microseconds >= afterExpiry.saturatingMicroseconds {
                return "still \(status.rawValue) \(afterExpiry) after the pull expired at \(expiresAt); given up"
            }
            return nil
        }
    }

    /// `('a','b')`, sorted: a status list for SQL, from the sets above (never from input).
    public static func sqlList(_ statuses: Set<PullStatus>) -> String {
        "(" + statuses.map { "'\($0.rawValue)'" }.sorted().joined(separator: ",") + ")"
    }
}
