import DredgeAdminAPI
import DredgeDomain
import DredgeServer
import Foundation
import Testing

/// The life of a pull target as a value (#52): the rules alone, with no database. That both
/// queues keep them is `PullQueueConformanceTests`'s.
@Suite struct PullTargetLifeTests {
    typealias Life = PullTargetLife

    static let moves: [(String, Life.Move)] = [
        ("deliver", Life.deliver), ("deliverQueued", Life.deliverQueued), ("undeliver", Life.undeliver), ("failCommand", Life.failCommand),
        ("accept", Life.accept), ("reject", Life.reject), ("upload", Life.upload), ("complete", Life.complete), ("fail", Life.fail),
        ("remove", Life.remove), ("expireBeforeDelivery", Life.expireBeforeDelivery), ("stall", Life.stall),
    ]

    @Test func noMoveLeavesAFinalStatus() {
        #expect(Life.final == [.complete, .rejected, .failed, .expired])
        #expect(Life.open == [.queued, .delivered, .exporting, .uploading])
        for (name, move) in Self.moves {
            for status in Life.final { #expect(!move.applies(to: status), "\(name) from \(status)") }
        }
    }

    /// Every status a target can reach from each status, by any move: the diagram in
    /// PullTargetLife's documentation, exactly.
    @Test func theReachableStatusesAreTheDiagrams() {
        var reach: [PullStatus: Set<PullStatus>] = [:]
        for (_, move) in Self.moves {
            for from in move.from where from != move.to { reach[from, default: []].insert(move.to) }
        }
        #expect(reach[.queued] == [.delivered, .failed, .exporting, .rejected, .uploading, .complete, .expired])
        #expect(reach[.delivered] == [.queued, .failed, .exporting, .rejected, .uploading, .complete, .expired])
        #expect(reach[.exporting] == [.uploading, .complete, .failed, .expired])
        #expect(reach[.uploading] == [.complete, .failed, .expired])
        for status in Life.final { #expect(reach[status] == nil) }
    }

    @Test func answersApplyOnlyBeforeTheAgentAnswered() {
        // A repeated CommandAccepted never takes an uploading target back; a rejection after an
        // acceptance is ignored (Protocol § 10).
        #expect(!Life.accept.applies(to: .uploading) && !Life.accept.applies(to: .exporting))
        #expect(!Life.reject.applies(to: .exporting) && Life.reject.applies(to: .delivered))
        #expect(Life.deliverable(includingUnanswered: false) == [.queued])
        #expect(Life.deliverable(includingUnanswered: true) == [.queued, .delivered])
    }

    @Test func aQueuedTargetExpiresAtItsPullsExpiryAndShowsSo() {
        let expiry = Timestamp(microseconds: 1_000_000)
        #expect(Life.expiredBeforeDelivery(.queued, expiresAt: expiry, now: expiry))
        #expect(!Life.expiredBeforeDelivery(.queued, expiresAt: expiry, now: Timestamp(microseconds: 999_999)))
        #expect(!Life.expiredBeforeDelivery(.delivered, expiresAt: expiry, now: Timestamp(microseconds: 5_000_000)))
        #expect(Life.shown(.queued, detail: "", expiresAt: expiry, now: expiry) == (.expired, "expired before delivery"))
        #expect(Life.shown(.exporting, detail: "x", expiresAt: expiry, now: expiry) == (.exporting, "x"))
        // A queued target is sent until its expiry, then expired: never both, never neither.
        for micros: Int64 in [0, 999_999, 1_000_000, 1_000_001] {
            let now = Timestamp(microseconds: micros)
            #expect(Life.isSent(expiresAt: expiry, now: now) != Life.expiredBeforeDelivery(.queued, expiresAt: expiry, now: now), "\(micros)")
        }
        #expect(Life.isSent(expiresAt: expiry, now: Timestamp(microseconds: 999_999)) && !Life.isSent(expiresAt: expiry, now: expiry))
    }

    @Test func deadlinesEndADeliveredTargetAfterItsQuietPeriodOrTheGrace() {
        let d = Life.Deadlines()
        #expect(d.quietAfterExpiry == .seconds(15 * 60) && d.afterExpiry == .seconds(24 * 3600))
        let minute: Int64 = 60_000_000
        let expiry = Timestamp(microseconds: 1_000 * minute)
        func at(_ minutes: Int64) -> Timestamp { Timestamp(microseconds: expiry.microseconds + minutes * minute) }
        let always = Timestamp(microseconds: .min)
        // Heard of before the expiry: the quiet period runs from the expiry.
        #expect(d.ending(.delivered, heard: at(-30), expiresAt: expiry, now: at(14), listeningSince: always) == nil)
        let quiet = d.ending(.delivered, heard: at(-30), expiresAt: expiry, now: at(15), listeningSince: always)
        #expect(quiet == "no word from the agent since \(at(-30)) (delivered); the pull expired at \(expiry)")
        // Heard of after it: from then.
        #expect(d.ending(.uploading, heard: at(10), expiresAt: expiry, now: at(24), listeningSince: always) == nil)
        #expect(d.ending(.uploading, heard: at(10), expiresAt: expiry, now: at(25), listeningSince: always) != nil)
        // The server's own downtime is not the agent's silence.
        #expect(d.ending(.exporting, heard: at(-30), expiresAt: expiry, now: at(20), listeningSince: at(10)) == nil)
        // However busy, 24 hours after the expiry it ends.
        let grace = d.ending(.uploading, heard: at(24 * 60 - 1), expiresAt: expiry, now: at(24 * 60), listeningSince: always)
        #expect(grace?.hasPrefix("still uploading 86400.0 seconds after the pull expired at") == true, "\(grace ?? "nil")")
        // Not a queued target (it expires at the expiry) nor a final one.
        for status: PullStatus in [.queued, .complete, .failed, .rejected, .expired] {
            #expect(d.ending(status, heard: at(-100), expiresAt: expiry, now: at(10_000), listeningSince: always) == nil)
        }
    }

    /// Deadlines too long to count in µs mean "never", not a trap.
    @Test func deadlinesBeyondCountingNeverEndATarget() {
        let never = Life.Deadlines(quietAfterExpiry: .seconds(Int64.max), afterExpiry: .seconds(Int64.max))
        let start = Timestamp(microseconds: 0)
        #expect(never.ending(.uploading, heard: start, expiresAt: start, now: Timestamp(microseconds: 253_402_300_799_999_999), listeningSince: start) == nil)
    }

    @Test func statusListsForSQLAreSortedAndQuoted() {
        #expect(Life.sqlList(Life.final) == "('complete','expired','failed','rejected')")
        #expect(Life.sqlList(Life.stall.from) == "('delivered','exporting','uploading')")
    }
}
