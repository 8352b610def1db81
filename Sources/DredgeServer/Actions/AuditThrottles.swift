import DredgeAdminAPI
import Foundation
import Synchronization

/// At most one audit entry per key and interval: a key is admitted, then refused until the
/// interval has passed, the refusals counted. Bounded: when full of keys still in their
/// interval, it forgets them all (some entries are then recorded twice, none lost).
final class AuditThrottle: Sendable {
    let interval: TimeInterval
    static let capacity = 10_000
    private let state = Mutex<[String: (last: Date, suppressed: Int)]>([:])

    init(interval: TimeInterval) { self.interval = interval }

    /// Nil: not now (counted). Else record, with how many were refused since the last entry.
    func admit(_ key: String, now: Date) -> Int? {
        state.withLock { state in
            if let entry = state[key], now.timeIntervalSince(entry.last) < interval {
                state[key]?.suppressed += 1
                return nil
            }
            if state.count >= Self.capacity {
                state = state.filter { now.timeIntervalSince($0.value.last) < interval }
                if state.count >= Self.capacity { state.removeAll() }
            }
            let suppressed = state[key]?.suppressed ?? 0
            state[key] = (now, 0)
            return suppressed
        }
    }

    /// The entry could not be written: the key is admitted again next time.
    func forget(_ key: String) {
        _ = state.withLock { $0.removeValue(forKey: key) }
    }
}

/// When a search is recorded in the audit log: the first time an actor runs it (its filter, as
/// ``AdminActions/describe(_:)`` writes it), then again only after ten minutes, so the pages of a
/// search and the looks of a follow do not flood the log, while no filter is ever run unrecorded.
final class SearchAudit: Sendable {
    private let throttle = AuditThrottle(interval: 600)

    func shouldRecord(actor: String, detail: String, now: Date) -> Bool { throttle.admit(actor + "\u{0}" + detail, now: now) != nil }

    /// The write failed: the search is not recorded, so it must be the next time.
    func forget(actor: String, detail: String) { throttle.forget(actor + "\u{0}" + detail) }

    /// Records `action` unless the same actor and `key` (the detail, unless given) were
    /// recorded in the last ten minutes; a write that fails is thrown, and the next one tries again.
    func record(_ action: AuditAction, actor: String, detail: String, key: String? = nil, in audit: any AuditLog, now: Date) async throws {
        let key = key ?? detail
        guard shouldRecord(actor: actor, detail: key, now: now) else { return }
        do {
            try await audit.record(actor: actor, action, detail: detail)
        } catch {
            forget(actor: actor, detail: key)
            throw error
        }
    }
}

/// Refused tokens recorded at most once a minute per host; the refusals in between are
/// counted and reported with the next entry.
final class RefusalAudit: Sendable {
    private let throttle = AuditThrottle(interval: 60)

    /// Nil: do not record now (counted). Else record, saying how many were not recorded since.
    func admit(host: String, now: Date) -> Int? { throttle.admit(host, now: now) }
}
